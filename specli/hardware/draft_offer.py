"""Whether a converted copy of the draft model would draft cheaper on this machine: its pass of
one token priced from the header (:mod:`specli.hardware.predict` with this machine's kernel
table) as shipped and with every matrix of the cheaper type, in passes of the target's one
token where the target is known. Said in one line where it pays (``run``, ``pairs``); the
copy itself is :mod:`specli.resolve.converted`."""

from __future__ import annotations

import os
from dataclasses import dataclass

from specli.hardware.predict import matmul_weights, pass_cost
from specli.resolve.converted import DEFAULT_TYPE
from specli.resolve.gguf_header import GGUFHeader

PAYS = 0.85  # the copy is offered when its pass costs at most this share of the shipped one


@dataclass(frozen=True)
class DraftCost:
    shipped: float  # the draft's one-token pass: seconds, or target passes when ``per_target``
    converted: float
    type_name: str
    per_target: bool

    @property
    def pays(self) -> bool:
        return self.converted <= PAYS * self.shipped

    def figures(self) -> str:
        def fmt(x: float) -> str:
            return f"{x:.2f} of a target token" if self.per_target else f"{x * 1000:.3f} ms"
        return (f"a draft token costs {fmt(self.shipped)} as shipped, {fmt(self.converted)} "
                f"with every matrix {self.type_name} (predicted)")

    def to_json(self) -> dict:
        return {"type": self.type_name, "shipped": round(self.shipped, 4), "converted": round(self.converted, 4),
                "per_target_token": self.per_target, "pays": self.pays}


def draft_cost(dh: GGUFHeader, table: dict | None, th: GGUFHeader | None = None,
               type_name: str = DEFAULT_TYPE) -> DraftCost | None:
    """The draft's predicted one-token pass as shipped and converted; None without a table."""
    if table is None:
        return None
    w = matmul_weights(dh)
    shipped = pass_cost(w, table, 1)
    converted = pass_cost([(n, type_name, x) for n, _, x in w], table, 1)
    unit = pass_cost(matmul_weights(th), table, 1) if th is not None else 0.0
    if unit > 0:
        return DraftCost(shipped / unit, converted / unit, type_name, True)
    return DraftCost(shipped, converted, type_name, False)


def offer_line(ref: str, cost: DraftCost | None) -> str | None:
    """One line offering the converted copy, when it would pay (None otherwise)."""
    if cost is None or not cost.pays:
        return None
    return (f"note: the draft's quant types run slowly on this CPU: {cost.figures()}; "
            f"make that copy once with: specli convert-draft {ref} (--draft auto then uses it; "
            "the target's text does not change)")


def pair_cost(target: str, draft: str, table: dict | None) -> DraftCost | None:
    """:func:`draft_cost` of two local files (None without a table)."""
    from specli.resolve.gguf_header import read_gguf

    return None if table is None else draft_cost(read_gguf(draft), table, read_gguf(target))


def run_line(target: str, draft: str | None, table: dict | None = None) -> str | None:
    """``run``'s line about the draft model ``draft`` drafting for ``target`` (files): the
    offer of a converted copy where it would pay, or the copy to use where it exists (None:
    nothing to say, or no table)."""
    from specli.hardware import calibrate
    from specli.resolve import converted
    from specli.resolve.gguf_header import read_gguf

    if draft is None or os.path.dirname(os.path.realpath(draft)) == os.path.realpath(converted.folder()):
        return None
    table = table if table is not None else calibrate.kernel_table()
    if table is None:
        return None
    cost = draft_cost(read_gguf(draft), table, read_gguf(target))
    if cost is None or not cost.pays:
        return None
    copy = converted.existing(draft, cost.type_name)
    if copy is not None:
        return f"note: {cost.figures()}; the converted copy is made: --draft auto or --draft {copy} uses it"
    return offer_line(draft, cost)
