#!/usr/bin/env python3
"""What trained drafting heads cost per pass, on synthetic f32 weights (nothing to download):
an EAGLE-3 head over a llama-shaped target and an MTP-only sidecar over a qwen35 trunk, built with
the generators of tests/tinyheads.py and tests/tiny2026.py at a larger hidden size. Timed: the
target's verify of 1 and k tokens, the head's decoder pass (one draft token), the head's encoder
over k target rows (EAGLE-3, paid inside each target pass), the sidecar's MTP pass.

    python benchmarks/gpu/head_costs.py --tokenizer T.gguf --out head-costs.json [--d 1024 --gpu-layers -1]

Not run by run.sh (written where no device was lent; the numbers are for the controller's
pricing, ``calibrate.cached_cost``, which measures the same passes on the user's machine).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from tiny2026 import tiny_2026_model  # noqa: E402
from tinyheads import tiny_head_model  # noqa: E402

from specli.engine import Context, ContextConfig, Model  # noqa: E402
from specli.speculate.heads import Eagle3Drafter, eagle3_context  # noqa: E402
from specli.speculate.mtp import MTPDrafter  # noqa: E402


def best(f, reps: int) -> float:
    f()  # warm-up: the first pass of a shape allocates its graph
    out = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        f()
        out = min(out, time.perf_counter() - t)
    return out


def verify_cost(ctx: Context, k: int, reps: int) -> float:
    n = ctx.n_past

    def once():
        ctx.eval([1] * k, "all")
        ctx.rollback(n)
    return best(once, reps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True, help="a GGUF with the SmolLM2 tokenizer")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cache", type=Path, default=Path("/tmp/specli-head-costs"))
    ap.add_argument("--d", type=int, default=1024, help="hidden size of target and heads")
    ap.add_argument("--k", type=int, default=8, help="verify block / encoder rows")
    ap.add_argument("--gpu-layers", type=int, default=-1)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    d, k = a.d, a.k
    cfg = ContextConfig(n_ctx=1024, n_batch=256, n_threads=a.threads)
    prompt = list(range(100, 164))
    res: dict = {"d": d, "k": k, "gpu_layers": a.gpu_layers}

    tpath = tiny_head_model(a.cache, a.tokenizer, "bigram", d=d, n_head=16, n_head_kv=4, ff=4 * d, n_layer=8)
    hpath = tiny_head_model(a.cache, a.tokenizer, "eagle3-partial", d=d, target_hidden=d, n_head=16, ff=4 * d,
                            layers=(1, 4, 7))
    target, head = Model(str(tpath), n_gpu_layers=a.gpu_layers), Model(str(hpath), n_gpu_layers=a.gpu_layers)
    ctx = Context(target, cfg)
    ctx.eval(prompt, "none")
    res["eagle3_target_verify_1_s"] = verify_cost(ctx, 1, a.reps)
    res["eagle3_target_verify_k_s"] = verify_cost(ctx, k, a.reps)
    drafter = Eagle3Drafter(ctx, eagle3_context(ctx, head, cfg), p_min=0.0)
    ctx.listen(drafter, replay=True)  # replays the prompt through the head
    res["eagle3_target_verify_k_with_head_s"] = verify_cost(ctx, k, a.reps)  # + exporting rows, encoding, feeding
    res["eagle3_head_pass_s"] = drafter.pass_time(a.reps)
    feats = np.zeros((k, 3 * d), np.float32)
    res["eagle3_encode_k_s"] = best(lambda: drafter._encode(feats), a.reps)
    drafter.close()

    trunk = Model(str(tiny_2026_model(a.cache, a.tokenizer, "qwen35-trunk-partial", d=d, ff=4 * d,
                                      n_head=8, n_head_kv=2, head_dim=d // 8)), n_gpu_layers=a.gpu_layers)
    side = Model(str(tiny_2026_model(a.cache, a.tokenizer, "qwen35-mtp-only-partial", d=d, ff=4 * d,
                                     n_head=8, n_head_kv=2, head_dim=d // 8)), n_gpu_layers=a.gpu_layers, load_mtp=True)
    tctx = Context(trunk, cfg)
    tctx.eval(prompt, "none")
    res["sidecar_target_verify_1_s"] = verify_cost(tctx, 1, a.reps)
    res["sidecar_target_verify_k_s"] = verify_cost(tctx, k, a.reps)
    mtp = MTPDrafter(tctx, tctx.mtp_context(cfg, side), p_min=0.0)
    tctx.listen(mtp, replay=True)
    res["sidecar_target_verify_k_with_head_s"] = verify_cost(tctx, k, a.reps)
    res["sidecar_mtp_pass_s"] = mtp.pass_time(a.reps)
    mtp.close()
    a.out.write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
