#!/usr/bin/env python3
"""specli's speed report: every figure a ratio measured side by side in one run.

1. Plain decoding overhead: specli's plain loop vs llama.cpp's own C++ (`llama-bench`, token
   generation at the same depth and thread count), when the binary is given.
2. Each prompt suite in each mode (plain, prompt lookup, draft model, hybrid, and the fixed
   draft-length variants), with the lossless check at temperature 0.
3. llama.cpp's own fixed-setting draft speculation (`llama-speculative-simple`) and n-gram
   lookup (`llama-lookup`) on the same prompts, when the binaries are given.

Writes a Markdown report (default benchmarks/results/benchmark-report.md) and the raw JSON beside it.

    python benchmarks/run_benchmarks.py --llama-cpp-bin /path/to/llama.cpp/build/bin
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time

from specli.engine import Context, ContextConfig, Model, system_info
from specli.measure.bench import run_bench
from specli.measure.report import markdown
from specli.measure.suite import load_suite
from specli.prompt import build_prompt
from specli.resolve import models
from specli.session import Options, Session
from specli.speculate.drafters import NoDrafter
from specli.speculate.loop import generate
from specli.speculate.settings import SpecSettings
from specli.speculate.verify import SamplingParams


def plain_vs_llama_bench(target: str, bindir: str | None, threads: int, n: int = 128, depth: int = 128,
                         rounds: int = 5) -> dict:
    """specli's plain loop and llama-bench's token generation (tg{n} at depth {depth}, same
    threads), interleaved round by round so both see the same machine; medians."""
    import statistics

    m = Model(target)
    ctx = Context(m, ContextConfig(n_ctx=4096, n_threads=threads))
    prompt = m.tokenize("word " * (depth - 1))
    exe = os.path.join(bindir, "llama-bench") if bindir else None
    have_bench = bool(exe and os.path.exists(exe))
    ours, theirs = [], []
    for _ in range(rounds):
        ctx.clear()
        resp = generate(ctx, prompt, NoDrafter(), SamplingParams(), n, 0)
        for _ch in resp:
            pass
        st = resp.stats
        ours.append(st.tokens_per_s)
        if have_bench:
            r = subprocess.run([exe, "-m", target, "-p", "0", "-n", str(n), "-d", str(len(prompt)), "-t",
                                str(threads), "-r", "1", "-o", "json"], capture_output=True, text=True)
            theirs.append(float(json.loads(r.stdout)[0]["avg_ts"]))
    ctx.close()
    out = {"specli_plain_tok_s": statistics.median(ours), "depth": len(prompt), "tokens": n, "rounds": rounds,
           "specli_runs": ours}
    if have_bench:
        out.update(llama_bench_tok_s=statistics.median(theirs), llama_bench_runs=theirs,
                   ratio=statistics.median(ours) / statistics.median(theirs))
    return out


def llama_cpp_speculative(bindir: str, target: str, draft: str, suite, threads: int, n: int, chat_prompts) -> dict:
    """llama.cpp's fixed-setting draft speculation and n-gram lookup, on the same prompt text
    (rendered with the same chat template), with their default settings."""
    res = {}
    for name, exe_name, extra in (("llama.cpp speculative-simple (draft model)", "llama-speculative-simple",
                                   ["-md", draft, "--spec-type", "draft-simple"]),
                                  ("llama.cpp lookup (n-gram)", "llama-lookup", [])):
        exe = os.path.join(bindir, exe_name)
        if not os.path.exists(exe) or (extra and not draft):
            continue
        tokens = secs = 0.0
        for text in chat_prompts:
            r = subprocess.run([exe, "-m", target, *extra, "-p", text, "-n", str(n), "-t", str(threads),
                                "--temp", "0", "-c", "4096", "-s", "1"],
                               capture_output=True, text=True)
            log = r.stdout + r.stderr
            m = re.search(r"decoded\s+(\d+)\s+tokens in\s+([\d.]+) s", log)
            if m:
                tokens += int(m.group(1))
                secs += float(m.group(2))
        if secs:
            res[name] = tokens / secs
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct-q4_k_m")
    ap.add_argument("--suites", default="grounded,code,chat,unpredictable")
    ap.add_argument("--modes", default="none,lookup,model,hybrid,lookup-fixed,model-fixed",
                    help="add llama-cpp-python-lookup to time llama-cpp-python's LlamaPromptLookupDecoding")
    ap.add_argument("--llama-cpp-suites", default="grounded,code",
                    help="suites on which llama.cpp's own speculation tools are timed")
    ap.add_argument("-n", "--max-tokens", type=int, default=128)
    ap.add_argument("--draft-max", type=int, default=16)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--gpu-layers", type=int, default=None, help="default: the hardware plan")
    ap.add_argument("--llama-cpp-bin", default=os.environ.get("LLAMA_CPP_BIN"),
                    help="folder with llama.cpp's llama-bench, llama-speculative-simple, llama-lookup")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "benchmark-report.md"))
    a = ap.parse_args()

    target = models.resolve(a.target, progress=print)
    draft = models.resolve(a.draft, progress=print) if a.draft not in ("none", "") else None
    started = time.strftime("%Y-%m-%d %H:%M")
    cmd = "python benchmarks/run_benchmarks.py " + " ".join(sys.argv[1:])
    print("plain decoding vs llama-bench ...", flush=True)
    overhead = plain_vs_llama_bench(target, a.llama_cpp_bin, a.threads)
    print(overhead, flush=True)
    reports = []
    theirs = {}
    sess = Session(Options(target=target, draft=draft or "lookup", n_ctx=4096, threads=a.threads,
                           gpu_layers=a.gpu_layers, spec=SpecSettings(draft_max=a.draft_max)), build_drafter=False)
    for s in a.suites.split(","):
        suite = load_suite(s)
        print(f"suite {s} ...", flush=True)
        rep = run_bench(sess, suite, a.modes.split(","), a.max_tokens, 1)
        reports.append(rep)
        if a.llama_cpp_bin and s in a.llama_cpp_suites.split(","):
            m = Model(target, vocab_only=True)
            texts = [m.detokenize(build_prompt(m, p.text, True), special=True) for p in suite.prompts]
            theirs[s] = llama_cpp_speculative(a.llama_cpp_bin, target, draft, suite, a.threads, a.max_tokens, texts)
            if theirs[s] and "none" in rep.results:
                base = rep.results["none"].tokens_per_s
                theirs[s] = {k: {"tok_s": v, "vs_specli_plain": v / base} for k, v in theirs[s].items()}
        print(markdown([rep]), flush=True)

    lines = ["# Benchmark report\n", f"Run {started} on {platform.machine()}, {a.threads} threads; "
             f"llama.cpp: `{system_info()}`\n", f"Command: `{cmd}`\n", f"Target `{os.path.basename(target)}`, "
             f"draft `{os.path.basename(draft) if draft else '-'}`, {a.max_tokens} tokens per prompt, temperature "
             f"per prompt (0 unless the suite says otherwise).\n", "## Plain decoding overhead\n"]
    if "ratio" in overhead:
        lines.append(f"specli plain {overhead['specli_plain_tok_s']:.1f} tok/s vs llama-bench "
                     f"{overhead['llama_bench_tok_s']:.1f} tok/s (tg{overhead['tokens']} at depth "
                     f"{overhead['depth']}, medians of {overhead['rounds']} interleaved rounds): "
                     f"**{overhead['ratio']:.3f}×**; runs: specli "
                     + ", ".join(f"{x:.1f}" for x in overhead["specli_runs"]) + "; llama-bench "
                     + ", ".join(f"{x:.1f}" for x in overhead["llama_bench_runs"]) + "\n")
    else:
        lines.append(f"specli plain {overhead['specli_plain_tok_s']:.1f} tok/s (no llama-bench given)\n")
    lines.append("## Suites\n")
    lines.append("speedup = the mode's tokens/s over plain decoding's, same target, same process. "
                 "'same text' = prompts at temperature 0 whose tokens equal plain decoding's.\n")
    lines.append(markdown(reports))
    if theirs:
        lines.append("## llama.cpp's own speculation on the same prompts\n")
        lines.append("| suite | tool | tok/s | vs specli plain |\n|---|---|---|---|")
        for s, d in theirs.items():
            for k, v in d.items():
                lines.append(f"| {s} | {k} | {v['tok_s']:.1f} | {v['vs_specli_plain']:.2f}× |")
        lines.append("")
    out = os.path.abspath(a.out)
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.splitext(out)[0] + ".json", "w") as f:
        json.dump({"overhead": overhead, "suites": [r.to_dict() for r in reports], "llama_cpp": theirs}, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
