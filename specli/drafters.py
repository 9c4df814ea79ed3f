"""Drafters propose the next few tokens; the target verifies them. One small interface:

``propose(context, max_len)`` returns a :class:`Draft` for the tokens after ``context`` (every
token so far, prompt and output); ``name`` says which kind of drafter made it. A drafter keeps
its own state (a KV cache, an n-gram index) apart from the verify loop and brings it in line
with the context it is handed, so the loop never has to tell it what was accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

from .engine import Context, ContextConfig, Model
from .lookup import NgramIndex


@dataclass
class Draft:
    tokens: list[int]
    source: str  # "model", "lookup" or "none"
    # per drafted token: the drafter's confidence (draft model: its top probability;
    # lookup: the matched n-gram length), for the adaptive controller and the stats
    confidence: list[float] = field(default_factory=list)
    q: np.ndarray | None = None  # (k, V) draft probabilities; None: a point mass per token


class Drafter(Protocol):
    name: str

    def propose(self, context: Sequence[int], max_len: int) -> Draft: ...

    def close(self) -> None: ...


class NoDrafter:
    """Plain decoding through the same loop: the baseline."""

    name = "none"

    def propose(self, context: Sequence[int], max_len: int) -> Draft:
        return Draft([], "none")

    def close(self) -> None:
        pass


class LookupDrafter:
    """Prompt lookup: copy what followed the latest earlier occurrence of the context's last
    n tokens, longest n first."""

    name = "lookup"

    def __init__(self, n_min: int = 1, n_max: int = 4, min_match: int = 2):
        self.index = NgramIndex(n_min, n_max)
        self.min_match = min_match

    def propose(self, context: Sequence[int], max_len: int) -> Draft:
        idx = self.index
        if len(idx.tokens) > len(context) or idx.tokens != list(context[:len(idx.tokens)]):
            idx.truncate(0)
        idx.extend(context[len(idx.tokens):])
        toks, n = idx.find(max_len)
        if n < self.min_match or max_len <= 0:
            return Draft([], "lookup")
        return Draft(toks, "lookup", [float(n)] * len(toks))

    def close(self) -> None:
        pass


class ModelDrafter:
    """A smaller model with the same tokenizer drafts greedily, stopping early when its top
    probability falls below ``p_min`` (it is then unlikely to be accepted)."""

    name = "model"

    def __init__(self, model: Model, cfg: ContextConfig, p_min: float = 0.5):
        self.model = model
        self.ctx = Context(model, cfg)
        self.p_min = p_min

    def propose(self, context: Sequence[int], max_len: int) -> Draft:
        if max_len <= 0:
            return Draft([], "model")
        ctx = self.ctx
        if len(context) + max_len > ctx.n_ctx:
            max_len = ctx.n_ctx - len(context)
            if max_len <= 0:
                return Draft([], "model")
        kept = ctx.sync(context)
        row = ctx.eval(list(context[kept:]))[0]
        toks: list[int] = []
        conf: list[float] = []
        while True:
            tok = int(row.argmax())
            z = row - row[tok]
            p_top = 1.0 / float(np.exp(z, dtype=np.float32).sum())
            if toks and p_top < self.p_min:
                break
            toks.append(tok)
            conf.append(p_top)
            if len(toks) >= max_len or self.model.is_eog(tok):
                break
            row = ctx.eval([tok])[0]
        return Draft(toks, "model", conf)

    def close(self) -> None:
        self.ctx.close()
