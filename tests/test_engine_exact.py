"""Speculative output is token-for-token the target's own, on tiny f32 models with an f32 KV
cache (batch shapes move their logits by < 1e-5, so any difference is a bug)."""

from collections import Counter

import numpy as np
import pytest
from exacthelp import CFG, PROMPTS, exact_joint, grounded_prompt, run
from stathelp import chi2_critical, chi2_stat

from specli.engine import Context, ContextConfig
from specli.errors import PromptTooLong
from specli.speculate.drafters import LookupDrafter, ModelDrafter, NoDrafter
from specli.speculate.loop import generate
from specli.speculate.verify import SamplingParams


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8, 16])
def test_greedy_with_draft_model_is_plain_greedy(tm, dm, k):
    drafted = accepted = 0
    for text in PROMPTS:
        prompt = tm.tokenize(text)
        plain, *_ = run(tm, prompt, NoDrafter())
        spec, st, _, flags = run(tm, prompt, ModelDrafter(dm, CFG, p_min=0.0), k)
        assert spec == plain, f"prompt {text!r}, draft length {k}"
        assert sum(flags) == st.accepted
        drafted += st.drafted
        accepted += st.accepted
    # both paths ran: some drafted tokens were kept, some rolled back
    assert 0 < accepted < drafted
    assert accepted / drafted > 0.15


def test_draft_model_early_stop_on_low_confidence(tm, dm):
    prompt = tm.tokenize(PROMPTS[0])
    plain, *_ = run(tm, prompt, NoDrafter(), n=120)
    loose, st_loose, *_ = run(tm, prompt, ModelDrafter(dm, CFG, p_min=0.0), 8, n=120)
    tight, st_tight, *_ = run(tm, prompt, ModelDrafter(dm, CFG, p_min=0.9), 8, n=120)
    assert loose == tight == plain
    assert st_tight.drafted / st_tight.spec_steps < st_loose.drafted / st_loose.spec_steps
    assert st_tight.acceptance > st_loose.acceptance


@pytest.mark.parametrize("k", [2, 5, 10])
def test_greedy_with_prompt_lookup_is_plain_greedy(tm, k):
    accepted = 0
    for text in PROMPTS[:5]:
        prompt = grounded_prompt(tm, text)
        plain, *_ = run(tm, prompt, NoDrafter())
        spec, st, *_ = run(tm, prompt, LookupDrafter(), k)
        assert spec == plain, text
        accepted += st.accepted
    assert accepted > 10  # measured 15-20: the copied continuation is partly taken


def test_rollback_leaves_the_cache_consistent(tm, dm):
    prompt = tm.tokenize(PROMPTS[7])
    out, st, ctx, _ = run(tm, prompt, ModelDrafter(dm, CFG, p_min=0.0), 6, n=60)
    assert st.accepted < st.drafted  # there were rollbacks
    # the cache holds exactly prompt + output minus the pending last token
    assert ctx.tokens == prompt + out[:-1]
    nxt = ctx.eval([out[-1]])[0].copy()
    fresh = Context(tm, CFG)
    ref = fresh.eval(prompt + out)[0].copy()
    np.testing.assert_allclose(nxt, ref, atol=1e-4)
    # the check has teeth: a cache that kept one stale token would be far off
    stale = Context(tm, CFG).eval(prompt + out[:-2] + out[-1:] + out[-1:])[0]
    assert np.abs(stale - ref).max() > 0.1


def test_multi_turn_reuses_the_cache(tm, dm):
    prompt = tm.tokenize(PROMPTS[1])
    out1, _, ctx, _ = run(tm, prompt, ModelDrafter(dm, CFG, p_min=0.0), 4, n=30)
    turn2 = prompt + out1 + tm.tokenize(" and then", add_special=False)
    out2, st2, *_ = run(tm, turn2, ModelDrafter(dm, CFG, p_min=0.0), 4, n=30, ctx=ctx)
    assert st2.prompt_tokens_cached == len(prompt) + len(out1) - 1
    fresh, *_ = run(tm, turn2, NoDrafter(), n=30)
    assert out2 == fresh


def test_seeded_sampling_is_reproducible(tm, dm):
    prompt = tm.tokenize(PROMPTS[2])
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=42)
    a, *_ = run(tm, prompt, ModelDrafter(dm, CFG), 4, params)
    b, *_ = run(tm, prompt, ModelDrafter(dm, CFG), 4, params)
    c, *_ = run(tm, prompt, NoDrafter(), 0, params)
    d, *_ = run(tm, prompt, NoDrafter(), 0, params)
    assert a == b and c == d


def test_speculative_sampling_follows_the_target_distribution(tm, dm):
    """Joint distribution of the first three tokens under speculative sampling equals the exact
    target distribution, enumerated from the target's own logits (chi-square)."""
    params = SamplingParams(temperature=1.5, top_k=6)
    prompt = tm.tokenize(PROMPTS[0])
    exact = exact_joint(Context(tm, CFG), prompt, params)
    keys = list(exact)
    probs = np.array([exact[k] for k in keys])
    assert abs(probs.sum() - 1) < 1e-9

    n = 3000
    drafter = ModelDrafter(dm, CFG, p_min=0.0)
    counts = Counter()
    gen = Context(tm, CFG)
    drafted = accepted = 0
    for seed in range(n):
        resp = generate(gen, prompt, drafter, SamplingParams(1.5, 6, 1.0, seed), 3, 2)
        toks = [t for ch in resp for t in ch.tokens]
        st = resp.stats
        counts[tuple(toks)] += 1
        drafted += st.drafted
        accepted += st.accepted
    assert set(counts) <= set(keys)
    stat, dof = chi2_stat(np.array([counts[k] for k in keys], float), probs)
    assert stat < chi2_critical(dof), (stat, dof)
    assert 0 < accepted < drafted


def test_prompt_longer_than_the_context(tm):
    ctx = Context(tm, ContextConfig(n_ctx=256, f32_kv=True))
    with pytest.raises(PromptTooLong, match=r"the prompt is 300 tokens, longer than the context \(256 tokens\)") as e:
        generate(ctx, list(range(100, 400)), NoDrafter(), SamplingParams(), 10)
    assert (e.value.n_prompt, e.value.n_ctx) == (300, 256) and "--ctx" in e.value.hint


def test_generation_stops_when_the_context_is_full(tm, dm):
    ctx = Context(tm, ContextConfig(n_ctx=256, n_batch=64, f32_kv=True))
    prompt = tm.tokenize(PROMPTS[0])
    out, st, *_ = run(tm, prompt, ModelDrafter(dm, CFG, p_min=0.0), 8, n=500, ctx=ctx)
    assert st.stop == "context"
    assert len(prompt) + len(out) == ctx.n_ctx + 1  # every position used, plus the pending token
    plain, *_ = run(tm, prompt, NoDrafter(), n=len(out))
    assert out == plain


def test_exact_prefill_reuses_whole_batches_only(tm):
    """A server answering a repeated prompt evaluates the uncached part in the blocks a fresh run
    would use: the kept prefix is a multiple of the batch size."""
    ctx = Context(tm, CFG)  # n_batch 64
    prompt = (tm.tokenize(PROMPTS[7]) * 8)[:150]
    out1 = [t for ch in generate(ctx, prompt, NoDrafter(), SamplingParams(), 4, exact_prefill=True) for t in ch.tokens]
    resp = generate(ctx, prompt, NoDrafter(), SamplingParams(), 4, exact_prefill=True)
    out2 = [t for ch in resp for t in ch.tokens]
    assert resp.stats.prompt_tokens_cached == 128 and out1 == out2
    resp = generate(ctx, prompt, NoDrafter(), SamplingParams(), 4)
    assert [t for ch in resp for t in ch.tokens] == out1 and resp.stats.prompt_tokens_cached == 149
