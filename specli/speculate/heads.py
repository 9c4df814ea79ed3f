"""EAGLE-3 heads: a one-layer drafter fed three of the target's hidden layers (llama.cpp's
``draft-eagle3``, ``common/speculative.cpp`` of the llama.cpp that llama-cpp-python 0.3.36 vendors).

The call sequence is llama.cpp's:
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

The functions reading the layer rows and the head's layer ids are exported by libllama only under
C++-mangled names (``src/llama-ext.h``); llama.cpp aborts the process on misuse (a layer id past
the target's layers, a target architecture whose graph does not expose its layer inputs), so every
precondition is checked here first.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from specli.engine import LX, Context, ContextConfig, L, Model, mtp_available
from specli.errors import SpecliError
from specli.resolve.gguf_header import HEAD_EAGLE3, head_fit
from specli.speculate.drafters import Source
from specli.speculate.mtp import MTPDrafter
from specli.speculate.settings import DEFAULTS

EAGLE3 = Source("eagle3")  # fed inside the target's pass, like MTP


def _bind(names: tuple[str, ...], argtypes: list, restype):
    lib = L.llama_cpp._lib
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
target_layer_ids_n = _bind(("llama_model_target_layer_ids_n", "_Z30llama_model_target_layer_ids_nPK11llama_model"),
                           [_model_p], ctypes.c_uint32)


def heads_available() -> bool:
    """Does this libllama export what EAGLE-3 drafting needs?"""
    return mtp_available() and None not in (set_layer_inp, get_layer_inp, target_layer_ids, target_layer_ids_n) \
        and hasattr(L, "llama_process") and hasattr(L, "llama_batch_ext_add_embd")


def layer_ids(head: Model) -> list[int]:
    """The target layers the loaded head reads (llama.cpp's own reading of its header)."""
    n = int(target_layer_ids_n(head._model))
    ptr = target_layer_ids(head._model)
    return [int(ptr[i]) for i in range(n)] if n and ptr else []


def eagle3_context(target: Context, head: Model, cfg: ContextConfig) -> Context:
    """The EAGLE-3 head's context, reading ``target``'s state (its embeddings and output): checked
    to fit the target first (llama.cpp aborts the process on a misfit), and from now on the target
    exports the input rows of the layers the head reads (llama.cpp's ``draft-eagle3`` wiring)."""
    if not heads_available():
        raise SpecliError("this llama-cpp-python's libllama does not export the EAGLE-3 functions "
                          "(llama_set_embeddings_layer_inp, llama_model_target_layer_ids, ...)")
    tm = target.model
    if head.header.head_kind != HEAD_EAGLE3:
        raise SpecliError(f"{head.name} is not an EAGLE-3 head (architecture {head.header.architecture})")
    bad = [f"{rule}: {detail}" for ok, rule, detail in head_fit(tm.header, head.header) if not ok]
    if bad:
        raise SpecliError(f"{head.name} is an EAGLE-3 head built for another target ({'; '.join(bad)})")
    ids = layer_ids(head)
    n_layer = int(L.llama_model_n_layer(tm._model))
    if len(ids) != 3 or not all(0 <= i < n_layer for i in ids):
        raise SpecliError(f"{head.name} reads target layers {ids}; the target has {n_layer} "
                          "(specli reads layer inputs only, ids below the target's layer count)")
    if head.n_vocab != tm.n_vocab:
        raise SpecliError(f"{head.name}: a head with {head.n_vocab} tokens, the target has {tm.n_vocab}")
    ctx = Context(head, replace(cfg, n_rs_seq=0), other=target)
    for lid in ids:
        set_layer_inp(target._ctx, lid, True)
    LX.llama_set_embeddings_nextn(ctx._ctx, True, True)  # the head's pre-norm row where logits are asked
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
        self._enc = L.llama_batch_ext_init(self.ctx._ctx)

    # -- fed by the target ----------------------------------------------------------------
    def _encode(self, features: np.ndarray) -> np.ndarray:
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
            rc = L.llama_process(self.ctx._ctx, L.LLAMA_PROCESS_TYPE_ENCODE, self._enc)
            if rc != 0:
                raise SpecliError(f"the EAGLE-3 encoder failed (llama_process returned {rc})")
            g = LX.llama_get_embeddings_nextn(self.ctx._ctx)
            out.append(np.ctypeslib.as_array(g, shape=(len(chunk), self.n_embd)).copy())
        return np.concatenate(out)

    def decoded(self, ctx: Context, tokens: Sequence[int], pos0: int) -> None:
        n = len(tokens)
        layers = [np.ctypeslib.as_array(get_layer_inp(ctx._ctx, lid), shape=(n, self.n_embd_tgt)) for lid in self.ids]
        g = self._encode(np.concatenate(layers, axis=1))
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
