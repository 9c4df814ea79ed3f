"""The replay and the clairvoyant bound of benchmarks/lookup_bound.py, on synthetic text."""

import functools
import importlib.util
import os
import random

import pytest
from curves import VM_CURVE

from specli.speculate.adaptive import AdaptiveDrafter
from specli.speculate.controller import Controller, CostModel
from specli.speculate.drafters import LookupDrafter

_spec = importlib.util.spec_from_file_location(
    "lookup_bound", os.path.join(os.path.dirname(__file__), "..", "benchmarks", "lookup_bound.py"))
lb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lb)

COSTS = VM_CURVE


def test_bound_of_an_exact_copy():
    src = list(range(100, 160))
    agree = lb.agreement([1] + src + [2], src, 16)
    assert agree[1:4] == [16, 16, 16] and agree[-1] == 1
    # every draft would be right: the bound is the cheapest split of the 59 tokens after the
    # first into blocks of at most 17 (16 drafted + 1)
    @functools.lru_cache(None)
    def split(n):
        return min((COSTS[b - 1] + split(n - b) for b in range(1, min(17, n) + 1)), default=0.0)

    assert lb.min_cost(agree, COSTS) == pytest.approx(split(59))
    assert split(59) < 4 * COSTS[15]
    # nothing to copy: plain decoding is the best there is
    assert lb.min_cost(lb.agreement([1, 2], src, 16), COSTS) == pytest.approx(59.0)


def _edited_copies(n_edits: int, seed: int = 3, reps: int = 3):
    rng = random.Random(seed)
    for _ in range(reps):
        src = [rng.randrange(50, 90) for _ in range(400)]
        out = list(src)
        for i in rng.sample(range(1, 400), n_edits):  # an edited copy of its input
            out[i] = rng.randrange(200, 220)
        yield [1] + src + [2], out


def _costs(prompt, out, substitute=True):
    adaptive = lb.replay(prompt, out, AdaptiveDrafter(Controller(CostModel(list(COSTS)), k_max=16),
                                                      LookupDrafter(substitute=substitute)), COSTS)
    return (lb.min_cost(lb.agreement(prompt, out, 16), COSTS), adaptive,
            lb.replay(prompt, out, LookupDrafter(substitute=substitute), COSTS),
            lb.replay(prompt, out, LookupDrafter(min_match=99), COSTS))


@pytest.mark.parametrize("n_edits", [10, 40, 150])
def test_no_copying_policy_beats_the_clairvoyant_bound(n_edits):
    for prompt, out in _edited_copies(n_edits):
        bound, adaptive, fixed, plain = _costs(prompt, out, substitute=False)
        assert plain == pytest.approx(len(out) - 1)
        assert bound <= adaptive and bound <= fixed and bound <= plain


def test_adaptive_lookup_gains_on_copies_and_stays_near_plain_on_heavy_edits():
    light = [sum(x) for x in zip(*(_costs(p, o) for p, o in _edited_copies(10)))]
    heavy = [sum(x) for x in zip(*(_costs(p, o) for p, o in _edited_copies(150)))]
    bound, adaptive, fixed, plain = light
    assert plain / adaptive > 1.3 and adaptive <= fixed  # long copies: drafts long
    bound, adaptive, fixed, plain = heavy
    assert adaptive <= 1.01 * plain and fixed > 1.5 * plain  # an edit every ~3 tokens: drafts little
