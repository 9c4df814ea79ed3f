import importlib.util
import os
import subprocess
import sys
from pathlib import Path

COSTHOOK = Path(__file__).parent / "costhook"  # its sitecustomize simulates a machine's costs


def simulated_costs(kind: str, env: dict | None = None) -> dict:
    """``env`` (default this process's) for a CLI subprocess that calibrates as the simulated
    machine ``kind`` ("steep": no draft pays; "gpu": drafting pays), whatever this machine's
    real costs (tests/costhook/sitecustomize.py)."""
    env = dict(os.environ if env is None else env)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(COSTHOOK), *[p for p in paths if p != str(COSTHOOK)]])
    env["SPECLI_TEST_COSTS"] = kind
    return env


def _costhook():
    spec = importlib.util.spec_from_file_location("specli_test_costhook", COSTHOOK / "sitecustomize.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def install_simulated_costs(kind: str) -> None:
    """Simulate ``kind`` in this process and in every subprocess it starts (tests/conftest.py
    does this for the whole run under ``SPECLI_TEST_STEEP=1``)."""
    os.environ.update(simulated_costs(kind))
    _costhook().install(kind)


def simulate_costs_here(monkeypatch, kind: str) -> None:
    """Simulate ``kind`` in this process until ``monkeypatch`` is undone (a test's sessions)."""
    from specli.hardware import calibrate
    for name, f in _costhook().replacements(calibrate, kind).items():
        monkeypatch.setattr(calibrate, name, f)


def specli(*args, stdin: str | bytes | None = "", env=None, timeout=600, cwd=None):
    """Run the CLI as a user would; returns (rc, stdout, stderr). ``stdin`` may be bytes (sent
    as they are, e.g. text in another encoding); the output is decoded as UTF-8 either way."""
    binary = isinstance(stdin, bytes)
    r = subprocess.run([sys.executable, "-m", "specli", *args], input=stdin, capture_output=True,
                       text=not binary, env=env, timeout=timeout, cwd=cwd,
                       stdin=None if stdin is not None else subprocess.DEVNULL)
    if binary:
        return r.returncode, r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")
    return r.returncode, r.stdout, r.stderr
