"""Speculation on hybrid and recurrent targets (rollback by recurrent-state snapshots or by
state checkpoints) and MTP self-speculation, on tiny generated models of 2026 architectures
(tests/tiny2026.py): f32 weights and an f32 KV cache, so every output must match plain
greedy decoding token for token."""

import json

import numpy as np
import pytest
from clihelp import specli
from conftest import TEST_CACHE
from curves import gpu_like_costs
from hybridhelp import CHECKPOINTS, PROMPTS, SNAPSHOTS, assert_sampling_follows_the_target, cache_env, cfg, run, run_cli
from tiny2026 import tiny_2026_model

from specli.chat import Chat
from specli.engine import Context, Model
from specli.measure import lossless
from specli.session import Options, Session
from specli.speculate.drafters import LookupDrafter, ModelDrafter, NoDrafter
from specli.speculate.mtp import MTPDrafter
from specli.speculate.verify import SamplingParams


@pytest.fixture(scope="session")
def tiny26(smol_gguf):
    return lambda kind: str(tiny_2026_model(TEST_CACHE, smol_gguf, kind))


def mtp_drafter(target, cfg):
    """The MTP drafter over ``target`` wired as the session wires it."""
    d = MTPDrafter(target, target.mtp_context(cfg), p_min=0.0)
    target.listen(d, replay=True)
    return d


def test_the_tiny_models_are_what_they_claim(tiny26):
    q = Model(tiny26("qwen35-mtp-partial"), load_mtp=True)
    assert q.recurrent and q.n_mtp_layers == 1 and q.header.mtp_usable
    assert Model(tiny26("qwen35")).header.mtp_layers == 0
    m = Model(tiny26("mamba"))
    assert m.recurrent and m.header.architecture == "mamba"
    snap, ckpt = Context(q, cfg(SNAPSHOTS)), Context(q, cfg(CHECKPOINTS))
    assert (snap.rollback_kind, snap.n_rs_seq) == ("snapshots", SNAPSHOTS) and ckpt.rollback_kind == "checkpoints"
    assert Context(m, cfg(SNAPSHOTS)).rollback_kind == "checkpoints"  # mamba has no snapshots in this llama.cpp


@pytest.mark.parametrize("n_rs_seq", [SNAPSHOTS, CHECKPOINTS])
@pytest.mark.parametrize("kind", ["qwen35-mtp-full", "qwen35-mtp-partial"])
def test_mtp_greedy_is_plain_greedy(tiny26, kind, n_rs_seq):
    model = Model(tiny26(kind), load_mtp=True)
    drafted = accepted = 0
    for text in PROMPTS:
        prompt = model.tokenize(text)
        plain, *_ = run(model, prompt, lambda c: NoDrafter(), n_rs_seq)
        out, st, c = run(model, prompt, lambda c: mtp_drafter(c, cfg(n_rs_seq)), n_rs_seq)
        assert out == plain, text
        assert c.tokens == prompt + out[:-1]  # the cache holds exactly what was kept
        drafted, accepted = drafted + st.drafted, accepted + st.accepted
    if kind == "qwen35-mtp-full":  # built so that the MTP head predicts what the trunk will say
        assert drafted > 0 and accepted == drafted
    else:
        assert 0 < accepted < drafted


@pytest.mark.parametrize("n_rs_seq", [SNAPSHOTS, CHECKPOINTS])
@pytest.mark.parametrize("kind", ["qwen35-mtp-full", "qwen35", "mamba"])
def test_lookup_and_draft_models_on_hybrid_and_recurrent_targets(tiny26, tiny_draft, kind, n_rs_seq):
    model = Model(tiny26(kind))
    base = model.tokenize(PROMPTS[0])
    first, *_ = run(model, base, lambda c: NoDrafter(), 0, n=24)
    prompt = base + first + base  # the answer to the repeated prompt can be copied from the first
    plain, *_ = run(model, prompt, lambda c: NoDrafter(), 0, n=48)
    out, st, c = run(model, prompt, lambda c: LookupDrafter(), n_rs_seq, k=6, n=48)
    assert out == plain and st.drafted > 0
    if kind == "qwen35-mtp-full":  # a bigram trunk: it answers the repeated prompt as before
        assert plain[:24] == first and st.accepted > 0.75 * st.drafted
    # a llama draft model (same tokenizer) for the recurrent target: partial acceptance
    dm = Model(tiny_draft)
    out, st, c = run(model, prompt, lambda c: ModelDrafter(dm, cfg(0), p_min=0.0), n_rs_seq, n=48)
    assert out == plain and st.drafted > st.accepted
    assert c.tokens == prompt + out[:-1]


def test_a_recurrent_draft_model_rolls_its_own_drafts_back(tiny26, smol_gguf):
    """A hybrid draft model drafts one decode per token, so its rollbacks cross several
    decodes: snapshots cannot do that (llama.cpp would accept the cut and keep a wrong state),
    checkpoints must. The draft context must end in exactly the state of a clean one."""
    target = Model(tiny26("qwen35"))
    other = Model(str(tiny_2026_model(TEST_CACHE, smol_gguf, "qwen35", seed=1)))
    for draft, all_accepted in ((target, True), (other, False)):
        prompt = target.tokenize(PROMPTS[1])
        plain, *_ = run(target, prompt, lambda c: NoDrafter(), 0)
        drafter = ModelDrafter(draft, cfg(SNAPSHOTS), p_min=0.0)
        out, st, _ = run(target, prompt, lambda c, d=drafter: d, SNAPSHOTS)
        assert out == plain and st.drafted > 0 and (st.accepted == st.drafted) == all_accepted
        dc = drafter.ctx
        assert dc.rollback_kind == "snapshots"
        held = list(dc.tokens)
        got = dc.eval([out[-1]])[0].copy()
        clean = Context(draft, cfg(0))
        ref = clean.eval(held + [out[-1]])[0].copy()
        np.testing.assert_allclose(got, ref, atol=1e-4)
        if not all_accepted:
            assert dc.n_restored > 0  # rejected drafts were rolled back by checkpoints


def test_a_memory_that_cannot_cut_back_is_decoded_again(tiny26, smol_gguf, monkeypatch):
    """Where neither mechanism works (no snapshot, no checkpoint), a rollback decodes the kept
    prefix again: slower, never wrong."""
    import specli.engine as engine

    model = Model(tiny26("qwen35"))
    prompt = model.tokenize(PROMPTS[2])
    plain, *_ = run(model, prompt, lambda c: NoDrafter(), 0)
    monkeypatch.setattr(engine.L, "llama_state_seq_get_data_ext", lambda *a: 0)  # no checkpoint can be taken
    other = Model(str(tiny_2026_model(TEST_CACHE, smol_gguf, "qwen35", seed=1)))
    out, st, c = run(model, prompt, lambda c: ModelDrafter(other, cfg(0), p_min=0.0), CHECKPOINTS)
    assert out == plain and st.drafted > st.accepted
    assert c.n_restored > 0 and c.n_replayed >= c.n_restored * len(prompt)  # the prompt, decoded again each time


def test_mtp_sampling_follows_the_target_distribution(tiny26):
    model = Model(tiny26("qwen35-mtp-partial"), load_mtp=True)
    gen = Context(model, cfg(SNAPSHOTS))
    assert_sampling_follows_the_target(model, gen, mtp_drafter(gen, cfg(SNAPSHOTS)), SNAPSHOTS, 2000)


def test_chat_on_a_hybrid_target_reuses_the_conversation(tiny26):
    path = tiny26("qwen35-mtp-partial")
    sess = Session(Options(target=path, draft="auto", f32_kv=True, threads=2))
    assert sess.drafter.name == "mtp-lookup"
    conv = Chat(sess, SamplingParams(), max_tokens=24)
    stream, _ = conv.send("Hello, who are you?")
    first = [t for ch in stream for t in ch.tokens]
    conv.finish()
    stream, _ = conv.send("Tell me more.")
    second = [t for ch in stream for t in ch.tokens]
    conv.finish()
    assert conv.last.prompt_tokens_cached > len(first)  # the first turn stayed in the cache
    # the same conversation decoded plainly from scratch gives the same second reply
    ref = Session(Options(target=path, draft="none", f32_kv=True, threads=2))
    replay = Chat(ref, SamplingParams(), max_tokens=24)
    stream, _ = replay.send("Hello, who are you?")
    assert [t for ch in stream for t in ch.tokens] == first
    replay.finish()
    stream, _ = replay.send("Tell me more.")
    assert [t for ch in stream for t in ch.tokens] == second
    sess.close()
    ref.close()


def test_cli_draft_auto_picks_mtp_and_says_so(tiny26, tmp_path):
    env, path = cache_env(tmp_path), tiny26("qwen35-mtp-full")
    plain, _ = run_cli(path, "none", env, PROMPTS[0])
    run_cli(path, "auto", env, PROMPTS[0])  # measures and caches this machine's costs
    gpu_like_costs(tmp_path)
    auto, err = run_cli(path, "auto", env, PROMPTS[0])
    assert "--draft auto: the target's own MTP layers (1), with prompt lookup" in err
    assert "rejected drafts roll back by recurrent-state snapshots" in err
    st = auto["stats"]
    assert st["mode"] == "mtp-lookup" and st["drafted"] > 0 and st["accepted"] == st["drafted"]
    assert "mode mtp-lookup" in err and auto["text"] == plain["text"] and auto["tokens"] == plain["tokens"]
    # a GGUF without its MTP block: --draft mtp is one line, auto moves on to lookup
    rc, out, err = specli("run", "--target", tiny26("qwen35"), "--draft", "mtp", "--raw", "--prompt", "hi", env=env)
    assert rc != 0 and err.count("\n") == 1 and "has no MTP layers" in err
    none, err = run_cli(tiny26("qwen35"), "auto", env, PROMPTS[0])
    assert "using prompt lookup" in err and none["stats"]["mode"] == "lookup"
    assert "has no MTP layers (qwen35.nextn_predict_layers is absent: converted without its MTP block)" in err


def test_cli_lookup_on_a_hybrid_target(tiny26, tmp_path):
    env, path = cache_env(tmp_path), tiny26("qwen35-mtp-full")
    first, _ = run_cli(path, "none", env, PROMPTS[0])
    prompt = PROMPTS[0] + first["text"] + " " + PROMPTS[0]  # the answer repeats what the prompt holds
    plain, _ = run_cli(path, "none", env, prompt)
    run_cli(path, "lookup", env, prompt)
    gpu_like_costs(tmp_path)
    look, err = run_cli(path, "lookup", env, prompt)
    st = look["stats"]
    assert st["mode"] == "lookup" and st["drafted"] > 0 and st["accepted"] > 0
    assert look["tokens"] == plain["tokens"]


def test_check_plan_doctor_and_bench_know_mtp(tiny26, tmp_path):
    env, path = cache_env(tmp_path), tiny26("qwen35-mtp-partial")
    rc, out, err = specli("check", path, env=env)
    assert rc == 0 and "target: architecture qwen35, MTP layers 1 (--draft mtp drafts with them)" in out
    rc, out, err = specli("check", tiny26("qwen35"), env=env)
    assert rc == 0 and "MTP layers none" in out
    rc, out, err = specli("run", "--target", path, "--plan", env=env)
    assert rc == 0 and "MTP layers: 1" in out and "drafter: mtp" in out
    rc, out, err = specli("doctor", env=env)
    assert rc == 0 and "MTP self-speculation (models with MTP layers, --draft mtp): yes" in out
    suite = tmp_path / "s.yaml"
    suite.write_text("prompts:\n  - id: one\n    text: Once upon a time\n  - id: two\n    text: def fibonacci(n)\n")
    rc, out, err = specli("bench", "--target", path, "--suite", str(suite), "-n", "16", "-t", "2",
                          "--modes", "none,mtp-fixed,lookup", "--json", env=env)
    assert rc == 0, err
    modes = json.loads(out)["modes"]
    assert set(modes) == {"none", "lookup", "mtp-fixed"}
    fixed = modes["mtp-fixed"]
    assert fixed["drafted"] > 0 and 0 < fixed["accepted"] < fixed["drafted"]
    assert all(lossless.holds(v) for v in fixed["lossless"].values()), fixed["lossless"]
