"""A file's verify curve predicted from its GGUF header alone: every matrix the forward pass
multiplies (the output matrix included; the embedding table is looked up, unless it doubles as
the output matrix), priced per weight by its type's kernel cost at that many rows on this
machine (:mod:`specli.hardware.kernels`' table). cost(k + 1 rows) / cost(1 row) sets what
speculation can gain: with every draft right, a step yields k + 1 tokens for that cost.

No llama.cpp here: a Hub file's header read remotely is priced like a local one."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from specli.resolve.gguf_header import GGUFHeader

K_MAX = 15  # the curve runs over blocks of 1..16 tokens
FLATTER = 0.85  # another quant "verifies clearly cheaper" when its 8-token cost is at most this share


def per_weight(table: dict, type_name: str, rows: int) -> float | None:
    """Seconds per weight of ``type_name`` in a pass of ``rows`` rows, read off the table's row
    counts (linear between two, and beyond the last); None when the type was not timed."""
    costs = table.get("types", {}).get(type_name)
    pts = table.get("rows", [])
    if not costs or len(costs) != len(pts):
        return None
    if rows <= pts[0]:
        return float(costs[0])
    for (r0, c0), (r1, c1) in itertools.pairwise(zip(pts, costs, strict=True)):
        if rows <= r1 or r1 == pts[-1]:
            return float(c0 + (rows - r0) * (c1 - c0) / (r1 - r0))
    return float(costs[-1])


def _unknown(table: dict, rows: int) -> float:
    """A type the table lacks: the table's mean single-row cost, growing with every row (the
    row-by-row vec_dot path, llama.cpp's fallback)."""
    ones = [c[0] for c in table.get("types", {}).values() if c]
    return rows * (sum(ones) / len(ones) if ones else 1.0)


def matmul_weights(h: GGUFHeader) -> list[tuple[str, str, float]]:
    """(tensor, type, weights read per token) of every matrix a token's pass multiplies. Expert
    tensors count the share of experts a token uses."""
    names = {t.name for t in h.tensors}
    tied = "output.weight" not in names
    used = float(h.arch_key("expert_used_count", 0) or 0)
    total = float(h.arch_key("expert_count", 0) or 0)
    out = []
    for t in h.tensors:
        if len([d for d in t.shape if d > 1]) < 2:
            continue
        if t.name == "token_embd.weight" and not tied:
            continue
        n = 1.0
        for d in t.shape:
            n *= d
        if "_exps" in t.name and used and total:
            n *= used / total
        out.append((t.name, t.type_name, n))
    return out


def pass_cost(weights: list[tuple[str, str, float]], table: dict, rows: int) -> float:
    """Predicted seconds of the matrix products of a pass over ``rows`` rows."""
    total = 0.0
    for _, type_name, n in weights:
        c = per_weight(table, type_name, rows)
        total += n * (c if c is not None else _unknown(table, rows))
    return total


def verify_curve(h: GGUFHeader, table: dict, k_max: int = K_MAX) -> list[float]:
    """cost(k + 1 rows) / cost(1 row), k = 0..k_max. It may fall where the kernels' row tiles
    fill up (a repacked Q4_0 file verifies 4 tokens for less than 3), as the measured curve does."""
    w = matmul_weights(h)
    one = pass_cost(w, table, 1) or 1.0
    return [pass_cost(w, table, k + 1) / one for k in range(k_max + 1)]


def ceiling(curve: list[float]) -> tuple[int, float]:
    """(k, speed-up) of the best draft length with perfect drafts: max over k of (k+1)/cost."""
    return max(((k, (k + 1) / c) for k, c in enumerate(curve) if c > 0), key=lambda p: p[1], default=(0, 1.0))


@dataclass(frozen=True)
class Prediction:
    curve: list[float]

    @property
    def best(self) -> tuple[int, float]:
        return ceiling(self.curve)

    def at(self, tokens: int) -> float:
        return self.curve[min(tokens, len(self.curve)) - 1]

    def line(self) -> str:
        k, up = self.best
        return (f"verify cost here (predicted from the header): 4 tokens {self.at(4):.1f}×, 8 tokens "
                f"{self.at(8):.1f}× one token; speculation's ceiling {up:.2f}× plain (perfect drafts of {k})")

    def to_json(self) -> dict:
        k, up = self.best
        return {"verify_curve": [round(c, 3) for c in self.curve], "verify_4": round(self.at(4), 3),
                "verify_8": round(self.at(8), 3), "ceiling": round(up, 3), "ceiling_draft_length": k}


def predict(h: GGUFHeader, table: dict | None) -> Prediction | None:
    """The header's predicted curve, None without a kernel table for this machine."""
    return None if table is None else Prediction(verify_curve(h, table))


def clearly_flatter(mine: Prediction, other: Prediction) -> bool:
    return other.at(8) <= FLATTER * mine.at(8)
