"""`specli bench --target A --target B` (issue 37, item 5): files of one model side by side in
one run, each mode over its own file's plain decoding, each file's verify curve predicted from
its header, and the quality each file kept, scored by the best file at hand. Quants of the tiny
f32 target, made by llama.cpp's quantizer; a FIXED kernel table installed: nothing here depends
on this machine's kernels or speed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from clihelp import specli
from storehelp import clean_env

from specli.engine import Context, ContextConfig, Model
from specli.hardware import calibrate, kernel_models
from specli.hardware.predict import verify_curve
from specli.measure import compare, quality
from specli.measure.bench import BenchRun
from specli.resolve.gguf_header import read_gguf
from specli.session import Options, Session

ROWS = [1, 2, 4, 8, 16, 32]
# Q4_0 repacked (8 rows cost 2 single rows), Q8_0 a little steeper, F32 row by row
TABLE = {"rows": ROWS, "types": {"Q4_0": [1e-9 * (1 + (r - 1) / 7) for r in ROWS],
                                 "Q8_0": [2e-9 * (1 + (r - 1) / 3) for r in ROWS],
                                 "F32": [4e-9 * r for r in ROWS]}}
SUITE = "prompts:\n  - id: one\n    text: The quick brown fox\n  - id: two\n    text: Once upon a time there\n"


@pytest.fixture(scope="module")
def quants(tmp_path_factory, tiny_target):
    d = tmp_path_factory.mktemp("quants")
    out = {"F32": Path(tiny_target)}
    for t in ("Q8_0", "Q4_0"):
        out[t] = kernel_models.quantize(Path(tiny_target), d / f"tiny-{t.lower()}.gguf", t)
    return out


@pytest.fixture()
def home(tmp_path, quants, monkeypatch):
    """The Q8_0 and Q4_0 files to compare; the f32 file in a local store (the best at hand)."""
    store = tmp_path / "store"
    store.mkdir()
    os.link(quants["F32"], store / "tiny-f32.gguf")
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECLI_CACHE", str(cache))
    calibrate.install_kernels(TABLE)
    suite = tmp_path / "suite.yaml"
    suite.write_text(SUITE)
    env = clean_env(tmp_path, SPECLI_CACHE=cache, SPECLI_MODEL_DIRS=store, SPECLI_CONFIG_DIR=tmp_path / "config")
    return env, store, str(suite)


def test_two_quants_side_by_side(home, quants, tmp_path, tiny_draft):
    env, store, suite = home
    out = tmp_path / "cmp.json"
    rc, stdout, err = specli("bench", "--target", str(quants["Q8_0"]), "--target", str(quants["Q4_0"]),
                             "--draft", tiny_draft, "--suite", suite, "--modes", "none,lookup,model-fixed", "-n", "24",
                             "--json", "--out", str(out), env=env)
    assert rc == 0, err
    data = json.loads(stdout)
    assert data == json.loads(out.read_text())  # the --out file is the whole report, not a partial one
    files = data["files"]
    assert [f["file"] for f in files] == [str(quants["Q8_0"]), str(quants["Q4_0"])]
    assert [f["quant"] for f in files] == ["Q8_0", "Q4_0"]
    assert files[0]["bits_per_weight"] == pytest.approx(8.5, abs=0.1)
    assert files[1]["bits_per_weight"] == pytest.approx(4.5, abs=0.1)
    for f, t in zip(files, ("Q8_0", "Q4_0"), strict=True):
        # the curve each file's header predicts with the installed table
        want = verify_curve(read_gguf(str(quants[t])), TABLE)
        assert f["predicted"]["verify_curve"] == [round(c, 3) for c in want]
        (rep,) = f["suites"]
        assert rep["target"] == str(quants[t])
        modes = rep["modes"]
        assert list(modes) == ["none", "lookup", "model-fixed"]
        plain = modes["none"]
        for m in ("lookup", "model-fixed"):
            r = modes[m]
            assert plain["tokens"] == r["tokens"] == 2 * 24
            # each mode over its own file's plain, and its text its own file's plain text
            assert r["speedup"] == pytest.approx(r["tokens_per_s"] / plain["tokens_per_s"])
            assert r["lossless"] == {"one": "identical", "two": "identical"}
        assert modes["model-fixed"]["drafted"] > 0
    # Q4_0's steeper-than-nothing but flatter curve than Q8_0 under the fixed table
    assert files[1]["predicted"]["verify_8"] < files[0]["predicted"]["verify_8"]
    q = data["quality"]
    assert q["reference"] == str(store / "tiny-f32.gguf") and q["reference_quant"] == "F32"
    assert all(f["quality_mean_logprob"] < 0 for f in files)


def test_quality_is_the_references_log_probability(quants):
    """mean_logprob against llama-cpp-python's own logits for the same tokens (an independent
    path through llama.cpp), on the f32 model."""
    from llama_cpp import Llama

    m = Model(str(quants["F32"]))
    prompt = m.tokenize("The capital of France is", add_special=True, parse_special=False)
    answer = m.tokenize(" a city of lights and long rivers", add_special=False, parse_special=False)
    ctx = Context(m, ContextConfig(n_ctx=128))
    try:
        got = quality.mean_logprob(ctx, [(prompt, answer)])
    finally:
        ctx.close()
        m.close()
    llm = Llama(str(quants["F32"]), n_ctx=128, logits_all=True, verbose=False)
    llm.eval(prompt + answer)
    rows = np.asarray(llm.scores[len(prompt) - 1:len(prompt) + len(answer) - 1], dtype=np.float64)
    lse = rows.max(axis=1) + np.log(np.exp(rows - rows.max(axis=1, keepdims=True)).sum(axis=1))
    want = float(np.mean(rows[np.arange(len(answer)), answer] - lse))
    assert got == pytest.approx(want, abs=1e-3)


def test_the_reference_is_the_best_file_at_hand(quants):
    paths = [str(quants["Q4_0"]), str(quants["Q8_0"])]
    assert quality.reference(paths, on_disk=[]).path == str(quants["Q8_0"])
    assert quality.reference(paths, explicit=str(quants["Q4_0"]), on_disk=[]).path == str(quants["Q4_0"])


def test_the_files_runs_alternate(quants, monkeypatch):
    """Measured runs interleaved file by file, so a drift of the machine hits both alike."""
    seen: list[str] = []
    measure = BenchRun.measure

    def spy(self, mode, sp, toks, first_pass):
        seen.append(os.path.basename(self.sess.target.path))
        return measure(self, mode, sp, toks, first_pass)

    monkeypatch.setattr(BenchRun, "measure", spy)
    from specli.measure.suite import parse_suite

    suite = parse_suite(SUITE, "s.yaml", "s")
    sessions = [Session(Options(target=str(quants[t]), draft="lookup"), build_drafter=False)
                for t in ("Q8_0", "Q4_0")]
    try:
        reports = compare.run_files(sessions, suite, ["none", "lookup"], 8, 2)
    finally:
        for s in sessions:
            s.close()
    assert len(seen) == 2 * 2 * 2 * 2  # files x modes x prompts x rounds
    assert seen == ["tiny-q8_0.gguf", "tiny-q4_0.gguf"] * 8
    assert [r.target for r in reports] == [str(quants["Q8_0"]), str(quants["Q4_0"])]


def test_bad_combinations_are_one_line_errors(home, quants, smol_gguf, tiny_draft_edited):
    env, _, suite = home
    base = ["bench", "--suite", suite, "--modes", "none", "-n", "4"]
    cases = [
        (["--target", str(quants["Q8_0"]), "--target", smol_gguf], "another model"),
        (["--target", str(quants["Q8_0"]), "--target", tiny_draft_edited], "another tokenizer"),
        (["--target", str(quants["Q8_0"]), "--target", str(quants["Q8_0"])], "names the same file"),
        (["--target", str(quants["Q8_0"]), "--reference", str(quants["F32"])], "give two or more"),
        (["--target", str(quants["Q8_0"]), "--target", str(quants["Q4_0"]), "--reference", smol_gguf],
         "another model"),
    ]
    for extra, says in cases:
        rc, out, err = specli(*base, *extra, env=env)
        assert rc != 0 and says in err, (extra, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
