"""Drafters propose the next few tokens; the target verifies them. One small contract,
:class:`Drafter`: ``propose(context, max_len)`` returns a :class:`Draft` for the tokens after
``context`` (every token so far, prompt and output); ``observe`` hears what the target kept;
``close`` frees what the drafter holds. A drafter keeps its own state (a KV cache, an n-gram
index) apart from the verify loop and brings it in line with the context it is handed.

The contract and the capabilities beyond it are declared in :mod:`specli.speculate.contract`.
Drafters that pay a forward pass per drafted token (a draft model, the target's MTP layers)
derive from :class:`PaidDrafter` (:class:`~specli.speculate.contract.PricedPerPass`): the
adaptive policy drives and prices them through it.
Adding a drafter means a class here (or beside it) and its entry in
:mod:`specli.speculate.registry`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from specli.engine import Context, ContextConfig, Model
from specli.hardware import calibrate
from specli.speculate.contract import Drafter, KeepGoing, PricedPerPass
from specli.speculate.lookup import NgramIndex, Substitutions
from specli.speculate.settings import DEFAULTS
from specli.speculate.source import LOOKUP, MODEL, RESYNC, Draft, Source, history_key, lookup_key
from specli.tokens import common_prefix


class PaidDrafter(Drafter, PricedPerPass):
    """A drafter that pays a forward pass for every token it drafts: a draft model, or the
    target's own MTP layers or a head (:class:`~specli.speculate.contract.PricedPerPass`)."""

    source: Source = MODEL
    max_len: int | None = None  # the most tokens one draft can hold (a DFlash head's block); None: any

    def propose(self, context: Sequence[int], max_len: int, keep_going: KeepGoing | None = None,
                p_min: float | None = None) -> Draft:
        raise NotImplementedError

    def behind(self, context: Sequence[int]) -> int:
        raise NotImplementedError

    def token_cost(self) -> float:
        raise NotImplementedError


def row_top(row: np.ndarray) -> tuple[int, float]:
    """A logits row's argmax and its probability."""
    tok = int(row.argmax())
    return tok, 1.0 / float(np.exp(row - row[tok], dtype=np.float32).sum())


def draft_top(sampler, pos: int) -> Callable[[np.ndarray], tuple[int, float]]:
    """The ``top`` of :func:`greedy_drafts` for a draft whose first token is at position
    ``pos``: without sampling, :func:`row_top`; when sampling, the token the ``sampler``'s noise
    picks at each position in turn from the drafter's own distribution (the same temperature,
    top-k and top-p), with the row's top probability as its confidence. The target keeps a
    drafted token when its own pick with that noise is the same token, which it is wherever
    the two distributions agree (a greedy draft would be kept with the target's probability of
    that token, however close the two models are)."""
    if sampler is None or sampler.params.greedy:
        return row_top
    at = pos

    def top(row: np.ndarray) -> tuple[int, float]:
        nonlocal at
        at += 1
        return sampler.pick(row, at - 1), row_top(row)[1]
    return top


def greedy_drafts(first_row, step: Callable[[int], object], max_len: int, is_eog: Callable[[int], bool],
                  p_min: float, keep_going: Callable[[int, float, list[int]], bool] | None = None,
                  top: Callable[[object], tuple[int, float]] = row_top,
                  guide=None) -> tuple[list[int], list[float], int]:
    """A model's greedy draft: from the logits ``first_row``, take the argmax, feed it with
    ``step(token) -> next row``, and so on. Before adding token i (0-based) with top probability
    p, stop if p < p_min (never before the first) or ``keep_going(i, p, tokens so far)`` says
    it no longer pays; before the pass that would show token i (i > 0), stop if
    ``keep_going(i, None, tokens so far)`` says even looking does not pay. Returns the tokens
    and their top probabilities, and the passes made (``step`` calls). ``top`` reads a row's
    argmax and its probability (the replay hands recorded (token, p) pairs instead of logits).
    Under a constraint's ``guide``, each row is masked by the grammar after the tokens drafted
    so far (the draft model's own constrained greedy choice), and the grammar is left as it was."""
    if guide is not None:
        kg = keep_going
        if guide.chained:
            def kg(i: int, p: float | None, toks: list[int]) -> bool:
                # no pass for a token the grammar forces: the draft runs on through it for free
                if p is None and toks and guide.forces_after(toks[-1]):
                    return False
                return keep_going is None or keep_going(i, p, toks)
        return guide.drafting(lambda g_top, g_step: greedy_drafts(first_row, g_step, max_len, is_eog, p_min,
                                                                  kg, g_top), top, step)
    toks: list[int] = []
    conf: list[float] = []
    passes = 0
    row = first_row
    while True:
        tok, p_top = top(row)
        if (toks and p_top < p_min) or (keep_going is not None and not keep_going(len(toks), p_top, toks)):
            break
        toks.append(tok)
        conf.append(p_top)
        if len(toks) >= max_len or is_eog(tok) or (keep_going is not None and not keep_going(len(toks), None, toks)):
            break
        row = step(tok)
        passes += 1
    return toks, conf, passes


class NoDrafter(Drafter):
    """Plain decoding through the same loop: the baseline."""

    def propose(self, context: Sequence[int], max_len: int) -> Draft:
        return Draft([])


class LookupDrafter(Drafter):
    """Prompt lookup: copy what followed an earlier occurrence of the context's last n tokens
    (:meth:`NgramIndex.find`: longest n first), with the token substitutions the answer has
    been making to what it copies (``substitute``). A draft's confidence is the match length,
    followed back up to ``MATCH_CAP`` tokens; its source, the match's :func:`lookup_key`.

    With no such match, it picks up the copy it was making before (``RESYNC``): it keeps a
    cursor in the source, where the context stopped following the last copy. When that copy
    had held for ``RESYNC_HELD`` tokens or more and the context's last token is one of the
    ``RESYNC_WINDOW`` source tokens from the cursor on, the answer has come back to the source
    past an edit (a word inserted, replaced or dropped) and the copy goes on from there. A
    2-token match could not see it yet: the token before is the edit. How often such copies
    start right: research/README.md, "Figures behind lookup's buckets".

    With a :class:`~specli.speculate.history.History` of earlier answers (:meth:`recall`), it
    also copies from them where they match the context's end longer than the context itself
    does (:meth:`recalled`): a draft of source ``history``, learned apart per match length."""

    name = "lookup"
    history = None  # earlier answers to copy from (a History), set for each answer by recall
    MATCH_CAP = 32
    RESYNC_HELD = 4
    RESYNC_WINDOW = 8

    def __init__(self, n_min: int = DEFAULTS.lookup_ngram[0], n_max: int = DEFAULTS.lookup_ngram[1],
                 min_match: int = DEFAULTS.lookup_min_match, substitute: bool = True):
        self.index = NgramIndex(n_min, n_max)
        self.min_match = min_match
        self.subs = Substitutions() if substitute else None
        self._forget()

    def _forget(self) -> None:
        """Start over: no copy followed yet (a new answer, or a context that is not the
        last one's continuation)."""
        self.index.truncate(0)
        if self.subs:
            self.subs.reset()
        self.cursor: int | None = None  # in the source of the last copy: where the context left it
        self.held = 0  # how long that copy had matched when the context left it
        self._copying: tuple[int, int, int] | None = None  # the last copy: (context length, source position, match)

    def recall(self, history) -> None:
        self.history = history

    def propose(self, context: Sequence[int], max_len: int) -> Draft:
        """The copy from the context, or from an earlier answer where one matches longer."""
        d = self.copy(context, max_len)
        h = self.recalled(context, max_len, matched(d))
        return h if h.tokens else d

    def recalled(self, context: Sequence[int], max_len: int, longer_than: int = 0) -> Draft:
        """The copy from the earlier answers (none without a history): the continuation most
        of the answers that match the context's end furthest back took, when the match is at
        least ``min_match`` tokens long and longer than ``longer_than``. Its confidence is the
        match length; its source, :func:`history_key`."""
        if self.history is None or max_len <= 0:
            return Draft([], history_key(0))
        toks, n = self.history.find(context[-self.MATCH_CAP:], max_len)
        if n < self.min_match or n <= longer_than:
            return Draft([], history_key(0))
        return Draft(toks, history_key(n), [float(n)] * len(toks))

    def copy(self, context: Sequence[int], max_len: int) -> Draft:
        """The copy from the context (the class's docstring)."""
        idx = self.index
        if len(idx.tokens) > len(context) or idx.tokens != list(context[:len(idx.tokens)]):
            self._forget()
        if self.subs:
            self.subs.learn(context)
        idx.extend(context[len(idx.tokens):])
        self._follow(context)
        toks, n = idx.find(max_len, self.MATCH_CAP)
        if n < self.min_match and self.subs and self.subs.map:  # a copy that substituted goes on
            toks, n = idx.find(max_len, self.MATCH_CAP, self.subs.undo(context[-self.MATCH_CAP:]))
        if max_len <= 0:
            return Draft([], LOOKUP)
        if n < self.min_match:
            return self._resync(context, max_len)
        self._copying = (len(context), idx.last_source, n)
        if self.subs:
            toks = self.subs.apply(len(context), toks)
        return self._match_draft(toks, n)

    def _match_draft(self, toks: list[int], n: int) -> Draft:
        """A draft of ``toks`` from the index's last match, ``n`` tokens long."""
        return Draft(toks, lookup_key(n, self.index.last_ambiguous), [float(n)] * len(toks))

    def _follow(self, context: Sequence[int]) -> None:
        """Move the cursor along the last copy as far as the context followed it."""
        if self._copying is None:
            return
        at, src, matched = self._copying
        toks, j = self.index.tokens, 0
        while at + j < len(context) and src + j < at and toks[src + j] == context[at + j]:
            j += 1
        self.cursor, self.held, self._copying = src + j, matched + j, None

    def _resync(self, context: Sequence[int], max_len: int) -> Draft:
        """The copy picked up again past an edit, or nothing (see the class). Its confidence
        is how long the copy had held before the edit."""
        toks = self.index.tokens
        if self.cursor is None or self.held < self.RESYNC_HELD:
            return Draft([], LOOKUP)
        last = len(toks) - 1
        for j in range(self.cursor, min(self.cursor + self.RESYNC_WINDOW, last)):
            if toks[j] == toks[last]:
                self._copying = (len(context), j + 1, 1)
                out = toks[j + 1:j + 1 + max_len]
                return Draft(out, Source("lookup", RESYNC), [float(self.held)] * len(out))
        return Draft([], LOOKUP)

    def continuation(self, context: Sequence[int], drafted: Sequence[int], max_len: int,
                     min_match: int) -> Draft:
        """What a copy would add after ``drafted`` (another drafter's tokens after the
        ``context`` just proposed from), when those tokens run into text the context holds:
        a draft of the tokens after the longest match; empty if it is shorter than
        ``min_match``."""
        tail = (list(context[-self.MATCH_CAP:]) + list(drafted))[-self.MATCH_CAP:]
        toks, n = self.index.find(max_len, self.MATCH_CAP, tail)
        if n < min_match or max_len <= 0:
            return Draft([], LOOKUP)
        return self._match_draft(toks, n)


def matched(d: Draft) -> int:
    """How long the match a copy was drafted from is (its confidence); 0 for no draft."""
    return int(d.confidence[0]) if d.tokens and d.confidence else 0


class ModelDrafter(PaidDrafter):
    """A smaller model with the same tokenizer drafts (greedily; when sampling, with the
    answer's noise: :func:`draft_top`), stopping early when its top probability falls below
    ``p_min`` (it is then unlikely to be accepted)."""

    name = "model"
    source = MODEL

    def __init__(self, model: Model, cfg: ContextConfig, p_min: float = DEFAULTS.draft_p_min,
                 ctx: Context | None = None):
        self.model, self.cfg, self.p_min = model, cfg, p_min
        self._ctx = ctx  # None: made on first use

    @property
    def ctx(self) -> Context:
        """Its KV cache, made on first use (the slots of a --parallel batch draft in sequences
        of the batch's draft context instead: this one is then never made)."""
        if self._ctx is None:
            self._ctx = Context(self.model, self.cfg)
        return self._ctx

    @property
    def has_cache(self) -> bool:
        """Whether its KV cache has been made (or handed to it)."""
        return self._ctx is not None

    def propose(self, context: Sequence[int], max_len: int, keep_going: KeepGoing | None = None,
                p_min: float | None = None) -> Draft:
        p_min = self.p_min if p_min is None else p_min
        if max_len <= 0:
            return Draft([], MODEL)
        ctx = self.ctx
        if len(context) + max_len > ctx.n_ctx:
            max_len = ctx.n_ctx - len(context)
            if max_len <= 0:
                return Draft([], MODEL)
        kept = ctx.sync(context)
        row = ctx.eval(list(context[kept:]))[0]
        ctx.mark(across_decodes=True)  # a recurrent draft model rolls its drafts back to here
        toks, conf, passes = greedy_drafts(row, lambda t: ctx.eval([t])[0], max_len, self.model.is_eog, p_min,
                                           keep_going, draft_top(self.sampler, len(context)), self.guide)
        return Draft(toks, MODEL, conf, len(context) - kept, passes)

    def behind(self, context: Sequence[int]) -> int:
        """The tokens of ``context`` its cache lacks."""
        return len(context) - common_prefix(self.ctx.tokens, context, len(context) - 1)

    def token_cost(self) -> float:
        return calibrate.draft_token_cost(self.ctx)

    def repair(self) -> None:
        self.ctx.repair()

    def close(self) -> None:
        """Free its KV cache; a later use makes a new one (a drafter a session shares, closed
        by one of its users, never runs on a freed cache)."""
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None
