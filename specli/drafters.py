"""Drafters propose the next few tokens; the target verifies them. One small interface:

``propose(context, max_len)`` returns a :class:`Draft` for the tokens after ``context`` (every
token so far, prompt and output); ``name`` says which kind of drafter made it. A drafter keeps
its own state (a KV cache, an n-gram index) apart from the verify loop and brings it in line
with the context it is handed, so the loop never has to tell it what was accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np

from .controller import Acceptance, Controller, lookup_key, marginal_token_pays
from .engine import Context, ContextConfig, Model
from .lookup import NgramIndex, Substitutions


@dataclass
class Draft:
    tokens: list[int]
    source: str  # "model", "lookup" or "none"
    # per drafted token: the drafter's confidence (draft model: its top probability;
    # lookup: the matched n-gram length), for the adaptive controller and the stats
    confidence: list[float] = field(default_factory=list)
    q: np.ndarray | None = None  # (k, V) draft probabilities; None: a point mass per token


class Drafter(Protocol):
    name: str

    def propose(self, context: Sequence[int], max_len: int) -> Draft: ...

    def close(self) -> None: ...

    # optional: ``observe(draft, n_accepted, emitted, t_draft, t_verify)`` after each step


class NoDrafter:
    """Plain decoding through the same loop: the baseline."""

    name = "none"

    def propose(self, context: Sequence[int], max_len: int) -> Draft:
        return Draft([], "none")

    def close(self) -> None:
        pass


class LookupDrafter:
    """Prompt lookup: copy what followed the latest earlier occurrence of the context's last
    n tokens, longest n first, with the token substitutions the answer has been making to what
    it copies (``substitute``). A draft's confidence is the match length, followed back up to
    ``MATCH_CAP`` tokens."""

    name = "lookup"
    MATCH_CAP = 32

    def __init__(self, n_min: int = 1, n_max: int = 8, min_match: int = 2, substitute: bool = True):
        self.index = NgramIndex(n_min, n_max)
        self.min_match = min_match
        self.subs = Substitutions() if substitute else None

    def propose(self, context: Sequence[int], max_len: int) -> Draft:
        idx = self.index
        if len(idx.tokens) > len(context) or idx.tokens != list(context[:len(idx.tokens)]):
            idx.truncate(0)
            if self.subs:
                self.subs.reset()
        if self.subs:
            self.subs.learn(context)
        idx.extend(context[len(idx.tokens):])
        toks, n = idx.find(max_len, self.MATCH_CAP)
        if n < self.min_match and self.subs and self.subs.map:  # a copy that substituted goes on
            toks, n = idx.find(max_len, self.MATCH_CAP, self.subs.undo(context[-self.MATCH_CAP:]))
        if n < self.min_match or max_len <= 0:
            return Draft([], "lookup")
        if self.subs:
            toks = self.subs.apply(len(context), toks)
        return Draft(toks, "lookup", [float(n)] * len(toks))

    def close(self) -> None:
        pass


class ModelDrafter:
    """A smaller model with the same tokenizer drafts greedily, stopping early when its top
    probability falls below ``p_min`` (it is then unlikely to be accepted)."""

    name = "model"

    def __init__(self, model: Model, cfg: ContextConfig, p_min: float = 0.5):
        self.model = model
        self.ctx = Context(model, cfg)
        self.p_min = p_min

    def propose(self, context: Sequence[int], max_len: int,
                keep_going: Callable[[int, float], bool] | None = None, p_min: float | None = None) -> Draft:
        """Draft up to ``max_len`` tokens greedily. Before adding token i (0-based) with top
        probability p, stop if p < p_min (this call's, else the drafter's) or ``keep_going(i, p)``
        says it no longer pays."""
        p_min = self.p_min if p_min is None else p_min
        if max_len <= 0:
            return Draft([], "model")
        ctx = self.ctx
        if len(context) + max_len > ctx.n_ctx:
            max_len = ctx.n_ctx - len(context)
            if max_len <= 0:
                return Draft([], "model")
        kept = ctx.sync(context)
        row = ctx.eval(list(context[kept:]))[0]
        toks: list[int] = []
        conf: list[float] = []
        while True:
            tok = int(row.argmax())
            z = row - row[tok]
            p_top = 1.0 / float(np.exp(z, dtype=np.float32).sum())
            if toks and p_top < p_min:
                break
            if keep_going is not None and not keep_going(len(toks), p_top):
                break
            toks.append(tok)
            conf.append(p_top)
            if len(toks) >= max_len or self.model.is_eog(tok):
                break
            row = ctx.eval([tok])[0]
        return Draft(toks, "model", conf)

    def close(self) -> None:
        self.ctx.close()


CONFIDENCE_BINS = (0.3, 0.5, 0.7, 0.85, 0.95, 1.01)


def confidence_bin(p: float) -> int:
    for i, edge in enumerate(CONFIDENCE_BINS):
        if p < edge:
            return i
    return len(CONFIDENCE_BINS) - 1


class AdaptiveDrafter:
    """Prompt lookup and/or a draft model under one cost-aware controller.

    Each step it asks the controller which source and how many tokens pay best, given the
    measured verify costs and what each source's drafts have been worth so far; lookup is
    tried first (free), the draft model drafts only when it beats both lookup and plain
    decoding, and stops as soon as its next token no longer pays. Lookup is scored on its
    whole proposal against what the target emitted, also on steps it did not draft or drafted
    only part of (shadow accounting), so it is picked up again as soon as the text starts to
    repeat, and short drafts that all pass still teach how far a copy goes on.
    """

    def __init__(self, controller: Controller, lookup: LookupDrafter | None = None,
                 model: ModelDrafter | None = None):
        if lookup is None and model is None:
            raise ValueError("an adaptive drafter needs lookup, a draft model, or both")
        self.ctl = controller
        self.lookup = lookup
        self.model = model
        self.name = "hybrid" if lookup and model else ("lookup" if lookup else "model")
        self.bins = [Acceptance(first=min(e, 1.0), rest=min(e, 1.0)) for e in CONFIDENCE_BINS]
        self._pending: tuple[str, list[int]] | None = None  # lookup proposal not drafted
        self.last = None  # the last Decision, for tests and stats

    def propose(self, context: Sequence[int], max_len: int) -> Draft:
        cands: dict[str, int] = {}
        look: list[int] = []
        look_key = ""
        if self.lookup is not None:
            d = self.lookup.propose(context, max_len)
            if d.tokens:
                look = d.tokens
                match = int(d.confidence[0])
                look_key = lookup_key(match)
                # a copy is trusted about as far again as it has matched: a 2-token match that
                # happens to recur cannot buy a 16-token block, a copy in sync can
                cands[look_key] = min(len(look), 2 * match)
        if self.model is not None:
            cands["model"] = max_len
        dec = self.ctl.decide(cands, k_cap=max_len)
        self.last = dec
        self._pending = (look_key, look) if look else None
        if dec.k == 0:
            return Draft([], "none")
        if dec.source.startswith("lookup"):
            return Draft(look[:dec.k], dec.source, d.confidence[:dec.k])
        if dec.probe:
            return self.model.propose(context, dec.k)
        ctl = self.ctl
        p_all = 1.0

        def keep_going(i: int, p_top: float) -> bool:
            nonlocal p_all
            p_all *= self.bins[confidence_bin(p_top)].alpha
            return i == 0 or marginal_token_pays(p_all, i, ctl.cost.verify, ctl.cost.draft_token, dec.rate)

        return self.model.propose(context, max_len, keep_going)

    def observe(self, draft: Draft, n_accepted: int, emitted: list[int], t_draft: float, t_verify: float) -> None:
        ctl = self.ctl
        k = len(draft.tokens)
        ctl.cost.observe_verify(k, t_verify)
        if draft.source == "model":
            ctl.cost.observe_draft(k + 1, t_draft)
            for i, c in enumerate(draft.confidence[: n_accepted + 1]):
                self.bins[confidence_bin(c)].observe(1, 1 if i < n_accepted else 0)
            if k:
                ctl.observe("model", k, n_accepted)
        if self._pending:  # lookup is scored on its whole proposal, drafted or not
            key, look = self._pending
            agree = 0
            for a, b in zip(look, emitted):
                if a != b:
                    break
                agree += 1
            ctl.observe(key, min(len(look), agree + 1, len(emitted)), agree)
            self._pending = None

    def close(self) -> None:
        if self.model is not None:
            self.model.close()
