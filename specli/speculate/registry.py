"""What drafts: one vocabulary, and one registry from it to the code that builds the drafter.

A :class:`DraftKind` names what proposes tokens (``none``, ``lookup``, ``model``, ``hybrid``,
``mtp``, ``mtp-lookup``, ``eagle3``, ``eagle3-lookup``, ``dflash``, ``dflash-lookup``); a
:class:`DraftMode` is a kind with its length policy, adaptive (the cost-aware controller) or
fixed (always up to ``--draft-max``). Mode names are the words every command uses: ``--draft``
(with ``--lookup/--no-lookup`` and ``--adaptive/--fixed``) picks the mode of ``run``, ``chat``,
``serve`` and ``export``; ``bench --modes`` lists mode names; the stats, ``bench``'s report and
the server's usage say them. :data:`MODES` holds every name.

The construction path (:class:`specli.session.Session`) decides the mode once and builds
drafters through :func:`build`, which looks the kind up in :data:`REGISTRY`, as llama.cpp's
``common/speculative.cpp`` maps a ``--spec-type`` name to its implementation. Adding a
drafter: a :class:`DraftKind` member and its :class:`Entry` (what it needs and its factory).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from specli.errors import SpecliError
from specli.speculate.adaptive import adaptive_drafter
from specli.speculate.contract import Drafter, capabilities
from specli.speculate.drafters import LookupDrafter, NoDrafter, PaidDrafter
from specli.speculate.settings import SpecSettings


class DraftKind(str, Enum):
    """What drafts."""

    NONE = "none"  # plain decoding through the same loop (the baseline)
    LOOKUP = "lookup"  # prompt lookup: copies from the context, no model
    MODEL = "model"  # a smaller draft model with the target's tokenizer
    HYBRID = "hybrid"  # the draft model and prompt lookup under one controller
    MTP = "mtp"  # the target's own multi-token-prediction layers
    MTP_LOOKUP = "mtp-lookup"  # the MTP layers and prompt lookup
    EAGLE3 = "eagle3"  # an EAGLE-3 head fed the target's hidden layers (a head file: --draft HEAD)
    EAGLE3_LOOKUP = "eagle3-lookup"  # the EAGLE-3 head and prompt lookup
    DFLASH = "dflash"  # a DFlash head: a block drafted in one pass from the target's hidden layers
    DFLASH_LOOKUP = "dflash-lookup"  # the DFlash head and prompt lookup

    def __str__(self) -> str:
        return self.value

    @property
    def entry(self) -> Entry:
        return REGISTRY[self]


@dataclass(frozen=True)
class DraftMode:
    """A kind and its length policy: what a session runs and what bench compares."""

    kind: DraftKind
    adaptive: bool = True  # the cost-aware controller; False: always draft up to draft_max
    # a draft model derived from the target names its modes (early-exit:E, layer-skip:SET):
    # LABEL, LABEL+lookup (hybrid), LABEL-fixed
    label: str = ""
    # bench's ``lookup-history``: lookup fed the answers to the suite's earlier prompts, where
    # every other mode runs without history (run, chat and serve consult --lookup-history in
    # every mode that copies: the history is the generation's, not the drafter's)
    history: bool = False

    @property
    def base(self) -> str:
        """The mode's name in :data:`MODES` (``model``, ``hybrid``, ``model-fixed`` for a derived draft)."""
        if self.history:
            return f"{self.kind.value}-history"
        fixed = not self.adaptive and self.kind.entry.fixed is self.kind and self.kind is not DraftKind.NONE
        return f"{self.kind.value}-fixed" if fixed else self.kind.value

    @property
    def name(self) -> str:
        if not self.label or self.kind.entry.paid is not DraftKind.MODEL:
            return self.base
        return self.label + {DraftKind.HYBRID: "+lookup"}.get(self.kind, "" if self.adaptive else "-fixed")

    def answers(self, names) -> bool:
        """Is this mode among ``names`` (bench's ``--modes``): by its name, its registry name or,
        for a derived draft, its kind without the layers (``early-exit+lookup``)?"""
        bare = self.name.replace(self.label, self.label.split(":")[0]) if self.label else self.name
        return bool({self.name, self.base, bare} & set(names))

    def __str__(self) -> str:
        return self.name


class Parts(Protocol):
    """What a factory builds a drafter from: the session's settings, a fresh prompt-lookup
    drafter, its shared paid drafters (loaded on first use) and the target's measured verify
    costs."""

    @property
    def settings(self) -> SpecSettings: ...

    def lookup(self) -> LookupDrafter: ...

    def paid(self, kind: DraftKind) -> PaidDrafter: ...

    def verify_costs(self) -> list[float]: ...


Factory = Callable[[DraftMode, "Parts"], Drafter]


def composed(mode: DraftMode, parts: Parts) -> Drafter:
    """Prompt lookup and/or a paid drafter, as the kind's entry names them: adaptive, under
    the controller priced by the target's verify costs and the paid drafter's cost per token;
    fixed, the one source alone."""
    e = mode.kind.entry
    lookup = parts.lookup() if e.lookup else None
    paid = parts.paid(e.paid) if e.paid else None
    if not mode.adaptive:
        return lookup or paid
    return adaptive_drafter(parts.settings, parts.verify_costs(), paid.token_cost() if paid else 0.0, lookup, paid)


@dataclass(frozen=True)
class Entry:
    """A kind's line in the registry."""

    help: str
    lookup: bool = False  # prompt lookup in play
    # the paid drafter it needs: MODEL (a draft model file), MTP (the target's layers, or an
    # MTP-only head's), EAGLE3 (an EAGLE-3 head's file) or DFLASH (a DFlash head's file)
    paid: DraftKind | None = None
    fixed: DraftKind | None = None  # what drafts under --fixed (itself: a fixed mode of its own)
    adaptive: bool = True  # has an adaptive mode
    build: Factory = composed


REGISTRY: dict[DraftKind, Entry] = {
    DraftKind.NONE: Entry("plain decoding (the baseline)", fixed=DraftKind.NONE, adaptive=False,
                          build=lambda mode, parts: NoDrafter()),
    DraftKind.LOOKUP: Entry("prompt lookup: copies from the context", lookup=True, fixed=DraftKind.LOOKUP),
    DraftKind.MODEL: Entry("the draft model", paid=DraftKind.MODEL, fixed=DraftKind.MODEL),
    DraftKind.HYBRID: Entry("the draft model and prompt lookup, one controller", lookup=True, paid=DraftKind.MODEL,
                            fixed=DraftKind.MODEL),
    DraftKind.MTP: Entry("the target's own MTP layers", paid=DraftKind.MTP, fixed=DraftKind.MTP),
    DraftKind.MTP_LOOKUP: Entry("the target's MTP layers and prompt lookup, one controller", lookup=True,
                                paid=DraftKind.MTP, fixed=DraftKind.MTP),
    DraftKind.EAGLE3: Entry("the EAGLE-3 head", paid=DraftKind.EAGLE3, fixed=DraftKind.EAGLE3),
    DraftKind.EAGLE3_LOOKUP: Entry("the EAGLE-3 head and prompt lookup, one controller", lookup=True,
                                   paid=DraftKind.EAGLE3, fixed=DraftKind.EAGLE3),
    DraftKind.DFLASH: Entry("the DFlash head (a block a pass)", paid=DraftKind.DFLASH, fixed=DraftKind.DFLASH),
    DraftKind.DFLASH_LOOKUP: Entry("the DFlash head and prompt lookup, one controller", lookup=True,
                                   paid=DraftKind.DFLASH, fixed=DraftKind.DFLASH),
}


def _every_mode() -> list[DraftMode]:
    """Each kind's adaptive mode and each fixed one, grouped by what drafts under --fixed
    (lookup, lookup-history, lookup-fixed, model, hybrid, model-fixed, ...): the order reports
    list them in."""
    kinds = list(DraftKind)
    modes = [DraftMode(k, a) for k in kinds for a in (True, False)
             if (k.entry.adaptive if a else k.entry.fixed is k)]
    at = modes.index(DraftMode(DraftKind.LOOKUP)) + 1
    modes.insert(at, DraftMode(DraftKind.LOOKUP, history=True))  # lookup-history, beside lookup
    return sorted(modes, key=lambda m: (kinds.index(m.kind.entry.fixed or m.kind), not m.adaptive))


MODES: dict[str, DraftMode] = {m.name: m for m in _every_mode()}


SELF_MODE = re.compile(r"((?:early-exit|layer-skip)(?::[0-9,\-]+?)?)(\+lookup|-fixed)?")


def mode(name: str) -> DraftMode:
    """The mode a name means (a derived draft's too: ``early-exit:8+lookup``); an unknown name
    is a one-line error listing the known ones."""
    m = MODES.get(name.strip())
    if m is None and (sm := SELF_MODE.fullmatch(name.strip())):
        kind = DraftKind.HYBRID if sm.group(2) == "+lookup" else DraftKind.MODEL
        return DraftMode(kind, sm.group(2) != "-fixed", sm.group(1))
    if m is None:
        hint = " (plain decoding is 'none')" if name.strip() == "plain" else ""
        raise SpecliError(f"unknown drafter mode '{name}'{hint}; one of: {', '.join(MODES)}")
    return m


def mode_for(kind: DraftKind, adaptive: bool) -> DraftMode:
    """The mode of ``kind`` under ``--adaptive`` / ``--fixed`` (fixed hybrid drafts with the
    model alone: one source of a fixed length)."""
    e = kind.entry
    return DraftMode(kind, True) if adaptive and e.adaptive else DraftMode(e.fixed or kind, False)


def with_lookup(kind: DraftKind, lookup: bool) -> DraftKind:
    """A paid kind with prompt lookup beside it (``--lookup``, the default), or alone."""
    both = {DraftKind.MODEL: DraftKind.HYBRID, DraftKind.MTP: DraftKind.MTP_LOOKUP,
            DraftKind.EAGLE3: DraftKind.EAGLE3_LOOKUP, DraftKind.DFLASH: DraftKind.DFLASH_LOOKUP}
    alone = {v: k for k, v in both.items()}
    return both.get(kind, kind) if lookup else alone.get(kind, kind)


def available(model: bool, mtp: bool, eagle3: bool = False, dflash: bool = False, label: str = "") -> list[DraftMode]:
    """The modes a session can build: those needing a draft model only with ``model``, those
    needing MTP layers only with ``mtp``, those needing an EAGLE-3 head only with ``eagle3``, a
    DFlash head only with ``dflash``; the draft model's named ``label`` where it is derived
    from the target (``early-exit:E``, ``layer-skip:SET``)."""
    have = {DraftKind.MODEL: model, DraftKind.MTP: mtp, DraftKind.EAGLE3: eagle3, DraftKind.DFLASH: dflash}
    return [labelled(m, label) for m in MODES.values() if m.kind.entry.paid is None or have[m.kind.entry.paid]]


def labelled(m: DraftMode, label: str) -> DraftMode:
    """``m`` named for a derived draft model (``label``), where it drafts with the draft model."""
    return DraftMode(m.kind, m.adaptive, label) if label and m.kind.entry.paid is DraftKind.MODEL else m


def build(mode: DraftMode, parts: Parts) -> Drafter:
    """A fresh drafter of ``mode`` (the paid drafter inside is the session's, shared). Here, and
    only here, it is named (``name``: the mode's, which the stats report) and asked once which
    capabilities beyond the contract it has (``caps``, :func:`~specli.speculate.contract.capabilities`)."""
    d = mode.kind.entry.build(mode, parts)
    d.name = mode.name
    d.caps = capabilities(d)
    return d
