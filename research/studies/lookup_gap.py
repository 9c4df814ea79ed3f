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

Then where the second gap goes, step by step of the replayed controller, against how far
specli's copy from the same position holds: **cut short** (a draft that passed whole while
the copy went on: the tokens left to later steps), **not drafted** (a plain step where the copy
would have held), **past the break** (a draft that went on after the copy broke: the verify
cost of the tokens after it), **failed** (a draft whose first token failed: its extra verify
cost). Costs are in target tokens.

    python -m research.studies.lookup_gap [--report research/results/replay.json]
                                          [--traces benchmarks/gpu/cache/traces]
                                          [--suites grounded,rag]

The cost curve is the first of the report's (replay.py's: this machine's, calibrated in its run).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from research.lab import replay as rp
from research.lab.policies import specli
from specli.errors import SpecliError
from specli.speculate.drafters import LookupDrafter
from specli.speculate.settings import DEFAULTS
from specli.tokens import common_prefix


def copies_agreement(trace: rp.Trace, k_max: int) -> list[int]:
    """How far the copy specli's lookup proposes from each true prefix agrees with the answer."""
    drafter, out = LookupDrafter(), trace.out
    agree = [0] * len(out)
    for i in range(1, len(out)):
        agree[i] = common_prefix(drafter.propose(trace.prompt + out[:i], k_max).tokens, out[i:i + k_max])
    return agree


def where_lost(run: rp.Run, own: list[int], verify) -> dict[str, float]:
    """A replayed run's steps sorted against ``own`` (how far the copy from each position
    holds): see the module's docstring."""
    out = dict.fromkeys(("cut short", "cut short tokens", "not drafted", "not drafted tokens",
                         "past the break", "past the break cost", "failed", "failed cost"), 0.0)
    i = 1
    for k, a in zip(run.lengths, run.accepted_at):
        if k == 0 and own[i]:
            out["not drafted"] += 1
            out["not drafted tokens"] += own[i]
        elif k and a == 0:
            out["failed"] += 1
            out["failed cost"] += verify[k] - verify[0]
        elif k and a == k and own[i] > k:
            out["cut short"] += 1
            out["cut short tokens"] += own[i] - k
        elif k > a:
            out["past the break"] += 1
            out["past the break cost"] += verify[k] - verify[a]
        i += a + 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--report", default="research/results/replay.json")
    ap.add_argument("--traces", default="benchmarks/gpu/cache/traces")
    ap.add_argument("--suites", default="grounded,rag,summarise,code")
    a = ap.parse_args()
    try:
        costs = rp.Costs.from_report(a.report)
    except SpecliError as e:
        sys.exit(f"lookup_gap: {e}")
    suites = {s: rp.load_traces(Path(a.traces) / f"{s}.json") for s in a.suites.split(",")}
    missing = [s for s, t in suites.items() if not t]
    if missing:
        sys.exit(f"lookup_gap: no traces for {', '.join(missing)} in {a.traces} "
                 f"(python -m research.studies.replay --traces {a.traces} records them)")
    k = DEFAULTS.draft_max
    policy = specli(("lookup",))
    print(f"cost curve: {costs.name}")
    for suite, traces in suites.items():
        plain = anyc = own = run = 0.0
        lost: dict[str, float] = {}
        for t in traces:
            n = len(t.out)
            plain += t.plain_cost
            agree = copies_agreement(t, k)
            anyc += rp.bound(n, [(rp.lookup_agreement(t.prompt, t.out, k), 0.0, 0.0)], costs.verify, k)
            own += rp.bound(n, [(agree, 0.0, 0.0)], costs.verify, k)
            clock = rp.Clock()
            r = rp.replay(t, policy.make(t, costs, clock), costs, policy.draft_max, clock)
            run += r.cost
            for key, v in where_lost(r, agree, costs.verify).items():
                lost[key] = lost.get(key, 0.0) + v
        b_any, b_own, got = plain / anyc, plain / own, plain / run
        print(f"{suite}: any copy {b_any:.2f}×, specli's copies {b_own:.2f}×, specli lookup {got:.2f}× "
              f"({100 * (got - 1) / (b_any - 1):.0f}% of the first bound's gain, "
              f"{100 * (got - 1) / (b_own - 1):.0f}% of the second's)")
        print(f"  steps of specli lookup: cut short {lost['cut short']:.0f} ({lost['cut short tokens']:.0f} tokens "
              f"left), not drafted {lost['not drafted']:.0f} ({lost['not drafted tokens']:.0f} tokens the copy "
              f"held), past the break {lost['past the break']:.0f} (cost {lost['past the break cost']:.1f}), "
              f"failed {lost['failed']:.0f} (cost {lost['failed cost']:.1f})")


if __name__ == "__main__":
    main()
