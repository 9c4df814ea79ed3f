#!/usr/bin/env python3
"""What trained drafting heads cost per pass, on synthetic f32 weights (nothing to download):
an EAGLE-3 head over a llama-shaped target, a DFlash head over a llama-shaped target, and an
MTP-only sidecar over a qwen35 trunk, built with the generators of tests/tinyheads.py and
tests/tiny2026.py at a larger hidden size. Timed: each target's verify of 1 and k tokens, and of
k tokens with the head fed (the rows it exports and what the head does with them inside each
target pass); the EAGLE-3 head's decoder pass (one draft token) and its encoder over k rows; the
DFlash head's block pass (the whole draft: ``block - 1`` tokens) and its injection of k rows; the
sidecar's MTP pass (one draft token).

    python benchmarks/gpu/head_costs.py --tokenizer T.gguf --out head-costs.json [--d 1024 --gpu-layers -1]
    python benchmarks/gpu/head_costs.py --tokenizer T.gguf --out /tmp/h.json --quick   # CPU, seconds

run.sh runs it after the cost curve and merges the figures into gpu-costs.json under "heads" (an
existing JSON object at --out is kept, the figures added under that key). They are what the
controller prices (``calibrate.cached_cost``: mtp-head, eagle3, dflashN), measured here on one
device for the same shapes.
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
from specli.speculate.heads import DFlashDrafter, Eagle3Drafter, dflash_context, eagle3_context  # noqa: E402
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
    ap.add_argument("--out", type=Path, required=True, help="JSON file; the figures go under its key 'heads'")
    ap.add_argument("--cache", type=Path, default=Path("/tmp/specli-head-costs"))
    ap.add_argument("--d", type=int, default=1024, help="hidden size of targets and heads")
    ap.add_argument("--k", type=int, default=8, help="verify block / encoded or injected rows")
    ap.add_argument("--block", type=int, default=16, help="the DFlash head's block (drafts block - 1 a pass)")
    ap.add_argument("--gpu-layers", type=int, default=-1)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="small shapes, 2 repetitions: a check that it runs")
    a = ap.parse_args()
    if a.quick:
        a.d, a.reps = 128, 2
    d, k = a.d, a.k
    n_head = max(4, d // 64)
    cfg = ContextConfig(n_ctx=1024, n_batch=256, n_threads=a.threads)
    prompt = list(range(100, 164))
    res: dict = {"d": d, "k": k, "block": a.block, "gpu_layers": a.gpu_layers, "reps": a.reps}

    def with_head(prefix: str, target: Model, make) -> None:
        """The target's verify costs alone and with the head fed, then the head's own passes."""
        ctx = Context(target, cfg)
        ctx.eval(prompt, "none")
        res[f"{prefix}_target_verify_1_s"] = verify_cost(ctx, 1, a.reps)
        res[f"{prefix}_target_verify_k_s"] = verify_cost(ctx, k, a.reps)
        drafter = make(ctx)
        ctx.listen(drafter, replay=True)  # replays the prompt through the head
        res[f"{prefix}_target_verify_k_with_head_s"] = verify_cost(ctx, k, a.reps)
        res[f"{prefix}_head_pass_s"] = drafter.pass_time(a.reps)
        if isinstance(drafter, Eagle3Drafter):
            feats = np.zeros((k, len(drafter.ids) * d), np.float32)
            res["eagle3_encode_k_s"] = best(lambda: drafter.encode(feats), a.reps)
        if isinstance(drafter, DFlashDrafter):
            res["dflash_drafts_per_pass"] = drafter.max_len
        drafter.close()

    tpath = tiny_head_model(a.cache, a.tokenizer, "bigram", d=d, n_head=n_head, n_head_kv=4, ff=4 * d, n_layer=8)
    hpath = tiny_head_model(a.cache, a.tokenizer, "eagle3-partial", d=d, target_hidden=d, n_head=n_head, ff=4 * d,
                            layers=(1, 4, 7))
    head = Model(str(hpath), n_gpu_layers=a.gpu_layers)
    with_head("eagle3", Model(str(tpath), n_gpu_layers=a.gpu_layers),
              lambda c: Eagle3Drafter(c, eagle3_context(c, head, cfg), p_min=0.0))

    tpath = tiny_head_model(a.cache, a.tokenizer, "copy", d=d, n_head=n_head, ff=4 * d)
    hpath = tiny_head_model(a.cache, a.tokenizer, "dflash-partial", d=d, target_hidden=d, n_head=n_head, ff=4 * d,
                            block_size=a.block)
    dhead = Model(str(hpath), n_gpu_layers=a.gpu_layers)
    with_head("dflash", Model(str(tpath), n_gpu_layers=a.gpu_layers),
              lambda c: DFlashDrafter(c, dflash_context(c, dhead, cfg), p_min=0.0, n_max=a.block - 1))

    trunk = Model(str(tiny_2026_model(a.cache, a.tokenizer, "qwen35-trunk-partial", d=d, ff=4 * d,
                                      n_head=8, n_head_kv=2, head_dim=d // 8)), n_gpu_layers=a.gpu_layers)
    side = Model(str(tiny_2026_model(a.cache, a.tokenizer, "qwen35-mtp-only-partial", d=d, ff=4 * d,
                                     n_head=8, n_head_kv=2, head_dim=d // 8)), n_gpu_layers=a.gpu_layers, load_mtp=True)
    with_head("sidecar", trunk, lambda c: MTPDrafter(c, c.mtp_context(cfg, side), p_min=0.0))

    try:
        doc = json.loads(a.out.read_text()) if a.out.exists() else {}
    except ValueError:
        doc = {}
    if not isinstance(doc, dict):
        doc = {}
    doc["heads"] = res
    a.out.write_text(json.dumps(doc, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
