"""The VRAM fallback and self-speculation (issue 39): where the GPU holds the target but not a
draft model beside it, the plan drafts with the draft ``--draft auto`` would derive from the
target's own layers (its kept blocks and output matrix counted), taken only where it is
measured to pay and fits, before falling back to prompt lookup; each way is one line."""

import json
import os

import pytest
from clihelp import simulated_costs, specli
from conftest import TEST_CACHE
from tinymodels import tiny_model

from specli.hardware.plan import derived_memory, make_plan, memory_from_header
from specli.resolve import derive
from specli.resolve.gguf_header import read_gguf

CTX = 512


@pytest.fixture(scope="module")
def pair(smol_gguf) -> tuple[str, str]:
    """An 8-layer target (enough layers to spare) and a draft model of its tokenizer as large."""
    return (str(tiny_model(TEST_CACHE, smol_gguf, seed=0, attn_scale=0.3, n_layer=8)),
            str(tiny_model(TEST_CACHE, smol_gguf, seed=1, attn_scale=0.3, n_layer=8)))


def sizes(target, draft):
    t, d = (memory_from_header(read_gguf(p)) for p in (target, draft))
    return t, d, t.gpu_bytes(-1, CTX), d.gpu_bytes(-1, CTX)


def env_for(tmp_path, costs):
    env = simulated_costs(costs, {**os.environ, "SPECLI_CACHE": str(tmp_path / "cache")})
    env.pop("SPECLI_VRAM", None)
    return env


def plan(pair, budget, env):
    rc, out, err = specli("run", "--target", pair[0], "--draft", pair[1], "--plan", "--ctx", str(CTX), "-t", "2",
                          "--vram", f"{budget}B", env=env)
    assert rc == 0 and "Traceback" not in err, err
    return out


def run(pair, draft, env, *extra):
    rc, out, err = specli("run", "--target", pair[0], "--draft", draft, "--ctx", str(CTX), "-t", "2", "--raw",
                          "--prompt", "Once upon a time", "-n", "32", "--json", "--stats", *extra, env=env)
    assert rc == 0, err
    return json.loads(out), err


def test_the_plan_counts_the_derived_drafts_kept_blocks_and_output(pair, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLI_CACHE", str(tmp_path))
    t, d, t_full, d_full = sizes(*pair)
    h = read_gguf(pair[0])
    for spec in ("early-exit:2", "layer-skip:3-4"):
        lay = derive.layers_for(derive.parse(spec), h)
        own = derived_memory(t, lay.kept, lay.label)
        got = memory_from_header(read_gguf(derive.derive(pair[0], lay)[0]))
        assert (own.n_layer, own.layer_bytes, own.output_bytes, own.input_bytes, own.kv_bytes_per_token) == \
            (got.n_layer, got.layer_bytes, got.output_bytes, got.input_bytes, got.kv_bytes_per_token)
        assert own.weights < d.weights  # what makes it fit where a second model does not
        need = t_full + own.gpu_bytes(-1, CTX)
        p = make_plan(t, d, need, CTX, True, wants_draft="hybrid", own=own)
        assert (p.branch, p.draft, p.draft_gpu_layers, p.own_label) == ("target-gpu-own", "hybrid", -1, spec)
        assert f"drafting with {spec} from its own layers instead of the draft" in p.summary
        assert "\n" not in p.summary
        p = make_plan(t, d, need - 1, CTX, True, wants_draft="hybrid", own=own)  # a byte short
        assert (p.branch, p.draft, p.own_label) == ("target-gpu-lookup", "lookup", "")
        assert f"its own {spec}" in p.summary and "does not fit either" in p.summary
    # a draft model that fits is kept; nothing of the target's own is considered
    p = make_plan(t, d, t_full + d_full, CTX, True, wants_draft="hybrid", own=own)
    assert (p.branch, p.own_label) == ("both-gpu", "")


def test_the_fallback_drafts_with_the_targets_own_layers_where_that_pays(pair, tmp_path):
    _, _, t_full, d_full = sizes(*pair)
    env = env_for(tmp_path, "gpu")
    out = plan(pair, t_full + d_full, env)  # both fit: no measurement, no derived file
    assert "[both-gpu]" in out and not (tmp_path / "cache" / "derived").exists(), out
    budget = t_full + d_full - 1
    out = plan(pair, budget, env)
    assert "[target-gpu-own]" in out and "measured to pay" in out, out
    drafter = out.split("drafter: ")[1].split()[0]
    assert drafter.startswith(("early-exit:", "layer-skip:")) and drafter.endswith("+lookup"), out
    assert "derived      " in out  # the derived file, its weights and KV, in the plan
    plain, _ = run(pair, "none", env)
    for extra, mode in (((), drafter), (("--no-lookup", "--fixed"), drafter.replace("+lookup", "-fixed"))):
        got, err = run(pair, pair[1], env, "--vram", f"{budget}B", *extra)
        assert got["stats"]["mode"] == mode and got["stats"]["drafted"] > 0, (extra, got["stats"])
        assert got["tokens"] == plain["tokens"]
        notes = [line for line in err.splitlines() if "from its own layers instead of the draft" in line]
        assert len(notes) == 1 and "measured to pay" in notes[0], err
    # the derived draft must fit beside the target too: with room for the target alone, lookup
    out = plan(pair, t_full, env)
    assert "[target-gpu-lookup]" in out and "drafter: lookup" in out and "does not fit either" in out, out


def test_the_fallback_takes_prompt_lookup_where_no_derived_draft_pays(pair, tmp_path):
    _, _, t_full, d_full = sizes(*pair)
    env = env_for(tmp_path, "steep")
    budget = t_full + d_full - 1
    out = plan(pair, budget, env)
    assert "[target-gpu-lookup]" in out and "drafter: lookup" in out, out
    assert "using prompt lookup instead of the draft (no draft derived from its own layers pays here" in out
    got, err = run(pair, pair[1], env, "--vram", f"{budget}B")
    assert got["stats"]["mode"] == "lookup" and "pays here, measured" in err
    assert "derived      " not in out


def test_a_target_with_no_layers_to_spare_falls_back_to_lookup_unmeasured(smol_gguf, tmp_path):
    small = (str(tiny_model(TEST_CACHE, smol_gguf, seed=0, attn_scale=0.3)),
             str(tiny_model(TEST_CACHE, smol_gguf, seed=1, attn_scale=0.3)))
    _, _, t_full, d_full = sizes(*small)
    out = plan(small, t_full + d_full - 1, env_for(tmp_path, "gpu"))
    assert "[target-gpu-lookup]" in out and "own layers" not in out, out
    assert not (tmp_path / "cache" / "derived").exists()
