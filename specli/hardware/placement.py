"""Where the chosen models go, decided before anything loads: the hardware plan for a
:class:`~specli.resolve.choose.Choice` (from the GGUF headers, the GPU budget and the
context), the layers each model puts on the GPU, and the drafter as placed (the GPU may not
hold a draft model too; ``--parallel``'s slots draft with a draft model or prompt lookup
only). The session (:mod:`specli.session`) then loads what is placed here."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace

from specli.hardware import calibrate
from specli.hardware.devices import Hardware, detect
from specli.hardware.plan import (
    ModelMemory,
    Plan,
    available_ram,
    check_host_memory,
    derived_memory,
    make_plan,
    memory_from_header,
)
from specli.options import Options
from specli.resolve import derive
from specli.resolve.choose import Choice, DraftPlan
from specli.resolve.gguf_header import read_gguf
from specli.speculate.registry import DraftKind, mode_for
from specli.speculate.settings import N_CTX


def plan_for(opts: Options, target_path: str, draft: DraftPlan,
             hardware: Hardware | None = None) -> tuple[Plan, Hardware, int]:
    """The hardware plan for these models and options, from the headers alone (``hardware``:
    what :func:`~specli.hardware.devices.detect` finds, unless given)."""
    th = read_gguf(target_path)
    dpath = draft.draft_path
    # a drafting head counts as a draft model does: its weights, its context's KV, its buffers
    # (placed with the target: it reads the target's state, so it never runs on the CPU alone)
    dh = read_gguf(dpath or draft.head) if dpath or draft.head else None
    n_ctx_train = int(th.arch_key("context_length", N_CTX) or N_CTX)
    n_ctx = min(opts.n_ctx, n_ctx_train) if opts.n_ctx > 0 else n_ctx_train
    hw = hardware or detect(opts.vram)
    pays = bool(dpath) and calibrate.draft_on_cpu_pays(
        target_path, dpath, opts.threads or os.cpu_count() or 1, min(512, n_ctx), opts.spec.draft_max)
    kv_ctx = n_ctx * max(1, opts.parallel)  # the KV cache of every slot, each n_ctx tokens
    tmem = memory_from_header(th, name="target")
    args = (tmem, memory_from_header(dh, name="draft" if dpath else "head") if dh else None,
            hw.budget, kv_ctx, hw.can_offload or hw.budget_source in ("--vram", "SPECLI_VRAM"), bool(pays))
    plan = make_plan(*args, wants_draft=draft.kind.value)
    if plan.branch == "target-gpu-lookup" and dpath and not draft.label:
        plan = own_fallback(opts, target_path, plan, lambda own: make_plan(*args, wants_draft=draft.kind.value,
                                                                            own=own))
    return plan, hw, n_ctx


def own_fallback(opts: Options, target_path: str, plan: Plan, replan: Callable[[ModelMemory], Plan]) -> Plan:
    """The VRAM fallback's middle step: the GPU holds the target but not the draft model beside
    it, so before prompt lookup, the draft ``--draft auto`` would derive from the target's own
    layers (early-exit, layer-skip), taken only where it is measured to pay (the same gate,
    :func:`specli.measure.selfpick.paying`) and fits beside the target (its kept blocks and
    output matrix, :func:`~specli.hardware.plan.derived_memory`)."""
    from specli.measure import selfpick  # loads models only here, where memory is short

    th = read_gguf(target_path)
    if not selfpick.derivable(th):
        return plan
    lay = selfpick.paying(target_path, opts.spec, opts.threads)
    if lay is None:
        return replace(plan, summary=plan.summary + " (no draft derived from its own layers pays here, measured)")
    plan = replan(derived_memory(memory_from_header(th), lay.kept, lay.label))
    if plan.own_label:
        path, _ = derive.derive(target_path, lay, opts.threads)
        plan = replace(plan, own_path=path)
    return plan


def gpu_layers(opts: Options, plan: Plan) -> tuple[int, int]:
    """(target, draft) layers on the GPU: what the user typed, else the plan's."""
    target = plan.target_gpu_layers if opts.gpu_layers is None else opts.gpu_layers
    if opts.draft_gpu_layers is not None:
        return target, opts.draft_gpu_layers
    return target, plan.draft_gpu_layers if opts.gpu_layers is None else opts.gpu_layers


def for_slots(draft: DraftPlan, parallel: int, notes: list[str]) -> DraftPlan:
    """The drafter every slot of ``--parallel N`` builds: a drafting head (MTP, EAGLE-3,
    DFlash) drafts from one sequence's hidden states, so the slots draft with prompt lookup
    instead; a draft model and prompt lookup draft per slot as they are."""
    head = draft.kind.entry.paid
    if parallel <= 1 or head in (None, DraftKind.MODEL):
        return draft
    notes.append(f"--parallel {parallel}: {head} drafts from one sequence's hidden states; "
                 "drafting with prompt lookup instead")
    return DraftPlan(mode_for(DraftKind.LOOKUP, draft.mode.adaptive))


@dataclass(frozen=True)
class Footprint:
    """Bytes per part in host memory (``host``) and on the GPU (``gpu``), keyed by what the part
    is: a model file's weights by its path, a context's KV cache and buffers by its own key."""

    host: dict[str, int]
    gpu: dict[str, int]

    def add(self, mem: ModelMemory, path: str, n_gpu_layers: int, n_ctx: int, state: str) -> None:
        """A model of ``path`` with ``n_gpu_layers`` on the GPU and a context of ``n_ctx``
        tokens: its weights under ``path``, its KV cache and buffers added under ``state``."""
        full = n_gpu_layers < 0 or n_gpu_layers > mem.n_layer  # ModelMemory's rule: buffers on the GPU
        gpu_total, host_total = mem.gpu_bytes(n_gpu_layers, n_ctx), mem.cpu_bytes(n_gpu_layers, n_ctx)
        gpu_w = mem.gpu_bytes(n_gpu_layers, 0) - mem.compute() if gpu_total else 0
        host_w = mem.cpu_bytes(n_gpu_layers, 0) - (0 if full else mem.compute())
        for where, w, total in ((self.gpu, gpu_w, gpu_total), (self.host, host_w, host_total)):
            if w:
                where[path] = w
            if total - w:
                where[state] = where.get(state, 0) + total - w


@dataclass(frozen=True)
class Placement:
    """A choice, placed: the hardware plan, the drafter that runs and the layers each model
    puts on the GPU. Everything a session needs before it loads a byte."""

    choice: Choice
    plan: Plan
    hardware: Hardware
    n_ctx: int  # the plan's context per slot (the target's own when --ctx is 0 or larger)
    draft: DraftPlan  # what drafts, as placed
    target_gpu_layers: int
    draft_gpu_layers: int

    @property
    def target(self) -> str:
        return self.choice.target

    def footprint(self, parallel: int = 1) -> Footprint:
        """The bytes this placement holds once loaded, per part, in host and GPU memory (from the
        headers: the plan's own estimate): each model file's weights keyed by its path, so
        placements that share a file can count it once, and the contexts' KV caches and buffers
        keyed by the target's path and ``#state`` (``parallel`` sequences of ``n_ctx`` tokens)."""
        fp = Footprint({}, {})
        kv_ctx = self.n_ctx * max(1, parallel)
        state = f"{self.target}#state"
        fp.add(memory_from_header(read_gguf(self.target)), self.target, self.target_gpu_layers, kv_ctx, state)
        if self.draft.draft_path:
            fp.add(memory_from_header(read_gguf(self.draft.draft_path)), self.draft.draft_path,
                   self.draft_gpu_layers, kv_ctx, state)
        if self.draft.head:  # placed as the target: it reads the target's state
            fp.add(memory_from_header(read_gguf(self.draft.head)), self.draft.head, self.target_gpu_layers,
                   kv_ctx, state)
        return fp

    def report(self) -> dict:
        """Where each model runs, for reports (run --json, bench)."""
        hw = self.hardware
        return {"backends": list(hw.backends), "gpu_offload": hw.can_offload,
                "devices": [d.name for d in hw.devices],
                "budget": hw.budget, "budget_source": hw.budget_source,
                "target_gpu_layers": self.target_gpu_layers,
                "draft_gpu_layers": self.draft_gpu_layers if self.draft.draft_path else None,
                "plan": self.plan.branch, "drafter": self.draft.mode.name}


def place(opts: Options, choice: Choice, hardware: Hardware | None = None) -> Placement:
    """Plan where ``choice``'s models go (its summary a note when there is a GPU budget), what
    drafts as placed, and refuse a target whose CPU part does not fit in host memory, all
    before anything loads."""
    plan, hw, n_ctx = plan_for(opts, choice.target, choice.draft, hardware)
    if hw.budget is not None:
        opts.notes.append(plan.summary)
    draft = for_slots(choice.draft.placed(plan), opts.parallel, opts.notes)
    tngl, dngl = gpu_layers(opts, plan)
    # the part of the target left on the CPU must fit in host memory: refuse before loading
    check_host_memory(memory_from_header(read_gguf(choice.target), name=os.path.basename(choice.target)),
                      tngl, n_ctx * max(1, opts.parallel), *available_ram())
    if tngl == 0 and choice.profile is not None and opts.target in (None, choice.profile.name):  # its own target
        from specli.hardware.advice import cpu_file_line
        if line := cpu_file_line(choice.profile):
            opts.notes.append(line)
    return Placement(choice, plan, hw, n_ctx, draft, tngl, dngl)
