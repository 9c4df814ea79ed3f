#!/usr/bin/env python3
"""The verify cost curve: seconds for the target to evaluate a block of k + 1 tokens (logits
for every row) over one token, k = 0..32, on this machine. It sets how much speculation can
gain: with every draft accepted, a step yields k + 1 tokens for cost[k] token-times.

    python benchmarks/cost_curve.py [--target REF] [--threads N] [--gpu-layers N]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from specli.engine import Context, ContextConfig, Model  # noqa: E402
from specli.hardware import calibrate
from specli.resolve import models  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--k-max", type=int, default=32)
    a = ap.parse_args()
    m = Model(models.resolve(a.target, progress=print), n_gpu_layers=a.gpu_layers)
    ctx = Context(m, ContextConfig(n_ctx=4096, n_threads=a.threads))
    costs = calibrate.verify_costs(ctx, a.k_max, reps=5, use_cache=False)
    print(f"target {os.path.basename(m.path)}, {ctx.threads} threads, one token {costs[0] * 1000:.1f} ms")
    print("| block (k+1) | cost / one token | ceiling (k+1)/cost |\n|---|---|---|")
    for k in calibrate.measured_points(a.k_max):
        r = costs[k] / costs[0]
        print(f"| {k + 1} | {r:.2f} | {(k + 1) / r:.2f}× |")


if __name__ == "__main__":
    main()
