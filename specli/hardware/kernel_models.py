"""Tiny llama GGUF models whose weight matrices are all of one ggml type, for timing each type's
kernels through llama.cpp itself (its repacking, sgemm and vec_dot paths as they run).

A model is written in f32 with the ``gguf`` writer (a made-up byte-level vocabulary: no download)
and quantised by llama.cpp's own ``llama_model_quantize`` with ``pure`` set, so every matrix,
the output matrix included, gets the one type. Rows are multiples of 256 (K-quants need it) and
of 8 (repacking needs it)."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# the types timed, and the llama.cpp file type whose pure quantisation gives each one
FTYPES = {
    "Q4_0": "Q4_0", "Q4_1": "Q4_1", "Q5_0": "Q5_0", "Q5_1": "Q5_1", "Q8_0": "Q8_0",
    "Q2_K": "Q2_K", "Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M", "Q6_K": "Q6_K",
    "IQ4_NL": "IQ4_NL", "IQ4_XS": "IQ4_XS", "F16": "F16", "BF16": "BF16",
}
TYPES = tuple(FTYPES)


@dataclass(frozen=True)
class Shape:
    """The probe model's size. The default has a real model's matrices (Qwen2.5 1.5B's: 1536 x
    8960) in two layers, 100M weights: more than a CPU's last-level cache holds, so a pass
    streams its weights from memory as a real model's does, and long enough (1-5 ms a row) that
    a pass's fixed costs hardly count. With probes of 25M weights (a sub-millisecond pass) timed at
    1, 2, 4, 8, 16 and 32 rows, the first ``benchmarks/cost_curve.py --predict`` run predicted real
    files' curves up to 48 % too flat."""
    d: int = 1536
    ff: int = 8960
    n_layer: int = 2
    n_head: int = 12
    n_vocab: int = 512

    def matmul_elements(self) -> int:
        """Weights the matrix products read per row (the output matrix included; the embedding
        table is looked up, not multiplied)."""
        return self.n_layer * (4 * self.d * self.d + 3 * self.d * self.ff) + self.n_vocab * self.d


DEFAULT_SHAPE = Shape()


def _vocab(n: int) -> tuple[list[str], list[float], list[int]]:
    """An SPM vocabulary: <unk>, <s>, </s>, the 256 byte tokens, then made-up pieces."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"▁w{i}" for i in range(n - len(tokens))]
    types = [2, 3, 3] + [6] * 256 + [1] * (n - 259)
    return tokens, [0.0] * 3 + [0.0] * 256 + [-float(i) for i in range(n - 259)], types


def write_f32(out: Path, shape: Shape, seed: int = 0) -> Path:
    """The tiny model in f32 (random weights: the cost of a product does not depend on them)."""
    import gguf

    rng = np.random.default_rng(seed)
    d, ff = shape.d, shape.ff

    def w(*s):
        return rng.normal(0.0, d ** -0.5, size=s).astype(np.float32)

    tensors = {"token_embd.weight": w(shape.n_vocab, d)}
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        tensors.update({p + "attn_norm.weight": np.ones(d, np.float32), p + "attn_q.weight": w(d, d),
                        p + "attn_k.weight": w(d, d), p + "attn_v.weight": w(d, d),
                        p + "attn_output.weight": w(d, d), p + "ffn_norm.weight": np.ones(d, np.float32),
                        p + "ffn_gate.weight": w(ff, d), p + "ffn_up.weight": w(ff, d),
                        p + "ffn_down.weight": w(d, ff)})
    tensors["output_norm.weight"] = np.ones(d, np.float32)
    tensors["output.weight"] = w(shape.n_vocab, d)
    tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
    wr = gguf.GGUFWriter(str(tmp), "llama")
    wr.add_name("specli-kernel-probe")
    for fn, v in ((wr.add_context_length, 256), (wr.add_embedding_length, d), (wr.add_block_count, shape.n_layer),
                  (wr.add_feed_forward_length, ff), (wr.add_head_count, shape.n_head),
                  (wr.add_head_count_kv, shape.n_head), (wr.add_rope_dimension_count, d // shape.n_head),
                  (wr.add_vocab_size, shape.n_vocab), (wr.add_file_type, 0)):
        fn(v)
    wr.add_layer_norm_rms_eps(1e-5)
    tokens, scores, types = _vocab(shape.n_vocab)
    wr.add_tokenizer_model("llama")
    wr.add_token_list(tokens)
    wr.add_token_scores(scores)
    wr.add_token_types(types)
    wr.add_bos_token_id(1)
    wr.add_eos_token_id(2)
    wr.add_unk_token_id(0)
    for name, arr in tensors.items():
        wr.add_tensor(name, arr)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    os.replace(tmp, out)
    return out


def quantize(src: Path, out: Path, type_name: str, threads: int | None = None) -> Path:
    """``src`` requantised by llama.cpp so that every matrix is ``type_name`` (pure)."""
    import llama_cpp.llama_cpp as L

    params = L.llama_model_quantize_default_params()
    params.ftype = getattr(L, "LLAMA_FTYPE_MOSTLY_" + FTYPES[type_name])
    params.pure = True
    params.allow_requantize = True
    params.nthread = threads or 0
    tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
    rc = L.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0 or not tmp.exists():
        raise RuntimeError(f"llama_model_quantize to {type_name} failed ({rc})")
    os.replace(tmp, out)
    return out


def probe_models(folder: Path, types: tuple[str, ...] = TYPES, shape: Shape = DEFAULT_SHAPE,
                 threads: int | None = None) -> dict[str, Path]:
    """One tiny model per type in ``folder`` (made once; their names carry the shape)."""
    folder.mkdir(parents=True, exist_ok=True)
    tag = f"{shape.d}x{shape.ff}x{shape.n_layer}x{shape.n_vocab}"
    src = folder / f"probe-{tag}-F32.gguf"
    if not src.exists():
        write_f32(src, shape)
    out = {}
    for t in types:
        p = folder / f"probe-{tag}-{t}.gguf"
        out[t] = p if p.exists() else quantize(src, p, t, threads)
    return out
