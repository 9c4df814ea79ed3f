"""Self-speculation through the target's own multi-token-prediction (MTP / NextN) layers:
no second model, almost no extra memory.

The call sequence is llama.cpp's ``draft-mtp`` (``common/speculative.cpp``): the model is
loaded with its MTP layers; a second context of type MTP over the same model reads the
target context's state; the target exports a hidden row for every token it decodes, and the
MTP context is fed (token at p, hidden row of p - 1) right after every target decode, while
those rows are valid (:class:`~specli.engine.DecodeListener`). To draft, the MTP head runs on
(last token, its predecessor's hidden row), then on its own prediction and its own hidden
row, and so on; the rows drafted are dropped again before the target verifies.

The MTP layers may also come from a separate MTP-only GGUF (a *sidecar*: the MTP block of a
target whose main file was converted without it), as llama.cpp's ``--spec-draft-model SIDECAR
--spec-type draft-mtp`` does: the MTP context is then made over the sidecar's model, still
reading the target context's state (``ctx_other``), and fed the target's hidden rows the same way.

llama.cpp aborts the process on misuse (an MTP context on a model loaded without its MTP
layers, say), so every precondition is checked here first.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Sequence

import numpy as np

from specli.engine import Context, ContextConfig, DecodeListener, L, Model
from specli.errors import SpecliError
from specli.speculate.drafters import MTP, Draft, Drafter, greedy_drafts
from specli.speculate.settings import DEFAULTS

try:
    from llama_cpp import llama_cpp_ext as LX
except ImportError:  # pragma: no cover - a llama-cpp-python without the MTP staging API
    LX = None


def mtp_available() -> bool:
    """Does this llama-cpp-python expose what MTP drafting needs?"""
    return LX is not None and all(hasattr(LX, f) for f in (
        "llama_set_embeddings_nextn", "llama_get_embeddings_nextn", "llama_get_embeddings_nextn_ith"))


def check_sidecar(target: Model, head: Model) -> None:
    """An MTP-only sidecar drafts for ``target`` only if it reads the target's hidden rows and
    speaks its vocabulary (llama.cpp asserts the first: "MTP input row width must match the
    target h_nextn width")."""
    if head.n_embd != target.n_embd:
        raise SpecliError(f"{head.name}: an MTP head for hidden size {head.n_embd}, the target's is {target.n_embd} "
                          "(a sidecar for another model)")
    if head.n_vocab != target.n_vocab:
        raise SpecliError(f"{head.name}: an MTP head with {head.n_vocab} tokens, the target has {target.n_vocab} "
                          "(a sidecar for another model)")


class MTPDrafter(Drafter, DecodeListener):
    """Greedy drafts from the target's MTP head, stopping (like a draft model) when its top
    probability falls below ``p_min`` or when ``keep_going`` says the next token does not pay."""

    name = "mtp"
    source = MTP
    lag = 0  # the head's position of the last token: the target's (pos0), or one before (EAGLE-3's pairs)

    def __init__(self, target: Context, cfg: ContextConfig, p_min: float = DEFAULTS.draft_p_min,
                 head: Model | None = None):
        model = head or target.model
        if not mtp_available():
            raise SpecliError("this llama-cpp-python has no MTP support (llama_cpp_ext nextn functions)")
        if model.n_mtp_layers <= 0:
            raise SpecliError(f"{model.name} has no MTP layers loaded (converted without its MTP block?)")
        if head is not None:
            check_sidecar(target.model, head)
        self.target = target
        self.p_min = p_min
        self.n_embd = model.n_embd
        self.ctx = Context(model, replace(cfg, n_rs_seq=0), ctx_type=L.LLAMA_CONTEXT_TYPE_MTP, other=target)
        LX.llama_set_embeddings_nextn(target._ctx, True, False)  # a hidden row for every token decoded
        LX.llama_set_embeddings_nextn(self.ctx._ctx, True, True)  # rows only where logits are asked
        self._block: tuple[int, np.ndarray] | None = None  # (first position, hidden rows) of the last decode
        target.listeners.append(self)
        if target.tokens:  # the target already holds tokens the MTP context never saw
            saved = list(target.tokens)
            target.clear()
            target.eval(saved, "none")

    # -- fed by the target ----------------------------------------------------------------
    def hidden(self, pos: int) -> np.ndarray:
        """The target's hidden row after the token at ``pos`` (zeros before the first token,
        or where it is no longer known: drafts are then worse, never wrong)."""
        if self._block is not None:
            p0, rows = self._block
            if p0 <= pos < p0 + len(rows):
                return rows[pos - p0]
        return np.zeros(self.n_embd, np.float32)

    def decoded(self, ctx: Context, tokens: Sequence[int], pos0: int) -> None:
        n = len(tokens)
        mine = self.ctx.tokens
        if pos0 + n <= len(mine) and mine[pos0:pos0 + n] == list(tokens):
            return  # a replay of tokens already fed (a checkpoint rollback): same rows
        ptr = LX.llama_get_embeddings_nextn(ctx._ctx)
        if not ptr:
            self._block = None
            return
        rows = np.ctypeslib.as_array(ptr, shape=(n, self.n_embd)).copy()
        inputs = np.concatenate([self.hidden(pos0 - 1)[None], rows[:-1]])
        self.ctx.rollback(pos0)
        if self.ctx.n_past == pos0:
            self.ctx.eval(tokens, "none", embd=inputs)
        self._block = (pos0, rows)

    def truncated(self, ctx: Context, n_keep: int) -> None:
        self.ctx.rollback(n_keep)

    # -- drafting -------------------------------------------------------------------------
    def propose(self, context: Sequence[int], max_len: int,
                keep_going: Callable[[int, float, list[int]], bool] | None = None, p_min: float | None = None) -> Draft:
        p_min = self.p_min if p_min is None else p_min
        pos0 = len(context) - 1  # the last token is not in the target's cache yet
        at = pos0 - self.lag  # where the head takes the last token
        ctx = self.ctx
        max_len = min(max_len, ctx.n_ctx - pos0 - 1)
        if max_len <= 0 or at < 0 or self.target.n_past != pos0 or ctx.n_past != at:
            return Draft([], self.source)
        def step(tok: int, h: np.ndarray | None = None) -> np.ndarray:
            """One MTP pass: the token with the hidden row before it (the MTP head's own last one)."""
            if h is None:
                h = np.ctypeslib.as_array(LX.llama_get_embeddings_nextn_ith(ctx._ctx, 0), shape=(self.n_embd,)).copy()
            return ctx.eval([tok], "last", embd=h[None])[0]

        try:
            first = step(int(context[-1]), self.hidden(pos0 - 1))
            toks, conf, passes = greedy_drafts(first, step, max_len, self.target.model.is_eog, p_min, keep_going)
        finally:
            ctx.rollback(at)  # the verify pass feeds the real rows for these positions
        return Draft(toks, self.source, conf, passes=passes)

    def behind(self, context: Sequence[int]) -> int:
        """Nothing to catch up on: the target's own passes feed the MTP layers."""
        return 0

    def token_cost(self, reps: int = 4) -> float:
        """Seconds per MTP forward pass, measured here (the best of ``reps``)."""
        pos0 = self.ctx.n_past
        if pos0 + reps + 1 > self.ctx.n_ctx:
            return 0.0
        h = np.zeros((1, self.n_embd), np.float32)
        best = float("inf")
        tok = max(self.target.model.bos, 0)
        self.ctx.eval([tok], "last", embd=h)  # warm-up: the first pass of a shape allocates its graph
        for _ in range(reps):
            t = time.perf_counter()
            self.ctx.eval([tok], "last", embd=h)
            best = min(best, time.perf_counter() - t)
        self.ctx.rollback(pos0)
        return best

    def close(self) -> None:
        if self in self.target.listeners:
            self.target.listeners.remove(self)
        self.ctx.close()
