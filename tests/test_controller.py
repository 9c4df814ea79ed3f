"""The cost-aware controller on synthetic cost curves and acceptance sequences."""

import pytest
from curves import VM_CURVE

from specli.speculate.adaptive import AdaptiveDrafter
from specli.speculate.controller import (
    Acceptance,
    Controller,
    CostModel,
    best_length,
    expected_accepted,
    marginal_token_pays,
    step_rate,
)
from specli.speculate.drafters import LookupDrafter
from specli.speculate.source import MODEL, NONE, Draft, Source, lookup_key

L2, L4, L16 = Source("lookup", 2), Source("lookup", 4), Source("lookup", 16)

# the 1.5B target on a 2-core CPU: verifying k+1 tokens costs this many single-token passes
CPU_CURVE = [1.0, 1.5, 2.0, 2.2, 2.6, 3.0, 3.1, 4.0, 4.8]
GPU_CURVE = [1.0, 1.02, 1.04, 1.05, 1.06, 1.08, 1.1, 1.12, 1.15]
T = 0.06  # seconds per target token


def curve(c):
    return [x * T for x in c]


def test_expected_accepted():
    assert expected_accepted(0.5, 0) == 0
    assert expected_accepted(0.5, 1) == pytest.approx(0.5)
    assert expected_accepted(0.5, 3) == pytest.approx(0.5 + 0.25 + 0.125)
    assert expected_accepted(1.0, 4) == 4
    assert expected_accepted(0.5, 2, first=0.2) == pytest.approx(0.2 * 1.5)


def test_useless_draft_means_plain_decoding():
    k, rate = best_length(0.05, curve(CPU_CURVE), draft_token=0.4 * T, k_max=8)
    assert k == 0 and rate == pytest.approx(1 / T)
    # even a free drafter does not pay when it is always wrong
    assert best_length(0.0, curve(GPU_CURVE), 0.0, 8)[0] == 0


def test_good_drafts_and_cheap_verification_mean_long_drafts():
    k, rate = best_length(0.9, curve(GPU_CURVE), draft_token=0.05 * T, k_max=8)
    assert k == 8 and rate > 3 / T
    # the same drafts on a CPU, where verification is not free: shorter
    k_cpu, _ = best_length(0.9, curve(CPU_CURVE), draft_token=0.05 * T, k_max=8)
    assert 1 <= k_cpu < 8


def test_draft_model_cost_can_make_speculation_lose():
    # 0.75 of a target token per draft token (the 0.5B draft on this CPU): even 90% acceptance loses
    assert best_length(0.9, curve(CPU_CURVE), draft_token=0.75 * T, k_max=8, draft_step=0.75 * T)[0] == 0
    # at 0.2 of a target token it pays
    assert best_length(0.9, curve(CPU_CURVE), draft_token=0.2 * T, k_max=8, draft_step=0.2 * T)[0] >= 1


def test_step_rate_counts_the_bonus_token():
    assert step_rate(1.0, 2, [1.0, 1.0, 1.0], 0.0) == 3.0


def test_marginal_token_rule():
    v = curve(GPU_CURVE)
    assert marginal_token_pays(0.9, 2, v, 0.01 * T, rate=2 / T)
    assert not marginal_token_pays(0.05, 2, v, 0.3 * T, rate=2 / T)
    assert not marginal_token_pays(1.0, len(v) - 1, v, 0.0, rate=1.0)  # no room left


def test_acceptance_reacts_when_it_drops():
    a = Acceptance()
    for _ in range(30):
        a.observe(4, 4)
    high = a.alpha
    assert high > 0.9
    for _ in range(10):
        a.observe(4, 0)
    assert a.alpha < 0.5 < high
    # tokens after the first rejection are not evidence either way
    b = Acceptance(first=0.5, rest=0.5, weight=2.0, decay=1.0)
    b.observe(8, 2)  # first accepted; second accepted, third rejected; 4..8 untested
    assert (b.f_ok, b.f_n) == (2.0, 3.0)
    assert (b.r_ok, b.r_n) == (2.0, 4.0)
    b.observe(3, 0)
    assert (b.f_ok, b.f_n) == (2.0, 4.0) and b.r_n == 4.0


def test_first_and_later_tokens_are_learned_apart():
    a = Acceptance(decay=1.0)
    for _ in range(50):
        a.observe(6, 0)  # half the time the first token misses...
        a.observe(6, 6)  # ...but a copy that starts right stays right
    assert 0.45 < a.alpha_first < 0.55 and a.alpha_rest > 0.95
    assert a.expected(4) == pytest.approx(a.alpha_first * sum(a.alpha_rest ** i for i in range(4)))


def _plain_steps_to_probe(ctl: Controller, limit: int = 2000, **kw) -> int | None:
    for i in range(limit):
        d = ctl.decide({MODEL: 8}, **kw)
        if d.probe:
            return i
        assert d.k == 0
    return None


def test_controller_turns_a_losing_drafter_off_and_probes_it_less_and_less():
    ctl = Controller(CostModel(curve(CPU_CURVE), draft_token=0.1 * T), k_max=8)
    steps = []
    for _ in range(1500):
        d = ctl.decide({MODEL: 8})
        ctl.observe(d.source, d.k, 0)  # every draft rejected
        steps.append(d)
    probes = [i for i, d in enumerate(steps) if d.probe]
    assert all(d.k == 0 or d.probe for d in steps[10:])
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    # each failed probe doubles the gain the next must wait for, up to 16 times its cost
    for a, b in zip(gaps[:3], gaps[1:4]):
        assert 2 * a - 1 <= b <= 2 * a + 1
    assert len(set(gaps[3:])) == 1 and gaps[3] >= 6 * gaps[0]
    assert all(d.k == 2 for d in steps if d.probe)  # failed probes stay short
    # drafts become good: the probe results turn speculation back on
    for _ in range(20):
        ctl.observe(MODEL, 2, 2)
    assert ctl.decide({MODEL: 8}).k > 0


def test_a_probe_that_passes_whole_is_followed_at_once_by_a_longer_one():
    # 0.4 of a target token a draft pass: the prior says no, drafts that good would say yes
    ctl = Controller(CostModel(curve(CPU_CURVE), draft_token=0.4 * T), k_max=8)
    assert _plain_steps_to_probe(ctl) is not None
    ctl.observe(MODEL, 2, 2)
    d = ctl.decide({MODEL: 8})
    assert d.probe and d.k == 4
    ctl.observe(MODEL, 4, 1)  # that one failed: back to waiting
    assert ctl.decide({MODEL: 8}).k == 0


def test_a_probe_waits_until_the_gain_forgone_covers_its_catch_up():
    near = _plain_steps_to_probe(Controller(CostModel(curve(CPU_CURVE), 0.4 * T), k_max=8), probe_behind=1)
    far = _plain_steps_to_probe(Controller(CostModel(curve(CPU_CURVE), 0.4 * T), k_max=8), probe_behind=300)
    assert near is not None and far is not None and far > 10 * near
    # ...and never when the answer has too little room left to earn it back
    ctl = Controller(CostModel(curve(CPU_CURVE), 0.4 * T), k_max=8)
    assert _plain_steps_to_probe(ctl, limit=5 * far, probe_behind=300, left=far // 4) is None


def test_a_model_is_not_probed_while_the_text_goes_faster_without_it():
    ctl = Controller(CostModel(curve(CPU_CURVE), draft_token=0.4 * T), k_max=8)
    for _ in range(10):
        ctl.observe(MODEL, 4, 0)  # turned off
        ctl.observe_step(6, 2.0 * T)  # lookup's copies: 3 tokens a target token's time
    assert _plain_steps_to_probe(ctl) is None
    ctl.done = [0.0, 0.0]  # the copies stop: the model is worth a look again
    assert _plain_steps_to_probe(ctl) is not None


def test_a_draft_models_first_catch_up_is_an_outlay_spread_over_its_drafts():
    ctl = Controller(CostModel(curve(GPU_CURVE), draft_token=0.05 * T), k_max=8)
    for _ in range(10):
        ctl.observe(MODEL, 4, 2)
    assert ctl.decide({MODEL: 8}, behind=1, probe_behind=400).k > 0  # a 400-token prompt: 1/16 of it
    assert ctl.decide({MODEL: 8}, behind=1, probe_behind=100_000).k == 0


def test_a_drafter_too_slow_to_ever_pay_is_never_probed():
    # 0.75 of a target token per draft token, on the CPU curve: even perfect drafts lose
    ctl = Controller(CostModel(curve(CPU_CURVE), draft_token=0.75 * T), k_max=8)
    assert not any(ctl.decide({MODEL: 8}).k for _ in range(100))
    assert ctl.probes == 0 and ctl.plain_steps == 100


def test_controller_prefers_the_free_lookup_on_repeated_text():
    ctl = Controller(CostModel(curve(CPU_CURVE), draft_token=0.4 * T), k_max=8)
    for _ in range(10):
        ctl.observe(L4, 6, 6)
        ctl.observe(MODEL, 4, 2)
    d = ctl.decide({L4: 6, MODEL: 8})
    assert d.source == L4 and d.k >= 2
    # no match this step: only the model is a candidate
    assert ctl.decide({MODEL: 8}).source in (MODEL, NONE)


def test_hybrid_drafter_copies_from_a_repeated_context():
    ctl = Controller(CostModel(curve(CPU_CURVE)), k_max=8)
    for _ in range(5):
        ctl.observe(L4, 8, 8)
    h = AdaptiveDrafter(ctl, lookup=LookupDrafter())
    text = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 99, 11, 12, 13, 14]
    d = h.propose(text, 8)
    assert d.source == L4 and d.tokens[:3] == [15, 16, 17] and d.confidence[0] == 4
    # shadow accounting: where verification is too dear to draft at all, the lookup proposal
    # is still scored against what the target emitted
    ctl2 = Controller(CostModel([T] + [100 * T] * 8), k_max=8)
    h2 = AdaptiveDrafter(ctl2, lookup=LookupDrafter())
    assert h2.propose(text, 8).tokens == []
    key = h2.last and L4
    before = ctl2.acceptance(key).f_n
    h2.observe(Draft([]), 0, [15], 0.0, T)  # the target emitted 15, as lookup proposed
    a = ctl2.acceptance(key)
    assert a.f_n == pytest.approx(before * a.decay + 1) and a.alpha_first > 0.6  # up from the 0.4 prior


def test_blocks_seen_slower_than_calibrated_make_unseen_ones_dearer_too():
    # calibrated on a short prefix, real steps run 20 % slower per block (longer context):
    # learned on 2- and 4-token blocks, the correction prices the 16-token block as well,
    # and drafts that paid on the calibrated curve at 88 % acceptance no longer do
    cm = CostModel(curve(VM_CURVE), smoothing=0.2)
    assert best_length(0.88, cm.verify, 0.0, 16)[0] == 3
    for _ in range(30):
        cm.observe_verify(0, T)
        cm.observe_verify(1, 1.2 * VM_CURVE[1] * T)
        cm.observe_verify(3, 1.2 * VM_CURVE[3] * T)
    assert cm.verify[0] == pytest.approx(T)
    assert cm.verify[15] == pytest.approx(1.2 * VM_CURVE[15] * T, rel=0.01)
    assert best_length(0.88, cm.verify, 0.0, 16)[0] == 0


def test_a_machine_faster_than_its_calibration_prices_every_size_alike():
    # calibrated at a slow moment (or another day), the machine now runs every pass 30 % faster:
    # plain steps show it, blocks not drafted yet follow, and the draft lengths that paid on
    # the calibrated curve still do (before, unseen blocks kept their calibrated time and
    # looked 1.4x dearer than a plain step: a lookup that had not drafted yet never started)
    cm = CostModel(curve(VM_CURVE), draft_token=0.4 * T, smoothing=0.2)
    assert best_length(0.88, cm.verify, 0.0, 16)[0] == 3
    for _ in range(40):
        cm.observe_verify(0, 0.7 * T)
    assert cm.verify[0] == pytest.approx(0.7 * T, rel=1e-3)
    assert cm.verify[15] == pytest.approx(0.7 * VM_CURVE[15] * T, rel=1e-3)
    assert best_length(0.88, cm.verify, 0.0, 16)[0] == 3
    # a draft pass, calibrated with the curve, follows it until one is timed; then its own time
    before = cm.draft_token
    assert before == pytest.approx(0.28 * T, rel=1e-3)
    cm.observe_draft(1, 0.5 * T)
    timed = cm.draft_token
    assert timed == pytest.approx(before + 0.2 * (0.5 * T - before))
    cm.observe_verify(0, T)
    assert cm.draft_token == timed
    # a block seen after the machine sped up keeps its own ratio on top of the speed
    cm.observe_verify(3, 0.7 * 1.5 * VM_CURVE[3] * T)
    assert cm.verify[3] / cm.verify[0] > VM_CURVE[3] / VM_CURVE[0]


def test_lookup_acceptance_is_learned_per_match_length():
    assert [str(lookup_key(n)) for n in (2, 3, 4, 7, 8, 15, 16, 40)] == [
        "lookup:2", "lookup:2", "lookup:4", "lookup:4", "lookup:8", "lookup:8", "lookup:16", "lookup:16"]
    # on the CPU curve of this project's VM (blocks of 16 cost about 8 tokens): a copy that has
    # matched for 16+ tokens and has kept going earns a long draft, while short matches that
    # break half the time on the same controller draft little or nothing
    ctl = Controller(CostModel(curve(VM_CURVE)), k_max=16)
    for _ in range(12):
        ctl.observe(L16, 16, 16)
        ctl.observe(L2, 4, 1)
    long, short = ctl.decide({L16: 16}), ctl.decide({L2: 16})
    assert long.k == 15 and short.k <= 1  # 15 drafted + 1: the block of 16 is cheapest per token


def test_copies_going_on_in_one_bucket_teach_the_others():
    # a bucket not seen yet starts from the continuation rate every copy so far has shown:
    # in an answer whose copies go on, a fresh 8-token match drafts long at once
    fresh = Controller(CostModel(curve(VM_CURVE)), k_max=16)
    taught = Controller(CostModel(curve(VM_CURVE)), k_max=16)
    for _ in range(10):
        taught.observe(L4, 16, 16)
    L8 = lookup_key(8)
    assert fresh.acceptance(L8).alpha_rest == pytest.approx(0.8)
    assert taught.acceptance(L8).alpha_rest > 0.9 and taught.acceptance(L8).alpha_first == pytest.approx(0.4)
    taught.acceptance(L8).observe(1, 1)  # its own first token: right
    fresh.acceptance(L8).observe(1, 1)
    assert taught.decide({L8: 16}).k > fresh.decide({L8: 16}).k
    # and copies that keep breaking teach the same: the shared rate falls for every bucket
    for _ in range(10):
        taught.observe(L16, 16, 1)
    assert taught.acceptance(lookup_key(20)).alpha_rest < 0.6
    # while the draft model's acceptance is its own
    assert taught.acceptance(MODEL).alpha_rest == pytest.approx(0.8)


def test_a_short_match_buys_a_short_draft_however_good_its_record():
    ctl = Controller(CostModel(curve(VM_CURVE)), k_max=16)
    for _ in range(20):
        ctl.observe(L2, 16, 16)
        ctl.observe(L16, 16, 16)
    h = AdaptiveDrafter(ctl, lookup=LookupDrafter())
    src = list(range(100, 140))
    short = h.propose(src + [7, 1] + src[:2], 16)  # the last 2 tokens recur: match of 2
    assert short.source == L2 and short.tokens == src[2:6]
    long = h.propose(src + [7] + src[:20], 16)  # copying for 20 tokens
    assert long.source == L16 and long.tokens == src[20:35]


def test_lookup_drafter_reports_how_long_the_copy_has_matched():
    src = list(range(100, 140))
    d = LookupDrafter(n_max=4).propose(src + [7] + src[:20], 8)
    assert d.tokens == src[20:28] and d.confidence[0] == 20  # followed back past the 4-gram
    d = LookupDrafter(n_max=4).propose(src + [7] + [1] + src[10:13], 8)
    assert d.tokens == src[13:21] and d.confidence[0] == 3  # a 3-gram, not followed back


def test_costs_follow_measured_steps():
    cm = CostModel([1.0, 2.0], draft_token=0.5, smoothing=0.5)
    cm.observe_verify(1, 1.0)
    assert cm.verify[1] == pytest.approx(1.5)
    assert cm.verify[0] == 1.0  # single tokens keep their own ratio
    cm.observe_draft(2, 0.2)
    assert cm.draft_token == pytest.approx(0.3)


def test_a_dflash_pass_is_priced_once_per_draft():
    """A DFlash head drafts its whole block in one pass: the controller charges that pass to the
    first token and nothing to the others (a draft model or MTP pays a pass a token), so a good
    head drafts to the end of its block, which caps its candidate, where a drafter as good but
    paying a pass a token as dear as a target token does not draft at all."""
    dflash = Source("dflash")
    ctl = Controller(CostModel([T * c for c in GPU_CURVE], T), k_max=8)
    assert ctl.draft_costs(dflash) == (0.0, T)
    assert ctl.draft_costs(MODEL) == (T, T)
    for _ in range(20):
        ctl.observe(dflash, 3, 3)
        ctl.observe(MODEL, 3, 3)
    assert ctl.decide({dflash: 3}, k_cap=8).k == 3
    assert ctl.decide({MODEL: 3}, k_cap=8).k == 0
