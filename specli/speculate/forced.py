"""Drafting under a constraint: the tokens a grammar forces (keys, punctuation, the end of a
structure) are drafted for free, and a draft runs on through them (:class:`ForcedDrafter`).
The grammar itself is :mod:`specli.constrain`'s :class:`~specli.constrain.Guide`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from specli.constrain import Constraint, Guide
from specli.speculate.contract import Drafter
from specli.speculate.source import FORCED, Draft


class ForcedDrafter(Drafter):
    """Drafts the tokens the grammar forces next for free; with nothing forced, the ``inner``
    drafter proposes as usual, stopping where the grammar forces the next token. Either way the
    draft then runs on (:meth:`Guide.extend`): the tokens the grammar forces after it; after
    forced tokens, the copy of an inner drafter that copies from the context
    (:class:`~specli.speculate.contract.CopiesContext`) where they and the ``continue_min``
    tokens before them run into text the context holds; what the grammar forces after that,
    and so on. Forced text can be tokenised more than one way and the target may choose
    another way, so forced tokens are drafts to verify like any other. An inner drafter
    forced by a grammar (:class:`~specli.speculate.contract.ForcedByGrammar`) sizes them (its
    room, how many pay) and learns their acceptance (``FORCED``); any other drafts them all.
    Without a constraint it is the inner drafter."""

    drafts_forced = True

    def __init__(self, inner: Drafter, continue_min: int = 4):
        self.inner = inner
        caps = inner.caps
        self.copies, self.priced = caps.copies, caps.forced
        self.name = "forced" if inner.name == "none" else f"{inner.name}+forced"
        self.guide: Guide | None = None
        self.continue_min = continue_min
        self._ours = False

    def begin(self, prompt: Sequence[int], max_tokens: int | None) -> None:
        self.inner.begin(prompt, max_tokens)

    def constrain(self, guide: Guide | None) -> None:
        self.guide = guide
        if guide is not None:
            guide.chained = True
        self.inner.constrain(guide)

    def sampling(self, sampler) -> None:
        self.inner.sampling(sampler)

    def recall(self, history) -> None:
        self.inner.recall(history)

    def _forced(self, g: Guide, max_len: int) -> list[int]:
        """The forced tokens worth drafting now (as the inner drafter prices them)."""
        forced = g.forced(max_len)
        if forced and self.priced is not None:
            forced = forced[:self.priced.forced(forced, max_len)]
        return forced

    def _copy(self, context: Sequence[int], head: list[int], n: int, forced: int) -> list[int]:
        # the forced tokens match wherever the structure recurs (the last item's keys): a copy
        # must match text before them too, as when the answer edits JSON it was given
        if self.copies is None:
            return []
        return self.copies.continuation(context, head, n, forced + self.continue_min).tokens

    def propose(self, context: Sequence[int], max_len: int) -> Draft:
        self._ours = False
        g = self.guide
        if g is None:
            return self.inner.propose(context, max_len)
        if self.priced is not None:
            max_len = self.priced.room(max_len)
        forced = self._forced(g, max_len)
        if forced:
            self._ours = True
            d = Draft(forced, FORCED, [1.0] * len(forced))
        else:
            d = self.inner.propose(context, max_len)
            toks = g.clip(d.tokens[:max_len])
            if len(toks) < len(d.tokens):
                d = replace(d, tokens=toks, confidence=d.confidence[:len(toks)])
            if not toks:
                return d
        more = g.extend(d.tokens, max_len - len(d.tokens), lambda head, n, f: self._copy(context, head, n, f),
                        forced=len(d.tokens) if self._ours else 0)
        return replace(d, tokens=d.tokens + more) if more else d

    def observe(self, draft: Draft, n_accepted: int, emitted: list[int], t_draft: float, t_verify: float) -> None:
        if not self._ours:
            self.inner.observe(draft, n_accepted, emitted, t_draft, t_verify)
        elif self.priced is not None:
            self.priced.observe_forced(draft, len(draft.confidence), n_accepted, emitted, t_draft, t_verify)

    def repair(self) -> None:
        self.inner.repair()

    def plain_rate(self) -> float | None:
        return self.inner.plain_rate()

    def close(self) -> None:
        self.inner.close()


def under(drafter: Drafter, constraint: Constraint | None) -> Drafter:
    """The drafter an answer under ``constraint`` runs: a speculating drafter drafts the
    grammar's forced tokens too (:class:`ForcedDrafter`); plain decoding, one that does
    already, or an answer without a constraint, the drafter as it is."""
    if constraint is None or drafter.name == "none" or drafter.drafts_forced:
        return drafter
    return ForcedDrafter(drafter)
