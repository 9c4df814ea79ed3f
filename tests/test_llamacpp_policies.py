"""The ports of llama.cpp's speculative policies (research/lab/llamacpp_policies.py) against
hand-built token histories whose drafts follow from the C++ (line numbers in the module)."""

import numpy as np
import pytest

from research.lab.llamacpp_policies import (
    ModTable,
    NgramCache,
    NgramMod,
    NgramSimple,
    draft_simple_length,
    draft_simple_p,
    ngram_simple_draft,
)
from specli.speculate.source import LOOKUP, Draft

P = list(range(1, 13))  # a 12-gram
F = list(range(100, 200))  # what follows it
K = list(range(1000, 1024))  # a 24-gram


def uniq(start, n):
    return list(range(start, start + n))


# ngram-simple


def test_simple_repeated_12gram_drafts_the_48_tokens_after_it():
    cached = uniq(5000, 5) + P + F[:60] + uniq(6000, 10) + P[:11]
    assert ngram_simple_draft(cached, P[11]) == F[:48]
    d = NgramSimple().propose(cached + [P[11]], 64)
    assert d.tokens == F[:48] and d.source == LOOKUP and d.confidence == [12.0] * 48
    assert NgramSimple().propose(cached + [P[11]], 5).tokens == F[:5]  # the cap cuts after


def test_simple_needs_all_12_tokens_including_the_sampled_one():
    cached = uniq(5000, 5) + P + F[:60] + uniq(6000, 10) + P[:11]
    assert ngram_simple_draft(cached, 999) == []  # only 11 match: the sampled token differs
    cached2 = uniq(5000, 5) + P + F[:60] + uniq(6000, 10) + [777] + P[1:11]
    assert ngram_simple_draft(cached2, P[11]) == []  # the first of the 12 differs


def test_simple_history_must_exceed_n_plus_m_plus_1():
    short = [5000] + P + F[:37] + P[:11]  # 61 cached tokens
    assert len(short) == 61 and ngram_simple_draft(short, P[11]) == []
    longer = [5000] + P + F[:38] + P[:11]  # 62
    assert ngram_simple_draft(longer, P[11]) == F[:38] + P[:10]


def test_simple_never_matches_at_position_0():
    cached = P + F[:60] + uniq(6000, 10) + P[:11]
    assert ngram_simple_draft(cached, P[11]) == []
    assert ngram_simple_draft([0] + cached, P[11]) == F[:48]


def test_simple_drops_drafts_shorter_than_size_n_and_takes_the_latest_match_only():
    base = uniq(5000, 70) + P
    assert ngram_simple_draft(base + P[:11], P[11]) == []  # 11 tokens after the match
    assert ngram_simple_draft(base + [7] + P[:11], P[11]) == [7] + P[:11]  # 12
    # a constant run: the latest match is 1 token before the end, no fall back to older ones
    assert ngram_simple_draft([7] * 100, 7) == []
    # two occurrences with different continuations: the later one wins
    two = [9] + P + F[:50] + P + F[50:100] + P[:11]
    assert ngram_simple_draft(two, P[11]) == F[50:98]


# ngram-mod


def test_mod_hash_is_the_uint64_lcg_mod_table_size():
    rng = np.random.default_rng(0)
    toks = [int(t) for t in rng.integers(0, 200_000, 30)]
    table = ModTable(24)
    expect = sum(t * pow(6364136223846793005, 23 - i, 2 ** 64) for i, t in enumerate(toks[:24])) % 2 ** 64
    assert table.idx(toks, 0) == expect % (4 * 1024 * 1024)
    # only the low 22 bits survive: a token 2^22 apart lands in the same slot
    other = toks[:23] + [toks[23] + 4 * 1024 * 1024]
    assert table.idx(other, 0) == table.idx(toks, 0) and other != toks[:24]


def test_mod_collisions_overwrite_and_count_once():
    t = ModTable(2, size=1)
    t.add([1, 2, 3], 0)
    t.add([4, 5, 6], 0)
    assert t.get([1, 2], 0) == 6 and t.used == 1
    t.reset()
    assert t.get([1, 2], 0) == -1 and t.used == 0


def test_mod_drafts_only_on_a_full_24_token_match():
    prompt = K + F + K[:23]
    assert NgramMod().propose(prompt + [K[23]], 64).tokens == F[:64]
    assert NgramMod().propose(prompt + [9999], 64).tokens == []  # 23 of 24 match
    d = NgramMod().propose(prompt + [K[23]], 10)
    assert d.tokens == F[:10] and d.confidence == [24.0] * 10


@pytest.mark.parametrize("n_follow, expect_len", [(30, 53), (25, 48), (24, 0), (20, 0)])
def test_mod_drafts_at_least_n_min_or_nothing(n_follow, expect_len):
    # the chain runs through the prompt's n-grams and stops where none is stored: a draft is
    # kept only when it got to n_min (48)
    prompt = K + F[:n_follow] + K[:23]
    draft = NgramMod().propose(prompt + [K[23]], 64).tokens
    assert len(draft) == expect_len
    assert draft == (F[:n_follow] + K[:23])[:expect_len]


def test_mod_adds_generated_ngrams_in_chunks():
    m = NgramMod()
    ctx = uniq(3000, 100) + [5]
    m.propose(ctx, 64)
    assert m.i_last == 76  # the prompt (100 tokens) minus n
    for tok in range(8):  # 8 more cached tokens: i_last + 32 < cur_len is still false
        m.observe(Draft([]), 0, [tok], 0.0, 0.0)
        ctx.append(tok)
    m.propose(ctx, 64)
    assert m.i_last == 76
    m.observe(Draft([]), 0, [8], 0.0, 0.0)
    m.propose(ctx + [8], 64)
    assert m.i_last == 109 - 24


def test_mod_explicit_begin_keeps_the_prompt_when_the_first_steps_are_not_proposed():
    prompt = uniq(3000, 100)
    m = NgramMod()
    m.begin(prompt)
    for _ in range(3):  # draft cap 0: the loop observes without proposing
        m.observe(Draft([]), 0, [7], 0.0, 0.0)
    m.propose(prompt + [5, 7, 7, 7], 64)
    assert m.i_last == 76  # begin(prompt) only; not again with the 3 generated tokens
    auto = NgramMod()
    auto.propose(prompt + [5, 7, 7, 7], 64)
    assert auto.i_last == 103 - 24


def test_mod_resets_after_five_low_acceptance_rounds():
    m = NgramMod()
    ctx = K + F + K[:23] + [K[23]]
    for k in (15, 15, 15, 15, 16, 15, 15, 15, 15):  # 16/64 is not < 0.25: the streak restarts
        d = m.propose(ctx, 64)
        assert len(d.tokens) == 64 and m.mod.used > 0
        m.observe(d, k, d.tokens[:k] + [1], 0.0, 0.0)
    assert m.n_low == 4 and m.mod.used > 0
    d = m.propose(ctx, 64)
    m.observe(d, 15, F[:16], 0.0, 0.0)
    assert m.mod.used == 0 and m.i_last == 0 and m.n_low == 0 and m.resets == 1
    # the generation goes on: the next draft re-adds the whole history first
    assert m.propose(ctx + F[:16], 64).tokens == F[16:80]


def test_mod_empty_drafts_do_not_count_as_low_acceptance():
    m = NgramMod()
    ctx = uniq(3000, 100) + [5]
    for _ in range(6):
        d = m.propose(ctx, 64)
        assert d.tokens == []
        m.observe(d, 0, [1], 0.0, 0.0)
        ctx = ctx + [1]
    assert m.n_low == 0
    m = NgramMod()
    ctx = K + F + K[:23] + [K[23]]
    d = m.propose(ctx, 64)
    m.observe(d, 64, F[:65], 0.0, 0.0)
    for _ in range(4):  # steps with draft cap 0 after a draft: nothing to accept
        m.observe(Draft([]), 0, [1], 0.0, 0.0)
    assert len(d.tokens) == 64 and m.n_low == 0 and m.mod.used > 0


def test_mod_table_outlives_generations_and_occupancy_resets_it():
    m = NgramMod()
    m.propose(K + F + [1], 64)  # generation 1 learns K -> F
    d = m.propose(uniq(7000, 30) + K[:23] + [K[23]], 64)  # a new generation: begin() again
    assert d.tokens == F[:64] and m.i_last == 53 - 24
    assert m.propose(uniq(8000, 10) + [1], 64).tokens == [] and m.i_last == 0  # a prompt shorter than n
    small = NgramMod(size=64)
    prompt = [int(t) for t in np.random.default_rng(1).integers(0, 100_000, 24 + 40)]
    probe = ModTable(24, size=64)
    for i in range(40):
        probe.add(prompt, i)
    assert probe.used > 16  # more than a quarter of the slots
    small.propose(prompt + [1], 64)
    assert small.mod.used == 0 and small.resets == 1
    ok = NgramMod(size=64)
    ok.propose(prompt[:24 + 10] + [1], 64)  # at most 10 of 64 slots
    assert 0 < ok.mod.used <= 16 and ok.resets == 0


# draft-simple


def test_draft_simple_defaults_always_submit_three():
    assert draft_simple_length([0.01, 0.02, 0.03, 0.99]) == 3
    assert draft_simple_length([0.01, 0.02, 0.03], cap=2) == 2
    with pytest.raises(ValueError):
        draft_simple_length([0.9, 0.9])  # it would have drafted a third


def test_draft_simple_p_min_n_min_and_cap():
    assert draft_simple_length([0.9, 0.4, 0.9], p_min=0.5) == 1
    assert draft_simple_length([0.4, 0.9, 0.9], p_min=0.5) == 0  # the first token is checked too
    assert draft_simple_length([0.6, 0.6, 0.6], p_min=0.6) == 3  # not below
    assert draft_simple_length([0.9, 0.4], p_min=0.5, n_min=2) == 0
    assert draft_simple_length([0.9, 0.9, 0.9], n_min=3, cap=2) == 0  # the cap stops it first
    assert draft_simple_length([0.9, 0.9], n_max=0) == 1  # n_max is checked after appending


def test_draft_simple_p_is_the_top10_softmax():
    row = np.concatenate([np.zeros(10), np.full(1000, -1.0)]).astype(np.float32)
    assert draft_simple_p(row) == pytest.approx(0.1, abs=1e-7)
    assert draft_simple_p(np.array([2.0, 0.0], dtype=np.float32)) == pytest.approx(1 / (1 + np.exp(-2.0)), rel=1e-6)


# ngram-cache and llama-lookup


def test_cache_drafts_from_the_longest_ngram_that_clears_its_thresholds():
    tool = NgramCache(NgramCache.TOOL_N_DRAFT, whole_history=True)
    # "5 6" then 7 once: the 2-gram has one sample (needs 2), the 1-gram "6" one (needs 2)
    assert tool.propose([5, 6, 7, 9, 5, 6], 16).tokens == []
    # a 3-gram needs one sample: "4 5 6" -> 7, then "5 6 7" -> 8, "6 7 8" -> 9
    tool = NgramCache(NgramCache.TOOL_N_DRAFT, whole_history=True)
    assert tool.propose([4, 5, 6, 7, 8, 9, 1, 4, 5, 6], 16).tokens == [7, 8, 9]  # at most 3
    server = NgramCache()
    assert server.propose([4, 5, 6, 7, 8, 9, 1, 4, 5, 6], 16).tokens == [7, 8, 9, 1, 4, 5, 6, 7]  # at most 8
    assert NgramCache().propose([4, 5, 6, 7, 8, 9, 1, 4, 5, 6], 2).tokens == [7, 8]  # the cap cuts it after


def test_cache_one_gram_needs_two_thirds_and_ties_go_to_the_follower_counted_last():
    # "3" -> 4, 4, 5: 2 of 3 (67 %) clears 66 %
    assert NgramCache(1, True).propose([3, 4, 9, 3, 4, 8, 3, 5, 7, 3], 16).tokens == [4]
    # "3" -> 4, 5: 50 % does not
    assert NgramCache(1, True).propose([3, 4, 9, 3, 5, 7, 3], 16).tokens == []
    # "2 3" -> 4, then 5: a tie at 50 % clears the 2-gram's threshold; the follower seen last wins
    assert NgramCache(1, True).propose([2, 3, 4, 9, 2, 3, 5, 7, 2, 3], 16).tokens == [5]


def test_server_cache_misses_ngrams_that_span_two_calls():
    history = [10, 11, 12, 13, 14, 15]
    for whole in (True, False):
        d = NgramCache(NgramCache.TOOL_N_DRAFT, whole_history=whole)
        assert d.propose(history[:3], 16).tokens == []  # counts 10 11 12
        # then 13..15 and a repeat of "11 12": the tool knows "11 12" -> 13 (a 2-gram across
        # the two calls, one sample: not enough) but also "10 11 12" -> 13 (a 3-gram, enough)
        got = d.propose(history + [10, 11, 12], 16).tokens
        assert got == ([13, 14, 15] if whole else [])
