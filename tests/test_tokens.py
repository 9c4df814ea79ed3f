"""common_prefix: compared a slice at a time on long inputs, the same answer as a plain loop."""

import random

import numpy as np

from specli.tokens import common_prefix


def _loop(a, b, limit=None):
    n = min(len(a), len(b)) if limit is None else min(len(a), len(b), limit)
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def test_common_prefix_matches_a_plain_loop():
    rng = random.Random(7)
    for _ in range(3000):
        n = rng.randrange(0, 400)
        a = [rng.randrange(3) for _ in range(n)]
        b = a[:rng.randrange(0, n + 1)] + [rng.randrange(3) for _ in range(rng.randrange(0, 60))]
        limit = rng.choice([None, rng.randrange(0, 500)])
        for x, y in ((a, b), (b, a), (np.array(a, dtype=np.int64), b), (a, np.array(b, dtype=np.int32))):
            assert common_prefix(x, y, limit) == _loop(x, y, limit)


def test_common_prefix_of_long_contexts():
    a = list(range(5000))
    assert common_prefix(a, a + [1]) == 5000
    assert common_prefix(a, a, 4999) == 4999
    for at in (0, 1, 31, 32, 33, 2500, 4999):
        b = a[:at] + [-1] + a[at + 1:]
        assert common_prefix(a, b) == at
