"""Everything one generation needs, wired together: the resolved models, the target context,
the drafter. The CLI commands build a Session from their options and only print."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

from specli.engine import Context, ContextConfig, Model
from specli.errors import SpecliError
from specli.hardware import calibrate
from specli.hardware.devices import Hardware, detect
from specli.hardware.plan import Plan, available_ram, check_host_memory, make_plan, memory_from_header
from specli.prompt import build_prompt
from specli.resolve import hub, models, profiles, vocab
from specli.resolve.gguf_header import (
    HEAD_EAGLE3,
    HEAD_MTP_ONLY,
    HEAD_NAMES,
    MTP_ARCHITECTURES,
    head_fit,
    read_gguf,
    vocab_from_header,
)
from specli.resolve.local import draft_on_disk, profile_for
from specli.resolve.profiles import ModelSpec, Profile
from specli.speculate.adaptive import adaptive_drafter, lookup_drafter
from specli.speculate.drafters import (
    Drafter,
    ModelDrafter,
    NoDrafter,
)
from specli.speculate.heads import Eagle3Drafter
from specli.speculate.loop import Response, Stats, check_prompt_fits, generate
from specli.speculate.mtp import MTPDrafter
from specli.speculate.settings import SpecSettings
from specli.speculate.verify import SamplingParams


@dataclass
class Options:
    target: str | None = None
    draft: str = "auto"  # a model reference, "lookup", "auto" or "none"
    profile: str | None = None
    n_ctx: int = 4096
    threads: int | None = None
    gpu_layers: int | None = None  # None: the hardware plan decides
    draft_gpu_layers: int | None = None
    vram: str | None = None  # overrides the detected GPU budget (--vram / SPECLI_VRAM)
    spec: SpecSettings = field(default_factory=SpecSettings)
    f32_kv: bool = False
    drafter: str = ""  # what --draft resolved to: none, lookup, model, mtp or eagle3 (set by choose_models)
    head: str | None = None  # a drafting head's file: MTP-only (the MTP drafter runs on it) or EAGLE-3
    given: set[str] = field(default_factory=set)  # options the user typed: a profile does not override them
    notes: list[str] = field(default_factory=list)  # one-line decisions for stderr


def plan_for(opts: Options, target_path: str, draft_path: str | None) -> tuple[Plan, Hardware, int]:
    """The hardware plan for these models and options, from the headers alone."""
    th = read_gguf(target_path)
    dh = read_gguf(draft_path) if draft_path else None
    n_ctx_train = int(th.arch_key("context_length", 4096) or 4096)
    n_ctx = min(opts.n_ctx, n_ctx_train) if opts.n_ctx > 0 else n_ctx_train
    hw = detect(opts.vram)
    wants = "none" if opts.draft == "none" else ("model" if draft_path else
                                                 "mtp" if opts.drafter in ("mtp", "eagle3") else "lookup")
    pays = bool(draft_path) and calibrate.draft_on_cpu_pays(
        target_path, draft_path, opts.threads or os.cpu_count() or 1, min(512, n_ctx), opts.spec.draft_max)
    plan = make_plan(memory_from_header(th, name="target"), memory_from_header(dh, name="draft") if dh else None,
                     hw.budget, n_ctx, hw.can_offload or hw.budget_source != "detected", bool(pays),
                     wants_draft=wants)
    return plan, hw, n_ctx


def gpu_layers(opts: Options, plan: Plan) -> tuple[int, int]:
    """(target, draft) layers on the GPU: what the user typed, else the plan's."""
    target = plan.target_gpu_layers if opts.gpu_layers is None else opts.gpu_layers
    if opts.draft_gpu_layers is not None:
        return target, opts.draft_gpu_layers
    return target, plan.draft_gpu_layers if opts.gpu_layers is None else opts.gpu_layers


def apply_profile_defaults(opts: Options, prof: Profile | None) -> None:
    """A profile's defaults fill the options the user did not give."""
    if prof is None:
        return
    for key, attr in profiles.DEFAULTS.items():
        if key in prof.defaults and key not in opts.given:
            obj, name = (opts.spec, attr[5:]) if attr.startswith("spec.") else (opts, attr)
            setattr(obj, name, type(getattr(obj, name))(prof.defaults[key]))


def choose_models(opts: Options, progress: Callable[[str], None] | None = None
                  ) -> tuple[str, str | None, Profile | None]:
    """Resolve the target and the draft (``--draft auto`` included), refusing an incompatible
    pair from the GGUF headers before any weights are downloaded or loaded; the profile in
    play (named, or found for the target) fills the options the user did not give."""
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
    opts.drafter = opts.draft if opts.draft in ("none", "lookup", "mtp") else "model"
    if opts.draft == "auto":
        prof = prof or (profile_for(opts.target, notes) if opts.target else None)
        opts.drafter, dspec = _auto_draft(tspec, prof, notes)
    elif opts.draft == "mtp":
        th = models.header_of_spec(tspec)
        if not th.mtp_usable:
            raise SpecliError(_no_mtp(tspec.ref, th))
    elif opts.draft not in ("none", "lookup"):
        dspec = ModelSpec((opts.draft,))
    if dspec is not None:
        th, dh = models.header_of_spec(tspec), models.header_of_spec(dspec)
        vocab.ensure_compatible(vocab_from_header(th), vocab_from_header(dh))
        if dh.head_kind:
            opts.drafter = _head_drafter(dspec.ref, th, dh, notes)
    tpath = models.resolve_spec(tspec, progress, notes)
    dpath = models.resolve_spec(dspec, progress, notes) if dspec else None
    if opts.drafter in ("mtp", "eagle3") and dpath:  # a drafting head, not a draft model
        opts.head, dpath = dpath, None
    apply_profile_defaults(opts, prof)
    return tpath, dpath, prof


def _head_drafter(ref: str, th, dh, notes: list[str]) -> str:
    """The drafter a trained drafting head (``dh.head_kind``) runs as, once it is checked to fit
    the target; a head that does not fit, or of a kind specli cannot drive, is one line."""
    kind = dh.head_kind
    if kind not in (HEAD_MTP_ONLY, HEAD_EAGLE3):
        raise SpecliError(f"{ref} is {HEAD_NAMES[kind]}; specli does not draft with {kind} heads "
                          "(see docs/models.md); use --draft mtp, a draft model or lookup")
    bad = [f"{rule}: {detail}" for ok, rule, detail in head_fit(th, dh) if not ok]
    if bad:
        raise SpecliError(f"{ref} is {HEAD_NAMES[kind]} built for another target ({'; '.join(bad)})")
    if kind == HEAD_EAGLE3:
        notes.append(f"{os.path.basename(ref)} is {HEAD_NAMES[kind]}: drafting with it, fed the target's "
                     f"layers {dh.target_layers}")
        return "eagle3"
    notes.append(f"{os.path.basename(ref)} is {HEAD_NAMES[kind]}: drafting with its MTP layers")
    return "mtp"


def _no_mtp(ref: str, th) -> str:
    if th.mtp_layers and not th.mtp_usable:
        return f"{ref}: this llama.cpp has no MTP graph for architecture '{th.architecture}'"
    return (f"{ref} has no MTP layers ({th.architecture}.nextn_predict_layers is absent: "
            "converted without its MTP block)")


def _auto_draft(tspec: ModelSpec, prof: Profile | None, notes: list[str]) -> tuple[str, ModelSpec | None]:
    """``--draft auto``: the target's own MTP layers when it has them, then a compatible draft
    model already on disk (local.draft_on_disk), then the profile's, else the smallest
    compatible GGUF of its family on the Hub, then prompt lookup. Each choice is one line on
    stderr."""
    th = models.header_of_spec(tspec)
    if th.mtp_usable:
        notes.append(f"--draft auto: the target's own MTP layers ({th.mtp_layers}), with prompt lookup")
        return "mtp", None
    if th.mtp_layers or (prof and prof.wants_mtp) or th.architecture in MTP_ARCHITECTURES:
        notes.append(f"note: {_no_mtp(os.path.basename(tspec.ref), th)}; looking for a draft model instead")
    if not (prof and prof.drafts and not prof.draft_models):  # unless the profile asks for lookup
        dspec = draft_on_disk(tspec, th, prof, notes.append)
        if dspec:
            return "model", dspec
    if prof and prof.draft_models:
        dspec = prof.draft_models[0]
        notes.append(f"--draft auto: {dspec.ref} (profile {prof.name}), hybrid with prompt lookup")
        return "model", dspec
    if prof and prof.drafts:  # the profile asks for lookup (or for MTP the file lacks)
        notes.append(f"--draft auto: prompt lookup (profile {prof.name})")
        return "lookup", None
    dspec = _search_draft(tspec, notes)
    return ("model" if dspec else "lookup"), dspec


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
        target_path, draft_path, self.profile = choose_models(opts, progress)
        self.plan, self.hardware, plan_ctx = plan_for(opts, target_path, draft_path)
        if self.hardware.budget is not None:
            opts.notes.append(self.plan.summary)
        if draft_path and self.plan.draft == "lookup":
            draft_path = None  # the GPU cannot hold both: the plan falls back to prompt lookup
        self.draft_path = draft_path
        self.target_gpu_layers, self.draft_gpu_layers = gpu_layers(opts, self.plan)
        # the part of the target left on the CPU must fit in host memory: refuse before loading
        check_host_memory(memory_from_header(read_gguf(target_path), name=os.path.basename(target_path)),
                          self.target_gpu_layers, plan_ctx, *available_ram())
        self.target = Model(target_path, n_gpu_layers=self.target_gpu_layers,
                            load_mtp=opts.drafter == "mtp" and not opts.head)
        # a drafting head (an MTP-only sidecar or an EAGLE-3 head), placed as the target is
        head = Model(opts.head, n_gpu_layers=self.target_gpu_layers, load_mtp=True) if opts.head else None
        self.mtp_head = head if opts.drafter == "mtp" else None
        self.eagle3_head = head if opts.drafter == "eagle3" else None
        self._eagle3: Eagle3Drafter | None = None
        n_ctx = min(opts.n_ctx, self.target.n_ctx_train) if opts.n_ctx > 0 else self.target.n_ctx_train
        # hybrid/recurrent targets keep draft_max recurrent-state snapshots where llama.cpp can
        self.cfg = ContextConfig(n_ctx=n_ctx, n_threads=opts.threads, f32_kv=opts.f32_kv,
                                 n_rs_seq=opts.spec.draft_max)
        self.ctx = Context(self.target, self.cfg)
        if self.target.recurrent and opts.draft != "none":
            how = (f"recurrent-state snapshots ({self.ctx.n_rs_seq})" if self.ctx.rollback_kind == "snapshots"
                   else "state checkpoints")
            opts.notes.append(f"{self.target.name} is a hybrid/recurrent model: rejected drafts roll back by {how}")
        self.draft_model: Model | None = None
        self._model_drafter: ModelDrafter | None = None
        self._mtp: MTPDrafter | None = None
        self._verify_costs: list[float] | None = None
        # bench makes its own drafters, one per mode and run
        self.drafter = self.drafter_for(self.default_mode()) if build_drafter else NoDrafter()

    # -- drafters -------------------------------------------------------------------------
    def default_mode(self) -> str:
        """The drafter the options ask for: none, lookup, model, hybrid, mtp, mtp-lookup
        (+ "-fixed": always draft_max, no controller, no lookup)."""
        o, s = self.opts, self.opts.spec
        if o.draft == "none" or s.draft_max == 0:
            return "none"
        if self.has_mtp:
            kind = "mtp-lookup" if s.hybrid else "mtp"
        elif self.eagle3_head:
            kind = "eagle3-lookup" if s.hybrid else "eagle3"
        else:
            kind = ("hybrid" if s.hybrid else "model") if self.draft_path else "lookup"
        if s.adaptive:
            return kind
        return {"hybrid": "model", "mtp-lookup": "mtp", "eagle3-lookup": "eagle3"}.get(kind, kind) + "-fixed"

    def modes(self) -> list[str]:
        """Every drafter mode this session can build (bench compares them)."""
        out = ["none", "lookup", "lookup-fixed"]
        if self.has_mtp:
            out += ["mtp", "mtp-lookup", "mtp-fixed"]
        if self.eagle3_head:
            out += ["eagle3", "eagle3-lookup", "eagle3-fixed"]
        return out + (["model", "hybrid", "model-fixed"] if self.draft_path else [])

    @property
    def has_mtp(self) -> bool:
        """MTP layers to draft with: the target's own, or an MTP-only head's."""
        return bool(self.target.n_mtp_layers or self.mtp_head)

    def mtp_drafter(self) -> MTPDrafter:
        """The target's own MTP layers as a drafter, made on first use and shared."""
        if self._mtp is None:
            # feeding the MTP layers is part of every target pass from now on; the cached verify
            # curve may have been measured without it: real steps correct it (CostModel)
            self._mtp = MTPDrafter(self.ctx, self.cfg, p_min=self.opts.spec.draft_p_min, head=self.mtp_head)
        return self._mtp

    def model_drafter(self) -> ModelDrafter:
        """The draft model's drafter, loaded on first use and shared by every mode."""
        if self._model_drafter is None:
            if not self.draft_path:
                raise SpecliError("no draft model: name one with --draft REF")
            self.draft_model = Model(self.draft_path, n_gpu_layers=self.draft_gpu_layers or 0)
            # the loaded vocabularies are what llama.cpp will actually use: check them too
            vocab.ensure_compatible(self.target.vocab_info(), self.draft_model.vocab_info())
            self._model_drafter = ModelDrafter(self.draft_model, self.cfg, p_min=self.opts.spec.draft_p_min)
        return self._model_drafter

    def eagle3_drafter(self) -> Eagle3Drafter:
        """The EAGLE-3 head as a drafter, made on first use and shared."""
        if self._eagle3 is None:
            self._eagle3 = Eagle3Drafter(self.ctx, self.eagle3_head, self.cfg, p_min=self.opts.spec.draft_p_min)
        return self._eagle3

    def verify_costs(self) -> list[float]:
        """The target's verify cost curve on this machine (calibrated once, cached)."""
        if self._verify_costs is None:
            self._verify_costs = calibrate.verify_costs(self.ctx, self.opts.spec.draft_max)
        return list(self._verify_costs)

    def drafter_for(self, mode: str) -> Drafter:
        """A fresh drafter of this mode over the session's models (bench makes one per run)."""
        s = self.opts.spec
        if mode == "none":
            return NoDrafter()
        kind, fixed = mode.removesuffix("-fixed"), mode.endswith("-fixed")
        lookup = lookup_drafter(s) if kind in ("lookup", "hybrid", "mtp-lookup", "eagle3-lookup") else None
        model: ModelDrafter | MTPDrafter | Eagle3Drafter | None = None
        if kind in ("model", "hybrid"):
            model = self.model_drafter()
        elif kind in ("mtp", "mtp-lookup"):
            model = self.mtp_drafter()
        elif kind in ("eagle3", "eagle3-lookup"):
            model = self.eagle3_drafter()
        if fixed:
            return lookup or model
        if isinstance(model, Eagle3Drafter):
            dcost = calibrate.cached_cost("eagle3", self.ctx, model.token_cost)
        elif isinstance(model, MTPDrafter):
            dcost = calibrate.cached_cost("mtp-head" if self.mtp_head else "mtp", self.ctx, model.token_cost)
        else:
            dcost = calibrate.draft_token_cost(model.ctx) if model else 0.0
        return adaptive_drafter(s, self.verify_costs(), dcost, lookup, model)

    def placement(self) -> dict:
        """Where each model runs, for reports."""
        return {"backends": list(self.hardware.backends), "gpu_offload": self.hardware.can_offload,
                "devices": [d.name for d in self.hardware.devices],
                "budget": self.hardware.budget, "budget_source": self.hardware.budget_source,
                "target_gpu_layers": self.target_gpu_layers,
                "draft_gpu_layers": self.draft_gpu_layers if self.draft_path else None,
                "plan": self.plan.branch, "drafter": self.plan.draft}

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
                 drafter: Drafter | None = None, exact_prefill: bool = False) -> Response:
        return generate(self.ctx, prompt, drafter or self.drafter, params, max_tokens, self.opts.spec.draft_max,
                        exact_prefill)

    def plain_rate_estimate(self) -> float | None:
        """Tokens/s plain decoding would have reached here: the controller's measured cost of a
        one-token pass (refreshed from this run's plain steps); None without a controller."""
        ctl = getattr(self.drafter, "ctl", None)
        return 1.0 / ctl.cost.verify[0] if ctl and ctl.cost.verify[0] > 0 else None

    def slower_than_plain(self, st: Stats, tolerance: float = 0.95) -> str | None:
        """A one-line warning when speculation ran measurably slower than plain decoding would."""
        est = self.plain_rate_estimate()
        if est and st.generated >= 32 and st.tokens_per_s < tolerance * est:
            return (f"note: speculation ran at {st.tokens_per_s / est:.2f}x the measured plain speed "
                    f"({st.tokens_per_s:.1f} vs {est:.1f} tok/s) on this text; --draft none may be faster")
        return None

    def close(self) -> None:
        self.drafter.close()
        for shared in (self._model_drafter, self._mtp, self._eagle3):
            if shared:
                shared.close()
        self.ctx.close()
        self.target.close()
        for m in (self.draft_model, self.mtp_head or self.eagle3_head):
            if m:
                m.close()
