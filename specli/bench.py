"""Plain vs speculative decoding side by side on one target, in one process.

Each prompt of a suite runs in each mode against the same loaded target; modes are measured
in turn over all prompts so the same prompt never runs twice in a row, and every mode gets a
warm-up first. Rates exclude prompt processing (all modes prefill alike). At temperature 0,
every mode's tokens are compared with plain decoding's; where they part, the report gives the
position and the target's top-2 margin there.
"""

from __future__ import annotations

import resource
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from . import calibrate
from .controller import Controller, CostModel
from .decode import AcceptanceRates, Stats, generate
from .drafters import AdaptiveDrafter, LookupDrafter, ModelDrafter, NoDrafter
from .engine import Context, ContextConfig, Model
from .lossless import divergence
from .prompt import build_prompt
from .suite import Suite
from .verify import SamplingParams

MODES = ("plain", "lookup", "lookup-fixed", "llama-cpp-python-lookup", "model", "hybrid", "model-fixed")


@dataclass
class ModeResult(AcceptanceRates):
    mode: str
    tokens: int = 0
    seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    spec_steps: int = 0
    steps: int = 0
    t_draft: float = 0.0
    t_verify: float = 0.0
    peak_rss_mb: float = 0.0
    per_prompt: dict = field(default_factory=dict)  # prompt id -> tokens/s of each repeat
    lossless: dict = field(default_factory=dict)  # prompt id -> "identical" or a description
    speedup: float | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def draft_share(self) -> float:
        t = self.t_draft + self.t_verify
        return self.t_draft / t if t else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(tokens_per_s=self.tokens_per_s, acceptance=self.acceptance,
                 mean_accepted=self.mean_accepted, draft_share=self.draft_share)
        return d


@dataclass
class BenchReport:
    target: str
    draft: str | None
    suite: str
    max_tokens: int
    repeat: int
    threads: int
    results: dict[str, ModeResult]

    def to_dict(self) -> dict:
        return {"target": self.target, "draft": self.draft, "suite": self.suite, "max_tokens": self.max_tokens,
                "repeat": self.repeat, "threads": self.threads,
                "modes": {m: r.to_dict() for m, r in self.results.items()}}


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class _LlamaCppPythonLookup:
    """llama-cpp-python's own LlamaPromptLookupDecoding, as its users would pick it, run
    through its high-level Llama.generate on a second copy of the target."""

    def __init__(self, path: str, n_ctx: int, threads: int, draft_max: int):
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.llm = Llama(path, n_ctx=n_ctx, n_threads=threads, verbose=False, logits_all=False,
                         draft_model=LlamaPromptLookupDecoding(num_pred_tokens=draft_max))

    def run(self, prompt: list[int], max_tokens: int, is_eog) -> tuple[list[int], float]:
        self.llm.reset()
        out: list[int] = []
        t0 = None
        for tok in self.llm.generate(prompt, temp=0.0, top_k=1, reset=True):
            if t0 is None:
                t0 = time.perf_counter()
            if is_eog(tok):
                break
            out.append(tok)
            if len(out) >= max_tokens:
                break
        return out, (time.perf_counter() - t0) if t0 else 0.0


def schedule(modes: list[str], n_prompts: int) -> list[tuple[int, str]]:
    """Every (prompt, mode) pair once, modes interleaved in time (in each round every mode runs
    a different prompt), never the same prompt twice in a row when there are two or more."""
    order = [((r + j) % n_prompts, m) for r in range(n_prompts) for j, m in enumerate(modes)]
    for i in range(1, len(order)):
        if order[i][0] != order[i - 1][0]:
            continue
        for k in range(i + 1, len(order)):
            ok_here = order[k][0] != order[i - 1][0]
            ok_there = order[i][0] != order[k - 1][0] and (k + 1 >= len(order) or order[i][0] != order[k + 1][0])
            if ok_here and ok_there and k != i + 1:
                order[i], order[k] = order[k], order[i]
                break
    return order


def run_bench(target_path: str, draft_path: str | None, suite: Suite, modes: list[str], max_tokens: int = 128,
              repeat: int = 1, n_ctx: int = 4096, threads: int | None = None, draft_max: int = 8,
              gpu_layers: int = 0, progress: Callable[[str, int, int], None] | None = None,
              chat: bool | None = None) -> BenchReport:
    target = Model(target_path, n_gpu_layers=gpu_layers)
    cfg = ContextConfig(n_ctx=min(n_ctx, target.n_ctx_train), n_threads=threads)
    ctx = Context(target, cfg)
    use_chat = target.chat_template() is not None if chat is None else chat
    prompts = [(p, build_prompt(target, p.text, use_chat)) for p in suite.prompts]
    verify = calibrate.verify_costs(ctx, draft_max)
    mdrafter: ModelDrafter | None = None  # loaded after the warm-ups without it (peak RSS per mode)
    dcost = 0.0
    lcp = None

    def load_draft() -> None:
        nonlocal mdrafter, dcost
        if mdrafter is None:
            mdrafter = ModelDrafter(Model(draft_path, n_gpu_layers=gpu_layers), cfg, p_min=0.0)
            dcost = calibrate.draft_token_cost(mdrafter.ctx)

    def make(mode: str):
        if mode == "plain":
            return NoDrafter()
        if mode == "lookup-fixed":
            return LookupDrafter()
        if mode == "model-fixed":
            return _FixedModel(mdrafter)
        ctl = Controller(CostModel(list(verify), dcost), k_max=draft_max)
        return AdaptiveDrafter(ctl, LookupDrafter() if mode in ("lookup", "hybrid") else None,
                               mdrafter if mode in ("model", "hybrid") else None)

    needs_draft = ("model", "hybrid", "model-fixed")
    modes = [m for m in MODES if m in modes]  # known modes, in the report's order
    if not draft_path:
        modes = [m for m in modes if m not in needs_draft]
    results = {m: ModeResult(m) for m in modes}
    total = len(modes) * (len(prompts) * repeat + 1)
    done = 0

    def one(mode: str, sp, toks: list[int], n: int) -> tuple[list[int], Stats]:
        st = Stats()
        if mode == "llama-cpp-python-lookup":
            out, secs = lcp.run(toks, n, target.is_eog)
            st.generated, st.t_generate = len(out), secs
            return out, st
        ctx.clear()
        params = SamplingParams(sp.temperature, sp.top_k, sp.top_p, seed=1234)
        out: list[int] = []
        for ch in generate(ctx, toks, make(mode), params, n, draft_max, st):
            out += ch.tokens
        return out, st

    outputs: dict[tuple[str, str], tuple[list[int], list[int]]] = {}

    def measure(mode: str, sp, toks: list[int], first_pass: bool) -> None:
        r = results[mode]
        out, st = one(mode, sp, toks, sp.max_tokens or max_tokens)
        r.tokens += st.generated
        r.seconds += st.t_generate
        r.drafted += st.drafted
        r.accepted += st.accepted
        r.spec_steps += st.spec_steps
        r.steps += st.steps
        r.t_draft += st.t_draft
        r.t_verify += st.t_verify
        r.per_prompt.setdefault(sp.id, []).append(st.generated / st.t_generate if st.t_generate else 0)
        if sp.temperature == 0 and first_pass:
            outputs[(mode, sp.id)] = (toks, out)

    try:
        # warm-ups, modes without the draft model first: peak memory with and without it
        for mode in sorted(modes, key=lambda m: m in needs_draft):
            if mode in needs_draft:
                load_draft()
            if mode == "llama-cpp-python-lookup":
                lcp = _LlamaCppPythonLookup(target_path, cfg.n_ctx, ctx.threads, draft_max)
            if progress:
                progress(f"{mode}: warm-up", done, total)
            one(mode, prompts[-1][0], prompts[-1][1], 16)
            done += 1
            results[mode].peak_rss_mb = _peak_rss_mb()
        # measured runs, interleaved: in each round every mode runs a different prompt, so slow
        # drifts of the machine hit every mode alike
        for rep in range(repeat):
            for sp_i, mode in schedule(modes, len(prompts)):
                sp, toks = prompts[sp_i]
                if progress:
                    progress(f"{mode}: {sp.id}", done, total)
                measure(mode, sp, toks, rep == 0)
                done += 1
        # lossless check: every mode's greedy tokens against plain decoding's
        for (mode, pid), (toks, out) in outputs.items():
            ref = outputs.get(("plain", pid))
            if mode != "plain" and ref is not None:
                d = divergence(ctx, toks, ref[1], out)
                results[mode].lossless[pid] = "identical" if d is None else d.describe()
    finally:
        ctx.close()
        target.close()
        if mdrafter:
            mdrafter.close()
            mdrafter.model.close()
    if "plain" in results and results["plain"].tokens_per_s:
        base = results["plain"].tokens_per_s
        for r in results.values():
            r.speedup = r.tokens_per_s / base
    return BenchReport(target_path, draft_path, suite.name, max_tokens, repeat, ctx.threads, results)


class _FixedModel:
    """The draft model at a fixed draft length with llama.cpp's default cut-off (stop when the
    draft's top probability is under 0.75), sharing the loaded drafter."""

    name = "model"
    p_min = 0.75

    def __init__(self, inner: ModelDrafter):
        self.inner = inner

    def propose(self, context, max_len):
        return self.inner.propose(context, max_len, p_min=self.p_min)

    def close(self):
        pass
