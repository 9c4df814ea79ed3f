"""What a batched pass costs per weight type on this machine: each type's probe model
(:mod:`specli.hardware.kernel_models`) timed through llama.cpp at every row count from 1 to 16
and at 32, once per machine and llama.cpp build, cached beside the calibration (with its
busy-machine guard).

Every row count, not only 1, 2, 4, 8, 16: the batched kernels work in tiles of rows (a repacked
Q4_0 in 4-row tiles on AVX-512), so a pass of 4 rows can cost less than one of 3, and a curve
read off powers of two missed that (the first ``cost_curve.py --predict`` run: up to 48 %).

The types are timed in turn, round after round (:data:`ROUNDS`), so that a spell of a slower or
faster machine, minutes long on a shared VM, moves every type alike instead of one: timed in one
go per type, the same Q4_0 probe's cost of 8 rows over one came out 2.4 in one table and 2.7-2.8
in others the same day.

The table prices a weight of each type at each row count; :mod:`specli.hardware.predict` turns
it into any file's verify curve from its header alone.

Table (JSON): ``{"rows": [1, 2, ..., 16, 32], "types": {"Q4_0": [seconds per weight at each
row count], ...}, "threads": N}``."""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

from specli.engine import Context, ContextConfig, Model
from specli.hardware import calibrate, kernel_models
from specli.hardware.predict import per_weight
from specli.util import cache_root

ROWS = (*range(1, 17), 32)
ROUNDS = 3  # passes over all the types, apart in time
REPS = 3  # timings of each row count per pass; the slowest quarter of all is left out of the busy-machine guard
CHEAP = 3.0  # a type whose 8 rows cost at most this many single rows "verifies cheaply"


def time_type(path: str, rows=ROWS, reps: int = REPS, threads: int | None = None) -> list[list[float]]:
    """Seconds of a pass of one type's model at each row count, ``reps`` timings each."""
    m = Model(path)
    try:
        ctx = Context(m, ContextConfig(n_ctx=2 * max(rows) + 8, n_batch=max(rows), n_threads=threads))
        try:
            times = calibrate.block_timings(ctx, list(rows), reps)
        finally:
            ctx.close()
    finally:
        m.close()
    return [times[r] for r in rows]


def measure(types: tuple[str, ...] = kernel_models.TYPES, shape: kernel_models.Shape = kernel_models.DEFAULT_SHAPE,
            reps: int = REPS, threads: int | None = None, folder: Path | None = None,
            progress: Callable[[str], None] | None = None, rounds: int = ROUNDS) -> tuple[dict, list[list[float]]]:
    """Time every type, the types in turn for ``rounds`` rounds of ``reps`` timings; a type's
    cost at a row count is the median of all its timings there. Returns the table and, per
    type and row count, the timings the busy-machine guard judges: the fastest three quarters
    (a pass or two a neighbour slowed in a minute is not a busy machine; a machine that is busy
    slows most of them). Without ``folder``, the probe models (1.5 GB for all types) are made in
    a temporary folder of specli's cache and removed afterwards: they serve this measurement
    only, and are made again (in a minute) if the machine is measured again."""
    if folder is None:
        cache_root().mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="kernel-probes-", dir=cache_root()) as tmp:
            return measure(types, shape, reps, threads, Path(tmp), progress, rounds)
    Model(str(_f32(folder, shape)), vocab_only=True).close()  # llama.cpp logs to specli before it quantises
    if progress:
        progress(f"making the probe models ({', '.join(types)}) with llama.cpp's quantizer")
    paths = kernel_models.probe_models(folder, types, shape, threads)
    raw: dict[str, list[list[float]]] = {t: [[] for _ in ROWS] for t in paths}
    for i in range(rounds):
        if progress:
            progress(f"timing each type at 1-16 and 32 rows (round {i + 1} of {rounds})")
        for t, p in paths.items():
            for acc, ts in zip(raw[t], time_type(str(p), ROWS, reps, threads), strict=True):
                acc += ts
    n = shape.matmul_elements()
    table: dict = {"rows": list(ROWS), "threads": threads or 0,
                   "shape": [shape.d, shape.ff, shape.n_layer, shape.n_vocab],
                   "types": {t: [statistics.median(ts) / n for ts in per_row] for t, per_row in raw.items()}}
    timings = [sorted(ts)[:max(2, len(ts) * 3 // 4)] if len(ts) > 2 else ts
               for per_row in raw.values() for ts in per_row]
    return table, timings


def _f32(folder: Path, shape: kernel_models.Shape) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / f"probe-{shape.d}x{shape.ff}x{shape.n_layer}x{shape.n_vocab}-F32.gguf"
    return p if p.exists() else kernel_models.write_f32(p, shape)


def costs(measure_now: bool = False, progress: Callable[[str], None] | None = None, **kw) -> dict | None:
    """This machine's table: cached, else measured when ``measure_now`` (and cached unless the
    machine was busy), else None."""
    if not measure_now and (t := calibrate.kernel_table()) is not None:
        return t
    if not measure_now:
        return None
    table, timings = measure(progress=progress, **kw)
    calibrate.keep_kernels(table, timings)
    if progress and not calibrate.steady(timings):
        progress("the machine was busy while the kernels were timed: these costs serve this run only "
                 "(not cached); time them again when it is idle")
    return table


def growth(table: dict, type_name: str, rows: int) -> float | None:
    """A weight of ``type_name``: the cost of ``rows`` rows over one row (None: not timed)."""
    one, n = per_weight(table, type_name, 1), per_weight(table, type_name, rows)
    return None if one is None or n is None else n / one


def cheap_types(table: dict, rows: int = 8) -> list[tuple[str, float]]:
    """The types timed, cheapest growth first: (type, cost of ``rows`` rows over one)."""
    g = [(t, growth(table, t, rows)) for t in table.get("types", {})]
    return sorted(((t, x) for t, x in g if x is not None), key=lambda p: p[1])


def doctor_line(table: dict | None) -> str:
    """``specli doctor``'s line: the types that verify cheaply here, the others."""
    if table is None:
        return ("verify cost per quant type: not measured on this machine "
                "(specli doctor --kernels times each type once, a minute or two)")
    g = cheap_types(table)
    cheap = ", ".join(f"{t} {x:.1f}×" for t, x in g if x <= CHEAP) or "none"
    slow = ", ".join(f"{t} {x:.1f}×" for t, x in g if x > CHEAP) or "none"
    return (f"quant types that verify cheaply on this CPU (8 tokens cost, in single tokens): {cheap}; "
            f"row by row: {slow}")
