#!/usr/bin/env python3
"""What copying from earlier answers (``--lookup-history``) adds, replayed on any hardware's
costs, free of timing noise: the repetitive batch workloads of benchmarks/history_bench.py and
a control (the bench's own suites), each replayed in order by specli's adaptive policy over
lookup (and over lookup + the draft model), with history off and on. The traces (the target's
greedy answers and what the draft model would propose) are recorded once and cached, as
research/studies/replay.py records them.

    python -m research.studies.history_replay --costs research/curves/h200-qwen7b-q4km.json \\
        --costs research/curves/this-host-h.json --out research/results/history-replay.md
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from research.lab import replay as rp
from research.lab.policies import specli, speedup
from research.studies.replay import Models, suite_traces

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = [str(ROOT / "benchmarks" / "workloads" / f) for f in ("extract.jsonl", "docstring.jsonl")]
CONTROL = "code,qa,summarise,translation,maths,chat"
BOUNDS = ("0", "256,100k")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct-q4_k_m")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--costs", action="append", default=[], help="a cost-curve JSON file (repeatable)")
    ap.add_argument("--traces", help="read/write traces in DIR (see research/studies/replay.py)")
    ap.add_argument("--out", default=str(ROOT / "research" / "results" / "history-replay.md"))
    a = ap.parse_args()
    ms = Models(a)
    sets = {Path(w).stem: [w] for w in WORKLOADS}
    sets["control"] = CONTROL.split(",")
    traces = {name: [t for s in suites for t in suite_traces(s, ms, a)] for name, suites in sets.items()}
    costs = [rp.Costs.from_file(f) for f in a.costs]
    policies = [specli(("lookup",)), specli(("lookup", "model"))]
    lines = [f"# What earlier answers add, replayed ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
             "    python -m research.studies.history_replay " + " ".join(f"--costs {c}" for c in a.costs), "",
             f"{a.target} (draft {a.draft}), greedy answers of at most {a.max_tokens} tokens, each set replayed in "
             "order (history: the answers of the prompts replayed before); speed-up over plain decoding on each "
             "cost curve.", "",
             "| cost curve | set | prompts | policy | history off | history 256,100k | added |",
             "|---|---|---|---|---|---|---|"]
    for c in costs:
        for name, ts in traces.items():
            for p in policies:
                off, on = (speedup(p, ts, c, history=b) for b in BOUNDS)
                lines.append(f"| {c.name} | {name} | {len(ts)} | {p.name} | {off:.2f}× | {on:.2f}× | {on / off:.2f}× |")
    md = "\n".join(lines) + "\n"
    print(md)
    Path(a.out).write_text(md)


if __name__ == "__main__":
    main()
