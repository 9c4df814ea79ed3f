"""A draft derived from the target itself (self-speculation from its own layers):
``--draft early-exit[:E]`` keeps the first E blocks, ``--draft layer-skip[:SET]`` keeps all but a
set of middle ones; both keep the embeddings, the final norm and the output matrix, so the
derived GGUF has the target's tokenizer and drafts as any draft model does.

The file is a copy, not a view of the target's weights: llama.cpp's loader refuses a
``block_count`` override on the target's own file (it counts every tensor of the file and
expects the overridden layer count's: "wrong number of tensors"), a monolithic GGUF cannot
serve as a shard of a split load, and a buffer-type override maps tensors to memory, not to
another file (docs/self-speculation.md). It is made by llama.cpp's own pruning
(``llama_model_quantize`` with ``prune_layers`` and ``only_copy``: the blocks renumbered,
``block_count`` updated, every tensor's type kept), except where the target has per-layer
metadata arrays, which that copy does not cut (llama.cpp #27976): then the ``gguf`` writer
copies the file with the arrays cut to the kept layers. Derived files are cached under
``$SPECLI_CACHE/derived`` by the target's SHA-256 and the layers, written to a temporary file
and renamed, so an interrupted derivation leaves nothing half written."""

from __future__ import annotations

import ctypes
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from specli.errors import SpecliError
from specli.resolve.gguf_header import GGUFHeader, read_gguf
from specli.resolve.integrity import cached_sha256
from specli.util import cache_root

EARLY_EXIT, LAYER_SKIP = "early-exit", "layer-skip"
KINDS = (EARLY_EXIT, LAYER_SKIP)
# known LayerSkip checkpoints (facebook/layerskip-*, trained with an early-exit loss) and the
# exit the LayerSkip README and Hugging Face blog run them at
LAYERSKIP_EXITS = {"layerskip-llama3.2-1b": 4, "layerskip-llama3-8b": 4, "layerskip-llama2-7b": 8,
                   "layerskip-llama2-13b": 8, "layerskip-llama2-70b": 10, "layerskip-codellama-7b": 8,
                   "layerskip-codellama-34b": 8}
EXIT_KEY = "early_exit_layer"  # {arch}.early_exit_layer: a model that declares its exit


@dataclass(frozen=True)
class SelfSpec:
    """What ``--draft early-exit[:E]`` / ``layer-skip[:SET]`` asks for (``arg`` None: the
    layers are chosen by measurement, :mod:`specli.measure.selfpick`)."""

    kind: str
    arg: str | None = None


def parse(text: str | None) -> SelfSpec | None:
    """The self-draft a ``--draft`` value names, or None when it names something else."""
    word, sep, arg = (text or "").strip().partition(":")
    if word not in KINDS:
        return None
    if sep and not arg.strip():
        raise SpecliError(f"--draft {text}: give the layers after ':' ({word}:E)" if word == EARLY_EXIT
                          else f"--draft {text}: give the layers after ':' (layer-skip:10-17 or 8,10,12)")
    return SelfSpec(word, arg.strip() or None)


@dataclass(frozen=True)
class Layers:
    """The target's blocks a derived draft drops (``pruned``, ascending) out of ``n_layer``."""

    kind: str
    n_layer: int
    pruned: tuple[int, ...]

    @property
    def kept(self) -> list[int]:
        return [i for i in range(self.n_layer) if i not in self.pruned]

    @property
    def label(self) -> str:
        """The name its modes and reports carry: ``early-exit:E`` or ``layer-skip:SET``."""
        if self.kind == EARLY_EXIT:
            return f"{EARLY_EXIT}:{len(self.kept)}"
        return f"{LAYER_SKIP}:{compact(self.pruned)}"

    @property
    def tag(self) -> str:
        return self.label.replace(":", "-").replace(",", "_")


def compact(ids) -> str:
    """``[8, 10, 11, 12]`` as ``8,10-12``."""
    out, ids = [], sorted(ids)
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(out)


def parse_set(text: str) -> list[int]:
    """``10-17`` or ``8,10,12`` (or both: ``3,5-7``) as a sorted list; garbage is one line."""
    out: set[int] = set()
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m or (m.group(2) and int(m.group(2)) < int(m.group(1))):
            raise SpecliError(f"layer-skip:{text}: name the layers to skip as 10-17 or 8,10,12")
        out.update(range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1))
    return sorted(out)


def n_layers(h: GGUFHeader) -> int:
    return int(h.arch_key("block_count", 0) or 0)


def check_target(h: GGUFHeader, ref: str) -> None:
    """Refuse a target that has its own drafter built in (MTP layers) or is a drafting head."""
    if h.mtp_layers:
        raise SpecliError(f"{ref} carries MTP layers: --draft mtp drafts with them (no derived draft needed)")
    if h.head_kind:
        raise SpecliError(f"{ref} is a drafting head, not a model to derive a draft from")


def layers_for(spec: SelfSpec, h: GGUFHeader, ref: str = "the target") -> Layers:
    """The layers ``spec`` (with its E or SET) keeps of the target ``h``; a wrong one is one line."""
    check_target(h, ref)
    n = n_layers(h)
    word = f"{spec.kind}:{spec.arg}"
    if spec.kind == EARLY_EXIT:
        if not (spec.arg or "").isdigit():
            raise SpecliError(f"--draft {word}: E is a layer count, e.g. early-exit:8")
        e = int(spec.arg)
        if not 1 <= e < n:
            raise SpecliError(f"--draft {word}: {ref} has {n} layers; exit after 1 to {n - 1} of them")
        return Layers(EARLY_EXIT, n, tuple(range(e, n)))
    skip = parse_set(spec.arg or "")
    if n < 3 or skip[0] < 1 or skip[-1] > n - 2:
        raise SpecliError(f"--draft {word}: layer-skip keeps the first and last layers; skip layers 1 to {n - 2} "
                          f"of {ref}'s {n}" if n >= 3 else f"--draft {word}: {ref} has {n} layers, too few to skip")
    lay = Layers(LAYER_SKIP, n, tuple(skip))
    why = pattern_broken(h, lay)
    if why:
        raise SpecliError(f"--draft {word}: {why}")
    return lay


def pattern_broken(h: GGUFHeader, lay: Layers) -> str | None:
    """Why renumbering the kept blocks would change a layer's kind: a hybrid model whose every
    N-th layer attends (``full_attention_interval``) reads each layer's kind from its index."""
    every = int(h.arch_key("full_attention_interval", 0) or 0)
    if every <= 1:
        return None
    kinds = [(old + 1) % every == 0 for old in lay.kept]
    if kinds != [(new + 1) % every == 0 for new in range(len(lay.kept))]:
        return (f"every {every}th layer of this hybrid model attends, by its index; skip whole groups of {every} "
                f"layers (e.g. {every}-{2 * every - 1}) so the kept layers keep their kinds")
    return None


def declared_exit(h: GGUFHeader, path: str) -> int | None:
    """The exit a model declares (``{arch}.early_exit_layer``) or a known LayerSkip checkpoint's
    (by its name or file name), within its layers; None for other models."""
    e = h.arch_key(EXIT_KEY)
    if e is None:
        names = " ".join(str(h.get(k, "")) for k in ("general.name", "general.basename", "general.finetune"))
        names = (names + " " + os.path.basename(path)).lower().replace("_", "-")
        e = next((x for name, x in LAYERSKIP_EXITS.items() if name in names), None)
    return int(e) if e is not None and 1 <= int(e) < n_layers(h) else None


def candidates(kind: str, h: GGUFHeader) -> list[Layers]:
    """The few layer sets measured when none is given: exits at a quarter, half and three
    quarters of the stack; skips of the middle third and of every other layer of the middle
    half (the training-free kind), those a hybrid's layer pattern allows."""
    n = n_layers(h)
    out: list[Layers] = []
    if kind == EARLY_EXIT and n >= 2:
        out = [Layers(EARLY_EXIT, n, tuple(range(e, n))) for e in sorted({max(1, min(n - 1, round(n * f)))
                                                                          for f in (0.25, 0.5, 0.75)})]
    if kind == LAYER_SKIP and n >= 3:
        sets = {tuple(range(max(1, n // 3), max(2, 2 * n // 3))),
                tuple(range(max(1, n // 4), max(2, 3 * n // 4), 2))}
        every = int(h.arch_key("full_attention_interval", 0) or 0)
        if every > 1:  # whole groups of the hybrid pattern from the middle
            g0 = max(1, n // (3 * every))
            sets.add(tuple(range(g0 * every, min(n - 1, (g0 + max(1, n // (3 * every))) * every))))
        out = [Layers(LAYER_SKIP, n, s) for s in sorted(sets) if s and s[-1] <= n - 2]
        out = [lay for lay in out if not pattern_broken(h, lay)]
    return out


# -- the derived file -----------------------------------------------------------------------
def derived_dir() -> Path:
    return cache_root() / "derived"


def derived_path(target: str, lay: Layers) -> Path:
    return derived_dir() / f"{cached_sha256(target)[:16]}-{lay.tag}.gguf"


def derive(target: str, lay: Layers, threads: int | None = None) -> tuple[str, bool]:
    """The draft ``lay`` derives from the target file (cached: ``(path, False)`` when it was
    there already, ``(path, True)`` when derived now)."""
    out = derived_path(target, lay)
    if out.exists():
        return str(out), False
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.stem}-", suffix=".tmp")
    os.close(fd)
    try:
        h = read_gguf(target)
        if per_layer_arrays(h):
            _copy_with_gguf(target, tmp, lay)
        else:
            prune_with_llama(target, tmp, lay, threads)
        got = n_layers(read_gguf(tmp))
        if got != len(lay.kept):
            raise SpecliError(f"deriving {lay.label} from {target} gave {got} layers, not {len(lay.kept)}")
        os.replace(tmp, out)
    except OSError as e:
        raise SpecliError(f"cannot write the derived draft {out}: {e.strerror or e}") from None
    finally:
        Path(tmp).unlink(missing_ok=True)
    return str(out), True


# the keys llama.cpp reads as one value per layer (get_key_or_arr / get_arr with n_layer in
# src/llama-model.cpp and src/models/*.cpp); rope.dimension_sections, say, is not one
PER_LAYER_KEYS = ("feed_forward_length", "attention.head_count", "attention.head_count_kv", "expert_used_count",
                  "expert_feed_forward_length", "attention.sliding_window_pattern", "attention.recurrent_layers",
                  "swiglu_clamp_exp", "swiglu_clamp_shexp", "ple.layer_multipliers")


def per_layer_arrays(h: GGUFHeader) -> list[str]:
    """The target's per-layer metadata arrays (:data:`PER_LAYER_KEYS` given as arrays of
    ``block_count`` values): what a pruned copy must cut to the kept layers."""
    n = n_layers(h)
    return [f"{h.architecture}.{k}" for k in PER_LAYER_KEYS
            if not isinstance(v := h.arch_key(k), (str, bytes, int, float, type(None))) and len(v) == n]


def prune_with_llama(src: str, dst: str, lay: Layers, threads: int | None) -> None:
    """llama.cpp's own pruning: ``llama_model_quantize`` copying every tensor as it is
    (``only_copy``) but the pruned blocks', the rest renumbered, ``block_count`` updated."""
    import llama_cpp as L

    from specli.engine.binding import ready

    ready()
    p = L.llama_model_quantize_default_params()
    p.only_copy = True
    p.nthread = threads or 0
    prune = (ctypes.c_int32 * (len(lay.pruned) + 1))(*lay.pruned, -1)  # -1 ends the list
    p.prune_layers = ctypes.cast(prune, ctypes.POINTER(ctypes.c_int32))
    rc = L.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p))
    if rc != 0:
        raise SpecliError(f"llama.cpp could not derive {lay.label} from {src} (llama_model_quantize returned {rc})")


def _copy_with_gguf(src: str, dst: str, lay: Layers) -> None:
    """The ``gguf`` writer's copy: the kept blocks renumbered, ``block_count`` and every
    per-layer array cut to the kept layers, the other keys and tensors as they are."""
    import gguf

    reader = gguf.GGUFReader(src)
    arch = str(reader.fields["general.architecture"].contents())
    new_id = {old: new for new, old in enumerate(lay.kept)}
    n = lay.n_layer
    cut = {f"{arch}.{k}" for k in PER_LAYER_KEYS}
    writer = gguf.GGUFWriter(dst, arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == f"{arch}.block_count":
            value = len(lay.kept)
        elif field.name in cut and isinstance(value, list) and len(value) == n:
            value = [value[i] for i in lay.kept]
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
    kept = []
    for t in reader.tensors:
        m = re.match(r"blk\.(\d+)\.", t.name)
        if m and int(m.group(1)) not in new_id:
            continue
        name = f"blk.{new_id[int(m.group(1))]}.{t.name[m.end():]}" if m else t.name
        kept.append((name, t))
        writer.add_tensor_info(name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, t in kept:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()
