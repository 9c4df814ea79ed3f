"""The verify rule: which drafted tokens the target keeps. Pure functions over numpy arrays.

Greedy: accept while the target's argmax equals the drafted token, then emit the target's own
token. Sampling: the rejection-sampling rule of Leviathan et al. (2022) and Chen et al. (2023):
accept drafted token x with probability min(1, p(x)/q(x)); on the first rejection sample from
normalise(max(0, p - q)); when every drafted token is accepted, sample the bonus token from p.
A deterministic drafter (greedy draft model, prompt lookup) has q = a point mass on its token.
The tokens produced this way are distributed exactly as plain sampling from p.
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


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one index from a probability vector."""
    c = np.cumsum(p)
    i = int(np.searchsorted(c, rng.random() * c[-1], side="right"))
    return min(i, len(p) - 1)


def greedy_accept(draft: Sequence[int], target_argmax: Sequence[int]) -> tuple[int, int]:
    """``target_argmax[i]`` is the target's token after the context plus ``draft[:i]``
    (len(draft) + 1 entries). Returns (number of drafted tokens accepted, the target's next token)."""
    n = 0  # read in order and no further than needed (the rows may be computed on demand)
    while n < len(draft) and draft[n] == target_argmax[n]:
        n += 1
    return n, int(target_argmax[n])


def speculative_accept(draft: Sequence[int], p: np.ndarray, q: np.ndarray | None,
                       rng: np.random.Generator) -> tuple[int, int]:
    """Rejection sampling over one verified block.

    ``p``: (k+1, V) target probabilities after context + draft[:i] (rows read in order, as
    far as needed); ``q``: (k, V) draft
    probabilities the tokens were drawn from, or None for a deterministic drafter (point mass).
    Returns (number of drafted tokens accepted, the next token: a correction or the bonus token).
    """
    for i, x in enumerate(draft):
        px = p[i][x]
        qx = 1.0 if q is None else q[i][x]
        if qx > 0 and rng.random() * qx < px:  # accept with probability min(1, px/qx)
            continue
        if q is None:
            residual = p[i].copy()
            residual[x] = 0.0
        else:
            residual = np.maximum(p[i] - q[i], 0.0)
        if residual.sum() <= 0.0:  # p == q up to rounding: rejection had probability ~0
            residual = p[i]
        return i, sample(residual, rng)
    return len(draft), sample(p[len(draft)], rng)


class _Rows:
    """``f(rows[i], allowed[i])`` for each position, computed when first read, in order: the
    rule stops at the first rejection, and a constraint's masks past it are never computed."""

    def __init__(self, rows: Sequence[np.ndarray], allowed: Sequence[np.ndarray] | None, f):
        self.rows, self.allowed, self.f, self.done = rows, allowed, f, {}

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        if i not in self.done:
            row = self.rows[i]
            if self.allowed is not None:
                row = np.where(self.allowed[i], row, -np.inf)
            self.done[i] = self.f(row)
        return self.done[i]


def accept(draft: Sequence[int], rows: Sequence[np.ndarray], params: SamplingParams,
           rng: np.random.Generator, allowed: Sequence[np.ndarray] | None = None) -> tuple[int, int]:
    """The acceptance decision for one verified block, the only place it is made (the first
    token after a prompt is the block with no draft). ``rows[i]``: the target's logits after
    the context plus ``draft[:i]`` (len(draft) + 1 rows). Greedy: the longest prefix that
    matches the target's argmax; sampling: rejection sampling over the distribution plain
    sampling would draw from (drafts are deterministic: a point mass per token).
    ``allowed[i]``: a constraint's boolean mask at that position (the tokens its grammar
    allows after the context plus ``draft[:i]``): the target's logits are masked first, so
    its argmax, and the distribution sampled from, are those of plain constrained decoding
    (a drafted token is one the grammar allows, so its point mass is masked already).
    Returns (number of drafted tokens accepted, the target's next token)."""
    if params.greedy:
        return greedy_accept(draft, _Rows(rows, allowed, lambda r: int(r.argmax())))
    return speculative_accept(draft, _Rows(rows, allowed, lambda r: probs_from_logits(r, params)), None, rng)
