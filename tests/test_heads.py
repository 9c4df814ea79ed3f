"""Trained drafting heads in separate GGUFs: an MTP-only head (a *sidecar*, llama.cpp's
``--spec-draft-model SIDECAR --spec-type draft-mtp``) drafting for a trunk converted without
its MTP block, on tiny generated qwen35 halves (tests/tiny2026.py: the trunk and the sidecar of
one model); EAGLE-3 heads (llama.cpp's ``draft-eagle3``) drafting for a tiny llama
(tests/tinyheads.py); DFlash heads (llama.cpp's ``draft-dflash``: a block a pass) drafting for a
tiny llama that copies (tests/tinyheads.py); DFlash2 and DSpark heads recognised and refused.
f32 weights and an f32 KV cache: every output must match plain greedy decoding token for token."""

import json
import shlex

import numpy as np
import pytest
from clihelp import specli
from conftest import TEST_CACHE
from constrainhelp import EMAIL
from curves import gpu_like_costs
from hybridhelp import CHECKPOINTS, PROMPTS, SNAPSHOTS, assert_sampling_follows_the_target, cache_env, cfg, run, run_cli
from tiny2026 import _write, tiny_2026_model
from tinyheads import tiny_head_model
from tinymodels import read_tokenizer

from specli.constrain import Constraint
from specli.engine import Context, Model
from specli.errors import SpecliError
from specli.resolve.gguf_header import read_gguf
from specli.speculate.drafters import NoDrafter
from specli.speculate.heads import DFlashDrafter, Eagle3Drafter, dflash_context, eagle3_context, layer_ids
from specli.speculate.loop import generate
from specli.speculate.mtp import MTPDrafter
from specli.speculate.verify import SamplingParams


def sidecar_drafter(target, sidecar, cfg):
    """The MTP drafter on an MTP-only head, wired as the session wires it."""
    d = MTPDrafter(target, target.mtp_context(cfg, sidecar), p_min=0.0)
    target.listen(d, replay=True)
    return d


def dflash_drafter(target, head, cfg, n_max=8):
    """The DFlash drafter, wired as the session wires it."""
    d = DFlashDrafter(target, dflash_context(target, head, cfg), p_min=0.0, n_max=n_max)
    target.listen(d, replay=True)
    return d


def eagle3_drafter(target, head, cfg):
    """The EAGLE-3 drafter, wired as the session wires it."""
    d = Eagle3Drafter(target, eagle3_context(target, head, cfg), p_min=0.0)
    target.listen(d, replay=True)
    return d


@pytest.fixture(scope="session")
def halves(smol_gguf):
    """(trunk, MTP-only head) paths of one tiny qwen35 model, per mode; ``other`` a head of
    another hidden size (built for another target)."""
    def get(mode, **kw):
        return (str(tiny_2026_model(TEST_CACHE, smol_gguf, f"qwen35-trunk-{mode}", **kw)),
                str(tiny_2026_model(TEST_CACHE, smol_gguf, f"qwen35-mtp-only-{mode}", **kw)))
    return get


def test_headers_say_what_each_half_is(halves):
    trunk, head = halves("partial")
    th, hh = read_gguf(trunk), read_gguf(head)
    assert th.head_kind is None and th.mtp_layers == 0
    assert hh.head_kind == "mtp-only" and hh.mtp_layers == 1 and not hh.mtp_usable  # no trunk of its own
    assert not hh.has_tensor("blk.0.attn_norm.weight") and hh.has_tensor("blk.2.nextn.eh_proj.weight")


@pytest.mark.parametrize("n_rs_seq", [SNAPSHOTS, CHECKPOINTS])
@pytest.mark.parametrize("mode", ["full", "partial"])
def test_a_sidecar_head_drafts_for_its_trunk_losslessly(halves, mode, n_rs_seq):
    trunk, head = halves(mode)
    model, sidecar = Model(trunk), Model(head, load_mtp=True)
    assert model.n_mtp_layers == 0 and sidecar.n_mtp_layers == 1
    drafted = accepted = 0
    for text in PROMPTS[:2]:
        prompt = model.tokenize(text)
        plain, *_ = run(model, prompt, lambda c: NoDrafter(), n_rs_seq)
        out, st, c = run(model, prompt, lambda c: sidecar_drafter(c, sidecar, cfg(n_rs_seq)), n_rs_seq)
        assert out == plain, text
        assert c.tokens == prompt + out[:-1]
        drafted, accepted = drafted + st.drafted, accepted + st.accepted
    if mode == "full":  # the sidecar is the MTP block that predicts exactly what the trunk says
        assert drafted > 0 and accepted == drafted
    else:
        assert 0 < accepted < drafted


def test_a_sidecar_of_another_model_is_refused_before_llama_cpp_sees_it(halves):
    trunk, _ = halves("full")
    _, other = halves("full", d=32, ff=64)
    model = Model(trunk)
    with pytest.raises(SpecliError, match="hidden size 32, the target's is 64"):
        Context(model, cfg(0)).mtp_context(cfg(0), Model(other, load_mtp=True))


def test_sidecar_sampling_follows_the_target_distribution(halves):
    trunk, head = halves("partial")
    model, sidecar = Model(trunk), Model(head, load_mtp=True)
    gen = Context(model, cfg(SNAPSHOTS))
    assert_sampling_follows_the_target(model, gen, sidecar_drafter(gen, sidecar, cfg(SNAPSHOTS)), SNAPSHOTS, 800)


def test_cli_draft_head_runs_mtp_on_it_and_check_explains_the_fit(halves, tmp_path):
    env = cache_env(tmp_path)
    trunk, head = halves("full")
    plain, _ = run_cli(trunk, "none", env, PROMPTS[0])
    run_cli(trunk, head, env, PROMPTS[0])  # measures and caches this machine's costs
    gpu_like_costs(tmp_path)
    got, err = run_cli(trunk, head, env, PROMPTS[0])
    assert "is an MTP-only head (llama.cpp draft-mtp with a separate model): drafting with its MTP layers" in err
    st = got["stats"]
    assert st["mode"] == "mtp-lookup" and st["drafted"] > 0 and st["accepted"] == st["drafted"]
    assert got["tokens"] == plain["tokens"] and got["text"] == plain["text"]
    rc, out, err = specli("check", trunk, head, env=env)
    assert rc == 0, err
    assert "draft: an MTP-only head" in out and "✓ hidden size: head reads rows of 64, the target's are 64" in out
    assert "✓ layers: head placed after layer 2, the target has 2" in out and "compatible" in out
    # a head built for another target: one line, from the headers, before anything loads
    _, other = halves("full", d=32, ff=64)
    rc, out, err = specli("run", "--target", trunk, "--draft", other, "--raw", "--prompt", "hi", env=env)
    assert rc != 0 and err.count("\n") == 1
    assert "built for another target (hidden size: head reads rows of 32, the target's are 64)" in err
    rc, out, err = specli("check", trunk, other, env=env)
    assert rc == 1 and "✗ hidden size" in out and "built for another target" in err


@pytest.fixture(scope="session")
def eagle(smol_gguf):
    """(bigram llama target, EAGLE-3 head) paths (tests/tinyheads.py); ``mode`` full: every draft
    right when the call sequence is; partial: the target's features enter, drafts sometimes wrong."""
    def get(mode, **kw):
        return (str(tiny_head_model(TEST_CACHE, smol_gguf, "bigram")),
                str(tiny_head_model(TEST_CACHE, smol_gguf, f"eagle3-{mode}", **kw)))
    return get


@pytest.fixture(scope="session")
def dflash(smol_gguf):
    """(copy llama target, DFlash head) paths (tests/tinyheads.py); ``mode`` full: every draft right
    when the call sequence is (features injected at their positions, the block where llama.cpp
    puts it); partial: FFN noise and layer 1's features, drafts sometimes wrong."""
    def get(mode, **kw):
        return (str(tiny_head_model(TEST_CACHE, smol_gguf, "copy")),
                str(tiny_head_model(TEST_CACHE, smol_gguf, f"dflash-{mode}", **kw)))
    return get


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_head_sampling_follows_the_target_distribution(eagle, dflash, kind):
    """T > 0: the EAGLE-3 head partial (its drafts sometimes wrong), the DFlash head full (right
    at greedy, so the sampled tokens make the drafts partly wrong)."""
    target_path, head_path = eagle("partial", g_weight=0.1) if kind == "eagle3" else dflash("full")
    make = eagle3_drafter if kind == "eagle3" else dflash_drafter
    model, head = Model(target_path), Model(head_path)
    gen = Context(model, cfg(0))
    assert_sampling_follows_the_target(model, gen, make(gen, head, cfg(0)), 0, 800)


def refused_for_another_target(target: str, head: str, env: dict, what: str, hidden: int, layers: list[int]) -> None:
    """``run`` refuses a head built for another target in one line; ``check`` names the rules it fails
    (the tiny targets' rows are 64 wide, from 2 layers)."""
    rc, out, err = specli("run", "--target", target, "--draft", head, "--raw", "--prompt", "hi", env=env)
    assert rc != 0 and err.count("\n") == 1
    assert f"is {what} built for another target (hidden size" in err
    rc, out, err = specli("check", target, head, env=env)
    assert rc == 1 and f"✗ hidden size: head reads rows of {hidden}, the target's are 64" in out
    assert f"✗ target layers: head reads layers {layers}, the target has 2" in out


def test_cli_draft_eagle3_head_and_check(eagle, smol_gguf, tmp_path):
    env = cache_env(tmp_path)
    target, head = eagle("full")
    plain, _ = run_cli(target, "none", env, PROMPTS[0])
    run_cli(target, head, env, PROMPTS[0])
    gpu_like_costs(tmp_path)
    got, err = run_cli(target, head, env, PROMPTS[0])
    assert "is an EAGLE-3 head (llama.cpp draft-eagle3): drafting with it, fed the target's layers [0, 1, 1]" in err
    st = got["stats"]
    assert st["mode"] == "eagle3-lookup" and st["drafted"] > 0 and st["accepted"] == st["drafted"]
    assert got["tokens"] == plain["tokens"]
    rc, out, err = specli("check", target, head, env=env)
    assert rc == 0, err
    assert "draft: an EAGLE-3 head (llama.cpp draft-eagle3)" in out and "✓ hidden size" in out
    assert "✓ target layers: head reads layers [0, 1, 1], the target has 2" in out and "compatible" in out
    # a head built for another target (its hidden size and layers): one line, from the headers
    other = str(tiny_head_model(TEST_CACHE, smol_gguf, "eagle3-full", target_hidden=4096, layers=(2, 20, 40)))
    refused_for_another_target(target, other, env, "an EAGLE-3 head (llama.cpp draft-eagle3)", 4096, [2, 20, 40])


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_a_head_drafts_under_a_constraint_as_the_grammar_masks(eagle, dflash, kind):
    """Under a regex a head's greedy drafts are masked by the grammar as the target's rows are
    (the EAGLE-3 drafter is the MTP drafter one position behind, its guide included; DFlash's
    block rows are read in order under the guide): the output is plain constrained decoding's,
    and the full EAGLE-3 head's drafts are all kept."""
    target_path, head_path = (eagle if kind == "eagle3" else dflash)("full")
    make = eagle3_drafter if kind == "eagle3" else dflash_drafter
    model, head = Model(target_path), Model(head_path)
    constraint = Constraint.regex(EMAIL)
    prompt = model.tokenize(PROMPTS[0])
    plain = generate(Context(model, cfg(0)), prompt, NoDrafter(), SamplingParams(), 40, 4, constraint=constraint)
    c = Context(model, cfg(0))
    d = make(c, head, cfg(0))
    resp = generate(c, prompt, d, SamplingParams(), 40, 4, constraint=constraint)
    assert [t for ch in resp for t in ch.tokens] == [t for ch in plain for t in ch.tokens]
    assert d.guide is not None  # the loop's guide reached the head's drafting
    st = resp.stats
    assert st.drafted > 0 and (kind == "dflash" or st.accepted == st.drafted), (st.drafted, st.accepted)
    d.close()


def test_export_names_the_head_as_llama_server_drafts_with_it(eagle, halves, dflash, tmp_path):
    """``specli export`` of a head: llama-server's draft model is the head's file, its
    --spec-type the head's (draft-eagle3, draft-mtp, draft-dflash); engines that load safetensors
    refuse it."""
    env = {**cache_env(tmp_path), "SPECLI_VRAM": "0"}
    for (target, head), kind in ((eagle("full"), "draft-eagle3"), (halves("full"), "draft-mtp"),
                                 (dflash("full"), "draft-dflash")):
        rc, out, err = specli("export", "--target", target, "--draft", head, "--to", "llama-server", env=env)
        assert rc == 0, err
        cmd = shlex.split(out.splitlines()[-1])
        assert cmd[cmd.index("-m") + 1] == target and cmd[cmd.index("-md") + 1] == head
        assert cmd[cmd.index("--spec-type") + 1] == f"ngram-simple,{kind}"
        if kind == "draft-dflash":  # llama.cpp's clamp to the block, said by the command itself
            assert int(cmd[cmd.index("--spec-draft-n-max") + 1]) <= 3
        rc, out, err = specli("export", "--target", target, "--draft", head, "--to", "vllm", "--hf-target", "o/t",
                              env=env)
        assert rc == 1 and err.count("\n") == 1 and "cannot load a GGUF drafting head" in err


@pytest.mark.parametrize("mode", ["full", "partial"])
@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_a_head_drafts_losslessly(eagle, dflash, kind, mode):
    """EAGLE-3: right only if fed (token at P+1, features of P) at P, rejected rows dropped;
    DFlash: right only if the rows sit at their positions and the block after them."""
    target_path, head_path = (eagle if kind == "eagle3" else dflash)(mode)
    make = eagle3_drafter if kind == "eagle3" else dflash_drafter
    model, head = Model(target_path), Model(head_path)
    assert read_gguf(head_path).head_kind == kind
    assert layer_ids(head) == ([0, 1, 1] if kind == "eagle3" else [0, 1])
    drafted = accepted = 0
    for text in PROMPTS[:2]:
        prompt = model.tokenize(text)
        plain, *_ = run(model, prompt, lambda c: NoDrafter(), 0)
        out, st, c = run(model, prompt, lambda c: make(c, head, cfg(0)), 0, k=4 if kind == "eagle3" else 8)
        assert out == plain, text
        assert c.tokens == prompt + out[:-1]
        drafted, accepted = drafted + st.drafted, accepted + st.accepted
    if mode == "full":
        assert drafted > 0 and accepted == drafted
    else:
        assert 0 < accepted < drafted


def test_dflash_drafts_at_most_its_block_and_drops_the_block_again(dflash):
    """The block (``dflash.block_size`` 4) bounds the draft, whatever is asked (llama.cpp clamps
    n_max to block_size - 1); after drafting, the head's cache holds the target's rows only."""
    target_path, head_path = dflash("full")
    model, head = Model(target_path), Model(head_path)
    c = Context(model, cfg(0))
    d = dflash_drafter(c, head, cfg(0), n_max=16)
    assert (d.block, d.max_len) == (4, 3)
    prompt = model.tokenize(PROMPTS[0])
    c.eval(prompt[:-1], "none")
    assert d.ctx.tokens == prompt[:-1]
    draft = d.propose(prompt, 16)
    assert len(draft.tokens) == 3 and draft.passes == 0
    assert d.ctx.tokens == prompt[:-1]  # the block's rows are gone before the target verifies
    assert dflash_drafter(Context(model, cfg(0)), head, cfg(0), n_max=2).block == 3
    # the target keeps fewer tokens: the head's rows past them go too
    c.eval(draft.tokens, "none")
    c.rollback(len(prompt) - 1)
    assert d.ctx.tokens == prompt[:-1]
    d.close()


def test_cli_draft_dflash_head_and_check(dflash, smol_gguf, tmp_path):
    env = cache_env(tmp_path)
    target, head = dflash("full")
    plain, _ = run_cli(target, "none", env, PROMPTS[0])
    run_cli(target, head, env, PROMPTS[0], "--no-lookup")  # measures and caches this machine's costs
    gpu_like_costs(tmp_path)
    got, err = run_cli(target, head, env, PROMPTS[0], "--no-lookup")
    assert ("is a DFlash head (llama.cpp draft-dflash): drafting a block of up to 3 tokens a pass, "
            "fed the target's layers [0, 1]") in err
    st = got["stats"]
    assert st["mode"] == "dflash" and st["drafted"] > 0 and st["accepted"] == st["drafted"]
    assert got["tokens"] == plain["tokens"]
    got, _ = run_cli(target, head, env, PROMPTS[1])
    assert got["stats"]["mode"] == "dflash-lookup"
    rc, out, err = specli("check", target, head, env=env)
    assert rc == 0, err
    assert "draft: a DFlash head (llama.cpp draft-dflash)" in out and "✓ hidden size" in out
    assert "✓ target layers: head reads layers [0, 1], the target has 2" in out
    assert "✓ mask token: token 12345, the target's vocabulary has 49152" in out
    assert "block: 4 tokens, a draft of up to 3 in one pass" in out
    assert "(--draft HEAD drafts with it: DFlash, a block a pass)" in out
    # a head built for another target (its hidden size and layers): one line, from the headers
    other = str(tiny_head_model(TEST_CACHE, smol_gguf, "dflash-full", target_hidden=128, d=128, layers=(3, 30)))
    refused_for_another_target(target, other, env, "a DFlash head (llama.cpp draft-dflash)", 128, [3, 30])
    # no mask token: the block cannot be built
    nomask = str(tiny_head_model(TEST_CACHE, smol_gguf, "dflash-full", mask_token=None))
    rc, out, err = specli("run", "--target", target, "--draft", nomask, "--raw", "--prompt", "hi", env=env)
    assert rc != 0 and err.count("\n") == 1 and "(mask token: the head names none)" in err
    # DFlash2 (a selector lattice) and DSpark (a Markov head): recognised, checked, refused in one line
    tok = read_tokenizer(smol_gguf)
    kv = [("u32", "embedding_length", 64), ("u32", "block_count", 1), ("u32", "block_size", 16),
          ("u32", "tokenizer.ggml.mask_token_id", 5), ("arr_i32", "target_layers", [0, 1])]
    fc = {"fc.weight": np.zeros((64, 128), np.float32)}
    dflash2 = _write(tmp_path / "dflash2.gguf", "dflash", tok, kv + [("u32", "selector_top_k", 4)], fc)
    dspark = _write(tmp_path / "dspark.gguf", "dflash", tok, kv, {**fc, "markov_w1.weight": np.zeros((8, 8))})
    for path, what in ((dflash2, "a DFlash2 head"), (dspark, "a DSpark head")):
        rc, out, err = specli("check", target, str(path), env=env)
        assert rc == 1 and f"it is {what}" in err and "specli does not draft with it" in err, err
        rc, out, err = specli("run", "--target", target, "--draft", str(path), "--raw", "--prompt", "hi", env=env)
        assert rc != 0 and err.count("\n") == 1 and f"is {what}" in err, err


def test_the_memory_plan_counts_a_head_as_a_draft_model(dflash, halves, tmp_path):
    """A head's weights, its own context's KV and its buffers count as a draft model's: where the
    GPU holds the target alone, prompt lookup drafts instead of the head; where it holds both, the
    head drafts beside the target on the GPU. An MTP-only head's KV is its MTP layers' alone."""
    from specli.hardware.plan import memory_from_header

    target, head = dflash("full")
    t, h = (memory_from_header(read_gguf(p)) for p in (target, head))
    hh = read_gguf(head)
    assert h.weights == sum(x.nbytes for x in hh.tensors) and h.input_bytes == 0  # it borrows the embeddings
    assert h.kv_bytes_per_token == 1 * 4 * (16 + 16) * 2  # one layer, 4 KV heads of 16, f16 K and V
    both = t.gpu_bytes(-1, 512) + h.gpu_bytes(-1, 512)
    env = cache_env(tmp_path)

    def plan(budget):
        rc, out, err = specli("run", "--target", target, "--draft", head, "--plan", "--ctx", "512",
                              "--vram", f"{budget}B", env=env)
        assert rc == 0, err
        return out

    out = plan(both)
    assert "drafter: dflash-lookup" in out and "head tiny-dflash" not in out and "[both-gpu]" in out, out
    assert "+ head 0.2 MiB" in out
    out = plan(both - 1)
    assert "drafter: lookup" in out and "[target-gpu-lookup]" in out, out
    assert t.gpu_bytes(-1, 512) <= both - 1  # the target alone fits: the head's share decided it
    _, sidecar = halves("full")
    s = memory_from_header(read_gguf(sidecar))
    assert s.kv_bytes_per_token == 1 * 2 * (16 + 16) * 2  # the MTP layer only: 2 KV heads of 16


def test_pairs_and_draft_auto_know_dflash_heads_on_disk(dflash, smol_gguf, tmp_path):
    """``specli pairs`` lists the DFlash heads of the target's tokenizer on disk: the one that fits
    (and ``--draft auto`` takes it, the target having no MTP layers), one built for another target
    with the rules it fails, a DFlash2 head with why specli does not draft with it."""
    from storehelp import clean_env

    target, head = dflash("full")
    other = str(tiny_head_model(TEST_CACHE, smol_gguf, "dflash-full", target_hidden=128, d=128, layers=(3, 30)))
    mine = tmp_path / "models"
    mine.mkdir()
    for src, name in ((target, "copy.gguf"), (head, "dflash-copy.gguf"), (other, "dflash-other.gguf")):
        (mine / name).symlink_to(src)
    kv = [("u32", "embedding_length", 64), ("u32", "block_count", 1), ("u32", "block_size", 16),
          ("u32", "tokenizer.ggml.mask_token_id", 5), ("arr_i32", "target_layers", [0, 1]),
          ("u32", "selector_top_k", 4)]
    _write(mine / "dflash2.gguf", "dflash", read_tokenizer(smol_gguf), kv, {"fc.weight": np.zeros((64, 128))})
    home = tmp_path / "home"
    home.mkdir()
    env = clean_env(home, SPECLI_MODEL_DIRS=mine, SPECLI_CONFIG_DIR=home / "cfg", SPECLI_CACHE=tmp_path / "cache")
    copy = str(mine / "copy.gguf")
    rc, out, err = specli("pairs", copy, "--json", env=env)
    assert rc == 0, err
    ((group),) = json.loads(out)
    assert group["drafts"] == []  # heads are not draft models
    heads = {h["name"].rsplit("/", 1)[-1]: h for h in group["heads"]}
    assert set(heads) == {"dflash-copy.gguf", "dflash-other.gguf", "dflash2.gguf"}, heads
    assert heads["dflash-copy.gguf"]["drafts"] and heads["dflash-copy.gguf"]["kind"] == "dflash"
    assert not heads["dflash-other.gguf"]["fits"]
    assert any(p.startswith("target layers: head reads layers [3, 30]") for p in heads["dflash-other.gguf"]["problems"])
    assert heads["dflash2.gguf"]["fits"] and not heads["dflash2.gguf"]["drafts"]
    assert "DFlash2" in heads["dflash2.gguf"]["not_drafted_because"]
    rc, out, err = specli("pairs", copy, env=env)
    assert rc == 0 and "DFlash head" in out and "fits this target" in out and "specli does not draft with" in out
    rc, out, err = specli("run", "--target", copy, "--draft", "auto", "--raw", "--prompt", PROMPTS[0], "-n", "12",
                          "-t", "2", "--json", env=env)
    assert rc == 0, err
    assert "dflash-copy.gguf), found on disk: a DFlash head (llama.cpp draft-dflash) that fits this target" in err
    assert "skipped" in err and "dflash-other.gguf" in err
    assert json.loads(out)["stats"]["mode"] == "dflash-lookup"
