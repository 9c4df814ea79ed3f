"""The drafter contract, declared once.

:class:`Drafter` is what the verify loop (:func:`specli.speculate.loop.generate`) drives: before
an answer ``begin`` (its prompt and token cap), ``constrain`` (its grammar state, or None),
``sampling`` (its sampler) and ``recall`` (the earlier answers lookup may copy from, or None);
each step ``propose(context, max_len) -> Draft`` (always a
:class:`~specli.speculate.source.Draft`) and ``observe`` (what the target kept); ``repair``
after an interrupted answer, ``close`` at the end. ``plain_rate`` says what plain decoding
measured, for a drafter that measures it.

What a drafter may do beyond that is a capability, declared as a protocol of its own and named
where it is used:

- :class:`PricedPerPass`: pays a forward pass per drafted token (a draft model, MTP layers, a
  head); the adaptive policy drives and prices it (:mod:`specli.speculate.adaptive`).
- :class:`FedByDecodes`: hears the target's decodes (MTP layers and heads,
  :mod:`specli.speculate.mtp`).
- :class:`CopiesContext`: copies on from the context after a head (prompt lookup); the
  constrained drafter runs a draft on through such copies (:mod:`specli.speculate.forced`).
- :class:`ForcedByGrammar`: sizes and learns the tokens a grammar forces
  (:mod:`specli.speculate.forced`).
- :class:`Batchable`: its policy can be priced per slot of a batch
  (:mod:`specli.speculate.batch`).

:func:`capabilities` is the one place that asks which of them a drafter has; the registry
calls it once when it builds a drafter (:func:`specli.speculate.registry.build`) and keeps the
answer in the drafter's ``caps``. Use sites read ``caps``; none asks the drafter itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol, runtime_checkable

from specli.speculate.source import Draft, Source

KeepGoing = Callable[[int, "float | None", list[int]], bool]


class Drafter(Protocol):
    """The contract every drafter follows. ``begin``, ``observe``, ``repair`` and ``close`` do
    nothing by default; ``constrain`` and ``sampling`` keep what they are handed in ``guide``
    and ``sampler``. ``name``: the mode it drafts in, as stats and reports say it (the registry
    names what it builds). ``drafts_forced``: it drafts a grammar's forced tokens itself
    (:class:`specli.speculate.forced.ForcedDrafter`)."""

    name: str = "none"
    guide: Any = None  # the answer's constraint state, when it has one (see constrain)
    sampler: Any = None  # the answer's Sampler (see sampling)
    drafts_forced: bool = False

    def begin(self, prompt: Sequence[int], max_tokens: int | None) -> None:
        """Before an answer: its prompt and the most tokens it may take (None: no cap)."""

    def constrain(self, guide) -> None:
        """Before an answer: its constraint's grammar state (a :class:`specli.constrain.Guide`,
        or None). The loop clips every draft to what the grammar allows; a model drafter
        drafts under the grammar too, so its drafts are not cut."""
        self.guide = guide

    def sampling(self, sampler) -> None:
        """Before an answer: its :class:`specli.speculate.verify.Sampler`. A model drafter
        drafts with its noise, so its tokens are the target's own samples wherever the two
        models agree."""
        self.sampler = sampler

    def recall(self, history) -> None:
        """Before an answer: the earlier answers prompt lookup may copy from (a
        :class:`specli.speculate.history.History`), or None. A drafter that does not copy
        ignores them; one that wraps another hands them on."""

    def propose(self, context: Sequence[int], max_len: int) -> Draft:
        """Up to ``max_len`` tokens to follow ``context`` (every token so far)."""
        raise NotImplementedError

    def observe(self, draft: Draft, n_accepted: int, emitted: list[int], t_draft: float, t_verify: float) -> None:
        """After each step: the draft, how many of its tokens the target kept, the tokens the
        step emitted (kept + the target's own), and the seconds drafting and verifying took."""

    def repair(self) -> None:
        """After an answer interrupted mid-step: drop cache entries the drafter's own contexts
        do not account for (:meth:`specli.engine.Context.repair`)."""

    def plain_rate(self) -> float | None:
        """Tokens/s of a plain target step as this drafter has measured it; None for a drafter
        that measures nothing."""
        return None

    def close(self) -> None:
        """Free what the drafter holds."""

    @cached_property
    def caps(self) -> Capabilities:
        """What it can do beyond the contract, asked once (:func:`capabilities`; the registry
        sets it when it builds the drafter)."""
        return capabilities(self)


@runtime_checkable
class PricedPerPass(Protocol):
    """Pays a forward pass for every token it drafts. The adaptive policy drives it token by
    token (``keep_going``), prices its catch-up (``behind``) and its tokens (``token_cost``),
    and learns its acceptance under ``source``; ``max_len``: the most tokens one draft can hold
    (a DFlash head's block), None for any."""

    source: Source
    max_len: int | None

    def propose(self, context: Sequence[int], max_len: int, keep_going: KeepGoing | None = None,
                p_min: float | None = None) -> Draft:
        """Draft up to ``max_len`` tokens greedily. Before adding token i (0-based) with top
        probability p, stop if p < p_min (this call's, else the drafter's) or
        ``keep_going(i, p, tokens)`` says it no longer pays; before the pass that would show
        token i, stop if ``keep_going(i, None, tokens)`` says even looking does not pay."""
        ...

    def behind(self, context: Sequence[int]) -> int:
        """The tokens of ``context`` it has not seen yet: what its next draft first evaluates."""
        ...

    def token_cost(self) -> float:
        """Seconds per drafted token on this machine (measured once, then cached)."""
        ...


@runtime_checkable
class FedByDecodes(Protocol):
    """Hears every decode of the target (:class:`specli.engine.DecodeListener`): its own
    context is fed the target's hidden rows."""

    def decoded(self, ctx, tokens: Sequence[int], pos0: int) -> None: ...

    def truncated(self, ctx, n_keep: int) -> None: ...


@runtime_checkable
class CopiesContext(Protocol):
    """Copies on from the context (prompt lookup)."""

    def continuation(self, context: Sequence[int], head: Sequence[int], max_len: int, min_match: int) -> Draft:
        """Up to ``max_len`` tokens that copy on from the context after ``context + head``,
        from a match of at least ``min_match`` tokens: a draft (empty without one)."""
        ...


@runtime_checkable
class ForcedByGrammar(Protocol):
    """Sizes and learns the tokens a constraint's grammar forces."""

    def room(self, max_len: int) -> int:
        """The most tokens this step's draft may hold, forced tokens too (a batch slot: its share)."""
        ...

    def forced(self, tokens: Sequence[int], max_len: int) -> int:
        """How many of the ``tokens`` the grammar forces next are worth drafting in a block of
        at most ``max_len`` (those declined are still scored against what the target emits)."""
        ...

    def observe_forced(self, draft: Draft, n_forced: int, n_accepted: int, emitted: list[int],
                       t_draft: float, t_verify: float) -> None:
        """After a step that drafted ``n_forced`` forced tokens (then maybe a copy): what it
        cost, and how many of them the target kept."""
        ...


@runtime_checkable
class Batchable(Protocol):
    """A policy a batch slot prices per step (:class:`specli.speculate.batch.BatchDrafter`):
    lookup's proposal first (``lookup_proposal``, trusted as far as ``trusted`` says), the
    controller ``ctl`` with its acceptance estimates, the paid drafter ``model`` (None: none)
    whose drafts carry ``msource``, and ``propose`` with lookup's proposal made already."""

    ctl: Any
    msource: Source
    model: PricedPerPass | None

    def lookup_proposal(self, context: Sequence[int], max_len: int) -> Draft: ...

    def trusted(self, look: Draft) -> int: ...

    def propose(self, context: Sequence[int], max_len: int, look: Draft | None = None) -> Draft: ...


@dataclass(frozen=True)
class Capabilities:
    """A drafter's capabilities beyond :class:`Drafter`: each the drafter itself, or None."""

    paid: PricedPerPass | None = None
    fed: FedByDecodes | None = None
    copies: CopiesContext | None = None
    forced: ForcedByGrammar | None = None
    batch: Batchable | None = None


def capabilities(d: object) -> Capabilities:
    """Which capabilities ``d`` has: the one place that asks."""
    return Capabilities(*(d if isinstance(d, p) else None
                          for p in (PricedPerPass, FedByDecodes, CopiesContext, ForcedByGrammar, Batchable)))
