"""One KV cache on a model: the operations speculative decoding needs.

``Context`` evaluates a block of tokens asking for logits only at chosen positions, reads
those logits without copying the whole buffer, and rolls the cache back to a shorter prefix
(the policy for that: :mod:`specli.engine.rollback`). Its :attr:`Context.handle` is the
``llama_context`` pointer for the few llama.cpp calls specli's drafting heads make themselves.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from specli.engine.binding import L, Model
from specli.engine.mtp_rows import HiddenRows, check_mtp_head
from specli.engine.rollback import Rollback
from specli.errors import ContextFull, SpecliError


@dataclass
class ContextConfig:
    n_ctx: int  # tokens (0: the model's own); the session's default is settings.N_CTX
    n_batch: int = 512
    n_threads: int | None = None
    # exact numerics (tests): f32 KV cache and no flash attention, whose f16 accumulation
    # moves logits by ~1e-3 between batch shapes; with both, batch shapes move them < 1e-5
    f32_kv: bool = False
    # hybrid/recurrent models: recurrent-state snapshots kept for rollback (the most tokens
    # one rollback may drop; 0: checkpoints only)
    n_rs_seq: int = 0
    # sequences (slots) in the context, each of n_ctx tokens (llama.cpp's n_seq_max; they
    # share one unified cache of n_ctx * n_seq cells); their views are SeqContext
    n_seq: int = 1


class DecodeListener:
    """Told about every decode and every truncation of a context (the MTP drafter feeds its
    own context from the target's hidden states this way)."""

    def decoded(self, ctx: Context, tokens: Sequence[int], pos0: int) -> None: ...

    def truncated(self, ctx: Context, n_keep: int) -> None: ...


def _context_params(cfg: ContextConfig, n_ctx: int, n_seq: int, threads: int):
    cp = L.llama_context_default_params()
    cp.n_ctx = n_ctx * n_seq
    cp.n_batch = min(cfg.n_batch, n_ctx * n_seq)
    cp.n_ubatch = min(cfg.n_batch, n_ctx * n_seq)
    cp.n_seq_max = n_seq
    # the sequences share one cache of n_ctx * n_seq cells (each kept to n_ctx tokens here):
    # a batch whose sequences hold different numbers of tokens is then one pass; with a
    # cache per sequence llama.cpp splits it into passes of as many tokens per sequence
    cp.kv_unified = True
    cp.n_threads = threads
    cp.n_threads_batch = threads
    cp.no_perf = True
    if cfg.f32_kv:
        cp.type_k = L.GGML_TYPE_F32
        cp.type_v = L.GGML_TYPE_F32
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    return cp


def _wanted(logits: str, n: int, last_chunk: bool) -> list[bool]:
    """The logits flags of one chunk of :meth:`Context.eval` asked for by name."""
    return [logits == "all" or (logits == "last" and last_chunk and i == n - 1) for i in range(n)]


class Context(Rollback, HiddenRows):
    """One KV cache (sequence 0) on a model. ``tokens`` mirrors what the cache holds.
    ``ctx_type``/``other``: an MTP context over the same model, reading ``other``'s state.
    With ``cfg.n_seq`` > 1 the cache holds that many sequences of ``n_ctx`` tokens each; this
    object speaks for sequence 0, :meth:`decode_seqs` decodes several in one batch and
    :class:`specli.engine.SeqContext` is one sequence's view."""

    def __init__(self, model: Model, cfg: ContextConfig, ctx_type: int = 0, other: Context | None = None):
        self.model = model
        n_ctx = cfg.n_ctx if cfg.n_ctx > 0 else model.n_ctx_train
        n_seq = max(1, cfg.n_seq)
        threads = cfg.n_threads or max(1, os.cpu_count() or 1)
        cp = _context_params(cfg, n_ctx, n_seq, threads)
        recurrent = model.recurrent and ctx_type == L.LLAMA_CONTEXT_TYPE_DEFAULT  # an MTP context is attention
        cp.n_rs_seq = cfg.n_rs_seq if recurrent else 0
        cp.ctx_type = ctx_type
        if other is not None:
            cp.ctx_other = other.handle
        self._ctx = L.llama_init_from_model(model.handle, cp)
        if not self._ctx:
            raise SpecliError(f"llama.cpp could not create a context of {n_ctx} tokens for {model.path} "
                              "(out of memory? try a smaller --ctx)")
        # llama.cpp rounds the context up (to a multiple of 256): the size asked for stays the limit
        self.n_ctx = min(int(L.llama_n_ctx_seq(self._ctx)), n_ctx)
        self.n_seq = n_seq
        self.n_rows = 0  # tokens decoded, every sequence together
        self.n_batch = int(cp.n_batch)
        self.threads = threads
        self._mem = L.llama_get_memory(self._ctx)
        self._batch = L.llama_batch_init(self.n_batch, 0, 1)
        self.tokens: list[int] = []
        self.n_decode_calls = 0
        self.rows_with_logits = 0  # rows whose logits were asked for (the LM head ran on them)
        self.listeners: list[DecodeListener] = []
        self._ebatch = None
        self.init_rollback(recurrent)

    @property
    def handle(self):
        """The ``llama_context`` pointer (None once closed), for llama.cpp calls the engine does
        not wrap; valid while this object lives and is not closed."""
        return self._ctx

    @property
    def memory(self):
        """The ``llama_memory`` pointer of :attr:`handle` (its KV cache and recurrent states)."""
        return self._mem

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            L.llama_batch_free(self._batch)
            if self._ebatch is not None:
                self._ebatch.token = ctypes.POINTER(L.llama_token)()
                L.llama_batch_free(self._ebatch)
            L.llama_free(self._ctx)
            self._ctx = None

    def __del__(self):  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def eval(self, tokens: Sequence[int], logits: str | Sequence[bool] = "last",
             embd: np.ndarray | None = None) -> list[np.ndarray | None]:
        """Append ``tokens`` to the cache. ``logits``: "last" (one row, for the last token),
        "all" (a row per token), "none", or a flag per token (a block of at most n_batch
        tokens: a row per token, None where its flag is off, so llama.cpp's last layer and
        LM head skip it). Rows are views into llama.cpp's buffer, valid until the next call;
        copy what must outlive it. ``embd``: an (n, n_embd) row per token passed along with it
        (an MTP context's input: the target's hidden state)."""
        n = len(tokens)
        if n == 0:
            return []
        if not self._ctx:
            raise RuntimeError("this context was closed")  # llama.cpp would crash on the freed pointer
        if self.n_past + n > self.n_ctx:
            raise ContextFull(self.n_past + n, self.n_ctx)
        flags = None if isinstance(logits, str) else [bool(f) for f in logits]
        if flags is not None and len(flags) != n:
            raise ValueError(f"{len(flags)} logits flags for {n} tokens")
        if (logits == "all" or flags is not None) and n > self.n_batch:
            raise ValueError("logits for every token need a block no larger than n_batch")
        b = self._batch if embd is None else self._embd_batch()
        start = 0
        while start < n:
            if start:
                self.between_chunks()
            chunk = tokens[start:start + self.n_batch]
            pos0 = self.n_past
            want = flags if flags is not None else _wanted(logits, len(chunk), start + len(chunk) == n)
            try:
                out = self._decode_chunk(b, chunk, pos0, want,
                                         None if embd is None else embd[start:start + len(chunk)])
            except SpecliError:
                self.rollback(pos0)
                raise
            self.rows_with_logits += sum(want)
            self.tokens.extend(int(t) for t in chunk)
            self.decoded_block(len(chunk))
            start += len(chunk)
            for lst in self.listeners:
                lst.decoded(self, chunk, pos0)
        if flags is not None:
            rows = iter(out)
            return [next(rows) if f else None for f in flags]
        if logits == "none":
            return []
        return out if logits == "all" else out[-1:]

    def between_chunks(self) -> None:
        """Between two chunks of one eval (a long prompt): a sequence of a shared context
        stops here when its request is gone (:class:`specli.engine.SeqContext`)."""

    def _decode_chunk(self, b, chunk: Sequence[int], pos0: int, want: Sequence[bool],
                      embd: np.ndarray | None) -> list[np.ndarray]:
        """One llama_decode of ``chunk`` at ``pos0`` in this sequence: the logits rows asked for."""
        if embd is not None:
            rows = np.ctypeslib.as_array(b.embd, shape=(self.n_batch, self.model.n_embd))
            rows[:len(chunk)] = embd
        return self.decode_seqs([(self.seq, chunk, pos0, want)], b)[0]

    def decode_seqs(self, items: Sequence[tuple[int, Sequence[int], int, Sequence[bool]]], b=None
                    ) -> list[list[np.ndarray]]:
        """ONE llama_decode over several sequences. ``items``: (sequence, tokens, first position,
        logits wanted per token), their tokens together no more than n_batch. Returns each
        item's logits rows: views into llama.cpp's buffer, valid until the next decode."""
        b = self._batch if b is None else b
        i = sum(len(it[1]) for it in items)
        if i > self.n_batch:
            raise ValueError(f"a batch of {i} tokens is more than n_batch ({self.n_batch})")
        i = 0
        for seq, toks, pos0, want in items:
            for j, t in enumerate(toks):
                b.token[i] = t
                b.pos[i] = pos0 + j
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = seq
                b.logits[i] = bool(want[j])
                i += 1
        b.n_tokens = i
        rc = L.llama_decode(self._ctx, b)
        self.n_decode_calls += 1
        self.n_rows += i
        if rc != 0:
            raise SpecliError(f"llama_decode failed with code {rc} at position {items[0][2]}"
                              + (" (KV cache full)" if rc == 1 else ""))
        nv = self.model.n_vocab
        out, i = [], 0
        for _, toks, _, want in items:
            out.append([np.ctypeslib.as_array(L.llama_get_logits_ith(self._ctx, i + j), shape=(nv,))
                        for j in range(len(toks)) if want[j]])
            i += len(toks)
        return out

    def _embd_batch(self):
        """A batch carrying token ids and embedding rows together. llama_batch_init allocates
        either, so the token array is ours (detached again before llama_batch_free)."""
        if self._ebatch is None:
            self._ebatch = L.llama_batch_init(self.n_batch, self.model.n_embd, 1)
            self._etokens = (L.llama_token * self.n_batch)()
            self._ebatch.token = ctypes.cast(self._etokens, ctypes.POINTER(L.llama_token))
        return self._ebatch

    def listen(self, listener: DecodeListener, replay: bool = False) -> None:
        """Tell ``listener`` about every decode and truncation from now on; ``replay``: decode
        the cached tokens again first, so it hears those too."""
        self.listeners.append(listener)
        if replay and self.tokens:
            saved = list(self.tokens)
            self.clear()
            self.eval(saved, "none")

    def unlisten(self, listener: DecodeListener) -> None:
        if listener in self.listeners:
            self.listeners.remove(listener)

    def mtp_context(self, cfg: ContextConfig, head: Model | None = None) -> Context:
        """A context of type MTP over this context's model (or over ``head``, an MTP-only
        sidecar GGUF of this model: llama.cpp's ``draft-mtp`` with a separate model), reading
        this one's state (llama.cpp's ``draft-mtp``). From now on this context exports a hidden
        row for every token it decodes (:meth:`hidden_rows`), the MTP context one where logits
        are asked (:meth:`hidden_row`). llama.cpp aborts the process on misuse, so the
        preconditions are checked here first (:func:`specli.engine.mtp_rows.check_mtp_head`)."""
        model = head or self.model
        check_mtp_head(self.model, model)
        mtp = Context(model, replace(cfg, n_rs_seq=0), ctx_type=L.LLAMA_CONTEXT_TYPE_MTP, other=self)
        self.export_hidden_rows(every_token=True)  # a hidden row for every token decoded
        mtp.export_hidden_rows(every_token=False)  # rows only where logits are asked
        return mtp

