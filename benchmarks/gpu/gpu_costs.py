#!/usr/bin/env python3
"""Measure, with specli's own calibration code, what the synthetic models of
``synth_models.py`` cost on this machine, and write a cost-curve file:

    {"verify": [seconds for a block of k + 1 tokens, k = 0..K],   # the target, calibrate.verify_costs
     "draft_token": seconds,                                      # the draft, calibrate.draft_token_cost
     "machine": "...", "model": "...", "draft_model": "...", "k_max": K, "details": {...}}

``details`` holds what else was measured: the draft's own verify curve, the draft's per-token
cost on the CPU (n_gpu_layers 0), load times, llama.cpp's system info.

    python benchmarks/gpu/gpu_costs.py --models DIR --out gpu-costs.json [--gpu-layers -1] [--k-max 32]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]

import gpu_offload  # noqa: E402,F401  (SPECLI_GPU_MODEL_PARAMS: the loading variant run.sh found to work)

from specli.engine import Context, ContextConfig, Model, supports_gpu_offload, system_info  # noqa: E402
from specli.hardware import calibrate  # noqa: E402


def _load(path: str, layers: int, threads: int, n_ctx: int) -> tuple[Model, Context, float]:
    t = time.perf_counter()
    m = Model(path, n_gpu_layers=layers)
    ctx = Context(m, ContextConfig(n_ctx=n_ctx, n_threads=threads))
    return m, ctx, time.perf_counter() - t


def _ms(xs: list[float]) -> str:
    return " ".join(f"{x * 1000:.2f}" for x in xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=Path, required=True, help="the folder synth_models.py wrote")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--gpu-layers", type=int, default=-1)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--k-max", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--machine", default="")
    ap.add_argument("--skip-cpu-draft", action="store_true", help="do not time the draft on the CPU too")
    a = ap.parse_args()

    manifest = json.loads((a.models / "models.json").read_text())
    tinfo, dinfo = manifest["target"], manifest["draft"]
    result = {"verify": None, "draft_token": None,
              "machine": a.machine or system_info(),
              "model": f"synthetic {tinfo['shape']} Q4_K_M (random weights), n_gpu_layers={a.gpu_layers}",
              "draft_model": f"synthetic {dinfo['shape']} Q4_K_M (random weights), n_gpu_layers={a.gpu_layers}",
              "k_max": a.k_max,
              "details": {"gpu_offload_supported": supports_gpu_offload(), "system_info": system_info(),
                          "threads": a.threads, "n_ctx": a.n_ctx, "reps": a.reps,
                          "measured_points": calibrate.measured_points(a.k_max), "shapes": manifest}}

    def save() -> None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=1))

    det = result["details"]
    m, ctx, det["target_load_s"] = _load(tinfo["path"], a.gpu_layers, a.threads, a.n_ctx)
    t = time.perf_counter()
    result["verify"] = calibrate.verify_costs(ctx, a.k_max, reps=a.reps, use_cache=False)
    det["target_verify_s"] = time.perf_counter() - t
    print(f"target {tinfo['shape']}: loaded in {det['target_load_s']:.1f} s, curve in {det['target_verify_s']:.1f} s")
    print(f"  verify ms, k=0..{len(result['verify']) - 1}: {_ms(result['verify'])}", flush=True)
    save()
    ctx.close()
    m.close()

    m, ctx, det["draft_load_s"] = _load(dinfo["path"], a.gpu_layers, a.threads, a.n_ctx)
    result["draft_token"] = calibrate.draft_token_cost(ctx, reps=16, use_cache=False)
    det["draft_verify"] = calibrate.verify_costs(ctx, a.k_max, reps=a.reps, use_cache=False)
    print(f"draft {dinfo['shape']}: one token {result['draft_token'] * 1000:.2f} ms; "
          f"its own verify ms: {_ms(det['draft_verify'])}", flush=True)
    save()
    ctx.close()
    m.close()

    if not a.skip_cpu_draft and a.gpu_layers != 0:
        m, ctx, _ = _load(dinfo["path"], 0, a.threads, a.n_ctx)
        det["draft_token_cpu"] = calibrate.draft_token_cost(ctx, reps=16, use_cache=False)
        print(f"draft on the CPU ({a.threads} threads): one token {det['draft_token_cpu'] * 1000:.2f} ms", flush=True)
        save()
        ctx.close()
        m.close()
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
