"""A slot's drafter inside a batch (:class:`BatchDrafter`): it drafts what the batch's
allocation gives it, through the capabilities its inner drafter declared."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from specli.speculate.adaptive import CATCH_UP_PRICED
from specli.speculate.batch.pricing import ALONE, MODEL_SHARE, NOTHING, Estimate
from specli.speculate.contract import CopiesContext, Drafter, ForcedByGrammar
from specli.speculate.source import FORCED, LOOKUP, Draft

SMOOTHING = 0.1  # of a draft model's measured pass time


class Planner(Protocol):
    """What a slot's drafter asks of its batch (:class:`specli.speculate.batch.pool.Batch`)."""

    def plan(self, slot, context: Sequence[int] | None, max_len: int, look: Draft | None = None,
             forced: bool = False) -> tuple[int, str]: ...

    def verify_share(self, slot, t_verify: float) -> float: ...

    def calibrated_pass(self) -> float: ...


class BatchDrafter(Drafter, CopiesContext, ForcedByGrammar):
    """A slot's drafter inside a batch: drafts what the batch's allocation gives it
    (:meth:`Batch.plan`): prompt lookup's copy at that length, or its draft model up to that
    length (while the model is confident) when the allocation finds that its passes (their
    whole wall time, which every member of the batch waits out) pay. Alone in the batch, its
    own controller decides as served alone. The slots' draft models are one context's
    sequences: the slots drafting at once run each pass as one decode (:class:`Batcher`
    again). It tells its controller the part of each batch pass its block took, not the whole
    pass, and times its draft model's passes itself.

    What it prices is its inner drafter's :class:`~specli.speculate.contract.Batchable` policy
    (``policy``; None: fixed lengths, it drafts the batch's length as the inner drafter does);
    under a grammar it sizes forced tokens by the batch's share and passes copies and forced
    tokens on to the inner drafter's capabilities, where it has them."""

    def __init__(self, inner: Drafter, batch: Planner, slot):
        self.inner, self.batch, self.slot = inner, batch, slot
        self.name = inner.name
        caps = inner.caps
        self.policy = caps.batch
        self._copies, self._forced = caps.copies, caps.forced
        self.adaptive = self.policy is not None
        self.model = self.policy.model if self.policy is not None else None  # the draft model, if any
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

    def recall(self, history) -> None:
        self.inner.recall(history)

    # -- prices --------------------------------------------------------------------------
    def lookup_estimate(self, look: Draft | None, max_len: int) -> Estimate:
        """Lookup's proposal this step, free to draft, at the acceptance its match's bucket has
        earned, as far as a copy from such a match is trusted (:meth:`AdaptiveDrafter.trusted`)."""
        if look is None or not look.tokens:
            return NOTHING
        a = self.policy.ctl.acceptance(look.source)
        return Estimate(a.cautious_first(), a.alpha_rest, 0.0, min(max_len, self.policy.trusted(look)))

    def forced_estimate(self, max_len: int) -> Estimate:
        """Tokens a grammar forces: free, at the acceptance forced drafts have earned."""
        a = self.policy.ctl.acceptance(FORCED)
        return Estimate(a.alpha_first, a.alpha_rest, 0.0, max_len)

    def model_estimate(self, context: Sequence[int], cap: int, passes: list[float]) -> Estimate | None:
        """Its next draft from the draft model (None: it has none): each pass at its measured
        wall time, the first one the catch-up over all the model's cache lacks (the prompt
        too, before its first draft: no outlay spread over drafts to come, the whole batch
        waits it out now), priced on the batch's pass curve ``passes``."""
        if self.model is None:
            return None
        ctl, src = self.policy.ctl, self.policy.msource
        a = ctl.acceptance(src)
        dt = self.pass_time
        if dt is None:  # calibrated with the verify curve, at the batch's measured speed since
            cal = self.batch.calibrated_pass()
            dt = ctl.cost.draft_calibrated * (passes[0] / cal if cal > 0 else 1.0)
        # its first token's acceptance as lookup's is judged: lowered by its estimate's spread
        return Estimate(a.cautious_first(), a.alpha_rest, dt, cap, max(1, self.model.behind(context)))

    # -- a step --------------------------------------------------------------------------
    def propose(self, context: Sequence[int], max_len: int) -> Draft:
        if not self.adaptive:
            return self.inner.propose(context, self.batch.plan(self.slot, context, max_len)[0])
        look = self.policy.lookup_proposal(context, max_len)  # scored against the target's tokens, drafted or not
        k, who = self.batch.plan(self.slot, context, max_len, look)
        if who == ALONE:
            return self.policy.propose(context, k, look)
        if who == MODEL_SHARE:  # the draft model's tokens up to k, while it is confident enough
            return self.model.propose(context, k)
        if k == 0:
            return Draft([])
        return Draft(look.tokens[:k], look.source, look.confidence[:k])

    def _verify_time(self, t_verify: float) -> float:
        return self.batch.verify_share(self.slot, t_verify)

    def observe(self, draft: Draft, n_accepted: int, emitted: list[int], t_draft: float, t_verify: float) -> None:
        if self.model is not None and draft.source == self.policy.msource and draft.caught_up <= CATCH_UP_PRICED:
            per = t_draft / (draft.passes + 1)  # its passes' wall time, Python's share included
            self.pass_time = per if self.pass_time is None else self.pass_time + SMOOTHING * (per - self.pass_time)
        self.inner.observe(draft, n_accepted, emitted, t_draft, self._verify_time(t_verify))

    def observe_forced(self, draft, n_forced, n_accepted, emitted, t_draft, t_verify) -> None:
        if self._forced is not None:
            self._forced.observe_forced(draft, n_forced, n_accepted, emitted, t_draft, self._verify_time(t_verify))

    def room(self, max_len: int) -> int:
        return self.batch.plan(self.slot, None, max_len, forced=True)[0]

    def forced(self, tokens, max_len: int) -> int:
        return self._forced.forced(tokens, max_len) if self._forced is not None else len(tokens)

    def continuation(self, context, head, max_len, min_match) -> Draft:
        if self._copies is None:
            return Draft([], LOOKUP)
        return self._copies.continuation(context, head, max_len, min_match)

    def repair(self) -> None:
        self.inner.repair()

    def plain_rate(self) -> float | None:
        return self.inner.plain_rate()
