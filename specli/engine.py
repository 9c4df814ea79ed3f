"""A thin layer over llama.cpp's C API (through llama-cpp-python's ctypes bindings).

``Model`` owns the weights and the vocabulary; ``Context`` owns one KV cache and exposes the
three operations speculative decoding needs: evaluate a block of tokens asking for logits only
at chosen positions, read those logits without copying the whole buffer, and roll the cache
back to a shorter prefix.

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
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from specli.errors import ContextFull, Interrupted, SpecliError
from specli.resolve.gguf_header import VocabInfo, read_gguf
from specli.tokens import common_prefix

try:
    import llama_cpp as L
except ImportError as e:  # pragma: no cover - import guard for a broken install
    raise SpecliError(f"llama-cpp-python is not installed or failed to load: {e}") from None
try:
    from llama_cpp import llama_cpp_ext as LX
except ImportError:  # pragma: no cover - a llama-cpp-python without the MTP staging API
    LX = None

_VOCAB_TYPES = {0: "NONE", 1: "SPM", 2: "BPE", 3: "WPM", 4: "UGM", 5: "RWKV", 6: "PLAMO2"}
_backend_ready = False
_log_cb = None
log_sink: list[str] | None = None  # set to a list to collect llama.cpp's log lines (tests, doctor)


def _init_backend() -> None:
    global _backend_ready, _log_cb
    if _backend_ready:
        return
    if not os.environ.get("SPECLI_LLAMA_LOG"):
        # llama.cpp logs every load detail to stderr; keep stderr for specli's own one-liners
        @L.llama_log_callback
        def _quiet(level, text, user_data):  # noqa: ARG001
            if log_sink is not None and text:
                log_sink.append(text.decode("utf-8", "replace"))

        _log_cb = _quiet
        L.llama_log_set(_log_cb, ctypes.c_void_p(0))
    L.llama_backend_init()
    _backend_ready = True


def supports_gpu_offload() -> bool:
    return bool(L.llama_supports_gpu_offload())


def mtp_available() -> bool:
    """Does this llama-cpp-python expose what MTP drafting needs?"""
    return LX is not None and all(hasattr(LX, f) for f in (
        "llama_set_embeddings_nextn", "llama_get_embeddings_nextn", "llama_get_embeddings_nextn_ith"))


def system_info() -> str:
    return L.llama_print_system_info().decode("utf-8", "replace").strip()


def extra_buffer_types() -> bool:
    """Whether llama.cpp may repack weights into its extra CPU buffer types. Not on a CPU with
    AMX tiles: there llama.cpp repacks quantised weights for AMX, and on hosts whose kernel (or
    sandbox) does not grant the AMX tile state the first decode dies with SIGSEGV.
    SPECLI_EXTRA_BUFTS=1 turns them back on."""
    if os.environ.get("SPECLI_EXTRA_BUFTS") == "1":
        return True
    try:
        with open("/proc/cpuinfo") as f:
            return not any(line.startswith("flags") and " amx_tile" in line for line in f)
    except OSError:
        return True


class Model:
    """Weights and vocabulary of one GGUF model."""

    def __init__(self, path: str, n_gpu_layers: int = 0, vocab_only: bool = False, load_mtp: bool = False):
        _init_backend()
        self.header = read_gguf(path)  # clear errors for missing, non-GGUF and truncated files
        self.path = path
        self.n_gpu_layers = n_gpu_layers
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = n_gpu_layers
        mp.vocab_only = vocab_only
        mp.load_mtp = load_mtp
        mp.use_extra_bufts = extra_buffer_types()
        self._model = L.llama_model_load_from_file(path.encode(), mp)
        if not self._model:
            raise SpecliError(f"llama.cpp could not load {path} (architecture '{self.header.architecture}' "
                              "unsupported by this build, or a corrupt file)")
        self.vocab = L.llama_model_get_vocab(self._model)
        self.n_vocab = int(L.llama_vocab_n_tokens(self.vocab))
        self.bos = int(L.llama_vocab_bos(self.vocab))
        self.eos = int(L.llama_vocab_eos(self.vocab))
        self.add_bos = bool(L.llama_vocab_get_add_bos(self.vocab))
        self.n_ctx_train = int(L.llama_model_n_ctx_train(self._model))
        self.recurrent = bool(L.llama_model_is_recurrent(self._model) or L.llama_model_is_hybrid(self._model))
        self.n_embd = int(L.llama_model_n_embd(self._model))
        # MTP (NextN) layers loaded with the model: self-speculation needs them
        self.n_mtp_layers = int(L.llama_model_n_layer_nextn(self._model)) if load_mtp else 0
        self._pieces: dict[tuple[int, bool], bytes] = {}
        self._eog = np.array([bool(L.llama_vocab_is_eog(self.vocab, i)) for i in range(self.n_vocab)])

    @property
    def name(self) -> str:
        return str(self.header.get("general.name") or os.path.basename(self.path))

    def close(self) -> None:
        if getattr(self, "_model", None):
            L.llama_model_free(self._model)
            self._model = None

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass

    # -- vocabulary ---------------------------------------------------------------------
    def vocab_info(self) -> VocabInfo:
        texts = tuple((L.llama_vocab_get_text(self.vocab, i) or b"").decode("utf-8", "replace")
                      for i in range(self.n_vocab))
        return VocabInfo(
            vocab_type=_VOCAB_TYPES.get(int(L.llama_vocab_type(self.vocab)), "?"),
            n_tokens=self.n_vocab, bos=self.bos, eos=self.eos,
            add_bos=self.add_bos, add_eos=bool(L.llama_vocab_get_add_eos(self.vocab)), tokens=texts)

    def is_eog(self, token: int) -> bool:
        return bool(self._eog[token])

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 16
        buf = (L.llama_token * n_max)()
        n = L.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (L.llama_token * n_max)()
            n = L.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int, special: bool = False) -> bytes:
        key = (token, special)
        got = self._pieces.get(key)
        if got is None:  # a buffer per call: requests of a batch detokenize on their own threads
            buf = ctypes.create_string_buffer(256)
            n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = L.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
            got = self._pieces[key] = buf.raw[:n]
        return got

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        return b"".join(self.piece(t, special) for t in tokens).decode("utf-8", "replace")

    def chat_template(self) -> str | None:
        t = self.header.get("tokenizer.chat_template")
        return str(t) if t else None


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


class Context:
    """One KV cache (sequence 0) on a model. ``tokens`` mirrors what the cache holds.
    ``ctx_type``/``other``: an MTP context over the same model, reading ``other``'s state.
    With ``cfg.n_seq`` > 1 the cache holds that many sequences of ``n_ctx`` tokens each; this
    object speaks for sequence 0, :meth:`decode_seqs` decodes several in one batch and
    :class:`SeqContext` is one sequence's view."""

    seq = 0  # the sequence this object's eval, rollback and mark act on

    def __init__(self, model: Model, cfg: ContextConfig, ctx_type: int = 0, other: Context | None = None):
        self.model = model
        cp = L.llama_context_default_params()
        n_ctx = cfg.n_ctx if cfg.n_ctx > 0 else model.n_ctx_train
        n_seq = max(1, cfg.n_seq)
        cp.n_ctx = n_ctx * n_seq
        cp.n_batch = min(cfg.n_batch, n_ctx * n_seq)
        cp.n_ubatch = min(cfg.n_batch, n_ctx * n_seq)
        cp.n_seq_max = n_seq
        # the sequences share one cache of n_ctx * n_seq cells (each kept to n_ctx tokens here):
        # a batch whose sequences hold different numbers of tokens is then one pass; with a
        # cache per sequence llama.cpp splits it into passes of as many tokens per sequence
        cp.kv_unified = True
        threads = cfg.n_threads or max(1, os.cpu_count() or 1)
        cp.n_threads = threads
        cp.n_threads_batch = threads
        cp.no_perf = True
        if cfg.f32_kv:
            cp.type_k = L.GGML_TYPE_F32
            cp.type_v = L.GGML_TYPE_F32
            cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        recurrent = model.recurrent and ctx_type == L.LLAMA_CONTEXT_TYPE_DEFAULT  # an MTP context is attention
        cp.n_rs_seq = cfg.n_rs_seq if recurrent else 0
        cp.ctx_type = ctx_type
        if other is not None:
            cp.ctx_other = other._ctx
        self._ctx = L.llama_init_from_model(model._model, cp)
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
        self.listeners: list[DecodeListener] = []
        self._ebatch = None
        # how a rollback works here: "kv" (attention only), "snapshots" or "checkpoints"
        self.n_rs_seq = int(L.llama_n_rs_seq(self._ctx)) if recurrent else 0
        self.rollback_kind = "kv" if not recurrent else ("snapshots" if self.n_rs_seq else "checkpoints")
        self._checkpoint: tuple[int, ctypes.Array] | None = None  # (position, recurrent state)
        self._cuttable = 0  # snapshots: how many tokens the next cut may drop (0 after a cut)
        self.n_restored = 0  # rollbacks that restored a checkpoint (or decoded the prefix again)
        self.n_replayed = 0  # tokens decoded again by those

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

    def eval(self, tokens: Sequence[int], logits: str = "last", embd: np.ndarray | None = None) -> list[np.ndarray]:
        """Append ``tokens`` to the cache. ``logits``: "last" (one row, for the last token),
        "all" (a row per token) or "none". Rows are views into llama.cpp's buffer, valid
        until the next call; copy what must outlive it. ``embd``: an (n, n_embd) row per token
        passed along with it (an MTP context's input: the target's hidden state)."""
        n = len(tokens)
        if n == 0:
            return []
        if self.n_past + n > self.n_ctx:
            raise ContextFull(self.n_past + n, self.n_ctx)
        if logits == "all" and n > self.n_batch:
            raise ValueError("logits for every token need a block no larger than n_batch")
        b = self._batch if embd is None else self._embd_batch()
        start = 0
        while start < n:
            if start:
                self.between_chunks()
            chunk = tokens[start:start + self.n_batch]
            last_chunk = start + len(chunk) == n
            pos0 = self.n_past
            want = [logits == "all" or (logits == "last" and last_chunk and i == len(chunk) - 1)
                    for i in range(len(chunk))]
            try:
                out = self._decode_chunk(b, chunk, pos0, want,
                                         None if embd is None else embd[start:start + len(chunk)])
            except SpecliError:
                self.rollback(pos0)
                raise
            self.tokens.extend(int(t) for t in chunk)
            self._cuttable = min(self.n_rs_seq, len(chunk) - 1)
            start += len(chunk)
            for lst in self.listeners:
                lst.decoded(self, chunk, pos0)
        if logits == "none":
            return []
        return out if logits == "all" else out[-1:]

    def between_chunks(self) -> None:
        """Between two chunks of one eval (a long prompt): a sequence of a shared context
        stops here when its request is gone (:class:`SeqContext`)."""

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

    def mark(self, across_decodes: bool = False) -> None:
        """Remember the state at the current position, so a rollback to here or later costs a
        restore and a replay of the tokens after it. Only where rollback needs checkpoints:
        snapshots cover a rollback within the last decode, so they need a mark only from a
        caller that rolls back across several decodes (a draft model drafting token by token)."""
        if self.rollback_kind == "kv" or (self.rollback_kind == "snapshots" and not across_decodes):
            return
        flags = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        size = int(L.llama_state_seq_get_size_ext(self._ctx, self.seq, flags))
        reuse = self._checkpoint and len(self._checkpoint[1]) == size
        buf = self._checkpoint[1] if reuse else (ctypes.c_uint8 * size)()
        if int(L.llama_state_seq_get_data_ext(self._ctx, buf, size, self.seq, flags)) != size:
            self._checkpoint = None
            return
        self._checkpoint = (self.n_past, buf)

    def rollback(self, n_keep: int) -> None:
        """Drop every cached token from position ``n_keep`` on."""
        if n_keep >= self.n_past:
            return
        replay = self._cut(n_keep)
        if replay:  # a recurrent state restored from a checkpoint: the kept tokens after it again
            self.eval(replay, "none")
        for lst in self.listeners:
            lst.truncated(self, n_keep)

    def _cut(self, n_keep: int) -> list[int]:
        """Drop the cache from ``n_keep`` on; the kept tokens to decode again (after a checkpoint)."""
        can_cut = self.rollback_kind == "kv" or (self.rollback_kind == "snapshots"
                                                  and self.n_past - n_keep <= self._cuttable)
        if can_cut and L.llama_memory_seq_rm(self._mem, self.seq, n_keep, -1):
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
            restored = L.llama_state_seq_set_data_ext(self._ctx, buf, len(buf), self.seq,
                                                      L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
            if not restored or not L.llama_memory_seq_rm(self._mem, self.seq, pos, -1):
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
        if self.rollback_kind == "kv" and L.llama_memory_seq_rm(self._mem, self.seq, len(self.tokens), -1):
            return []
        return self._rewind(len(self.tokens))

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

    # -- MTP (NextN) layers -----------------------------------------------------------------
    def mtp_context(self, cfg: ContextConfig, head: Model | None = None) -> Context:
        """A context of type MTP over this context's model (or over ``head``, an MTP-only
        sidecar GGUF of this model: llama.cpp's ``draft-mtp`` with a separate model), reading
        this one's state (llama.cpp's ``draft-mtp``). From now on this context exports a hidden
        row for every token it decodes (:meth:`hidden_rows`), the MTP context one where logits
        are asked (:meth:`hidden_row`). llama.cpp aborts the process on misuse, so the
        preconditions are checked here first."""
        model = head or self.model
        if not mtp_available():
            raise SpecliError("this llama-cpp-python has no MTP support (llama_cpp_ext nextn functions)")
        if model.n_mtp_layers <= 0:
            raise SpecliError(f"{model.name} has no MTP layers loaded (converted without its MTP block?)")
        # a sidecar reads this model's hidden rows and speaks its vocabulary (llama.cpp asserts
        # the first: "MTP input row width must match the target h_nextn width")
        for what, mine, its in (("hidden size", self.model.n_embd, model.n_embd),
                                ("vocabulary", self.model.n_vocab, model.n_vocab)):
            if mine != its:
                raise SpecliError(f"{model.name}: an MTP head for {what} {its}, the target's is {mine} "
                                  "(a sidecar for another model)")
        mtp = Context(model, replace(cfg, n_rs_seq=0), ctx_type=L.LLAMA_CONTEXT_TYPE_MTP, other=self)
        LX.llama_set_embeddings_nextn(self._ctx, True, False)  # a hidden row for every token decoded
        LX.llama_set_embeddings_nextn(mtp._ctx, True, True)  # rows only where logits are asked
        return mtp

    def hidden_rows(self, n: int) -> np.ndarray | None:
        """A copy of the hidden rows of the last decode's ``n`` tokens (a context whose hidden
        rows are exported: :meth:`mtp_context`); None when llama.cpp has none."""
        ptr = LX.llama_get_embeddings_nextn(self._ctx)
        return np.ctypeslib.as_array(ptr, shape=(n, self.model.n_embd)).copy() if ptr else None

    def hidden_row(self, i: int) -> np.ndarray:
        """A copy of the hidden row of the last decode's output ``i`` (an MTP context's own)."""
        return np.ctypeslib.as_array(LX.llama_get_embeddings_nextn_ith(self._ctx, i), shape=(self.model.n_embd,)).copy()

    def _forget(self) -> None:
        """Empty this sequence's cache (the whole memory where it holds one sequence)."""
        if self.n_seq == 1:
            L.llama_memory_clear(self._mem, True)
        else:
            L.llama_memory_seq_rm(self._mem, self.seq, -1, -1)

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


class SeqContext(Context):
    """One sequence (a slot) of a multi-sequence :class:`Context`, with the same API (eval,
    mark, rollback, sync, clear) on its own sequence id. Its blocks are decoded by
    ``batcher`` (:class:`specli.speculate.batch.Batcher`), which puts those of every active
    sequence into one llama_decode; every llama.cpp call on the shared context holds
    ``batcher.lock`` (never while it waits for a batch). ``n_batch``: the most tokens one step
    decodes for it (a prompt goes in chunks of that size, between the other sequences' steps)."""

    def __init__(self, parent: Context, seq: int, batcher, n_batch: int):
        self.parent, self.batcher, self.seq = parent, batcher, seq
        self.model, self._ctx, self._mem = parent.model, parent._ctx, parent._mem
        self.n_ctx, self.n_seq, self.n_batch, self.threads = parent.n_ctx, parent.n_seq, n_batch, parent.threads
        self.n_rs_seq, self.rollback_kind = parent.n_rs_seq, parent.rollback_kind
        self._batch = self._ebatch = None
        self.tokens = []
        self.listeners = []
        self.n_decode_calls = self.n_rows = self.n_restored = self.n_replayed = self._cuttable = 0
        self._checkpoint = None
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
