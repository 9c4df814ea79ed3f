"""The slots of a batch: :class:`Batch` hands a request a :class:`Slot` (its sequence of the
target's context and its drafter), plans each step's draft lengths over the busy slots, and
runs the decoding loop on the slot."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

from specli.constrain import Constraint
from specli.engine import Context, SeqContext
from specli.errors import SpecliError
from specli.hardware import calibrate
from specli.speculate import forced, registry
from specli.speculate.batch.decode import Batcher, DecodeThread
from specli.speculate.batch.drafter import BatchDrafter
from specli.speculate.batch.pricing import ALONE, LOOKUP_SHARE, MODEL_SHARE, NOTHING, allocate
from specli.speculate.drafters import ModelDrafter
from specli.speculate.loop import Response, generate
from specli.speculate.registry import DraftKind
from specli.speculate.source import Draft
from specli.speculate.verify import SamplingParams
from specli.tokens import common_prefix

PREFILL_CHUNK = 256  # the most prompt tokens one request puts in a step


@dataclass(eq=False)
class Slot:
    """One sequence of the target's context and what drafts for it; it keeps its cache (the
    prompt and answer of its last request) for the next request that shares a prefix."""

    index: int
    ctx: SeqContext
    drafter: BatchDrafter | None = None
    busy: bool = False
    used: int = 0  # when it was last taken (for the least recently used)


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
        # the session's draft model's weights, the slot's sequence of the batch's draft-model
        # context for a cache (the session's drafter never makes one of its own)
        ctx = self.batch.draft_seq(shared.model, self.slot.index)
        return ModelDrafter(shared.model, shared.cfg, shared.p_min, ctx=ctx)


class Batch:
    """``n`` slots on the session's target context (built with ``Options.parallel`` = n). A
    request :meth:`acquire`\\ s a slot, :meth:`generate`\\ s on it on its own thread as a member
    of the batch (``batcher.join()`` before its first step, ``batcher.leave()`` after its
    last), and :meth:`release`\\ s it."""

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
        self.calibration: list[float] = []
        if n > 1 and self.mode.adaptive and self.mode.kind is not DraftKind.NONE:
            # calibrated on sequence 0 before any slot holds it: a verify block, and a pass of
            # every slot with a whole block
            session.verify_costs()
            self.calibration = calibrate.batch_costs(ctx, n * (self.draft_max + 1))
            self.batcher.timed_rows = len(self.calibration)
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

    def verify_share(self, slot: Slot, t_verify: float) -> float:
        """The part of the last batch pass that ``slot``'s block took (by rows): its verify time."""
        return self.batcher.share.get(slot.index, t_verify)

    def calibrated_pass(self) -> float:
        """The session's calibrated cost of a one-token target pass."""
        return self.session.verify_costs()[0]

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
        base = self.calibration
        seen = {n: t for n, t in self.batcher.measured.items() if n <= len(base)}
        cal = sum(base[n - 1] for n in seen)
        scale = sum(seen.values()) / cal if seen and cal > 0 else 1.0
        return [c * scale for c in base]

    # -- generation ----------------------------------------------------------------------
    def generate(self, slot: Slot, prompt: Sequence[int], params: SamplingParams, max_tokens: int,
                 exact_prefill: bool = False, constraint: Constraint | None = None,
                 logprobs: int | None = None, history=True, owner: str | None = None) -> Response:
        """:func:`loop.generate` on the slot (iterate it on a member thread); ``history`` and
        ``owner``: the earlier answers lookup copies from (:meth:`Session.history`: the
        session's, shared by every slot)."""
        d = forced.under(slot.drafter, constraint)
        return generate(slot.ctx, prompt, d, params, max_tokens, self.draft_max, exact_prefill, constraint,
                        logprobs, self.session.history(history, owner))

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
