#!/usr/bin/env python3
"""How fast can prompt lookup make this target on this machine, at best?

For each greedy prompt of the suites it takes the target's own output (plain decoding) and the
measured verify cost curve, then computes, without timing noise:

- **clairvoyant bound**: the fastest any drafter that copies verbatim from the context could
  be, one that knows the future: at every position it may copy from *any* earlier occurrence
  of the last token (prompt or output) and picks the draft length that minimises the total
  verify cost of the whole answer (dynamic programming over the exact agreement lengths).
  specli's lookup also applies renames it has seen twice, which a verbatim copy cannot;
- **adaptive (replayed)**: specli's own lookup drafter and cost-aware controller, replayed over
  the same tokens with the same costs (what `--draft lookup` would gain if timings were exact);
- **fixed (replayed)**: lookup drafting `--draft-max` tokens whenever it has a match;
- **perfect drafts**: the best (k + 1) / cost[k], the ceiling if every draft were right.

    python benchmarks/lookup_bound.py [--suites grounded,code,chat] [--out docs/lookup-bound.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from typing import Sequence

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from specli.engine import Context, ContextConfig, Model, system_info  # noqa: E402
from specli.hardware import calibrate
from specli.measure.suite import load_suite  # noqa: E402
from specli.prompt import build_prompt  # noqa: E402
from specli.resolve import models  # noqa: E402
from specli.speculate.adaptive import AdaptiveDrafter
from specli.speculate.controller import Controller, CostModel  # noqa: E402
from specli.tokens import common_prefix  # noqa: E402
from specli.speculate.drafters import NONE, Draft, LookupDrafter, NoDrafter  # noqa: E402
from specli.speculate.loop import generate  # noqa: E402
from specli.speculate.verify import SamplingParams, greedy_accept  # noqa: E402


def agreement(prompt: Sequence[int], out: Sequence[int], k_max: int) -> list[int]:
    """agree[i]: the most tokens of out[i:] (at most k_max) that a copy from any earlier
    occurrence of the token before out[i] reproduces; 0 for i = 0 (the prefill's token)."""
    full = list(prompt) + list(out)
    agree = [0] * len(out)
    for i in range(1, len(out)):
        pos = len(prompt) + i
        best = 0
        for j in range(pos - 1):
            if full[j] != full[pos - 1]:
                continue
            best = max(best, common_prefix(full[j + 1:j + 1 + k_max], full[pos:]))
        agree[i] = best
    return agree


def min_cost(agree: Sequence[int], costs: Sequence[float]) -> float:
    """Least total verify cost to emit out[1:], drafting k <= len(costs) - 1 tokens a step,
    when a draft at position i is accepted up to agree[i] tokens."""
    n = len(agree)
    best = [0.0] * (n + 1)
    for i in range(n - 1, 0, -1):
        b = costs[0] + best[i + 1]
        for k in range(1, min(len(costs) - 1, n - 1 - i) + 1):
            b = min(b, costs[k] + best[min(n, i + min(k, agree[i]) + 1)])
        best[i] = b
    return best[1] if n > 1 else 0.0


def replay(prompt: Sequence[int], out: Sequence[int], drafter, costs: Sequence[float]) -> float:
    """Total verify cost of ``drafter`` emitting out[1:] (greedy: the target's tokens are
    known), charging costs[k] per step and telling the drafter what a step took."""
    ctx = list(prompt) + [out[0]]
    i, n, total = 1, len(out), 0.0
    k_cap = len(costs) - 1
    while i < n:
        k_max = max(0, min(k_cap, n - 1 - i))
        d = drafter.propose(ctx, k_max) if k_max else Draft([])
        toks = d.tokens[:k_max]
        a, _ = greedy_accept(toks, out[i:i + len(toks) + 1])  # the target's tokens are out's
        total += costs[len(toks)]
        drafter.observe(Draft(toks, d.source if toks else NONE, d.confidence), a, out[i:i + a + 1], 0.0,
                        costs[len(toks)])
        ctx += out[i:i + a + 1]
        i += a + 1
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--suites", default="grounded,code,chat")
    ap.add_argument("--draft-max", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "docs", "lookup-bound.md"))
    a = ap.parse_args()
    m = Model(models.resolve(a.target, progress=print))
    ctx = Context(m, ContextConfig(n_ctx=4096, n_threads=a.threads))
    costs = calibrate.verify_costs(ctx, a.draft_max, reps=5, use_cache=False)
    K = a.draft_max
    perfect = max((k + 1) / (costs[k] / costs[0]) for k in range(K + 1))
    rows = []
    for name in a.suites.split(","):
        suite = load_suite(name)
        agg = [0.0, 0.0, 0.0, 0.0]  # plain, bound, adaptive, fixed (costs)
        for p in suite.prompts:
            if p.temperature:
                continue
            prompt = build_prompt(m, p.text, m.chat_template() is not None)
            ctx.clear()
            out = [t for ch in generate(ctx, prompt, NoDrafter(), SamplingParams(), p.max_tokens or a.max_tokens, 0)
                   for t in ch.tokens]
            if len(out) < 2:
                continue
            ctl = Controller(CostModel(list(costs)), k_max=K)
            r = [costs[0] * (len(out) - 1), min_cost(agreement(prompt, out, K), costs),
                 replay(prompt, out, AdaptiveDrafter(ctl, LookupDrafter()), costs),
                 replay(prompt, out, LookupDrafter(), costs)]
            agg = [x + y for x, y in zip(agg, r)]
            print(f"{name}/{p.id}: {len(out)} tokens, bound {r[0] / r[1]:.2f}x, adaptive {r[0] / r[2]:.2f}x, "
                  f"fixed {r[0] / r[3]:.2f}x", flush=True)
        rows.append((name, agg[0] / agg[1], agg[0] / agg[2], agg[0] / agg[3]))
    cmd = "python benchmarks/lookup_bound.py " + " ".join(sys.argv[1:])
    lines = [
        "# Prompt lookup: replayed speed and the clairvoyant bound", "",
        f"Command: `{cmd.strip()}`  ", f"Machine: {platform.machine()}, {a.threads} threads, "
        f"`{system_info()}`  ", f"Target: `{os.path.basename(m.path)}`, one token {costs[0] * 1000:.1f} ms, "
        f"draft length up to {K}; perfect drafts would allow {perfect:.2f}×  ",
        "Verify cost over one token, by block size (k + 1): "
        + ", ".join(f"{k + 1}: {costs[k] / costs[0]:.2f}" for k in calibrate.measured_points(K)), "",
        "Speedups over plain decoding in verify-cost units (the measured cost curve, no timing noise); "
        "see benchmarks/lookup_bound.py for the definitions.", "",
        "| suite | specli adaptive lookup (replayed) | fixed lookup (replayed) | clairvoyant bound |",
        "|---|---|---|---|"]
    lines += [f"| {n} | {ad:.2f}× | {fx:.2f}× | {b:.2f}× |" for n, b, ad, fx in rows]
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines[-len(rows) - 2:]))
    print(f"report: {a.out}")


if __name__ == "__main__":
    main()
