"""Tiny llama-architecture GGUF models with random f32 weights and a real tokenizer.

They run thousands of tokens a second, so exact-output tests are cheap. A draft is the
target's weights plus noise: it agrees with the target often, but not always, which is what
the rollback and acceptance paths need. Files are cached by their parameters.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

import numpy as np

from specli.resolve.gguf_header import read_gguf

TOKENIZER_KEYS = (
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_space_prefix", "tokenizer.chat_template",
)


@functools.lru_cache(maxsize=4)
def read_tokenizer(tokenizer_gguf: str) -> dict:
    """The ``TOKENIZER_KEYS`` of a GGUF file (lists / arrays for array keys)."""
    meta = read_gguf(tokenizer_gguf).metadata
    return {k: meta[k] for k in TOKENIZER_KEYS if k in meta}


def add_tokenizer(wr, tok: dict, tokens: list[str] | None = None) -> int:
    """Write the tokenizer keys of ``tok`` (from ``read_tokenizer``) to a ``gguf.GGUFWriter``.

    Returns the vocabulary size. ``tokens`` overrides the token texts (same length)."""
    tokens = list(tok["tokenizer.ggml.tokens"]) if tokens is None else list(tokens)
    wr.add_tokenizer_model(tok["tokenizer.ggml.model"])
    if "tokenizer.ggml.pre" in tok:
        wr.add_tokenizer_pre(tok["tokenizer.ggml.pre"])
    wr.add_token_list(tokens)
    wr.add_token_types([int(x) for x in tok["tokenizer.ggml.token_type"]])
    if "tokenizer.ggml.merges" in tok:
        wr.add_token_merges(list(tok["tokenizer.ggml.merges"]))
    for key, fn in (("bos_token_id", wr.add_bos_token_id), ("eos_token_id", wr.add_eos_token_id),
                    ("unknown_token_id", wr.add_unk_token_id), ("padding_token_id", wr.add_pad_token_id)):
        if "tokenizer.ggml." + key in tok:
            fn(int(tok["tokenizer.ggml." + key]))
    if "tokenizer.ggml.add_bos_token" in tok:
        wr.add_add_bos_token(bool(tok["tokenizer.ggml.add_bos_token"]))
    if "tokenizer.ggml.add_space_prefix" in tok:
        wr.add_add_space_prefix(bool(tok["tokenizer.ggml.add_space_prefix"]))
    if "tokenizer.chat_template" in tok:
        wr.add_chat_template(tok["tokenizer.chat_template"])
    return len(tokens)


def make_tiny_gguf(out: Path, tokenizer_gguf: str, *, seed: int = 0, noise: float = 0.0, noise_seed: int = 1,
                   n_layer: int = 2, d: int = 64, n_head: int = 4, n_head_kv: int | list[int] = 2, ff: int = 128,
                   n_ctx: int = 4096, out_scale: float = 0.5, attn_scale: float = 1.0,
                   token_edits: dict[int, str] | None = None, metadata: dict | None = None,
                   chat_template: str | None = None) -> Path:
    import gguf  # test dependency

    tok = read_tokenizer(tokenizer_gguf)
    if chat_template is not None:  # another family's template over the same tokenizer
        tok = {**tok, "tokenizer.chat_template": chat_template}
    tokens = list(tok["tokenizer.ggml.tokens"])
    for i, text in (token_edits or {}).items():
        tokens[i] = text
    n_vocab = len(tokens)

    rng = np.random.default_rng(seed)
    nrng = np.random.default_rng(noise_seed)
    hd = d // n_head

    def w(*shape, std):
        a = rng.normal(0.0, std, size=shape).astype(np.float32)
        if noise:
            a += nrng.normal(0.0, noise * std, size=shape).astype(np.float32)
        return a

    tensors = {"token_embd.weight": w(n_vocab, d, std=1.0)}
    for i in range(n_layer):
        p = f"blk.{i}."
        tensors[p + "attn_norm.weight"] = np.ones(d, np.float32)
        tensors[p + "attn_q.weight"] = w(n_head * hd, d, std=d ** -0.5)
        hkv = n_head_kv[i] if isinstance(n_head_kv, list) else n_head_kv  # a list: a per-layer array key
        tensors[p + "attn_k.weight"] = w(hkv * hd, d, std=d ** -0.5)
        tensors[p + "attn_v.weight"] = w(hkv * hd, d, std=d ** -0.5)
        tensors[p + "attn_output.weight"] = w(d, n_head * hd, std=attn_scale * d ** -0.5)
        tensors[p + "ffn_norm.weight"] = np.ones(d, np.float32)
        tensors[p + "ffn_gate.weight"] = w(ff, d, std=d ** -0.5)
        tensors[p + "ffn_up.weight"] = w(ff, d, std=d ** -0.5)
        tensors[p + "ffn_down.weight"] = w(d, ff, std=ff ** -0.5)
    tensors["output_norm.weight"] = np.ones(d, np.float32)
    tensors["output.weight"] = w(n_vocab, d, std=out_scale)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
    wr = gguf.GGUFWriter(str(tmp), "llama")
    wr.add_name("tiny-test")
    wr.add_context_length(n_ctx)
    wr.add_embedding_length(d)
    wr.add_block_count(n_layer)
    wr.add_feed_forward_length(ff)
    wr.add_head_count(n_head)
    if isinstance(n_head_kv, list):
        wr.add_array("llama.attention.head_count_kv", n_head_kv)
    else:
        wr.add_head_count_kv(n_head_kv)
    wr.add_layer_norm_rms_eps(1e-5)
    wr.add_rope_dimension_count(hd)
    wr.add_vocab_size(n_vocab)
    wr.add_file_type(0)
    add_tokenizer(wr, tok, tokens)
    for k, v in (metadata or {}).items():
        if isinstance(v, bool):
            wr.add_bool(k, v)
        elif isinstance(v, int):
            wr.add_uint32(k, v)
        else:
            wr.add_string(k, str(v))
    for name, arr in tensors.items():
        wr.add_tensor(name, arr)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    os.replace(tmp, out)
    return out


def tiny_model(cache: Path, tokenizer_gguf: str, **kw) -> Path:
    """Build (once) and return a tiny model; the file name encodes every parameter."""
    key = json.dumps({"tok": os.path.basename(tokenizer_gguf), **{k: kw[k] for k in sorted(kw)}},
                     sort_keys=True, default=str)
    name = "tiny-" + hashlib.sha256(key.encode()).hexdigest()[:16] + ".gguf"
    path = cache / name
    if not path.exists():
        make_tiny_gguf(path, tokenizer_gguf, **kw)
    return path
