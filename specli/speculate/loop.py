"""The decoding loop: propose, evaluate, accept, roll back, observe, emit.

``generate`` returns a :class:`Response`: iterate it for small :class:`Chunk` records (text,
tokens, which tokens came from the draft); once it has ended, ``stats`` and
``finish_reason`` say what happened. Plain decoding is the same loop with a drafter that never
proposes anything.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from specli.constrain import Constraint, Guide
from specli.engine import Context, Model
from specli.errors import PromptTooLong, SpecliError
from specli.speculate.contract import Drafter
from specli.speculate.history import History
from specli.speculate.settings import DEFAULTS
from specli.speculate.source import Draft, Source
from specli.speculate.verify import Sampler, SamplingParams, accept, log_softmax, logits_needed

# why a generation ended, as OpenAI's finish_reason where one fits
FINISH_STOP, FINISH_LENGTH, FINISH_CONTEXT, FINISH_INTERRUPTED = "stop", "length", "context", "interrupted"


@dataclass
class TokenLogprob:
    """The target's own log-probability of one emitted token (log-softmax of its logits, at
    temperature 1, before any sampling filter or constraint), and the ``top`` most likely tokens there."""

    token: int
    text: str
    logprob: float
    top: list[tuple[int, str, float]]


@dataclass
class Chunk:
    text: str
    tokens: list[int]
    from_draft: list[bool]
    logprobs: list[TokenLogprob] | None = None  # one per token, when generate(logprobs=N) asked


class AcceptanceRates:
    """Derived rates for anything counting drafted/accepted tokens and speculative steps."""

    drafted: int
    accepted: int
    spec_steps: int

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted(self) -> float:
        """Drafted tokens accepted per speculative step."""
        return self.accepted / self.spec_steps if self.spec_steps else 0.0


@dataclass
class Stats(AcceptanceRates):
    mode: str = "none"
    prompt_tokens: int = 0
    prompt_tokens_cached: int = 0
    generated: int = 0
    drafted: int = 0
    accepted: int = 0
    steps: int = 0  # target verify passes (one per emitted block)
    spec_steps: int = 0  # passes that verified at least one drafted token
    t_prefill: float = 0.0
    t_draft: float = 0.0
    t_verify: float = 0.0
    t_generate: float = 0.0  # wall time from the first to the last generated token
    stop: str = ""  # the finish reason
    history: int = 0  # accepted tokens that were copied from earlier answers (--lookup-history)
    accepted_by_source: dict = field(default_factory=dict)
    drafted_by_source: dict = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.t_generate if self.t_generate > 0 else 0.0

    @property
    def plain_steps(self) -> int:
        """Target passes that verified no drafted token (speculation off, or nothing to draft)."""
        return self.steps - self.spec_steps

    def record_step(self, source: Source, n_drafted: int, n_accepted: int, t_draft: float, t_verify: float) -> None:
        self.t_draft += t_draft
        self.t_verify += t_verify
        self.steps += 1
        if n_drafted:
            self.spec_steps += 1
            self.drafted += n_drafted
            self.accepted += n_accepted
            if source.kind == "history":
                self.history += n_accepted
            key = str(source)
            self.drafted_by_source[key] = self.drafted_by_source.get(key, 0) + n_drafted
            self.accepted_by_source[key] = self.accepted_by_source.get(key, 0) + n_accepted

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(tokens_per_s=self.tokens_per_s, acceptance=self.acceptance, mean_accepted=self.mean_accepted,
                 plain_steps=self.plain_steps)
        return d

    def summary(self) -> str:
        s = (f"{self.generated} tokens, {self.tokens_per_s:.1f} tok/s | mode {self.mode}"
             f" | prompt {self.prompt_tokens} tok in {self.t_prefill:.2f}s")
        if self.mode != "none":
            s += (f" | drafted {self.drafted}, accepted {self.accepted} ({100 * self.acceptance:.0f}%"
                  + (f"; {self.history} from history" if self.history else "") + "),"
                  f" mean accepted {self.mean_accepted:.2f}/step over {self.spec_steps} steps,"
                  f" {self.plain_steps} plain steps | draft {self.t_draft:.2f}s, verify {self.t_verify:.2f}s")
        return s + f" | finish: {self.stop}"


class Response:
    """One generation. Iterate it for chunks as they are decoded; ``stats`` fills in as it
    runs and ``finish_reason`` is set once it has ended ("stop", "length", "context",
    "interrupted"). ``close()`` stops it early and leaves the caches consistent."""

    def __init__(self, chunks: Iterator[Chunk], stats: Stats):
        self._chunks = chunks
        self.stats = stats

    def __iter__(self) -> Iterator[Chunk]:
        return self._chunks

    @property
    def finish_reason(self) -> str | None:
        return self.stats.stop or None

    def text(self) -> str:
        """Run to the end; the whole text."""
        return "".join(ch.text for ch in self)

    def close(self) -> None:
        self._chunks.close()


class _Detok:
    """Token ids to text, holding back bytes of a character split across tokens."""

    def __init__(self, piece: Callable[[int], bytes]):
        self.piece = piece
        self.dec = codecs.getincrementaldecoder("utf-8")("replace")

    def __call__(self, tokens: Sequence[int]) -> str:
        return self.dec.decode(b"".join(self.piece(t) for t in tokens))

    def flush(self) -> str:
        return self.dec.decode(b"", final=True)


def check_prompt_fits(n_prompt: int, n_ctx: int) -> None:
    if n_prompt >= n_ctx:
        raise PromptTooLong(n_prompt, n_ctx)


def cut_at_eog(model: Model, tokens: list[int], flags: list[bool]) -> tuple[list[int], list[bool], bool]:
    """The tokens before the first end-of-generation token, and whether there was one."""
    for i, t in enumerate(tokens):
        if model.is_eog(t):
            return tokens[:i], flags[:i], True
    return tokens, flags, False


def answer_tokens(model: Model, tokens: list[int]) -> list[int]:
    """An answer's tokens as history keeps them: up to its end-of-generation token, included
    (a copy from history may then draft an answer's end too)."""
    for i, t in enumerate(tokens):
        if model.is_eog(t):
            return tokens[:i + 1]
    return tokens


def token_logprobs(model: Model, rows: Sequence[np.ndarray], tokens: Sequence[int], n_top: int) -> list[TokenLogprob]:
    """``tokens[i]``'s log-probability under ``rows[i]`` (the target's logits where it was
    emitted), with the ``n_top`` most likely tokens of each row."""
    out = []
    for row, tok in zip(rows, tokens, strict=True):
        lp = log_softmax(row)
        top_ids = np.argpartition(-lp, n_top - 1)[:n_top] if n_top else np.array([], dtype=int)
        top_ids = top_ids[np.argsort(-lp[top_ids], kind="stable")]
        out.append(TokenLogprob(int(tok), _text(model, tok), float(lp[tok]),
                                [(int(t), _text(model, t), float(lp[t])) for t in top_ids]))
    return out


def _text(model: Model, tok: int) -> str:
    return model.piece(int(tok)).decode("utf-8", "replace")


def generate(target: Context, prompt: Sequence[int], drafter: Drafter, params: SamplingParams,
             max_tokens: int = 256, draft_max: int = DEFAULTS.draft_max, exact_prefill: bool = False,
             constraint: Constraint | None = None, logprobs: int | None = None,
             history: History | None = None) -> Response:
    """Generate up to ``max_tokens`` after ``prompt``, speculating with ``drafter``.

    The target's cache is reused for the longest common prefix with what it already holds
    (a multi-turn chat re-evaluates only the new turn). ``draft_max`` caps the tokens asked
    of the drafter at each step (an adaptive drafter may take fewer). ``exact_prefill``: reuse
    only whole batches of the prompt, so the rest is evaluated in the same blocks as on an
    empty cache (a quantised model's CPU logits move with the block shape; a server answering
    a repeated prompt then says exactly what a fresh run says). ``constraint``: the output
    must match it (a JSON schema, a regular expression, a grammar): the target's logits are
    masked by the grammar at every position, drafts are cut where the grammar refuses them,
    and the answer ends ("stop") when the grammar is complete. ``logprobs``: give each chunk
    the target's log-probability of its tokens and that many alternatives (0: none).
    ``history``: earlier answers prompt lookup may copy from; the answer joins them when it
    ends (stopped, at its length or at the context's end: an answer interrupted by its
    caller does not).
    """
    prompt = list(prompt)
    if not prompt:
        raise SpecliError("the prompt is empty")
    check_prompt_fits(len(prompt), target.n_ctx)
    st = Stats(mode=drafter.name)
    align = target.n_batch if exact_prefill else 1
    guide = constraint.guide(target.model) if constraint is not None else None
    return Response(_decode(target, prompt, drafter, params, max_tokens, draft_max, st, align, guide, logprobs,
                            history), st)


def _propose(drafter: Drafter, context: list[int], k_max: int, guide: Guide | None) -> tuple[Draft, list[int]]:
    """The drafter's draft, and the tokens of it to verify: at most ``k_max``, no further than
    the grammar allows."""
    draft = drafter.propose(context, k_max) if k_max > 0 else Draft([])
    d = draft.tokens[:k_max]
    if guide is not None and d:
        d = guide.clip(d)
        if len(d) < len(draft.tokens):
            draft = replace(draft, tokens=d, confidence=draft.confidence[:len(d)])
    return draft, d


def _rows_wanted(d: list[int], masks, n_logprobs: int | None):
    """The logits a verify block asks for: every row (one without a draft), or under a
    constraint, without logprobs, only the rows where the grammar allows more than one token
    (the rest are decided: the last layer and the LM head skip them)."""
    if masks is not None and n_logprobs is None:
        return logits_needed(masks)
    return "all" if d else "last"


def _decode(target: Context, prompt: list[int], drafter: Drafter, params: SamplingParams,
            max_tokens: int, draft_max: int, st: Stats, align: int, guide: Guide | None,
            n_logprobs: int | None = None, history: History | None = None) -> Iterator[Chunk]:
    model = target.model
    sampler = Sampler(params)
    detok = _Detok(model.piece)
    t0 = time.perf_counter()
    drafter.begin(prompt, max_tokens)
    drafter.constrain(guide)
    drafter.sampling(sampler)
    drafter.recall(history)
    kept = target.sync(prompt, align)
    st.prompt_tokens, st.prompt_tokens_cached = len(prompt), kept
    rows = target.eval(prompt[kept:])
    _, tok = accept([], rows, sampler, len(prompt), guide.masks([]) if guide else None)
    lps = None if n_logprobs is None else token_logprobs(model, rows, [tok], n_logprobs)
    done = guide is not None and guide.settle([tok]) > 0 and guide.stopped
    t1 = time.perf_counter()
    st.t_prefill += t1 - t0
    context = prompt + [tok]  # every token so far; the last one is not in the target's cache yet
    new, flags = [tok], [False]
    st.stop = FINISH_LENGTH
    try:
        while True:
            # emit what the last step produced, up to an end-of-generation token
            new, flags, eog = cut_at_eog(model, new, flags)
            st.generated += len(new) + eog
            if new:
                yield Chunk(detok(new), new, flags, None if lps is None else lps[:len(new)])
            if eog or done:
                st.stop = FINISH_STOP
                break
            room = target.n_ctx - target.n_past - 1  # positions left after the pending token
            if st.generated >= max_tokens:
                break
            if room < 0:
                st.stop = FINISH_CONTEXT
                break
            # propose
            k_max = max(0, min(draft_max, max_tokens - st.generated - 1, room, target.n_batch - 1))
            ta = time.perf_counter()
            draft, d = _propose(drafter, context, k_max, guide)
            tb = time.perf_counter()
            # evaluate the pending token and the draft in one pass, accept, roll back the rest
            base = target.n_past
            if d:
                target.mark()  # hybrid/recurrent targets without snapshots: a checkpoint to roll back to
            masks = guide.masks(d) if guide else None
            rows = target.eval([tok] + d, _rows_wanted(d, masks, n_logprobs))
            n, nxt = accept(d, rows, sampler, len(context), masks)
            new, flags = d[:n] + [nxt], [True] * n + [False]
            used = None if n_logprobs is None else [r.copy() for r in rows[:n + 1]]  # a rollback may decode
            target.rollback(base + 1 + n)
            tc = time.perf_counter()
            if used is not None:
                lps = token_logprobs(model, used, new, n_logprobs)
            # observe
            if guide is not None:  # the grammar follows what was kept; a complete one ends the answer
                counted = guide.settle(new)
                done = guide.stopped
                new, flags = new[:counted], flags[:counted]
            drafter.observe(draft, n, new, tb - ta, tc - tb)
            st.record_step(draft.source, len(d), n, tb - ta, tc - tb)
            context.extend(new)
            tok = nxt
    except GeneratorExit:
        st.stop = FINISH_INTERRUPTED
        raise
    finally:
        st.t_generate += time.perf_counter() - t1
    if history is not None:
        history.add(prompt, answer_tokens(model, context[len(prompt):]))
    tail = detok.flush()
    if tail:
        yield Chunk(tail, [], [], None if n_logprobs is None else [])
