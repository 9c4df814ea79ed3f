#!/usr/bin/env python3
"""Does the replay predict what a real run measures? One process, side by side:

1. calibrate this machine's verify curve (as every command does, but anew, not from the cache);
2. run a suite's prompts with plain decoding and with specli's lookup (interleaved by prompt,
   ``--repeat`` rounds), every step's drafted length and verify time recorded;
3. calibrate again;
4. replay the same policy (the shipped code) over the answers plain decoding just gave, on
   both calibrations and on the curve of the real steps' own median costs.

The measured speed-up (tokens/s over plain's) should fall between what the replay predicts on
the two calibrations: the machine's costs drift between runs, and the replay is only as right
as the curve it is handed. The report also gives each block size's real cost against the
calibrations', and the share of the lookup bound's gain on each curve.

    python -m research.studies.replay_vs_measured [--profile default] [--suite grounded]
                                                  [--repeat 1] [--threads N]
                                                  [--out research/results/replay-vs-measured.md]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from research.lab import replay as rp
from research.lab.policies import specli, speedup
from specli.errors import SpecliError
from specli.hardware import calibrate
from specli.measure.suite import load_suite
from specli.prompt import prompt_tokens
from specli.session import Options, Session
from specli.speculate.drafters import Drafter
from specli.speculate.settings import SpecSettings
from specli.speculate.verify import SamplingParams


class Recorder(Drafter):
    """A drafter as it is, each step's (drafted tokens, verify seconds) noted, and what the last
    step emitted (its end-of-generation token, which the response's chunks leave out)."""

    def __init__(self, inner: Drafter, steps: list[tuple[int, float]]):
        self.inner, self.steps, self.name = inner, steps, inner.name
        self.last: list[int] = []

    def begin(self, prompt, max_tokens) -> None:
        self.inner.begin(prompt, max_tokens)

    def propose(self, context, max_len):
        return self.inner.propose(context, max_len)

    def observe(self, draft, n_accepted, emitted, t_draft, t_verify) -> None:
        self.steps.append((len(draft.tokens), t_verify))
        self.last = emitted
        self.inner.observe(draft, n_accepted, emitted, t_draft, t_verify)


def run(sess: Session, mode: str, prompt: list[int], max_tokens: int, steps: list) -> tuple[list[int], float]:
    """(the answer as a trace holds it: its end-of-generation token included, seconds)."""
    sess.ctx.clear()
    rec = Recorder(sess.drafter_for(mode), steps)
    resp = sess.generate(prompt, SamplingParams(0.0, seed=1234), max_tokens, rec)
    out = [t for ch in resp for t in ch.tokens]
    if resp.finish_reason == "stop":
        out.append(rec.last[-1])
    return out, resp.stats.t_generate


def replayed(traces: list[rp.Trace], costs: rp.Costs) -> tuple[float, float]:
    """specli's lookup replayed on these answers, and the lookup bound: speed-ups over plain."""
    pol = specli(("lookup",))
    k = pol.draft_max
    bound = sum(rp.bound(len(t.out), rp.drafter_options(t, costs, ("lookup",), k), costs.verify, k) for t in traces)
    return speedup(pol, traces, costs), sum(t.plain_cost for t in traces) / bound


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="default")
    ap.add_argument("--suite", default="grounded")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--out", default="research/results/replay-vs-measured.md")
    a = ap.parse_args()
    try:
        spec = SpecSettings()
        sess = Session(Options(profile=a.profile, draft="none", threads=a.threads, spec=spec), progress=print,
                       build_drafter=False)
        suite = load_suite(a.suite)
        chat = sess.target.chat_template() is not None
        prompts = [(p, prompt_tokens(sess.target, p, chat)) for p in suite.prompts]
    except SpecliError as e:
        sys.exit(f"replay_vs_measured: {e}")
    k_max = spec.draft_max
    cal = [calibrate.verify_costs(sess.ctx, k_max, use_cache=False)]  # cached: the controller starts from it
    steps: dict[str, list[tuple[int, float]]] = {"none": [], "lookup": []}
    secs: dict[str, float] = defaultdict(float)
    tokens: dict[str, int] = defaultdict(int)
    answers: dict[str, list[int]] = {}
    same = 0
    for rnd in range(a.repeat):
        for i, (sp, toks) in enumerate(prompts):
            n = sp.max_tokens or a.max_tokens
            order = ("none", "lookup") if (i + rnd) % 2 == 0 else ("lookup", "none")
            outs = {}
            for mode in order:
                out, s = run(sess, mode, toks, n, steps[mode])
                outs[mode] = out
                secs[mode] += s
                tokens[mode] += len(out)
                print(f"  {sp.id} {mode}: {len(out)} tokens in {s:.2f}s", flush=True)
            if rnd == 0:
                answers[sp.id] = outs["none"]
                same += outs["none"] == outs["lookup"]
    cal.append(calibrate.verify_costs(sess.ctx, k_max, use_cache=False))
    sess.close()

    by_k: dict[int, list[float]] = defaultdict(list)
    for k, t in steps["lookup"]:
        by_k[k].append(t)
    one = statistics.median(t for _, t in steps["none"])
    real = {k: statistics.median(v) / one for k, v in sorted(by_k.items())}
    measured = (tokens["lookup"] / secs["lookup"]) / (tokens["none"] / secs["none"])
    traces = [rp.Trace(suite.name, sp.id, toks, answers[sp.id], [], {}, sp.max_tokens or a.max_tokens)
              for sp, toks in prompts]
    # the real steps' curve: their medians where lookup drafted that many; elsewhere the first
    # calibration, corrected by the real steps' average ratio to it (as the controller prices
    # sizes it has not tried: CostModel)
    c0 = [x / cal[0][0] for x in cal[0]]
    drafted = [k for k in real if k]
    ratio = sum(len(by_k[k]) * real[k] / c0[k] for k in drafted) / sum(len(by_k[k]) for k in drafted) \
        if drafted else 1.0
    curves = [rp.Costs.measured("calibrated before the runs", cal[0], 0.0),
              rp.Costs.measured("calibrated after the runs", cal[1], 0.0),
              rp.Costs("the real steps' medians (other sizes: calibrated before, corrected by the real steps' "
                       f"average ratio to it, {ratio:.2f})",
                       (1.0, *(real.get(k, c0[k] * ratio) for k in range(1, k_max + 1))), 0.0)]
    rows = [(c.name, *replayed(traces, c)) for c in curves]

    lines = ["# Replay against a measured run", "",
             f"Command: `{' '.join(['python -m research.studies.replay_vs_measured'] + sys.argv[1:])}`, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {sess.ctx.threads} threads, "
             f"{len(prompts)} prompts of `{suite.name}`, {a.repeat} round(s), plain and lookup interleaved.", "",
             f"Measured: plain {tokens['none'] / secs['none']:.2f} tok/s, "
             f"lookup {tokens['lookup'] / secs['lookup']:.2f} tok/s: **{measured:.3f}×**. "
             f"Same text as plain: {same} of {len(prompts)} answers.", "",
             "| curve | replayed specli lookup | lookup bound | share of the bound's gain |", "|---|---|---|---|"]
    lines += [f"| {name} | {x:.3f}× | {b:.3f}× | {100 * rp.gain_share(x, b):.1f}% |" for name, x, b in rows]
    lines += ["", f"Each block size's cost over a plain step's (median {1000 * one:.1f} ms over "
              f"{len(steps['none'])} plain steps):", "",
              "| drafted k | lookup steps | real | calibrated before | calibrated after |", "|---|---|---|---|---|"]
    lines += [f"| {k} | {len(by_k[k])} | {r:.2f} | {cal[0][k] / cal[0][0]:.2f} | {cal[1][k] / cal[1][0]:.2f} |"
              for k, r in real.items()]
    Path(a.out).write_text("\n".join(lines) + "\n")
    Path(a.out).with_suffix(".json").write_text(json.dumps(
        {"measured": measured, "same_text": same, "prompts": len(prompts), "calibrations": cal,
         "plain_step_s": one, "real_over_plain": real, "replayed": rows,
         "answers": {sp.id: {"prompt": toks, "out": answers[sp.id]} for sp, toks in prompts}}) + "\n")
    print("\n".join(lines))
    print(f"report: {a.out}")


if __name__ == "__main__":
    main()
