"""The verify curve predicted from a file's header (specli.hardware.predict, with this machine's
per-type kernel costs) against the curve measured here, per file: ``cost_curve.py --predict``.
Writes benchmarks/results/cost_curve_predicted.{md,json}."""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from specli.engine import Context, ContextConfig, Model, system_info
from specli.hardware import calibrate, kernel_models, kernels
from specli.hardware.predict import K_MAX, Prediction, matmul_weights, verify_curve
from specli.resolve import models
from specli.resolve.gguf_header import read_gguf

GOAL = 0.15  # the prediction's largest relative error allowed at any block size


def measured_curve(path: str, threads: int, gpu_layers: int, reps: int = 7) -> list[float]:
    """cost(k + 1) / cost(1), k = 0..K_MAX, every block size timed here (no cache, nothing
    interpolated: the kernels' row tiles make the curve a sawtooth), each the median of ``reps``
    rounds after 256 cached tokens, logits for every row (as a verify pass asks)."""
    m = Model(path, n_gpu_layers=gpu_layers)
    try:
        ctx = Context(m, ContextConfig(n_ctx=4096, n_threads=threads))
        times = calibrate.block_timings(ctx, list(range(1, K_MAX + 2)), reps, depth=256)
        ctx.close()
    finally:
        m.close()
    med = [statistics.median(times[n]) for n in range(1, K_MAX + 2)]
    return [s / med[0] for s in med]


def one_file(ref: str, path: str, table: dict, curves: list[list[float]]) -> dict:
    """A file's predicted curve against its measured ones (the median of the rounds, and their
    range: the measurement's own spread on this machine)."""
    h = read_gguf(path)
    predicted = verify_curve(h, table)
    measured = [statistics.median(c[k] for c in curves) for k in range(len(predicted))]
    errors = [abs(p - m) / m for p, m in zip(predicted, measured, strict=True)]
    types: dict[str, int] = {}
    for t in h.tensors:
        types[t.type_name] = types.get(t.type_name, 0) + (t.nbytes or 0)
    return {"ref": ref, "file": os.path.basename(path), "bytes_by_type": types,
            "predicted": [round(x, 3) for x in predicted], "measured": [round(x, 3) for x in measured],
            "measured_rounds": [[round(x, 3) for x in c] for c in curves],
            "max_error": round(max(errors), 3), "mean_error": round(statistics.mean(errors[1:] or [0.0]), 3),
            "within_goal": max(errors) <= GOAL,
            "ceiling_predicted": round(Prediction(predicted).best[1], 3),
            "ceiling_measured": round(Prediction(measured).best[1], 3)}


def markdown(rows: list[dict], meta: dict) -> str:
    out = [f"# Verify curve: predicted from the header vs measured ({meta['date']})", "",
           f"Machine: {meta['machine']}, {meta['threads']} threads. llama.cpp: {meta['system']}", "",
           f"Each file's curve measured in {meta['rounds']} rounds, the files in turn (every block size timed, "
           "7 passes each after 256 cached tokens, logits for every row); the median is compared, the range "
           "is the measurement's own spread.", "",
           f"Per-type kernel costs: timed {meta.get('kernels_timed', 'before')}.", "",
           f"Goal: the prediction within {GOAL:.0%} of the measurement at every block of 1..{K_MAX + 1} tokens.", ""]
    for r in rows:
        verdict = "met" if r["within_goal"] else f"missed (largest error {r['max_error']:.0%})"
        out += [f"## {r['file']}", "", "bytes by type: " + ", ".join(
                    f"{t} {b / 2**20:.0f} MiB" for t, b in sorted(r["bytes_by_type"].items(), key=lambda p: -p[1])),
                f"ceiling with perfect drafts: predicted {r['ceiling_predicted']:.2f}×, measured "
                f"{r['ceiling_measured']:.2f}×; goal {verdict}", "",
                f"mean error over blocks of 2..{K_MAX + 1}: {r['mean_error']:.0%}", "",
                "| block (k+1) | predicted | measured (median) | measured range | error |", "|---|---|---|---|---|"]
        out += [f"| {k + 1} | {p:.2f} | {m:.2f} | {min(c[k] for c in r['measured_rounds']):.2f}–"
                f"{max(c[k] for c in r['measured_rounds']):.2f} | {abs(p - m) / m:.0%} |"
                for k, (p, m) in enumerate(zip(r["predicted"], r["measured"], strict=True))]
        out.append("")
    return "\n".join(out)


def file_types(paths: list[str]) -> tuple[str, ...]:
    """The timed types the files' matrices use."""
    used = {t for p in paths for _, t, _ in matmul_weights(read_gguf(p))}
    return tuple(t for t in kernel_models.TYPES if t in used)


def median_table(tables: list[dict]) -> dict:
    """Each type's cost at each row count: the median over the rounds' tables."""
    first = tables[0]
    return {**first, "types": {t: [statistics.median(tb["types"][t][i] for tb in tables)
                                   for i in range(len(first["rows"]))] for t in first["types"]}}


def compare(refs: list[str], threads: int, gpu_layers: int, fresh_kernels: bool, folder: str,
            rounds: int = 3) -> list[dict]:
    """With ``fresh_kernels``, the per-type costs of the files' types are timed in every round
    too, between the files' curves: this machine's speed drifts for minutes at a time, and a
    table timed at another moment than the curves carried that drift into the comparison."""
    paths = [models.resolve(ref, progress=print) for ref in refs]
    fresh = fresh_kernels or calibrate.kernel_table() is None
    curves: list[list[list[float]]] = [[] for _ in paths]
    tables: list[dict] = []
    types = file_types(paths)
    with tempfile.TemporaryDirectory(prefix="kernel-probes-") as probes:
        for i in range(rounds):  # the files (and the kernels) in turn, round after round
            if fresh:
                print(f"round {i + 1}: timing the kernels of {', '.join(types)}")
                tables.append(kernels.measure(types, folder=Path(probes), rounds=1)[0])
            for j, p in enumerate(paths):
                curves[j].append(measured_curve(p, threads, gpu_layers))
    table = median_table(tables) if fresh else kernels.costs()
    rows = [one_file(ref, p, table, c) for ref, p, c in zip(refs, paths, curves, strict=True)]
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{platform.machine()} {platform.processor()}",
            "threads": threads, "system": system_info(), "kernels": table, "rounds": rounds,
            "kernels_timed": "in every round, between the files" if fresh else "before (this machine's cached table)"}
    os.makedirs(folder, exist_ok=True)
    base = os.path.join(folder, "cost_curve_predicted")
    with open(base + ".json", "w") as f:
        json.dump({"meta": meta, "files": rows}, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(markdown(rows, meta))
    print(markdown(rows, meta))
    print(f"report: {base}.md")
    return rows
