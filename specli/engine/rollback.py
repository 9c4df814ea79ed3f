"""The rollback policy: how a context drops the cached tokens after a position.

Rolling back is easy for attention (drop KV rows) and not for recurrent layers, whose state
folds every token in. Hybrid and recurrent models (Qwen3.5, LFM2, Nemotron-H, Mamba, RWKV, ...)
roll back with whichever mechanism this llama.cpp offers for the architecture:
- *snapshots*: ``n_rs_seq`` recurrent states kept per sequence, so the last decode can be cut
  back, once, by up to that many tokens and fewer than it decoded (``llama_n_rs_seq`` reads 0
  where unsupported; llama.cpp accepts larger cuts and silently keeps a wrong state, so the
  limits are checked here);
- *checkpoints*: the recurrent part of the state saved (``PARTIAL_ONLY``) at a ``mark()``,
  restored on a rollback, the attention rows cut, and the kept tokens decoded again;
- failing both, the kept prefix is decoded again from scratch (always correct, slow).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

from specli.engine.binding import L
from specli.tokens import common_prefix


class Rollback:
    """The rollback half of :class:`specli.engine.Context`: it keeps ``tokens`` (what the cache
    holds) true across rollbacks. The context provides ``handle`` and ``memory`` (llama.cpp's
    context and memory), ``seq``, ``n_seq``, ``listeners`` and ``eval``."""

    seq = 0  # the sequence this object's eval, rollback and mark act on
    tokens: list[int]

    def init_rollback(self, recurrent: bool) -> None:
        """Choose the mechanism (``recurrent``: the cache holds recurrent layers)."""
        # how a rollback works here: "kv" (attention only), "snapshots" or "checkpoints"
        self.n_rs_seq = int(L.llama_n_rs_seq(self.handle)) if recurrent else 0
        self.rollback_kind = "kv" if not recurrent else ("snapshots" if self.n_rs_seq else "checkpoints")
        self.reset_rollback()

    def reset_rollback(self) -> None:
        self._checkpoint: tuple[int, ctypes.Array] | None = None  # (position, recurrent state)
        self._cuttable = 0  # snapshots: how many tokens the next cut may drop (0 after a cut)
        self.n_restored = 0  # rollbacks that restored a checkpoint (or decoded the prefix again)
        self.n_replayed = 0  # tokens decoded again by those

    def decoded_block(self, n: int) -> None:
        """A decode of ``n`` tokens went in: with snapshots, a cut may drop fewer than it decoded."""
        self._cuttable = min(self.n_rs_seq, n - 1)

    def mark(self, across_decodes: bool = False) -> None:
        """Remember the state at the current position, so a rollback to here or later costs a
        restore and a replay of the tokens after it. Only where rollback needs checkpoints:
        snapshots cover a rollback within the last decode, so they need a mark only from a
        caller that rolls back across several decodes (a draft model drafting token by token)."""
        if self.rollback_kind == "kv" or (self.rollback_kind == "snapshots" and not across_decodes):
            return
        flags = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        size = int(L.llama_state_seq_get_size_ext(self.handle, self.seq, flags))
        reuse = self._checkpoint and len(self._checkpoint[1]) == size
        buf = self._checkpoint[1] if reuse else (ctypes.c_uint8 * size)()
        if int(L.llama_state_seq_get_data_ext(self.handle, buf, size, self.seq, flags)) != size:
            self._checkpoint = None
            return
        self._checkpoint = (len(self.tokens), buf)

    def rollback(self, n_keep: int) -> None:
        """Drop every cached token from position ``n_keep`` on."""
        if n_keep >= len(self.tokens):
            return
        replay = self._cut(n_keep)
        if replay:  # a recurrent state restored from a checkpoint: the kept tokens after it again
            self.eval(replay, "none")
        for lst in self.listeners:
            lst.truncated(self, n_keep)

    def _cut(self, n_keep: int) -> list[int]:
        """Drop the cache from ``n_keep`` on; the kept tokens to decode again (after a checkpoint)."""
        can_cut = self.rollback_kind == "kv" or (self.rollback_kind == "snapshots"
                                                  and len(self.tokens) - n_keep <= self._cuttable)
        if can_cut and L.llama_memory_seq_rm(self.memory, self.seq, n_keep, -1):
            del self.tokens[n_keep:]
            self._cuttable = 0
            return []
        return self._rewind(n_keep)

    def _rewind(self, n_keep: int) -> list[int]:
        """Rollback where the memory cannot drop a partial sequence: back to the checkpoint
        (or to nothing); the kept tokens after it, to decode again."""
        keep = self.tokens[:n_keep]
        pos = 0
        if self._checkpoint and self._checkpoint[0] <= n_keep:
            pos, buf = self._checkpoint
            restored = L.llama_state_seq_set_data_ext(self.handle, buf, len(buf), self.seq,
                                                      L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
            if not restored or not L.llama_memory_seq_rm(self.memory, self.seq, pos, -1):
                pos = 0
        if pos == 0:
            self._forget()
            self._checkpoint = None
        self._cuttable = 0
        del self.tokens[pos:]
        self.n_restored += 1
        replay = keep[pos:]
        self.n_replayed += len(replay)
        return replay

    def repair(self) -> None:
        """Drop cache entries past the tokens this object knows of (after an interrupt
        between llama_decode and the bookkeeping)."""
        self.eval(self._repair_cut(), "none")

    def _repair_cut(self) -> list[int]:
        if self.rollback_kind == "kv" and L.llama_memory_seq_rm(self.memory, self.seq, len(self.tokens), -1):
            return []
        return self._rewind(len(self.tokens))

    def _forget(self) -> None:
        """Empty this sequence's cache (the whole memory where it holds one sequence)."""
        if self.n_seq == 1:
            L.llama_memory_clear(self.memory, True)
        else:
            L.llama_memory_seq_rm(self.memory, self.seq, -1, -1)

    def clear(self) -> None:
        self._forget()
        self.tokens.clear()
        self._checkpoint = None
        for lst in self.listeners:
            lst.truncated(self, 0)

    def sync(self, tokens: Sequence[int], align: int = 1) -> int:
        """Make the cache hold a prefix of ``tokens`` that leaves at least the last token
        un-evaluated; return the number of cached tokens kept (the common prefix, cut down to
        a multiple of ``align``)."""
        n = common_prefix(self.tokens, tokens, len(tokens) - 1)
        n -= n % align
        self.rollback(n)
        return n
