"""Does the converted draft pay? The shipped draft model and its copy requantised to one type
(specli convert-draft, Q4_0 by default), side by side in one run with the same target.

1. The drafts' one-token pass in target one-token passes, measured (interleaved, medians) and
   predicted from the headers with this machine's kernel table (when measured: specli doctor
   --kernels).
2. A prompt suite (grounded, rewriting, by default) in each mode with each draft: plain, then
   each draft mode (``model-fixed``, ``hybrid``; ``--modes``) with the shipped and with the converted
   draft. Modes and drafts interleaved, the order rotated per prompt and round, so a busy
   neighbour slows them alike. Every text must be plain's (lossless check at temperature 0).

    python benchmarks/draft_convert_bench.py --profile default --repeat 2 \\
        --out benchmarks/results/draft_convert.json --md benchmarks/results/draft_convert.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from specli.engine import Context, ContextConfig, Model
from specli.hardware import calibrate, draft_offer
from specli.measure.lossless import divergence
from specli.measure.suite import load_suite
from specli.resolve import converted, models, profiles
from specli.resolve.gguf_header import read_gguf
from specli.session import Options, Session
from specli.speculate.drafters import NoDrafter
from specli.speculate.settings import SpecSettings
from specli.speculate.verify import SamplingParams


def _args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="default")
    ap.add_argument("--target", default=None)
    ap.add_argument("--draft", default=None, help="the shipped draft (default: the profile's)")
    ap.add_argument("--type", default=converted.DEFAULT_TYPE)
    ap.add_argument("--suite", default="grounded")
    ap.add_argument("--prompts", type=int, default=0, help="only the first N prompts (0: all)")
    ap.add_argument("--modes", default="model-fixed,hybrid")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--passes", type=int, default=20, help="timed one-token passes per model and round")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--md", default=None)
    return ap.parse_args()


def pass_times(paths: dict[str, str], threads: int, n: int, rounds: int = 3) -> dict[str, float]:
    """Median seconds of a one-token pass (at depth 64) of each model, interleaved."""
    models = {k: Model(p) for k, p in paths.items()}
    ctxs = {k: Context(m, ContextConfig(n_ctx=512, n_threads=threads)) for k, m in models.items()}
    times: dict[str, list[float]] = {k: [] for k in paths}
    for _ in range(rounds):
        for k, ctx in ctxs.items():
            ctx.clear()
            ctx.eval(models[k].tokenize("word " * 63), "none")
            ctx.eval([models[k].tokenize(" the")[-1]])  # warm-up
            for _ in range(n):
                t0 = time.perf_counter()
                ctx.eval([models[k].tokenize(" the")[-1]])
                times[k].append(time.perf_counter() - t0)
                ctx.rollback(ctx.n_past - 1)
    for k in ctxs:
        ctxs[k].close()
        models[k].close()
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> int:
    a = _args()
    threads = a.threads or os.cpu_count() or 1
    draft = a.draft
    if draft is None and not a.target:  # the profile's own draft file (auto would take its converted copy)
        prof = profiles.get(a.profile)
        draft = models.resolve_spec(prof.draft_models[0], progress=print) if prof.draft_models else None
    base = Options(target=a.target, draft=draft or "auto", profile=None if a.target else a.profile,
                   threads=threads, spec=SpecSettings())
    shipped = Session(base, build_drafter=False)
    src = shipped.draft_path
    if not src or os.path.dirname(os.path.realpath(src)) == os.path.realpath(converted.folder()):
        print("no shipped draft model to compare (give --draft FILE)", file=sys.stderr)
        return 2
    copy, made = converted.convert(src, a.type, threads, lambda s: print(s, file=sys.stderr))
    print(f"{'made' if made else 'reusing'} {copy}", file=sys.stderr)
    conv = Session(Options(target=shipped.target.path, draft=str(copy), threads=threads, spec=SpecSettings()),
                   build_drafter=False)
    tpath = shipped.target.path
    passes = pass_times({"target": tpath, "shipped": src, "converted": str(copy)}, threads, a.passes)
    table = calibrate.kernel_table()
    pred = {k: draft_offer.draft_cost(read_gguf(p), table, read_gguf(tpath), a.type) for k, p in
            (("shipped", src),)}
    suite = load_suite(a.suite)
    prompts = suite.prompts[:a.prompts] if a.prompts else suite.prompts
    runs = ["plain"] + [f"{m}/{d}" for m in a.modes.split(",") for d in ("shipped", "converted")]
    toks = {p.id: shipped.prompt_tokens(p.text) for p in prompts}

    def one(run: str, pid: str, n: int) -> dict:
        mode, _, which = run.partition("/")
        sess = conv if which == "converted" else shipped
        sess.ctx.clear()
        d = NoDrafter() if mode == "plain" else sess.drafter_for(mode)
        resp = sess.generate(toks[pid], SamplingParams(), n, d, history=None)  # never the earlier runs' answers
        out = [t for ch in resp for t in ch.tokens]
        st = resp.stats
        d.close()
        return {"tokens": out, "n": st.generated, "s": st.t_generate, "drafted": st.drafted, "accepted": st.accepted}

    for r in runs:  # warm-up
        one(r, prompts[0].id, 16)
    results: dict[str, dict[str, list[dict]]] = {r: {} for r in runs}
    for rnd in range(a.repeat):
        for i, p in enumerate(prompts):
            k = (i + rnd) % len(runs)
            for r in runs[k:] + runs[:k]:
                res = one(r, p.id, a.max_tokens)
                results[r].setdefault(p.id, []).append(res)
                print(f"round {rnd} {p.id:<16} {r:<20} {res['n']:4d} tok {res['n'] / res['s']:6.2f} tok/s",
                      file=sys.stderr, flush=True)
    report = _report(a, shipped, results, toks, passes, pred, tpath, src, str(copy))
    shipped.close()
    conv.close()
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1))
    md = render(report)
    if a.md:
        Path(a.md).write_text(md)
    print(md)
    return 0


def _report(a, sess, results, toks, passes, pred, tpath, src, copy) -> dict:
    summary, checks = {}, {}
    for r, by in results.items():
        rs = [x for v in by.values() for x in v]
        n, s = sum(x["n"] for x in rs), sum(x["s"] for x in rs)
        summary[r] = {"tokens": n, "seconds": s, "tokens_per_s": n / s if s else 0.0,
                      "drafted": sum(x["drafted"] for x in rs), "accepted": sum(x["accepted"] for x in rs)}
        bad = []
        for pid, v in by.items():
            ref = results["plain"][pid][0]["tokens"]
            for x in v:
                d = divergence(sess.ctx, toks[pid], ref, x["tokens"])
                if d is not None or len(x["tokens"]) != len(ref):
                    bad.append(f"{pid}: {d.describe() if d else 'a prefix'}")
        checks[r] = "identical" if not bad else "; ".join(dict.fromkeys(bad))  # a difference once, not per round
    for r in summary:
        summary[r]["vs_plain"] = summary[r]["tokens_per_s"] / summary["plain"]["tokens_per_s"]
    p = pred["shipped"]
    return {"command": "python " + " ".join(sys.argv), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "target": tpath, "draft": src, "converted": copy, "type": a.type, "suite": a.suite,
            "repeat": a.repeat, "max_tokens": a.max_tokens,
            "draft_pass_measured": {"shipped": passes["shipped"] / passes["target"],
                                    "converted": passes["converted"] / passes["target"],
                                    "target_ms": passes["target"] * 1000},
            "draft_pass_predicted": p.to_json() if p else None, "summary": summary, "checks": checks}


def render(rep: dict) -> str:
    m, p = rep["draft_pass_measured"], rep["draft_pass_predicted"]
    lines = [f"Converted draft benchmark, {rep['when']}: target {os.path.basename(rep['target'])}, draft "
             f"{os.path.basename(rep['draft'])} as shipped and as {rep['type']}; suite {rep['suite']}, "
             f"{rep['repeat']} rounds, greedy, up to {rep['max_tokens']} tokens, interleaved.", "",
             f"    {rep['command']}", "",
             "| draft | one-token pass, in target passes (measured) | predicted |", "|---|---|---|",
             f"| shipped | {m['shipped']:.2f} | {p['shipped'] if p else 'no kernel table'} |",
             f"| {rep['type']} | {m['converted']:.2f} | {p['converted'] if p else 'no kernel table'} |", "",
             f"(target one-token pass: {m['target_ms']:.1f} ms)", "",
             "| mode / draft | tok/s | vs plain | drafted | accepted | text |", "|---|---|---|---|---|---|"]
    for r, s in rep["summary"].items():
        lines.append(f"| {r} | {s['tokens_per_s']:.2f} | {s['vs_plain']:.2f}x | {s['drafted']} | {s['accepted']} "
                     f"| {rep['checks'][r]} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
