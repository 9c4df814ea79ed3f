#!/usr/bin/env python3
"""specli's plain decoding loop against the barest possible loop over the same llama.cpp
context (one llama_decode and one argmax per token, no bookkeeping), alternated in one
process: what the Python around llama.cpp costs.

    python -m research.studies.loop_overhead [--target REF] [--tokens 96] [--rounds 4]
"""

from __future__ import annotations

import argparse
import statistics
import time

import llama_cpp as L
import numpy as np

from specli.engine import Context, ContextConfig, Model
from specli.resolve import models
from specli.speculate.drafters import NoDrafter
from specli.speculate.loop import generate
from specli.speculate.verify import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=4)
    a = ap.parse_args()
    m = Model(models.resolve(a.target, progress=print))
    c = Context(m, ContextConfig(n_ctx=4096))
    prompt = m.tokenize("word " * 127)

    def specli_loop() -> float:
        c.clear()
        resp = generate(c, prompt, NoDrafter(), SamplingParams(), a.tokens, 0)
        for _ in resp:
            pass
        st = resp.stats
        return st.tokens_per_s

    def bare_loop() -> float:
        c.clear()
        c.eval(prompt, "none")
        tok = 100
        t = time.perf_counter()
        for _ in range(a.tokens - 1):
            L.llama_decode(c.handle, L.llama_batch_get_one((L.llama_token * 1)(tok), 1))
            tok = int(np.ctypeslib.as_array(L.llama_get_logits_ith(c.handle, -1), shape=(m.n_vocab,)).argmax())
        return (a.tokens - 1) / (time.perf_counter() - t)

    ours, bare = [], []
    for _ in range(a.rounds):
        ours.append(specli_loop())
        bare.append(bare_loop())
    print(f"specli loop {statistics.median(ours):.1f} tok/s ({', '.join(f'{x:.1f}' for x in ours)}); "
          f"bare loop {statistics.median(bare):.1f} tok/s ({', '.join(f'{x:.1f}' for x in bare)}); "
          f"ratio {statistics.median(ours) / statistics.median(bare):.3f}")


if __name__ == "__main__":
    main()
