"""Self-speculation from the target's own layers (issue 39): ``--draft early-exit[:E]`` and
``--draft layer-skip[:SET]`` derive a draft GGUF from the target, cached by its SHA-256; the
layers are chosen by measurement when not given; it drafts like any draft model, losslessly."""

import json
import os

import numpy as np
import pytest
from clihelp import simulated_costs, specli
from conftest import TEST_CACHE
from tiny2026 import tiny_2026_model
from tinymodels import tiny_model

from specli.engine import Model
from specli.errors import SpecliError
from specli.resolve import derive
from specli.resolve.gguf_header import read_gguf

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def tiny4(smol_gguf) -> str:
    """A random 4-layer llama: enough layers to exit early and to skip some."""
    return str(tiny_model(TEST_CACHE, smol_gguf, seed=0, attn_scale=0.3, n_layer=4))


def env_for(tmp_path, costs: str = "gpu") -> dict:
    """A fresh cache, and a simulated machine (``gpu``: drafting pays; ``steep``: nothing does)."""
    return simulated_costs(costs, {**os.environ, "SPECLI_CACHE": str(tmp_path / "cache")})


def run(path, draft, env, *extra, prompt=PROMPT, n="40"):
    rc, out, err = specli("run", "--target", path, "--draft", draft, "--raw", "--prompt", prompt, "-n", n, "-t", "2",
                          "--json", "--stats", *extra, env=env)
    assert rc == 0, err
    return json.loads(out), err


def tensors(path) -> dict:
    import gguf
    return {t.name: np.array(t.data) for t in gguf.GGUFReader(path).tensors}


def test_the_derived_file_holds_the_kept_blocks_renumbered(tiny4, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLI_CACHE", str(tmp_path))
    h = read_gguf(tiny4)
    src = tensors(tiny4)
    for spec, kept in (("early-exit:1", [0]), ("early-exit:3", [0, 1, 2]), ("layer-skip:1-2", [0, 3]),
                       ("layer-skip:2", [0, 1, 3])):
        lay = derive.layers_for(derive.parse(spec), h)
        assert lay.kept == kept and lay.label == spec
        path, new = derive.derive(tiny4, lay)
        assert new and derive.derive(tiny4, lay) == (path, False)  # cached: derived once
        dh = read_gguf(path)
        assert dh.arch_key("block_count") == len(kept)
        got = tensors(path)
        assert {n for n in got if not n.startswith("blk.")} == {n for n in src if not n.startswith("blk.")}
        assert len(got) == len(src) - 9 * (4 - len(kept))  # 9 tensors a block
        for new_id, old in enumerate(kept):
            for name in ("attn_q.weight", "ffn_down.weight", "attn_norm.weight"):
                assert np.array_equal(got[f"blk.{new_id}.{name}"], src[f"blk.{old}.{name}"])
        assert np.array_equal(got["output.weight"], src["output.weight"])
    assert not [p for p in os.listdir(tmp_path / "derived") if p.endswith(".tmp")]  # nothing half written


def test_per_layer_arrays_are_cut_to_the_kept_layers(smol_gguf, tmp_path, monkeypatch):
    """llama.cpp's pruning copies a per-layer array whole (llama.cpp #27976), which its loader
    then refuses ("wrong array length"); the gguf writer's copy cuts it. (llama's graph sizes
    every layer's K/V by the largest count, so the values are equal here.)"""
    monkeypatch.setenv("SPECLI_CACHE", str(tmp_path))
    target = str(tiny_model(TEST_CACHE, smol_gguf, seed=0, attn_scale=0.3, n_layer=4, n_head_kv=[2, 2, 2, 2]))
    h = read_gguf(target)
    assert derive.per_layer_arrays(h) == ["llama.attention.head_count_kv"]
    lay = derive.layers_for(derive.parse("layer-skip:1"), h)
    stale = str(tmp_path / "stale.gguf")
    derive.prune_with_llama(target, stale, lay, 2)
    assert list(read_gguf(stale).arch_key("attention.head_count_kv")) == [2, 2, 2, 2]
    with pytest.raises(SpecliError, match="could not load"):
        Model(stale)
    path, _ = derive.derive(target, lay)
    assert list(read_gguf(path).arch_key("attention.head_count_kv")) == [2, 2, 2]
    m = Model(path)
    m.close()


def test_bad_specs_are_one_line(tiny4, tmp_path):
    env = env_for(tmp_path)
    for spec, why in (("early-exit:99", "has 4 layers; exit after 1 to 3"),
                      ("early-exit:4", "exit after 1 to 3"),
                      ("layer-skip:0", "keeps the first and last layers"),
                      ("layer-skip:3", "keeps the first and last layers"),
                      ("layer-skip:2-1", "name the layers to skip"),
                      ("layer-skip:a,b", "name the layers to skip"),
                      ("early-exit:x", "E is a layer count"),
                      ("early-exit:", "give the layers after ':'")):
        rc, out, err = specli("run", "--target", tiny4, "--draft", spec, "--prompt", "hi", "-n", "3", env=env)
        assert rc == 1 and err.count("\n") == 1 and why in err and "Traceback" not in err, (spec, err)


@pytest.mark.parametrize("draft", ["early-exit:1", "layer-skip:1-2"])
def test_greedy_and_seeded_text_equals_plain_decoding(tiny4, tmp_path, draft):
    env = env_for(tmp_path)
    for extra in ((), ("--temp", "0.8", "--seed", "7")):
        plain, _ = run(tiny4, "none", env, *extra)
        for how, mode in ((("--lookup",), f"{draft}+lookup"), (("--no-lookup",), draft),
                          (("--no-lookup", "--fixed"), f"{draft}-fixed")):
            got, err = run(tiny4, draft, env, *how, *extra)
            st = got["stats"]
            assert st["mode"] == mode and f"mode {mode}" in err
            assert st["drafted"] > 0 and got["tokens"] == plain["tokens"], (extra, how, st)


def test_a_derived_draft_is_cached_and_the_choice_is_measured_once(tiny4, tmp_path):
    env = env_for(tmp_path)
    plain, _ = run(tiny4, "none", env)
    first, err = run(tiny4, "early-exit", env)
    assert "measuring early-exit:1 as a draft" in err and "chosen by measurement;" in err
    label = first["stats"]["mode"].removesuffix("+lookup")
    assert label.startswith("early-exit:") and first["tokens"] == plain["tokens"]
    files = sorted(os.listdir(tmp_path / "cache" / "derived"))
    assert len([f for f in files if f.endswith(".gguf")]) == 3 and any(f.endswith("-choice.json") for f in files)
    again, err = run(tiny4, "early-exit", env)
    assert "measuring" not in err and "chosen by measurement; cached at" in err
    assert again["stats"]["mode"] == first["stats"]["mode"] and again["tokens"] == plain["tokens"]
    rc, out, err = specli("check", tiny4, "early-exit", env=env)
    assert rc == 0 and f"draft: {label}, derived from the target" in out and "<- chosen" in out
    assert out.count("acceptance") == 3


def test_a_declared_exit_is_used(smol_gguf, tmp_path):
    target = str(tiny_model(TEST_CACHE, smol_gguf, seed=0, attn_scale=0.3, n_layer=4,
                            metadata={"llama.early_exit_layer": 2}))
    got, err = run(target, "early-exit", env_for(tmp_path))
    assert got["stats"]["mode"] == "early-exit:2+lookup" and "the exit the model declares" in err
    assert "measuring" not in err


def test_bench_names_the_modes_by_their_layers(tiny4, tmp_path):
    suite = tmp_path / "s.yaml"
    suite.write_text("prompts:\n  - id: one\n    text: Once upon a time\n  - id: two\n    text: def fibonacci(n)\n")
    rc, out, err = specli("bench", "--target", tiny4, "--draft", "layer-skip:1-2", "--suite", str(suite), "-n", "16",
                          "-t", "2", "--modes", "none,model,hybrid,lookup", "--json", env=env_for(tmp_path))
    assert rc == 0, err
    modes = json.loads(out)["modes"]
    assert list(modes) == ["none", "lookup", "layer-skip:1-2", "layer-skip:1-2+lookup"]
    for m in ("layer-skip:1-2", "layer-skip:1-2+lookup"):
        assert modes[m]["drafted"] > 0 and set(modes[m]["lossless"].values()) == {"identical"}, modes[m]


def test_draft_auto_takes_a_derived_draft_only_when_it_pays(smol_gguf, tmp_path):
    target = str(tiny_model(TEST_CACHE, smol_gguf, seed=0, attn_scale=0.3, n_layer=8))
    steep = env_for(tmp_path / "steep", "steep")
    got, err = run(target, "auto", steep)
    assert got["stats"]["mode"] == "lookup" and "no draft derived from the target's own layers pays" in err
    gpu = env_for(tmp_path / "gpu", "gpu")
    plain, _ = run(target, "none", gpu)
    got, err = run(target, "auto", gpu)
    mode = got["stats"]["mode"]
    assert mode.startswith(("early-exit:", "layer-skip:")) and "measured to pay" in err
    assert got["tokens"] == plain["tokens"]
    # a target of a few layers has none to spare: auto goes on to prompt lookup without measuring
    small, err = run(str(tiny_model(TEST_CACHE, smol_gguf, seed=0, attn_scale=0.3)), "auto", gpu)
    assert small["stats"]["mode"] == "lookup" and "derived" not in err


@pytest.mark.parametrize("draft", ["early-exit:2", "layer-skip:1-2"])
def test_a_hybrid_target_drafts_from_its_own_layers_losslessly(smol_gguf, tmp_path, draft):
    target = str(tiny_2026_model(TEST_CACHE, smol_gguf, "qwen35", n_layer=4))
    env = env_for(tmp_path)
    for extra in ((), ("--temp", "0.8", "--seed", "3")):
        plain, _ = run(target, "none", env, *extra)
        got, err = run(target, draft, env, *extra)
        assert got["stats"]["mode"] == f"{draft}+lookup" and got["stats"]["drafted"] > 0
        assert got["tokens"] == plain["tokens"] and "hybrid/recurrent" in err
    # renumbering must keep each layer's kind (every 2nd layer attends): skipping layer 1 alone would not
    rc, out, err = specli("run", "--target", target, "--draft", "layer-skip:1", "--prompt", "hi", env=env)
    assert rc == 1 and err.count("\n") == 1 and "skip whole groups of 2" in err


def test_early_exit_on_the_real_coder(real_model, tmp_path):
    target = real_model("qwen2.5-coder-1.5b-instruct-q4_k_m")
    env = {**os.environ, "SPECLI_CACHE": str(tmp_path)}
    prompt = "Write a Python function that reverses a string."
    plain, _ = run(target, "none", env, prompt=prompt, n="24")
    got, err = run(target, "early-exit:14", env, "--fixed", "--no-lookup", prompt=prompt, n="24")
    dh = read_gguf(err.split("derived at ")[1].split()[0])
    assert dh.arch_key("block_count") == 14 and dh.architecture == "qwen2"
    assert got["stats"]["mode"] == "early-exit:14-fixed" and got["stats"]["drafted"] > 0
    assert got["text"] == plain["text"] and got["tokens"] == plain["tokens"]
