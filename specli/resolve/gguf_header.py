"""Read a GGUF file's header (metadata and tensor table) without loading weights.

Works on any binary file object with ``read`` (a local file, or a remote file opened
through huggingface-hub's file system, which turns reads into HTTP range requests).
Also validates that a local file is complete: a truncated download is caught here,
with a clear message, before llama.cpp is asked to load it.
"""

from __future__ import annotations

import functools
import io
import os
import struct
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np

from specli.errors import SpecliError
from specli.resolve.archs import LAYER_INPUT_ARCHITECTURES, LLAMA_ARCHITECTURES, MTP_ARCHITECTURES

GGUF_MAGIC = b"GGUF"

# value types
_UINT8, _INT8, _UINT16, _INT16, _UINT32, _INT32, _FLOAT32, _BOOL, _STRING, _ARRAY, _UINT64, _INT64, _FLOAT64 = range(13)
_SCALAR = {
    _UINT8: "<B", _INT8: "<b", _UINT16: "<H", _INT16: "<h", _UINT32: "<I", _INT32: "<i",
    _FLOAT32: "<f", _BOOL: "<?", _UINT64: "<Q", _INT64: "<q", _FLOAT64: "<d",
}
_NP = {
    _UINT8: "<u1", _INT8: "<i1", _UINT16: "<u2", _INT16: "<i2", _UINT32: "<u4", _INT32: "<i4",
    _FLOAT32: "<f4", _BOOL: "?", _UINT64: "<u8", _INT64: "<i8", _FLOAT64: "<f8",
}


@functools.cache
def ggml_type(type_id: int) -> tuple[str, int, int] | None:
    """(name, elements per block, bytes per block) of a ggml tensor type, from the gguf package's
    tables (llama.cpp's own); None when the installed gguf does not know the type's size."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    try:
        t = GGMLQuantizationType(type_id)
    except ValueError:
        return None
    size = GGML_QUANT_SIZES.get(t)
    return None if size is None else (t.name, size[0], size[1])


# tokenizer.ggml.model -> llama.cpp vocabulary type name
VOCAB_TYPES = {"llama": "SPM", "gpt2": "BPE", "bert": "WPM", "t5": "UGM", "rwkv": "RWKV",
               "plamo2": "PLAMO2", "no_vocab": "NONE", "none": "NONE"}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    type_id: int
    offset: int  # relative to the start of the data section

    @property
    def type_name(self) -> str:
        from gguf.constants import GGMLQuantizationType
        try:
            return GGMLQuantizationType(self.type_id).name
        except ValueError:
            return str(self.type_id)

    @property
    def nbytes(self) -> int | None:
        """Bytes of the tensor's data; None when its type's size is unknown."""
        t = ggml_type(self.type_id)
        if t is None:
            return None
        n = 1
        for d in self.shape:
            n *= d
        return n // t[1] * t[2]


# trained drafting heads (GGUFHeader.head_kind)
HEAD_MTP_ONLY, HEAD_EAGLE3, HEAD_DFLASH = "mtp-only", "eagle3", "dflash"
HEAD_SHORT = {HEAD_MTP_ONLY: "MTP-only head", HEAD_EAGLE3: "EAGLE-3 head", HEAD_DFLASH: "DFlash head",
              "dspark": "DSpark head"}
HEAD_NAMES = {HEAD_MTP_ONLY: "an MTP-only head (llama.cpp draft-mtp with a separate model)",
              HEAD_EAGLE3: "an EAGLE-3 head (llama.cpp draft-eagle3)",
              HEAD_DFLASH: "a DFlash head (llama.cpp draft-dflash)",
              "dspark": "a DSpark head (llama.cpp draft-dspark)"}
# the kinds specli drafts with, and its drafter for each
HEAD_DRAFTERS = {HEAD_MTP_ONLY: "the MTP drafter", HEAD_EAGLE3: "EAGLE-3", HEAD_DFLASH: "DFlash, a block a pass"}


def head_not_driven(h: GGUFHeader) -> str | None:
    """Why specli does not draft with this drafting head (None: it does, or not a head): DSpark
    heads bias the block with a Markov head chained inside the graph, DFlash2 heads give a
    selector lattice instead of logits (llama.cpp's server drives both)."""
    kind = h.head_kind
    lattice = int(h.arch_key("selector_top_k", 0) or 0) > 0 or h.has_tensor("selector_hidden.weight")
    if kind == HEAD_DFLASH and lattice:
        return "a DFlash2 head (its drafts are a selector lattice, not logits per block position)"
    if kind is not None and kind not in HEAD_DRAFTERS:
        return f"{HEAD_NAMES[kind]}"
    return None


@dataclass
class GGUFHeader:
    version: int
    metadata: dict[str, Any]
    tensors: list[TensorInfo]
    data_offset: int
    path: str | None = None

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    def arch_key(self, suffix: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.architecture}.{suffix}", default)

    @property
    def mtp_layers(self) -> int:
        """Multi-token-prediction (NextN) layers the file carries (0: converted without them)."""
        return int(self.arch_key("nextn_predict_layers", 0) or 0)

    @property
    def mtp_usable(self) -> bool:
        """MTP layers that this llama.cpp can draft with (an MTP graph for the architecture) for
        this file's own trunk (an MTP-only sidecar has none: it drafts for another file)."""
        return self.mtp_layers > 0 and self.architecture in MTP_ARCHITECTURES and self.head_kind is None

    def has_tensor(self, name: str) -> bool:
        return any(t.name == name for t in self.tensors)

    @property
    def head_kind(self) -> str | None:
        """What trained drafting head this file is, as llama.cpp's
        ``common_speculative_types_from_gguf`` (``common/speculative.cpp``) and the model loaders
        tell them: ``eagle3`` (architecture eagle3), ``dflash`` / ``dspark`` (architecture dflash,
        a ``markov_w1`` tensor for DSpark), ``mtp-only`` (NextN layers and no trunk: no
        ``blk.0.attn_norm.weight``, the loaders' ``mtp_only`` test); None for a whole model."""
        if self.architecture == "eagle3":
            return HEAD_EAGLE3
        if self.architecture == "dflash":
            return "dspark" if self.has_tensor("markov_w1.weight") else HEAD_DFLASH
        if self.mtp_layers > 0 and not self.has_tensor("blk.0.attn_norm.weight"):
            return HEAD_MTP_ONLY
        return None

    @property
    def target_layers(self) -> list[int]:
        """The target layers whose hidden rows an EAGLE-3 or DFlash head reads
        (``{arch}.target_layers``)."""
        ids = self.arch_key("target_layers")
        return [] if ids is None else [int(x) for x in ids]

    @property
    def expected_size(self) -> int | None:
        """Smallest file size that holds every tensor, or None if a type is unknown."""
        end = 0
        for t in self.tensors:
            nb = t.nbytes
            if nb is None:
                return None
            end = max(end, t.offset + nb)
        return self.data_offset + end

    @property
    def n_params(self) -> int:
        total = 0
        for t in self.tensors:
            n = 1
            for d in t.shape:
                n *= d
            total += n
        return total


def unloadable(h: GGUFHeader) -> str | None:
    """Why this llama.cpp cannot generate text with the model whose header this is (an
    architecture it does not know, such as a vision projector's; no tokenizer), or None."""
    if h.architecture not in LLAMA_ARCHITECTURES:
        return (f"architecture '{h.architecture}' is not one this llama.cpp can load"
                + (" (a vision projector, not a model)" if h.architecture == "clip" else ""))
    if "tokenizer.ggml.model" not in h.metadata:
        return "its header has no tokenizer (tokenizer.ggml.model)"
    return None

class _Reader:
    """Buffered little-endian reader over a file object; counts bytes consumed."""

    def __init__(self, f: BinaryIO, chunk: int = 1 << 20):
        self.f = f
        self.buf = b""
        self.pos = 0  # position in buf
        self.consumed = 0  # bytes consumed from the stream start
        self.chunk = chunk

    def read(self, n: int) -> bytes:
        if self.pos + n > len(self.buf):
            rest = self.buf[self.pos:]
            need = n - len(rest)
            more = self.f.read(max(need, self.chunk))
            if more is None or len(more) < need:
                raise EOFError
            self.buf = rest + more
            self.pos = 0
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        self.consumed += n
        return out

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        if n > 1 << 24:
            raise ValueError(f"string of {n} bytes")
        return self.read(n).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALAR:
            return self.unpack(_SCALAR[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype = self.unpack("<I")
            count = self.unpack("<Q")
            if count > 1 << 28:
                raise ValueError(f"array of {count} elements")
            if etype in _NP:
                dt = np.dtype(_NP[etype])
                return np.frombuffer(self.read(count * dt.itemsize), dtype=dt)
            if etype == _STRING:
                # fast path for big token lists: read lengths and bytes from the buffer
                out = []
                for _ in range(count):
                    out.append(self.string())
                return out
            return [self.value(etype) for _ in range(count)]
        raise ValueError(f"unknown GGUF value type {vtype}")


def read_header(f: BinaryIO, name: str = "<stream>") -> GGUFHeader:
    """Parse a GGUF header from a binary stream positioned at the start of the file."""
    r = _Reader(f)
    try:
        magic = r.read(4)
        if magic != GGUF_MAGIC:
            raise SpecliError(f"{name}: not a GGUF file (starts with {magic!r}, expected b'GGUF')")
        version = r.unpack("<I")
        if version not in (2, 3):
            raise SpecliError(f"{name}: unsupported GGUF version {version}")
        n_tensors = r.unpack("<Q")
        n_kv = r.unpack("<Q")
        if n_tensors > 1 << 20 or n_kv > 1 << 20:
            raise SpecliError(f"{name}: corrupt GGUF header ({n_tensors} tensors, {n_kv} keys)")
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = r.string()
            vtype = r.unpack("<I")
            meta[key] = r.value(vtype)
        tensors = []
        for _ in range(n_tensors):
            tname = r.string()
            n_dims = r.unpack("<I")
            shape = tuple(r.unpack("<Q") for _ in range(n_dims))
            ttype = r.unpack("<I")
            off = r.unpack("<Q")
            tensors.append(TensorInfo(tname, shape, ttype, off))
    except EOFError:
        raise SpecliError(f"{name}: truncated GGUF file (the header ends early); download it again") from None
    except (ValueError, UnicodeDecodeError, struct.error) as e:
        raise SpecliError(f"{name}: corrupt GGUF header ({e})") from None
    align = int(meta.get("general.alignment", 32))
    data_offset = (r.consumed + align - 1) // align * align
    return GGUFHeader(version, meta, tensors, data_offset)


def read_gguf(path: str | os.PathLike, check_size: bool = True) -> GGUFHeader:
    """Read and validate a local GGUF file's header; raise SpecliError with one line on bad input.
    Parsed once per file version (a 150k-token vocabulary takes a quarter of a second)."""
    p = os.fspath(path)
    if not os.path.exists(p):
        raise SpecliError(f"model file not found: {p}")
    if os.path.isdir(p):
        raise SpecliError(f"model path is a directory, not a GGUF file: {p}")
    st = os.stat(p)
    return _read_gguf_cached(p, st.st_size, st.st_mtime_ns, check_size)


@functools.lru_cache(maxsize=16)
def _read_gguf_cached(p: str, size: int, mtime_ns: int, check_size: bool) -> GGUFHeader:
    try:
        with open(p, "rb") as f:
            h = read_header(io.BufferedReader(f, 1 << 20), name=p)
    except OSError as e:
        raise SpecliError(f"cannot read {p}: {e.strerror or e}") from None
    h.path = p
    if check_size:
        exp = h.expected_size
        size = os.path.getsize(p)
        if exp is not None and size < exp:
            raise SpecliError(
                f"{p}: truncated GGUF file ({size:,} bytes, its tensors need {exp:,}); download it again")
    return h


@dataclass(frozen=True)
class VocabInfo:
    """What llama.cpp compares to decide whether two models can share drafted tokens."""

    vocab_type: str
    n_tokens: int
    bos: int | None
    eos: int | None
    add_bos: bool | None
    add_eos: bool | None
    tokens: tuple[str, ...] = field(repr=False, default=())


def vocab_from_header(h: GGUFHeader) -> VocabInfo:
    model = str(h.get("tokenizer.ggml.model", "none"))
    tokens = h.get("tokenizer.ggml.tokens", [])

    def opt_int(k):
        v = h.get(k)
        return None if v is None else int(v)

    def opt_bool(k):
        v = h.get(k)
        return None if v is None else bool(v)

    return VocabInfo(
        vocab_type=VOCAB_TYPES.get(model, model.upper()),
        n_tokens=len(tokens),
        bos=opt_int("tokenizer.ggml.bos_token_id"),
        eos=opt_int("tokenizer.ggml.eos_token_id"),
        add_bos=opt_bool("tokenizer.ggml.add_bos_token"),
        add_eos=opt_bool("tokenizer.ggml.add_eos_token"),
        tokens=tuple(tokens),
    )


def head_fit(target: GGUFHeader, head: GGUFHeader) -> list[tuple[bool, str, str]]:
    """Does this drafting head (``head.head_kind``) fit this target, from the headers alone:
    (ok, rule, detail) per rule, in the checks llama.cpp makes when it builds the drafter (it
    aborts the process on some; specli refuses first). The tokenizer is checked separately
    (:mod:`specli.resolve.vocab`)."""
    kind = head.head_kind
    t_embd, h_embd = target.arch_key("embedding_length"), head.arch_key("embedding_length")
    t_layers = int(target.arch_key("block_count", 0) or 0) - target.mtp_layers
    rules: list[tuple[bool, str, str]] = []
    if kind == HEAD_MTP_ONLY:
        rules.append((head.architecture == target.architecture, "architecture",
                      f"head {head.architecture}, target {target.architecture}"))
        rules.append((t_embd == h_embd, "hidden size", f"head reads rows of {h_embd}, the target's are {t_embd}"))
        n_trunk = int(head.arch_key("block_count", 0) or 0) - head.mtp_layers
        rules.append((n_trunk == t_layers, "layers", f"head placed after layer {n_trunk}, the target has {t_layers}"))
        graph = "has" if head.architecture in MTP_ARCHITECTURES else "has no"
        rules.append((graph == "has", "MTP graph", f"this llama.cpp {graph} MTP graph for {head.architecture}"))
    elif kind in (HEAD_EAGLE3, HEAD_DFLASH, "dspark"):
        rows = "exports" if target.architecture in LAYER_INPUT_ARCHITECTURES else "cannot export"
        rules.append((rows == "exports", "layer rows",
                      f"this llama.cpp {rows} the layer rows of a {target.architecture} target"))
        want = head.arch_key("target_hidden_size") if kind == HEAD_EAGLE3 else h_embd
        rules.append((want == t_embd, "hidden size", f"head reads rows of {want}, the target's are {t_embd}"))
        ids = head.target_layers
        ok = bool(ids) and all(0 <= i < t_layers or (i == t_layers and target.mtp_layers) for i in ids)
        rules.append((ok, "target layers", f"head reads layers {ids}, the target has {t_layers}"))
        n_t = len(target.get("tokenizer.ggml.tokens") or [])
        if kind == HEAD_EAGLE3:
            rules.append((len(ids) == 3, "extract layers", f"EAGLE-3 reads exactly 3 layers, this head {len(ids)}"))
        else:  # the block is [last token, mask x (block - 1)], embedded by the target's token_embd
            mask = head.get("tokenizer.ggml.mask_token_id")
            detail = "the head names none" if mask is None else f"token {mask}, the target's vocabulary has {n_t}"
            rules.append((mask is not None and 0 <= int(mask) < n_t, "mask token", detail))
        d2t = next((t for t in head.tensors if t.name == "d2t"), None)
        if d2t is not None:
            rules.append((d2t.shape[0] <= n_t, "draft vocabulary",
                          f"d2t maps {d2t.shape[0]} draft tokens into the target's {n_t}"))
    return rules
