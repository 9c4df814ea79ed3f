"""The models one server offers, under the names their users know them by.

:func:`scan` lists every model ``specli models`` finds (Ollama's ``name:tag``, LM Studio's
``publisher/repo``, the Hugging Face cache's ``org/repo/file.gguf``, the file stem of a model
in a folder or specli's cache) and every profile whose target file is on disk (by its name).
Drafting heads and the models that draft for another model on disk are listed too, marked as
such (``role``). :meth:`Catalog.find` takes any of those names, with or without the
``ollama:`` / ``lmstudio:`` prefix, case aside, a tagless Ollama name as ``:latest``; an
unknown name is :class:`UnknownModel`, which carries the nearest names.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from specli.errors import SpecliError
from specli.resolve import local, on_disk, store_refs, stores
from specli.resolve.profiles import Profile, load_all

MODEL, DRAFT, HEAD = "model", "draft", "head"


class UnknownModel(SpecliError):
    """No served model has that name; ``nearest`` names the closest ones."""

    def __init__(self, name: str, nearest: list[str]):
        near = f"; nearest: {', '.join(nearest)}" if nearest else "; no models are served"
        super().__init__(f"model '{name}' not found{near}")
        self.name, self.nearest = name, nearest


@dataclass(frozen=True)
class Entry:
    """One served model: its listed ``name``, what ``--target`` takes for it (``ref``), its
    file, its role (a model, a draft model, a drafting head), and the profile it stands for."""

    name: str
    ref: str
    path: str
    store: str
    summary: local.Summary
    size: int
    modified: float
    role: str = MODEL
    profile: Profile | None = None
    aliases: tuple[str, ...] = field(default=())

    @property
    def digest(self) -> str:
        """The SHA-256 an Ollama blob is named by; elsewhere a hash of the file's path, size
        and time (hashing every file at every listing would read gigabytes)."""
        base = os.path.basename(os.path.realpath(self.path))
        if base.startswith("sha256-") and len(base) == 71:
            return base[7:]
        return hashlib.sha256(f"{self.path}\0{self.size}\0{self.modified}".encode()).hexdigest()

    def details(self) -> dict:
        """Ollama's ``details`` object."""
        s = self.summary
        return {"parent_model": "", "format": "gguf", "family": s.architecture, "families": [s.architecture],
                "parameter_size": parameter_size(s.params), "quantization_level": s.quant}


def parameter_size(n: int) -> str:
    """Parameters as Ollama writes them: 494M, 1.5B, 32.8B."""
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    return f"{round(n / 1e6)}M" if n >= 1e6 else str(n)


def _key(name: str) -> str:
    return name.strip().lower()


class Catalog:
    """The served models, found by any of their names."""

    def __init__(self, entries: Iterable[Entry]):
        self.entries = list(entries)
        self._by: dict[str, Entry] = {}
        for e in self.entries:
            for n in (e.name, *e.aliases):
                self._by.setdefault(_key(n), e)

    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    def find(self, name: str) -> Entry:
        for cand in _spellings(name):
            e = self._by.get(_key(cand))
            if e is not None:
                return e
        raise UnknownModel(name, store_refs.nearest(name, self.names(), 5))


def _spellings(name: str) -> list[str]:
    """``name`` and how else a client may spell it: without a store prefix, an Ollama name
    with the ``:latest`` tag it implies."""
    out = [name]
    low = name.lower()
    for prefix in stores.SCHEMES:
        if low.startswith(prefix):
            out.append(name[len(prefix):])
    for n in list(out):
        if ":" not in n.rsplit("/", 1)[-1]:
            out.append(f"{n}:{stores.OLLAMA_TAG}")
    return out


def _stem(path: str) -> str:
    base = os.path.basename(path)
    return base[:-5] if base.lower().endswith(".gguf") else base


def _names(f: stores.Found, repo_files: dict[str, int]) -> tuple[str, tuple[str, ...]]:
    """The listed name and the aliases of a store's model."""
    if f.store == "ollama":
        short = f.name.removesuffix(f":{stores.OLLAMA_TAG}")
        return f.name, tuple({f"ollama:{f.name}", short, f"ollama:{short}"} - {f.name})
    if f.store == "lmstudio":
        repo = f.name.rsplit("/", 1)[0]
        if repo_files.get(repo.lower()) == 1:  # the repo's only file: its publisher/repo
            return repo, (f"lmstudio:{repo}", f.name, f"lmstudio:{f.name}")
        return f.name, (f"lmstudio:{f.name}",)
    if f.store == "hf":
        return f.name, (_stem(f.path),)
    return _stem(f.path), (f.ref,) if f.ref != _stem(f.path) else ()


def _drafts(models: list[local.LocalModel]) -> set[str]:
    """The files that draft for another model on disk (``--draft auto`` would take them)."""
    out: set[str] = set()
    for _target, found, _heads in local.pairs(models):
        out.update(p.draft.path for p in found if local.auto_pick(p))
    return out


def _entry(m: local.LocalModel, name: str, aliases: tuple[str, ...], role: str,
           profile: Profile | None = None) -> Entry:
    try:
        modified = os.stat(m.path).st_mtime
    except OSError:
        modified = 0.0
    return Entry(name, profile.name if profile else m.found.ref, m.path, m.found.store, m.summary, m.size,
                 modified, role, profile, aliases)


def _profiles_on_disk(models: list[local.LocalModel]) -> list[tuple[Profile, local.LocalModel]]:
    """The profiles whose pinned target is a file on disk (its size, then its SHA-256)."""
    by_size: dict[int, list[local.LocalModel]] = {}
    for m in models:
        if m.ok and not m.same_as:
            by_size.setdefault(m.size, []).append(m)
    out = []
    for p in load_all().values():
        t = p.target
        for m in by_size.get(t.size, []) if t.sha256 and t.size else []:
            if on_disk.sha256_of(m.path) == t.sha256:
                out.append((p, m))
                break
    return out


def scan(models: list[local.LocalModel] | None = None) -> Catalog:
    """Every usable model on disk and every profile whose target is on disk."""
    models = local.scan() if models is None else models
    usable = [m for m in models if m.ok]
    repo_files: dict[str, int] = {}
    for m in usable:
        if m.found.store == "lmstudio":
            repo = m.found.name.rsplit("/", 1)[0].lower()
            repo_files[repo] = repo_files.get(repo, 0) + 1
    drafts = _drafts(usable)
    entries = [_entry(p_m, p.name, (), MODEL, p) for p, p_m in _profiles_on_disk(usable)]
    for m in usable:
        name, aliases = _names(m.found, repo_files)
        role = HEAD if m.summary.head else DRAFT if m.path in drafts else MODEL
        entries.append(_entry(m, name, aliases, role))
    return Catalog(entries)
