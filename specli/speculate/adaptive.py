"""The adaptive policy: prompt lookup and/or a draft model under the cost-aware controller,
the draft model's confidence calibrated per probability bin."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from specli.speculate.contract import Batchable, CopiesContext, Drafter, ForcedByGrammar
from specli.speculate.controller import (
    Acceptance,
    Controller,
    CostModel,
    marginal_token_pays,
)
from specli.speculate.drafters import LookupDrafter, PaidDrafter, matched
from specli.speculate.settings import SpecSettings
from specli.speculate.source import FORCED, LOOKUP, MODEL, Draft, Source
from specli.tokens import common_prefix

CONFIDENCE_BINS = (0.3, 0.5, 0.7, 0.85, 0.95, 1.01)
# a draft model's step teaches what a drafted token costs when its catch-up was this short
# (the target's token, the last drafted one); the first step's, over the whole prompt, does not
CATCH_UP_PRICED = 2
# a model draft that runs into a copy of the context this long hands over to prompt lookup
# (shorter matches recur by chance in code: "):\n    " is no copy)
HANDOVER_MATCH = 4


def paying_run(p_all: float, k: int, n_max: int, first: float, rest: float, per: float, verify: list[float],
               rate: float) -> tuple[int, float]:
    """How many of up to ``n_max`` further tokens, after ``k`` drafted ones that all pass with
    chance ``p_all``, are worth drafting: each is kept while it pays (:func:`marginal_token_pays`)
    at acceptance ``first`` (the first of them), then ``rest``, each costing ``per`` seconds to
    draft, against the step's ``rate``; and what they net at that rate."""
    p, n, net = p_all, 0, 0.0
    while n < n_max:
        p *= first if n == 0 else rest
        if not marginal_token_pays(p, k + n, verify, per, rate):
            break
        net += p - rate * (verify[k + n + 1] - verify[k + n] + per)
        n += 1
    return n, net


def confidence_bin(p: float) -> int:
    for i, edge in enumerate(CONFIDENCE_BINS):
        if p < edge:
            return i
    return len(CONFIDENCE_BINS) - 1


class AdaptiveDrafter(Drafter, CopiesContext, ForcedByGrammar, Batchable):
    """Prompt lookup and/or a draft model under one cost-aware controller.

    The model drafter is a draft model or the target's own MTP layers (a
    :class:`~specli.speculate.drafters.PaidDrafter`: ``propose(context, max_len, keep_going)``,
    ``behind(context)`` and a ``source`` are what it uses). Each
    step it asks the controller which source and how many tokens pay best, given the measured
    verify costs and what each source's drafts have been worth so far; lookup is tried first
    (free), the draft model drafts only when it beats both lookup and plain decoding (its
    step priced with the catch-up on what the target emitted since it last drafted; its first
    catch-up, over the prompt, as an outlay spread over the drafts to come), and stops as
    soon as its next token no longer pays (before the pass that would show it, when even an
    average token would not), or when its draft runs into text the context holds (a match of
    ``HANDOVER_MATCH`` tokens) and copying on promises more than the model's own tokens:
    lookup's copy then finishes the draft for free. Lookup is scored on its whole proposal against what the target
    emitted, also on steps it did not draft or drafted only part of (shadow accounting), so it is
    picked up again as soon as the text starts to repeat, and short drafts that all pass
    still teach how far a copy goes on. A copy from an earlier answer (``--lookup-history``,
    where it matches the context's end longer than the context does) is a source of its own,
    scored the same way: the step drafts the copy, of the two, whose learned acceptance
    promises more.

    Its ``name`` is the mode's, which the registry gives it (``adaptive`` until then).
    """

    name = "adaptive"

    def __init__(self, controller: Controller, lookup: LookupDrafter | None = None,
                 model: PaidDrafter | None = None):
        # whoever loaded the model drafter closes it (a session shares one across the drafters it makes)
        if lookup is None and model is None:
            raise ValueError("an adaptive drafter needs lookup, a draft model, or both")
        self.ctl = controller
        self.lookup = lookup
        self.model = model
        self.msource: Source = model.source if model is not None else MODEL
        self.bins = [Acceptance(first=min(e, 1.0), rest=min(e, 1.0)) for e in CONFIDENCE_BINS]
        self._model_drafted = False  # has the controller chosen the model yet (probes aside)
        self._pending: list[tuple[Source, list[int]]] = []  # lookup's proposals (the context's, history's)
        self._forced_shadow: list[int] = []  # the grammar's forced tokens this step, when declined
        self._end: int | None = None  # the context length at which the answer must end
        self.last = None  # the last Decision, for tests and stats

    def begin(self, prompt: Sequence[int], max_tokens: int | None) -> None:
        self._end = None if max_tokens is None else len(prompt) + max_tokens

    def constrain(self, guide) -> None:
        self.guide = guide
        if self.model is not None:
            self.model.constrain(guide)

    def sampling(self, sampler) -> None:
        self.sampler = sampler
        if self.model is not None:
            self.model.sampling(sampler)

    def recall(self, history) -> None:
        if self.lookup is not None:
            self.lookup.recall(history)

    def lookup_proposal(self, context: Sequence[int], max_len: int) -> Draft:
        """Prompt lookup's proposal for this step (none without lookup): its copy from the
        context, or from an earlier answer that matches longer, whichever promises more at
        the acceptance its source has earned. Drafted or not, both are scored against the
        tokens the target emits (:meth:`observe`)."""
        if self.lookup is None:
            self._pending = []
            return Draft([])
        d = self.lookup.copy(context, max_len)
        h = self.lookup.recalled(context, max_len, matched(d))
        self._pending = [(x.source, x.tokens) for x in (d, h) if x.tokens]
        if h.tokens and (not d.tokens or self.ctl.worth(h.source, self.trusted(h), max_len)
                         > self.ctl.worth(d.source, self.trusted(d), max_len)):
            return h
        return d

    @staticmethod
    def trusted(look: Draft) -> int:
        """How much of a lookup draft is worth pricing: a copy is trusted about as far again as
        it has matched (a 2-token match that happens to recur cannot buy a 16-token block, a
        copy in sync can)."""
        return min(len(look.tokens), 2 * int(look.confidence[0])) if look.tokens else 0

    def propose(self, context: Sequence[int], max_len: int, look: Draft | None = None) -> Draft:
        """``look``: lookup's proposal for this context, when the caller made it already
        (:meth:`lookup_proposal`; a batch slot prices it first), at least ``max_len`` long."""
        cands: dict[Source, int] = {}
        d = self.lookup_proposal(context, max_len) if look is None else \
            replace(look, tokens=look.tokens[:max_len], confidence=look.confidence[:max_len])
        look, look_key = d.tokens, d.source
        if look:
            cands[look_key] = self.trusted(d)
        behind = lacks = 1
        if self.model is not None:
            cands[self.msource] = min(max_len, self.model.max_len or max_len)
            # a draft model first catches up on what its cache lacks: what the target emitted
            # since it last drafted; before its first draft, the prompt, which the controller
            # prices as an outlay for the drafts to come (``probe_behind``)
            lacks = self.model.behind(context)
            behind = lacks if self._model_drafted else 1
        left = None if self._end is None else self._end - len(context)
        dec = self.ctl.decide(cands, k_cap=max_len, behind=behind, probe_behind=lacks, left=left)
        self.last = dec
        if dec.k and dec.source == self.msource:
            self._model_drafted = True
        if dec.k == 0:
            return Draft([])
        if dec.source.copy:
            return Draft(look[:dec.k], dec.source, d.confidence[:dec.k])
        if dec.probe:
            return self.model.propose(context, dec.k, p_min=0.0)
        return self._model_draft(context, max_len, dec.rate)

    def _model_draft(self, context: Sequence[int], max_len: int, rate: float) -> Draft:
        """The draft model's draft, token by token while the next one pays at the step's
        ``rate``, handing over to lookup's copy where it runs into text the context holds."""
        ctl = self.ctl
        dt = ctl.draft_costs(self.msource)[0]  # a further token's drafting cost (DFlash: none, its pass is paid)
        p_all = 1.0
        copy: list[int] = []

        def keep_going(i: int, p_top: float | None, toks: list[int]) -> bool:
            nonlocal p_all, copy
            if p_top is None:  # i tokens drafted; look at the next (a pass) only if an average one would pay
                if self.lookup is not None:  # ran into text the context holds: copy the rest
                    found = self.lookup.continuation(context, toks, max_len - i, HANDOVER_MATCH)
                    if found.tokens:
                        copy = self._copy_that_pays(found, i, p_all, rate, max_len - i)
                        if copy:
                            return False
                p_next = p_all * ctl.acceptance(self.msource).alpha_rest
                return marginal_token_pays(p_next, i, ctl.cost.verify, dt, rate)
            p_all *= self.bins[confidence_bin(p_top)].alpha
            return i == 0 or marginal_token_pays(p_all, i, ctl.cost.verify, dt, rate)

        d = self.model.propose(context, max_len, keep_going, p_min=0.0)
        if copy and len(d.tokens) < max_len:
            d = replace(d, tokens=d.tokens + copy[:max_len - len(d.tokens)])
        return d

    def _copy_that_pays(self, copy: Draft, k: int, p_all: float, rate: float, room: int) -> list[int]:
        """The part of a hand-over copy worth verifying after k model tokens whose chance of all
        passing is ``p_all``, or nothing when the model's own tokens promise more. Either way
        each further token is kept while it pays (:func:`marginal_token_pays`), at the
        acceptance copies from a match like it have earned (free to draft) or the draft
        model's (a pass a token); the copy is taken when it nets more at the step's rate."""
        ctl = self.ctl
        look, mod = ctl.acceptance(copy.source), ctl.acceptance(self.msource)
        v = ctl.cost.verify
        n, net = paying_run(p_all, k, len(copy.tokens), look.alpha_first, look.alpha_rest, 0.0, v, rate)
        if n and net >= paying_run(p_all, k, room, mod.alpha_rest, mod.alpha_rest, ctl.draft_costs(self.msource)[0],
                                   v, rate)[1]:
            return copy.tokens[:n]
        return []

    def repair(self) -> None:
        if self.model is not None:
            self.model.repair()

    def plain_rate(self) -> float | None:
        """The controller's measured cost of a one-token pass, as tokens/s."""
        v0 = self.ctl.cost.verify[0]
        return 1.0 / v0 if v0 > 0 else None

    def room(self, max_len: int) -> int:
        return max_len

    def forced(self, tokens: Sequence[int], max_len: int) -> int:
        k = self.ctl.decide({FORCED: len(tokens)}, k_cap=max_len).k
        # declined: scored against what the target emits all the same (as lookup's proposals are),
        # so forced tokens the prior undervalues are not declined for ever unseen
        self._forced_shadow = list(tokens) if k == 0 else []
        return k

    def continuation(self, context: Sequence[int], head: Sequence[int], max_len: int, min_match: int) -> Draft:
        """Lookup's copy after ``head`` (this step's draft so far, forced tokens), priced as
        lookup's own drafts are: each token while it pays at the acceptance its match's bucket
        has earned, at its place in the block, against the rate the block promises so far."""
        if self.lookup is None:
            return Draft([], LOOKUP)
        found = self.lookup.continuation(context, head, max_len, min_match)
        if not found.tokens:
            return found
        a, v = self.ctl.acceptance(found.source), self.ctl.cost.verify
        k = len(head)
        n, _ = paying_run(1.0, k, len(found.tokens), a.cautious_first(), a.alpha_rest, 0.0, v,
                          (k + 1) / v[min(k, len(v) - 1)])
        return replace(found, tokens=found.tokens[:n], confidence=found.confidence[:n])

    def observe_forced(self, draft: Draft, n_forced: int, n_accepted: int, emitted: list[int],
                       t_draft: float, t_verify: float) -> None:
        ctl = self.ctl
        self._forced_shadow = []
        ctl.cost.observe_verify(len(draft.tokens), t_verify)
        ctl.observe_step(len(emitted), t_draft + t_verify)
        ctl.observe(FORCED, n_forced, min(n_accepted, n_forced))

    def observe(self, draft: Draft, n_accepted: int, emitted: list[int], t_draft: float, t_verify: float) -> None:
        ctl = self.ctl
        k = len(draft.tokens)
        ctl.cost.observe_verify(k, t_verify)
        ctl.observe_step(len(emitted), t_draft + t_verify)
        if draft.source == self.msource:
            own = len(draft.confidence)  # the model's own tokens; a copy may follow them
            if draft.caught_up <= CATCH_UP_PRICED:  # a long catch-up (the prompt) says nothing of a draft's cost
                ctl.cost.observe_draft(draft.passes + 1,
                                       t_draft - ctl.cost.draft_token * (ctl.batch_ratio(draft.caught_up) - 1.0))
            for i, c in enumerate(draft.confidence[: n_accepted + 1]):
                self.bins[confidence_bin(c)].observe(1, 1 if i < n_accepted else 0)
            if own:
                ctl.observe(self.msource, own, min(n_accepted, own))
        # lookup is scored on its whole proposals, drafted or not; forced tokens when declined
        shadow = [(FORCED, self._forced_shadow)] if self._forced_shadow else []
        for key, look in self._pending + shadow:
            agree = common_prefix(look, emitted)
            ctl.observe(key, min(len(look), agree + 1, len(emitted)), agree)
        self._pending, self._forced_shadow = [], []


def lookup_drafter(s: SpecSettings) -> LookupDrafter:
    """Prompt lookup as the settings ask for it."""
    return LookupDrafter(*s.lookup_ngram, min_match=s.lookup_min_match)


def adaptive_drafter(s: SpecSettings, verify: list[float], draft_token: float, lookup: LookupDrafter | None,
                     model: PaidDrafter | None = None) -> AdaptiveDrafter:
    """specli's adaptive policy as every command builds it (:mod:`specli.speculate.registry`)
    and as the replay benchmark replays it: the controller over the measured verify curve and the
    drafter's cost per token."""
    return AdaptiveDrafter(Controller(CostModel(list(verify), draft_token), k_max=s.draft_max), lookup, model)
