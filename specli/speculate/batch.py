"""Several requests at once on one target context, speculation kept (``specli serve --parallel N``).

The target's context holds N sequences (slots). Each request runs the ordinary decoding loop
(:func:`specli.speculate.loop.generate`) on its own thread, on its slot's
:class:`~specli.engine.SeqContext`, with the slot's own drafter (lookup index, controller,
its sequence of the draft model's context, whose passes are batched the same way) and its
own :class:`~specli.speculate.verify.Sampler` (its seed's noise).
Every decode a request asks for goes to the :class:`Batcher`, which waits until every active
request has asked (its next token plus its draft block, or a chunk of its prompt) and runs
them as ONE llama_decode.
Each request therefore sees exactly the logits it would see alone (up to the float rounding
of another batch shape), and its output is what it gets served alone.

Draft lengths are chosen for the whole batch (:func:`allocate`): from the cost of a pass over
n rows (the calibrated batch curve, scaled by the passes timed lately: on a CPU it rises in
steps, so a tile of rows costs about what one row of it does), the draft model's measured pass
(batch time: every member waits for it; the slots drafting at once share each pass) and each
request's acceptance estimates (lookup's by the bucket of the match it has now), the draft
tokens are lined up by what each nets and the batch takes the prefix with the best tokens/s.
With one busy slot each request drafts as it does alone; with many, the batch already yields a
token per slot, so only likely tokens, or tokens that fill a tile already paid for, are worth
their rows, and a draft model drafts only where its passes pay (:meth:`Batch.plan`).
"""

from __future__ import annotations

import queue
import statistics
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np

from specli.constrain import Constraint, ForcedDrafter
from specli.engine import Context, SeqContext
from specli.errors import SpecliError
from specli.hardware import calibrate
from specli.speculate import registry
from specli.speculate.adaptive import CATCH_UP_PRICED, AdaptiveDrafter
from specli.speculate.controller import block_ratio
from specli.speculate.drafters import Drafter, ModelDrafter
from specli.speculate.loop import Response, generate
from specli.speculate.registry import DraftKind
from specli.speculate.source import FORCED, Draft
from specli.speculate.verify import SamplingParams
from specli.tokens import common_prefix

PREFILL_CHUNK = 256  # the most prompt tokens one request puts in a step
SMOOTHING = 0.1  # of a draft model's measured pass time
# the batch's passes of each size: the median of the last few (the first pass of a new size also
# allocates its graph)
RECENT = 7


@dataclass
class _Item:
    seq: int
    tokens: Sequence[int]
    pos0: int
    want: Sequence[bool]
    rows: list[np.ndarray] | None = None
    error: BaseException | None = None
    done: bool = False


class DecodeThread:
    """One thread that makes every llama_decode of a batch (its target's and its draft model's
    contexts): llama.cpp's CPU backend (OpenMP) keeps a team of worker threads per calling
    thread, and decodes called from the requests' threads in turn were slower than from one
    thread (docs/benchmarks.md, "Many clients at once")."""

    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="specli-decode", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, args, done, out = job
            try:
                out.append((True, fn(*args)))
            except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
                out.append((False, e))
            done.set()

    def call(self, fn, *args):
        """``fn(*args)`` on the decode thread; its result, or its exception raised here."""
        if threading.current_thread() is self._thread or not self._thread.is_alive():  # (closed: here)
            return fn(*args)
        done, out = threading.Event(), []
        self._jobs.put((fn, args, done, out))
        done.wait()
        ok, value = out[0]
        if not ok:
            raise value
        return value

    def close(self) -> None:
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()


class Batcher:
    """Collects the blocks the active sequences ask to decode and runs them as one
    llama_decode once every member has asked (a thread that is not a member is served at
    once, in the next batch). ``members``: the threads generating now (:meth:`join`,
    :meth:`leave`; :meth:`away` while one waits on something else, so it holds nobody up).
    ``lock`` guards every llama.cpp call on the context (a decode holds it; nobody holds it
    while waiting for a batch); the members' bookkeeping has a lock of its own, so admitting
    a request never waits for a decode."""

    def __init__(self, ctx: Context, thread: DecodeThread):
        self.ctx = ctx
        self.thread = thread  # where its decodes run (its batch's one decode thread)
        # a draft model's batcher: a sequence decoded here may draft there until its next block
        # here (it is inside that batcher's phase meanwhile; see :meth:`enter`)
        self.phase: Batcher | None = None
        self.inside: set[int] = set()  # (a phase) the sequences it waits for, besides the members
        self.lock = threading.RLock()
        self._cond = threading.Condition(threading.Lock())
        self._pending: list[_Item] = []
        self.members = 0
        self.decodes = 0  # llama_decode calls
        self.rows = 0  # tokens they held
        self.shared = 0  # decodes that held two sequences or more
        self.max_seqs = 0  # the most sequences one decode held
        self.share: dict[int, float] = {}  # per sequence: its part of the last decode's time (by rows)
        self.timed_rows = 0  # decodes of at most this many rows are timed (the batch's steps: it prices drafts)
        self.measured: dict[int, float] = {}  # rows -> seconds a decode of that many took, lately (a median)
        self._recent: dict[int, deque[float]] = {}

    def join(self) -> None:
        with self._cond:
            self.members += 1

    def leave(self) -> None:
        with self._cond:
            self.members -= 1
            ready = self._take_if_ready()
        self._decode(ready)

    @contextmanager
    def away(self) -> Iterator[None]:
        """A member that waits on something else meanwhile (a client, a test's hook)."""
        self.leave()
        try:
            yield
        finally:
            self.join()

    def enter(self, seqs: set[int]) -> None:
        """These sequences may draft here now: a decode waits for their blocks too, until each
        has asked or dropped out (:meth:`drop`). Every sequence a step of the target's batch
        just decoded enters: their draft passes then go in one decode."""
        with self._cond:
            self.inside |= seqs

    def drop(self, seq: int) -> None:
        """``seq`` drafts no more until it enters again (it goes on to its target step, or away)."""
        with self._cond:
            if seq not in self.inside:
                return
            self.inside.discard(seq)
            ready = self._take_if_ready()
        self._decode(ready)

    def submit(self, seq: int, tokens: Sequence[int], pos0: int, want: Sequence[bool]) -> list[np.ndarray]:
        """Decode ``tokens`` in sequence ``seq`` with the others' blocks; the logits rows asked for."""
        if self.phase is not None:
            self.phase.drop(seq)
        item = _Item(seq, tokens, pos0, want)
        with self._cond:
            self._pending.append(item)
            ready = self._take_if_ready()
        self._decode(ready)
        with self._cond:
            while not item.done:
                self._cond.wait()
        if item.error is not None:
            raise item.error
        return item.rows

    def _take_if_ready(self) -> list[_Item]:
        """Every pending block once every member has asked (the caller then decodes them)."""
        if not self._pending or len(self._pending) < self.members or \
                not self.inside <= {it.seq for it in self._pending}:
            return []
        items, self._pending = sorted(self._pending, key=lambda it: it.seq), []
        return items

    def _decode(self, items: list[_Item]) -> None:
        if not items:
            return
        try:
            with self.lock:
                for group in self._groups(items):
                    self.thread.call(self._run, group)
        finally:
            if self.phase is not None:
                self.phase.enter({it.seq for it in items})
            with self._cond:
                for it in items:
                    it.done = True
                self._cond.notify_all()

    def _run(self, group: list[_Item]) -> None:
        t0 = time.perf_counter()
        try:
            out = self.ctx.decode_seqs([(it.seq, it.tokens, it.pos0, it.want) for it in group])
        except SpecliError as e:
            for it in group:
                it.error = SpecliError(str(e))
            return
        dt = time.perf_counter() - t0
        n = sum(len(it.tokens) for it in group)
        if n <= self.timed_rows:
            recent = self._recent.setdefault(n, deque(maxlen=RECENT))
            recent.append(dt)
            self.measured[n] = statistics.median(recent)
        for it, rows in zip(group, out, strict=True):
            it.rows = rows
            self.share[it.seq] = dt * len(it.tokens) / n
        self.decodes += 1
        self.rows += n
        self.shared += len(group) > 1
        self.max_seqs = max(self.max_seqs, len(group))

    def _groups(self, items: list[_Item]) -> Iterator[list[_Item]]:
        """The items in batches of at most n_batch tokens (one, unless prompts' chunks crowd it)."""
        group: list[_Item] = []
        n = 0
        for it in items:
            if group and n + len(it.tokens) > self.ctx.n_batch:
                yield group
                group, n = [], 0
            group.append(it)
            n += len(it.tokens)
        if group:
            yield group

    def stats(self) -> dict:
        with self._cond:
            return {"decodes": self.decodes, "rows": self.rows, "shared_decodes": self.shared,
                    "max_sequences": self.max_seqs}


@dataclass
class Estimate:
    """What one request's next draft is worth: the chance its first token is accepted, each
    later one (given the ones before), the wall time of a one-row pass of what drafts (0:
    free, prompt lookup or tokens a grammar forces), the most tokens it may draft, and the
    rows its first pass holds (a draft model's catch-up over what its cache lacks, which
    yields its first token). A draft model's passes stall the whole batch (every member
    waits for its block), so they are priced as the batch's time; the slots drafting at once
    share them (one decode of the draft model's context per pass)."""

    first: float
    rest: float
    draft_token: float
    cap: int
    behind: int = 1


NOTHING = Estimate(0.0, 0.0, 0.0, 0)  # a request with nothing to draft this step
# who drafts a slot's share (:meth:`Batch.plan`): its own controller as served alone (no other
# slot busy, or fixed lengths), prompt lookup's copy at the length the batch gives it, or the
# draft model up to that length
ALONE, LOOKUP_SHARE, MODEL_SHARE = "alone", "lookup", "model"


def allocate(requests: Sequence[Estimate], passes: Sequence[float]) -> tuple[list[int], float]:
    """Draft lengths for one batch step of these requests, and the tokens/s the step promises.
    ``passes[n - 1]``: the seconds of a pass over n rows (the batch's curve, :meth:`Batch.curve`:
    on a CPU it rises in steps, a tile of rows costing about as much as one row of it). The
    step costs the pass over all its rows (one per request, plus the drafts) and the draft
    model's passes, and yields one token per request plus the expected accepted drafts.

    Draft tokens are lined up by what each nets: its chance of being kept (a request's tokens
    in order, each worth less than the one before) less its drafting time at the batch's
    plain rate. A draft model's pass holds every slot drafting that deep at once, so a
    slot's token there costs only the rows it adds to the pass (priced by the curve's shape);
    the first token at a depth pays for the pass. The step takes the prefix of that line with
    the best tokens/s, none when no prefix beats the plain batch: over costs that rise in
    steps a token that does not pay alone may pay with the tokens that fill its tile or share
    its pass, so every prefix is priced. One request alone drafts up to its cap: its own
    controller prices its draft as it does serving alone."""
    n = len(requests)
    if n <= 1:
        return [r.cap for r in requests], 0.0
    if n > len(passes) or passes[n - 1] <= 0:
        return [0] * n, 0.0

    def pass_rows(rows: int) -> float:  # a draft pass over ``rows`` rows, in one-row passes
        return block_ratio(passes, rows) if rows > 0 else 0.0

    def draft_cost(r: Estimate, j: int) -> float:  # seconds r's token at depth j adds
        if r.draft_token <= 0:
            return 0.0
        have = depth[j] if j < len(depth) else 0
        return r.draft_token * (pass_rows(have + (r.behind if j == 0 else 1)) - pass_rows(have))

    plain = n / passes[n - 1]
    k, p = [0] * n, [1.0] * n
    depth: list[int] = []  # rows of the draft model's pass at each depth so far
    tokens, drafting, rows = float(n), 0.0, n
    best, best_rate = list(k), plain
    while rows < len(passes):
        top, pick, cost = float("-inf"), -1, 0.0
        for i, r in enumerate(requests):
            if k[i] >= r.cap:
                continue
            c = draft_cost(r, k[i])
            net = p[i] * (r.first if k[i] == 0 else r.rest) - plain * c
            if net > top:
                top, pick, cost = net, i, c
        if pick < 0:
            break
        r, j = requests[pick], k[pick]
        if r.draft_token > 0:
            if j == len(depth):
                depth.append(0)
            depth[j] += r.behind if j == 0 else 1
        drafting += cost
        p[pick] *= r.first if j == 0 else r.rest
        tokens += p[pick]
        k[pick] += 1
        rows += 1
        rate = tokens / (passes[rows - 1] + drafting)
        if rate > best_rate * (1 + 1e-9):
            best, best_rate = list(k), rate
    return best, best_rate


class BatchDrafter(Drafter):
    """A slot's drafter inside a batch: drafts what the batch's allocation gives it
    (:meth:`Batch.plan`): prompt lookup's copy at that length, or its draft model up to that
    length (while the model is confident) when the allocation finds that its passes (their
    whole wall time, which every member of the batch waits out) pay. Alone in the batch, its
    own controller decides as served alone. The slots' draft models are one context's
    sequences: the slots drafting at once run each pass as one decode (:class:`Batcher`
    again). It tells its controller the part of each batch pass its block took, not the whole
    pass, and times its draft model's passes itself."""

    def __init__(self, inner: Drafter, batch: Batch, slot: Slot):
        self.inner, self.batch, self.slot = inner, batch, slot
        self.name = inner.name
        self.adaptive = isinstance(inner, AdaptiveDrafter)
        self.model = inner.model if self.adaptive else None  # the draft model (a PaidDrafter), if any
        self.est: Estimate | None = None  # its draft as last priced (what the other slots count it at)
        self.pass_time: float | None = None  # a draft-model pass's measured wall time (None: not timed yet)

    def begin(self, prompt, max_tokens) -> None:
        self.est = None
        self.inner.begin(prompt, max_tokens)

    def constrain(self, guide) -> None:
        self.guide = guide
        self.inner.constrain(guide)

    def sampling(self, sampler) -> None:
        self.inner.sampling(sampler)

    # -- prices --------------------------------------------------------------------------
    def lookup_estimate(self, look: Draft | None, max_len: int) -> Estimate:
        """Lookup's proposal this step, free to draft, at the acceptance its match's bucket has
        earned, as far as a copy from such a match is trusted (:meth:`AdaptiveDrafter.trusted`)."""
        if look is None or not look.tokens:
            return NOTHING
        a = self.inner.ctl.acceptance(look.source)
        return Estimate(a.cautious_first(), a.alpha_rest, 0.0, min(max_len, self.inner.trusted(look)))

    def forced_estimate(self, max_len: int) -> Estimate:
        """Tokens a grammar forces: free, at the acceptance forced drafts have earned."""
        a = self.inner.ctl.acceptance(FORCED)
        return Estimate(a.alpha_first, a.alpha_rest, 0.0, max_len)

    def model_estimate(self, context: Sequence[int], cap: int, passes: list[float]) -> Estimate | None:
        """Its next draft from the draft model (None: it has none): each pass at its measured
        wall time, the first one the catch-up over all the model's cache lacks (the prompt
        too, before its first draft: no outlay spread over drafts to come, the whole batch
        waits it out now), priced on the batch's pass curve ``passes``."""
        if self.model is None:
            return None
        ctl, src = self.inner.ctl, self.inner.msource
        a = ctl.acceptance(src)
        dt = self.pass_time
        if dt is None:  # calibrated with the verify curve, at the batch's measured speed since
            cal = self.batch.session.verify_costs()[0]
            dt = ctl.cost.draft_calibrated * (passes[0] / cal if cal > 0 else 1.0)
        # its first token's acceptance as lookup's is judged: lowered by its estimate's spread
        return Estimate(a.cautious_first(), a.alpha_rest, dt, cap, max(1, self.model.behind(context)))

    # -- a step --------------------------------------------------------------------------
    def propose(self, context: Sequence[int], max_len: int) -> Draft:
        if not self.adaptive:
            return self.inner.propose(context, self.batch.plan(self.slot, context, max_len)[0])
        look = self.inner.lookup_proposal(context, max_len)  # scored against the target's tokens, drafted or not
        k, who = self.batch.plan(self.slot, context, max_len, look)
        if who == ALONE:
            return self.inner.propose(context, k, look)
        if who == MODEL_SHARE:  # the draft model's tokens up to k, while it is confident enough
            return self.model.propose(context, k)
        if k == 0:
            return Draft([])
        return Draft(look.tokens[:k], look.source, look.confidence[:k])

    def _verify_time(self, t_verify: float) -> float:
        return self.batch.batcher.share.get(self.slot.index, t_verify)

    def observe(self, draft: Draft, n_accepted: int, emitted: list[int], t_draft: float, t_verify: float) -> None:
        if self.model is not None and draft.source == self.inner.msource and draft.caught_up <= CATCH_UP_PRICED:
            per = t_draft / (draft.passes + 1)  # its passes' wall time, Python's share included
            self.pass_time = per if self.pass_time is None else self.pass_time + SMOOTHING * (per - self.pass_time)
        self.inner.observe(draft, n_accepted, emitted, t_draft, self._verify_time(t_verify))

    def observe_forced(self, draft, n_forced, n_accepted, emitted, t_draft, t_verify) -> None:
        self.inner.observe_forced(draft, n_forced, n_accepted, emitted, t_draft, self._verify_time(t_verify))

    def room(self, max_len: int) -> int:
        return self.batch.plan(self.slot, None, max_len, forced=True)[0]

    def forced(self, n: int, max_len: int) -> int:
        return self.inner.forced(n, max_len)

    def continuation(self, context, head, max_len, min_match):
        return self.inner.continuation(context, head, max_len, min_match)

    def repair(self) -> None:
        self.inner.repair()

    def plain_rate(self) -> float | None:
        return self.inner.plain_rate()


@dataclass(eq=False)
class Slot:
    """One sequence of the target's context and what drafts for it; it keeps its cache (the
    prompt and answer of its last request) for the next request that shares a prefix."""

    index: int
    ctx: SeqContext
    drafter: BatchDrafter | None = None
    busy: bool = False
    used: int = 0  # when it was last taken (for the least recently used)


class _SlotModelDrafter(ModelDrafter):
    """One slot's draft model: the session's draft model's weights, its sequence of the batch's
    draft-model context for a cache (the session's drafter never makes one of its own)."""

    def __init__(self, shared: ModelDrafter, ctx: SeqContext):
        self.model, self.cfg, self.p_min, self._ctx = shared.model, shared.cfg, shared.p_min, ctx


class _SlotParts:
    """The session's parts as one slot builds its drafter from (:class:`registry.Parts`): the
    draft model's weights are shared, its KV cache is the slot's sequence of the batch's
    draft-model context."""

    def __init__(self, session, batch: Batch, slot: Slot):
        self.session, self.batch, self.slot = session, batch, slot

    @property
    def settings(self):
        return self.session.settings

    def lookup(self):
        return self.session.lookup()

    def verify_costs(self) -> list[float]:
        return self.session.verify_costs()

    def paid(self, kind: DraftKind):
        if kind is not DraftKind.MODEL:
            raise SpecliError(f"--parallel drafts with a draft model or prompt lookup, not {kind}")
        shared = self.session.paid(kind)  # loads the draft model
        return _SlotModelDrafter(shared, self.batch.draft_seq(shared.model, self.slot.index))


class Batch:
    """``n`` slots on the session's target context (built with ``Options.parallel`` = n). A
    request :meth:`acquire`\\ s a slot, :meth:`generate`\\ s on it on its own thread as a member
    of the batch (:meth:`member`), and :meth:`release`\\ s it."""

    def __init__(self, session, n: int | None = None, chunk: int = PREFILL_CHUNK):
        ctx: Context = session.ctx
        n = ctx.n_seq if n is None else n
        if n > ctx.n_seq:
            raise SpecliError(f"the target's context holds {ctx.n_seq} sequences, not {n}")
        self.session = session
        self.mode = session.draft.mode
        self.draft_max = session.opts.spec.draft_max
        self.thread = DecodeThread()
        self.batcher = Batcher(ctx, self.thread)
        self._curve: list[float] = []
        if n > 1 and self.mode.adaptive and self.mode.kind is not DraftKind.NONE:
            # calibrated on sequence 0 before any slot holds it: a verify block, and a pass of
            # every slot with a whole block
            session.verify_costs()
            self._curve = calibrate.batch_costs(ctx, n * (self.draft_max + 1))
            self.batcher.timed_rows = len(self._curve)
        ctx.clear()
        self._lock = threading.Lock()
        self.chunk = chunk
        step = max(1, min(chunk, ctx.n_batch // n))
        self.slots = [Slot(i, SeqContext(ctx, i, self.batcher, step)) for i in range(n)]
        for s in self.slots:
            s.ctx.clear()  # whatever an earlier batch on this context left there
        self.drafts: Batcher | None = None  # the draft model's, once a slot drafts with one
        for s in self.slots:
            s.drafter = BatchDrafter(registry.build(self.mode, _SlotParts(session, self, s)), self, s)
        self._taken = 0

    # -- slots -----------------------------------------------------------------------------
    def acquire(self, prompt: Sequence[int]) -> Slot | None:
        """A free slot for ``prompt``: the one whose cache shares the longest prefix with it,
        else the least recently used; None when every slot is busy."""
        with self._lock:
            free = [s for s in self.slots if not s.busy]
            if not free:
                return None
            slot = max(free, key=lambda s: (common_prefix(s.ctx.tokens, prompt), -s.used))
            slot.busy = True
            self._taken += 1
            slot.used = self._taken
            return slot

    def release(self, slot: Slot) -> None:
        if self.drafts is not None:
            self.drafts.drop(slot.index)
        with self._lock:
            slot.busy = False

    def draft_seq(self, model, seq: int) -> SeqContext:
        """Sequence ``seq`` of the draft model's context of as many sequences as slots (made
        on first use); the target's batcher lets each step's sequences draft there together."""
        if self.drafts is None:
            n = len(self.slots)
            self.drafts = Batcher(Context(model, replace(self.session.cfg, n_seq=n)), self.thread)
            self.batcher.phase = self.drafts
        dctx = self.drafts.ctx
        return SeqContext(dctx, seq, self.drafts, max(1, min(self.chunk, dctx.n_batch // dctx.n_seq)))

    @contextmanager
    def away(self, slot: Slot) -> Iterator[None]:
        """``slot``'s thread waits on something else meanwhile: the others draft and step on."""
        if self.drafts is not None:
            self.drafts.drop(slot.index)
        with self.batcher.away():
            yield

    @property
    def busy(self) -> int:
        with self._lock:
            return sum(s.busy for s in self.slots)

    @contextmanager
    def member(self) -> Iterator[None]:
        """The calling thread generates in the batch meanwhile (join before it starts: the
        batch then waits for its first block)."""
        self.batcher.join()
        try:
            yield
        finally:
            self.batcher.leave()

    # -- draft lengths -------------------------------------------------------------------
    def plan(self, slot: Slot, context: Sequence[int] | None, max_len: int, look: Draft | None = None,
             forced: bool = False) -> tuple[int, str]:
        """The most tokens ``slot`` may draft this step, and who drafts them (``ALONE``,
        ``LOOKUP_SHARE``, ``MODEL_SHARE``), by :func:`allocate` over the busy slots (the others
        at the price of their last plan): lookup's proposal ``look`` (free), or the draft model
        at its own price (its passes' wall time, catch-up included), whichever promises the
        batch more tokens/s; the model only when it earns a share. Alone, or drafting with
        fixed lengths (--fixed), it drafts up to ``max_len`` as it does served alone.
        ``forced``: the room for tokens a grammar forces (free, and nearly always kept)."""
        d = slot.drafter
        if max_len <= 0:
            return 0, LOOKUP_SHARE
        with self._lock:
            others = [s.drafter for s in self.slots if s.busy and s is not slot]
        if not d.adaptive or not others:
            return max_len, ALONE
        passes = self.curve()
        ests = [o.est or NOTHING for o in others]
        if forced:
            d.est = d.forced_estimate(max_len)
            return allocate([d.est, *ests], passes)[0][0], LOOKUP_SHARE
        d.est = d.lookup_estimate(look, max_len)
        ks, rate = allocate([d.est, *ests], passes)
        k, who = ks[0], LOOKUP_SHARE
        model = d.model_estimate(context, max_len, passes)
        if model is not None:
            mks, mrate = allocate([model, *ests], passes)
            if mks[0] > 0 and mrate > rate:
                d.est, k, who = model, mks[0], MODEL_SHARE
        return k, who

    def curve(self) -> list[float]:
        """The price of a batch pass by its rows (``[n - 1]``: n rows): the calibrated batch
        curve (:func:`calibrate.batch_costs`), scaled by what the steps' passes have taken
        lately against it (the machine's speed now; its shape, the steps of a CPU's tiles,
        stays the calibration's)."""
        base = self._curve
        seen = {n: t for n, t in self.batcher.measured.items() if n <= len(base)}
        cal = sum(base[n - 1] for n in seen)
        scale = sum(seen.values()) / cal if seen and cal > 0 else 1.0
        return [c * scale for c in base]

    # -- generation ----------------------------------------------------------------------
    def generate(self, slot: Slot, prompt: Sequence[int], params: SamplingParams, max_tokens: int,
                 exact_prefill: bool = False, constraint: Constraint | None = None,
                 logprobs: int | None = None) -> Response:
        """:func:`loop.generate` on the slot (iterate it on a member thread)."""
        d: Drafter = slot.drafter
        if constraint is not None and d.name != "none":
            d = ForcedDrafter(d)
        return generate(slot.ctx, prompt, d, params, max_tokens, self.draft_max, exact_prefill, constraint,
                        logprobs)

    def run(self, requests: Sequence[dict]) -> list[Response]:
        """Serve ``requests`` together (keyword arguments of :meth:`generate` without the
        slot), each on its own thread from the same first step; the finished responses, in
        order, with their chunks in ``.chunks``. At most one request per slot."""
        if len(requests) > len(self.slots):
            raise SpecliError(f"{len(requests)} requests for {len(self.slots)} slots")
        slots = [self.acquire(r["prompt"]) for r in requests]
        out: list[Response | None] = [None] * len(requests)
        errors: list[BaseException] = []

        def one(i: int) -> None:
            try:
                resp = self.generate(slots[i], **requests[i])
                resp.chunks = list(resp)
                out[i] = resp
            except BaseException as e:  # noqa: BLE001 - re-raised on the calling thread
                errors.append(e)
            finally:
                self.batcher.leave()
                self.release(slots[i])

        for _ in requests:
            self.batcher.join()
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return out

    def stats(self) -> dict:
        out = {"slots": len(self.slots), "busy": self.busy, **self.batcher.stats()}
        if self.drafts is not None:
            out["draft"] = self.drafts.stats()  # the draft model's decodes: each pass of every slot drafting then
        return out

    def close(self) -> None:
        if self.drafts is not None:
            self.batcher.phase = None
            self.drafts.ctx.close()
            self.drafts = None
        self.thread.close()
