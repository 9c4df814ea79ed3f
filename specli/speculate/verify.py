"""The verify rule: which drafted tokens the target keeps. Pure functions over numpy arrays.

Each position's token is the target's own choice, a function of the target's logits there and,
when sampling, of noise drawn from (seed, position) alone (:class:`Sampler`). A drafted token is
kept while it equals that choice; at the first one that does not, the target's choice is the
next token, and when all are kept, the choice after them (the bonus token). Greedy: the choice
is the argmax. Sampling: the Gumbel-max trick, the token x maximising p(x) / E(x) where E is
standard exponential noise over the vocabulary (log p - log E is log p plus Gumbel noise): it
is distributed exactly as p, and since the noise belongs to the position, not to a stream the
drafts consume, the text is the one plain sampling with the same seed gives, whatever drafted
it and however long its drafts were. A model drafter that drafts with the same noise from its
own distribution (:func:`specli.speculate.drafters.draft_top`) proposes the target's sample
wherever the two distributions agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """One row's log-probabilities at temperature 1 (float64, natural log): what the target's
    logprobs report and what a quant's answers are scored by."""
    z = np.asarray(logits, dtype=np.float64)
    lp = z - z.max()
    lp -= np.log(np.exp(lp).sum())
    return lp


def probs_from_logits(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The distribution plain sampling draws from: temperature, then top-k, then top-p.

    ``logits`` is one row (V,). Returns float64 probabilities (V,) summing to 1.
    """
    z = np.asarray(logits, dtype=np.float64) / params.temperature
    v = z.shape[-1]
    keep: np.ndarray | None = None
    if 0 < params.top_k < v:
        keep = np.argpartition(z, v - params.top_k)[v - params.top_k:]
    if params.top_p < 1.0:
        keep = _nucleus(z, keep, params.top_p)
    if keep is None:
        p = np.exp(z - z.max())
        return p / p.sum()
    zk = z[keep]
    pk = np.exp(zk - zk.max())
    out = np.zeros(v, dtype=np.float64)
    out[keep] = pk / pk.sum()
    return out


def _nucleus(z: np.ndarray, pool: np.ndarray | None, top_p: float) -> np.ndarray:
    """Smallest set of the most likely tokens whose mass, within ``pool`` (the top-k set, or
    the whole row when None), reaches ``top_p``. Looks at the best 1024 first: the nucleus is
    small in practice, and a full sort of a 150k vocabulary costs more than a token."""
    v = z.shape[-1]
    m = z.max()
    total = np.exp((z if pool is None else z[pool]) - m).sum()
    cand = pool if pool is not None else np.argpartition(z, v - min(v, 1024))[v - min(v, 1024):]
    while True:
        zc = z[cand]
        order = np.argsort(-zc, kind="stable")
        mass = np.cumsum(np.exp(zc[order] - m)) / total
        n = int(np.searchsorted(mass, top_p)) + 1
        if n <= len(order) or len(cand) == (v if pool is None else len(pool)):
            return cand[order[:min(n, len(order))]]
        cand = np.arange(v)


class Sampler:
    """The choices of one answer. The token at position ``pos`` of the sequence (prompt and
    output together) is the argmax of the logits (greedy), or the Gumbel-max sample
    argmax p(x) / E(x), where p is the distribution plain sampling draws from
    (:func:`probs_from_logits`, after a constraint's mask) and E the noise of that position:
    standard exponentials over the vocabulary from a generator seeded by (seed, pos) alone.
    Without a seed, the answer draws one. The noise of the positions a block looks at is kept
    until the answer moves past them (the drafter and the target read the same)."""

    def __init__(self, params: SamplingParams):
        self.params = params
        seed = params.seed if params.seed is not None else np.random.SeedSequence().entropy
        self.seed = seed % 2**64 if seed < 0 else seed  # any integer is a seed
        self._noise: dict[int, np.ndarray] = {}

    def noise(self, pos: int, n: int) -> np.ndarray:
        """The first ``n`` exponentials of position ``pos`` (a longer vocabulary's noise starts
        with a shorter one's: the generator fills the array in order)."""
        e = self._noise.get(pos)
        if e is None or len(e) < n:
            e = self._noise[pos] = np.random.default_rng([self.seed, pos]).standard_exponential(n)
        return e[:n]

    def done(self, pos: int) -> None:
        """The answer has chosen every token before ``pos``: their noise is not read again."""
        for k in [k for k in self._noise if k < pos]:
            del self._noise[k]

    def choose(self, p: np.ndarray, pos: int) -> int:
        """The token the noise of ``pos`` picks from the distribution ``p``."""
        return int(np.argmax(p / self.noise(pos, len(p))))

    def pick(self, row: np.ndarray, pos: int) -> int:
        """The token chosen at ``pos`` from one row of logits (already masked, if constrained)."""
        if self.params.greedy:
            return int(np.asarray(row).argmax())
        return self.choose(probs_from_logits(row, self.params), pos)


def prefix_accept(draft: Sequence[int], choices: Sequence[int]) -> tuple[int, int]:
    """``choices[i]`` is the target's token after the context plus ``draft[:i]`` (len(draft) + 1
    entries). Returns (number of drafted tokens accepted, the target's next token)."""
    n = 0  # read in order and no further than needed (the choices may be computed on demand)
    while n < len(draft) and draft[n] == choices[n]:
        n += 1
    return n, int(choices[n])


class _Choices:
    """The target's choice at each position of a block, computed when first read, in order:
    the rule stops at the first rejection, and a constraint's masks past it are never computed."""

    def __init__(self, rows: Sequence[np.ndarray], allowed: Sequence[np.ndarray] | None, sampler: Sampler,
                 pos: int):
        self.rows, self.allowed, self.sampler, self.pos, self.done = rows, allowed, sampler, pos, {}

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> int:
        if i not in self.done:
            row = self.rows[i]
            if row is None:  # no logits asked: the grammar allows one token here (logits_needed)
                self.done[i] = _only(self.allowed[i] if self.allowed is not None else None)
                return self.done[i]
            if self.allowed is not None:
                row = np.where(self.allowed[i], row, -np.inf)
            self.done[i] = self.sampler.pick(row, self.pos + i)
        return self.done[i]


def _only(allowed: np.ndarray | None) -> int:
    ids = np.flatnonzero(allowed) if allowed is not None else ()
    if len(ids) != 1:
        raise ValueError("a row without logits where the grammar allows more than one token")
    return int(ids[0])


def logits_needed(allowed: Sequence[np.ndarray]) -> list[bool]:
    """Which rows of a verify block need the target's logits (``allowed``: a constraint's mask
    at each row): all but those where the grammar allows exactly one token. That token is the
    choice whatever the logits: greedy, the argmax of the masked row; sampling, the masked
    distribution gives it probability 1 (after temperature, top-k and top-p alike), so the
    Gumbel-max choice is it too. Reading the masks computes them all (they are kept)."""
    return [int(np.count_nonzero(allowed[i])) != 1 for i in range(len(allowed))]


def accept(draft: Sequence[int], rows: Sequence[np.ndarray], sampler: Sampler, pos: int,
           allowed: Sequence[np.ndarray] | None = None) -> tuple[int, int]:
    """The acceptance decision for one verified block, the only place it is made (the first
    token after a prompt is the block with no draft). ``rows[i]``: the target's logits after
    the context plus ``draft[:i]`` (len(draft) + 1 rows); ``pos``: the position of the block's
    first token in the sequence (the context's length). The longest prefix of the draft that
    matches the target's own choices (:class:`Sampler`) is kept, then the target's choice.
    ``allowed[i]``: a constraint's boolean mask at that position (the tokens its grammar
    allows after the context plus ``draft[:i]``): the target's logits are masked first, so
    its choice is that of plain constrained decoding. A row may be None where ``allowed``
    admits one token only (:func:`logits_needed`): that token is the choice.
    Returns (number of drafted tokens accepted, the target's next token)."""
    sampler.done(pos)
    return prefix_accept(draft, _Choices(rows, allowed, sampler, pos))
