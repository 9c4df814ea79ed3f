"""The decoding loop: draft, verify in one batched target pass, keep the agreed prefix plus
one target token, roll the target's cache back past the rejected tail.

``generate`` is a generator of small :class:`Chunk` records (text, tokens, which tokens came
from the draft); a :class:`Stats` object fills in as it runs. Plain decoding is the same loop
with a drafter that never proposes anything.
"""

from __future__ import annotations

import codecs
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from .drafters import Draft, Drafter
from .engine import Context
from .errors import SpecliError
from .verify import SamplingParams, greedy_accept, probs_from_logits, sample, speculative_accept


@dataclass
class Chunk:
    text: str
    tokens: list[int]
    from_draft: list[bool]


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
    stop: str = ""
    accepted_by_source: dict = field(default_factory=dict)
    drafted_by_source: dict = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.t_generate if self.t_generate > 0 else 0.0

    @property
    def plain_steps(self) -> int:
        """Target passes that verified no drafted token (speculation off, or nothing to draft)."""
        return self.steps - self.spec_steps

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(tokens_per_s=self.tokens_per_s, acceptance=self.acceptance, mean_accepted=self.mean_accepted,
                 plain_steps=self.plain_steps)
        return d

    def summary(self) -> str:
        s = (f"{self.generated} tokens, {self.tokens_per_s:.1f} tok/s | mode {self.mode}"
             f" | prompt {self.prompt_tokens} tok in {self.t_prefill:.2f}s")
        if self.mode != "none":
            s += (f" | drafted {self.drafted}, accepted {self.accepted} ({100 * self.acceptance:.0f}%),"
                  f" mean accepted {self.mean_accepted:.2f}/step over {self.spec_steps} steps,"
                  f" {self.plain_steps} plain steps | draft {self.t_draft:.2f}s, verify {self.t_verify:.2f}s")
        return s + f" | stop: {self.stop}"


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
        raise SpecliError(f"the prompt is {n_prompt} tokens, longer than the context "
                          f"(--ctx {n_ctx}); use a larger --ctx or a shorter prompt")


def generate(target: Context, prompt: Sequence[int], drafter: Drafter, params: SamplingParams,
             max_tokens: int = 256, draft_max: int = 8,
             stats: Stats | None = None) -> Iterator[Chunk]:
    """Generate up to ``max_tokens`` after ``prompt``, speculating with ``drafter``.

    The target's cache is reused for the longest common prefix with what it already holds
    (a multi-turn chat re-evaluates only the new turn). ``draft_max`` caps the tokens asked
    of the drafter at each step (an adaptive drafter may take fewer).
    """
    model = target.model
    st = stats if stats is not None else Stats()
    st.mode = drafter.name
    prompt = list(prompt)
    if not prompt:
        raise SpecliError("the prompt is empty")
    check_prompt_fits(len(prompt), target.n_ctx)
    rng = np.random.default_rng(params.seed)
    greedy = params.greedy
    detok = _Detok(model.piece)
    choose = (lambda row: int(row.argmax())) if greedy else (lambda row: sample(probs_from_logits(row, params), rng))

    t0 = time.perf_counter()
    kept = target.sync(prompt)
    st.prompt_tokens, st.prompt_tokens_cached = len(prompt), kept
    tok = choose(target.eval(prompt[kept:])[0])
    t1 = time.perf_counter()
    st.t_prefill += t1 - t0
    context = prompt + [tok]
    st.generated += 1
    st.stop = "max_tokens"
    if model.is_eog(tok):
        st.stop = "eog"
        st.t_generate += time.perf_counter() - t1
        return
    yield Chunk(detok([tok]), [tok], [False])

    try:
        while st.generated < max_tokens:
            room = target.n_ctx - target.n_past - 1  # positions left after the pending token
            if room < 0:
                st.stop = "context"
                break
            k_max = max(0, min(draft_max, max_tokens - st.generated - 1, room))
            ta = time.perf_counter()
            draft = drafter.propose(context, k_max) if k_max > 0 else Draft([], drafter.name)
            d = draft.tokens[:k_max]
            tb = time.perf_counter()
            base = target.n_past
            rows = target.eval([tok] + d, "all" if d else "last")
            if greedy:
                n, nxt = greedy_accept(d, [int(r.argmax()) for r in rows])
            else:
                p = np.stack([probs_from_logits(r, params) for r in rows])
                q = None if draft.q is None else draft.q[:len(d)]
                n, nxt = speculative_accept(d, p, q, rng)
            target.rollback(base + 1 + n)
            tc = time.perf_counter()
            observe = getattr(drafter, "observe", None)
            if observe is not None:
                observe(draft, n, d[:n] + [nxt], tb - ta, tc - tb)
            st.t_draft += tb - ta
            st.t_verify += tc - tb
            st.steps += 1
            if d:
                st.spec_steps += 1
                st.drafted += len(d)
                st.accepted += n
                src = draft.source
                st.drafted_by_source[src] = st.drafted_by_source.get(src, 0) + len(d)
                st.accepted_by_source[src] = st.accepted_by_source.get(src, 0) + n
            new = d[:n] + [nxt]
            flags = [True] * n + [False]
            stop_eog = False
            for i, t in enumerate(new):
                if model.is_eog(t):
                    new, flags, stop_eog = new[:i], flags[:i], True
                    break
            st.generated += len(new) + (1 if stop_eog else 0)
            context.extend(new)
            tok = nxt
            if new:
                yield Chunk(detok(new), new, flags)
            if stop_eog:
                st.stop = "eog"
                break
    except GeneratorExit:
        st.stop = "interrupted"
        raise
    finally:
        st.t_generate += time.perf_counter() - t1
    tail = detok.flush()
    if tail:
        yield Chunk(tail, [], [])
