"""Everything one generation needs, wired together: the resolved models, the target context,
the drafter. The CLI commands build a Session from their options and only print."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Iterator

from . import calibrate, compat, hub, models
from . import profile as profiles
from .controller import Controller, CostModel
from .decode import Chunk, Stats, check_prompt_fits, generate
from .drafters import AdaptiveDrafter, Drafter, LookupDrafter, ModelDrafter, NoDrafter
from .engine import Context, ContextConfig, Model
from .errors import SpecliError
from .gguf_meta import read_gguf, vocab_from_header
from .hardware import Hardware, detect
from .plan import Plan, make_plan, memory_from_header
from .profile import ModelSpec, Profile
from .prompt import build_prompt
from .verify import SamplingParams


@dataclass
class Options:
    target: str | None = None
    draft: str = "none"
    profile: str | None = None
    n_ctx: int = 4096
    threads: int | None = None
    gpu_layers: int | None = None  # None: the hardware plan decides
    draft_gpu_layers: int | None = None
    vram: str | None = None  # overrides the detected GPU budget (--vram / SPECLI_VRAM)
    draft_max: int = 16
    draft_p_min: float = 0.6
    adaptive: bool = True  # cost-aware controller; False: always draft up to draft_max
    hybrid: bool = True  # with a draft model, also use prompt lookup when the context repeats
    lookup_ngram: tuple[int, int] = (1, 8)
    lookup_min_match: int = 2
    f32_kv: bool = False
    given: set[str] = field(default_factory=set)  # options the user typed: a profile does not override them
    notes: list[str] = field(default_factory=list)  # one-line decisions for stderr


def plan_for(opts: Options, target_path: str, draft_path: str | None) -> tuple[Plan, Hardware, int]:
    """The hardware plan for these models and options, from the headers alone."""
    th = read_gguf(target_path)
    dh = read_gguf(draft_path) if draft_path else None
    n_ctx_train = int(th.arch_key("context_length", 4096) or 4096)
    n_ctx = min(opts.n_ctx, n_ctx_train) if opts.n_ctx > 0 else n_ctx_train
    hw = detect(opts.vram)
    wants = "none" if opts.draft == "none" else ("model" if draft_path else "lookup")
    pays = bool(draft_path) and calibrate.draft_on_cpu_pays(
        target_path, draft_path, opts.threads or os.cpu_count() or 1, min(512, n_ctx), opts.draft_max)
    plan = make_plan(memory_from_header(th, name="target"), memory_from_header(dh, name="draft") if dh else None,
                     hw.budget, n_ctx, hw.can_offload or hw.budget_source != "detected", bool(pays),
                     wants_draft=wants)
    return plan, hw, n_ctx


def apply_profile_defaults(opts: Options, prof: Profile | None) -> None:
    """A profile's defaults fill the options the user did not give."""
    if prof is None:
        return
    for key, attr in profiles.DEFAULTS.items():
        if key in prof.defaults and key not in opts.given:
            setattr(opts, attr, type(getattr(opts, attr))(prof.defaults[key]))


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
    if opts.draft == "auto":
        local = opts.target if opts.target and os.path.exists(os.path.expanduser(opts.target)) else None
        prof = prof or (profiles.for_target(opts.target, local) if opts.target else None)
        if prof and prof.drafts:
            dspec = prof.drafts[0]
            notes.append(f"--draft auto: {dspec.ref} (profile {prof.name}), hybrid with prompt lookup")
        else:
            dspec = _search_draft(tspec, notes)
    elif opts.draft not in ("none", "lookup"):
        dspec = ModelSpec((opts.draft,))
    if dspec is not None:
        th, dh = models.header_of_spec(tspec), models.header_of_spec(dspec)
        compat.ensure_compatible(vocab_from_header(th), vocab_from_header(dh))
    tpath = models.resolve_spec(tspec, progress, notes)
    dpath = models.resolve_spec(dspec, progress, notes) if dspec else None
    apply_profile_defaults(opts, prof)
    return tpath, dpath, prof


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
            if compat.mismatch_message(compat.check_vocab(vocab_from_header(th), vocab_from_header(dh))) is None:
                notes.append(f"--draft auto: {cand} (smallest compatible {hub.family_of(h.repo)} GGUF on the Hub, "
                             "tokenizer checked from its header), hybrid with prompt lookup")
                return ModelSpec((str(cand),))
    except SpecliError as e:
        notes.append(f"--draft auto: Hub search failed ({e}); using prompt lookup")
        return None
    notes.append(f"--draft auto: no smaller compatible {hub.family_of(h.repo)} GGUF on the Hub; using prompt lookup")
    return None


class Session:
    def __init__(self, opts: Options, progress: Callable[[str], None] | None = None):
        self.opts = opts
        target_path, draft_path, self.profile = choose_models(opts, progress)
        self.plan, self.hardware, _ = plan_for(opts, target_path, draft_path)
        if self.hardware.budget is not None:
            opts.notes.append(self.plan.summary)
        if draft_path and self.plan.draft == "lookup":
            draft_path = None  # the GPU cannot hold both: the plan falls back to prompt lookup
        gpu_layers = self.plan.target_gpu_layers if opts.gpu_layers is None else opts.gpu_layers
        if opts.draft_gpu_layers is None:
            opts.draft_gpu_layers = self.plan.draft_gpu_layers if opts.gpu_layers is None else opts.gpu_layers
        self.target = Model(target_path, n_gpu_layers=gpu_layers)
        n_ctx = min(opts.n_ctx, self.target.n_ctx_train) if opts.n_ctx > 0 else self.target.n_ctx_train
        self.cfg = ContextConfig(n_ctx=n_ctx, n_threads=opts.threads, f32_kv=opts.f32_kv)
        self.ctx = Context(self.target, self.cfg)
        self.draft_model: Model | None = None
        self.drafter = self._make_drafter(draft_path)

    def _make_drafter(self, draft_path: str | None) -> Drafter:
        o = self.opts
        if o.draft != "none" and not self.target.can_rollback:
            o.notes.append(f"{self.target.name} is a recurrent/hybrid model whose cache cannot drop "
                           "rejected tokens: speculation is off, decoding plainly")
            return NoDrafter()
        if o.draft == "none" or o.draft_max == 0:
            return NoDrafter()
        model = None
        if draft_path:
            self.draft_model = Model(draft_path, n_gpu_layers=o.draft_gpu_layers or 0)
            # the loaded vocabularies are what llama.cpp will actually use: check them too
            compat.ensure_compatible(self.target.vocab_info(), self.draft_model.vocab_info())
            model = ModelDrafter(self.draft_model, self.cfg, p_min=o.draft_p_min if not o.adaptive else 0.0)
        lookup = None
        if model is None or o.hybrid:
            lookup = LookupDrafter(*o.lookup_ngram, min_match=o.lookup_min_match)
        if not o.adaptive:
            return model or lookup
        verify = calibrate.verify_costs(self.ctx, o.draft_max)
        dcost = calibrate.draft_token_cost(model.ctx) if model else 0.0
        ctl = Controller(CostModel(verify, dcost), k_max=o.draft_max)
        return AdaptiveDrafter(ctl, lookup, model)

    def prompt_tokens(self, text: str, chat: bool | None = None, system: str | None = None) -> list[int]:
        if chat is None:
            chat = self.target.chat_template() is not None
        if not text.strip():
            raise SpecliError("the prompt is empty")
        toks = build_prompt(self.target, text, chat, system)
        check_prompt_fits(len(toks), self.ctx.n_ctx)
        return toks

    def generate(self, prompt: list[int], params: SamplingParams, max_tokens: int,
                 stats: Stats | None = None) -> Iterator[Chunk]:
        return generate(self.ctx, prompt, self.drafter, params, max_tokens, self.opts.draft_max, stats)

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
        self.ctx.close()
        self.target.close()
        if self.draft_model:
            self.draft_model.close()
