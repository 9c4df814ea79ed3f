#!/usr/bin/env python3
"""What a calibration taken at another speed costs: specli's controller handed a cost curve
``drift`` times the machine's (calibrated when it ran slower, drift > 1, or faster, drift < 1;
a calibration is cached and reused), replayed over the recorded answers while every step
costs what the machine's curve says. The controller corrects its curve from the steps it
times (``CostModel``); the table shows how much of the undrifted speed it keeps.

    python -m research.studies.calibration_drift [--costs FILE ...] [--drifts 1,1.45,0.7]
                                                 [--suites grounded,rag,summarise,code]
                                                 [--traces benchmarks/gpu/cache/traces]
                                                 [--out research/results/calibration-drift.md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from research.lab import replay as rp
from research.lab.policies import specli, speedup
from specli.errors import SpecliError

CURVES = ("research/curves/this-host-g.json", "research/curves/this-host-f.json",
          "research/curves/h200-qwen7b-q4km.json")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--costs", action="append", help="a cost-curve file (repeatable; default: " + ", ".join(CURVES))
    ap.add_argument("--drifts", default="1,1.45,0.7")
    ap.add_argument("--suites", default="grounded,rag,summarise,code")
    ap.add_argument("--traces", default="benchmarks/gpu/cache/traces")
    ap.add_argument("--out", default="research/results/calibration-drift.md")
    a = ap.parse_args()
    try:
        curves = [rp.Costs.from_file(f) for f in (a.costs or CURVES)]
        drifts = [float(x) for x in a.drifts.split(",")]
    except (SpecliError, ValueError) as e:
        sys.exit(f"calibration_drift: {e}")
    suites = a.suites.split(",")
    traces = {s: rp.load_traces(Path(a.traces) / f"{s}.json") for s in suites}
    missing = [s for s, t in traces.items() if not t]
    if missing:
        sys.exit(f"calibration_drift: no traces for {', '.join(missing)} in {a.traces} "
                 f"(python -m research.studies.replay --traces {a.traces} records them)")
    lines = ["# A calibration taken at another speed", "",
             f"Command: `{' '.join(['python -m research.studies.calibration_drift'] + sys.argv[1:])}`", "",
             "Replayed speed-up over plain decoding when the controller's calibrated curve is *drift* times "
             "what the steps cost (drift 1.45: calibrated when the machine ran 1.45x slower).", ""]
    for c in curves:
        lines += [f"## {c.name}", "", "| policy | drift | " + " | ".join(suites) + " |",
                  "|---|---|" + "---|" * len(suites)]
        for kinds in (("lookup",), ("lookup", "model")):
            for d in drifts:
                row = [speedup(specli(kinds, drift=d), traces[s], c) for s in suites]
                lines.append(f"| specli {'+'.join(kinds)} | {d:g} | " + " | ".join(f"{x:.3f}×" for x in row) + " |")
        lines.append("")
        print("\n".join(lines[-10:]), flush=True)
    Path(a.out).write_text("\n".join(lines) + "\n")
    print(f"report: {a.out}")


if __name__ == "__main__":
    main()
