"""Calibration: measured once per model + backend + threads, then read from the cache."""

import itertools
import json

import numpy as np
import pytest

import specli.engine as engine
from specli.engine import Context, ContextConfig, Model
from specli.hardware import calibrate


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLI_CACHE", str(tmp_path / "specli"))
    return tmp_path / "specli" / "calibration.json"


def test_verify_costs_are_cached(cache, tiny_target, monkeypatch):
    monkeypatch.setattr(calibrate, "steady", lambda timings: True)  # however busy the machine is
    m = Model(tiny_target)
    ctx = Context(m, ContextConfig(n_ctx=512, n_threads=2))
    calls = ctx.n_decode_calls
    costs = calibrate.verify_costs(ctx, 8)
    assert len(costs) == 9 and all(c > 0 for c in costs)
    assert ctx.n_decode_calls > calls + 9  # it measured
    assert cache.exists() and any(k.startswith("verify:") for k in json.loads(cache.read_text()))
    calls = ctx.n_decode_calls
    assert calibrate.verify_costs(ctx, 8) == costs
    assert ctx.n_decode_calls == calls  # the second run starts calibrated: no passes
    # another thread count is another machine setting: measured again
    other = Context(m, ContextConfig(n_ctx=512, n_threads=1))
    n = other.n_decode_calls
    calibrate.verify_costs(other, 8)
    assert other.n_decode_calls > n
    # the context's own cache is left as it was
    ctx.eval(m.tokenize("hello world"))
    before = list(ctx.tokens)
    calibrate.verify_costs(ctx, 8, use_cache=False)
    assert ctx.tokens == before


def test_a_calibration_timed_on_a_busy_machine_is_not_cached(cache, tiny_target, monkeypatch):
    assert calibrate.steady([[1.0, 1.2, 1.1], [2.0, 2.9]]) and not calibrate.steady([[1.0, 1.2], [2.0, 3.1]])
    monkeypatch.setattr(calibrate, "steady", lambda timings: False)
    m = Model(tiny_target)
    ctx = Context(m, ContextConfig(n_ctx=512, n_threads=2))
    costs = calibrate.verify_costs(ctx, 8)
    assert len(costs) == 9 and all(c > 0 for c in costs)
    stored = [v for k, v in json.loads(cache.read_text()).items() if k.startswith("verify:")]
    assert stored == [{"noisy": costs}]  # kept marked, never read back as a calibration
    calls = ctx.n_decode_calls
    calibrate.verify_costs(ctx, 8)
    assert ctx.n_decode_calls > calls  # the next run measures again


def test_interpolation_between_measured_points():
    # every block of 1..16 tokens timed (the kernels' row tiles make a sawtooth), then 24 and 32
    assert calibrate.measured_points(16) == [*range(16), 16]
    assert calibrate.measured_points(31) == [*range(16), 23, 31]
    pts = {0: 1.0, 4: 3.0, 7: 6.0}
    assert calibrate.interpolate(pts, 7) == [1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0]


def test_a_measured_dip_is_kept(tiny_target, monkeypatch, tmp_path):
    """A block that fills the kernels' row tiles costs less than a smaller one (a repacked
    Q4_0 file: 4 rows for 1.7 single rows, 3 for 2.5): the curve keeps the dip, so the
    controller drafts to that length."""
    monkeypatch.setenv("SPECLI_CACHE", str(tmp_path))
    saw = {1: 1.0, 2: 1.8, 3: 2.5, 4: 1.7, 5: 2.5, 6: 3.2, 7: 3.9, 8: 3.0, 9: 3.8}
    monkeypatch.setattr(calibrate, "_time_blocks",
                        lambda ctx, sizes, reps, depth: {n: [saw[n]] * reps for n in sizes})
    m = Model(tiny_target)
    ctx = Context(m, ContextConfig(n_ctx=256))
    try:
        costs = calibrate.verify_costs(ctx, 8)
    finally:
        ctx.close()
        m.close()
    assert costs == [saw[k + 1] for k in range(9)]
    from specli.speculate.controller import best_length
    # drafts right 8 times in 10: 3 drafted tokens (a block of 4, at the dip) pay best; a curve
    # priced never falling (3 tokens as dear as 2) would have chosen another length
    assert best_length(0.8, costs, 0.0, 8)[0] == 3
    assert best_length(0.8, list(itertools.accumulate(costs, max)), 0.0, 8)[0] != 3


def test_rollback_refused_by_the_model_memory_decodes_the_prefix_again(tiny_target, monkeypatch):
    """A memory that cannot drop a partial sequence (and no checkpoint to go back to): the kept
    prefix is decoded again, and the cache ends exactly as a clean one (hybrid and recurrent
    models: tests/test_hybrid.py)."""
    m = Model(tiny_target)
    cfg = ContextConfig(n_ctx=512, f32_kv=True)
    ctx = Context(m, cfg)
    toks = m.tokenize("one two three four")
    ctx.eval(toks)
    monkeypatch.setattr(engine.L, "llama_memory_seq_rm", lambda *a: False)
    ctx.rollback(2)
    assert ctx.tokens == toks[:2] and ctx.n_restored == 1 and ctx.n_replayed == 2
    monkeypatch.undo()
    got = ctx.eval([toks[3]])[0].copy()
    clean = Context(m, cfg)
    np.testing.assert_allclose(got, clean.eval(toks[:2] + [toks[3]])[0], atol=1e-4)


def test_draft_on_cpu_pays_only_from_measurements(cache, tiny_target, tiny_draft):
    assert calibrate.draft_on_cpu_pays(tiny_target, tiny_draft, 2, 512, 8) is None  # nothing measured
    d = {"version": calibrate.CALIBRATION_VERSION,
         calibrate.entry("verify", tiny_target, -1, 2, 512, 8): [0.01] * 9,  # GPU: flat curve
         calibrate.entry("draft", tiny_draft, 0, 2, 512, 0): 0.002}
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(d))
    assert calibrate.draft_on_cpu_pays(tiny_target, tiny_draft, 2, 512, 8) is True
    d[calibrate.entry("draft", tiny_draft, 0, 2, 512, 0)] = 0.02  # slower than the target itself
    cache.write_text(json.dumps(d))
    assert calibrate.draft_on_cpu_pays(tiny_target, tiny_draft, 2, 512, 8) is False


def test_a_run_slower_than_plain_says_so(cache, tiny_target):
    from specli.session import Options, Session
    from specli.speculate.loop import Stats

    sess = Session(Options(target=tiny_target, draft="lookup"))
    sess.drafter.ctl.cost.verify[0] = 0.001  # plain decoding measured at 1000 tok/s
    st = Stats(generated=100, t_generate=0.2)  # this run: 500 tok/s
    assert sess.slower_than_plain(st).startswith("note: speculation ran at 0.50x the measured plain speed")
    assert sess.slower_than_plain(Stats(generated=100, t_generate=0.1)) is None
    sess.close()


def test_the_batch_curve_prices_a_pass_as_the_next_size_timed_and_is_cached(cache, tiny_target, monkeypatch):
    """A batch pass over n rows: the sizes timed (every one to 8, 12, 16, multiples of 16, the
    most) priced as measured, a size between two timed ones as the bigger (CPU tiles: a line
    between them would call the first rows of the next tile nearly free), cached like the
    verify curve."""
    assert calibrate.batch_points(40) == [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 32, 40]
    monkeypatch.setattr(calibrate, "steady", lambda timings: True)
    timed = {}

    def fake(ctx, sizes, reps, depth):
        timed.update({n: [0.01 * (n if n <= 8 else 8 + n // 16)] for n in sizes})  # steps past 8 rows
        return {n: list(ts) for n, ts in timed.items()}

    monkeypatch.setattr(calibrate, "_time_blocks", fake)
    ctx = Context(Model(tiny_target), ContextConfig(n_ctx=512, n_threads=2, n_seq=4))
    costs = calibrate.batch_costs(ctx, 40)
    assert sorted(timed) == calibrate.batch_points(40) and len(costs) == 40
    assert costs[7] == pytest.approx(0.08) and costs[8:12] == [pytest.approx(0.08)] * 4  # 9-12 rows: as 12
    assert costs[16:32] == [pytest.approx(0.10)] * 16 and costs[39] == pytest.approx(0.10)
    timed.clear()
    assert calibrate.batch_costs(ctx, 40) == costs and not timed  # the second run reads the cache


def test_the_batch_curve_is_measured_on_a_real_context(cache, tiny_target):
    ctx = Context(Model(tiny_target), ContextConfig(n_ctx=256, n_threads=2, n_seq=2))
    ctx.eval(ctx.model.tokenize("hello world"))
    before = list(ctx.tokens)
    costs = calibrate.batch_costs(ctx, 20, reps=1)
    assert len(costs) == 20 and costs == sorted(costs) and costs[0] > 0
    assert ctx.tokens == before  # the context's cache is left as it was


def test_a_draft_token_cost_timed_on_a_busy_machine_is_not_cached(cache, tiny_draft, monkeypatch):
    ctx = Context(Model(tiny_draft), ContextConfig(n_ctx=512, n_threads=2))
    monkeypatch.setattr(calibrate, "steady", lambda timings: False)
    cost = calibrate.draft_token_cost(ctx)
    stored = [v for k, v in json.loads(cache.read_text()).items() if k.startswith("draft:")]
    assert cost > 0 and stored == [{"noisy": cost}]
    calls = ctx.n_decode_calls
    calibrate.draft_token_cost(ctx)
    assert ctx.n_decode_calls > calls  # measured again
    monkeypatch.setattr(calibrate, "steady", lambda timings: True)
    cost = calibrate.draft_token_cost(ctx)
    calls = ctx.n_decode_calls
    assert calibrate.draft_token_cost(ctx) == cost and ctx.n_decode_calls == calls  # a steady one is kept
