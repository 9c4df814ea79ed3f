"""Small helpers every layer uses: where specli keeps its files, how a cache record is written,
and how a size is written."""

from __future__ import annotations

import json
import os
from pathlib import Path


def cache_root() -> Path:
    """specli's cache folder: ``$SPECLI_CACHE``, else ``$XDG_CACHE_HOME/specli`` (``~/.cache/specli``).
    It holds the assembled models (``models/``), the calibration and the verified-file records."""
    return Path(os.environ.get("SPECLI_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "specli"))


def cache_dir() -> Path:
    """Where models fetched from wheels are assembled."""
    return cache_root() / "models"


def store_json(path: Path, obj, indent: int | None = None) -> None:
    """A cache record written whole or not at all (a temporary file, then renamed); a full or
    read-only disk only costs computing the record again next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(obj, indent=indent))
        os.replace(tmp, path)
    except OSError:
        pass


def fmt_size(n: int) -> str:
    """Bytes for people: GiB from one GiB up, MiB below (binary units, as ``--vram`` takes them)."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
