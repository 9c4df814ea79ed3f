"""Plain vs speculative decoding side by side on one target, in one process.

Each prompt of a suite runs in each mode against the same loaded target; modes are measured
in turn over all prompts so the same prompt never runs twice in a row, and every mode gets a
warm-up first. Rates exclude prompt processing (all modes prefill alike). At temperature 0,
every mode's tokens are compared with plain decoding's (mode ``none``); where they part, the
report gives the position and the target's top-2 margin there. Modes are named as everywhere
(:data:`specli.speculate.registry.MODES`); ``llama-cpp-python-lookup`` is the one comparison row
of another tool.

Every mode runs without the earlier answers lookup may copy from, but ``lookup-history``: its
history (bounded by ``--lookup-history``) is fed its own answers, prompt after prompt, so each
prompt drafts from the answers to the prompts it ran before in that round (a round runs the
suite in order, from another first prompt for each mode; each round starts with an empty
history, so no prompt ever finds its own answer there).
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from specli.measure.lossless import divergence, verdict
from specli.measure.suite import Suite
from specli.prompt import prompt_tokens
from specli.speculate import registry
from specli.speculate.history import History, parse_bound
from specli.speculate.loop import AcceptanceRates, Stats
from specli.speculate.verify import SamplingParams

if TYPE_CHECKING:
    from specli.session import Session

PLAIN = registry.DraftKind.NONE.value  # the baseline every mode is compared with
LCP = "llama-cpp-python-lookup"  # llama-cpp-python's own prompt lookup (--compare-llama-cpp-python)
ORDER = (*registry.MODES, LCP)  # the order reports list modes in


def parse_modes(text: str) -> list[str]:
    """``--modes``: comma-separated mode names (registry.MODES); a wrong one is a one-line error."""
    return [registry.mode(m).name for m in text.split(",") if m.strip()]


@dataclass
class ModeResult(AcceptanceRates):
    mode: str
    tokens: int = 0
    seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    spec_steps: int = 0
    steps: int = 0
    history: int = 0  # accepted tokens copied from earlier answers (lookup-history)
    t_draft: float = 0.0
    t_verify: float = 0.0
    peak_rss_mb: float = 0.0
    per_prompt: dict = field(default_factory=dict)  # prompt id -> tokens/s of each repeat
    lossless: dict = field(default_factory=dict)  # prompt id -> "identical" or a description
    speedup: float | None = None
    error: str = ""  # a comparison mode that could not run says why here

    def add(self, st: Stats) -> None:
        self.tokens += st.generated
        self.seconds += st.t_generate
        self.drafted += st.drafted
        self.accepted += st.accepted
        self.spec_steps += st.spec_steps
        self.steps += st.steps
        self.history += st.history
        self.t_draft += st.t_draft
        self.t_verify += st.t_verify

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
    placement: dict = field(default_factory=dict)  # where each model ran (Session.placement)

    def to_dict(self) -> dict:
        return {"target": self.target, "draft": self.draft, "suite": self.suite, "max_tokens": self.max_tokens,
                "repeat": self.repeat, "threads": self.threads, "placement": self.placement,
                "modes": {m: r.to_dict() for m, r in self.results.items()}}


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class _LlamaCppPythonLookup:
    """llama-cpp-python's own LlamaPromptLookupDecoding, as its users would pick it, run
    through its high-level Llama.generate on a second copy of the target."""

    def __init__(self, path: str, n_ctx: int, threads: int, draft_max: int, n_gpu_layers: int = 0):
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        # logits_all=True: with a draft model Llama keeps every row's logits anyway, but sizes its
        # score buffer by this flag (n_batch rows when False), so a prompt longer than n_batch
        # failed with "could not broadcast input array ... into shape (0,)"
        self.llm = Llama(path, n_ctx=n_ctx, n_threads=threads, n_gpu_layers=n_gpu_layers, verbose=False,
                         logits_all=True,
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


def run_bench(sess: Session, suite: Suite, modes: list[str], max_tokens: int = 128, repeat: int = 1,
              progress: Callable[[str, int, int], None] | None = None, chat: bool | None = None,
              on_result: Callable[[BenchReport], None] | None = None) -> BenchReport:
    """Every mode over ``suite`` on the session's target, drafters built by the session (the
    same construction, hardware plan and settings as ``specli run``). ``on_result`` gets the
    report as far as it got after the warm-ups and after every measured prompt (``--out``
    keeps it, so an interrupted run leaves the prompts it finished)."""
    for m in modes:
        if m != LCP:
            registry.mode(m)  # an unknown name is an error, not a mode quietly left out
    run = BenchRun(sess, suite, modes, max_tokens, repeat, progress, chat, on_result)
    run.warm_up()
    for rep in range(repeat):
        run.round(rep)
    return run.report()


class BenchRun:
    """One ``run_bench``: its modes, prompts, results so far and the greedy outputs compared."""

    def __init__(self, sess: Session, suite: Suite, modes: list[str], max_tokens: int, repeat: int,
                 progress: Callable[[str, int, int], None] | None, chat: bool | None,
                 on_result: Callable[[BenchReport], None] | None):
        self.sess, self.suite, self.max_tokens, self.repeat = sess, suite, max_tokens, repeat
        self.progress, self.on_result = progress, on_result
        target = sess.target
        use_chat = target.chat_template() is not None if chat is None else chat
        self.prompts = [(p, prompt_tokens(target, p, use_chat)) for p in suite.prompts]
        self.available = {m.name: m for m in sess.modes()}
        # a draft derived from the target answers to model/hybrid too, and reports its own name
        # (early-exit:E, layer-skip:SET+lookup)
        base = {m.name: m.base for m in self.available.values()}
        self.modes = [m for m in sorted(self.available, key=lambda n: ORDER.index(base[n]))
                      if self.available[m].answers(modes)] + ([LCP] if LCP in modes else [])
        self.results = {m: ModeResult(m) for m in self.modes}
        self.total = len(self.modes) * (len(self.prompts) * repeat + 1)
        self.done = 0
        self.lcp: _LlamaCppPythonLookup | None = None
        self.outputs: dict[tuple[str, str], tuple[list[int], list[int]]] = {}
        self.live: list[str] = []  # the modes whose warm-up ran
        self.histories: dict[str, History] = {}  # a history mode's earlier answers this round

    def history(self, mode: str) -> History | None:
        """The earlier answers ``mode`` copies from: none, but for a history mode (lookup-history)."""
        m = self.available.get(mode)
        if m is None or not m.history:
            return None
        if mode not in self.histories:
            bound = parse_bound(self.sess.opts.spec.lookup_history)
            self.histories[mode] = History(bound)
        return self.histories[mode]

    def one(self, mode: str, sp, toks: list[int], n: int) -> tuple[list[int], Stats]:
        if mode == LCP:
            out, secs = self.lcp.run(toks, n, self.sess.target.is_eog)
            return out, Stats(generated=len(out), t_generate=secs)
        drafter = self.sess.drafter_for(self.available[mode])  # built before its run: loaded and priced at the warm-up
        self.sess.ctx.clear()
        params = SamplingParams(sp.temperature, sp.top_k, sp.top_p, seed=1234 if sp.seed is None else sp.seed)
        resp = self.sess.generate(toks, params, n, drafter, constraint=sp.constraint(), history=self.history(mode))
        out = [t for ch in resp for t in ch.tokens]
        return out, resp.stats

    def measure(self, mode: str, sp, toks: list[int], first_pass: bool) -> None:
        r = self.results[mode]
        out, st = self.one(mode, sp, toks, sp.max_tokens or self.max_tokens)
        r.add(st)
        r.per_prompt.setdefault(sp.id, []).append(st.generated / st.t_generate if st.t_generate else 0)
        if sp.temperature == 0 and first_pass:
            self.outputs[(mode, sp.id)] = (toks, out)

    def report(self) -> BenchReport:
        sess = self.sess
        _compare(sess.ctx, self.outputs, self.results)
        return BenchReport(sess.target.path, sess.draft_path, self.suite.name, self.max_tokens, self.repeat,
                           sess.ctx.threads, self.results, sess.placement())

    def _needs_draft(self, m: str) -> bool:
        return m != LCP and self.available[m].kind.entry.paid is registry.DraftKind.MODEL

    def _start_lcp(self) -> None:
        sess, draft_max = self.sess, self.sess.opts.spec.draft_max
        # llama-cpp-python's score buffer is n_ctx rows of n_vocab floats: only the room the longest run needs
        n_ctx = min(sess.ctx.n_ctx, max(len(t) + (sp.max_tokens or self.max_tokens) for sp, t in self.prompts)
                    + draft_max + 16)
        self.lcp = _LlamaCppPythonLookup(sess.target.path, n_ctx, sess.ctx.threads, draft_max, sess.target_gpu_layers)

    def _step(self, mode: str, what: str, run: Callable[[], None]) -> None:
        """One unit of the run: a comparison mode (llama-cpp-python's lookup) that fails is a row
        that says so; specli's own modes fail the bench."""
        if self.progress:
            self.progress(f"{mode}: {what}", self.done, self.total)
        try:
            run()
        except Exception as e:  # noqa: BLE001 - a comparison mode that fails is a row that says so
            if mode != LCP:
                raise
            self.results[mode].error = _one_line(e)
        self.done += 1

    def warm_up(self) -> None:
        """Modes without the draft model first (peak memory with and without it); each mode's
        models are loaded and its costs measured (calibrated once per machine) before it runs."""
        sp, toks = self.prompts[-1]

        def warm(mode: str) -> None:
            if mode == LCP:
                self._start_lcp()
            else:
                self.sess.prepare(self.available[mode])
            self.one(mode, sp, toks, 16)

        for mode in sorted(self.modes, key=self._needs_draft):
            self._step(mode, "warm-up", lambda mode=mode: warm(mode))
            self.results[mode].peak_rss_mb = _peak_rss_mb()
        self.live = [m for m in self.modes if not self.results[m].error]
        if self.on_result:
            self.on_result(self.report())

    def round(self, rep: int) -> None:
        """The measured runs, interleaved: in each round every mode runs a different prompt, so
        slow drifts of the machine hit every mode alike."""
        for _ in self.steps(rep):
            pass

    def steps(self, rep: int) -> Iterator[None]:
        """Round ``rep``, one measured run per step (``compare`` interleaves the rounds of
        several targets step by step)."""
        self.histories.clear()  # no prompt finds its own answer (nor the warm-up's) in history
        for sp_i, mode in schedule(self.live, len(self.prompts)):
            sp, toks = self.prompts[sp_i]
            if self.results[mode].error:  # a comparison mode that failed on an earlier prompt: its row says why
                self.done += 1
                continue
            self._step(mode, sp.id, lambda mode=mode, sp=sp, toks=toks: self.measure(mode, sp, toks, rep == 0))
            if self.on_result:
                self.on_result(self.report())
            yield


def _compare(ctx, outputs: dict, results: dict[str, ModeResult]) -> None:
    """Every mode's greedy tokens against plain decoding's (each prompt once), and speedups."""
    for (mode, pid), (toks, out) in outputs.items():
        ref = outputs.get((PLAIN, pid))
        if mode != PLAIN and ref is not None and pid not in results[mode].lossless:
            d = divergence(ctx, toks, ref[1], out)
            results[mode].lossless[pid] = verdict(d)
    base = results[PLAIN].tokens_per_s if PLAIN in results else 0.0
    for r in results.values():
        r.speedup = r.tokens_per_s / base if base and r.tokens else None


def _one_line(e: Exception) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())
