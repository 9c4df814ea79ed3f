"""Per-type kernel costs (timed through llama.cpp on tiny one-type models) and the verify curve
predicted from a header with a FIXED cost table: nothing here depends on this machine's speed."""

from __future__ import annotations

import pytest
from gguf.constants import GGMLQuantizationType as Q

from specli.hardware import kernel_models, kernels, predict
from specli.resolve.gguf_header import GGUFHeader, TensorInfo

ROWS = [1, 2, 4, 8, 16, 32]
# Q4_0 repacked (8 rows cost 2 single rows), Q6_K row by row (8 rows cost 8)
TABLE = {"rows": ROWS, "types": {"Q4_0": [1e-9 * (1 + (r - 1) / 7) for r in ROWS],
                                 "Q6_K": [2e-9 * r for r in ROWS],
                                 "F32": [4e-9 * r for r in ROWS]}}


def header(types: dict[str, Q], d: int = 256, vocab: int = 1024, n_layer: int = 2) -> GGUFHeader:
    shapes = {"token_embd.weight": (d, vocab), "output.weight": (d, vocab), "output_norm.weight": (d,)}
    for i in range(n_layer):
        for n in ("attn_q", "attn_k", "attn_v", "attn_output"):
            shapes[f"blk.{i}.{n}.weight"] = (d, d)
        shapes[f"blk.{i}.ffn_up.weight"] = (d, 4 * d)
        shapes[f"blk.{i}.ffn_down.weight"] = (4 * d, d)
    tensors = [TensorInfo(n, s, types.get(n, types["*"]) if len(s) > 1 else Q.F32, 0) for n, s in shapes.items()]
    return GGUFHeader(3, {"general.architecture": "llama"}, tensors, 0)


def test_all_q4_0_is_flatter_than_a_q6_k_output():
    pure = predict.verify_curve(header({"*": Q.Q4_0}), TABLE)
    mixed = predict.verify_curve(header({"*": Q.Q4_0, "output.weight": Q.Q6_K}), TABLE)
    assert len(pure) == len(mixed) == 16
    assert pure[0] == mixed[0] == 1.0
    assert pure[7] == pytest.approx(2.0)  # 8 rows of Q4_0: two single rows, by the table
    assert mixed[7] > pure[7] + 0.5
    for c in (pure, mixed):
        assert all(b >= a for a, b in zip(c, c[1:]))
    assert predict.clearly_flatter(predict.Prediction(mixed), predict.Prediction(pure))
    assert not predict.clearly_flatter(predict.Prediction(pure), predict.Prediction(mixed))


def test_embedding_counts_only_as_a_tied_output():
    h = header({"*": Q.Q4_0, "token_embd.weight": Q.Q6_K})
    assert "token_embd.weight" not in [n for n, _, _ in predict.matmul_weights(h)]
    tied = GGUFHeader(3, h.metadata, [t for t in h.tensors if t.name != "output.weight"], 0)
    assert "token_embd.weight" in [n for n, _, _ in predict.matmul_weights(tied)]


def test_ceiling_and_unknown_types():
    pure = predict.Prediction(predict.verify_curve(header({"*": Q.Q4_0}), TABLE))
    k, up = pure.best
    assert k == 15 and up == pytest.approx(16 / pure.curve[15])
    assert set(pure.to_json()) >= {"verify_curve", "verify_4", "verify_8", "ceiling"}
    # a type the table lacks grows with every row
    odd = predict.verify_curve(header({"*": Q.Q5_K}), TABLE)
    assert odd[7] == pytest.approx(8.0)
    assert predict.per_weight(TABLE, "Q4_0", 3) == pytest.approx(1e-9 * (1 + 2 / 7))
    assert predict.per_weight(TABLE, "Q6_K", 40) == pytest.approx(2e-9 * 40)


def test_doctor_line_names_cheap_types():
    line = kernels.doctor_line(TABLE)
    assert "Q4_0 2.0×" in line.split("row by row")[0] and "Q6_K 8.0×" in line.split("row by row")[1]
    assert "not measured" in kernels.doctor_line(None)


def test_probe_models_are_one_type_each(tmp_path):
    from specli.resolve.gguf_header import read_gguf

    shape = kernel_models.Shape(d=256, ff=256, n_layer=1, n_head=4, n_vocab=512)
    table, timings = kernels.measure(("Q4_0", "Q6_K"), shape, reps=1, folder=tmp_path, rounds=1)
    for t in ("Q4_0", "Q6_K"):
        h = read_gguf(str(next(tmp_path.glob(f"probe-*-{t}.gguf"))))
        assert {x.type_name for x in h.tensors if len(x.shape) > 1} == {t}
        assert len(table["types"][t]) == len(kernels.ROWS) and all(c > 0 for c in table["types"][t])
    # every row count from 1 to 16 (the kernels' row tiles), and 32
    assert table["rows"] == [*range(1, 17), 32] and len(timings) == 2 * len(kernels.ROWS)


def test_without_a_folder_the_probes_are_made_and_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLI_CACHE", str(tmp_path / "cache"))
    shape = kernel_models.Shape(d=256, ff=256, n_layer=1, n_head=4, n_vocab=512)
    table, timings = kernels.measure(("Q4_0",), shape, reps=2, rounds=2)
    assert set(table["types"]) == {"Q4_0"}
    assert all(len(ts) == 3 for ts in timings)  # 2 rounds of 2; the slowest quarter left out of the guard's input
    assert not list((tmp_path / "cache").rglob("*.gguf"))


def test_benchmark_report_compares_predicted_and_measured(monkeypatch, tmp_path):
    """cost_curve.py --predict's report, with the measurement stubbed (nothing timed here)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import cost_predict

    h = header({"*": Q.Q4_0, "output.weight": Q.Q6_K})
    pred = predict.verify_curve(h, TABLE)
    monkeypatch.setattr(cost_predict.models, "resolve", lambda ref, progress=None: f"/x/{ref}.gguf")
    monkeypatch.setattr(cost_predict, "read_gguf", lambda path: h)
    monkeypatch.setattr(cost_predict, "measured_curve", lambda *a: [p * 1.1 for p in pred])
    monkeypatch.setattr(cost_predict.kernels, "costs", lambda **kw: TABLE)
    monkeypatch.setattr(cost_predict.calibrate, "kernel_table", lambda: TABLE)
    monkeypatch.setattr(cost_predict, "system_info", lambda: "test")
    (row,) = cost_predict.compare(["a"], 2, 0, False, str(tmp_path))
    assert row["within_goal"] and row["max_error"] == pytest.approx(0.091, abs=0.002)
    md = (tmp_path / "cost_curve_predicted.md").read_text()
    assert "| 8 | " in md and "goal met" in md and "cached table" in md
    # --kernels: the file's types timed in every round, between the curves; the median table predicts
    timed = []
    slower = {**TABLE, "types": {t: [2 * c for c in cs] for t, cs in TABLE["types"].items()}}

    def measure(types, folder, rounds):
        timed.append(types)
        return (slower if len(timed) == 2 else TABLE), []

    monkeypatch.setattr(cost_predict.kernels, "measure", measure)
    (row,) = cost_predict.compare(["a"], 2, 0, True, str(tmp_path), rounds=3)
    assert timed == [("Q4_0", "Q6_K")] * 3 and row["predicted"] == [round(x, 3) for x in pred]
    assert "in every round" in (tmp_path / "cost_curve_predicted.md").read_text()


def test_costs_are_cached_beside_the_calibration_unless_the_machine_was_busy(monkeypatch, tmp_path):
    from specli.hardware import calibrate

    monkeypatch.setenv("SPECLI_CACHE", str(tmp_path))
    assert kernels.costs() is None
    monkeypatch.setattr(kernels, "measure", lambda **kw: (TABLE, [[1.0, 3.0]]))  # one size 3x apart: busy
    said = []
    assert kernels.costs(measure_now=True, progress=said.append) == TABLE
    assert calibrate.kernel_table() is None and "busy" in said[-1]
    monkeypatch.setattr(kernels, "measure", lambda **kw: (TABLE, [[1.0, 1.1]]))
    assert kernels.costs(measure_now=True) == TABLE
    assert kernels.costs() == TABLE == calibrate.kernel_table()
