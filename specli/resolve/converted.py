"""Converted copies of draft models: the same weights requantised by llama.cpp's own quantizer
(``llama_model_quantize``, requantising allowed, every matrix one type) into a type whose
kernels run fast on this CPU. A draft never changes the target's text, so a draft in another
quant is free to choose; a target is never converted (another file is another model).

A copy lives in specli's cache, named by its source's SHA-256 and its type, written under a
temporary name and renamed into place once complete. It is made only when the user asks
(``specli convert-draft``); ``--draft auto`` then uses it in place of its source."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from specli.errors import SpecliError
from specli.resolve import integrity
from specli.util import cache_root

DEFAULT_TYPE = "Q4_0"


def folder() -> Path:
    return cache_root() / "converted-drafts"


def _name(sha256: str, type_name: str, src: str) -> str:
    stem = os.path.basename(src).removesuffix(".gguf")
    return f"{sha256[:16]}-{type_name}-{stem}.gguf"


def existing(src: str, type_name: str | None = None, sha256: str | None = None) -> Path | None:
    """The converted copy of ``src`` (as ``type_name``; any type when None, DEFAULT_TYPE first),
    when one was made; None otherwise. The source is hashed (once per version of the file)
    only when some copy exists."""
    d = folder()
    if not any(d.glob(f"*-{type_name or '*'}-*.gguf")):
        return None
    sha = sha256 or integrity.cached_sha256(src)
    found = sorted(d.glob(f"{sha[:16]}-{type_name or '*'}-*.gguf"),
                   key=lambda p: (not p.name.startswith(f"{sha[:16]}-{DEFAULT_TYPE}-"), p.name))
    return found[0] if found else None


def convert(src: str, type_name: str = DEFAULT_TYPE, threads: int | None = None,
            progress: Callable[[str], None] | None = None, sha256: str | None = None) -> tuple[Path, bool]:
    """``src`` requantised so that every matrix is ``type_name``, in the cache; (its path,
    whether it was made now). A copy made before is reused."""
    from specli.hardware import kernel_models
    from specli.resolve.gguf_header import read_gguf

    if type_name not in kernel_models.FTYPES:
        raise SpecliError(f"cannot convert to {type_name}: one of {', '.join(kernel_models.FTYPES)}")
    if not os.path.isfile(src):
        raise SpecliError(f"{src}: not a file")
    sha = sha256 or integrity.cached_sha256(src)
    out = folder() / _name(sha, type_name, src)
    if out.exists():
        return out, False
    out.parent.mkdir(parents=True, exist_ok=True)
    if progress:
        progress(f"converting {os.path.basename(src)} to {type_name} with llama.cpp's quantizer ...")
    try:
        kernel_models.quantize(Path(src), out, type_name, threads)
    except RuntimeError as e:
        raise SpecliError(f"{os.path.basename(src)}: {e}") from None
    mats = [t.type_name for t in read_gguf(str(out)).tensors if len([d for d in t.shape if d > 1]) >= 2]
    if type_name not in mats:  # (llama.cpp falls back only for matrices whose rows the type cannot split)
        out.unlink()
        raise SpecliError(f"llama.cpp's quantizer gave no {type_name} matrix for {os.path.basename(src)}")
    return out, True
