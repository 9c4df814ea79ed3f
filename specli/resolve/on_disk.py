"""The models on disk that a run takes without being told: a profile's target or draft found by
its pinned SHA-256, and ``--draft auto``'s pick among the local models (:mod:`specli.resolve.local`)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from specli.errors import SpecliError
from specli.resolve import integrity
from specli.resolve.gguf_header import HEAD_NAMES, GGUFHeader
from specli.resolve.local import auto_pick, disk_size, drafts_for, heads_for, scan, summarise
from specli.resolve.profiles import ModelSpec, Profile, load_all


def sha256_of(path: str) -> str:
    """A file's SHA-256: from its name where its store names blobs by content (Ollama's
    ``sha256-<hex>``, huggingface-hub's blobs), else hashed once per file version and remembered."""
    name = os.path.basename(os.path.realpath(path))
    m = re.fullmatch(r"(?:sha256[-:])?([0-9a-f]{64})", name)
    return m.group(1) if m else integrity.cached_sha256(path)


def _matches(path: str, spec: ModelSpec) -> bool:
    if not spec.sha256:
        return False
    try:
        if spec.size is not None and disk_size(path) != spec.size:
            return False
        return sha256_of(path) == spec.sha256
    except OSError:
        return False


def local_path(ref: str) -> str | None:
    """The local file a reference names (a path, ``ollama:``, ``lmstudio:``), or None."""
    from specli.resolve.models import classify
    try:
        r = classify(ref)
    except SpecliError:
        return None
    return r.path if r.kind == "local" else None


def profile_for(ref: str, notes: list[str] | None = None) -> Profile | None:
    """The profile for a target: by its reference or file name (profiles.for_target), else the
    one whose pinned target has this local file's SHA-256 (its size checked first)."""
    from specli.resolve.profiles import for_target
    path = local_path(ref)
    prof = for_target(ref, path)
    if prof is not None or path is None:
        return prof
    for p in load_all().values():
        if _matches(path, p.target):
            if notes is not None:
                notes.append(f"{ref} is profile {p.name}'s target (SHA-256 {p.target.sha256[:12]}…): "
                             "its drafts and settings apply")
            return p
    return None


def draft_on_disk(tspec: ModelSpec, th: GGUFHeader, prof: Profile | None,
                  note: Callable[[str], None]) -> ModelSpec | None:
    """``--draft auto``'s local step: the profile's draft where a file on disk has its pinned
    SHA-256, else the most suitable compatible model on disk (same tokenizer, at least
    MIN_DRAFT_RATIO times fewer parameters, same family first). ``note`` gets the one line
    saying which and from where. Only files smaller than the target are read."""
    tpath = local_path(tspec.ref)
    limit = disk_size(tpath) if tpath else (th.expected_size or None)
    models = scan(max_size=limit)
    for spec in prof.draft_models if prof else []:
        for m in models:
            if m.ok and _matches(m.path, spec):
                note(f"--draft auto: {m.found.where} ({m.path}): profile {prof.name}'s draft {spec.ref}, "
                     "found on disk (SHA-256 match), hybrid with prompt lookup")
                return ModelSpec((m.path,), spec.sha256, spec.size)
    heads = heads_for(th, tpath, models, note)
    if heads:
        h = heads[0]
        note(f"--draft auto: {h.found.where} ({h.path}), found on disk: {HEAD_NAMES[h.summary.head]} "
             "that fits this target (checked from its header)")
        return ModelSpec((h.path,))
    target = summarise(th)
    best = [p for p in drafts_for(target, tpath, models) if auto_pick(p)]
    if not best:
        return None
    p = best[0]
    family = f", same family ({target.family})" if p.same_family else ""
    note(f"--draft auto: {p.draft.found.where} ({p.draft.path}), found on disk: tokenizer compatible, "
         f"{p.ratio:.1f}x fewer parameters{family}; hybrid with prompt lookup")
    return ModelSpec((p.draft.path,))
