"""Which models run, decided before anything loads: the target, and what drafts for it
(``--draft auto`` included: the target's MTP layers, a drafting head or draft model on disk,
a profile's, the smallest compatible GGUF of its family on the Hub, else prompt lookup). An
incompatible pair is refused from the GGUF headers before any weights are downloaded. The
hardware plan (:mod:`specli.hardware.placement`) then places what is chosen here."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from specli.errors import SpecliError
from specli.options import Options
from specli.resolve import converted, derive, hub, models, profiles, vocab
from specli.resolve.gguf_header import (
    HEAD_DFLASH,
    HEAD_EAGLE3,
    HEAD_NAMES,
    MTP_ARCHITECTURES,
    GGUFHeader,
    head_fit,
    head_not_driven,
    vocab_from_header,
)
from specli.resolve.on_disk import draft_on_disk, profile_for
from specli.resolve.profiles import ModelSpec, Profile
from specli.speculate.registry import DraftKind, DraftMode, available, labelled, mode_for, with_lookup

if TYPE_CHECKING:
    from specli.hardware.plan import Plan


@dataclass(frozen=True)
class DraftPlan:
    """Which drafter runs, decided once by the construction path (the options, the model
    headers, then the hardware plan), never written back into the :class:`Options`."""

    mode: DraftMode
    draft_path: str | None = None  # the draft model's file, where the mode drafts with one
    # a drafting head's file: an MTP-only sidecar (the MTP kinds draft with its layers), an
    # EAGLE-3 head (the EAGLE3 kinds) or a DFlash head (the DFLASH kinds)
    head: str | None = None
    label: str = ""  # a draft model derived from the target: early-exit:E or layer-skip:SET (resolve.derive)

    @property
    def kind(self) -> DraftKind:
        return self.mode.kind

    @property
    def mtp(self) -> bool:
        """MTP layers draft: the target's own, or an MTP-only head's (``head``)."""
        return self.kind.entry.paid is DraftKind.MTP

    @property
    def loads_mtp(self) -> bool:
        """The target's own MTP layers draft: the target loads them."""
        return self.mtp and self.head is None

    @property
    def eagle3(self) -> bool:
        """An EAGLE-3 head (``head``) drafts."""
        return self.kind.entry.paid is DraftKind.EAGLE3

    @property
    def dflash(self) -> bool:
        """A DFlash head (``head``) drafts."""
        return self.kind.entry.paid is DraftKind.DFLASH

    def placed(self, plan: Plan) -> DraftPlan:
        """This plan as the hardware plan places it: where the GPU cannot hold the draft model
        too, prompt lookup drafts instead, or a draft derived from the target's own layers
        (``plan.own_path``: the VRAM fallback's, measured to pay)."""
        if plan.own_path:
            return DraftPlan(labelled(self.mode, plan.own_label), plan.own_path, None, plan.own_label)
        kind = DraftKind(plan.draft)
        if kind is self.kind:
            return self
        paid = kind.entry.paid is not None
        return DraftPlan(labelled(mode_for(kind, self.mode.adaptive), self.label if paid else ""),
                         self.draft_path if paid else None, self.head if paid else None, self.label if paid else "")

    def modes(self) -> list[DraftMode]:
        """Every mode a session of this plan can build (bench compares them)."""
        return available(model=bool(self.draft_path), mtp=self.mtp, eagle3=self.eagle3, dflash=self.dflash,
                         label=self.label)


class Choice(NamedTuple):
    """What :func:`choose_models` decided: the target's file, the drafter asked for (before the
    hardware plan places it) and the profile in play."""

    target: str
    draft: DraftPlan
    profile: Profile | None


def apply_profile_defaults(opts: Options, prof: Profile | None) -> None:
    """A profile's defaults (profiles.DEFAULT_KEYS) fill the options the user did not give."""
    if prof is None:
        return
    d = prof.defaults

    def fills(key: str) -> bool:
        return key in d and key not in opts.given

    if fills("ctx"):
        opts.n_ctx = int(d["ctx"])
    if fills("draft_max"):
        opts.spec.draft_max = int(d["draft_max"])
    if fills("draft_p_min"):
        opts.spec.draft_p_min = float(d["draft_p_min"])


def _named(opts: Options) -> Profile | None:
    """The profile the options name: ``--profile NAME``, or ``--target NAME`` where NAME is a
    profile and no file (that profile's target, with all its sources)."""
    if opts.profile:
        return profiles.get(opts.profile)
    if not opts.target:
        raise SpecliError("name a model: --target REF or --profile NAME (see specli profiles)")
    if os.path.exists(os.path.expanduser(opts.target)):
        return None
    named = profiles.load_all().get(opts.target)
    if named is not None:
        opts.target = None
    return named


def _asked(opts: Options, tspec: ModelSpec, prof: Profile | None
           ) -> tuple[DraftKind, ModelSpec | None, Profile | None]:
    """What ``--draft`` asks for: its kind, the draft's (or head's) spec, and the profile in play."""
    if opts.draft == "auto":
        prof = prof or (profile_for(opts.target, opts.notes) if opts.target else None)
        return (*_auto_draft(tspec, prof, opts.notes), prof)
    if opts.draft in (DraftKind.NONE, DraftKind.LOOKUP):
        return DraftKind(opts.draft), None, prof
    if opts.draft == DraftKind.MTP:
        th = models.header_of_spec(tspec)
        if not th.mtp_usable:
            raise SpecliError(no_mtp(tspec.ref, th))
        return DraftKind.MTP, None, prof
    return DraftKind.MODEL, ModelSpec((opts.draft,)), prof


def choose_models(opts: Options, progress: Callable[[str], None] | None = None) -> Choice:
    """Resolve the target and the draft (``--draft auto`` included), refusing an incompatible
    pair from the GGUF headers before any weights are downloaded or loaded; the profile in
    play (named, or found for the target) fills the options the user did not give. Returns
    the target's file, the drafter asked for (before the hardware plan places it) and the
    profile."""
    prof = _named(opts)
    tspec = prof.target if prof and not opts.target else ModelSpec((opts.target,))
    own = derive.parse(opts.draft)  # early-exit / layer-skip: a draft derived from the target
    source, dspec, prof = (DraftKind.MODEL, None, prof) if own else _asked(opts, tspec, prof)
    if source is DraftKind.MODEL and dspec is None and not own:  # the profile's own-layer draft
        own = derive.parse(prof.own_draft)
    if dspec is not None:
        th, dh = models.header_of_spec(tspec), models.header_of_spec(dspec)
        vocab.ensure_compatible(vocab_from_header(th), vocab_from_header(dh))
        if dh.head_kind:
            source = _head_drafter(dspec.ref, th, dh, opts.notes)
    tpath = models.resolve_spec(tspec, progress, opts.notes)
    dpath = models.resolve_spec(dspec, progress, opts.notes) if dspec else None
    head = None
    if source is not DraftKind.MODEL:  # a drafting head, not a draft model
        head, dpath = dpath, None
    elif dpath and opts.draft == "auto":
        dpath = _converted(dpath, dspec, opts.notes)
    apply_profile_defaults(opts, prof)
    label = ""
    if own or (opts.draft == "auto" and source is DraftKind.LOOKUP and not (prof and prof.drafts)):
        from specli.measure import selfpick  # loads models only where no E or SET is given

        derived = selfpick.derived_draft(tpath, own, opts.spec, opts.threads, opts.notes, progress)
        if derived:
            (dpath, label), source = derived, DraftKind.MODEL
    s = opts.spec
    kind = DraftKind.NONE if s.draft_max == 0 else with_lookup(source, opts.lookup)
    return Choice(tpath, DraftPlan(labelled(mode_for(kind, s.adaptive), label), dpath, head, label), prof)


def _converted(dpath: str, dspec: ModelSpec, notes: list[str]) -> str:
    """``--draft auto``'s draft model, or the converted copy of it the user made (``specli
    convert-draft``: the same weights in a type that runs faster here; the target's text is
    the same whatever drafts)."""
    copy = converted.existing(dpath, sha256=dspec.sha256)
    if copy is None:
        return dpath
    notes.append(f"--draft auto: using the converted copy of {os.path.basename(dpath)} ({copy}, made by "
                 "specli convert-draft)")
    return str(copy)


def _head_drafter(ref: str, th: GGUFHeader, dh: GGUFHeader, notes: list[str]) -> DraftKind:
    """What a trained drafting head (``dh.head_kind``) drafts as, once it is checked to fit the
    target; a head that does not fit, or of a kind specli cannot drive, is one line."""
    kind = dh.head_kind
    why = head_not_driven(dh)
    if why:
        raise SpecliError(f"{ref} is {why}; specli does not draft with it (see docs/models.md); "
                          "use --draft mtp, a draft model or lookup")
    bad = [f"{rule}: {detail}" for ok, rule, detail in head_fit(th, dh) if not ok]
    if bad:
        raise SpecliError(f"{ref} is {HEAD_NAMES[kind]} built for another target ({'; '.join(bad)})")
    if kind == HEAD_EAGLE3:
        notes.append(f"{os.path.basename(ref)} is {HEAD_NAMES[kind]}: drafting with it, fed the target's "
                     f"layers {dh.target_layers}")
        return DraftKind.EAGLE3
    if kind == HEAD_DFLASH:
        notes.append(f"{os.path.basename(ref)} is {HEAD_NAMES[kind]}: drafting a block of up to "
                     f"{int(dh.arch_key('block_size', 16) or 16) - 1} tokens a pass, fed the target's layers "
                     f"{dh.target_layers}")
        return DraftKind.DFLASH
    notes.append(f"{os.path.basename(ref)} is {HEAD_NAMES[kind]}: drafting with its MTP layers")
    return DraftKind.MTP


def no_mtp(ref: str, th: GGUFHeader) -> str:
    """Why the target's MTP layers cannot draft: this llama.cpp cannot run them, or it has none."""
    if th.mtp_layers and not th.mtp_usable:
        return f"{ref}: this llama.cpp has no MTP graph for architecture '{th.architecture}'"
    return (f"{ref} has no MTP layers ({th.architecture}.nextn_predict_layers is absent: "
            "converted without its MTP block)")


def _auto_draft(tspec: ModelSpec, prof: Profile | None, notes: list[str]) -> tuple[DraftKind, ModelSpec | None]:
    """``--draft auto``: the target's own MTP layers when it has them, then a compatible draft
    model already on disk (on_disk.draft_on_disk), then the profile's, else the smallest
    compatible GGUF of its family on the Hub, then prompt lookup. Each choice is one line on
    stderr."""
    th = models.header_of_spec(tspec)
    if th.mtp_usable:
        notes.append(f"--draft auto: the target's own MTP layers ({th.mtp_layers}), with prompt lookup")
        return DraftKind.MTP, None
    if th.mtp_layers or (prof and prof.wants_mtp) or th.architecture in MTP_ARCHITECTURES:
        notes.append(f"note: {no_mtp(os.path.basename(tspec.ref), th)}; looking for a draft model instead")
    if not (prof and prof.drafts and not prof.draft_models):  # unless the profile asks for lookup
        dspec = draft_on_disk(tspec, th, prof, notes.append)
        if dspec:
            return DraftKind.MODEL, dspec
    if prof and prof.own_draft and not prof.draft_models:
        notes.append(f"--draft auto: {prof.own_draft} (profile {prof.name}), derived from the target's own layers")
        return DraftKind.MODEL, None
    if prof and prof.draft_models:
        dspec = prof.draft_models[0]
        notes.append(f"--draft auto: {dspec.ref} (profile {prof.name}), hybrid with prompt lookup")
        return DraftKind.MODEL, dspec
    if prof and prof.drafts:  # the profile asks for lookup (or for MTP the file lacks)
        notes.append(f"--draft auto: prompt lookup (profile {prof.name})")
        return DraftKind.LOOKUP, None
    dspec = search_draft(tspec, notes)
    return (DraftKind.MODEL if dspec else DraftKind.LOOKUP), dspec


def search_draft(tspec: ModelSpec, notes: list[str]) -> ModelSpec | None:
    """A smaller GGUF of the target's family on the Hub whose header passes the tokenizer
    check (the smallest at least ~8x smaller); None (prompt lookup) when there is none."""
    h = hub.parse_hub_ref(tspec.ref) if not os.path.exists(tspec.ref) else None
    if h is None or hub.offline():
        why = "HF_HUB_OFFLINE is set" if h is not None else "no profile covers this target"
        notes.append(f"--draft auto: {why}; using prompt lookup")
        return None
    try:
        cand = _first_compatible(h, models.header_of(tspec.ref))
    except SpecliError as e:
        notes.append(f"--draft auto: Hub search failed ({e}); using prompt lookup")
        return None
    if cand is None:
        notes.append(f"--draft auto: no smaller compatible {hub.family_of(h.repo)} GGUF on the Hub; "
                     "using prompt lookup")
        return None
    notes.append(f"--draft auto: {cand} (smallest compatible {hub.family_of(h.repo)} GGUF on the Hub, "
                 "tokenizer checked from its header), hybrid with prompt lookup")
    return ModelSpec((str(cand),))


def _first_compatible(h: hub.HubRef, th: GGUFHeader):
    """The first of the Hub's candidate drafts (smallest first) whose header passes the
    tokenizer check; None when none does. A candidate whose header cannot be read is skipped."""
    for cand in hub.search_drafts(h, th):
        try:
            dh = hub.header(cand)
        except SpecliError:
            continue
        if vocab.mismatch_message(vocab.check_vocab(vocab_from_header(th), vocab_from_header(dh))) is None:
            return cand
    return None
