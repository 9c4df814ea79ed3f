#!/usr/bin/env python3
"""The verify cost curve: seconds for the target to evaluate a block of k + 1 tokens (logits
for every row) over one token, k = 0..32, on this machine. It sets how much speculation can
gain: with every draft accepted, a step yields k + 1 tokens for cost[k] token-times.

    python benchmarks/cost_curve.py [--target REF] [--draft REF] [--threads N] [--gpu-layers N]
                                    [--out curve.json]

``--out`` writes the curve (seconds) and the draft model's cost per token (``--draft``, by
default the 0.5B draft the replay's traces use) as JSON, for ``research/studies/replay.py --costs
FILE`` on any other machine.

    python benchmarks/cost_curve.py --predict [--target REF ...] [--kernels] [--report DIR]

``--predict`` compares, for each ``--target`` (default: the Q4_K_M 1.5B and the 0.5B draft; add
an all-Q4_0 file of the same weights by path), the verify curve predicted from the file's header
and this machine's per-type kernel costs (``specli doctor --kernels``'s cached table;
``--kernels`` times the files' types afresh in every round, between the files' curves) with the
curve measured here, k + 1 = 1..16, and writes a Markdown + JSON report to benchmarks/results/
(goal: within 15 % at every k).
"""

from __future__ import annotations

import argparse
import json
import os
import platform

from specli.engine import Context, ContextConfig, Model, system_info
from specli.hardware import calibrate
from specli.resolve import models

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m"
PREDICT_TARGETS = (DEFAULT_TARGET, "qwen2.5-coder-0.5b-instruct-q4_k_m")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", action="append", help="model reference (several with --predict)")
    ap.add_argument("--predict", action="store_true", help="predicted against measured curves, reported")
    ap.add_argument("--kernels", action="store_true",
                    help="with --predict: time the files' kernel types afresh, in every round")
    ap.add_argument("--report", default=os.path.join(os.path.dirname(__file__), "results"),
                    help="with --predict: the folder the report goes to")
    ap.add_argument("--rounds", type=int, default=3, help="with --predict: measured curves per file")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--k-max", type=int, default=32)
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct-q4_k_m",
                    help="time one token of this draft model too (the replay prices its passes by it)")
    ap.add_argument("--out", help="write the curve as JSON here")
    a = ap.parse_args()
    if a.predict:
        from cost_predict import compare  # benchmarks/, beside this script

        compare(a.target or list(PREDICT_TARGETS), a.threads, a.gpu_layers, a.kernels, a.report, a.rounds)
        return
    m = Model(models.resolve((a.target or [DEFAULT_TARGET])[-1], progress=print), n_gpu_layers=a.gpu_layers)
    ctx = Context(m, ContextConfig(n_ctx=4096, n_threads=a.threads))
    costs = calibrate.verify_costs(ctx, a.k_max, reps=5, use_cache=False)
    print(f"target {os.path.basename(m.path)}, {ctx.threads} threads, one token {costs[0] * 1000:.1f} ms")
    print("| block (k+1) | cost / one token | ceiling (k+1)/cost |\n|---|---|---|")
    for k in calibrate.measured_points(a.k_max):
        r = costs[k] / costs[0]
        print(f"| {k + 1} | {r:.2f} | {(k + 1) / r:.2f}× |")
    draft = None
    if a.draft:  # --draft "" skips it (the curve alone; the replay needs the draft's cost)
        dm = Model(models.resolve(a.draft, progress=print), n_gpu_layers=a.gpu_layers)
        draft = calibrate.draft_token_cost(Context(dm, ContextConfig(n_ctx=4096, n_threads=a.threads)), use_cache=False)
        print(f"draft {os.path.basename(dm.path)}: one token {draft * 1000:.1f} ms "
              f"({draft / costs[0]:.2f} of the target's)")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"verify": costs, "draft_token": draft, "model": os.path.basename(m.path),
                       "machine": f"{platform.machine()}, {ctx.threads} threads, {a.gpu_layers} GPU layers",
                       "system": system_info()}, f, indent=1)
        print(f"curve: {a.out}")


if __name__ == "__main__":
    main()
