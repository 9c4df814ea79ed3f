"""Tiny random-weight f32 GGUF models of 2026 architectures, with a real tokenizer.

Companion of ``tinymodels.py`` (same idea: d=64 random f32 weights plus the SmolLM2 tokenizer,
~27 MB a file, almost all of it the 49152-row embedding and output matrices; files are cached
by their parameters).

Kinds (``tiny_2026_model(cache, tokenizer_gguf, kind, **kw)``):

* ``qwen35-mtp-full``    qwen35 hybrid (gated-delta-net + full attention) with one MTP/NextN block,
                         built so that greedy MTP drafts are always accepted: the trunk is a bigram
                         model (attention / SSM outputs zero, only layer 0 has an FFN, unit-RMS
                         embedding rows) and the MTP block computes the same function of the token
                         it is fed (``eh_proj = [I | 0]``, zero attention output, FFN = layer 0's).
* ``qwen35-mtp-partial`` the same layout with small non-zero attention / SSM outputs (the trunk
                         depends on the history) and a noisy MTP block: acceptance in between.
* ``qwen35``             the partial trunk without the MTP block (no ``nextn_predict_layers`` key).
* ``mamba``              pure recurrent Mamba-1 (``llama_model_is_recurrent`` is true).
* ``qwen35-trunk-full`` / ``qwen35-trunk-partial``
                         the trunk of ``qwen35-mtp-full`` / ``-partial`` without its MTP block (what a
                         GGUF converted without the ``mtp.*`` tensors holds)
* ``qwen35-mtp-only-full`` / ``qwen35-mtp-only-partial``
                         the MTP block of the same model alone, as an MTP-only sidecar GGUF: same keys
                         (``block_count = n_layer + 1``, ``nextn_predict_layers = 1``), ``token_embd``,
                         ``output_norm``, ``output`` and ``blk.{n_layer}.*``, no ``blk.0.attn_norm``
                         (llama.cpp's ``mtp_only`` test in ``src/models/qwen35.cpp``). The trunk and
                         the sidecar of one mode together are the ``-mtp-`` model of that mode.

Keys and tensor shapes follow llama.cpp's ``src/models/qwen35.cpp`` / ``src/models/mamba.cpp`` and
``src/llama-arch.cpp`` (the version vendored by llama-cpp-python 0.3.36). Shapes in comments are
ggml order ``{ne0, ne1}``; numpy arrays are ``(ne1, ne0)``.

``add_tokenizer`` / ``read_tokenizer`` are the tokenizer copying that ``tinymodels.make_tiny_gguf``
does inline; ``tinymodels`` could reuse them.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
from tinymodels import add_tokenizer, read_tokenizer

KINDS = ("qwen35-mtp-full", "qwen35-mtp-partial", "qwen35", "mamba", "qwen35-trunk-full", "qwen35-trunk-partial",
         "qwen35-mtp-only-full", "qwen35-mtp-only-partial")

# bump when a construction changes, so cached files are rebuilt
_VERSION = 5


# --------------------------------------------------------------------------- tokenizer



def _write(out: Path, arch: str, tok: dict, kv: list[tuple[str, str, object]], tensors: dict[str, np.ndarray]) -> Path:
    """kv: (method, key-without-arch-prefix or full key, value); method in u32/f32/str/arr_i32/bool."""
    import gguf

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
    wr = gguf.GGUFWriter(str(tmp), arch)
    wr.add_name("tiny-test-2026")
    wr.add_file_type(0)
    for kind, key, val in kv:
        key = key if key.startswith(("general.", "tokenizer.")) else f"{arch}.{key}"
        if kind == "u32":
            wr.add_uint32(key, int(val))
        elif kind == "f32":
            wr.add_float32(key, float(val))
        elif kind == "bool":
            wr.add_bool(key, bool(val))
        elif kind == "str":
            wr.add_string(key, str(val))
        elif kind == "arr_i32":
            wr.add_array(key, [int(x) for x in val])  # ints -> INT32 array
        else:
            raise ValueError(kind)
    add_tokenizer(wr, tok)
    for name, arr in tensors.items():
        wr.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    os.replace(tmp, out)
    return out


# --------------------------------------------------------------------------- qwen35

def _part(t: dict, part: str, mtp: bool, n_layer: int) -> tuple[bool, dict]:
    """The tensors of ``part``: "all", the "trunk" (no MTP block) or the "mtp" block alone."""
    if part == "trunk":
        return False, {k: v for k, v in t.items() if not k.startswith(f"blk.{n_layer}.")}
    if part == "mtp":
        return mtp, {k: v for k, v in t.items() if not k.startswith("blk.") or k.startswith(f"blk.{n_layer}.")}
    return mtp, t


def make_qwen35_gguf(out: Path, tokenizer_gguf: str, *, mode: str = "partial", mtp: bool = True, part: str = "all",
                     seed: int = 0, n_layer: int = 2, full_attention_interval: int = 2,
                     d: int = 64, n_head: int = 4, n_head_kv: int = 2, head_dim: int = 16, ff: int = 128,
                     ssm_state: int = 16, ssm_groups: int = 2, ssm_heads: int = 4, conv_kernel: int = 4,
                     n_ctx: int = 4096, out_scale: float = 1.0,
                     mix_scale: float = 0.1, mtp_noise: float = 0.1, mtp_h_scale: float = 0.1,
                     mtp_attn_scale: float = 0.3) -> Path:
    """A tiny ``qwen35`` model, optionally with one MTP block at ``blk.{n_layer}``.

    mode "full": bigram trunk + exact MTP copy (greedy drafts always accepted).
    mode "partial": attention / SSM outputs scaled by ``mix_scale`` (history matters), MTP block =
    exact copy + gaussian noise of relative size ``mtp_noise`` on its FFN and a ``mtp_h_scale``
    contribution of the hidden state through ``eh_proj``, and an MTP attention output scaled by
    ``mtp_attn_scale`` (so the draft context's own KV cache matters).
    part "trunk": the model without its MTP block; "mtp": the MTP block alone (an MTP-only
    sidecar); both are drawn as the whole model is, so they are its two halves.
    """
    assert mode in ("full", "partial") and part in ("all", "trunk", "mtp")
    tok = read_tokenizer(tokenizer_gguf)
    n_vocab = len(tok["tokenizer.ggml.tokens"])
    rng = np.random.default_rng(seed)

    def w(*shape, std):
        return rng.normal(0.0, std, size=shape).astype(np.float32)

    # gated delta net dims (llama_model_qwen35::load_arch_tensors)
    head_k = head_v = ssm_state
    key_dim, value_dim = head_k * ssm_groups, head_v * ssm_heads
    conv_dim = 2 * key_dim + value_dim
    d_inner = value_dim
    is_recr = [(i + 1) % full_attention_interval != 0 for i in range(n_layer)]
    n_rot = head_dim
    # IMROPE sections sum to n_rot/2 (Qwen3.5-0.8B: n_rot 64 -> [11, 11, 10, 0]); text positions are
    # identical in all sections, so the split only has to be valid
    sections = [3 * n_rot // 16, 3 * n_rot // 16, n_rot // 2 - 6 * (n_rot // 16), 0]

    emb = w(n_vocab, d, std=1.0)
    emb /= np.sqrt((emb ** 2).mean(axis=1, keepdims=True))  # unit-RMS rows: rms_norm(e) == e (up to eps)
    t: dict[str, np.ndarray] = {"token_embd.weight": emb}
    mix = 0.0 if mode == "full" else mix_scale

    def attn_block(p: str, out_std: float):
        t[p + "attn_q.weight"] = w(2 * n_head * head_dim, d, std=d ** -0.5)      # {d, 2*n_head*hd}: query + gate
        t[p + "attn_k.weight"] = w(n_head_kv * head_dim, d, std=d ** -0.5)       # {d, n_head_kv*hd}
        t[p + "attn_v.weight"] = w(n_head_kv * head_dim, d, std=d ** -0.5)
        t[p + "attn_output.weight"] = (w(d, n_head * head_dim, std=out_std) if out_std
                                       else np.zeros((d, n_head * head_dim), np.float32))
        t[p + "attn_q_norm.weight"] = np.ones(head_dim, np.float32)
        t[p + "attn_k_norm.weight"] = np.ones(head_dim, np.float32)

    ffn0 = None
    for i in range(n_layer):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = np.ones(d, np.float32)
        t[p + "post_attention_norm.weight"] = np.ones(d, np.float32)
        if is_recr[i]:
            t[p + "attn_qkv.weight"] = w(conv_dim, d, std=d ** -0.5)              # {d, 2*key_dim+value_dim}
            t[p + "attn_gate.weight"] = w(value_dim, d, std=d ** -0.5)            # {d, value_dim} (z)
            t[p + "ssm_conv1d.weight"] = w(conv_dim, conv_kernel, std=conv_kernel ** -0.5)  # {d_conv, conv_dim}
            t[p + "ssm_dt.bias"] = w(ssm_heads, std=0.5)                          # {n_v_heads}
            t[p + "ssm_a"] = -np.exp(rng.uniform(-1.0, 0.5, size=ssm_heads)).astype(np.float32)  # {n_v_heads}, < 0
            t[p + "ssm_beta.weight"] = w(ssm_heads, d, std=d ** -0.5)             # {d, n_v_heads}
            t[p + "ssm_alpha.weight"] = w(ssm_heads, d, std=d ** -0.5)
            t[p + "ssm_norm.weight"] = np.ones(head_v, np.float32)                # {head_v_dim}
            t[p + "ssm_out.weight"] = (w(d, value_dim, std=mix * value_dim ** -0.5) if mix
                                       else np.zeros((d, value_dim), np.float32))  # {value_dim, d}
        else:
            attn_block(p, mix * (n_head * head_dim) ** -0.5)
        t[p + "ffn_gate.weight"] = w(ff, d, std=d ** -0.5)
        t[p + "ffn_up.weight"] = w(ff, d, std=d ** -0.5)
        # only layer 0 has an FFN: with zero attention / SSM outputs ("full") the trunk is
        # h = e + ffn0(norm(e)), a bigram model that the MTP block can copy exactly
        down_std = ff ** -0.5 if i == 0 else 0.0
        t[p + "ffn_down.weight"] = w(d, ff, std=down_std) if down_std else np.zeros((d, ff), np.float32)
        if i == 0:
            ffn0 = {k: t[p + k] for k in ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")}
    t["output_norm.weight"] = np.ones(d, np.float32)
    t["output.weight"] = w(n_vocab, d, std=out_scale)

    if mtp:
        p = f"blk.{n_layer}."
        t[p + "attn_norm.weight"] = np.ones(d, np.float32)
        t[p + "post_attention_norm.weight"] = np.ones(d, np.float32)
        # full: zero attention output, the draft is a function of (token, h) only
        attn_block(p, mtp_attn_scale * (n_head * head_dim) ** -0.5 if mode == "partial" else 0.0)
        for k, v in ffn0.items():
            if mode == "partial":
                v = v + w(*v.shape, std=mtp_noise * float(v.std()))
            t[p + k] = v.copy()
        eh = np.zeros((d, 2 * d), np.float32)                # {2d, d}; input is concat(enorm(e), hnorm(h))
        eh[:, :d] = np.eye(d, dtype=np.float32)
        if mode == "partial" and mtp_h_scale:
            eh[:, d:] = w(d, d, std=mtp_h_scale * d ** -0.5)
        t[p + "nextn.eh_proj.weight"] = eh
        t[p + "nextn.enorm.weight"] = np.ones(d, np.float32)
        t[p + "nextn.hnorm.weight"] = np.ones(d, np.float32)
        # nextn.embed_tokens / shared_head_head / shared_head_norm are optional: tok_embd / output / output_norm

    mtp, t = _part(t, part, mtp, n_layer)
    kv = [
        ("u32", "context_length", n_ctx), ("u32", "embedding_length", d),
        ("u32", "block_count", n_layer + (1 if mtp else 0)), ("u32", "feed_forward_length", ff),
        ("u32", "attention.head_count", n_head), ("u32", "attention.head_count_kv", n_head_kv),
        ("u32", "attention.key_length", head_dim), ("u32", "attention.value_length", head_dim),
        ("f32", "attention.layer_norm_rms_epsilon", 1e-6),
        ("u32", "rope.dimension_count", n_rot), ("arr_i32", "rope.dimension_sections", sections),
        ("f32", "rope.freq_base", 10000.0),
        ("u32", "full_attention_interval", full_attention_interval),
        ("u32", "ssm.conv_kernel", conv_kernel), ("u32", "ssm.state_size", ssm_state),
        ("u32", "ssm.group_count", ssm_groups), ("u32", "ssm.time_step_rank", ssm_heads),
        ("u32", "ssm.inner_size", d_inner), ("u32", "vocab_size", n_vocab),
    ]
    if mtp:
        kv.append(("u32", "nextn_predict_layers", 1))
    return _write(out, "qwen35", tok, kv, t)


# --------------------------------------------------------------------------- mamba

def make_mamba_gguf(out: Path, tokenizer_gguf: str, *, seed: int = 0, n_layer: int = 2, d: int = 64,
                    d_state: int = 16, d_conv: int = 4, dt_rank: int = 4, n_ctx: int = 4096,
                    out_scale: float = 1.0) -> Path:
    """A tiny Mamba-1 model (fewest keys of the pure recurrent archs: 4 ssm keys + rms eps)."""
    tok = read_tokenizer(tokenizer_gguf)
    n_vocab = len(tok["tokenizer.ggml.tokens"])
    rng = np.random.default_rng(seed)
    d_inner = 2 * d  # llama.cpp: "only an expansion factor of 2 is supported"

    def w(*shape, std):
        return rng.normal(0.0, std, size=shape).astype(np.float32)

    t = {"token_embd.weight": w(n_vocab, d, std=1.0)}
    for i in range(n_layer):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = np.ones(d, np.float32)
        t[p + "ssm_in.weight"] = w(2 * d_inner, d, std=d ** -0.5)                   # {d, 2*d_inner}
        t[p + "ssm_conv1d.weight"] = w(d_inner, d_conv, std=d_conv ** -0.5)         # {d_conv, d_inner}
        t[p + "ssm_conv1d.bias"] = w(d_inner, std=0.1)
        t[p + "ssm_x.weight"] = w(dt_rank + 2 * d_state, d_inner, std=d_inner ** -0.5)  # {d_inner, dt_rank+2*d_state}
        t[p + "ssm_dt.weight"] = w(d_inner, dt_rank, std=dt_rank ** -0.5)           # {dt_rank, d_inner}
        t[p + "ssm_dt.bias"] = w(d_inner, std=0.5) - 1.0
        a_log = np.log(np.tile(np.arange(1, d_state + 1, dtype=np.float32), (d_inner, 1)))
        t[p + "ssm_a"] = -np.exp(a_log)                                              # {d_state, d_inner}, < 0
        t[p + "ssm_d"] = np.ones(d_inner, np.float32)                                # {d_inner}
        t[p + "ssm_out.weight"] = w(d, d_inner, std=d_inner ** -0.5)                 # {d_inner, d}
    t["output_norm.weight"] = np.ones(d, np.float32)
    t["output.weight"] = w(n_vocab, d, std=out_scale)
    kv = [
        ("u32", "context_length", n_ctx), ("u32", "embedding_length", d), ("u32", "block_count", n_layer),
        ("u32", "ssm.conv_kernel", d_conv), ("u32", "ssm.inner_size", d_inner),
        ("u32", "ssm.state_size", d_state), ("u32", "ssm.time_step_rank", dt_rank),
        ("f32", "attention.layer_norm_rms_epsilon", 1e-5), ("u32", "vocab_size", n_vocab),
    ]
    return _write(out, "mamba", tok, kv, t)


# --------------------------------------------------------------------------- cache

def _build(path: Path, tokenizer_gguf: str, kind: str, kw: dict) -> Path:
    if kind == "qwen35-mtp-full":
        return make_qwen35_gguf(path, tokenizer_gguf, mode="full", mtp=True, **kw)
    if kind == "qwen35-mtp-partial":
        return make_qwen35_gguf(path, tokenizer_gguf, mode="partial", mtp=True, **kw)
    if kind == "qwen35":
        return make_qwen35_gguf(path, tokenizer_gguf, mode="partial", mtp=False, **kw)
    if kind.startswith(("qwen35-trunk-", "qwen35-mtp-only-")):
        return make_qwen35_gguf(path, tokenizer_gguf, mode=kind.rsplit("-", 1)[1], mtp=True,
                                part="trunk" if "-trunk-" in kind else "mtp", **kw)
    if kind == "mamba":
        return make_mamba_gguf(path, tokenizer_gguf, **kw)
    raise ValueError(f"unknown kind {kind!r}; expected one of {KINDS}")


def tiny_2026_model(cache: Path, tokenizer_gguf: str, kind: str, **kw) -> Path:
    """Build (once) and return a tiny model of ``kind`` (see ``KINDS``); the file name encodes
    the kind, every parameter and the construction version."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {KINDS}")
    key = json.dumps({"v": _VERSION, "kind": kind, "tok": os.path.basename(tokenizer_gguf),
                      **{k: kw[k] for k in sorted(kw)}}, sort_keys=True, default=str)
    name = f"tiny-{kind}-" + hashlib.sha256(key.encode()).hexdigest()[:16] + ".gguf"
    path = Path(cache) / name
    if not path.exists():
        _build(path, tokenizer_gguf, kind, kw)
    return path
