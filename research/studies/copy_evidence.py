#!/usr/bin/env python3
"""Does anything besides the match tell how far a copy will hold? Three kinds of evidence a
policy could add to what specli's controller sees of a lookup match, tried on the recorded
traces (no timing noise):

1. **the target's confidence** in the tokens it has just emitted (free: the verify pass
   computes it). Per-token continuation of specli's copies, by the target's probability of the
   last emitted token.
2. **the draft model's agreement** with each copied token (its argmax at that position, one
   batched pass of the draft over the copy). Continuation by agreement, then the copy checked
   that way, replayed: a draft pass over up to ``--check`` copied tokens (and what its cache
   lacks), the copy cut where the draft disagrees, the draft's own token there added.
3. **what earlier answers taught**: specli's controller carrying its learned acceptance from
   one prompt of the suite to the next, against starting each answer afresh (as every command
   does).

    python -m research.studies.copy_evidence [--report research/results/replay.json]
                                             [--traces benchmarks/gpu/cache/traces]
                                             [--suites grounded,rag,summarise] [--costs FILE ...]
                                             [--out research/results/copy-evidence.md]

Curves: the report's first (replay.py's, this machine's, calibrated in its run), each
``--costs`` file, and two GPU-like ones. The target's probabilities are recorded once per
answer (one teacher-forced pass of the target) and kept beside the traces.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections import defaultdict
from pathlib import Path

from research.lab import replay as rp
from research.lab.policies import specli
from specli.errors import SpecliError
from specli.speculate.adaptive import lookup_drafter
from specli.speculate.drafters import Drafter, LookupDrafter
from specli.speculate.settings import DEFAULTS
from specli.speculate.source import MODEL, Draft
from specli.tokens import common_prefix

P_EDGES = (0.5, 0.9, 0.99, 0.999)  # bands of the target's probability of its last token
SURE = 0.7  # a draft argmax this probable counts as a confident one
BANDS = [f"{lo:g}–{e:g}" for lo, e in zip((0.0,) + P_EDGES, P_EDGES)] + [f"≥ {P_EDGES[-1]:g}"]
VIEWS = ["agrees, sure", "agrees", "disagrees", "disagrees, sure"]


def p_band(p: float) -> str:
    return BANDS[sum(p >= e for e in P_EDGES)]


def copy_trials(trace: rp.Trace, k_max: int) -> list[tuple[int, int, int, bool]]:
    """(where the copy starts, position in the answer, copied token, held?) for every copied
    token tested: specli's copy from the true prefix at each position, up to and including its
    first wrong token (so every one is copied after a true prefix)."""
    drafter, out, trials = LookupDrafter(), trace.out, []
    for i in range(1, len(out)):
        toks = drafter.propose(trace.prompt + out[:i], k_max).tokens
        a = common_prefix(toks, out[i:i + len(toks)])
        trials += [(i, i + j, toks[j], j < a) for j in range(min(len(toks), a + 1, len(out) - i))]
    return trials


def continuation(traces: list[rp.Trace], p_target: dict[str, list[float]], k_max: int) -> tuple[dict, dict]:
    """Per-token continuation of copies by the target's last probability and by the draft's view."""
    by_p: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    by_draft: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for t in traces:
        p, m = p_target[t.id], t.models["model"]
        for i, pos, tok, held in copy_trials(t, k_max):
            view = ("agrees" if m.argmax[pos] == tok else "disagrees") + (", sure" if m.p_top[pos] >= SURE else "")
            for table, key in ((by_p, p_band(p[i - 1])), (by_draft, view)):
                table[key][0] += 1
                table[key][1] += held
    return by_p, by_draft


class CheckedCopy(Drafter):
    """specli's lookup copy (up to ``check`` tokens), checked by the draft model before the
    target sees it: one draft pass over what its cache lacks plus the copy, billed to the
    clock; the copy is cut where the draft's argmax differs, and that argmax is drafted in its
    place. Off the answer (a wrong copied token the draft agreed with) the draft's own recorded
    continuation stands for its view."""

    def __init__(self, trace: rp.Trace, costs: rp.Costs, clock: rp.Clock, check: int):
        self.lookup, self.t, self.costs, self.clock, self.check = lookup_drafter(DEFAULTS), trace, costs, clock, check
        self.cache = rp.TraceModel(trace, "model", MODEL, costs, clock)  # what the draft's cache holds

    def begin(self, prompt, max_tokens):
        self.lookup.begin(prompt, max_tokens)

    def propose(self, context, max_len):
        d = self.lookup.propose(context, min(max_len, self.check))
        if not d.tokens:
            return Draft([])
        self.clock.spent += self.costs.draft * self.costs.block(self.cache.behind(context) + len(d.tokens))
        self.cache.held, self.cache.fed = len(context), list(d.tokens)
        i, out, keep, off = len(context) - len(self.t.prompt), self.t.out, [], None
        for j, tok in enumerate(d.tokens):
            if off is None:
                if i + j >= len(out):
                    break
                view = self.cache.m.argmax[i + j]
            else:
                view = off.pop(0)[0] if off else None
            if view != tok:
                keep += [view] if view is not None else []
                break
            keep.append(tok)
            if off is None and tok != out[i + j]:  # the draft agreed with a wrong copy: its own chain
                off = list(self.cache.m.off.get(i + j, []))
        return Draft(keep[:max_len], d.source)

    def observe(self, draft, n_accepted, emitted, t_draft, t_verify):
        self.lookup.observe(draft, n_accepted, emitted, t_draft, t_verify)


def speed(traces: list[rp.Trace], make, costs: rp.Costs, carry: bool = False) -> float:
    """Replayed speed-up over plain decoding; ``carry``: each answer's controller starts with
    what the previous answer's learned (acceptance per source and of copies going on)."""
    plain = cost = 0.0
    prev = None
    for t in traces:
        clock = rp.Clock()
        d = make(t, costs, clock)
        if carry and prev is not None:
            learned = copy.deepcopy((prev.ctl.sources, prev.ctl.copies))
            d.ctl.sources, d.ctl.copies = learned  # deepcopy keeps each bucket's rest_from on the copied copies
        cost += rp.replay(t, d, costs, DEFAULTS.draft_max, clock).cost
        plain += t.plain_cost
        prev = d
    return plain / cost


def target_probabilities(traces: list[rp.Trace], path: Path, target: str) -> dict[str, list[float]]:
    """The target's probability of each answer token (cached at ``path`` per answer)."""
    cached = json.loads(path.read_text()) if path.exists() else {}
    need = [t for t in traces if cached.get(t.id, {}).get("out") != t.out]
    if need:
        from specli.engine import Context, ContextConfig, Model
        from specli.resolve import models

        ctx = Context(Model(models.resolve(target, progress=print)), ContextConfig(n_ctx=4096))
        for t in need:
            cached[t.id] = {"out": t.out, "p": rp.teacher_forced(ctx, t.prompt, t.out, 1).p_top}
            print(f"  target probabilities: {t.suite}/{t.id}", flush=True)
        path.write_text(json.dumps(cached))
    return {t.id: cached[t.id]["p"] for t in traces}


def rates(table: dict, order: list[str]) -> str:
    return ", ".join(f"{k}: {table[k][1] / table[k][0]:.2f} ({table[k][0]})" for k in order if k in table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--report", default="research/results/replay.json")
    ap.add_argument("--traces", default="benchmarks/gpu/cache/traces")
    ap.add_argument("--suites", default="grounded,rag,summarise")
    ap.add_argument("--costs", action="append", default=[], help="a cost-curve JSON file (repeatable)")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--check", type=int, default=DEFAULTS.draft_max, help="most copied tokens the draft checks")
    ap.add_argument("--out", default="research/results/copy-evidence.md")
    a = ap.parse_args()
    try:  # a bad report or curve file: one line, no traceback
        curves = [rp.Costs.from_report(a.report), *(rp.Costs.from_file(f) for f in a.costs)]
    except SpecliError as e:
        sys.exit(f"copy_evidence: {e}")
    curves += [rp.Costs.linear(0.05, 0.1), rp.Costs.linear(0.01, 0.05)]
    k = DEFAULTS.draft_max
    lines = ["# Evidence beyond the match: can a policy tell how far a copy holds?", "",
             f"Command: `{' '.join(['python -m research.studies.copy_evidence'] + sys.argv[1:])}`", "",
             "Per-token continuation: of the copied tokens tested (specli's copy from the true prefix at every "
             "position, up to its first wrong token), the share that held (trials in brackets). Speeds are "
             "replayed speed-ups over plain decoding (research/studies/copy_evidence.py says how each is "
             "replayed).", ""]
    suites = {s: rp.load_traces(Path(a.traces) / f"{s}.json") for s in a.suites.split(",")}
    missing = [s for s, t in suites.items() if not t]
    if missing:  # never a report of nothing over the one kept
        sys.exit(f"copy_evidence: no traces for {', '.join(missing)} in {a.traces} (python -m research.studies.replay "
                 f"--traces {a.traces} records them)")
    for suite, traces in suites.items():
        p_target = target_probabilities(traces, Path(a.traces) / f"{suite}-target-p.json", a.target)
        by_p, by_draft = continuation(traces, p_target, k)
        lines += [f"## {suite} ({len(traces)} answers)", "",
                  f"- continuation by the target's probability of its last token: {rates(by_p, BANDS)}",
                  f"- continuation by the draft model's view of the copied token (sure: p ≥ {SURE}): "
                  f"{rates(by_draft, VIEWS)}",
                  "", "| cost model | specli lookup | specli hybrid | copy checked by the draft | "
                  "specli lookup, learning carried across answers |", "|---|---|---|---|---|"]
        for c in curves:
            row = [speed(traces, specli(("lookup",)).make, c), speed(traces, specli(("lookup", "model")).make, c),
                   speed(traces, lambda t, cc, clk: CheckedCopy(t, cc, clk, a.check), c),
                   speed(traces, specli(("lookup",)).make, c, carry=True)]
            lines.append(f"| {c.name} | " + " | ".join(f"{x:.2f}×" for x in row) + " |")
        lines.append("")
        print("\n".join(lines[-len(curves) - 7:]), flush=True)
    Path(a.out).write_text("\n".join(lines) + "\n")
    print(f"report: {a.out}")


if __name__ == "__main__":
    main()
