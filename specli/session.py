"""The runtime of one generation: the target's context and the drafters over the models a
:class:`~specli.hardware.placement.Placement` placed, and generation with them. The steps
before it are apart and callable on their own: :func:`specli.resolve.choose.choose_models`
chooses the models, :func:`specli.hardware.placement.place` plans where they go; a Session
runs what they decided (the CLI commands build one from their options and only print)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from specli.constrain import Constraint
from specli.engine import Context, ContextConfig, Model
from specli.engine.weights import Weights
from specli.errors import SpecliError
from specli.hardware import calibrate
from specli.hardware.devices import Hardware
from specli.hardware.placement import Placement, gpu_layers, place, plan_for
from specli.hardware.plan import Plan
from specli.options import Options
from specli.prompt import build_prompt
from specli.resolve import vocab
from specli.resolve.choose import DraftPlan, apply_profile_defaults, choose_models
from specli.resolve.profiles import Profile
from specli.speculate import forced, registry
from specli.speculate.adaptive import lookup_drafter
from specli.speculate.drafters import Drafter, LookupDrafter, ModelDrafter, NoDrafter, PaidDrafter
from specli.speculate.heads import DFlashDrafter, Eagle3Drafter, dflash_context, eagle3_context
from specli.speculate.history import Histories, History, parse_bound
from specli.speculate.loop import Response, Stats, check_prompt_fits, generate
from specli.speculate.mtp import MTPDrafter
from specli.speculate.registry import DraftKind, DraftMode
from specli.speculate.settings import SpecSettings
from specli.speculate.verify import SamplingParams

# the steps' names where they were first imported from (their homes: options, resolve.choose,
# hardware.placement)
__all__ = ["DraftPlan", "Options", "Session", "apply_profile_defaults", "choose_models", "gpu_layers", "plan_for"]


class Session:
    """The one construction path every command goes through: the models chosen (the profile's
    defaults, tokenizers checked from the headers first), placed (the hardware plan), then the
    target's context and the drafters, built the same way for ``run``, ``chat``, ``bench`` and
    ``serve``."""

    def __init__(self, opts: Options, progress: Callable[[str], None] | None = None, build_drafter: bool = True,
                 placement: Placement | None = None, weights: Weights | None = None):
        """Choose the models and place them (unless ``placement`` is given: the steps before,
        taken apart, as a pool of models takes them), then load the target and its context and
        build the drafter."""
        self.opts = opts
        self.weights = weights  # a server's shared weights (a draft model two targets use is loaded once)
        self.placed = placement or place(opts, choose_models(opts, progress))
        self.draft = self.placed.draft  # what drafts, decided: the GPU may not hold the draft model too
        self.draft_model: Model | None = None
        self.head_model: Model | None = None  # a drafting head (MTP-only, EAGLE-3, DFlash), loaded on first use
        self._paid: dict[DraftKind, PaidDrafter] = {}  # the draft model's and the MTP layers' drafters, shared
        self._verify_costs: list[float] | None = None
        # earlier answers lookup copies from (--lookup-history): one history, or one per API key
        try:
            self.histories = Histories(parse_bound(opts.spec.lookup_history))
        except ValueError as e:
            raise SpecliError(str(e)) from None
        self.drafter: Drafter = NoDrafter()
        self.target = Model(self.placed.target, n_gpu_layers=self.target_gpu_layers, load_mtp=self.draft.loads_mtp)
        try:  # a load that fails leaves nothing loaded
            self.cfg, self.ctx = self._open_context()
        except BaseException:
            self.target.close()
            raise
        try:
            # bench makes its own drafters, one per mode and run; serve --parallel's slots theirs
            # (specli.speculate.batch: the draft model's cache is then the batch's, one sequence a slot)
            if build_drafter and opts.parallel <= 1:
                self.drafter = self.drafter_for(self.draft.mode)
        except BaseException:
            self.close()
            raise

    def _open_context(self) -> tuple[ContextConfig, Context]:
        """The target's context (a sequence per slot), as the options ask for it."""
        opts = self.opts
        n_ctx = min(opts.n_ctx, self.target.n_ctx_train) if opts.n_ctx > 0 else self.target.n_ctx_train
        if "ctx" in opts.given and opts.n_ctx > n_ctx:
            opts.notes.append(f"--ctx {opts.n_ctx} is more than {self.target.name} was trained for: "
                              f"using its {n_ctx} tokens")
        # hybrid/recurrent targets keep draft_max recurrent-state snapshots where llama.cpp can
        cfg = ContextConfig(n_ctx=n_ctx, n_threads=opts.threads, f32_kv=opts.f32_kv, n_rs_seq=opts.spec.draft_max)
        ctx = Context(self.target, replace(cfg, n_seq=max(1, opts.parallel)))
        if self.target.recurrent and self.draft.kind is not DraftKind.NONE:
            how = (f"recurrent-state snapshots ({ctx.n_rs_seq})" if ctx.rollback_kind == "snapshots"
                   else "state checkpoints")
            opts.notes.append(f"{self.target.name} is a hybrid/recurrent model: rejected drafts roll back by {how}")
        return cfg, ctx

    # -- what was chosen and placed (resolve.choose, hardware.placement) -------------------
    @property
    def profile(self) -> Profile | None:
        return self.placed.choice.profile

    @property
    def plan(self) -> Plan:
        return self.placed.plan

    @property
    def hardware(self) -> Hardware:
        return self.placed.hardware

    @property
    def target_gpu_layers(self) -> int:
        return self.placed.target_gpu_layers

    @property
    def draft_gpu_layers(self) -> int:
        return self.placed.draft_gpu_layers

    @property
    def draft_path(self) -> str | None:
        """The draft model's file, when the session drafts with one."""
        return self.draft.draft_path

    @property
    def drafter_name(self) -> str:
        """The drafter its generations use: the session's own, or with ``--parallel`` the one
        every slot builds (the placed mode, a head's fallback to prompt lookup included)."""
        return self.draft.mode.name

    def placement(self) -> dict:
        """Where each model runs, for reports."""
        return self.placed.report()

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
        ngl = self.draft_gpu_layers or 0
        self.draft_model = self.weights.get(self.draft_path, ngl) if self.weights else \
            Model(self.draft_path, n_gpu_layers=ngl)
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

    # -- generation -----------------------------------------------------------------------
    def prompt_tokens(self, text: str, chat: bool | None = None, system: str | None = None) -> list[int]:
        if chat is None:
            chat = self.target.chat_template() is not None
        if not text.strip():
            raise SpecliError("the prompt is empty")
        toks = build_prompt(self.target, text, chat, system)
        check_prompt_fits(len(toks), self.ctx.n_ctx)
        return toks

    def history(self, history: History | bool | None = True, owner: str | None = None) -> History | None:
        """The earlier answers a generation copies from and joins: ``True``, ``owner``'s own
        (the session's, or an API key's on a server with keys; None when --lookup-history is
        0); ``None`` or ``False``, none; a :class:`History`, that one."""
        if history is True:
            return self.histories.of(owner)
        return history if isinstance(history, History) else None

    def generate(self, prompt: list[int], params: SamplingParams, max_tokens: int,
                 drafter: Drafter | None = None, exact_prefill: bool = False,
                 constraint: Constraint | None = None, logprobs: int | None = None,
                 history: History | bool | None = True, owner: str | None = None) -> Response:
        """Generate with the session's drafter (or ``drafter``); under a ``constraint`` a
        speculating drafter also drafts the tokens the grammar forces (:class:`ForcedDrafter`).
        ``history`` and ``owner``: the earlier answers lookup copies from (:meth:`history`)."""
        d = forced.under(drafter or self.drafter, constraint)
        return generate(self.ctx, prompt, d, params, max_tokens, self.opts.spec.draft_max, exact_prefill, constraint,
                        logprobs, self.history(history, owner))

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
        if self.draft_model is not None:
            (self.weights.put if self.weights else Model.close)(self.draft_model)
        if self.head_model is not None:
            self.head_model.close()
