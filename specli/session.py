"""Everything one generation needs, wired together: the resolved models, the target context,
the drafter. The CLI commands build a Session from their options and only print."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from specli.constrain import Constraint
from specli.engine import Context, ContextConfig, Model
from specli.errors import SpecliError
from specli.hardware import calibrate
from specli.hardware.devices import Hardware, detect
from specli.hardware.plan import Plan, available_ram, check_host_memory, make_plan, memory_from_header
from specli.prompt import build_prompt
from specli.resolve import hub, models, profiles, vocab
from specli.resolve.gguf_header import (
    HEAD_DFLASH,
    HEAD_EAGLE3,
    HEAD_NAMES,
    MTP_ARCHITECTURES,
    head_fit,
    head_not_driven,
    read_gguf,
    vocab_from_header,
)
from specli.resolve.local import draft_on_disk, profile_for
from specli.resolve.profiles import ModelSpec, Profile
from specli.speculate import forced, registry
from specli.speculate.adaptive import lookup_drafter
from specli.speculate.drafters import Drafter, LookupDrafter, ModelDrafter, NoDrafter, PaidDrafter
from specli.speculate.heads import DFlashDrafter, Eagle3Drafter, dflash_context, eagle3_context
from specli.speculate.loop import Response, Stats, check_prompt_fits, generate
from specli.speculate.mtp import MTPDrafter
from specli.speculate.registry import DraftKind, DraftMode, available, mode_for, with_lookup
from specli.speculate.settings import N_CTX, SpecSettings
from specli.speculate.verify import SamplingParams


@dataclass
class Options:
    """What the user asked for (the command line's options, a profile's defaults filling the
    rest). What runs is decided from these once, into a :class:`DraftPlan`."""

    target: str | None = None
    draft: str = "auto"  # a model reference, "mtp", "lookup", "auto" or "none"
    profile: str | None = None
    n_ctx: int = N_CTX
    threads: int | None = None
    gpu_layers: int | None = None  # None: the hardware plan decides
    draft_gpu_layers: int | None = None
    vram: str | None = None  # overrides the detected GPU budget (--vram / SPECLI_VRAM)
    spec: SpecSettings = field(default_factory=SpecSettings)
    f32_kv: bool = False
    parallel: int = 1  # sequences (slots) in the target's context, each of n_ctx tokens (serve --parallel)
    given: set[str] = field(default_factory=set)  # options the user typed: a profile does not override them
    notes: list[str] = field(default_factory=list)  # one-line decisions for stderr


@dataclass(frozen=True)
class DraftPlan:
    """Which drafter runs, decided once by the construction path (the options, the model
    headers, then the hardware plan), never written back into the :class:`Options`."""

    mode: DraftMode
    draft_path: str | None = None  # the draft model's file, where the mode drafts with one
    # a drafting head's file: an MTP-only sidecar (the MTP kinds draft with its layers), an
    # EAGLE-3 head (the EAGLE3 kinds) or a DFlash head (the DFLASH kinds)
    head: str | None = None

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
        too, prompt lookup drafts instead."""
        kind = DraftKind(plan.draft)
        if kind is self.kind:
            return self
        paid = kind.entry.paid is not None
        return DraftPlan(mode_for(kind, self.mode.adaptive), self.draft_path if paid else None,
                         self.head if paid else None)

    def modes(self) -> list[DraftMode]:
        """Every mode a session of this plan can build (bench compares them)."""
        return available(model=bool(self.draft_path), mtp=self.mtp, eagle3=self.eagle3, dflash=self.dflash)


def plan_for(opts: Options, target_path: str, draft: DraftPlan) -> tuple[Plan, Hardware, int]:
    """The hardware plan for these models and options, from the headers alone."""
    th = read_gguf(target_path)
    dpath = draft.draft_path
    # a drafting head counts as a draft model does: its weights, its context's KV, its buffers
    # (placed with the target: it reads the target's state, so it never runs on the CPU alone)
    dh = read_gguf(dpath or draft.head) if dpath or draft.head else None
    n_ctx_train = int(th.arch_key("context_length", N_CTX) or N_CTX)
    n_ctx = min(opts.n_ctx, n_ctx_train) if opts.n_ctx > 0 else n_ctx_train
    hw = detect(opts.vram)
    pays = bool(dpath) and calibrate.draft_on_cpu_pays(
        target_path, dpath, opts.threads or os.cpu_count() or 1, min(512, n_ctx), opts.spec.draft_max)
    kv_ctx = n_ctx * max(1, opts.parallel)  # the KV cache of every slot, each n_ctx tokens
    plan = make_plan(memory_from_header(th, name="target"),
                     memory_from_header(dh, name="draft" if dpath else "head") if dh else None,
                     hw.budget, kv_ctx, hw.can_offload or hw.budget_source in ("--vram", "SPECLI_VRAM"), bool(pays),
                     wants_draft=draft.kind.value)
    return plan, hw, n_ctx


def gpu_layers(opts: Options, plan: Plan) -> tuple[int, int]:
    """(target, draft) layers on the GPU: what the user typed, else the plan's."""
    target = plan.target_gpu_layers if opts.gpu_layers is None else opts.gpu_layers
    if opts.draft_gpu_layers is not None:
        return target, opts.draft_gpu_layers
    return target, plan.draft_gpu_layers if opts.gpu_layers is None else opts.gpu_layers


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


def choose_models(opts: Options, progress: Callable[[str], None] | None = None
                  ) -> tuple[str, DraftPlan, Profile | None]:
    """Resolve the target and the draft (``--draft auto`` included), refusing an incompatible
    pair from the GGUF headers before any weights are downloaded or loaded; the profile in
    play (named, or found for the target) fills the options the user did not give. Returns
    the target's file, the drafter asked for (before the hardware plan places it) and the
    profile."""
    notes = opts.notes
    prof = profiles.get(opts.profile) if opts.profile else None
    if prof is None and not opts.target:
        raise SpecliError("name a model: --target REF or --profile NAME (see specli profiles)")
    if prof is None and not os.path.exists(os.path.expanduser(opts.target)):
        named = profiles.load_all().get(opts.target)
        if named is not None:  # --target PROFILE: that profile's target, with all its sources
            prof, opts.target = named, None
    tspec = prof.target if prof and not opts.target else ModelSpec((opts.target,))
    dspec: ModelSpec | None = None
    if opts.draft == "auto":
        prof = prof or (profile_for(opts.target, notes) if opts.target else None)
        source, dspec = _auto_draft(tspec, prof, notes)
    elif opts.draft in (DraftKind.NONE, DraftKind.LOOKUP):
        source = DraftKind(opts.draft)
    elif opts.draft == DraftKind.MTP:
        source = DraftKind.MTP
        th = models.header_of_spec(tspec)
        if not th.mtp_usable:
            raise SpecliError(_no_mtp(tspec.ref, th))
    else:
        source, dspec = DraftKind.MODEL, ModelSpec((opts.draft,))
    if dspec is not None:
        th, dh = models.header_of_spec(tspec), models.header_of_spec(dspec)
        vocab.ensure_compatible(vocab_from_header(th), vocab_from_header(dh))
        if dh.head_kind:
            source = _head_drafter(dspec.ref, th, dh, notes)
    tpath = models.resolve_spec(tspec, progress, notes)
    dpath = models.resolve_spec(dspec, progress, notes) if dspec else None
    head = None
    if source is not DraftKind.MODEL:  # a drafting head, not a draft model
        head, dpath = dpath, None
    apply_profile_defaults(opts, prof)
    s = opts.spec
    kind = DraftKind.NONE if s.draft_max == 0 else with_lookup(source, s.hybrid)
    return tpath, DraftPlan(mode_for(kind, s.adaptive), dpath, head), prof


def _head_drafter(ref: str, th, dh, notes: list[str]) -> DraftKind:
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


def _no_mtp(ref: str, th) -> str:
    if th.mtp_layers and not th.mtp_usable:
        return f"{ref}: this llama.cpp has no MTP graph for architecture '{th.architecture}'"
    return (f"{ref} has no MTP layers ({th.architecture}.nextn_predict_layers is absent: "
            "converted without its MTP block)")


def _auto_draft(tspec: ModelSpec, prof: Profile | None, notes: list[str]) -> tuple[DraftKind, ModelSpec | None]:
    """``--draft auto``: the target's own MTP layers when it has them, then a compatible draft
    model already on disk (local.draft_on_disk), then the profile's, else the smallest
    compatible GGUF of its family on the Hub, then prompt lookup. Each choice is one line on
    stderr."""
    th = models.header_of_spec(tspec)
    if th.mtp_usable:
        notes.append(f"--draft auto: the target's own MTP layers ({th.mtp_layers}), with prompt lookup")
        return DraftKind.MTP, None
    if th.mtp_layers or (prof and prof.wants_mtp) or th.architecture in MTP_ARCHITECTURES:
        notes.append(f"note: {_no_mtp(os.path.basename(tspec.ref), th)}; looking for a draft model instead")
    if not (prof and prof.drafts and not prof.draft_models):  # unless the profile asks for lookup
        dspec = draft_on_disk(tspec, th, prof, notes.append)
        if dspec:
            return DraftKind.MODEL, dspec
    if prof and prof.draft_models:
        dspec = prof.draft_models[0]
        notes.append(f"--draft auto: {dspec.ref} (profile {prof.name}), hybrid with prompt lookup")
        return DraftKind.MODEL, dspec
    if prof and prof.drafts:  # the profile asks for lookup (or for MTP the file lacks)
        notes.append(f"--draft auto: prompt lookup (profile {prof.name})")
        return DraftKind.LOOKUP, None
    dspec = _search_draft(tspec, notes)
    return (DraftKind.MODEL if dspec else DraftKind.LOOKUP), dspec


def _search_draft(tspec: ModelSpec, notes: list[str]) -> ModelSpec | None:
    """A smaller GGUF of the target's family on the Hub whose header passes the tokenizer
    check (the smallest at least ~8x smaller); None (prompt lookup) when there is none."""
    h = hub.parse_hub_ref(tspec.ref) if not os.path.exists(tspec.ref) else None
    if h is None or hub.offline():
        why = "HF_HUB_OFFLINE is set" if h is not None else "no profile covers this target"
        notes.append(f"--draft auto: {why}; using prompt lookup")
        return None
    try:
        th = models.header_of(tspec.ref)
        for cand in hub.search_drafts(h, th):
            try:
                dh = hub.header(cand)
            except SpecliError:
                continue
            if vocab.mismatch_message(vocab.check_vocab(vocab_from_header(th), vocab_from_header(dh))) is None:
                notes.append(f"--draft auto: {cand} (smallest compatible {hub.family_of(h.repo)} GGUF on the Hub, "
                             "tokenizer checked from its header), hybrid with prompt lookup")
                return ModelSpec((str(cand),))
    except SpecliError as e:
        notes.append(f"--draft auto: Hub search failed ({e}); using prompt lookup")
        return None
    notes.append(f"--draft auto: no smaller compatible {hub.family_of(h.repo)} GGUF on the Hub; using prompt lookup")
    return None


class Session:
    """The one construction path every command goes through: the profile's defaults, the
    models (tokenizers checked from the headers first), the hardware plan, the target's
    context, and the drafters, built the same way for ``run``, ``chat``, ``bench`` and
    ``serve``."""

    def __init__(self, opts: Options, progress: Callable[[str], None] | None = None, build_drafter: bool = True):
        self.opts = opts
        target_path, asked, self.profile = choose_models(opts, progress)
        self.plan, self.hardware, plan_ctx = plan_for(opts, target_path, asked)
        if self.hardware.budget is not None:
            opts.notes.append(self.plan.summary)
        self.draft = asked.placed(self.plan)  # what drafts, decided: the GPU may not hold the draft model too
        head = self.draft.kind.entry.paid
        if opts.parallel > 1 and head not in (None, DraftKind.MODEL):  # MTP, EAGLE-3, DFlash
            opts.notes.append(f"--parallel {opts.parallel}: {head} drafts from one sequence's hidden "
                              "states; drafting with prompt lookup instead")
            self.draft = DraftPlan(mode_for(DraftKind.LOOKUP, self.draft.mode.adaptive))
        self.target_gpu_layers, self.draft_gpu_layers = gpu_layers(opts, self.plan)
        # the part of the target left on the CPU must fit in host memory: refuse before loading
        check_host_memory(memory_from_header(read_gguf(target_path), name=os.path.basename(target_path)),
                          self.target_gpu_layers, plan_ctx * max(1, opts.parallel), *available_ram())
        self.target = Model(target_path, n_gpu_layers=self.target_gpu_layers, load_mtp=self.draft.loads_mtp)
        n_ctx = min(opts.n_ctx, self.target.n_ctx_train) if opts.n_ctx > 0 else self.target.n_ctx_train
        if "ctx" in opts.given and opts.n_ctx > n_ctx:
            opts.notes.append(f"--ctx {opts.n_ctx} is more than {self.target.name} was trained for: "
                              f"using its {n_ctx} tokens")
        # hybrid/recurrent targets keep draft_max recurrent-state snapshots where llama.cpp can
        self.cfg = ContextConfig(n_ctx=n_ctx, n_threads=opts.threads, f32_kv=opts.f32_kv,
                                 n_rs_seq=opts.spec.draft_max)
        self.ctx = Context(self.target, replace(self.cfg, n_seq=max(1, opts.parallel)))
        if self.target.recurrent and self.draft.kind is not DraftKind.NONE:
            how = (f"recurrent-state snapshots ({self.ctx.n_rs_seq})" if self.ctx.rollback_kind == "snapshots"
                   else "state checkpoints")
            opts.notes.append(f"{self.target.name} is a hybrid/recurrent model: rejected drafts roll back by {how}")
        self.draft_model: Model | None = None
        self.head_model: Model | None = None  # a drafting head (MTP-only, EAGLE-3, DFlash), loaded on first use
        self._paid: dict[DraftKind, PaidDrafter] = {}  # the draft model's and the MTP layers' drafters, shared
        self._verify_costs: list[float] | None = None
        # bench makes its own drafters, one per mode and run; serve --parallel's slots theirs
        # (specli.speculate.batch: the draft model's cache is then the batch's, one sequence a slot)
        self.drafter = self.drafter_for(self.draft.mode) if build_drafter and opts.parallel <= 1 else NoDrafter()

    @property
    def draft_path(self) -> str | None:
        """The draft model's file, when the session drafts with one."""
        return self.draft.draft_path

    # -- drafters (registry.Parts) --------------------------------------------------------
    @property
    def settings(self) -> SpecSettings:
        return self.opts.spec

    def lookup(self) -> LookupDrafter:
        """A fresh prompt-lookup drafter as the settings ask for it."""
        return lookup_drafter(self.opts.spec)

    def paid(self, kind: DraftKind) -> PaidDrafter:
        """The draft model's drafter (``MODEL``), the MTP layers' (``MTP``: the target's own or an
        MTP-only head's), the EAGLE-3 head's (``EAGLE3``) or the DFlash head's (``DFLASH``), made on
        first use and shared by every drafter the session builds."""
        if kind not in self._paid:
            make = {DraftKind.MODEL: self._model_drafter, DraftKind.MTP: self._mtp_drafter,
                    DraftKind.EAGLE3: self._eagle3_drafter, DraftKind.DFLASH: self._dflash_drafter}[kind]
            self._paid[kind] = make()
        return self._paid[kind]

    def _model_drafter(self) -> ModelDrafter:
        if not self.draft_path:
            raise SpecliError("no draft model: name one with --draft REF")
        self.draft_model = Model(self.draft_path, n_gpu_layers=self.draft_gpu_layers or 0)
        # the loaded vocabularies are what llama.cpp will actually use: check them too
        vocab.ensure_compatible(self.target.vocab_info(), self.draft_model.vocab_info())
        return ModelDrafter(self.draft_model, self.cfg, p_min=self.opts.spec.draft_p_min)

    def _head(self) -> Model:
        """The drafting head's model, placed as the target is."""
        if self.head_model is None:
            if not self.draft.head:
                raise SpecliError("no drafting head: name one with --draft HEAD")
            self.head_model = Model(self.draft.head, n_gpu_layers=self.target_gpu_layers, load_mtp=True)
        return self.head_model

    def _mtp_drafter(self) -> MTPDrafter:
        # feeding the MTP layers is part of every target pass from now on; the cached verify
        # curve may have been measured without it: real steps correct it (CostModel)
        head = self._head() if self.draft.head else None  # an MTP-only sidecar, else the target's own layers
        mtp = MTPDrafter(self.ctx, self.ctx.mtp_context(self.cfg, head), p_min=self.opts.spec.draft_p_min)
        self.ctx.listen(mtp, replay=True)  # fed by every target decode, the cached tokens first
        return mtp

    def _eagle3_drafter(self) -> Eagle3Drafter:
        d = Eagle3Drafter(self.ctx, eagle3_context(self.ctx, self._head(), self.cfg), p_min=self.opts.spec.draft_p_min)
        self.ctx.listen(d, replay=True)  # fed the target's layer rows of every decode, the cached tokens first
        return d

    def _dflash_drafter(self) -> DFlashDrafter:
        s = self.opts.spec
        d = DFlashDrafter(self.ctx, dflash_context(self.ctx, self._head(), self.cfg), p_min=s.draft_p_min,
                          n_max=s.draft_max)
        self.ctx.listen(d, replay=True)  # fed the target's layer rows of every decode, the cached tokens first
        return d

    def verify_costs(self) -> list[float]:
        """The target's verify cost curve on this machine (calibrated once, cached)."""
        if self._verify_costs is None:
            self._verify_costs = calibrate.verify_costs(self.ctx, self.opts.spec.draft_max)
        return list(self._verify_costs)

    def modes(self) -> list[DraftMode]:
        """Every drafter mode this session can build (bench compares them)."""
        return self.draft.modes()

    def prepare(self, mode: DraftMode) -> None:
        """Load and price what ``mode`` drafts with (the draft model or the MTP layers, the
        verify and draft costs), so that no generation pays for it."""
        e = mode.kind.entry
        if e.paid:
            paid = self.paid(e.paid)
            if mode.adaptive:
                paid.token_cost()
        if mode.adaptive and mode.kind is not DraftKind.NONE:
            self.verify_costs()

    def drafter_for(self, mode: DraftMode | str) -> Drafter:
        """A fresh drafter of ``mode`` (a mode or its name) over the session's models (bench
        makes one per run), from the registry."""
        m = registry.mode(mode) if isinstance(mode, str) else mode
        if m not in self.modes():
            raise SpecliError(f"this session cannot draft in mode '{m}' (it can: {', '.join(map(str, self.modes()))})")
        return registry.build(m, self)

    def placement(self) -> dict:
        """Where each model runs, for reports."""
        return {"backends": list(self.hardware.backends), "gpu_offload": self.hardware.can_offload,
                "devices": [d.name for d in self.hardware.devices],
                "budget": self.hardware.budget, "budget_source": self.hardware.budget_source,
                "target_gpu_layers": self.target_gpu_layers,
                "draft_gpu_layers": self.draft_gpu_layers if self.draft_path else None,
                "plan": self.plan.branch, "drafter": self.draft.mode.name}

    # -- generation -----------------------------------------------------------------------
    def prompt_tokens(self, text: str, chat: bool | None = None, system: str | None = None) -> list[int]:
        if chat is None:
            chat = self.target.chat_template() is not None
        if not text.strip():
            raise SpecliError("the prompt is empty")
        toks = build_prompt(self.target, text, chat, system)
        check_prompt_fits(len(toks), self.ctx.n_ctx)
        return toks

    def generate(self, prompt: list[int], params: SamplingParams, max_tokens: int,
                 drafter: Drafter | None = None, exact_prefill: bool = False,
                 constraint: Constraint | None = None, logprobs: int | None = None) -> Response:
        """Generate with the session's drafter (or ``drafter``); under a ``constraint`` a
        speculating drafter also drafts the tokens the grammar forces (:class:`ForcedDrafter`)."""
        d = forced.under(drafter or self.drafter, constraint)
        return generate(self.ctx, prompt, d, params, max_tokens, self.opts.spec.draft_max, exact_prefill, constraint,
                        logprobs)

    def plain_rate_estimate(self) -> float | None:
        """Tokens/s plain decoding would have reached here: the controller's measured cost of a
        one-token pass (refreshed from this run's plain steps); None without a controller."""
        return self.drafter.plain_rate()

    def slower_than_plain(self, st: Stats, tolerance: float = 0.95) -> str | None:
        """A one-line warning when speculation ran measurably slower than plain decoding would."""
        est = self.plain_rate_estimate()
        if est and st.generated >= 32 and st.tokens_per_s < tolerance * est:
            return (f"note: speculation ran at {st.tokens_per_s / est:.2f}x the measured plain speed "
                    f"({st.tokens_per_s:.1f} vs {est:.1f} tok/s) on this text; --draft none may be faster")
        return None

    def close(self) -> None:
        self.drafter.close()
        for shared in self._paid.values():
            shared.close()
        self.ctx.close()
        self.target.close()
        for m in (self.draft_model, self.head_model):
            if m:
                m.close()
