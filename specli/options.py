"""What the user asked for: one record the commands fill from their options, read by each step
that follows it (model choice in :mod:`specli.resolve.choose`, placement in
:mod:`specli.hardware.placement`, the runtime in :mod:`specli.session`). A leaf: it imports
only the settings."""

from __future__ import annotations

from dataclasses import dataclass, field

from specli.speculate.settings import N_CTX, SpecSettings


@dataclass
class Options:
    """What the user asked for (the command line's options, a profile's defaults filling the
    rest). What runs is decided from these once, into a :class:`~specli.resolve.choose.DraftPlan`."""

    target: str | None = None
    draft: str = "auto"  # a model reference, "mtp", "lookup", "auto" or "none"
    profile: str | None = None
    # --lookup/--no-lookup: a draft model, MTP layers or a head also copy from the context
    # (hybrid, mtp-lookup, ...) or draft alone
    lookup: bool = True
    n_ctx: int = N_CTX
    threads: int | None = None
    gpu_layers: int | None = None  # None: the hardware plan decides
    draft_gpu_layers: int | None = None
    vram: str | None = None  # overrides the detected GPU budget (--vram / SPECLI_VRAM)
    spec: SpecSettings = field(default_factory=SpecSettings)
    f32_kv: bool = False
    parallel: int = 1  # sequences (slots) in the target's context, each of n_ctx tokens (serve --parallel)
    given: set[str] = field(default_factory=set)  # options the user typed: a profile does not override them
    notes: list[str] = field(default_factory=list)  # one-line decisions for stderr
