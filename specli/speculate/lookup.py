"""Prompt lookup: draft by copying what followed an earlier occurrence of the context's last
n tokens (longest n first; the latest, or for the longest n the one that agrees furthest
back). No second model; shines when the answer quotes its input (rewriting code, editing
text, extracting fields)."""

from __future__ import annotations

from collections.abc import Sequence


class NgramIndex:
    """Incremental index of n-grams (n in [n_min, n_max]) over a growing token list.

    ``index[ngram]`` is the end position of the latest occurrence that has at least one
    token after it, so a lookup never matches the context's own suffix. ``ambiguous`` holds
    the n-grams the context has gone on from in more than one way (in code, ``"):\n    "``
    is followed by anything): a copy from one of them is a guess between continuations.
    ``occurrences`` keeps, for each n_max-gram, the end positions of its occurrences: a match
    that long is copied from the one whose preceding text agrees with the context furthest
    back (of the latest ``CANDIDATES``), the latest among equals. An answer that repeats a
    shape line after line has its own previous line as the latest occurrence of such a match,
    while the line it is copying agrees for longer.
    """

    CANDIDATES = 32  # occurrences of an n_max-gram compared, latest first

    def __init__(self, n_min: int = 1, n_max: int = 4):
        if not 1 <= n_min <= n_max:
            raise ValueError("need 1 <= n_min <= n_max")
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []
        self.index: dict[tuple[int, ...], int] = {}
        self.ambiguous: set[tuple[int, ...]] = set()
        self.occurrences: dict[tuple[int, ...], list[int]] = {}
        self.last_ambiguous = False  # was the last match found by :meth:`find` ambiguous
        self.last_source = -1  # where the tokens the last match proposed start in ``tokens``

    def extend(self, new: Sequence[int]) -> None:
        for t in new:
            e = len(self.tokens)  # n-grams ending at e now have a continuation (t)
            toks = self.tokens
            t = int(t)
            for n in range(self.n_min, min(self.n_max, e) + 1):
                g = tuple(toks[e - n:e])
                seen = self.index.get(g)
                if seen is not None and toks[seen] != t:
                    self.ambiguous.add(g)
                self.index[g] = e
                if n == self.n_max:
                    self.occurrences.setdefault(g, []).append(e)
            toks.append(t)

    def truncate(self, length: int) -> None:
        """Forget tokens past ``length`` (rare: the loop only appends accepted tokens)."""
        if length < len(self.tokens):
            keep = self.tokens[:length]
            self.tokens, self.index, self.ambiguous, self.occurrences = [], {}, set(), {}
            self.extend(keep)

    def find(self, max_draft: int, extend_to: int = 0, tail: Sequence[int] | None = None) -> tuple[list[int], int]:
        """(drafted tokens, length of the match); ([], 0) when nothing matches. The match is
        the longest indexed n-gram ending the context (or ``tail``, a stand-in for the
        context's last tokens); with ``extend_to`` > n_max it is followed further back, up to
        that many tokens (how long the context has been copying this source), at each of the
        n-gram's recent occurrences, and the one it follows furthest is copied. Sets
        ``last_ambiguous`` (whether the matched n-gram is :attr:`ambiguous`) and ``last_source``
        (where the proposed tokens start)."""
        toks = self.tokens
        q = toks if tail is None else list(tail)
        L = len(q)
        self.last_ambiguous = False
        for n in range(min(self.n_max, L), self.n_min - 1, -1):
            g = tuple(q[L - n:])
            e = self.index.get(g)
            if e is not None:
                self.last_ambiguous = g in self.ambiguous
                if n == self.n_max:
                    n, e = max((self._back(q, s, extend_to), s)
                               for s in self.occurrences[g][-self.CANDIDATES:])
                self.last_source = e
                return toks[e:e + max_draft], n
        return [], 0

    def _back(self, q: Sequence[int], e: int, extend_to: int) -> int:
        """How far back (at least n_max, at most ``extend_to``) the text before position ``e``
        agrees with the end of ``q``."""
        toks, n, L = self.tokens, self.n_max, len(q)
        while n < extend_to and n < e and n < L and toks[e - 1 - n] == q[L - 1 - n]:
            n += 1
        return n


class Substitutions:
    """Token substitutions the answer keeps making to the text it copies (a renamed
    variable: the source says ``data``, the answer ``records``). One is learned when a copied
    proposal breaks at a single token and the copy resumes right after it; it is applied to
    later copies, and dropped as soon as it makes a proposal wrong."""

    CONFIRM = 2  # seen twice: a one-off change is not a rename

    def __init__(self):
        self.map: dict[int, int] = {}
        self.seen: dict[tuple[int, int], int] = {}
        self._last: tuple[int, list[int], list[int]] | None = None  # (position, proposed, copied)
        self._cand: tuple[int, int, int, int] | None = None  # (position, source, replacement, next)

    def reset(self) -> None:
        self.map.clear()
        self.seen.clear()
        self._last = self._cand = None

    def learn(self, context: Sequence[int]) -> None:
        """Compare the last proposal with what the context now holds."""
        if self._cand is not None and self._cand[0] < len(context):
            at, x, y, nxt = self._cand
            if context[at] == nxt:  # the copy resumed after one token: a substitution
                self.seen[(x, y)] = self.seen.get((x, y), 0) + 1
                if self.seen[(x, y)] >= self.CONFIRM:
                    self.map[x] = y
            self._cand = None
        if self._last is None:
            return
        pos, proposed, copied = self._last
        for j, t in enumerate(proposed):
            if pos + j >= len(context):
                return  # not yet known; keep waiting
            y = context[pos + j]
            if t != y:
                x = copied[j]
                if self.map.get(x) == t:
                    del self.map[x]
                elif j + 1 < len(copied):
                    self._cand = (pos + j + 1, x, y, copied[j + 1])
                break
        self._last = None

    def undo(self, tokens: Sequence[int]) -> list[int]:
        """``tokens`` as the source they were copied from said them (to find where a copy
        that made substitutions goes on)."""
        back = {y: x for x, y in self.map.items()}
        return [back.get(t, t) for t in tokens]

    def apply(self, position: int, copied: list[int]) -> list[int]:
        """The proposal for ``copied`` tokens starting at context ``position``."""
        proposed = [self.map.get(t, t) for t in copied] if self.map else list(copied)
        self._last = (position, proposed, list(copied)) if copied else None
        return proposed
