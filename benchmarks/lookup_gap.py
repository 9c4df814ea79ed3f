#!/usr/bin/env python3
"""Where prompt lookup's possible gain goes, suite by suite, on one cost curve:

- **any copy**: the lookup bound replay.py reports (a copy from *any* earlier occurrence of the
  last token, drafted exactly as far as it holds);
- **specli's copies**: the copies specli's lookup drafter proposes from the true prefix at every
  position (its source choice, its learned renames), drafted exactly as far as each holds;
- **specli lookup**: the shipped controller over that drafter, replayed.

The first gap is the choice of source, the second the choice of length. "specli's copies" is
not a strict bound: renames are learned from the proposals a drafter makes, and this one makes
one at every position.

    python benchmarks/lookup_gap.py [--report docs/replay.json] [--traces benchmarks/gpu/cache/traces]
                                    [--suites grounded,rag]

The cost curve is the first of the report's (replay.py's: this machine's, calibrated in its run).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specli.measure import replay as rp  # noqa: E402
from specli.measure.policies import specli  # noqa: E402
from specli.speculate.drafters import LookupDrafter  # noqa: E402
from specli.speculate.settings import DEFAULTS  # noqa: E402
from specli.tokens import common_prefix  # noqa: E402


def copies_agreement(trace: rp.Trace, k_max: int) -> list[int]:
    """How far the copy specli's lookup proposes from each true prefix agrees with the answer."""
    drafter, out = LookupDrafter(), trace.out
    agree = [0] * len(out)
    for i in range(1, len(out)):
        agree[i] = common_prefix(drafter.propose(trace.prompt + out[:i], k_max).tokens, out[i:i + k_max])
    return agree


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--report", default="docs/replay.json")
    ap.add_argument("--traces", default="benchmarks/gpu/cache/traces")
    ap.add_argument("--suites", default="grounded,rag,summarise,code")
    a = ap.parse_args()
    entry = json.load(open(a.report, encoding="utf-8"))[0]
    costs = rp.Costs(entry["costs"], tuple(entry["verify"]), entry["draft"], entry["draft"])
    k = DEFAULTS.draft_max
    policy = specli(("lookup",))
    print(f"cost curve: {costs.name}")
    for suite in a.suites.split(","):
        traces = rp.load_traces(Path(a.traces) / f"{suite}.json") or []
        plain = anyc = own = run = 0.0
        for t in traces:
            n = len(t.out)
            plain += t.plain_cost
            anyc += rp.bound(n, [(rp.lookup_agreement(t.prompt, t.out, k), 0.0, 0.0)], costs.verify, k)
            own += rp.bound(n, [(copies_agreement(t, k), 0.0, 0.0)], costs.verify, k)
            clock = rp.Clock()
            run += rp.replay(t, policy.make(t, costs, clock), costs, policy.draft_max, clock).cost
        if not traces:
            print(f"{suite}: no traces in {a.traces}")
            continue
        b_any, b_own, got = plain / anyc, plain / own, plain / run
        print(f"{suite}: any copy {b_any:.2f}×, specli's copies {b_own:.2f}×, specli lookup {got:.2f}× "
              f"({100 * (got - 1) / (b_any - 1):.0f}% of the first bound's gain, "
              f"{100 * (got - 1) / (b_own - 1):.0f}% of the second's)")


if __name__ == "__main__":
    main()
