"""Self-speculation through the target's own multi-token-prediction (MTP / NextN) layers:
no second model, almost no extra memory.

The call sequence is llama.cpp's ``draft-mtp`` (``common/speculative.cpp``): the model is
loaded with its MTP layers; a second context of type MTP over the same model reads the
target context's state; the target exports a hidden row for every token it decodes, and the
MTP context is fed (token at p, hidden row of p - 1) right after every target decode, while
those rows are valid (:class:`~specli.engine.DecodeListener`). To draft, the MTP head runs on
(last token, its predecessor's hidden row), then on its own prediction and its own hidden
row, and so on; the rows drafted are dropped again before the target verifies.

The MTP context and the hidden rows come from :class:`~specli.engine.Context`
(``mtp_context``, ``hidden_rows``, ``hidden_row``), which checks llama.cpp's preconditions
first (it aborts the process on misuse).

The MTP layers may also come from a separate MTP-only GGUF (a *sidecar*: the MTP block of a
target whose main file was converted without it), as llama.cpp's ``--spec-draft-model SIDECAR
--spec-type draft-mtp`` does: the MTP context is then made over the sidecar's model
(``mtp_context(cfg, head=sidecar)``), still reading the target context's state, and fed the
target's hidden rows the same way.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from specli.engine import Context, DecodeListener
from specli.hardware import calibrate
from specli.speculate.contract import FedByDecodes, KeepGoing
from specli.speculate.drafters import PaidDrafter, draft_top, greedy_drafts
from specli.speculate.settings import DEFAULTS
from specli.speculate.source import MTP, Draft


class FedDrafter(PaidDrafter, DecodeListener, FedByDecodes):
    """A drafter with a context of its own fed by the target's passes (``ctx``, listening to
    ``target``; :class:`~specli.speculate.contract.FedByDecodes`): MTP layers, an EAGLE-3 or a
    DFlash head. Nothing to catch up on before drafting; its cost is a pass it measures
    (``pass_time``), cached under ``cost_key``."""

    target: Context
    ctx: Context
    cost_key: str

    def behind(self, context: Sequence[int]) -> int:
        """Nothing to catch up on: the target's own passes feed it."""
        return 0

    def token_cost(self) -> float:
        return calibrate.cached_cost(self.cost_key, self.target, self.pass_time)

    def pass_time(self, reps: int = 4) -> float:
        raise NotImplementedError

    def repair(self) -> None:
        self.ctx.repair()

    def close(self) -> None:
        self.target.unlisten(self)
        self.ctx.close()


class MTPDrafter(FedDrafter):
    """Greedy drafts from the target's MTP head, stopping (like a draft model) when its top
    probability falls below ``p_min`` or when ``keep_going`` says the next token does not pay.
    ``ctx``: the MTP context over the target (:meth:`Context.mtp_context`); the drafter must
    hear every decode of the target (``target.listen(drafter, replay=True)``), which the
    session wires."""

    name = "mtp"
    source = MTP
    lag = 0  # the head's position of the last token: the target's (pos0), or one before (EAGLE-3's pairs)

    def __init__(self, target: Context, ctx: Context, p_min: float = DEFAULTS.draft_p_min):
        self.target = target
        self.ctx = ctx
        self.p_min = p_min
        self.n_embd = target.model.n_embd
        # its cost is cached per model: the target's own layers, or a sidecar's
        self.cost_key = "mtp" if ctx.model is target.model else "mtp-head"
        self._block: tuple[int, np.ndarray] | None = None  # (first position, hidden rows) of the last decode

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
        rows = ctx.hidden_rows(n)
        if rows is None:
            self._block = None
            return
        inputs = np.concatenate([self.hidden(pos0 - 1)[None], rows[:-1]])
        self.ctx.rollback(pos0)
        if self.ctx.n_past == pos0:
            self.ctx.eval(tokens, "none", embd=inputs)
        self._block = (pos0, rows)

    def truncated(self, ctx: Context, n_keep: int) -> None:
        self.ctx.rollback(n_keep)

    # -- drafting -------------------------------------------------------------------------
    def propose(self, context: Sequence[int], max_len: int,
                keep_going: KeepGoing | None = None, p_min: float | None = None) -> Draft:
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
                h = ctx.hidden_row(0)
            return ctx.eval([tok], "last", embd=h[None])[0]

        try:
            first = step(int(context[-1]), self.hidden(pos0 - 1))
            toks, conf, passes = greedy_drafts(first, step, max_len, self.target.model.is_eog, p_min, keep_going,
                                               draft_top(self.sampler, len(context)), self.guide)
        finally:
            ctx.rollback(at)  # the verify pass feeds the real rows for these positions
        return Draft(toks, self.source, conf, passes=passes)

    def pass_time(self, reps: int = 4) -> float:
        """Seconds per MTP forward pass, measured now (the best of ``reps``)."""
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
