"""Which of the target's own layers draft for it, chosen by measurement (``--draft early-exit``
or ``layer-skip`` without E or SET, and ``--draft auto`` with nothing else to draft with).

A few candidates (:func:`specli.resolve.derive.candidates`) are derived and each measured on a
short calibration text: its acceptance (how often its greedy token is the target's, along the
target's own greedy continuation) and its cost per drafted token on this machine. Each is
priced as the adaptive controller prices a drafter (:func:`specli.speculate.controller.best_length`
over the target's verify curve) and the fastest taken. ``--draft auto`` takes it only when it
beats plain decoding by the margin :data:`PAYS`; an explicit ``--draft early-exit`` takes the best
and lets the controller decline it step by step. The choice is cached next to the derived files
(``$SPECLI_CACHE/derived/<target sha>-choice.json``), so later runs load nothing to choose.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from specli.errors import SpecliError
from specli.resolve import derive
from specli.resolve.derive import EARLY_EXIT, LAYER_SKIP, Layers, SelfSpec
from specli.resolve.gguf_header import GGUFHeader, read_gguf
from specli.resolve.integrity import cached_sha256
from specli.speculate.settings import SpecSettings
from specli.util import store_json

PAYS = 1.05  # --draft auto takes a derived draft only when its priced speed beats plain decoding by this
MIN_AUTO_LAYERS = 8  # --draft auto derives none from a model of fewer layers: it has none to spare
CALIBRATION_TEXT = (
    "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n"
    "    out, i, j = [], 0, 0\n    while i < len(a) and j < len(b):\n"
    "The city council met on Tuesday to discuss the new budget. After a long debate, the members agreed that"
)
GREEDY_TOKENS = 48  # the target's own continuation the candidates are scored along
CHOICE_VERSION = 1


@dataclass
class Measured:
    """One candidate as measured: acceptance, cost per drafted token (seconds), the draft
    length the controller would pick and the priced speed over plain decoding's."""

    label: str
    acceptance: float
    token_cost: float
    k: int
    speedup: float


def derived_draft(target: str, own: SelfSpec | None, settings: SpecSettings, threads: int | None,
                  notes: list[str], progress: Callable[[str], None] | None = None) -> tuple[str, str] | None:
    """The derived draft's file and label for ``--draft early-exit[:E]`` / ``layer-skip[:SET]``
    (``own``) or, ``own`` None, for ``--draft auto`` with nothing else to draft with (None when
    none pays there)."""
    h = read_gguf(target)
    name = os.path.basename(target)
    if own is None:
        if not derivable(h):
            return None
        lay = paying(target, settings, threads, progress)
        if lay is None:
            notes.append("--draft auto: no draft derived from the target's own layers pays here (measured); "
                         "using prompt lookup")
            return None
        how = "measured to pay"
    elif own.arg:
        lay, how = derive.layers_for(own, h, name), "as asked"
    else:
        derive.check_target(h, name)
        e = derive.declared_exit(h, target) if own.kind == EARLY_EXIT else None
        if e:
            lay, how = Layers(EARLY_EXIT, derive.n_layers(h), tuple(range(e, derive.n_layers(h)))), \
                "the exit the model declares (LayerSkip)"
        else:
            lay, how = choose(target, h, (own.kind,), settings, threads, progress), "chosen by measurement"
    if progress:
        progress(f"deriving {lay.label} from {name}")
    path, new = derive.derive(target, lay, threads)
    notes.append(f"--draft {lay.label}: {len(lay.kept)} of {lay.n_layer} layers of {name}, {how}; "
                 f"{'derived' if new else 'cached'} at {path}")
    return path, lay.label


def derivable(h: GGUFHeader) -> bool:
    """Does ``--draft auto`` (or the VRAM fallback) consider a draft derived from this target:
    enough layers to spare, and no drafter of its own (MTP layers) or a head's role?"""
    return derive.n_layers(h) >= MIN_AUTO_LAYERS and not h.mtp_layers and not h.head_kind


def paying(target: str, settings: SpecSettings, threads: int | None,
           progress: Callable[[str], None] | None = None) -> Layers | None:
    """The early-exit or layer-skip draft ``--draft auto`` would take (measured once, cached),
    None when none pays (:data:`PAYS`); the hardware plan's VRAM fallback asks the same."""
    h = read_gguf(target)
    return choose(target, h, (EARLY_EXIT, LAYER_SKIP), settings, threads, progress, auto=True)


def choose(target: str, h: GGUFHeader, kinds: tuple[str, ...], settings: SpecSettings, threads: int | None,
           progress: Callable[[str], None] | None = None, auto: bool = False) -> Layers | None:
    """The best measured candidate of ``kinds`` (cached per target, kinds, draft length and
    threads); with ``auto``, None unless it pays (:data:`PAYS`)."""
    key = f"{'+'.join(kinds)}:{settings.draft_max}:{threads or 0}"
    record = load_choice(target)
    got = record.get(key)
    if not isinstance(got, dict):
        cands = [lay for k in kinds for lay in derive.candidates(k, h)]
        if not cands:
            raise SpecliError(f"{os.path.basename(target)} has {derive.n_layers(h)} layers: too few to derive "
                              f"a {' or '.join(kinds)} draft from")
        results = measure(target, cands, settings.draft_max, threads, progress)
        best = max(results, key=lambda m: (round(m.speedup, 3), m.acceptance))  # none pays: the likeliest
        got = {"best": best.label, "pays": best.speedup >= PAYS and best.k > 0,
               "candidates": [asdict(m) for m in results]}
        record[key] = got
        _store_choice(target, record)
    if auto and not got.get("pays"):
        return None
    spec = derive.parse(got["best"])
    return derive.layers_for(spec, h)


def measure(target: str, cands: list[Layers], k_max: int, threads: int | None,
            progress: Callable[[str], None] | None = None) -> list[Measured]:
    """Each candidate's acceptance along the target's greedy continuation of the calibration
    text, its cost per drafted token, and its speed as the controller prices it."""
    from specli.engine import Context, ContextConfig, Model
    from specli.hardware import calibrate
    from specli.speculate.controller import best_length

    cfg = ContextConfig(n_ctx=512, n_threads=threads)
    tm = Model(target)
    try:
        ctx = Context(tm, cfg)
        seq, ref = _target_run(ctx, tm.tokenize(CALIBRATION_TEXT))
        verify = calibrate.verify_costs(ctx, k_max)
        ctx.close()
    finally:
        tm.close()
    out = []
    for lay in cands:
        if progress:
            progress(f"measuring {lay.label} as a draft")
        path, _ = derive.derive(target, lay, threads)
        dm = Model(path)
        try:
            dctx = Context(dm, cfg)
            rows = dctx.eval(seq[:-1], "all")
            guess = np.array([int(np.argmax(r)) for r in rows[-len(ref):]])
            dctx.clear()
            cost = calibrate.draft_token_cost(dctx)
            dctx.close()
        finally:
            dm.close()
        alpha = float(np.mean(guess == ref))
        k, rate = best_length(alpha, verify, cost, k_max)
        out.append(Measured(lay.label, alpha, cost, k, rate * verify[0]))
    return out


def _target_run(ctx, prompt: list[int]) -> tuple[list[int], np.ndarray]:
    """The prompt plus the target's greedy continuation, and the target's greedy token after
    each position of the continuation (what a draft must guess)."""
    seq = list(prompt)
    rows = ctx.eval(seq, "last")
    for _ in range(GREEDY_TOKENS):
        tok = int(np.argmax(rows[-1]))
        seq.append(tok)
        rows = ctx.eval([tok], "last")
    ref = np.array(seq[len(prompt):])  # token i of the continuation follows position len(prompt)-1+i
    ctx.clear()
    return seq, ref


def _choice_path(target: str):
    return derive.derived_dir() / f"{cached_sha256(target)[:16]}-choice.json"


def load_choice(target: str) -> dict:
    """The choices measured for the target (``{}`` when none, or an older record)."""
    try:
        d = json.loads(_choice_path(target).read_text())
        return d if isinstance(d, dict) and d.get("version") == CHOICE_VERSION else {"version": CHOICE_VERSION}
    except (OSError, ValueError):
        return {"version": CHOICE_VERSION}


def _store_choice(target: str, record: dict) -> None:
    store_json(_choice_path(target), record, indent=1)  # a read-only cache only costs a measurement next time


def report(target: str, own: SelfSpec, progress: Callable[[str], None] | None = None) -> list[str]:
    """``specli check TARGET early-exit|layer-skip[:...]``: the derived draft, its layers and
    size, and the candidates measured to choose it."""
    notes: list[str] = []
    path, label = derived_draft(target, own, SpecSettings(), None, notes, progress)
    dh = read_gguf(path)
    n = derive.n_layers(read_gguf(target))
    lines = [f"draft: {label}, derived from the target: {derive.n_layers(dh)} of {n} layers, "
             f"{os.path.getsize(path) / 2**20:.1f} MiB at {path}", *notes]
    got = load_choice(target).get(f"{own.kind}:{SpecSettings().draft_max}:0")
    for m in (got or {}).get("candidates", []) if not own.arg else []:
        lines.append(f"  {m['label']}: acceptance {100 * m['acceptance']:.0f}%, {1e3 * m['token_cost']:.2f} ms a "
                     f"drafted token, priced {m['speedup']:.2f}x plain (draft length {m['k']})"
                     + ("  <- chosen" if m["label"] == label else ""))
    return lines
