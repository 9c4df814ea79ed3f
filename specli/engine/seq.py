"""One sequence (a slot) of a multi-sequence context, decoded in batches with the others."""

from __future__ import annotations

from collections.abc import Callable

from specli.engine.context import Context, DecodeListener
from specli.errors import Interrupted, SpecliError


class SeqContext(Context):
    """One sequence (a slot) of a multi-sequence :class:`Context`, with the same API (eval,
    mark, rollback, sync, clear) on its own sequence id. Its blocks are decoded by
    ``batcher`` (:class:`specli.speculate.batch.Batcher`), which puts those of every active
    sequence into one llama_decode; every llama.cpp call on the shared context holds
    ``batcher.lock`` (never while it waits for a batch). ``n_batch``: the most tokens one step
    decodes for it (a prompt goes in chunks of that size, between the other sequences' steps)."""

    def __init__(self, parent: Context, seq: int, batcher, n_batch: int):
        self.parent, self.batcher, self.seq = parent, batcher, seq
        self.model, self._ctx, self._mem = parent.model, parent.handle, parent.memory
        self.n_ctx, self.n_seq, self.n_batch, self.threads = parent.n_ctx, parent.n_seq, n_batch, parent.threads
        self.n_rs_seq, self.rollback_kind = parent.n_rs_seq, parent.rollback_kind
        self._batch = self._ebatch = None
        self.tokens = []
        self.listeners = []
        self.n_decode_calls = self.n_rows = self.rows_with_logits = 0
        self.reset_rollback()
        self.interrupt: Callable[[], bool] | None = None  # True: stop the prompt at its next chunk

    def close(self) -> None:  # the parent owns the llama context
        pass

    def between_chunks(self) -> None:
        if self.interrupt is not None and self.interrupt():
            raise Interrupted()

    def _decode_chunk(self, b, chunk, pos0, want, embd):
        if embd is not None:
            raise SpecliError("a sequence of a shared context takes no embedding rows")
        self.n_decode_calls += 1
        self.n_rows += len(chunk)
        return self.batcher.submit(self.seq, chunk, pos0, want)

    def mark(self, across_decodes: bool = False) -> None:
        with self.batcher.lock:
            super().mark(across_decodes)

    def _cut(self, n_keep: int) -> list[int]:
        with self.batcher.lock:
            return super()._cut(n_keep)

    def _repair_cut(self) -> list[int]:
        with self.batcher.lock:
            return super()._repair_cut()

    def _forget(self) -> None:
        with self.batcher.lock:
            super()._forget()

    def listen(self, listener: DecodeListener, replay: bool = False) -> None:
        raise SpecliError("a sequence of a shared context feeds no listener (MTP and EAGLE-3 draft one sequence)")
