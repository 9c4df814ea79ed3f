"""Prompt lookup: draft by copying what followed the latest earlier occurrence of the
context's last n tokens (longest n first). No second model; shines when the answer quotes
its input (rewriting code, editing text, extracting fields)."""

from __future__ import annotations

from typing import Sequence


class NgramIndex:
    """Incremental index of n-grams (n in [n_min, n_max]) over a growing token list.

    ``index[ngram]`` is the end position of the latest occurrence that has at least one
    token after it, so a lookup never matches the context's own suffix.
    """

    def __init__(self, n_min: int = 1, n_max: int = 4):
        if not 1 <= n_min <= n_max:
            raise ValueError("need 1 <= n_min <= n_max")
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []
        self.index: dict[tuple[int, ...], int] = {}

    def extend(self, new: Sequence[int]) -> None:
        for t in new:
            e = len(self.tokens)  # n-grams ending at e now have a continuation (t)
            toks = self.tokens
            for n in range(self.n_min, min(self.n_max, e) + 1):
                self.index[tuple(toks[e - n:e])] = e
            toks.append(int(t))

    def truncate(self, length: int) -> None:
        """Forget tokens past ``length`` (rare: the loop only appends accepted tokens)."""
        if length < len(self.tokens):
            keep = self.tokens[:length]
            self.tokens, self.index = [], {}
            self.extend(keep)

    def find(self, max_draft: int, extend_to: int = 0) -> tuple[list[int], int]:
        """(drafted tokens, length of the match); ([], 0) when nothing matches. The match is
        the longest indexed n-gram; with ``extend_to`` > n_max it is followed further back, up
        to that many tokens (how long the context has been copying this source)."""
        toks = self.tokens
        L = len(toks)
        for n in range(min(self.n_max, L), self.n_min - 1, -1):
            e = self.index.get(tuple(toks[L - n:]))
            if e is not None:
                if n == self.n_max:
                    while n < extend_to and n < e and toks[e - 1 - n] == toks[L - 1 - n]:
                        n += 1
                return toks[e:e + max_draft], n
        return [], 0


def lookup_draft(tokens: Sequence[int], max_draft: int, n_min: int = 1, n_max: int = 4) -> tuple[list[int], int]:
    """Stateless form of :class:`NgramIndex` for one context."""
    idx = NgramIndex(n_min, n_max)
    idx.extend(tokens)
    return idx.find(max_draft)
