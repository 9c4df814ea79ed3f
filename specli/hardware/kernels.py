"""What a batched pass costs per weight type on this machine: each type's probe model
(:mod:`specli.hardware.kernel_models`) timed through llama.cpp at every row count from 1 to 16
and at 32, once per machine and llama.cpp build, cached beside the calibration (with its
busy-machine guard). Every count, not only 1, 2, 4, 8, 16: the batched kernels work in tiles of
rows (a repacked Q4_0 in 4-row tiles on AVX-512), so a pass of 4 rows can cost less than one
of 3, and a curve read off powers of two missed that (the first ``cost_curve.py --predict`` run:
up to 48 %). The table prices a weight
of each type at each row count; :mod:`specli.hardware.predict` turns it into any file's verify
curve from its header alone.

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
REPS = 7  # rounds per row count; the slowest of each is dropped before the busy-machine guard
CHEAP = 3.0  # a type whose 8 rows cost at most this many single rows "verifies cheaply"


def time_type(path: str, shape: kernel_models.Shape, rows=ROWS, reps: int = REPS,
              threads: int | None = None) -> tuple[list[float], list[list[float]]]:
    """Seconds per weight of one type's model at each row count (the median of ``reps``), and
    the raw timings (for the busy-machine guard)."""
    m = Model(path)
    try:
        ctx = Context(m, ContextConfig(n_ctx=2 * max(rows) + 8, n_batch=max(rows), n_threads=threads))
        try:
            times = calibrate.block_timings(ctx, list(rows), reps)
        finally:
            ctx.close()
    finally:
        m.close()
    n = shape.matmul_elements()
    return [statistics.median(times[r]) / n for r in rows], [times[r] for r in rows]


def measure(types: tuple[str, ...] = kernel_models.TYPES, shape: kernel_models.Shape = kernel_models.DEFAULT_SHAPE,
            reps: int = REPS, threads: int | None = None, folder: Path | None = None,
            progress: Callable[[str], None] | None = None) -> tuple[dict, list[list[float]]]:
    """Time every type; returns the table and, per type and row count, the timings the
    busy-machine guard judges: every round's but the slowest (one round a neighbour slowed is
    not a busy machine). Without ``folder``, the probe models (1.5 GB for all types) are made in
    a temporary folder of specli's cache and removed afterwards: they serve this measurement
    only, and are made again (in a minute) if the machine is measured again."""
    if folder is None:
        cache_root().mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="kernel-probes-", dir=cache_root()) as tmp:
            return measure(types, shape, reps, threads, Path(tmp), progress)
    Model(str(_f32(folder, shape)), vocab_only=True).close()  # llama.cpp logs to specli before it quantises
    if progress:
        progress(f"making the probe models ({', '.join(types)}) with llama.cpp's quantizer")
    paths = kernel_models.probe_models(folder, types, shape, threads)
    table: dict = {"rows": list(ROWS), "types": {}, "threads": threads or 0,
                   "shape": [shape.d, shape.ff, shape.n_layer, shape.n_vocab]}
    timings: list[list[float]] = []
    for t, p in paths.items():
        if progress:
            progress(f"timing {t} at 1-16 and 32 rows")
        per_weight, raw = time_type(str(p), shape, ROWS, reps, threads)
        table["types"][t] = per_weight
        timings += [sorted(ts)[:-1] if len(ts) > 2 else ts for ts in raw]
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
