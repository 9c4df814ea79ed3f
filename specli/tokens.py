"""Token-sequence helpers shared by the engine, the verify rule, the drafters and bench."""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix(a: Sequence[int], b: Sequence[int], limit: int | None = None) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` (at most ``limit``). Called on
    whole contexts every step (a cache against the context it must hold), so long inputs are
    compared a slice at a time, at C speed: whole when one extends the other (the usual case),
    else halving the span that holds the first difference."""
    n = min(len(a), len(b)) if limit is None else min(len(a), len(b), limit)
    lo, hi = 0, n  # a[:lo] == b[:lo]; the first difference, if any, is in [lo, hi)
    if n > 32:
        if list(a[:n]) == list(b[:n]):
            return n
        while hi - lo > 32:
            mid = (lo + hi) // 2
            if list(a[lo:mid]) == list(b[lo:mid]):
                lo = mid
            else:
                hi = mid
    while lo < hi and a[lo] == b[lo]:
        lo += 1
    return lo
