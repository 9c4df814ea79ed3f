"""Verification asks for logits only on the rows that need them (issue 37, item 7): under a
constraint, a row where the grammar allows exactly one token is decided whatever the target's
logits, so llama.cpp skips its last layer and LM head. On tiny f32 models the text stays plain
constrained decoding's, token for token, greedy and seeded sampling, alone and in a batch;
fewer rows ask for logits; with logprobs every row does."""

import numpy as np
import pytest
from batchhelp import run_together
from constrainhelp import CHEAP_VERIFY, EMAIL, SCHEMA
from exacthelp import CFG, PROMPTS, grounded_prompt

from specli.constrain import Constraint
from specli.engine import Context
from specli.session import Options, Session
from specli.speculate.adaptive import adaptive_drafter, lookup_drafter
from specli.speculate.batch import Batch
from specli.speculate.drafters import ModelDrafter, NoDrafter
from specli.speculate.forced import ForcedDrafter
from specli.speculate.loop import generate
from specli.speculate.settings import SpecSettings
from specli.speculate.verify import Sampler, SamplingParams, accept, logits_needed

SAMPLED = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=11)


def run(tm, prompt, drafter, constraint, params=SamplingParams(), logprobs=None, n=120):
    """Tokens, stats, the rows that asked for logits and the rows every verify block holds."""
    ctx = Context(tm, CFG)
    resp = generate(ctx, prompt, drafter, params, max_tokens=n, draft_max=6, constraint=constraint,
                    logprobs=logprobs)
    toks = [t for ch in resp for t in ch.tokens]
    st = resp.stats
    asked = ctx.rows_with_logits
    ctx.close()
    return toks, st, asked, 1 + st.steps + st.drafted  # the prompt's last row, then k + 1 per block


def hybrid_forced(dm):
    s = SpecSettings(draft_max=6)
    return ForcedDrafter(adaptive_drafter(s, CHEAP_VERIFY, 0.01, lookup_drafter(s), ModelDrafter(dm, CFG, p_min=0.0)))


@pytest.mark.parametrize("params", [SamplingParams(), SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("constraint", [Constraint.json_schema(SCHEMA), Constraint.regex(EMAIL)],
                         ids=["schema", "regex"])
def test_forced_rows_ask_no_logits_and_the_text_is_plain_constrained(tm, dm, params, constraint):
    skipped = {}
    for text in PROMPTS[:2]:
        prompt = grounded_prompt(tm, text)
        plain, pst, p_asked, p_rows = run(tm, prompt, NoDrafter(), constraint, params)
        assert pst.stop == "stop" and p_asked <= p_rows
        for label, d in (("forced", ForcedDrafter(NoDrafter())), ("hybrid+forced", hybrid_forced(dm))):
            toks, st, asked, rows = run(tm, prompt, d, constraint, params)
            assert toks == plain, (label, text)
            assert st.drafted > 0 and asked < rows, (label, asked, rows)
            skipped[label] = skipped.get(label, 0) + rows - asked
            d.close()
    if constraint.kind == "json_schema":  # keys and punctuation: most forced drafts need no logits
        assert skipped["forced"] >= 10, skipped


def test_with_logprobs_every_row_asks_for_logits(tm):
    c = Constraint.json_schema(SCHEMA)
    prompt = grounded_prompt(tm, PROMPTS[0])
    plain, _, _, _ = run(tm, prompt, NoDrafter(), c)
    toks, st, asked, rows = run(tm, prompt, ForcedDrafter(NoDrafter()), c, logprobs=2)
    assert toks == plain and st.drafted > 0 and asked == rows


def test_without_a_constraint_every_verified_row_asks_for_logits(tm, dm):
    prompt = grounded_prompt(tm, PROMPTS[0])
    toks, st, asked, rows = run(tm, prompt, hybrid_forced(dm), None, n=40)
    assert st.drafted > 0 and asked == rows


def test_a_row_without_logits_is_the_one_token_its_mask_allows():
    one = np.zeros(8, dtype=bool)
    one[5] = True
    many = np.ones(8, dtype=bool)
    assert logits_needed([one, many, one]) == [False, True, False]
    row = np.arange(8, dtype=np.float32)  # the target would pick 7; the grammar allows only 5
    for params in (SamplingParams(), SAMPLED):
        assert accept([5, 5], [None, row, None], Sampler(params), 10, [one, many, one]) == (1, 7)
        assert accept([5], [None, row], Sampler(params), 10, [one, one]) == (1, 5)
    with pytest.raises(ValueError, match="more than one token"):
        accept([], [None], Sampler(SamplingParams()), 10, [many])


def test_context_eval_with_flags_returns_a_row_where_asked(tm):
    ctx = Context(tm, CFG)
    toks = grounded_prompt(tm, PROMPTS[0])[:6]
    ref = [r.copy() for r in ctx.eval(toks, "all")]
    ctx.clear()
    before = ctx.rows_with_logits
    rows = ctx.eval(toks, [i % 2 == 1 for i in range(6)])
    assert ctx.rows_with_logits - before == 3
    assert [r is None for r in rows] == [True, False] * 3
    for i in (1, 3, 5):
        assert np.array_equal(rows[i], ref[i])
    with pytest.raises(ValueError, match="flags for"):
        ctx.eval([1, 2], [True])
    ctx.close()


def test_a_batch_skips_forced_rows_too_and_each_answer_is_its_solo_answer(tiny_target, tiny_draft):
    c = Constraint.json_schema(SCHEMA)
    opts = dict(target=tiny_target, draft=tiny_draft, n_ctx=512, f32_kv=True, threads=2)
    one = Session(Options(**opts, parallel=1))
    two = Session(Options(**opts, parallel=2))
    try:
        prompts = [grounded_prompt(one.target, t) for t in PROMPTS[:2]]
        solo = []
        for p in prompts:
            one.ctx.clear()
            resp = one.generate(p, SamplingParams(), 80, NoDrafter(), constraint=c)
            solo.append([t for ch in resp for t in ch.tokens])
        batch = Batch(two)
        out = run_together(batch, [dict(prompt=p, params=SamplingParams(), max_tokens=80, constraint=c)
                                   for p in prompts])
        assert [[t for ch in r.chunks for t in ch.tokens] for r in out] == solo
        drafted = sum(r.stats.drafted for r in out)
        rows = sum(1 + r.stats.steps + r.stats.drafted for r in out)
        asked = sum(s.ctx.rows_with_logits for s in batch.slots)
        assert drafted > 0 and asked < rows, (asked, rows)
        batch.close()
    finally:
        one.close()
        two.close()
