#!/usr/bin/env python3
"""Where a GPU run's greedy text parted from plain greedy: the tiny test target's top-2 logit
margin there, on this machine's CPU (f32 weights, f32 KV cache, one token per pass). A margin
no larger than the GPU's batch-shape logit differences means numerics, not a bug.

    python benchmarks/gpu/near_ties.py "def fibonacci(n):@22" "Once upon a time@150"

Each argument is PROMPT@POSITION (0: the first generated token); prints the margin there, its
rank among the answer's margins, and the median margin.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from conftest import TARGET_KW, TEST_CACHE  # noqa: E402
from tinymodels import tiny_model  # noqa: E402

from specli.engine import Context, ContextConfig, Model  # noqa: E402
from specli.resolve import wheels  # noqa: E402


def margins(model: Model, text: str, n: int) -> list[float]:
    ctx = Context(model, ContextConfig(n_ctx=1024, n_batch=64, f32_kv=True))
    row = ctx.eval(model.tokenize(text))[-1]
    out = []
    for _ in range(n):
        top2 = np.sort(row)[-2:]
        out.append(float(top2[1] - top2[0]))
        row = ctx.eval([int(row.argmax())])[-1]
    return out


def main() -> None:
    smol = str(wheels.fetch(wheels.BUILTIN["smollm2-135m-instruct-q4_1"]))
    model = Model(str(tiny_model(TEST_CACHE, smol, **TARGET_KW)))
    for arg in sys.argv[1:]:
        text, _, pos = arg.rpartition("@")
        m = margins(model, text, int(pos) + 50)
        rank = sorted(m).index(m[int(pos)]) + 1
        print(f"{text!r} @ {pos}: top-2 margin {m[int(pos)]:.4f} (rank {rank} of {len(m)}, "
              f"median {np.median(m):.3f})")


if __name__ == "__main__":
    main()
