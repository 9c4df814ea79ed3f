"""Where each model goes, decided before anything loads: pure functions of the GGUF headers,
the GPU memory budget, the context size and the backend.

Order of preference: both models fully on the GPU; the target on the GPU and the draft on the
CPU (only when the draft is fast enough there to pay); the target on the GPU with prompt
lookup; part of the target on the GPU with prompt lookup; CPU only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from specli.errors import SpecliError
from specli.resolve.gguf_header import HEAD_MTP_ONLY, GGUFHeader
from specli.util import fmt_size

GiB = 1 << 30
MiB = 1 << 20
_LAYER = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class ModelMemory:
    """Bytes a model needs on the device, from its header."""

    name: str
    n_layer: int
    layer_bytes: tuple[int, ...]  # weights of each repeating layer
    output_bytes: int  # output head and final norm (offloaded with the last layer)
    input_bytes: int  # token embeddings (llama.cpp keeps them in host memory)
    kv_bytes_per_token: int  # all layers, K and V
    n_vocab: int
    n_embd: int
    tied: bool = False  # no output tensor: the output head is token_embd (a copy of it on a device)

    @property
    def weights(self) -> int:
        return sum(self.layer_bytes) + self.output_bytes + self.input_bytes

    def kv(self, n_ctx: int) -> int:
        return self.kv_bytes_per_token * n_ctx

    def compute(self, n_batch: int = 512) -> int:
        """Compute and output buffers: a batch of f32 logits and activations, plus one output
        row and a 16 MiB margin (llama.cpp reports 302.75 + 0.58 MiB for Qwen2.5 1.5B at 512)."""
        return n_batch * (self.n_vocab * 4 + self.n_embd * 8) + self.n_vocab * 4 + 16 * MiB

    def gpu_bytes(self, n_gpu_layers: int, n_ctx: int, n_batch: int = 512) -> int:
        """Device memory for ``n_gpu_layers`` offloaded layers (-1 or > n_layer: everything)."""
        n = self.n_layer if n_gpu_layers < 0 or n_gpu_layers > self.n_layer else n_gpu_layers
        if n == 0:
            return 0
        full = n_gpu_layers < 0 or n_gpu_layers > self.n_layer
        w = sum(self.layer_bytes[self.n_layer - n:]) + (self.output_bytes if full else 0)
        kv = self.kv_bytes_per_token * n_ctx * n // self.n_layer
        return w + kv + self.compute(n_batch)

    def cpu_bytes(self, n_gpu_layers: int, n_ctx: int, n_batch: int = 512) -> int:
        """Host memory for what stays on the CPU with ``n_gpu_layers`` offloaded: the token
        embeddings (always), the layers left and their KV, and, unless everything is offloaded,
        the output head (a tied one is the embeddings themselves) and the compute buffers."""
        full = n_gpu_layers < 0 or n_gpu_layers > self.n_layer
        left = 0 if full else self.n_layer - max(0, n_gpu_layers)
        head = 0 if full else self.output_bytes - (self.input_bytes if self.tied else 0)
        kv = self.kv_bytes_per_token * n_ctx * left // self.n_layer
        return self.input_bytes + sum(self.layer_bytes[:left]) + head + kv + (0 if full else self.compute(n_batch))


def memory_from_header(h: GGUFHeader, kv_type_bytes: float = 2.0, name: str = "") -> ModelMemory:
    """A model's memory from its header; a drafting head's too (EAGLE-3, DFlash: its layers and
    its own context's KV; it borrows the target's embeddings and output where it has none; an
    MTP-only head: its MTP layers and their KV, ``block_count`` counting the trunk it lacks)."""
    n_layer = int(h.arch_key("block_count", 0) or 0)
    if n_layer <= 0:
        raise SpecliError(f"{name or h.path}: the GGUF header has no block_count; cannot plan memory")
    layers = [0] * n_layer
    out = inp = 0
    for t in h.tensors:
        nb = t.nbytes
        if nb is None:  # planning with 0 bytes for it would put too much on the GPU
            raise SpecliError(f"{name or h.path}: tensor {t.name} has ggml type {t.type_name}, whose size the "
                              "installed gguf package does not know; cannot plan memory (upgrade gguf)")
        m = _LAYER.match(t.name)
        if m and int(m.group(1)) < n_layer:
            layers[int(m.group(1))] += nb
        elif t.name.startswith("token_embd"):
            inp += nb
        else:
            out += nb
    tied = not any(t.name.startswith("output.") for t in h.tensors)
    if tied:
        out += inp  # tied embeddings: the output head is a copy of token_embd on the device
    n_embd = int(h.arch_key("embedding_length", 0) or 0)
    n_head = int(h.arch_key("attention.head_count", 1) or 1)
    n_head_kv = h.arch_key("attention.head_count_kv", n_head)
    if hasattr(n_head_kv, "__len__"):  # per-layer head counts
        n_head_kv = max(int(x) for x in n_head_kv)
    n_head_kv = int(n_head_kv)
    k_len = int(h.arch_key("attention.key_length", n_embd // max(n_head, 1)) or 0)
    v_len = int(h.arch_key("attention.value_length", n_embd // max(n_head, 1)) or 0)
    kv_layers = h.mtp_layers if h.head_kind == HEAD_MTP_ONLY else n_layer  # an MTP context caches those alone
    kv_tok = int(kv_layers * n_head_kv * (k_len + v_len) * kv_type_bytes)
    n_vocab = len(h.get("tokenizer.ggml.tokens", [])) or int(h.arch_key("vocab_size", 32000) or 32000)
    return ModelMemory(name or str(h.get("general.name", "model")), n_layer, tuple(layers), out, inp, kv_tok,
                       n_vocab, n_embd, tied)


def derived_memory(target: ModelMemory, kept: Sequence[int], name: str) -> ModelMemory:
    """A draft derived from ``target`` keeping its blocks ``kept`` (early-exit, layer-skip): those
    blocks' weights, the target's embeddings, final norm and output matrix (a copy: the derived
    file holds them too), and the KV cache of the kept layers alone."""
    return replace(target, name=name, n_layer=len(kept), layer_bytes=tuple(target.layer_bytes[i] for i in kept),
                   kv_bytes_per_token=target.kv_bytes_per_token * len(kept) // target.n_layer)


@dataclass(frozen=True)
class Plan:
    target_gpu_layers: int  # -1: all
    # what drafts, as specli.speculate.registry.DraftKind names it: the kind asked for, or
    # "lookup" where the draft model it needs does not fit
    draft: str
    draft_gpu_layers: int
    branch: str  # which rule decided
    summary: str  # one line for stderr
    # the VRAM fallback's draft derived from the target (branch "target-gpu-own"): its label
    # (early-exit:E, layer-skip:SET) and, once derived, its file (specli.hardware.placement)
    own_label: str = ""
    own_path: str = ""


def make_plan(target: ModelMemory, draft: ModelMemory | None, budget: int | None, n_ctx: int,
              can_offload: bool, draft_cpu_pays: bool = False, n_batch: int = 512,
              wants_draft: str = "model", own: ModelMemory | None = None) -> Plan:
    """``budget``: free device memory in bytes (None: no GPU). ``draft``: the draft model, when
    the kind asked for (``wants_draft``: "model", "hybrid", "lookup", "mtp", "none", ...)
    drafts with one. ``draft_cpu_pays``: the draft model measured fast enough on the CPU to
    help a target on the GPU. ``own``: a draft derived from the target's own layers
    (:func:`derived_memory`, measured to pay), which drafts in the draft model's place where
    the target and it fit on the GPU and the draft model does not."""
    dmode = wants_draft
    if not can_offload or budget is None or budget <= 0:
        why = "no GPU offload in this llama.cpp build" if not can_offload else "no GPU found"
        return Plan(0, dmode, 0, "cpu", f"{why}: everything on the CPU")
    t_full = target.gpu_bytes(-1, n_ctx, n_batch)
    t_w = target.gpu_bytes(-1, 0, n_batch) - target.compute(n_batch)
    t_kv = target.kv(n_ctx)
    if draft is not None:
        d_full = draft.gpu_bytes(-1, n_ctx, n_batch)
        d_w = draft.gpu_bytes(-1, 0, n_batch) - draft.compute(n_batch)
        need = t_full + d_full
        parts = (f"target {fmt_size(t_w)} + {draft.name} {fmt_size(d_w)} + KV {fmt_size(t_kv + draft.kv(n_ctx))} "
                 f"+ buffers {fmt_size(target.compute(n_batch) + draft.compute(n_batch))}")
        if need <= budget:
            return Plan(-1, dmode, -1, "both-gpu",
                        f"{parts} = {fmt_size(need)} <= {fmt_size(budget)} free: both on the GPU")
        if t_full <= budget and draft_cpu_pays:
            return Plan(-1, dmode, 0, "draft-cpu",
                        f"{parts} > {fmt_size(budget)} free: target on the GPU, draft on the CPU (fast enough there)")
        if t_full <= budget:
            return _own_or_lookup(target, own, budget, n_ctx, n_batch, dmode, f"{parts} > {fmt_size(budget)} free")
    elif t_full <= budget:
        return Plan(-1, dmode, 0, "target-gpu",
                    f"target {fmt_size(t_w)} + KV {fmt_size(t_kv)} = {fmt_size(t_full)} <= {fmt_size(budget)} free: "
                    "target on the GPU")
    # the target does not fit whole: offload as many layers as fit, draft with lookup
    n = target.n_layer
    while n > 0 and target.gpu_bytes(n, n_ctx, n_batch) > budget:
        n -= 1
    fallback = "lookup" if draft is not None else dmode
    if n > 0:
        return Plan(n, fallback, 0, "partial-lookup",
                    f"target {fmt_size(t_full)} > {fmt_size(budget)} free: "
                    f"{n}/{target.n_layer} target layers on the GPU"
                    + (", using prompt lookup" if fallback == "lookup" else ""))
    return Plan(0, fallback, 0, "cpu-lookup",
                f"not even one target layer fits in {fmt_size(budget)} free: everything on the CPU"
                + (", using prompt lookup" if fallback == "lookup" else ""))


def _own_or_lookup(target: ModelMemory, own: ModelMemory | None, budget: int, n_ctx: int, n_batch: int,
                   dmode: str, why: str) -> Plan:
    """The target fits on the GPU, the draft model beside it does not: the draft derived from
    the target's own layers (``own``) where it fits beside the target, else prompt lookup."""
    if own is None:
        return Plan(-1, "lookup", 0, "target-gpu-lookup",
                    f"{why}: target on the GPU, using prompt lookup instead of the draft")
    o_w = own.gpu_bytes(-1, 0, n_batch) - own.compute(n_batch)
    need = target.gpu_bytes(-1, n_ctx, n_batch) + own.gpu_bytes(-1, n_ctx, n_batch)
    if need <= budget:
        return Plan(-1, dmode, -1, "target-gpu-own",
                    f"{why}: target on the GPU, drafting with {own.name} from its own layers instead of the draft "
                    f"({own.n_layer}/{target.n_layer} blocks and the output matrix, {fmt_size(o_w)}; "
                    f"{fmt_size(need)} with the target, KV and buffers <= {fmt_size(budget)} free; measured to pay)",
                    own.name)
    return Plan(-1, "lookup", 0, "target-gpu-lookup",
                f"{why}: target on the GPU, using prompt lookup instead of the draft (its own {own.name}, "
                f"{fmt_size(need)} with the target, does not fit either)")


class HostMemoryTooSmall(SpecliError):
    hint = "use a smaller --ctx or a smaller quantisation of the model (e.g. Q4_K_M instead of Q8_0)"

    def __init__(self, name: str, need: int, weights: int, kv: int, available: int, source: str, where: str):
        super().__init__(f"{name} needs {fmt_size(need)} of memory {where} (weights {fmt_size(weights)}, "
                         f"KV cache {fmt_size(kv)}, buffers {fmt_size(need - weights - kv)}), but only "
                         f"{fmt_size(available)} is available ({source})")
        self.need, self.available = need, available


def check_host_memory(target: ModelMemory, n_gpu_layers: int, n_ctx: int, available: int | None,
                      source: str = "", n_batch: int = 512) -> None:
    """Refuse, before anything loads, a target whose CPU part does not fit in ``available``
    bytes of host memory (None: unknown, no check). The GPU part is the plan's business."""
    need = target.cpu_bytes(n_gpu_layers, n_ctx, n_batch)
    if available is None or need <= available:
        return
    full = n_gpu_layers < 0 or n_gpu_layers > target.n_layer
    left = 0 if full else target.n_layer - max(0, n_gpu_layers)
    kv = target.kv_bytes_per_token * n_ctx * left // target.n_layer
    buffers = 0 if full else target.compute(n_batch)
    where = ("on the CPU" if n_gpu_layers == 0 else
             f"for the part left on the CPU ({left}/{target.n_layer} layers)")
    raise HostMemoryTooSmall(target.name, need, need - kv - buffers, kv, available, source,
                             f"{where} at --ctx {n_ctx}")


def available_ram() -> tuple[int | None, str]:
    """Host memory a model may use, and where the figure comes from: SPECLI_RAM (e.g. 8GiB),
    else Linux's MemAvailable (free plus reclaimable cache), else the physical memory; None
    where none of these can be read."""
    if os.environ.get("SPECLI_RAM"):
        return parse_size(os.environ["SPECLI_RAM"]), "SPECLI_RAM"
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "physical memory"
    except (AttributeError, ValueError, OSError):
        return None, ""


_SIZE = re.compile(r"^\s*([\d.]+)\s*([kmgt]i?b?|b)?\s*$", re.I)


def parse_size(text: str) -> int:
    """'6GiB', '6G', '512MiB', '6.5 GB' -> bytes (binary units)."""
    m = _SIZE.match(text or "")
    if not m:
        raise SpecliError(f"cannot read the memory size '{text}' (examples: 6GiB, 512MiB)")
    unit = (m.group(2) or "b").lower()[0]
    mult = {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[unit]
    return int(float(m.group(1)) * mult)
