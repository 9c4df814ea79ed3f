"""What a file's quant means for speculation on this machine, said where people choose a file
(`specli check`, `pull`, `pairs`, `run`): its predicted verify cost (:mod:`specli.hardware.predict`
with this machine's kernel table) and, when the local stores or its Hub repo hold the same
model in a quant that verifies clearly cheaper, that file and the ``--target`` to use. The
target is never switched: another file is another model."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from specli.errors import SpecliError
from specli.hardware import calibrate
from specli.hardware.predict import Prediction, clearly_flatter, predict
from specli.resolve import hub, local, models
from specli.resolve.gguf_header import GGUFHeader, read_gguf

DAY = 86400.0
HUB_QUANTS = 12  # most other quants of a Hub repo whose headers are read (a range request each)
NOT_MEASURED = ("verify cost here: not predicted (this machine's kernel costs are not measured: "
                "specli doctor --kernels)")


def prediction(h: GGUFHeader, table: dict | None = None) -> Prediction | None:
    return predict(h, table if table is not None else calibrate.kernel_table())


def verify_line(h: GGUFHeader, table: dict | None = None) -> str:
    p = prediction(h, table)
    return p.line() if p else NOT_MEASURED


def verify_json(h: GGUFHeader, table: dict | None = None) -> dict:
    p = prediction(h, table)
    return p.to_json() if p else {"verify_curve": None}


@dataclass(frozen=True)
class Alternative:
    ref: str  # what --target takes
    quant: str
    pred: Prediction


def local_alternatives(h: GGUFHeader, path: str | None, table: dict,
                       models: list[local.LocalModel] | None = None) -> list[Alternative]:
    """The same model in the local stores, other files, with their predicted curves."""
    out = []
    for m in local.other_files(h, [path] if path else [], models):
        try:
            p = predict(read_gguf(m.path), table)
        except SpecliError:
            continue
        if p:
            out.append(Alternative(m.found.ref, m.summary.quant, p))
    return out


def hub_alternatives(ref: str, table: dict) -> list[Alternative]:
    """The other quants of a Hub reference's repo, their headers read remotely."""
    try:
        c = models.classify(ref)
    except SpecliError:
        return []
    r = c.hub if c.kind == "hub" else None
    if r is None:
        return []
    try:
        files = hub.list_files(r)
        mine = hub.quant_of(hub.pick_files(files, r)[0])
    except SpecliError:
        return []
    quants = sorted({q for f in files if f.lower().endswith(".gguf") and "mmproj" not in f.lower()
                     and (q := hub.quant_of(f)) and q != mine})
    rev = f"@{r.revision}" if r.revision else ""
    remembered = _remembered()
    out = []
    for q in quants[:HUB_QUANTS]:
        key = f"{calibrate.kernels_entry()}:{r.repo}:{q}{rev}"
        if key not in remembered:
            try:
                p = predict(hub.header(hub.HubRef(r.repo, q, None, r.revision)), table)
            except SpecliError:
                continue
            remembered[key] = [time.time(), p.curve if p else None]
        curve = remembered[key][1]
        if curve:
            out.append(Alternative(f"{r.repo}:{q}{rev}", q, Prediction(curve)))
    _remember(remembered)
    return out


def _advice_file():
    from specli.util import cache_root
    return cache_root() / "quant-advice.json"


def _remembered() -> dict:
    """Hub quants' predicted curves read before (a day at most): `run` need not read a repo's
    headers again each time."""
    try:
        d = json.loads(_advice_file().read_text())
        now = time.time()
        return {k: v for k, v in d.items() if now - float(v[0]) < DAY}
    except (OSError, ValueError, TypeError, IndexError, AttributeError):
        return {}


def _remember(curves: dict) -> None:
    from specli.util import store_json
    store_json(_advice_file(), curves)  # a read-only cache only costs the header reads next time


def cheaper_quant(ref: str | None, h: GGUFHeader, path: str | None, table: dict | None = None,
                  models: list[local.LocalModel] | None = None) -> tuple[Prediction, Alternative] | None:
    """This file's prediction and the same model's flattest clearly cheaper quant, local or on
    the Hub; None when there is none (or no kernel table)."""
    table = table if table is not None else calibrate.kernel_table()
    mine = predict(h, table)
    if mine is None:
        return None
    alts = local_alternatives(h, path, table, models) + (hub_alternatives(ref, table) if ref else [])
    alts = [a for a in alts if clearly_flatter(mine, a.pred)]
    return (mine, min(alts, key=lambda a: a.pred.at(8))) if alts else None


def flatter_line(ref: str | None, h: GGUFHeader, path: str | None, table: dict | None = None,
                 models: list[local.LocalModel] | None = None) -> str | None:
    """One line naming the flattest clearly cheaper quant of the same model, with the figures
    and the ``--target`` to use; None when there is none."""
    return say(cheaper_quant(ref, h, path, table, models))


def say(found: tuple[Prediction, Alternative] | None) -> str | None:
    """:func:`cheaper_quant`'s finding in one line (None: nothing to say)."""
    if found is None:
        return None
    mine, best = found
    return (f"note: the same model as {best.quant} verifies clearly cheaper on this machine: 8 tokens cost "
            f"{best.pred.at(8):.1f}× one token there, {mine.at(8):.1f}× in this file (speculation's ceiling "
            f"{best.pred.best[1]:.2f}× vs {mine.best[1]:.2f}×); to use it: --target {best.ref} "
            "(another file is another model: specli does not switch on its own)")


def cheaper_json(found: tuple[Prediction, Alternative] | None) -> dict | None:
    if found is None:
        return None
    _, best = found
    return {"target": best.ref, "quant": best.quant, **best.pred.to_json()}


def cpu_file_line(profile, table: dict | None = None) -> str | None:
    """On a CPU, the profile's CPU file (``cpu_target``: the model in a quant llama.cpp runs
    batched cheaply, where the publisher has one) named with its ``--target``, when this
    machine's kernel table says its type verifies cheaply here; None otherwise (no such file,
    no table measured, or a type that is not cheap on this CPU)."""
    cpu = profile.cpu_target
    table = table if table is not None else calibrate.kernel_table()
    if cpu is None or table is None:
        return None
    from specli.hardware.kernels import CHEAP, growth

    r = hub.parse_hub_ref(cpu.ref)
    quant = (r.quant.upper() if r.quant else hub.quant_of(r.filename or "")) if r else hub.quant_of(cpu.ref)
    g = growth(table, quant, 8) if quant else None
    if g is None or g > CHEAP:
        return None
    return (f"note: profile {profile.name} names a CPU file of this model, {quant}, whose weights verify cheaply "
            f"here (8 tokens cost {g:.1f}× one token for that type); to use it: --target {cpu.ref} (another file "
            "is another model: specli does not switch on its own)")
