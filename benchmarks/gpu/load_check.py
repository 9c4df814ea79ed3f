#!/usr/bin/env python3
"""Does a model load fully offloaded and decode here? Used by run.sh before it measures, and run
once per loading variant (environment variables) until one works, so that one crash in
llama.cpp's loader does not cost the whole run. Exit 0 and one line on success.

    python benchmarks/gpu/load_check.py MODEL.gguf [--gpu-layers -1] [--llama-cpp]

Variants are set in the environment: SPECLI_GPU_MODEL_PARAMS (see gpu_offload.py),
SPECLI_LLAMA_LOG=1 (llama.cpp logs to stderr instead of specli's callback), GGML_CUDA_NO_PINNED=1.
--llama-cpp loads it with llama-cpp-python's own ``Llama`` class instead of specli's engine.
"""

from __future__ import annotations

import argparse
import faulthandler
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE)]
faulthandler.enable()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--gpu-layers", type=int, default=-1)
    ap.add_argument("--llama-cpp", action="store_true")
    a = ap.parse_args()
    t = time.perf_counter()
    if a.llama_cpp:
        from llama_cpp import Llama
        llm = Llama(a.model, n_gpu_layers=a.gpu_layers, n_ctx=512, verbose=True)
        out = llm.create_completion("The", max_tokens=8, temperature=0.0)
        print(f"load_check: llama_cpp.Llama OK in {time.perf_counter() - t:.1f} s: {out['usage']}")
        return
    import gpu_offload  # noqa: F401  (applies SPECLI_GPU_MODEL_PARAMS)

    from specli.engine import Context, ContextConfig, Model

    m = Model(a.model, n_gpu_layers=a.gpu_layers)
    print(f"load_check: loaded in {time.perf_counter() - t:.1f} s", flush=True)
    ctx = Context(m, ContextConfig(n_ctx=512))
    toks = [m.bos if m.bos >= 0 else 0]
    for _ in range(8):
        toks.append(int(ctx.eval(toks[-1:])[-1].argmax()))
    print(f"load_check: OK, decoded {toks[1:]} in {time.perf_counter() - t:.1f} s")


if __name__ == "__main__":
    main()
