"""Tiny generated EAGLE-3 heads and the target they draft for (f32, the SmolLM2 tokenizer, cached
by their parameters like tests/tiny2026.py).

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
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from tiny2026 import _write
from tinymodels import read_tokenizer

_VERSION = 1


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
    """``kind``: "bigram" (the target) or "eagle3-full" / "eagle3-partial" (a head)."""
    key = json.dumps({"v": _VERSION, "kind": kind, **{k: kw[k] for k in sorted(kw)}}, sort_keys=True, default=str)
    path = Path(cache) / (f"tiny-{kind}-" + hashlib.sha256(key.encode()).hexdigest()[:16] + ".gguf")
    if not path.exists():
        if kind == "bigram":
            make_bigram_llama(path, tokenizer_gguf, **kw)
        elif kind.startswith("eagle3-"):
            make_eagle3_head(path, tokenizer_gguf, mode=kind.split("-", 1)[1], **kw)
        else:
            raise ValueError(kind)
    return path
