"""Earlier answers lookup may copy from (``--lookup-history``): a bounded index over the
answers a model gave before (each with the last few tokens of its prompt), so that a job
whose answers look alike (the same keys, the same phrasing, the same code skeleton) drafts
the next answer from the last ones. A leaf module: it imports nothing else from specli.

The search follows SuffixDecoding (arXiv 2411.04975; ``../shared/notes/suffix-decoding.md``)
with hash tables instead of a suffix tree: every n-gram of ``KEYS`` sizes of every kept
answer points to where it occurred; the context's last tokens are matched longest key first,
each recent occurrence is followed back (up to ``MATCH_CAP`` tokens) to measure how long the
context agrees with it, and from the occurrences that agree furthest the draft follows, token
by token, the continuation most of them took (a token's probability: the share of the
occurrences still followed that go on with it; the draft ends where the product falls below
``MIN_PROB``, or where no occurrence goes on). Answers are evicted oldest first, whole.

A :class:`History` is safe to share between threads (the slots of a batch)."""

from __future__ import annotations

import re
import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice

KEYS = (2, 4, 8)  # the n-gram sizes indexed: a match of 2-3, 4-7 or 8+ tokens is found by one of them
MATCH_CAP = 32  # a match is followed back at most this far
CANDIDATES = 32  # occurrences of the matched n-gram compared, latest first
MIN_PROB = 0.1  # a draft ends where the share of occurrences that go on with it falls below this
PROMPT_TAIL = 8  # the prompt's last tokens kept before each answer (a chat template's assistant header)
_SHIFT = 32  # an occurrence is (answer serial << _SHIFT) | end position


@dataclass(frozen=True)
class Bound:
    """How much history is kept: at most ``answers`` answers and ``tokens`` tokens (None: no
    limit of that kind); both None and ``off``: no history."""

    answers: int | None = None
    tokens: int | None = None
    off: bool = False

    def __str__(self) -> str:
        if self.off:
            return "0"
        parts = [] if self.answers is None else [str(self.answers)]
        return ",".join(parts + ([] if self.tokens is None else [f"{self.tokens}t"]))


OFF = Bound(off=True)
_PART = re.compile(r"^(\d+(?:\.\d+)?)\s*(t|tok|tokens|k|m)?$", re.IGNORECASE)
_SCALE = {None: None, "t": 1, "tok": 1, "tokens": 1, "k": 1_000, "m": 1_000_000}


def parse_bound(text: str) -> Bound:
    """``--lookup-history``: ``0`` (or ``off``) keeps none; a number, that many answers; a
    number with ``t``, ``k`` or ``M``, that many tokens (``50000t``, ``500k``, ``2M``); both,
    comma-separated (``256,500k``), whichever is reached first. A wrong one is a ValueError
    that says what is wanted."""
    s = text.strip().lower()
    if s in ("0", "off", "none"):
        return OFF
    answers = tokens = None
    for part in filter(None, (p.strip() for p in s.split(","))):
        m = _PART.match(part)
        if m is None:
            raise ValueError(f"--lookup-history: '{text}' is not a count of answers (256), a size in tokens "
                             "(500k, 2M, 50000t), both (256,500k), or 0 (off)")
        value, unit = float(m.group(1)), m.group(2)
        if unit is None:
            if value != int(value) or value < 1:
                raise ValueError(f"--lookup-history: '{part}' is not a whole number of answers")
            answers = int(value)
        else:
            tokens = int(value * _SCALE[unit.lower()])
            if tokens < 1:
                raise ValueError(f"--lookup-history: '{part}' is no tokens")
    if answers is None and tokens is None:
        return OFF
    return Bound(answers, tokens)


class History:
    """The earlier answers of one model (for one API key, on a server with keys), bounded by a
    :class:`Bound`, oldest evicted first. :meth:`add` keeps an answer; :meth:`find` drafts
    from the answers kept."""

    def __init__(self, bound: Bound):
        self.bound = bound
        self.answers: dict[int, array] = {}  # serial -> tokens, oldest first
        # an n-gram's hash -> its occurrence (one) or occurrences (a list, oldest first); a hash
        # that two n-grams share is told apart when matched (a small table: an entry per token and size)
        self.index: dict[int, int | list[int]] = {}
        self.tokens = 0  # tokens kept
        self.added = self.evicted = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.answers)

    def add(self, prompt: Sequence[int], answer: Sequence[int]) -> None:
        """Keep ``answer`` (after the last ``PROMPT_TAIL`` tokens of ``prompt``), evicting the
        oldest answers beyond the bound. One longer than a token bound keeps its beginning."""
        b = self.bound
        if b.off or not answer:
            return
        toks = array("l", list(prompt[-PROMPT_TAIL:]) + list(answer))
        if b.tokens is not None:
            del toks[b.tokens:]
        with self._lock:
            serial = self.added
            self.added += 1
            self.answers[serial] = toks
            self.tokens += len(toks)
            base = serial << _SHIFT
            index = self.index
            for g, e in _grams(toks):
                occ = index.get(g)
                if occ is None:
                    index[g] = base | e
                elif isinstance(occ, int):
                    index[g] = [occ, base | e]
                else:
                    occ.append(base | e)
            while self.answers and ((b.answers is not None and len(self.answers) > b.answers)
                                    or (b.tokens is not None and self.tokens > b.tokens)):
                self._evict_oldest()

    def _evict_oldest(self) -> None:
        serial, toks = next(iter(self.answers.items()))
        del self.answers[serial]
        self.tokens -= len(toks)
        self.evicted += 1
        index = self.index
        for g, _ in _grams(toks):
            occ = index.get(g)
            if occ is None:
                continue  # the answer's earlier occurrence of g took them all
            if isinstance(occ, int):
                if occ >> _SHIFT == serial:
                    del index[g]
                continue
            k = 0
            while k < len(occ) and occ[k] >> _SHIFT == serial:
                k += 1
            del occ[:k]
            if len(occ) == 1:
                index[g] = occ[0]

    def find(self, tail: Sequence[int], max_len: int) -> tuple[list[int], int]:
        """(drafted tokens, length of the match) for a context ending in ``tail``; ([], 0)
        when no kept answer holds its last ``KEYS[0]`` tokens (see the module)."""
        if max_len <= 0 or not self.answers:
            return [], 0
        q = [int(t) for t in tail[-MATCH_CAP:]]
        with self._lock:
            for n in reversed(KEYS):
                if len(q) < n:
                    continue
                occ = self.index.get(hash(tuple(q[-n:])))
                if occ is None:
                    continue
                found = self._draft(q, n, [occ] if isinstance(occ, int) else islice(reversed(occ), CANDIDATES),
                                    max_len)
                if found[1]:
                    return found
        return [], 0

    def _draft(self, q: list[int], n: int, occurrences, max_len: int) -> tuple[list[int], int]:
        """From the occurrences (latest first) of the context's last ``n`` tokens: the match
        length, and the draft the ones agreeing furthest back go on with."""
        best, followed = 0, []
        for code in occurrences:
            toks, e = self.answers[code >> _SHIFT], code & ((1 << _SHIFT) - 1)
            if list(toks[e - n:e]) != q[-n:]:
                continue  # another n-gram with the same hash
            m = _back(toks, e, q, n)
            if m > best:
                best, followed = m, [(toks, e)]
            elif m == best:
                followed.append((toks, e))
        out: list[int] = []
        p = 1.0
        while len(out) < max_len:
            counts: dict[int, int] = {}
            for toks, e in followed:  # latest first: a tie goes to the latest
                if e + len(out) < len(toks):
                    t = toks[e + len(out)]
                    counts[t] = counts.get(t, 0) + 1
            if not counts:
                break
            tok, c = max(counts.items(), key=lambda kv: kv[1])
            p *= c / len(followed)
            if p < MIN_PROB:
                break
            out.append(tok)
            followed = [(toks, e) for toks, e in followed if e + len(out) - 1 < len(toks)
                        and toks[e + len(out) - 1] == tok]
        return out, best


def _back(toks: Sequence[int], e: int, q: list[int], n: int) -> int:
    """How far back (at least ``n``, at most ``MATCH_CAP``) the tokens before ``toks[e]``
    agree with the end of ``q``."""
    L = len(q)
    while n < MATCH_CAP and n < e and n < L and toks[e - 1 - n] == q[L - 1 - n]:
        n += 1
    return n


class Histories:
    """A model's histories: one for every owner (an API key on a server with keys; ``None``,
    everyone else), each bounded alike. Answers never cross owners: a response's timing then
    says nothing about another owner's texts."""

    def __init__(self, bound: Bound):
        self.bound = bound
        self._by_owner: dict[str | None, History] = {}
        self._lock = threading.Lock()

    def of(self, owner: str | None = None) -> History | None:
        """``owner``'s history (made on first use); None when history is off."""
        if self.bound.off:
            return None
        with self._lock:
            h = self._by_owner.get(owner)
            if h is None:
                h = self._by_owner[owner] = History(self.bound)
            return h


def _grams(toks: Sequence[int]):
    """(key, end) of every indexed n-gram of an answer (n in :data:`KEYS`) that has a token after it."""
    for n in KEYS:
        for e in range(n, len(toks)):
            yield hash(tuple(toks[e - n:e])), e
