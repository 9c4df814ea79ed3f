"""References to models in other tools' stores: ``ollama:NAME[:TAG]`` and
``lmstudio:PUBLISHER/REPO[/FILE]``, found among what :func:`specli.resolve.stores.discover`
lists, the nearest names named when nothing matches."""

from __future__ import annotations

import difflib
import os

from specli.errors import SpecliError
from specli.resolve.stores import LABELS, SCHEMES, Found, discover, parse_ollama_name, roots


def nearest(name: str, names: list[str], n: int = 8) -> list[str]:
    """The names most like ``name``, nearest first."""
    low = name.lower()
    return sorted(set(names), key=lambda x: (-difflib.SequenceMatcher(None, low, x.lower()).ratio(), x))[:n]


def _unknown(ref: str, store: str, names: list[str]) -> SpecliError:
    where = ", ".join(str(r) for s, r in roots() if s == store)
    if not names:
        return SpecliError(f"{ref}: no {LABELS[store]} models found (searched {where})")
    near = nearest(ref.split(":", 1)[1], names)
    more = f" (and {len(set(names)) - len(near)} more)" if len(set(names)) > len(near) else ""
    return SpecliError(f"{ref}: no such {LABELS[store]} model; it has: {', '.join(near)}{more}")


def find(ref: str) -> Found:
    """The store entry an ``ollama:NAME[:TAG]`` or ``lmstudio:PUBLISHER/REPO[/FILE]`` reference
    names; one line naming what exists (nearest names first) when nothing matches."""
    scheme, _, name = ref.partition(":")
    scheme = scheme.lower()
    if not name:
        form = "NAME[:TAG]" if scheme == "ollama" else "PUBLISHER/REPO[/FILE]"
        raise SpecliError(f"'{ref}' names no model: write {scheme}:{form}")
    found = discover(scheme)
    if scheme == "ollama":
        models = [f for f in found if _ollama_key(f.name)]
        want = parse_ollama_name(name)
        hits = [f for f in models if _ollama_key(f.name) == want]
    else:
        models = [f for f in found if not os.path.isabs(f.name)]
        parts = name.strip("/").split("/")
        if len(parts) not in (2, 3):
            raise SpecliError(f"{ref}: name a model as lmstudio:PUBLISHER/REPO[/FILE]")
        low = "/".join(parts).lower()
        hits = [f for f in models if f.name.lower() == low] if len(parts) == 3 else \
            [f for f in models if f.name.lower().rsplit("/", 1)[0] == low]
        if len(hits) > 1:
            files = ", ".join(f"lmstudio:{f.name}" for f in hits)
            raise SpecliError(f"{ref}: {len(hits)} GGUF files there; name one: {files}")
    if not hits:
        raise _unknown(ref, scheme, [f.name for f in models])
    return hits[0]


def is_ref(ref: str) -> bool:
    """An ``ollama:`` or ``lmstudio:`` reference."""
    return ref.lower().startswith(SCHEMES)


def name_of(ref: str) -> str:
    """The store's own name for the model a reference names (``ollama:qwen`` -> ``qwen:latest``)."""
    return find(ref).name


def _ollama_key(name: str) -> tuple[str, str, str, str] | None:
    try:
        return parse_ollama_name(name)
    except SpecliError:
        return None


def locate(ref: str) -> str:
    """The GGUF file an ``ollama:`` / ``lmstudio:`` reference names, used in place; one line
    naming the model and why when it is not a GGUF this llama.cpp can load (read from its
    header, before any weights load)."""
    from specli.resolve.gguf_header import read_gguf, unloadable
    f = find(ref)
    if not f.ok:
        raise SpecliError(f"{ref}: {f.note}")
    try:
        why = unloadable(read_gguf(f.path))
    except SpecliError as e:
        why = str(e).removeprefix(f"{f.path}: ")
    if why:
        raise SpecliError(f"{ref} ({f.path}): {why}")
    return f.path
