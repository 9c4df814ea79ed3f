"""Several requests in one batch (specli.speculate.batch): on tiny f32 models with an f32 KV
cache, each request's output equals what it gets served alone, greedy and sampled, on
attention, hybrid and recurrent targets; the batch really holds several sequences per
llama_decode; and the draft lengths shrink as the batch fills."""

import threading
from dataclasses import replace

import pytest
from batchhelp import run_together
from conftest import TEST_CACHE
from tiny2026 import tiny_2026_model

from specli.engine import Context, ContextConfig, ContextFull, Model, SeqContext
from specli.errors import SpecliError
from specli.session import Options, Session
from specli.speculate.batch import MODEL_SHARE, NOTHING, Batch, Estimate, allocate
from specli.speculate.drafters import ModelDrafter
from specli.speculate.registry import DraftKind
from specli.speculate.settings import SpecSettings
from specli.speculate.source import Draft
from specli.speculate.verify import SamplingParams

CTX = 512
PROMPTS = ["Once upon a time", "def fibonacci(n):\n    ", "The capital of France is",
           "1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3,"]
MAX_TOKENS = [40, 17, 28, 33]


def session(target, draft, parallel, **spec):
    return Session(Options(target=target, draft=draft, n_ctx=CTX, f32_kv=True, threads=2, parallel=parallel,
                           spec=SpecSettings(**spec)))


def solo(sess, prompt, params, max_tokens):
    resp = sess.generate(prompt, params, max_tokens)
    return [t for ch in resp for t in ch.tokens], resp.finish_reason


def batched(batch, reqs):
    out = run_together(batch, reqs)
    return [([t for ch in r.chunks for t in ch.tokens], r.finish_reason) for r in out]


def requests(sess, params, prompts=PROMPTS, max_tokens=MAX_TOKENS):
    toks = [sess.target.tokenize(p) for p in prompts]
    # a long prompt too: it goes in chunks between the others' steps
    toks[2] = toks[2] + sess.target.tokenize(" and the capital of Spain is Madrid." * 12)
    return [dict(prompt=t, params=p, max_tokens=m) for t, p, m in zip(toks, params, max_tokens, strict=True)]


@pytest.fixture(scope="module")
def pair(tiny_target, tiny_draft):
    """The tiny target and draft, served alone and as a batch of four slots."""
    one = session(tiny_target, tiny_draft, 1)
    four = session(tiny_target, tiny_draft, 4)
    yield one, four
    one.close()
    four.close()


def test_four_greedy_requests_in_one_batch_each_equal_their_solo_answer(pair):
    one, four = pair
    reqs = requests(one, [SamplingParams()] * 4)
    want = [solo(one, **r) for r in reqs]
    batch = Batch(four, chunk=32)  # a 150-token prompt then takes 5 steps beside the others
    got = batched(batch, reqs)
    assert got == want
    st = batch.stats()
    assert st["max_sequences"] == 4 and st["shared_decodes"] > 0
    generated = sum(len(t) for t, _ in got)
    assert st["decodes"] < generated  # the requests shared their passes
    # the slots keep their prefixes: asked again, each prompt goes back to its own slot
    for slot, r in zip(batch.slots, reqs, strict=True):
        assert slot.ctx.tokens[:len(r["prompt"])] == r["prompt"]
    again = batched(batch, reqs[::-1])
    assert again == want[::-1]
    batch.close()


def test_sampled_requests_with_their_own_seeds_equal_their_solo_answers(tiny_target, tiny_draft):
    """T > 0, a draft model drafting fixed lengths (--fixed): each request's text is the one
    its seed gives it alone."""
    one = session(tiny_target, tiny_draft, 1, adaptive=False, draft_max=4)
    four = session(tiny_target, tiny_draft, 4, adaptive=False, draft_max=4)
    params = [SamplingParams(temperature=t, top_k=k, top_p=p, seed=s)
              for t, k, p, s in [(0.8, 0, 0.95, 1), (1.2, 8, 1.0, 2), (0.5, 0, 1.0, 3), (1.0, 40, 0.9, 4)]]
    reqs = requests(one, params)
    want = [solo(one, **r) for r in reqs]
    batch = Batch(four)
    got = batched(batch, reqs)
    assert got == want
    assert four.ctx.n_decode_calls > 0 and batch.stats()["max_sequences"] == 4
    # each slot drafts in its own sequence of one draft-model context, the slots' passes together
    assert sorted(s.drafter.inner.ctx.seq for s in batch.slots if s.drafter.inner.ctx.n_past) == [0, 1, 2, 3]
    st = batch.stats()["draft"]
    assert st["max_sequences"] == 4 and st["shared_decodes"] > 0
    batch.close()
    one.close()
    four.close()


@pytest.mark.parametrize("kind,draft_max", [("qwen35", 6), ("mamba", 6)])
def test_hybrid_and_recurrent_targets_batch_each_sequence_its_own_state(smol_gguf, kind, draft_max):
    """Qwen3.5-like (recurrent-state snapshots per sequence) and Mamba (state checkpoints per
    sequence): lookup drafts, rejected drafts roll each sequence back on its own."""
    path = str(tiny_2026_model(TEST_CACHE, smol_gguf, kind))
    one = session(path, "lookup", 1, draft_max=draft_max, adaptive=False)
    three = session(path, "lookup", 3, draft_max=draft_max, adaptive=False)
    assert three.ctx.rollback_kind == ("snapshots" if kind == "qwen35" else "checkpoints")
    base = one.target.tokenize(PROMPTS[0])
    first, _ = solo(one, base, SamplingParams(), 20)
    prompts = [base + first + base, one.target.tokenize(PROMPTS[1]), one.target.tokenize(PROMPTS[3])]
    reqs = [dict(prompt=p, params=SamplingParams(), max_tokens=m) for p, m in zip(prompts, (30, 25, 35), strict=True)]
    want = [solo(one, **r) for r in reqs]
    batch = Batch(three)
    got = batched(batch, reqs)
    assert got == want
    assert batch.stats()["max_sequences"] == 3
    assert sum(s.ctx.n_restored for s in batch.slots) > 0 or kind == "qwen35"
    one.close()
    three.close()


def test_the_batch_drafts_less_as_it_fills():
    passes = [0.010 * (1 + 0.05 * k) for k in range(136)]  # a pass over n rows: each row 5 % of one
    sure = Estimate(0.9, 0.9, 0.0, 16)
    unsure = Estimate(0.4, 0.6, 0.0, 16)
    assert allocate([sure], passes)[0] == [16]  # alone: its own controller decides, up to its cap
    two, eight = allocate([sure, sure], passes)[0], allocate([sure] * 8, passes)[0]
    assert sum(two) > 0 and max(eight) < max(two)
    mixed = allocate([sure, unsure, sure, unsure], passes)[0]
    assert mixed[0] > mixed[1] and mixed[2] > mixed[3]
    # a paid draft token (a draft model's pass) is dearer: fewer of them
    paid = allocate([Estimate(0.9, 0.9, 0.004, 16)] * 4, passes)[0]
    assert sum(paid) < sum(allocate([sure] * 4, passes)[0])
    assert allocate([NOTHING] * 4, passes) == ([0] * 4, 4 / passes[3])  # nothing to draft: the plain batch


def test_tokens_that_fill_a_tile_already_paid_for_are_drafted_though_one_alone_would_not_pay():
    """A CPU prices a pass in tiles of rows: 5 to 8 rows cost about what 5 do. One unsure draft
    token alone does not pay for the step up from 4 rows; four of them, filling the tile, do
    (a rule that adds a token only while the next one pays alone never starts)."""
    passes = [0.20] * 4 + [0.26] * 4 + [0.50] * 8
    unsure = Estimate(0.35, 0.5, 0.0, 1)
    assert allocate([unsure, NOTHING, NOTHING, NOTHING], passes)[0] == [0, 0, 0, 0]
    ks, rate = allocate([unsure] * 4, passes)
    assert ks == [1, 1, 1, 1] and rate == pytest.approx((4 + 4 * 0.35) / 0.26)
    # past the tile: 9 rows cost 0.50, which these tokens cannot pay
    assert sum(allocate([replace(unsure, cap=4)] * 4, passes)[0]) == 4


def test_slots_drafting_with_the_draft_model_at_once_share_its_passes():
    """One slot's draft-model token costs a whole pass (half a target pass here) and does not
    pay; four slots drafting at once share the passes (one decode each over their rows), and
    do."""
    passes = [0.10] * 32  # the target's pass: flat up to 32 rows (a GPU)
    model = Estimate(0.7, 0.8, 0.05, 8)
    assert allocate([model, NOTHING, NOTHING, NOTHING], passes)[0] == [0, 0, 0, 0]
    ks, rate = allocate([model] * 4, passes)
    assert min(ks) > 0 and rate > 4 / 0.10


def test_a_draft_model_pass_is_priced_at_its_wall_time_and_catch_up():
    """A draft model's passes stall every member of the batch: priced with its catch-up over
    what its cache lacks, a draft that would pay at a pass's cost alone gets nothing."""
    passes = [0.100 * (1 + 0.05 * k) for k in range(68)]
    pass_s = 0.010  # a draft-model pass: a tenth of a target pass
    cheap = Estimate(0.8, 0.8, pass_s, 16)  # caught up: its first token is one pass
    assert allocate([cheap] * 4, passes)[0][0] > 0
    behind = Estimate(0.8, 0.8, pass_s, 16, behind=300)  # the prompt first
    assert allocate([behind, NOTHING, NOTHING, NOTHING], passes)[0][0] == 0
    dear = Estimate(0.8, 0.8, 0.100, 16)  # a pass as dear as a target pass, shared or not
    assert allocate([dear] * 4, passes)[0] == [0, 0, 0, 0]
    # a free draft of the same acceptance still pays
    assert allocate([Estimate(0.8, 0.8, 0.0, 16)] * 4, passes)[0][0] > 0


@pytest.mark.parametrize("pass_s,model", [(10.0, False), (1e-6, True)])
def test_a_slot_whose_draft_model_cannot_pay_drafts_no_model_pass(tiny_target, tiny_draft, pass_s, model):
    """Two busy slots; one's draft model measured at ``pass_s`` a pass: too dear, the batch
    plans it lookup's share and its draft model decodes nothing (it does not even catch up
    on the prompt), though its own controller, alone, would draft with it; nearly free, the
    model drafts."""
    two = session(tiny_target, tiny_draft, 2, draft_max=8)
    batch = Batch(two)
    a, b = batch.slots
    a.busy = b.busy = True
    a.drafter.pass_time = pass_s  # the batch's price of a pass
    a.drafter.inner.ctl.cost.draft_token = 1e-6  # alone, its own controller would draft with it
    a.drafter.begin([], None)
    a.drafter.inner.ctl.acceptance(a.drafter.inner.msource).f_ok = 1.9  # its drafts have been good (0.95)
    context = two.target.tokenize("1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3,")
    look = a.drafter.inner.lookup_proposal(context, 8)
    k, who = batch.plan(a, context, 8, look)
    assert (who == MODEL_SHARE) is model
    drafter_ctx = a.drafter.model.ctx
    calls = drafter_ctx.n_decode_calls
    d = a.drafter.propose(context, 8)
    if model:
        assert k > 0 and d.source == a.drafter.inner.msource and drafter_ctx.n_decode_calls > calls
    else:
        assert drafter_ctx.n_decode_calls == calls and d.source.kind in ("lookup", "none")
        assert len(d.tokens) <= k
    batch.close()
    two.close()


def test_a_slot_drafts_lookups_copy_at_the_batchs_length_and_learns_from_copies_it_did_not_draft(
        tiny_target, tiny_draft):
    """In a batch a slot drafts prompt lookup's copy as far as the allocation gives it, priced
    at the acceptance of its match's bucket. A copy it does not draft is still scored against
    what the target emits, so a bucket that starts pessimistic learns to draft (before, a slot
    that never drafted never learned, and a batch drafted nothing)."""
    two = session(tiny_target, "lookup", 2, draft_max=8)
    batch = Batch(two)
    a, b = batch.slots
    a.busy = b.busy = True
    ctl = a.drafter.inner.ctl
    context = two.target.tokenize("1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3,")
    batch.calibration = [0.10, 0.18, 0.19, 0.20] + [1.0] * 14  # rows 2-4 cost about the same; 5 and up, 5x
    look = a.drafter.inner.lookup_proposal(context, 8)
    assert len(look.tokens) >= 4
    acc = ctl.acceptance(look.source)
    acc.f_ok, acc.f_n = 0.0, 6.0  # its first tokens have failed: the step's plain rate is better
    assert a.drafter.propose(context, 8).tokens == []
    n_before = acc.f_n
    emitted = look.tokens[:1]
    a.drafter.observe(Draft([]), 0, emitted, 0.0, 0.1)
    assert acc.f_n > n_before * acc.decay  # scored on the copy it did not draft
    for _ in range(30):  # the copy keeps coming true: its bucket learns, and the slot drafts it
        a.drafter.propose(context, 8)
        a.drafter.observe(Draft([]), 0, look.tokens[:3], 0.0, 0.1)
    d = a.drafter.propose(context, 8)
    k = len(d.tokens)
    assert 0 < k <= 2 and d.tokens == look.tokens[:k] and d.source == look.source  # 2 + k rows: within the tile
    batch.close()
    two.close()


def test_the_slots_draft_models_run_as_one_batch_each_drafting_what_it_drafts_alone(tiny_target, tiny_draft,
                                                                                   monkeypatch):
    """Three requests drafting with the draft model at once (--fixed, 4 tokens a step): each
    draft pass of the slots drafting is one llama_decode of the draft model's context, and
    every draft each request gets, and its output, are those it gets served alone."""
    drafts = []
    propose = ModelDrafter.propose

    def recorded(self, context, max_len, *args, **kw):
        d = propose(self, context, max_len, *args, **kw)
        drafts.append((tuple(context), tuple(d.tokens)))
        return d

    monkeypatch.setattr(ModelDrafter, "propose", recorded)
    one = session(tiny_target, tiny_draft, 1, adaptive=False, draft_max=4)
    three = session(tiny_target, tiny_draft, 3, adaptive=False, draft_max=4)
    reqs = requests(one, [SamplingParams()] * 4)[:3]

    def per_request():
        return [[(len(c), d) for c, d in drafts if list(c[:len(r["prompt"])]) == r["prompt"]] for r in reqs]

    want = [solo(one, **r) for r in reqs]
    want_drafts, drafts[:] = per_request(), []
    assert all(sum(len(d) for _, d in r) >= 8 for r in want_drafts)  # each request drafted, step after step
    batch = Batch(three)
    assert batched(batch, reqs) == want
    assert per_request() == want_drafts
    st = batch.stats()["draft"]
    passes = sum(len(d) + 1 for _, d in drafts)  # a catch-up pass and a pass per drafted token
    assert st["max_sequences"] == 3 and st["decodes"] < passes  # the slots' passes went together
    # the draft model's only cache is the batch's, a sequence a slot (the memory plan counts
    # n_ctx x 3 draft tokens): the session's own drafter never made one
    assert three.drafter.name == "none" and not three.paid(DraftKind.MODEL).has_cache
    assert batch.drafts.ctx.n_seq == 3
    batch.close()
    one.close()
    three.close()


def test_the_slots_share_one_cache_that_holds_every_slot_full_at_once(tiny_target):
    """The sequences share one KV cache (unified, so that llama.cpp runs a batch whose
    sequences hold different numbers of tokens as one pass), each kept to n_ctx tokens:
    uneven blocks of every sequence go in one decode, every slot may be full at once, and
    none may take another's room."""
    ctx = Context(Model(tiny_target), ContextConfig(n_ctx=64, n_threads=2, n_seq=4))
    slots = [SeqContext(ctx, s, None, 64) for s in range(4)]
    toks = ctx.model.tokenize("one two three four five six seven eight nine ten " * 8, add_special=False)
    pos = [0] * 4
    for blocks in ([40, 3, 1, 17], [24, 61, 63, 47]):  # uneven blocks, every sequence in one decode
        ctx.decode_seqs([(s, toks[:n], pos[s], [True] * n) for s, n in enumerate(blocks)])
        pos = [p + n for p, n in zip(pos, blocks, strict=True)]
    assert pos == [64] * 4
    slots[0].tokens = toks[:64]
    with pytest.raises(ContextFull):
        slots[0].eval(toks[:1])
    ctx.close()


def test_every_decode_of_a_batch_runs_on_one_thread(tiny_target, tiny_draft, monkeypatch):
    """The requests' threads take turns completing a batch, but its decodes (the target's and
    the draft model's) all run on the batch's one decode thread: llama.cpp's CPU backend keeps
    a team of worker threads per calling thread, and decodes from threads in turn were
    slower. An error there reaches the caller."""
    threads = set()
    decode_seqs = Context.decode_seqs

    def recorded(self, items, b=None):
        threads.add(threading.current_thread().name)
        return decode_seqs(self, items, b)

    three = session(tiny_target, tiny_draft, 3, adaptive=False, draft_max=4)
    batch = Batch(three)
    monkeypatch.setattr(Context, "decode_seqs", recorded)
    reqs = requests(three, [SamplingParams()] * 4)[:3]
    batched(batch, reqs)
    assert batch.stats()["draft"]["decodes"] > 0 and threads == {"specli-decode"}

    def fails():
        raise SpecliError("boom")

    with pytest.raises(SpecliError, match="boom"):
        batch.thread.call(fails)
    assert batch.thread.call(lambda: threading.current_thread().name) == "specli-decode"
    batch.close()
    assert batch.thread.call(lambda: 7) == 7  # closed: runs where it is called
    three.close()
