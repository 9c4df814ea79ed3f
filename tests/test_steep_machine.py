"""The suite on a machine whose verify cost curve is steep (issue #36): a CPU where verifying
k + 1 tokens costs k + 1 single tokens, so that no draft pays and the adaptive controller
drafts nothing (an AVX-512 CPU comes close: 2 tokens cost 1.7-1.9 of one). Simulated by the
fake calibration of tests/costhook (``SPECLI_TEST_STEEP=1`` installs it for a whole pytest run,
CLI subprocesses included); the tests most sensitive to the machine's costs must pass under it,
since none may demand that drafting pays where it runs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from clihelp import simulated_costs, specli

ROOT = Path(__file__).resolve().parent.parent
# the tests that price drafting or check the text of adaptive drafting through the CLI (the
# matrix's adaptive greedy cells: each installs a GPU's costs, which must win over the steep ones)
SENSITIVE = ["tests/test_cli_run.py", "tests/test_seed.py", "tests/test_matrix.py::test_the_matrix_covers_every_axis",
             "tests/test_matrix.py::test_every_combination_decodes_plain_decodings_text"]


def _pytest_steep(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPECLI_TEST_STEEP": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=1800)


def test_the_steep_calibration_makes_every_draft_unprofitable(tiny_target, tiny_draft, tmp_path):
    """Under the simulated steep machine the adaptive controller drafts nothing, and the text is
    plain decoding's all the same."""
    env = simulated_costs("steep", {**os.environ, "SPECLI_CACHE": str(tmp_path)})
    outs = {}
    for draft in ("none", tiny_draft, "lookup"):
        rc, out, err = specli("run", "--target", tiny_target, "--draft", draft, "--raw", "-n", "32", "-t", "2",
                              "--json", "--prompt", "1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2,", env=env)
        assert rc == 0, err
        outs[draft] = json.loads(out)
    for draft in (tiny_draft, "lookup"):
        assert outs[draft]["tokens"] == outs["none"]["tokens"]
        assert outs[draft]["stats"]["drafted"] == 0, outs[draft]["stats"]
    cal = json.loads((tmp_path / "calibration.json").read_text())
    curves = [v for k, v in cal.items() if k.startswith("verify:") and isinstance(v, list) and len(v) > 2]
    assert curves and all(c[k] == pytest.approx((k + 1) * c[0]) for c in curves for k in range(len(c)))


def test_the_cost_sensitive_tests_pass_on_a_steep_machine():
    # of the matrix, the adaptive greedy cells: those whose drafting the machine's costs decide
    r = _pytest_steep(*SENSITIVE, "-k", "not test_every_combination or (adaptive and greedy)")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


@pytest.mark.real
def test_bench_draft_auto_passes_on_a_steep_machine():
    r = _pytest_steep("tests/test_bench_auto.py")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
