"""Measure what a verify pass of k tokens and a draft-model token cost on this machine, once
per model + backend + threads, cached so the next run starts calibrated."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from specli.engine import Context, system_info
from specli.speculate.controller import best_length
from specli.util import cache_root, store_json

CALIBRATION_VERSION = 3  # 3: verify curves timed at every block up to 16 tokens, dips kept


def _ident(path: str, n_gpu_layers: int, threads: int, n_batch: int, k_max: int) -> str:
    st = os.stat(path)
    ident = f"{os.path.basename(path)}:{st.st_size}:{n_gpu_layers}:{threads}:{n_batch}:{k_max}:{system_info()}"
    return hashlib.sha256(ident.encode()).hexdigest()[:20]


def entry(kind: str, path: str, n_gpu_layers: int, threads: int, n_batch: int, k_max: int) -> str:
    """The cache key of a calibration of ``kind`` ("verify", "draft", "mtp", ...) for the model
    file ``path`` in this placement, on this machine."""
    return f"{kind}:" + _ident(path, n_gpu_layers, threads, n_batch, k_max)


def install(kind: str, path: str, n_gpu_layers: int, threads: int, n_batch: int, k_max: int, value) -> None:
    """Record costs measured elsewhere (or fixed for a test) as this machine's calibration of
    ``kind`` for that file and placement: a verify curve (seconds by draft length), or a
    drafted token's seconds."""
    _store(entry(kind, path, n_gpu_layers, threads, n_batch, k_max), value)


def _key(ctx: Context, k_max: int) -> str:
    return _ident(ctx.model.path, ctx.model.n_gpu_layers, ctx.threads, ctx.n_batch, k_max)


TYPICAL_ACCEPTANCE = 0.8  # a same-family draft is typically right 70-90% of the time


def measured_length(target_path: str, target_gpu_layers: int, threads: int, n_batch: int, k_max: int,
                    drafter: tuple[str, str, int] | None = None) -> int | None:
    """The draft length with the best expected tokens/s at a typical acceptance, from earlier
    measurements of these files and this placement only (0: drafting does not pay); None when
    they were not measured here. ``drafter``: (kind, file, GPU layers) of what drafts, as the
    cache keys it ("draft" with the draft model's file, "mtp" with the target's); None prices
    prompt lookup (free drafts)."""
    cache = _load()
    verify = cache.get("verify:" + _ident(target_path, target_gpu_layers, threads, n_batch, k_max))
    dcost = 0.0
    if drafter:
        kind, path, layers = drafter
        dcost = cache.get(f"{kind}:" + _ident(path, layers, threads, n_batch, 0))
    if not isinstance(verify, list) or len(verify) != k_max + 1 or not isinstance(dcost, (int, float)):
        return None
    a = TYPICAL_ACCEPTANCE
    return best_length(a, [float(x) for x in verify], float(dcost), k_max, float(dcost), a)[0]


def draft_on_cpu_pays(target_path: str, draft_path: str, threads: int, n_batch: int, k_max: int) -> bool | None:
    """From earlier measurements only (None when there are none): would the draft model on
    the CPU speed up the target fully on the GPU?"""
    k = measured_length(target_path, -1, threads, n_batch, k_max, ("draft", draft_path, 0))
    return None if k is None else k > 0


def _path() -> Path:
    return cache_root() / "calibration.json"


def _load() -> dict:
    try:
        d = json.loads(_path().read_text())
        return d if d.get("version") == CALIBRATION_VERSION else {"version": CALIBRATION_VERSION}
    except (OSError, ValueError):
        return {"version": CALIBRATION_VERSION}


def _store(key: str, value) -> None:
    d = _load()
    d[key] = value
    store_json(_path(), d, indent=1)  # a read-only cache only costs a calibration next time


def _block(ctx: Context, n: int) -> list[int]:
    # ordinary text tokens; what they are does not change the cost
    base = ctx.model.tokenize(" the quick brown fox jumps over the lazy dog and then", add_special=False)
    return (base * (n // max(1, len(base)) + 1))[:n]


def _depth(ctx: Context, k_max: int) -> int:
    """Tokens cached before a timed block: a typical prompt, so attention costs what it will
    (none in a context too small for one: --ctx 8 times blocks of 8)."""
    return max(0, min(256, ctx.n_ctx - k_max - 2))


def measured_points(k_max: int) -> list[int]:
    """Draft lengths timed directly: every k up to 15 (blocks of 1..16 tokens), then blocks of
    24 and 32 and ``k_max``; the rest is interpolated and refined from real steps. Every block
    up to 16: CPU kernels work in tiles of rows, so the curve is a sawtooth (a repacked Q4_0 file
    on an AVX-512 CPU verifies 4 tokens for 1.7 single tokens and 3 for 2.4), and a curve read
    off a few sizes and never allowed to fall priced the block of 4 as one of 3, 45 % too dear."""
    pts = list(range(min(k_max, 15) + 1))
    pts += [k for k in (23, 31) if 15 < k <= k_max]
    if k_max not in pts:
        pts.append(k_max)
    return sorted(pts)


def interpolate(points: dict[int, float], k_max: int) -> list[float]:
    ks = sorted(points)
    out = []
    for k in range(k_max + 1):
        if k in points:
            out.append(points[k])
            continue
        lo = max(x for x in ks if x < k)
        hi = min(x for x in ks if x > k)
        w = (k - lo) / (hi - lo)
        out.append(points[lo] + w * (points[hi] - points[lo]))
    return out


def _time_blocks(ctx: Context, sizes: list[int], reps: int, depth: int) -> dict[int, list[float]]:
    """Seconds a pass over a block of each size in ``sizes`` (a logits row per token) takes
    after ``depth`` cached tokens: the sizes timed in turn, ``reps`` rounds (a machine whose
    speed drifts, turbo or a busy neighbour, then moves every size alike and the ratios
    hold). The context's cache is as it was afterwards."""
    saved = list(ctx.tokens)
    ctx.clear()
    prefix = _block(ctx, depth)
    ctx.eval(prefix, "none")
    for n in (min(sizes), max(sizes)):  # warm-up: the first pass of a shape allocates its graph
        ctx.eval(_block(ctx, n), "all")
        ctx.rollback(len(prefix))
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(reps):
        for n, ts in times.items():
            t = time.perf_counter()
            ctx.eval(_block(ctx, n), "all")
            ts.append(time.perf_counter() - t)
            ctx.rollback(len(prefix))
    ctx.clear()
    if saved:
        ctx.eval(saved, "none")
    return times


def _keep(key: str, value, timings):
    """Cache ``value`` measured from ``timings`` (each size's repeated timings); one timed on a
    busy machine (:func:`steady`) is kept for a look, marked, and never read back."""
    _store(key, value if steady(timings) else {"noisy": value})
    return value


def _cached_curve(key: str, length: int) -> list[float] | None:
    cached = _load().get(key)
    if isinstance(cached, list) and len(cached) == length:
        return [float(x) for x in cached]
    return None


def verify_costs(ctx: Context, k_max: int, reps: int = 3, use_cache: bool = True) -> list[float]:
    """seconds[k] for a block of k + 1 tokens with logits for every row, k = 0..k_max, the
    median of ``reps`` rounds per size (:func:`_time_blocks`)."""
    k_max = min(k_max, ctx.n_batch - 1)  # a block with a logits row per token fits one batch (tiny --ctx)
    key = "verify:" + _key(ctx, k_max)
    if use_cache and (cached := _cached_curve(key, k_max + 1)) is not None:
        return cached
    times = _time_blocks(ctx, [k + 1 for k in measured_points(k_max)], reps, _depth(ctx, k_max))
    # kept as measured, dips included: where a block fills the kernels' row tiles it does cost
    # less than a smaller one, and the controller should draft to that length (real steps
    # refine each size's price as the run goes: AdaptiveCost.observe_verify)
    medians = {n - 1: statistics.median(ts) for n, ts in times.items()}
    return _keep(key, interpolate(medians, k_max), times.values())


def batch_points(n_max: int) -> list[int]:
    """Batch passes timed directly, in rows: every size up to 8, then 12, 16 and every multiple
    of 16 (CPU kernels work in tiles of rows: a pass costs about the same from one step to
    the next, on this project's VM 9-16, 17-32, 33-48 rows), and ``n_max``."""
    pts = {n for n in range(1, 9)} | {12} | set(range(16, n_max + 1, 16)) | {n_max}
    return sorted(n for n in pts if n <= n_max)


def batch_costs(ctx: Context, n_max: int, reps: int = 3, use_cache: bool = True) -> list[float]:
    """seconds[n - 1] for one pass over n rows, n = 1..n_max (a batch of several requests'
    blocks: what the sequences are does not change the cost). Between two sizes timed
    (:func:`batch_points`) a pass is priced as the bigger one: within a tile of rows the cost
    hardly moves, and a price read off a line between two tiles would call the first row of
    the next tile nearly free."""
    n_max = max(1, min(n_max, ctx.n_batch))
    key = "batch:" + _key(ctx, n_max)
    if use_cache and (cached := _cached_curve(key, n_max)) is not None:
        return cached
    times = _time_blocks(ctx, batch_points(n_max), reps, _depth(ctx, n_max))
    medians = {n: statistics.median(ts) for n, ts in times.items()}
    pts = sorted(medians)
    costs = [medians[next(p for p in pts if p >= n)] for n in range(1, n_max + 1)]
    return _keep(key, list(itertools.accumulate(costs, max)), times.values())


NOISY = 1.5  # timings of one block size this far apart: the machine was busy while it calibrated


def steady(timings) -> bool:
    """Were the repeated timings of each size close (within ``NOISY`` of each other)? A
    calibration taken while something else held the cores is used for this run only (the
    cache marks it noisy): the next run measures again."""
    return all(max(ts) <= NOISY * min(ts) for ts in timings if ts)


def cached_cost(kind: str, ctx: Context, measure: Callable[[], float], use_cache: bool = True) -> float:
    """A per-token drafting cost measured once per model + backend + threads (``kind``: what
    drafts, e.g. "mtp"), cached like the verify curve."""
    key = f"{kind}:" + _key(ctx, 0)
    if use_cache:
        cached = _load().get(key)
        if isinstance(cached, (int, float)):
            return float(cached)
    value = measure()
    _store(key, value)
    return value


def draft_token_cost(ctx: Context, reps: int = 4, use_cache: bool = True) -> float:
    key = "draft:" + _key(ctx, 0)
    if use_cache:
        cached = _load().get(key)
        if isinstance(cached, (int, float)):
            return float(cached)
    saved = list(ctx.tokens)
    ctx.clear()
    prefix = _block(ctx, _depth(ctx, reps))
    ctx.eval(prefix, "none")
    ctx.eval(_block(ctx, 1))  # warm-up
    times = []
    for tok in _block(ctx, reps):
        t = time.perf_counter()
        ctx.eval([tok])
        times.append(time.perf_counter() - t)
    ctx.clear()
    if saved:
        ctx.eval(saved, "none")
    return _keep(key, min(times), [times])


def block_timings(ctx: Context, sizes: list[int], reps: int, depth: int = 0) -> dict[int, list[float]]:
    """Seconds of a pass over a block of each size (rows), ``reps`` rounds each (see
    :func:`_time_blocks`): what the per-type kernel costs are timed with."""
    return _time_blocks(ctx, sizes, reps, depth)


def kernels_entry() -> str:
    """The cache key of this machine's per-type kernel costs: one per llama.cpp build and CPU
    (what llama.cpp reports of it), measured with the default threads."""
    import llama_cpp

    ident = f"{getattr(llama_cpp, '__version__', '?')}:{os.cpu_count()}:{system_info()}"
    return "kernels:" + hashlib.sha256(ident.encode()).hexdigest()[:20]


def kernel_table() -> dict | None:
    """The per-type kernel costs measured (or installed) on this machine; None when there are
    none, or only a noisy measurement."""
    value = _load().get(kernels_entry())
    return value if isinstance(value, dict) and isinstance(value.get("types"), dict) else None


def install_kernels(value: dict) -> None:
    """Record a per-type kernel cost table (measured elsewhere, or fixed for a test)."""
    _store(kernels_entry(), value)


def keep_kernels(value: dict, timings) -> dict:
    """Cache a kernel cost table measured from ``timings``, with the busy-machine guard."""
    return _keep(kernels_entry(), value, timings)
