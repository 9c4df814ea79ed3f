"""Drafts learned from earlier answers, measured on batch jobs (issue: many prompts from the
command line). In one run, interleaved and repeated, through `specli run --batch --parallel 1`:
plain decoding, prompt lookup alone (`--lookup-history 0`) and lookup with the history of
earlier answers, on the repetitive workloads (benchmarks/workloads: 36 extraction prompts, 36
docstring prompts) and on a control (the prompts of the bench's own Spec-Bench-style suites);
then `--batch --parallel 4` against a shell loop of single `specli run` calls over the same file.

    python benchmarks/history_bench.py --repeat 2 --out benchmarks/results/history_bench

Texts are compared with plain decoding's, item by item: where they part, the item and the
position are reported (quantised CPU logits move between batch shapes: a near-tie can part).
Writes OUT.json (every run) and OUT.md (the table)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).parent
WORKLOADS = {"extract": HERE / "workloads" / "extract.jsonl", "docstring": HERE / "workloads" / "docstring.jsonl"}
CONTROL_SUITES = ["code", "qa", "summarise", "translation", "maths", "chat"]
MODES = {"plain": ["--draft", "none"], "lookup": ["--draft", "lookup", "--lookup-history", "0"],
         "lookup-history": ["--draft", "lookup", "--lookup-history", "256"]}


def control_file(dest: Path, per_suite: int) -> Path:
    """The control: the first prompts of the bench's own suites, as a batch file."""
    suites = Path(__file__).resolve().parent.parent / "specli" / "measure" / "suites"
    with open(dest, "w") as f:
        for name in CONTROL_SUITES:
            prompts = yaml.safe_load((suites / f"{name}.yaml").read_text())["prompts"]
            for p in prompts[:per_suite]:
                f.write(json.dumps({"id": f"{name}-{p['id']}", "prompt": p["text"]}) + "\n")
    return dest


def batch(base: list[str], items: Path, mode: list[str], parallel: int, out: Path) -> tuple[float, list[dict]]:
    if out.exists():
        out.unlink()
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "specli", "run", *base, *mode, "--batch", str(items), "--out", str(out),
                        "--parallel", str(parallel)], capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"specli run --batch failed: {r.stderr.strip()[-2000:]}")
    return dt, [json.loads(x) for x in out.read_text().splitlines() if x.strip()]


def shell_loop(base: list[str], items: Path, mode: list[str]) -> float:
    """One `specli run` per item, as a script without --batch does it."""
    t0 = time.perf_counter()
    for line in items.read_text().splitlines():
        prompt = json.loads(line)["prompt"]
        r = subprocess.run([sys.executable, "-m", "specli", "run", *base, *mode, "--prompt", prompt],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"specli run failed: {r.stderr.strip()[-2000:]}")
    return time.perf_counter() - t0


def decode_rate(rows: list[dict]) -> float:
    """Tokens per second of generation alone (prompt processing and the load excluded, as
    `specli bench` measures), from each item's own rate."""
    secs = sum(r["completion_tokens"] / r["speculative"]["tokens_per_s"] for r in rows
               if r["speculative"]["tokens_per_s"] > 0)
    return sum(r["completion_tokens"] for r in rows) / secs if secs else 0.0


def tokens_of(rows: list[dict]) -> int:
    return sum(r["usage"]["completion_tokens"] if "usage" in r else r["completion_tokens"] for r in rows)


def spec(rows: list[dict]) -> dict:
    out = {"drafted": 0, "accepted": 0, "history": 0}
    for r in rows:
        s = (r.get("usage") or r).get("speculative") or {}
        for k in out:
            out[k] += int(s.get(k) or 0)
    return out


def parted(ref: list[dict], rows: list[dict]) -> list[tuple[str, str]]:
    """(id, text) of the items whose text is not plain decoding's."""
    return [(b["id"], b["text"]) for a, b in zip(ref, rows) if a["text"] != b["text"]]


def verdicts(target_args: list[str], items: dict[str, dict], plain: dict[str, str],
             diffs: list[tuple[str, str]], max_tokens: int) -> list[str]:
    """Where each parted text leaves plain decoding's, and the target's top-2 margin there
    (small: batched numerics at a near-tie; large: a bug). Plain decoding's own tokens are
    generated again (a text tokenized anew need not be the tokens the model chose)."""
    if not diffs:
        return []
    from specli.measure import lossless
    from specli.session import Options, Session
    from specli.speculate.verify import SamplingParams
    sess = Session(Options(target=target_args[1], draft="none") if target_args[0] == "--target"
                   else Options(profile=target_args[1], draft="none"))
    out = []
    try:
        for iid, text in diffs:
            toks = sess.prompt_tokens(items[iid]["prompt"])
            sess.ctx.clear()
            ref = [t for ch in sess.generate(toks, SamplingParams(0.0), max_tokens) for t in ch.tokens]
            assert sess.target.detokenize(ref) == plain[iid], f"{iid}: plain decoding is not what the run printed"
            sess.ctx.clear()
            other = lossless.tokens_of_text(sess.target, ref, text)
            out.append(f"{iid}: {lossless.verdict(lossless.divergence(sess.ctx, toks, ref, other))}")
    finally:
        sess.close()
    return out


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f}× ({min(xs):.2f}–{max(xs):.2f})" if xs else "—"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=None, help="--target for specli run (default: --profile default)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--items", type=int, default=0, help="only the first N items of each workload (0: all)")
    ap.add_argument("--control-per-suite", type=int, default=3)
    ap.add_argument("--skip-parallel", action="store_true")
    ap.add_argument("--parallel-repeat", type=int, default=1, help="repetitions of --parallel 4 against the loop")
    ap.add_argument("--out", default="benchmarks/results/history_bench")
    ap.add_argument("--from-json", help="write the report from this earlier run's OUT.json (the same options)")
    a = ap.parse_args()
    base = (["--target", a.target] if a.target else ["--profile", "default"]) + ["--temp", "0", "-n", str(a.max_tokens)]
    tmp = Path(tempfile.mkdtemp(prefix="history_bench-"))
    files = dict(WORKLOADS)
    files["control"] = control_file(tmp / "control.jsonl", a.control_per_suite)
    if a.items:
        for k in list(files):
            cut = tmp / f"{k}-cut.jsonl"
            cut.write_text("".join(files[k].read_text().splitlines(keepends=True)[:a.items]))
            files[k] = cut
    if a.from_json:
        saved = json.loads(Path(a.from_json).read_text())
        runs, loops = saved["runs"], saved["loops"]
    else:
        runs, loops = measure(a, base, files, tmp)
    report(a, base, files, runs, loops)
    return 0


def measure(a, base: list[str], files: dict[str, Path], tmp: Path) -> tuple[list[dict], list[dict]]:
    runs: list[dict] = []
    for rep in range(a.repeat):
        for wl, path in files.items():
            order = list(MODES) if rep % 2 == 0 else list(reversed(MODES))  # interleaved, both orders
            for mode in order:
                dt, rows = batch(base, path, MODES[mode], 1, tmp / f"{wl}-{mode}.jsonl")
                runs.append({"rep": rep, "workload": wl, "mode": mode, "parallel": 1, "seconds": dt,
                             "tokens": tokens_of(rows), "spec": spec(rows), "rows": rows})
                print(f"rep {rep} {wl:9s} {mode:15s} {dt:7.1f} s {tokens_of(rows) / dt:6.2f} tok/s {spec(rows)}",
                      file=sys.stderr)
    loops = []
    if not a.skip_parallel:
        path = files["extract"]
        for rep in range(a.parallel_repeat):
            dt4, rows4 = batch(base, path, MODES["lookup-history"], 4, tmp / "p4.jsonl")
            loop = shell_loop(base, path, MODES["lookup-history"])
            loops.append({"rep": rep, "parallel4": dt4, "shell_loop": loop, "items": len(rows4)})
            print(f"rep {rep} --parallel 4 {dt4:.1f} s, shell loop {loop:.1f} s ({loop / dt4:.2f}×)", file=sys.stderr)
    Path(a.out + ".json").write_text(json.dumps({"runs": runs, "loops": loops}, indent=1))  # kept whatever follows
    return runs, loops


def report(a, base: list[str], files: dict[str, Path], runs: list[dict], loops: list[dict]) -> None:
    lines = [f"# Drafts from earlier answers, on batch jobs ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
             "", f"    python benchmarks/history_bench.py --repeat {a.repeat} --max-tokens {a.max_tokens}"
             + (f" --items {a.items}" if a.items else ""), "",
             f"{os.cpu_count()} cores; `specli run {' '.join(base)} --batch FILE --parallel 1`; speed = completion "
             "tokens / wall seconds of the whole job (load included, once per job); ratios side by side in each "
             "repetition, median (min–max) over the repetitions.", "",
             "| workload | items | lookup / plain | lookup-history / plain | lookup-history / lookup | "
             "lookup-history / lookup, generation alone | history tokens kept / drafted from all sources | "
             "texts parted from plain |",
             "|---|---|---|---|---|---|---|---|"]
    summary, notes = {}, []
    for wl in files:
        per = {m: [r for r in runs if r["workload"] == wl and r["mode"] == m] for m in MODES}
        speed = {m: [r["tokens"] / r["seconds"] for r in per[m]] for m in MODES}
        lp = [x / y for x, y in zip(speed["lookup"], speed["plain"])]
        hp = [x / y for x, y in zip(speed["lookup-history"], speed["plain"])]
        hl = [x / y for x, y in zip(speed["lookup-history"], speed["lookup"])]
        gen = {m: [decode_rate(r["rows"]) for r in per[m]] for m in MODES}
        hl_gen = [x / y for x, y in zip(gen["lookup-history"], gen["lookup"])]
        ref = per["plain"][0]["rows"]
        diff = sorted({d for m in ("lookup", "lookup-history") for r in per[m] for d in parted(ref, r["rows"])})
        items = {json.loads(x)["id"]: json.loads(x) for x in files[wl].read_text().splitlines() if x.strip()}
        why = verdicts(base[:2], items, {r["id"]: r["text"] for r in ref}, diff, a.max_tokens)
        notes += [f"- {wl} {v}" for v in why]
        last = per["lookup-history"][-1]["spec"]
        summary[wl] = {"lookup/plain": lp, "history/plain": hp, "history/lookup": hl,
                       "history/lookup generation": hl_gen, "parted": why}
        lines.append(f"| {wl} | {len(ref)} | {spread(lp)} | {spread(hp)} | {spread(hl)} | {spread(hl_gen)} | "
                     f"{last['history']} of "
                     f"{last['accepted']} kept / {last['drafted']} drafted | {len(diff)} |")
    if notes:
        lines += ["", "Texts that parted from plain decoding's (item: the token, the target's top-2 margin there):",
                  "", *notes]
    if loops:
        r = [x["shell_loop"] / x["parallel4"] for x in loops]
        each = ", ".join(f"{x['parallel4']:.0f} s vs {x['shell_loop']:.0f} s" for x in loops)
        lines += ["", f"`--batch --parallel 4` with history against a shell loop of single `specli run` calls "
                      f"(extract, {loops[0]['items']} items): {spread(r)} ({each})."]
        summary["parallel4_vs_loop"] = r
    md = "\n".join(lines) + "\n"
    print(md)
    Path(a.out + ".md").write_text(md)
    Path(a.out + ".json").write_text(json.dumps({"summary": summary, "runs": runs, "loops": loops}, indent=1))


if __name__ == "__main__":
    raise SystemExit(main())
