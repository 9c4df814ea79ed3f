#!/usr/bin/env python3
"""What the file decides (issue 37's benchmark), in one run on this machine, through the commands
a user types:

1. The all-Q4_0 copy of the target (the same weights, every matrix requantised to Q4_0 by
   llama.cpp's quantizer) is made once, into a local model folder, beside the Q4_K_M file people
   download; the converted draft (``specli convert-draft``) likewise.
2. ``specli check`` on the Q4_K_M file, that folder listed as a local store: the advice line
   (which file it names).
3. ``specli bench --target Q4_K_M --target Q4_0`` on the grounded (rewriting) suite: plain,
   prompt lookup, the draft model and the hybrid, with the shipped draft; then the draft modes
   again with the converted draft. Files interleaved, repeated; each mode over its own file's
   plain; texts checked against plain's.
4. The verify curves predicted from the headers against the measured ones, from
   ``cost_curve.py --predict`` (run it first; this script reads its report).

Writes benchmarks/results/quant_bench.{json,md}. Goals: the advice names the file on which
lookup gains most, and there lookup reaches 1.35x plain, texts identical.

    python benchmarks/quant_bench.py --repeat 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from specli.hardware import kernel_models
from specli.resolve import converted, models

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m"
DRAFT = "qwen2.5-coder-0.5b-instruct-q4_k_m"
GOAL = 1.35


def specli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, check=False)


def bench(targets: list[str], draft: str, modes: str, repeat: int, out: Path) -> dict:
    args = ["bench", "--draft", draft, "--suite", "grounded", "--modes", modes, "--repeat", str(repeat),
            "--json", "--out", str(out)]
    for t in targets:
        args += ["--target", t]
    print("specli " + " ".join(args), flush=True)
    r = specli(*args)
    if r.returncode != 0:
        sys.exit(f"bench failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
    return json.loads(r.stdout)


def per_round(mode: dict, plain: dict) -> list[float]:
    """Each measured round's geometric mean, over the prompts, of the mode's tokens/s over plain's
    on the same prompt: the spread between rounds."""
    out = []
    for r in range(len(next(iter(plain["per_prompt"].values())))):
        ratios = [mode["per_prompt"][p][r] / plain["per_prompt"][p][r] for p in plain["per_prompt"]
                  if plain["per_prompt"][p][r] and p in mode["per_prompt"]]
        out.append(round(statistics.geometric_mean(ratios), 3) if ratios else 0.0)
    return out


def rows(shipped: dict, conv: dict) -> list[dict]:
    out = []
    for fs, fc in zip(shipped["files"], conv["files"], strict=True):
        ms, mc = fs["suites"][0]["modes"], fc["suites"][0]["modes"]
        row = {"file": os.path.basename(fs["file"]), "quant": fs["quant"], "quality": fs["quality_mean_logprob"],
               "predicted": fs["predicted"], "plain": ms["none"]["tokens_per_s"], "modes": {}}
        for name, m, plain in [*((k, v, ms["none"]) for k, v in ms.items() if k != "none"),
                               *((f"{k} (converted draft)", v, mc["none"]) for k, v in mc.items() if k != "none")]:
            same = sum(v == "identical" for v in m["lossless"].values())
            row["modes"][name] = {"tokens_per_s": m["tokens_per_s"], "speedup": m["speedup"],
                                  "rounds": per_round(m, plain),
                                  "acceptance": m["acceptance"], "identical": f"{same}/{len(m['lossless'])}",
                                  "differences": {k: v for k, v in m["lossless"].items() if v != "identical"}}
        out.append(row)
    return out


def markdown(data: dict) -> str:
    r = data["rows"]
    modes = list(r[0]["modes"])
    out = [f"# What the file decides: Q4_K_M vs all-Q4_0 ({data['date']})", "",
           f"Machine: {data['machine']}. Grounded (rewriting) suite, {data['repeat']} measured rounds, files "
           "interleaved, greedy; every ratio is over that file's own plain decoding in the same run "
           "(the converted-draft rows come from a second run, with its own plain baseline). Each cell: "
           "tokens/s (over plain, whole run; the range of the rounds' per-prompt geometric means; texts "
           "identical to plain's).", "",
           "    " + data["command"], "",
           "| file | plain tok/s | " + " | ".join(modes) + " | predicted verify 4 / 8 | quality (mean logprob) |",
           "|---|---|" + "---|" * len(modes) + "---|---|"]
    for row in r:
        p = row["predicted"]
        cells = [f"{m['tokens_per_s']:.1f} ({m['speedup']:.2f}×; rounds {min(m['rounds']):.2f}–"
                 f"{max(m['rounds']):.2f}×; {m['identical']} same)" for m in row["modes"].values()]
        out.append(f"| {row['file']} | {row['plain']:.1f} | " + " | ".join(cells)
                   + (f" | {p['verify_4']:.1f}× / {p['verify_8']:.1f}×" if p else " | —")
                   + f" | {row['quality']:.3f} |")
    out += ["", f"Quality: the mean log-probability per token that {data['reference']} gives each file's greedy "
            "answers to the shipped sample (closer to 0 is better).", "",
            "Advice (`specli check` on the Q4_K_M file, the Q4_0 copy in a local store):", "",
            f"> {data['advice'] or '(none)'}", "", "## Goals", ""]
    out += [f"- {g}" for g in data["goals"]]
    diffs = [(row["file"], m, k, v) for row in r for m, d in row["modes"].items() for k, v in d["differences"].items()]
    if diffs:
        out += ["", "## Texts that parted from plain", ""]
        out += [f"- {f}, {m}, `{k}`: {v}" for f, m, k, v in diffs]
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--folder", default=os.path.expanduser("~/.cache/specli/bench-files"),
                    help="the local model folder the Q4_0 copy is made in")
    ap.add_argument("--render", action="store_true", help="write the report again from the last run's JSON")
    a = ap.parse_args()
    if a.render:
        data = json.loads((RESULTS / "quant_bench.json").read_text())
        shipped = json.loads((RESULTS / "quant_bench-shipped.json").read_text())
        conv_run = json.loads((RESULTS / "quant_bench-converted.json").read_text())
        data["rows"] = rows(shipped, conv_run)
        (RESULTS / "quant_bench.json").write_text(json.dumps(data, indent=1))
        (RESULTS / "quant_bench.md").write_text(markdown(data))
        return
    km = models.resolve(TARGET, progress=print)
    draft = models.resolve(DRAFT, progress=print)
    folder = Path(a.folder)
    folder.mkdir(parents=True, exist_ok=True)
    q40 = folder / "qwen2.5-coder-1.5b-instruct-q4_0-pure.gguf"
    if not q40.exists():
        kernel_models.quantize(Path(km), q40, "Q4_0")
    conv, _ = converted.convert(draft, progress=print)
    adv = specli("check", km, env={"SPECLI_MODEL_DIRS": str(folder)})
    advice = next((line.removeprefix("specli: note: ") for line in adv.stderr.splitlines() if "--target" in line), "")
    targets = [km, str(q40)]
    shipped = bench(targets, draft, "none,lookup,model,hybrid", a.repeat, RESULTS / "quant_bench-shipped.json")
    conv_run = bench(targets, str(conv), "none,model,hybrid", a.repeat, RESULTS / "quant_bench-converted.json")
    r = rows(shipped, conv_run)
    best = max(r, key=lambda row: row["modes"]["lookup"]["speedup"])
    named = best["file"] in advice
    look = best["modes"]["lookup"]
    goals = [f"advice names the file on which lookup gains most ({best['file']}, lookup "
             f"{look['speedup']:.2f}×): {'met' if named else 'NOT met'}",
             f"lookup on that file ≥ {GOAL}× plain: {look['speedup']:.2f}×, "
             f"{'met' if look['speedup'] >= GOAL else 'NOT met'}; texts identical: {look['identical']}"]
    data = {"date": time.strftime("%Y-%m-%d %H:%M"), "repeat": a.repeat,
            "machine": f"{os.cpu_count()} threads, {shipped['files'][0]['suites'][0]['threads']} used",
            "command": "python benchmarks/quant_bench.py " + " ".join(sys.argv[1:]),
            "reference": os.path.basename(shipped["quality"]["reference"]) if shipped.get("quality") else "—",
            "advice": advice, "rows": r, "goals": goals}
    (RESULTS / "quant_bench.json").write_text(json.dumps(data, indent=1))
    (RESULTS / "quant_bench.md").write_text(markdown(data))
    print(markdown(data))


if __name__ == "__main__":
    main()
