#!/usr/bin/env python3
"""Self-speculation from the target's own layers (issue 39) on the real Qwen2.5-Coder-1.5B (28
layers): acceptance and cost per drafted token of early exits at E = 4, 8, 14, 20 and of a few
layer-skip sets, next to the 0.5B draft model and prompt lookup, on the grounded and code suites,
side by side in one run.

One target context; every drafter drafts a fixed length (``--k``, no controller, a drafting
model never stops early) so acceptance is comparable; drafters run interleaved (each round every
drafter runs a different prompt, benchmarks' usual schedule), ``--repeat`` rounds. Each run's
tokens are checked against plain decoding's (lossless). Reported per drafter and suite:
acceptance (accepted / drafted), mean accepted per step, cost per drafted token (ms, and over
the target's one-token pass), and the speed the controller's pricing predicts from that
acceptance on this machine's verify curve and, with ``--curve``, on another machine's (an H200
replay curve: a JSON list of seconds by draft length, or {"verify": [...], "draft_ratio": r}).

    python benchmarks/early_exit_bench.py --repeat 3 --out benchmarks/results/early_exit_bench.json
    python benchmarks/early_exit_bench.py --smoke     # the smallest setting: proves it runs
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from specli.engine import Context, ContextConfig, Model
from specli.hardware import calibrate
from specli.measure.bench import schedule
from specli.measure.suite import load_suite
from specli.prompt import prompt_tokens
from specli.resolve import derive, wheels
from specli.resolve.gguf_header import read_gguf
from specli.speculate.controller import best_length
from specli.speculate.drafters import LookupDrafter, ModelDrafter, NoDrafter
from specli.speculate.loop import generate
from specli.speculate.verify import SamplingParams

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct-q4_k_m", "qwen2.5-coder-0.5b-instruct-q4_k_m"
EXITS = (4, 8, 14, 20)
SKIPS = ("9-18", "7-20", "4,6,8,10,12,14,16,18,20,22")  # middle third, middle half, every other of the middle


def drafters(target: str, cfg: ContextConfig, exits, skips) -> dict[str, object]:
    h = read_gguf(target)
    out: dict[str, object] = {"none": NoDrafter(), "lookup": LookupDrafter(1, 8, min_match=2)}
    specs = [f"early-exit:{e}" for e in exits] + [f"layer-skip:{s}" for s in skips]
    for spec in specs:
        lay = derive.layers_for(derive.parse(spec), h)
        path, _ = derive.derive(target, lay)
        out[lay.label] = ModelDrafter(Model(path), cfg, p_min=0.0)
    out["model-0.5b"] = ModelDrafter(Model(str(wheels.fetch(wheels.BUILTIN[DRAFT]))), cfg, p_min=0.0)
    return out


def run(args) -> dict:
    target = str(wheels.fetch(wheels.BUILTIN[TARGET]))
    cfg = ContextConfig(n_ctx=4096, n_threads=args.threads)
    tm = Model(target)
    ctx = Context(tm, cfg)
    ds = drafters(target, cfg, args.exits, args.skips)
    verify = calibrate.verify_costs(ctx, args.k)
    other = _curve(args.curve)
    report: dict = {"target": TARGET, "k": args.k, "max_tokens": args.max_tokens, "repeat": args.repeat,
                    "verify_curve": verify, "suites": {}}
    for sname in args.suites:
        suite = load_suite(sname)
        prompts = [(p, prompt_tokens(tm, p, True)) for p in suite.prompts[:args.prompts]]
        rows = {m: {"drafted": 0, "accepted": 0, "spec_steps": 0, "t_draft": 0.0, "tokens": 0, "seconds": 0.0,
                    "lossless": []} for m in ds}
        plain: dict[str, list[int]] = {}
        for m, (_, toks) in ((m, prompts[-1]) for m in ds):  # warm-up: each drafter's graphs
            ctx.clear()
            generate(ctx, toks, ds[m], SamplingParams(), 8, args.k)
        for rep in range(args.repeat):
            for i, m in schedule(list(ds), len(prompts)):
                p, toks = prompts[i]
                ctx.clear()
                t0 = time.perf_counter()
                resp = generate(ctx, toks, ds[m], SamplingParams(), args.max_tokens, args.k)
                out = [t for ch in resp for t in ch.tokens]
                st, r = resp.stats, rows[m]
                r["seconds"] += time.perf_counter() - t0
                for key in ("drafted", "accepted", "spec_steps", "t_draft"):
                    r[key] += getattr(st, key)
                r["tokens"] += st.generated
                if m == "none" and rep == 0:
                    plain[p.id] = out
                elif rep == 0:
                    r["lossless"].append((p.id, out))
                print(f"{sname} {rep} {m} {p.id}: {st.generated} tok, {st.accepted}/{st.drafted}", file=sys.stderr)
        costs = {m: d.token_cost() if isinstance(d, ModelDrafter) else 0.0 for m, d in ds.items()}
        report["suites"][sname] = {m: _summary(r, plain, verify, other, args.k, costs[m]) for m, r in rows.items()}
    return report


def _summary(r: dict, plain: dict, verify: list[float], other: dict | None, k: int, per_tok: float) -> dict:
    """``per_tok``: the drafter's calibrated cost of one drafted token (a draft model's single-token
    pass, as the controller prices it); the measured draft time per drafted token (catch-up
    passes included) is reported beside it."""
    acc = r["accepted"] / r["drafted"] if r["drafted"] else 0.0
    out = {"acceptance": acc, "drafted": r["drafted"], "accepted": r["accepted"],
           "mean_accepted": r["accepted"] / r["spec_steps"] if r["spec_steps"] else 0.0,
           "ms_per_drafted_token": 1e3 * per_tok, "draft_over_target_pass": per_tok / verify[0],
           "measured_draft_ms_per_drafted": 1e3 * r["t_draft"] / r["drafted"] if r["drafted"] else 0.0,
           "tokens_per_s": r["tokens"] / r["seconds"] if r["seconds"] else 0.0,
           "lossless": all(plain.get(pid) == toks for pid, toks in r["lossless"])}
    if r["drafted"]:
        kk, rate = best_length(acc, verify, per_tok, k)
        out["priced_here"] = {"k": kk, "speedup": rate * verify[0]}
        if other:
            v = other["verify"]
            kk, rate = best_length(acc, v, other["draft_ratio"] * per_tok / verify[0] * v[0], min(k, len(v) - 1))
            out["priced_replay"] = {"k": kk, "speedup": rate * v[0]}
    return out


def _curve(path: str | None) -> dict | None:
    """Another machine's verify curve; a drafted token costs there what it costs here against
    the target's pass (``draft_ratio`` scales that)."""
    if not path:
        return None
    with open(path) as f:
        d = json.load(f)
    if isinstance(d, list):
        return {"verify": d, "draft_ratio": 1.0}
    # benchmarks/cost_curve.py's files: the verify curve in seconds; the draft ratio stays as measured here
    return {"verify": d["verify"], "draft_ratio": float(d.get("draft_ratio", 1.0))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suites", default="grounded,code")
    ap.add_argument("--prompts", type=int, default=99, help="prompts per suite (the first N)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--k", type=int, default=4, help="fixed draft length")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--curve", help="another machine's verify curve (JSON) to price the acceptance on")
    ap.add_argument("--exits", default=",".join(map(str, EXITS)))
    ap.add_argument("--skips", default=";".join(SKIPS), help="layer-skip sets, ';'-separated")
    ap.add_argument("--smoke", action="store_true", help="one exit, one skip set, one prompt, 16 tokens, once")
    ap.add_argument("--out")
    args = ap.parse_args()
    args.suites = [s for s in args.suites.split(",") if s]
    args.exits = [int(e) for e in args.exits.split(",") if e]
    args.skips = [s for s in args.skips.split(";") if s]
    if args.smoke:
        args.suites, args.prompts, args.max_tokens, args.repeat = args.suites[:1], 1, 16, 1
        args.exits, args.skips = args.exits[2:3], args.skips[:1]
    report = run(args)
    text = json.dumps(report, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    for sname, modes in report["suites"].items():
        print(f"suite {sname}")
        for m, s in modes.items():
            price = s.get("priced_here", {})
            print(f"  {m:28s} acceptance {100 * s['acceptance']:5.1f}%  {s['ms_per_drafted_token']:6.2f} ms/drafted "
                  f"({s['draft_over_target_pass']:.2f}x a target pass)  priced {price.get('speedup', 1):.2f}x "
                  f"(k={price.get('k', 0)})  lossless {s['lossless']}")


if __name__ == "__main__":
    main()
