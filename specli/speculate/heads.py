"""Trained drafting heads fed the target's hidden layers: EAGLE-3 (llama.cpp's ``draft-eagle3``)
and DFlash (``draft-dflash``), as ``common/speculative.cpp`` of the llama.cpp that
llama-cpp-python 0.3.36 vendors drives them.

EAGLE-3's call sequence is llama.cpp's:
- the target exports the input rows of the layers the head reads (``llama_model_target_layer_ids``
  of the head; ``llama_set_embeddings_layer_inp`` on the target context);
- after every target decode of tokens x[p0 .. p0+n), those rows are concatenated per token and
  *encoded* by the head (``llama_process(ENCODE)``: its ``fc`` layer) into one row g[p] per token;
  the head's own context is then fed the pairs (x[p+1], g[p]) at position p: the last position
  of each decode is deferred until the next token is known (the next decode's first token, or the
  last token when drafting);
- to draft, the head decodes (last token, g of the position before it), then its own prediction
  with its own pre-norm row (``llama_get_embeddings_nextn_ith``), and so on; the rows drafted are
  dropped again. When the target keeps n tokens of a verify, the deferred row is g of the last
  kept position (rows of rejected tokens are dropped with the cache).

DFlash's (``common_speculative_impl_draft_dflash``, and ``examples/speculative-simple`` for the
cache): a block-diffusion head that drafts a whole block in one pass.
- the target exports the input rows of the layers the head reads, as for EAGLE-3;
- after every target decode of tokens x[p0 .. p0+n), the rows are concatenated per token and
  decoded into the head's context as embeddings at positions p0 .. p0+n (``llama_process(DECODE)``
  of an embedding batch: the head's ``fc`` encodes them and writes each layer's K/V there);
- to draft, the head decodes [last token, mask x (block - 1)] at positions n_past .. with
  non-causal attention (``llama_set_causal_attn(false)``, unless ``dflash.attention.causal``) and
  logits for every position; the greedy token of mask i is draft i; the block's rows are dropped
  again (``seq_rm(ctx_dft, n_past, -1)``) before the target verifies. When the target keeps n
  tokens, the head's rows past them go with the target's (rows of rejected tokens are dropped).
- the block size (``dflash.block_size``, 16 by default) bounds the draft: block - 1 tokens.
DFlash2 heads (a selector lattice, ``dflash.selector_top_k``) and DSpark heads (a Markov head) read
their drafts another way and are refused.

The functions reading the layer rows and the head's layer ids are exported by libllama only under
C++-mangled names (``src/llama-ext.h``); llama.cpp aborts the process on misuse (a layer id past
the target's layers, a target architecture whose graph does not expose its layer inputs), so every
precondition is checked here first.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from specli.engine import LX, Context, ContextConfig, L, Model, libllama, mtp_available
from specli.errors import SpecliError
from specli.resolve.gguf_header import HEAD_DFLASH, HEAD_EAGLE3, HEAD_NAMES, head_fit
from specli.speculate.contract import KeepGoing
from specli.speculate.drafters import greedy_drafts
from specli.speculate.mtp import FedDrafter, MTPDrafter
from specli.speculate.settings import DEFAULTS
from specli.speculate.source import Draft, Source

EAGLE3 = Source("eagle3")  # fed inside the target's pass, like MTP


def _bind(names: tuple[str, ...], argtypes: list, restype):
    lib = libllama()
    for name in names:
        f = getattr(lib, name, None)
        if f is not None:
            f.argtypes, f.restype = argtypes, restype
            return f
    return None


_ctx_p, _model_p = ctypes.c_void_p, ctypes.c_void_p
set_layer_inp = _bind(("llama_set_embeddings_layer_inp", "_Z30llama_set_embeddings_layer_inpP13llama_contextjb"),
                      [_ctx_p, ctypes.c_uint32, ctypes.c_bool], None)
get_layer_inp = _bind(("llama_get_embeddings_layer_inp", "_Z30llama_get_embeddings_layer_inpP13llama_contextj"),
                      [_ctx_p, ctypes.c_uint32], ctypes.POINTER(ctypes.c_float))
target_layer_ids = _bind(("llama_model_target_layer_ids", "_Z28llama_model_target_layer_idsPK11llama_model"),
                         [_model_p], ctypes.POINTER(ctypes.c_int32))
selector_top_k = _bind(("llama_model_dflash_selector_top_k", "_Z33llama_model_dflash_selector_top_kPK11llama_model"),
                        [_model_p], ctypes.c_int32)
target_layer_ids_n = _bind(("llama_model_target_layer_ids_n", "_Z30llama_model_target_layer_ids_nPK11llama_model"),
                           [_model_p], ctypes.c_uint32)


def heads_available() -> bool:
    """Does this libllama export what EAGLE-3 drafting needs?"""
    return mtp_available() and None not in (set_layer_inp, get_layer_inp, target_layer_ids, target_layer_ids_n) \
        and hasattr(L, "llama_process") and hasattr(L, "llama_batch_ext_add_embd")


def layer_ids(head: Model) -> list[int]:
    """The target layers the loaded head reads (llama.cpp's own reading of its header)."""
    n = int(target_layer_ids_n(head.handle))
    ptr = target_layer_ids(head.handle)
    return [int(ptr[i]) for i in range(n)] if n and ptr else []


def _fitted(target: Context, head: Model, kind: str) -> list[int]:
    """The target layers ``head`` (a head of ``kind``) reads, once it is checked to fit ``target``
    (llama.cpp aborts the process on a misfit): this libllama's functions, the headers' rules
    (:func:`head_fit`), the layer ids llama.cpp itself read, the vocabulary."""
    if not heads_available():
        raise SpecliError("this llama-cpp-python's libllama does not export what drafting heads need "
                          "(llama_set_embeddings_layer_inp, llama_model_target_layer_ids, ...)")
    tm = target.model
    if head.header.head_kind != kind:
        raise SpecliError(f"{head.name} is not {HEAD_NAMES[kind]} (architecture {head.header.architecture})")
    bad = [f"{rule}: {detail}" for ok, rule, detail in head_fit(tm.header, head.header) if not ok]
    if bad:
        raise SpecliError(f"{head.name} is {HEAD_NAMES[kind]} built for another target ({'; '.join(bad)})")
    ids = layer_ids(head)
    n_layer = int(L.llama_model_n_layer(tm.handle))
    if not ids or (kind == HEAD_EAGLE3 and len(ids) != 3) or not all(0 <= i < n_layer for i in ids):
        raise SpecliError(f"{head.name} reads target layers {ids}; the target has {n_layer} "
                          "(specli reads layer inputs only, ids below the target's layer count)")
    if head.n_vocab != tm.n_vocab:
        raise SpecliError(f"{head.name}: a head with {head.n_vocab} tokens, the target has {tm.n_vocab}")
    return ids


def eagle3_context(target: Context, head: Model, cfg: ContextConfig) -> Context:
    """The EAGLE-3 head's context, reading ``target``'s state (its embeddings and output): checked
    to fit the target first (llama.cpp aborts the process on a misfit), and from now on the target
    exports the input rows of the layers the head reads (llama.cpp's ``draft-eagle3`` wiring)."""
    ids = _fitted(target, head, HEAD_EAGLE3)
    ctx = Context(head, replace(cfg, n_rs_seq=0), other=target)
    for lid in ids:
        set_layer_inp(target.handle, lid, True)
    LX.llama_set_embeddings_nextn(ctx.handle, True, True)  # the head's pre-norm row where logits are asked
    return ctx


class Eagle3Drafter(MTPDrafter):
    """Greedy drafts from an EAGLE-3 head, stopping when its top probability falls below
    ``p_min`` or when ``keep_going`` says the next token does not pay. Drafting (under a
    grammar's guide too), pricing and the rows kept are the MTP drafter's (an MTP head is fed
    (x[p], h[p-1]) at p, this one (x[p+1], g[p]) at p: the same loop one position behind); what
    differs is how it is fed. ``ctx``: the head's context (:func:`eagle3_context`); the drafter
    must hear every decode of the target (``target.listen(drafter, replay=True)``), which the
    session wires."""

    name = "eagle3"
    source = EAGLE3
    lag = 1

    def __init__(self, target: Context, ctx: Context, p_min: float = DEFAULTS.draft_p_min):
        super().__init__(target, ctx, p_min)
        self.cost_key = "eagle3"
        self.ids = layer_ids(ctx.model)
        self.n_embd_tgt = target.model.n_embd
        self.n_embd = ctx.model.n_embd
        self._enc = L.llama_batch_ext_init(self.ctx.handle)

    # -- fed by the target ----------------------------------------------------------------
    def encode(self, features: np.ndarray) -> np.ndarray:
        """The head's encoder (its ``fc``) over rows of concatenated target features."""
        out = []
        n_enc = features.shape[1]
        step = self.ctx.n_batch  # the encoder needs the whole batch in one ubatch
        pos = (ctypes.c_int32 * 4)()
        for s in range(0, len(features), step):
            chunk = np.ascontiguousarray(features[s:s + step], dtype=np.float32)
            L.llama_batch_ext_clear(self._enc)
            base = chunk.ctypes.data
            for j in range(len(chunk)):
                row = L.llama_embd(ctypes.cast(base + j * n_enc * 4, ctypes.POINTER(ctypes.c_float)), 1, n_enc)
                idx = L.llama_batch_ext_add_embd(self._enc, 0, row)
                if idx < 0:
                    raise SpecliError(f"EAGLE-3 encoder batch refused a row ({idx})")
                pos[0] = self.ctx.n_past + j
                L.llama_batch_ext_set_pos(self._enc, idx, pos)
                L.llama_batch_ext_set_output_logits(self._enc, idx, True)
            rc = L.llama_process(self.ctx.handle, L.LLAMA_PROCESS_TYPE_ENCODE, self._enc)
            if rc != 0:
                raise SpecliError(f"the EAGLE-3 encoder failed (llama_process returned {rc})")
            g = LX.llama_get_embeddings_nextn(self.ctx.handle)
            out.append(np.ctypeslib.as_array(g, shape=(len(chunk), self.n_embd)).copy())
        return np.concatenate(out)

    def decoded(self, ctx: Context, tokens: Sequence[int], pos0: int) -> None:
        n = len(tokens)
        layers = [np.ctypeslib.as_array(get_layer_inp(ctx.handle, lid), shape=(n, self.n_embd_tgt)) for lid in self.ids]
        g = self.encode(np.concatenate(layers, axis=1))
        # pairs (x[p+1], g[p]) at position p; the first completes the last decode's deferred position
        start = max(pos0 - 1, 0)
        toks = list(tokens) if pos0 > 0 else list(tokens[1:])
        rows = np.concatenate([self.hidden(pos0 - 1)[None], g[:-1]]) if pos0 > 0 else g[:-1]
        self.ctx.rollback(start)
        if self.ctx.n_past == start and toks:
            self.ctx.eval(toks, "none", embd=rows)
        self._block = (pos0, g)

    def truncated(self, ctx: Context, n_keep: int) -> None:
        self.ctx.rollback(max(n_keep - 1, 0))  # the last kept position is deferred again

    def close(self) -> None:
        if self._enc is not None:
            L.llama_batch_ext_free(self._enc)
            self._enc = None
        super().close()


DFLASH = Source("dflash")  # one pass drafts the whole block


def block_size(head: Model) -> int:
    """The block a DFlash head was trained on (llama.cpp reads ``dflash.block_size``, 16 if absent)."""
    return int(head.header.arch_key("block_size", 16) or 16)


def dflash_context(target: Context, head: Model, cfg: ContextConfig) -> Context:
    """The DFlash head's context, reading ``target``'s state (its token embeddings and output where
    the head has none): checked to fit first (llama.cpp aborts the process on a misfit), and from
    now on the target exports the input rows of the layers the head reads (llama.cpp's
    ``draft-dflash`` wiring: non-causal attention in the block unless the head says otherwise)."""
    ids = _fitted(target, head, HEAD_DFLASH)
    if selector_top_k is None or not hasattr(L, "llama_set_causal_attn") or not hasattr(L, "llama_vocab_mask"):
        raise SpecliError("this llama-cpp-python's libllama does not export what DFlash needs "
                          "(llama_model_dflash_selector_top_k, llama_set_causal_attn, llama_vocab_mask)")
    if int(selector_top_k(head.handle)) > 0:
        raise SpecliError(f"{head.name} is a DFlash2 head (a selector lattice); specli drafts with DFlash heads "
                          "that give logits per block position")
    mask = int(L.llama_vocab_mask(head.vocab))
    if not 0 <= mask < target.model.n_vocab:
        raise SpecliError(f"{head.name}: a DFlash head without a mask token (tokenizer.ggml.mask_token_id) "
                          "in the target's vocabulary")
    if block_size(head) < 2:
        raise SpecliError(f"{head.name}: a DFlash block of {block_size(head)} tokens drafts nothing")
    ctx = Context(head, replace(cfg, n_rs_seq=0), other=target)
    for lid in ids:
        set_layer_inp(target.handle, lid, True)
    LX.llama_set_embeddings_nextn(ctx.handle, True, True)
    causal = str(head.header.get("dflash.attention.causal", "false")).lower() == "true"
    L.llama_set_causal_attn(ctx.handle, causal)
    return ctx


class DFlashDrafter(FedDrafter):
    """Greedy drafts from a DFlash head: one pass over [last token, masks] gives the block's
    drafts; they are read in order, stopping when the top probability falls below ``p_min`` or
    when ``keep_going`` says the next token does not pay (the pass is paid once, whatever the
    length: the controller prices it as the first token's cost, ``Controller.draft_costs``).
    ``ctx``: the head's context (:func:`dflash_context`); ``n_max``: the longest draft asked for
    (llama.cpp clamps it to the block: ``block_size - 1``), which sizes the block decoded. The
    drafter must hear every decode of the target (``target.listen(drafter, replay=True)``), which
    the session wires. ``ctx.tokens`` mirrors the target tokens whose rows its cache holds."""

    name = "dflash"
    source = DFLASH

    def __init__(self, target: Context, ctx: Context, p_min: float = DEFAULTS.draft_p_min,
                 n_max: int = DEFAULTS.draft_max):
        self.target = target
        self.ctx = ctx
        self.p_min = p_min
        self.ids = layer_ids(ctx.model)
        self.n_embd_tgt = target.model.n_embd
        self.block = min(max(n_max, 1), block_size(ctx.model) - 1) + 1
        self.max_len = self.block - 1
        self.mask = int(L.llama_vocab_mask(ctx.model.vocab))
        self.cost_key = f"dflash{self.block}"
        self._inject = L.llama_batch_ext_init(ctx.handle)

    # -- fed by the target ----------------------------------------------------------------
    def decoded(self, ctx: Context, tokens: Sequence[int], pos0: int) -> None:
        n = len(tokens)
        mine = self.ctx.tokens
        if pos0 + n <= len(mine) and mine[pos0:pos0 + n] == list(tokens):
            return  # a replay of tokens already fed (a checkpoint rollback): same rows
        self.ctx.rollback(pos0)
        if self.ctx.n_past != pos0:
            return  # rows missing before these: drafts are then worse, never wrong
        layers = [np.ctypeslib.as_array(get_layer_inp(ctx.handle, lid), shape=(n, self.n_embd_tgt)) for lid in self.ids]
        features = np.ascontiguousarray(np.concatenate(layers, axis=1), dtype=np.float32)
        n_enc = features.shape[1]
        b, pos = self._inject, (ctypes.c_int32 * 4)()
        step = self.ctx.n_batch
        for s in range(0, n, step):
            chunk = features[s:s + step]
            L.llama_batch_ext_clear(b)
            base = chunk.ctypes.data
            for j in range(len(chunk)):
                row = L.llama_embd(ctypes.cast(base + j * n_enc * 4, ctypes.POINTER(ctypes.c_float)), 1, n_enc)
                idx = L.llama_batch_ext_add_embd(b, 0, row)
                if idx < 0:
                    raise SpecliError(f"DFlash injection batch refused a row ({idx})")
                pos[0] = pos[1] = pos[2] = pos0 + s + j
                L.llama_batch_ext_set_pos(b, idx, pos)
            rc = L.llama_process(self.ctx.handle, L.LLAMA_PROCESS_TYPE_DECODE, b)
            if rc != 0:
                self.ctx.rollback(pos0)
                raise SpecliError(f"the DFlash head's injection failed (llama_process returned {rc})")
            self.ctx.tokens.extend(int(t) for t in tokens[s:s + len(chunk)])

    def truncated(self, ctx: Context, n_keep: int) -> None:
        self.ctx.rollback(n_keep)

    # -- drafting -------------------------------------------------------------------------
    def _block(self, last: int) -> list[np.ndarray]:
        """One pass over [last, masks] at the head's position: a logits row per block position
        (views, valid until the head's next decode)."""
        return self.ctx.eval([last] + [self.mask] * (self.block - 1), "all")

    def propose(self, context: Sequence[int], max_len: int,
                keep_going: KeepGoing | None = None, p_min: float | None = None) -> Draft:
        p_min = self.p_min if p_min is None else p_min
        pos0 = len(context) - 1  # the last token is not in the target's cache yet
        ctx = self.ctx
        max_len = min(max_len, self.max_len)
        if max_len <= 0 or self.target.n_past != pos0 or ctx.n_past != pos0 or pos0 + self.block > ctx.n_ctx:
            return Draft([], DFLASH)
        try:
            rows = self._block(int(context[-1]))
            rest = iter(rows[2:])
            toks, conf, _ = greedy_drafts(rows[1], lambda tok: next(rest), max_len, self.target.model.is_eog, p_min,
                                          keep_going, guide=self.guide)
        finally:
            ctx.rollback(pos0)  # the block's rows go; the verify pass feeds the real ones
        return Draft(toks, DFLASH, conf, passes=0)

    def pass_time(self, reps: int = 4) -> float:
        """Seconds per block pass, measured now (the best of ``reps``): the whole draft's cost,
        whatever its length (the controller's price of the pass, ``Controller.draft_costs``)."""
        pos0 = self.ctx.n_past
        if pos0 + self.block > self.ctx.n_ctx:
            return 0.0
        tok = max(self.target.model.bos, 0)
        best = float("inf")
        try:
            self._block(tok)  # warm-up: the first pass of a shape allocates its graph
            self.ctx.rollback(pos0)
            for _ in range(reps):
                t = time.perf_counter()
                self._block(tok)
                best = min(best, time.perf_counter() - t)
                self.ctx.rollback(pos0)
        finally:
            self.ctx.rollback(pos0)
        return best

    def close(self) -> None:
        if self._inject is not None:
            L.llama_batch_ext_free(self._inject)
            self._inject = None
        super().close()
