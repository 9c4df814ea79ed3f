"""Tiny generated EAGLE-3 and DFlash heads and the targets they draft for (f32, the SmolLM2
tokenizer, cached by their parameters like tests/tiny2026.py).

Keys and tensors follow the vendored llama.cpp (llama-cpp-python 0.3.36): ``src/models/eagle3.cpp``
(``eagle3.target_layers`` (3 ids), ``eagle3.target_hidden_size``, ``fc`` {3*target_hidden, d},
one decoder layer whose Q/K/V read [norm(embedding) | norm(g)] (2d), ``attn_norm_2`` the norm of
g, ``norm_before_residual``), ``src/models/llama.cpp`` for the target. Shapes in comments are ggml
order ``{ne0, ne1}``; numpy arrays are ``(ne1, ne0)``.

The target (``bigram``) is a 2-layer llama whose attention and FFN outputs are zero: its next token
is a function of the last one, f(x) = argmax output . norm(e(x)). Its embedding rows have unit RMS
and a constant first coordinate (1.0).

The head (``mode="full"``) predicts f of the token it is fed, so every greedy draft is accepted
when, and only when, the call sequence feeds it llama.cpp's pairs (token at P+1, features of P)
at position P: its attention looks at its own position only (Q = K = a constant vector read from
the embeddings' constant coordinate: after RoPE the score is |q|^2 sum_j cos(theta_j (i - j)),
largest by a wide margin at i = j), V is the normed embedding, ``attn_output`` the identity, the FFN
and g's contribution zero (``norm_before_residual`` with a zero ``attn_norm_2``), and it has no
``token_embd`` / ``output`` of its own (llama.cpp takes the target's through ``ctx_other``).
``mode="partial"``: g enters (random ``fc``, ``attn_norm_2`` ones, FFN noise): drafts are
sometimes wrong, and the features of the target matter.

DFlash (``src/models/dflash.cpp``; ``common/speculative.cpp``'s ``draft-dflash``) drafts a whole
block in one pass: the target's features of every position are injected into the head's KV cache
(``fc`` {n_layers*d, d}, ``enc.output_norm``, then each layer's K/V), and the block
[last token, mask x (block_size - 1)] is decoded with non-causal attention, every mask position
giving a draft. A one-pass head cannot iterate a bigram, so its target (``copy``) is a 2-layer
llama that copies: its layer 0 attends ``period - 1`` positions back (RoPE only: Q a constant
vector pre-rotated by that offset, K constant), V the normed embedding, ``attn_output`` 10 I, the
output matrix the embeddings with their constant coordinate zeroed (a token reads out as itself):
x[t+1] = x[t+1-period]. The head (``mode="full"``) attends ``period`` positions back from every
mask, reading the injected features of layer 0 (the token's embedding: ``fc`` = [I | 0]), or the
block's own last token for the last mask: with ``block_size = period + 1`` every draft is right
when, and only when, the features were injected at their positions and the block stands where
llama.cpp puts it. ``mode="partial"``: noise in ``fc`` (layer 1's features enter) and the FFN.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from tiny2026 import _write
from tinymodels import read_tokenizer

_VERSION = 2


def _unit_rows_with_constant(rng, n_vocab: int, d: int) -> np.ndarray:
    e = rng.normal(0.0, 1.0, size=(n_vocab, d)).astype(np.float32)
    e[:, 1:] *= np.sqrt((d - 1) / (e[:, 1:] ** 2).sum(axis=1, keepdims=True))  # rows: 1 + (d-1) = d, unit RMS
    e[:, 0] = 1.0
    return e


def make_bigram_llama(out: Path, tokenizer_gguf: str, *, seed: int = 0, n_layer: int = 2, d: int = 64, n_head: int = 4,
                      n_head_kv: int = 2, ff: int = 128, n_ctx: int = 4096, out_scale: float = 1.0) -> Path:
    tok = read_tokenizer(tokenizer_gguf)
    n_vocab = len(tok["tokenizer.ggml.tokens"])
    rng = np.random.default_rng(seed)
    hd = d // n_head

    def w(*shape, std):
        return rng.normal(0.0, std, size=shape).astype(np.float32)

    t = {"token_embd.weight": _unit_rows_with_constant(rng, n_vocab, d)}
    for i in range(n_layer):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = np.ones(d, np.float32)
        t[p + "attn_q.weight"] = w(n_head * hd, d, std=d ** -0.5)
        t[p + "attn_k.weight"] = w(n_head_kv * hd, d, std=d ** -0.5)
        t[p + "attn_v.weight"] = w(n_head_kv * hd, d, std=d ** -0.5)
        t[p + "attn_output.weight"] = np.zeros((d, n_head * hd), np.float32)
        t[p + "ffn_norm.weight"] = np.ones(d, np.float32)
        t[p + "ffn_gate.weight"] = w(ff, d, std=d ** -0.5)
        t[p + "ffn_up.weight"] = w(ff, d, std=d ** -0.5)
        t[p + "ffn_down.weight"] = np.zeros((d, ff), np.float32)
    t["output_norm.weight"] = np.ones(d, np.float32)
    t["output.weight"] = w(n_vocab, d, std=out_scale)
    kv = [("u32", "context_length", n_ctx), ("u32", "embedding_length", d), ("u32", "block_count", n_layer),
          ("u32", "feed_forward_length", ff), ("u32", "attention.head_count", n_head),
          ("u32", "attention.head_count_kv", n_head_kv), ("f32", "attention.layer_norm_rms_epsilon", 1e-6),
          ("u32", "rope.dimension_count", hd), ("f32", "rope.freq_base", 10000.0), ("u32", "vocab_size", n_vocab)]
    return _write(out, "llama", tok, kv, t)


def rope_offset_query(offset: int, n_rot: int, base: float, neox: bool) -> np.ndarray:
    """A head's constant query which, against a key of ones, scores highest ``offset`` positions
    away (key position - query position) after ggml's RoPE (NORM: pairs (2j, 2j+1); NeoX:
    (j, j + n_rot/2)); unit RMS."""
    q = np.zeros(n_rot, np.float32)
    for j in range(n_rot // 2):
        psi = offset * base ** (-2.0 * j / n_rot)
        a, b = (j, j + n_rot // 2) if neox else (2 * j, 2 * j + 1)
        q[a], q[b] = np.cos(psi) - np.sin(psi), np.sin(psi) + np.cos(psi)
    return q


def _reads_constant(rows: np.ndarray, d_in: int) -> np.ndarray:
    """A projection whose output is ``rows`` times the input's constant coordinate (index 0)."""
    w = np.zeros((len(rows), d_in), np.float32)
    w[:, 0] = rows
    return w


def make_copy_llama(out: Path, tokenizer_gguf: str, *, seed: int = 0, period: int = 3, d: int = 64, n_head: int = 4,
                    ff: int = 128, qk: float = 30.0, freq_base: float = 100.0, n_ctx: int = 4096,
                    out_scale: float = 0.1) -> Path:
    """A 2-layer llama whose next token is the token ``period - 1`` positions back (see the module)."""
    tok = read_tokenizer(tokenizer_gguf)
    n_vocab = len(tok["tokenizer.ggml.tokens"])
    rng = np.random.default_rng(seed)
    hd = d // n_head
    e = _unit_rows_with_constant(rng, n_vocab, d)
    q = np.tile(rope_offset_query(-(period - 1), hd, freq_base, neox=False), n_head)
    z = np.zeros
    t = {"token_embd.weight": e}
    for i in range(2):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = np.ones(d, np.float32)
        t[p + "attn_q.weight"] = _reads_constant(qk * q, d)
        t[p + "attn_k.weight"] = _reads_constant(np.ones(d, np.float32), d)
        t[p + "attn_v.weight"] = np.eye(d, dtype=np.float32)
        t[p + "attn_output.weight"] = (10.0 if i == 0 else 0.0) * np.eye(d, dtype=np.float32)
        t[p + "ffn_norm.weight"] = np.ones(d, np.float32)
        t[p + "ffn_gate.weight"] = rng.normal(0.0, d ** -0.5, size=(ff, d)).astype(np.float32)
        t[p + "ffn_up.weight"] = rng.normal(0.0, d ** -0.5, size=(ff, d)).astype(np.float32)
        t[p + "ffn_down.weight"] = z((d, ff), np.float32)
    readout = e.copy()
    readout[:, 0] = 0.0  # the constant coordinate says nothing of the token
    t["output_norm.weight"] = np.ones(d, np.float32)
    t["output.weight"] = out_scale * readout
    kv = [("u32", "context_length", n_ctx), ("u32", "embedding_length", d), ("u32", "block_count", 2),
          ("u32", "feed_forward_length", ff), ("u32", "attention.head_count", n_head),
          ("u32", "attention.head_count_kv", n_head), ("f32", "attention.layer_norm_rms_epsilon", 1e-6),
          ("u32", "rope.dimension_count", hd), ("f32", "rope.freq_base", freq_base), ("u32", "vocab_size", n_vocab)]
    return _write(out, "llama", tok, kv, t)


def make_dflash_head(out: Path, tokenizer_gguf: str, *, mode: str = "full", seed: int = 2, period: int = 3,
                     target_hidden: int = 64, layers: tuple[int, ...] = (0, 1), d: int = 64, n_head: int = 4,
                     ff: int = 128, qk: float = 30.0, freq_base: float = 100.0, n_ctx: int = 4096,
                     block_size: int | None = None, mask_token: int | None = 12345, noise: float = 12.0) -> Path:
    """A DFlash head for :func:`make_copy_llama` (see the module); ``mask_token`` None writes no
    mask token (a head llama.cpp cannot draft with)."""
    assert mode in ("full", "partial")
    tok = read_tokenizer(tokenizer_gguf)
    rng = np.random.default_rng(seed)
    hd = d // n_head
    n_in = len(layers) * target_hidden
    partial = mode == "partial"
    fc = np.zeros((d, n_in), np.float32)  # {n_layers*target_hidden, d}: layer 0's features, the token's embedding
    fc[:, :min(d, target_hidden)] = np.eye(d, min(d, target_hidden), dtype=np.float32)
    if partial:
        fc[:, 1:] += rng.normal(0.0, 0.15 * n_in ** -0.5, size=(d, n_in - 1)).astype(np.float32)
    q = np.tile(rope_offset_query(-period, hd, freq_base, neox=True), n_head)
    t = {
        "fc.weight": fc,
        "enc.output_norm.weight": np.ones(d, np.float32),
        "output_norm.weight": np.ones(d, np.float32),
        "blk.0.attn_norm.weight": np.ones(d, np.float32),
        "blk.0.attn_q.weight": _reads_constant(q, d),
        "blk.0.attn_k.weight": _reads_constant(np.ones(d, np.float32), d),
        "blk.0.attn_v.weight": np.eye(d, dtype=np.float32),
        "blk.0.attn_output.weight": 10.0 * np.eye(d, dtype=np.float32),
        "blk.0.attn_q_norm.weight": np.full(hd, qk, np.float32),  # the sharpness of the positional choice
        "blk.0.attn_k_norm.weight": np.ones(hd, np.float32),
        "blk.0.ffn_norm.weight": np.ones(d, np.float32),
        "blk.0.ffn_gate.weight": rng.normal(0.0, d ** -0.5, size=(ff, d)).astype(np.float32),
        "blk.0.ffn_up.weight": rng.normal(0.0, d ** -0.5, size=(ff, d)).astype(np.float32),
        "blk.0.ffn_down.weight": (rng.normal(0.0, noise * ff ** -0.5, size=(d, ff)) if partial
                                  else np.zeros((d, ff))).astype(np.float32),
    }
    kv = [("u32", "context_length", n_ctx), ("u32", "embedding_length", d), ("u32", "block_count", 1),
          ("u32", "feed_forward_length", ff), ("u32", "attention.head_count", n_head),
          ("u32", "attention.head_count_kv", n_head), ("f32", "attention.layer_norm_rms_epsilon", 1e-6),
          ("u32", "rope.dimension_count", hd), ("f32", "rope.freq_base", freq_base),
          ("arr_i32", "target_layers", list(layers)), ("u32", "block_size", block_size or period + 1)]
    if mask_token is not None:
        kv.append(("u32", "tokenizer.ggml.mask_token_id", mask_token))
    return _write(out, "dflash", tok, kv, t)


def make_eagle3_head(out: Path, tokenizer_gguf: str, *, mode: str = "full", seed: int = 1, target_hidden: int = 64,
                     layers: tuple[int, int, int] = (0, 1, 1), d: int = 64, n_head: int = 4, ff: int = 128,
                     qk: float = 20.0, freq_base: float = 100.0, n_ctx: int = 4096, g_weight: float = 0.3) -> Path:
    assert mode in ("full", "partial")
    tok = read_tokenizer(tokenizer_gguf)
    rng = np.random.default_rng(seed)
    hd = d // n_head
    z = np.zeros
    # Q and K: every head, every dimension = qk * (normed embedding)[0] = qk (the constant coordinate)
    wq = z((n_head * hd, 2 * d), np.float32)
    wq[:, 0] = qk
    wv = z((n_head * hd, 2 * d), np.float32)
    wv[:, :d] = np.eye(d, dtype=np.float32)  # V = the normed embedding of the token fed
    partial = mode == "partial"
    t = {
        "fc.weight": (rng.normal(0.0, (3 * target_hidden) ** -0.5, size=(d, 3 * target_hidden))
                      if partial else z((d, 3 * target_hidden))).astype(np.float32),  # {3*target_hidden, d}
        "output_norm.weight": np.ones(d, np.float32),
        "blk.0.attn_norm.weight": np.ones(d, np.float32),
        "blk.0.attn_norm_2.weight": (g_weight * np.ones(d) if partial else z(d)).astype(np.float32),  # norm of g
        "blk.0.attn_q.weight": wq, "blk.0.attn_k.weight": wq.copy(), "blk.0.attn_v.weight": wv,  # {2d, n_head*hd}
        "blk.0.attn_output.weight": np.eye(d, dtype=np.float32),
        "blk.0.ffn_norm.weight": np.ones(d, np.float32),
        "blk.0.ffn_gate.weight": rng.normal(0.0, d ** -0.5, size=(ff, d)).astype(np.float32),
        "blk.0.ffn_up.weight": rng.normal(0.0, d ** -0.5, size=(ff, d)).astype(np.float32),
        "blk.0.ffn_down.weight": (rng.normal(0.0, 0.3 * ff ** -0.5, size=(d, ff)) if partial
                                  else z((d, ff))).astype(np.float32),
    }
    kv = [("u32", "context_length", n_ctx), ("u32", "embedding_length", d), ("u32", "block_count", 1),
          ("u32", "feed_forward_length", ff), ("u32", "attention.head_count", n_head),
          ("u32", "attention.head_count_kv", n_head), ("f32", "attention.layer_norm_rms_epsilon", 1e-6),
          ("u32", "rope.dimension_count", hd), ("f32", "rope.freq_base", freq_base),
          ("arr_i32", "target_layers", list(layers)), ("u32", "target_hidden_size", target_hidden),
          ("bool", "norm_before_residual", True)]
    return _write(out, "eagle3", tok, kv, t)


def tiny_head_model(cache: Path, tokenizer_gguf: str, kind: str, **kw) -> Path:
    """``kind``: "bigram" / "copy" (the targets) or "eagle3-full" / "eagle3-partial" /
    "dflash-full" / "dflash-partial" (heads)."""
    key = json.dumps({"v": _VERSION, "kind": kind, **{k: kw[k] for k in sorted(kw)}}, sort_keys=True, default=str)
    path = Path(cache) / (f"tiny-{kind}-" + hashlib.sha256(key.encode()).hexdigest()[:16] + ".gguf")
    if not path.exists():
        if kind == "bigram":
            make_bigram_llama(path, tokenizer_gguf, **kw)
        elif kind == "copy":
            make_copy_llama(path, tokenizer_gguf, **kw)
        elif kind.startswith("eagle3-"):
            make_eagle3_head(path, tokenizer_gguf, mode=kind.split("-", 1)[1], **kw)
        elif kind.startswith("dflash-"):
            make_dflash_head(path, tokenizer_gguf, mode=kind.split("-", 1)[1], **kw)
        else:
            raise ValueError(kind)
    return path
