#!/usr/bin/env python3
"""Every drafting policy replayed over the target's own answers, on any hardware's costs,
against the clairvoyant bound of its drafters. No timing noise: the answers and what each
drafter would propose are recorded once (traces, cached per model pair and suite), then each
policy is run over them with a cost model charging every step what it would cost there.

Policies: specli's adaptive controller (the shipped code, built as every command builds it)
over prompt lookup, the draft model, and both; every fixed draft length k = 1..draft_max of
each; llama.cpp's defaults (draft-simple, ngram-simple, ngram-mod, ngram-cache, and the
llama-lookup tool's n-gram cache). Cost models: this
machine's calibrated curve, curves from files (``benchmarks/cost_curve.py --out`` on any
machine), and GPU-like ones (verify(k) = 1 + c·k, a draft pass r target tokens). On every
measured curve it also fits, knowing the answers, the best lookup rule that sees of a match
what the controller sees (``best_table_rule``): how much of the bound a policy deciding from
the match alone could take on grounded; and the same rule told, at every step, whether its
copy's first token holds (an oracle): what a perfect signal of where copies break would add.

    python -m research.studies.replay [--suites grounded,code,...] [--costs FILE ...]
                                      [--no-measured] [--traces DIR]
                                      [--out research/results/replay.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections import defaultdict

from research.lab import replay as rp
from research.lab.policies import Policy, every_policy, speedup
from specli.engine import Context, ContextConfig, Model, system_info
from specli.errors import SpecliError
from specli.hardware import calibrate
from specli.measure.suite import BUILTIN_SUITES, load_suite
from specli.prompt import prompt_tokens
from specli.resolve import models
from specli.speculate.adaptive import lookup_drafter
from specli.speculate.drafters import Drafter
from specli.speculate.settings import DEFAULTS
from specli.speculate.source import BUCKET_NAMES, Draft

GRID_C = (0.01, 0.02, 0.05, 0.1, 0.2)
GRID_R = (0.05, 0.1, 0.2, 0.5)
HEADLINE = "specli lookup+model"


class Models:
    """The target and draft, loaded only when a trace or the calibration needs them."""

    def __init__(self, a):
        self.a, self._ctx = a, None

    def paths(self) -> tuple[str, str]:
        return models.resolve(self.a.target, progress=print), models.resolve(self.a.draft, progress=print)

    def contexts(self) -> tuple[Context, Context]:
        if self._ctx is None:
            tp, dp = self.paths()
            cfg = ContextConfig(n_ctx=4096, n_threads=self.a.threads)
            self._ctx = Context(Model(tp), cfg), Context(Model(dp), cfg)
        return self._ctx


def suite_traces(name: str, ms: Models, a) -> list[rp.Trace]:
    """The suite's traces: from --traces DIR, else the cache, else recorded now (and cached)."""
    suite = load_suite(name)
    caps = {p.id: p.max_tokens or a.max_tokens for p in suite.prompts}
    greedy = [p for p in suite.prompts if not p.temperature]  # a trace is of the target's greedy answer
    if a.traces:
        given = rp.load_traces(rp.Path(a.traces) / f"{name}.json")
        if given is not None and [t.id for t in given] == [p.id for p in greedy]:
            return with_caps(given, caps)
        # missing, or recorded for other prompts (a suite that changed since): record it anew
    tp, dp = ms.paths()
    key = rp.trace_key(rp.model_ident(tp), rp.model_ident(dp), suite.name,
                       [[p.id, p.text, p.messages, p.max_tokens] for p in suite.prompts], a.max_tokens,
                       DEFAULTS.draft_max)
    path = rp.traces_dir() / f"{suite.name}-{key}.json"
    traces = rp.load_traces(path)
    if traces is None:
        tctx, dctx = ms.contexts()
        traces = []
        for p in greedy:
            t0 = time.time()
            tokens = prompt_tokens(tctx.model, p, tctx.model.chat_template() is not None)
            traces.append(rp.record(tctx, tokens, p.max_tokens or a.max_tokens, {"model": dctx}, DEFAULTS.draft_max,
                                    suite.name, p.id))
            print(f"  traced {name}/{p.id}: {len(traces[-1].out)} tokens in {time.time() - t0:.1f}s", flush=True)
        rp.save_traces(path, traces)
    if a.traces:
        rp.save_traces(rp.Path(a.traces) / f"{name}.json", traces)
    return with_caps(traces, caps)


def with_caps(traces: list[rp.Trace], caps: dict[str, int]) -> list[rp.Trace]:
    """Traces recorded before they kept their cap get the suite's."""
    for t in traces:
        t.max_tokens = t.max_tokens or caps.get(t.id)
    return traces


def cost_models(ms: Models, a) -> list[rp.Costs]:
    out = []
    if not a.no_measured:
        tctx, dctx = ms.contexts()
        # measured now, not from the cache: the run's report says what this machine does today
        verify = calibrate.verify_costs(tctx, a.k_max, reps=5, use_cache=False)
        draft = calibrate.draft_token_cost(dctx, use_cache=False)
        out.append(rp.Costs.measured(f"this machine ({platform.machine()}, {a.threads} threads, calibrated now)",
                                     verify, draft))
        print(f"calibrated: one token {verify[0] * 1000:.1f} ms, blocks of 2/4/16: " + "/".join(
            f"{verify[k] / verify[0]:.2f}" for k in (1, 3, 15)) + f", a draft token {draft / verify[0]:.2f}",
              flush=True)
    out += [rp.Costs.from_file(f) for f in a.costs]
    out += [rp.Costs.linear(c, r, a.k_max) for c in a.grid_c for r in a.grid_r]
    return out


def evaluate(traces: list[rp.Trace], looks: list[list[int]], policies: list[Policy], costs: rp.Costs,
             draft_max: int) -> dict:
    """Suite totals: plain cost, each policy's cost, each drafter set's bound (``looks``: each
    trace's lookup agreement, the same on every cost model)."""
    tot: dict = defaultdict(float)
    for t, look in zip(traces, looks):
        tot["plain"] += t.plain_cost
        for kinds in dict.fromkeys(p.kinds for p in policies):  # in order: the same JSON on every run
            options = rp.drafter_options(t, costs, kinds, draft_max, look)
            tot["bound " + "+".join(kinds)] += rp.bound(len(t.out), options, costs.verify, draft_max)
        for p in policies:
            clock = rp.Clock()
            tot[p.name] += rp.replay(t, p.make(t, costs, clock), costs, p.draft_max, clock).cost
    return {k: tot["plain"] / v for k, v in tot.items() if v > 0}  # speed-ups over plain


MATCH_BANDS = (2, 3, 4, 6, 8, 12, 16, 24)  # match lengths a TableRule tells apart
KINDS = ("", *BUCKET_NAMES.values())  # and kinds of match ("": an ordinary one)


class TableRule(Drafter):
    """Prompt lookup drafting ``table[(band, kind)]`` tokens from a match whose length falls
    in that band (``MATCH_BANDS``) and whose kind is a special lookup bucket's name
    (``BUCKET_NAMES``) or an ordinary one (""): the family of rules that see of a match what
    specli's controller sees, to be tuned in hindsight. ``told``: the trace it replays, read
    as an oracle no policy has: the rule then drafts only copies whose first token holds."""

    def __init__(self, table: dict[tuple[int, str], int], told: rp.Trace | None = None):
        self.lookup, self.table, self.told = lookup_drafter(DEFAULTS), table, told

    def propose(self, context, max_len):
        d = self.lookup.propose(context, max_len)
        if not d.tokens:
            return d
        if self.told is not None and d.tokens[0] != self.told.out[len(context) - len(self.told.prompt)]:
            return Draft([], d.source)
        band = max(i for i, e in enumerate(MATCH_BANDS) if d.confidence[0] >= e)
        k = self.table[(band, BUCKET_NAMES.get(d.source.bucket, ""))]
        return Draft(d.tokens[:k], d.source, d.confidence[:k])


def best_table_rule(traces: list[rp.Trace], costs: rp.Costs, rounds: int = 3,
                    told: bool = False) -> tuple[float, dict]:
    """A TableRule for these answers, chosen knowing them (coordinate descent over each
    cell's draft length from 3 everywhere): near what a lookup policy that decides from the
    match alone, the same way all answer long, could reach; an adaptive policy may beat it
    only by learning each answer as it goes. ``told``: the rule is also told, at every step,
    whether its copy's first token holds (how far knowing that alone would take it)."""
    def speed(table: dict) -> float:
        rule = Policy("table rule", "rule", ("lookup",), DEFAULTS.draft_max,
                      lambda t, c, clk: TableRule(table, t if told else None))
        return speedup(rule, traces, costs)

    table = {(b, kind): 3 for b in range(len(MATCH_BANDS)) for kind in KINDS}
    best = speed(table)
    for _ in range(rounds):
        for cell in table:
            for k in range(DEFAULTS.draft_max + 1):
                old, table[cell] = table[cell], k
                x = speed(table)
                if x > best + 1e-9:
                    best = x
                else:
                    table[cell] = old
    return best, table


def table_text(table: dict[tuple[int, str], int]) -> str:
    bands = [f"{e}+" if i == len(MATCH_BANDS) - 1 else f"{e}" if MATCH_BANDS[i + 1] == e + 1
             else f"{e}-{MATCH_BANDS[i + 1] - 1}" for i, e in enumerate(MATCH_BANDS)]
    return "; ".join((kind or "ordinary") + " " + ", ".join(f"{bands[b]}: {table[(b, kind)]}"
                                                            for b in range(len(MATCH_BANDS)))
                     for kind in KINDS)


def best_fixed(sp: dict) -> tuple[str, float]:
    name = max((k for k in sp if k.startswith("fixed ")), key=sp.get)
    return name.removeprefix("fixed "), sp[name]


def against(res: dict) -> tuple[dict, dict]:
    """Per suite: specli's hybrid over the best fixed k in hindsight, and over the best
    llama.cpp default."""
    return ({s: r[HEADLINE] / best_fixed(r)[1] for s, r in res.items()},
            {s: r[HEADLINE] / max(v for k, v in r.items() if k.startswith("llama.cpp")) for s, r in res.items()})


LLAMA_COLUMNS = ("draft-simple (model)", "ngram-simple", "ngram-mod", "ngram-cache", "llama-lookup")


def table(costs: rp.Costs, res: dict[str, dict]) -> list[str]:
    head = ["suite", "specli lookup", "specli model", "specli hybrid", "best fixed k (which)",
            *(f"llama.cpp {c}".removesuffix(" (model)") for c in LLAMA_COLUMNS), "bound lookup", "bound hybrid",
            "hybrid: share of bound gain"]
    lines = [f"### {costs.name}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for suite, sp in res.items():
        bf, bfx = best_fixed(sp)
        cells = [suite, *(f"{sp[k]:.2f}×" for k in ("specli lookup", "specli model", HEADLINE)), f"{bfx:.2f}× ({bf})",
                 *(f"{sp['llama.cpp ' + c]:.2f}×" for c in LLAMA_COLUMNS),
                 *(f"{sp[k]:.2f}×" for k in ("bound lookup", "bound lookup+model")),
                 f"{100 * rp.gain_share(sp[HEADLINE], sp['bound lookup+model']):.0f}%"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def checks(all_res: list[tuple[rp.Costs, dict]], rules: dict[str, tuple[float, dict]],
           told: dict[str, tuple[float, dict]]) -> list[str]:
    """The issue's targets, checked on the replayed figures: on every measured curve (this
    machine's, calibrated in the run, and curves from files) the grounded share and the
    slowest suite (targets for this machine's curve), and where specli stands against the best
    fixed k and llama.cpp's defaults (targets for GPUs); on the GPU-like grid, the GPU targets
    cell by cell."""
    out = []
    for costs, res in all_res:
        if costs.parametric:
            continue
        g = res.get("grounded")
        if g:
            look = rp.gain_share(g["specli lookup"], g["bound lookup"])
            both = rp.gain_share(g[HEADLINE], g["bound lookup+model"])
            out.append(f"- {costs.name}: on grounded specli's lookup captures {100 * look:.1f}% of the lookup bound's "
                       f"gain ({g['specli lookup']:.2f}× of {g['bound lookup']:.2f}×), its hybrid {100 * both:.1f}% of "
                       f"the hybrid bound's ({g[HEADLINE]:.2f}× of {g['bound lookup+model']:.2f}×) (target on this "
                       f"machine's curve ≥ 60%): {'met' if max(look, both) >= 0.6 else 'NOT met'}")
        rule = rules.get(costs.name)
        if rule and g:
            out.append(f"- {costs.name}: the best lookup rule that sees of a match only what the controller sees "
                       f"(its length, its kind), chosen knowing the answers: {rule[0]:.2f}× on grounded, "
                       f"{100 * rp.gain_share(rule[0], g['bound lookup']):.0f}% of the lookup bound's gain "
                       f"(tokens drafted by kind and match length: {table_text(rule[1])})")
        oracle = told.get(costs.name)
        if oracle and g:
            out.append(f"- {costs.name}: the same family of rules, told in advance at every step whether its copy's "
                       f"first token holds (an oracle: what a perfect signal of where copies break would be worth), "
                       f"chosen knowing the answers: {oracle[0]:.2f}× on grounded, "
                       f"{100 * rp.gain_share(oracle[0], g['bound lookup']):.0f}% of the lookup bound's gain")
        worst = min(res, key=lambda s: res[s][HEADLINE])
        fx, ll = against(res)
        wf, wl = min(fx, key=fx.get), min(ll, key=ll.get)
        out.append(f"- {costs.name}: slowest suite {worst} at {res[worst][HEADLINE]:.3f}× plain (target on this "
                   f"machine's curve ≥ 0.98×): {'met' if res[worst][HEADLINE] >= 0.98 else 'NOT met'}; specli's hybrid "
                   f"at worst {fx[wf]:.3f}× the best fixed k in hindsight ({wf}) and {ll[wl]:.3f}× the best llama.cpp "
                   f"default ({wl}) (targets on GPUs: ≥ 0.90× and > 1×)")
    gpu = [(c, r) for c, r in all_res if c.parametric]
    if gpu:
        cells = sum(len(r) for _, r in gpu)
        ratios = [(c.name, *against(r)) for c, r in gpu]
        under = sorted((x, name, s) for name, fx, _ in ratios for s, x in fx.items() if x < 0.9)
        lose = [(name, s) for name, _, ll in ratios for s, x in ll.items() if x <= 1]
        out.append(f"- GPU-like curves: cells under 0.90 of the best fixed k in hindsight: {len(under)} of {cells}"
                   + "".join(f"; {x:.3f} ({c}, {s})" for x, c, s in under)
                   + f" (target 0): {'met' if not under else 'NOT met'}")
        out.append(f"- GPU-like curves: cells where a llama.cpp default matches or beats specli: {len(lose)} of {cells}"
                   + "".join(f"; {c}, {s}" for c, s in lose) + f" (target 0): {'met' if not lose else 'NOT met'}")
    return out


def summary(all_res: list[tuple[rp.Costs, dict]]) -> list[str]:
    """One line per cost model but this machine's (GPU-like ones, curves from files): specli's
    hybrid against the best fixed k and llama.cpp's best default, at its worst suite."""
    lines = ["| cost model | hybrid / best fixed k, worst suite | hybrid / best llama.cpp default, worst suite "
             "| suites where a llama.cpp default is as fast | hybrid's share of the bound's gain (median) |",
             "|---|---|---|---|---|"]
    for c, res in all_res:
        if c.name.startswith("this machine"):
            continue
        fx, ll = against(res)
        share = sorted(rp.gain_share(r[HEADLINE], r["bound lookup+model"]) for r in res.values())
        wf, wl = min(fx, key=fx.get), min(ll, key=ll.get)
        lines.append(f"| {c.name} | {fx[wf]:.2f} ({wf}) | {ll[wl]:.2f} ({wl}) | {sum(v <= 1 for v in ll.values())} "
                     f"of {len(ll)} | {100 * share[len(share) // 2]:.0f}% |")
    return lines + [""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct-q4_k_m")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct-q4_k_m")
    ap.add_argument("--suites", default=",".join(s for s in BUILTIN_SUITES if s != "unpredictable"))
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--k-max", type=int, default=64, help="longest block the cost models price")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--costs", action="append", default=[], help="a cost-curve JSON file (repeatable)")
    ap.add_argument("--no-measured", action="store_true", help="skip this machine's calibrated curve")
    ap.add_argument("--grid-c", type=lambda s: [float(x) for x in s.split(",") if x], default=list(GRID_C))
    ap.add_argument("--grid-r", type=lambda s: [float(x) for x in s.split(",") if x], default=list(GRID_R))
    ap.add_argument("--traces", help="read traces from DIR/<suite>.json when they are the suite's prompts, "
                    "and write them there")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "results", "replay.md"))
    a = ap.parse_args()
    ms = Models(a)
    suites = [s for s in a.suites.split(",") if s]
    traces = {s: suite_traces(s, ms, a) for s in suites}
    K = DEFAULTS.draft_max
    policies = every_policy(("lookup", "model"), K)
    looks = {s: [rp.lookup_agreement(t.prompt, t.out, K) for t in ts] for s, ts in traces.items()}
    all_res = []
    for costs in cost_models(ms, a):
        t0 = time.time()
        res = {s: evaluate(traces[s], looks[s], policies, costs, K) for s in suites}
        all_res.append((costs, res))
        print(f"{costs.name}: {time.time() - t0:.0f}s; " + ", ".join(
            f"{s} {r[HEADLINE]:.2f}×/{r['bound lookup+model']:.2f}×" for s, r in res.items()), flush=True)
    measured = [c for c, _ in all_res if "grounded" in traces and not c.parametric]
    rules = {c.name: best_table_rule(traces["grounded"], c) for c in measured}
    told = {c.name: best_table_rule(traces["grounded"], c, told=True) for c in measured}
    cmd = "python -m research.studies.replay " + " ".join(sys.argv[1:])
    n_tok = {s: sum(len(t.out) for t in ts) for s, ts in traces.items()}
    lines = ["# Replay: every policy against its bound, on any hardware's costs", "",
             f"Command: `{cmd.strip()}`  ", f"Machine: {platform.machine()}, `{system_info()}`  ",
             f"Traces: {a.target} answering greedily (up to {a.max_tokens} tokens), draft {a.draft}; "
             + ", ".join(f"{s} {len(traces[s])} prompts / {n_tok[s]} tokens" for s in suites), "",
             "Speed-ups over plain decoding, in cost units (no timing noise). *hybrid* is lookup + draft model; "
             f"bounds allow drafts up to specli's draft_max ({K}); llama.cpp's n-gram policies draft up to their own "
             "maximum (ngram-simple 48, ngram-mod 64, ngram-cache 8, llama-lookup 3). See research/studies/replay.py "
             "and research/notebook.md for the definitions.", "",
             "## Targets", ""] + checks(all_res, rules, told) + ["", "## Other cost models at a glance", ""]
    lines += summary(all_res) + ["## Tables", ""]
    for costs, res in all_res:
        lines += table(costs, res)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.splitext(a.out)[0] + ".json", "w") as f:
        json.dump([{"costs": c.name, "verify": list(c.verify), "draft": c.draft, "suites": r} for c, r in all_res],
                  f, indent=1)
    print("\n".join(lines[:len(lines) - sum(len(table(c, r)) for c, r in all_res) - 2]))
    print(f"report: {a.out}")


if __name__ == "__main__":
    try:
        main()
    except SpecliError as e:  # a bad cost-curve or trace file: one line, no traceback
        sys.exit(f"replay: {e}")
