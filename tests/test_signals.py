"""Ctrl-C (SIGINT, to the process group as a terminal sends it) and SIGTERM (to the process, as
`kill PID` sends it) during `run`, `bench` and `pull`: status 130 or 143, one line, never a
traceback; bench keeps the prompts it finished in its --out file. Each signal is sent after an
event the test observes: generation held after a chunk (tests/pausehook.py), or a download
held by the local index or Hub server after N bytes; never after a sleep."""

import json
import os
import signal
import subprocess
import sys
import threading

import pytest
from hubserver import HubServer, HubState, Repo
from indexserver import IndexServer, IndexState, make_wheel
from pausehook import MARK

PAUSEHOOK = os.path.join(os.path.dirname(__file__), "pausehook.py")
SIGNALS = [(signal.SIGINT, 130, "specli: interrupted"), (signal.SIGTERM, 143, "specli: terminated")]
IDS = ["SIGINT", "SIGTERM"]


class Proc:
    """A specli process in its own process group (through tests/pausehook.py: generation
    number ``held_from`` on holds; 0: none), both streams read as they come."""

    def __init__(self, args, env=None, held_from=0):
        env = dict(os.environ if env is None else env, PAUSEHOOK_FROM=str(held_from))
        self.p = subprocess.Popen([sys.executable, PAUSEHOOK, *args], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.out: list[str] = []
        self.err: list[str] = []
        self.held = threading.Event()
        self.readers = [threading.Thread(target=self._read, args=(s, buf), daemon=True)
                        for s, buf in ((self.p.stdout, self.out), (self.p.stderr, self.err))]
        for t in self.readers:
            t.start()

    def _read(self, stream, buf):
        for line in iter(stream.readline, ""):
            buf.append(line)
            if MARK in line:
                self.held.set()

    def wait_held(self):
        assert self.held.wait(300), "generation never reached the hold: " + "".join(self.err)

    def signal(self, sig) -> tuple[int, str, str]:
        if sig == signal.SIGINT:
            os.killpg(self.p.pid, sig)
        else:
            os.kill(self.p.pid, sig)
        rc = self.p.wait(300)
        for t in self.readers:
            t.join(60)
        return rc, "".join(self.out), "".join(self.err)


def ends_in_one_line(rc, err, want_rc, line):
    assert rc == want_rc and "Traceback" not in err, err
    tail = [ln for ln in err.splitlines() if ln.strip() and MARK not in ln]
    assert tail[-1] == line, err


@pytest.mark.parametrize("sig, want_rc, line", SIGNALS, ids=IDS)
def test_run(tiny_target, sig, want_rc, line):
    p = Proc(["run", "--target", tiny_target, "--draft", "lookup", "--raw", "-n", "200", "--prompt", "Once upon"],
             held_from=1)
    p.wait_held()
    rc, out, err = p.signal(sig)
    assert out.strip(), "the text streamed before the signal is on stdout"
    if sig == signal.SIGINT:  # Ctrl-C stops the reply: the text so far, and 130
        assert rc == 130 and "Traceback" not in err and "specli: error" not in err, err
    else:
        ends_in_one_line(rc, err, want_rc, line)


@pytest.mark.parametrize("sig, want_rc, line", SIGNALS, ids=IDS)
def test_bench_keeps_the_finished_prompts(tmp_path, tiny_target, sig, want_rc, line):
    suite = tmp_path / "s.yaml"
    suite.write_text("prompts:\n  - id: one\n    text: Hello there\n  - id: two\n    text: Good morning\n"
                     "  - id: three\n    text: Once upon a time\n")
    out = tmp_path / "report.json"
    # generations: the warm-ups of plain and lookup, the first measured prompt; the next one holds
    p = Proc(["bench", "--target", tiny_target, "--draft", "lookup", "--suite", str(suite), "-n", "8",
              "--modes", "none,lookup", "--json", "--out", str(out)], held_from=4)
    p.wait_held()
    during = json.loads(out.read_text())  # written after every measured prompt
    assert during.get("partial") is True and "interrupted" not in during
    rc, stdout, err = p.signal(sig)
    ends_in_one_line(rc, err, want_rc, line)
    assert stdout == ""
    rep = json.loads(out.read_text())
    assert rep["interrupted"] is True and rep["partial"] is True and rep["suite"] == "s"
    finished = {(m, pid) for m, r in rep["modes"].items() for pid in r["per_prompt"]}
    assert len(finished) == 1
    (mode, _), = finished
    assert rep["modes"][mode]["tokens"] == 8
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".partial")]


# -- pull: a download held by the server -----------------------------------------------------

CHUNK = 1 << 20


@pytest.fixture()
def clean_env(tmp_path):
    (tmp_path / "tmp").mkdir()
    e = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "HF_"))}
    e.update(SPECLI_CACHE=str(tmp_path / "cache"), SPECLI_CONFIG_DIR=str(tmp_path / "config"),
             TMPDIR=str(tmp_path / "tmp"), HF_HOME=str(tmp_path / "hf"), HF_HUB_DISABLE_TELEMETRY="1",
             HF_HUB_DISABLE_PROGRESS_BARS="1")
    return e


@pytest.mark.parametrize("sig, want_rc, line", SIGNALS, ids=IDS)
def test_pull_from_a_package_index(tmp_path, clean_env, sig, want_rc, line):
    import hashlib
    data = [bytes([i]) * 7 + os.urandom(CHUNK - 7) for i in (1, 2)]
    sha = hashlib.sha256(b"".join(data)).hexdigest()
    (tmp_path / "wheels").mkdir()
    wheels = {f"specli-fake-part{i}": make_wheel(tmp_path / "wheels", f"specli-fake-part{i}", "1.0",
                                                 {f"specli_fake/m.{i}": d}) for i, d in enumerate(data, 1)}
    with IndexServer(IndexState(wheels)) as index:
        index.state.pause_at[wheels["specli-fake-part1"].name] = CHUNK // 3
        env = dict(clean_env, PIP_INDEX_URL=index.url, PIP_NO_CACHE_DIR="1", PIP_CONFIG_FILE=os.devnull,
                   HF_HUB_OFFLINE="1")
        p = Proc(["pull", f"pypi:specli-fake-part1==1.0,specli-fake-part2==1.0#sha256={sha}"], env=env)
        assert index.state.paused.wait(300), "the download never started"
        rc, _, err = p.signal(sig)
    ends_in_one_line(rc, err, want_rc, line)
    models = tmp_path / "cache" / "models"
    assert not [f for f in os.listdir(models) if f.endswith(".gguf")]  # nothing taken for the model


@pytest.mark.parametrize("sig, want_rc, line", SIGNALS, ids=IDS)
def test_pull_from_the_hub(tiny_target, clean_env, sig, want_rc, line):
    repo, fname = "tiny-org/Tiny-Target-2B-GGUF", "tiny-target-2b-q4_k_m.gguf"
    with HubServer(HubState(repos={repo: Repo({fname: tiny_target})})) as hub:
        hub.state.pause_at[fname] = os.path.getsize(tiny_target) // 3
        p = Proc(["pull", f"{repo}:Q4_K_M"], env=dict(clean_env, HF_ENDPOINT=hub.url))
        assert hub.state.paused.wait(300), "the download never started"
        rc, _, err = p.signal(sig)
    ends_in_one_line(rc, err, want_rc, line)
    snapshots = clean_env["HF_HOME"] + "/hub/models--" + repo.replace("/", "--") + "/snapshots"
    assert not os.path.isdir(snapshots) or not any(files for _, _, files in os.walk(snapshots))
