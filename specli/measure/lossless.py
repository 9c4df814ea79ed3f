"""Checking that speculative output is the target's own: where two token sequences part,
and how close the target's top two candidates were there. A small margin means batched
numerics flipped a near-tie (different batch shapes give slightly different logits); a large
one means a bug."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specli.engine import Context
from specli.tokens import common_prefix

NEAR_TIE = 1.0  # logits; batch-shape noise on quantised CPU models reaches ~0.6
IDENTICAL = "identical"
NEAR_TIE_KIND = "a near-tie (batched numerics)"


@dataclass(frozen=True)
class Divergence:
    position: int  # index into the generated tokens
    expected: int  # the reference (plain) token
    got: int
    top1: int
    top2: int
    margin: float  # target logit of top1 minus top2 at that position
    gap: float  # target logit of the plain token minus that of the other token

    @property
    def near_tie(self) -> bool:
        return abs(self.gap) < NEAR_TIE

    def describe(self) -> str:
        kind = NEAR_TIE_KIND if self.near_tie else "NOT a near-tie: likely a bug"
        return (f"differs from plain at token {self.position}: {self.got} vs {self.expected}; "
                f"target top-2 margin there {self.margin:.3f}, the two tokens {abs(self.gap):.3f} apart: {kind}")


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    i = common_prefix(a, b)
    return None if i == len(a) == len(b) else i


def divergence(ctx: Context, prompt: Sequence[int], reference: Sequence[int],
               other: Sequence[int]) -> Divergence | None:
    """None when ``other`` is ``reference`` (or a prefix of it, or it of ``other``: one run
    stopped earlier); else where they part and the target's margin there (``ctx`` is used
    as scratch: its cache is replaced)."""
    i = first_difference(reference, other)
    if i is None or i >= min(len(reference), len(other)):
        return None
    ctx.clear()
    row = np.array(ctx.eval(list(prompt) + list(reference[:i]))[0], dtype=np.float64)
    top = np.argsort(-row)[:2]
    return Divergence(i, int(reference[i]), int(other[i]), int(top[0]), int(top[1]),
                      float(row[top[0]] - row[top[1]]), float(row[reference[i]] - row[other[i]]))


def verdict(d: Divergence | None) -> str:
    """One line for a report: ``identical``, or where the outputs part and whether that is a near-tie."""
    return IDENTICAL if d is None else d.describe()


def holds(verdict: str) -> bool:
    """Whether a ``verdict`` line shows the target's own output: identical, or parted at a
    near-tie. A divergence that is not a near-tie (a lossless violation) does not hold."""
    return verdict == IDENTICAL or verdict.endswith(": " + NEAR_TIE_KIND)


def tokens_of_text(model, reference: Sequence[int], text: str) -> list[int]:
    """``text`` (an answer that came back as text: from a server, a batch job's output) as
    tokens: those of ``reference`` while their text is a prefix of it, then the rest tokenized."""
    i = 0
    while i < len(reference) and text.startswith(model.detokenize(reference[:i + 1])):
        i += 1
    head = model.detokenize(reference[:i])
    return list(reference[:i]) + model.tokenize(text[len(head):], add_special=False, parse_special=False)
