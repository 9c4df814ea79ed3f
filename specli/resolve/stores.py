"""The GGUF models a user already has: every store other tools keep, each read from its own format,
never by guessing, and never written to (a model is used where it lies; Ollama's blobs are
read-only to the user).

- **Ollama**: ``$OLLAMA_MODELS``, else ``~/.ollama/models`` and the Linux service's
  ``/usr/share/ollama/.ollama/models``. ``manifests/<registry>/<namespace>/<model>/<tag>`` is
  OCI-style JSON; its layer of media type ``application/vnd.ollama.image.model`` names the GGUF
  blob by digest (``blobs/sha256-<hex>``, older installs ``blobs/sha256:<hex>``). Names as Ollama
  writes them: ``qwen2.5-coder:7b``, ``user/model:tag``, ``registry/namespace/model:tag``.
- **LM Studio**: ``~/.lmstudio/models/<publisher>/<repo>/<file>.gguf`` and the legacy
  ``~/.cache/lm-studio/models``; vision projectors (``mmproj``) are not models.
- **Hugging Face cache**: through huggingface-hub's own ``scan_cache_dir`` (``HF_HUB_CACHE``).
- **llama.cpp's cache**: ``$LLAMA_CACHE``, else ``$XDG_CACHE_HOME/llama.cpp`` or
  ``~/.cache/llama.cpp`` (``fs_get_cache_directory`` in llama.cpp's ``common/common.cpp``): the
  flat files of ``-mu`` / docker downloads and of older ``-hf`` builds; newer ``-hf`` downloads go
  to the Hugging Face cache layout (``common/hf-cache.cpp``), under ``$LLAMA_CACHE`` when it is set.
- **specli's own cache** (:func:`specli.resolve.wheels.cache_dir`).
- **Your folders**: ``SPECLI_MODEL_DIRS`` (folders separated by ``os.pathsep``) and ``model_dirs:``
  in ``config.yaml`` in specli's config directory (``~/.config/specli`` on Linux, or
  ``$SPECLI_CONFIG_DIR``), searched recursively.

A store that cannot be read, a manifest that is not JSON or names a missing blob, a symlink
loop: each is a :class:`Found` with a ``note`` (skipped), never an exception.
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from specli.errors import SpecliError
from specli.resolve.model_dirs import user_dirs
from specli.util import cache_dir

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_REGISTRY, OLLAMA_NAMESPACE, OLLAMA_TAG = "registry.ollama.ai", "library", "latest"
SCHEMES = ("ollama:", "lmstudio:")  # references that name a model in another tool's store
LABELS = {"ollama": "Ollama", "lmstudio": "LM Studio", "hf": "Hugging Face cache", "llama.cpp": "llama.cpp cache",
          "specli": "specli cache", "folder": "your folder"}
MAX_DEPTH = 8  # how deep a user's folder is searched
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


@dataclass(frozen=True)
class Found:
    """One model a store holds: the store's name for it and the GGUF file (``path``), or why it
    was skipped (``note``; ``path`` may still name the file that was found wanting)."""

    store: str  # a key of LABELS
    name: str  # as the store writes it
    path: str | None
    root: str  # the store's folder
    note: str = ""
    sha256: str | None = None  # the content's SHA-256 where the store names files by it (Ollama)

    @property
    def ok(self) -> bool:
        return not self.note and self.path is not None

    @property
    def ref(self) -> str:
        """What ``--target`` / ``--draft`` accept for it: the store reference, the Hub reference
        (served from the cache; offline with HF_HUB_OFFLINE=1), the ``pypi:`` name, else the path."""
        if self.store in ("ollama", "lmstudio"):
            return f"{self.store}:{self.name}"
        if self.store == "hf" or self.name.startswith("pypi:"):
            return self.name
        return self.path or self.name

    @property
    def where(self) -> str:
        """'Ollama qwen2.5-coder:0.5b' for notes."""
        return f"{LABELS[self.store]} {self.name}"


def _is_model_file(name: str) -> bool:
    """A GGUF that is a model to list: not a vision projector, not a later part of a split file."""
    low = name.lower()
    if not low.endswith(".gguf") or "mmproj" in low:
        return False
    m = _SPLIT.search(name)
    return m is None or int(m.group(1)) == 1


def _why(e: OSError) -> str:
    if e.errno == errno.ELOOP:
        return "symlink loop"
    return e.strerror or str(e)


def _home() -> Path:
    return Path(os.path.expanduser("~"))


# -- Ollama -------------------------------------------------------------------------------------

def ollama_roots() -> list[Path]:
    env = os.environ.get("OLLAMA_MODELS")
    if env:
        return [Path(os.path.expanduser(env))]
    return [_home() / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]


def ollama_name(registry: str, namespace: str, model: str, tag: str) -> str:
    """The name ``ollama list`` shows for a manifest path."""
    if registry == OLLAMA_REGISTRY:
        return f"{model}:{tag}" if namespace == OLLAMA_NAMESPACE else f"{namespace}/{model}:{tag}"
    return f"{registry}/{namespace}/{model}:{tag}"


def parse_ollama_name(name: str) -> tuple[str, str, str, str]:
    """(registry, namespace, model, tag) of a name as Ollama users write it, lower-cased (Ollama
    matches names without regard to case)."""
    base, tag = name, OLLAMA_TAG
    if ":" in name.rsplit("/", 1)[-1]:
        base, tag = name.rsplit(":", 1)
    parts = base.split("/")
    if len(parts) > 3 or not all(parts) or not tag:
        raise SpecliError(f"ollama:{name}: not an Ollama model name (MODEL[:TAG], NAMESPACE/MODEL[:TAG] or "
                          "REGISTRY/NAMESPACE/MODEL[:TAG])")
    full = [OLLAMA_REGISTRY, OLLAMA_NAMESPACE][:3 - len(parts)] + parts
    return tuple(p.lower() for p in (*full, tag))  # type: ignore[return-value]


def _ollama_blob(root: Path, digest: str) -> Path | None:
    hexd = digest.split(":", 1)[1]
    for name in (f"sha256-{hexd}", f"sha256:{hexd}"):
        p = root / "blobs" / name
        if os.path.lexists(p):
            return p
    return None


def _ollama_manifest(root: Path, path: Path, name: str) -> Found:
    def skip(note: str, blob: Path | None = None, sha: str | None = None) -> Found:
        return Found("ollama", name, str(blob) if blob else None, str(root), note, sha)
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(1 << 20))
    except OSError as e:
        return skip(f"cannot read its manifest ({_why(e)})")
    except (ValueError, UnicodeDecodeError):
        return skip("its manifest is not JSON")
    layers = data.get("layers") if isinstance(data, dict) else None
    if not isinstance(layers, list):
        return skip("its manifest has no layers")
    model = [la for la in layers if isinstance(la, dict) and la.get("mediaType") == OLLAMA_MODEL_LAYER]
    if not model:
        kinds = sorted({str(la.get("mediaType")) for la in layers if isinstance(la, dict)})
        return skip(f"no GGUF weights layer ({OLLAMA_MODEL_LAYER}) in its manifest: {', '.join(kinds) or 'none'}")
    digest = str(model[0].get("digest", ""))
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        return skip(f"its manifest names a malformed digest {digest[:80]!r}")
    sha = digest.split(":", 1)[1]
    blob = _ollama_blob(root, digest)
    if blob is None:
        return skip(f"its blob sha256-{sha[:12]}… is missing from {root / 'blobs'}", sha=sha)
    return Found("ollama", name, str(blob), str(root), "", sha)


def _ollama(root: Path) -> Iterator[Found]:
    for item in _files_at_depth("ollama", root / "manifests", 4):  # registry / namespace / model / tag
        yield item if isinstance(item, Found) else _ollama_manifest(root, Path(item[0]), ollama_name(*item[1]))


def _files_at_depth(store: str, top: Path, depth: int) -> Iterator[Found | tuple[str, tuple[str, ...]]]:
    """(path, folder names) of each file exactly ``depth`` levels under ``top``, or a skipped
    :class:`Found` for a folder that cannot be read. Fixed depth: a symlink loop cannot recurse."""
    level: list[tuple[str, tuple[str, ...]]] = [(str(top), ())]
    for d in range(depth):
        nxt = []
        for folder, parts in level:
            try:
                entries = sorted(os.scandir(folder), key=lambda e: e.name)
            except FileNotFoundError:
                continue
            except OSError as e:
                yield Found(store, folder, None, str(top), f"cannot read it ({_why(e)})")
                continue
            for e in entries:
                if e.name.startswith("."):
                    continue
                if d < depth - 1 and _is_dir(e):
                    nxt.append((e.path, parts + (e.name,)))
                elif d == depth - 1 and not _is_dir(e):
                    yield e.path, parts + (e.name,)
        level = nxt


# -- LM Studio ----------------------------------------------------------------------------------

def lmstudio_roots() -> list[Path]:
    return [_home() / ".lmstudio" / "models", _home() / ".cache" / "lm-studio" / "models"]


def _lmstudio(root: Path) -> Iterator[Found]:
    """``<publisher>/<repo>/<file>.gguf``; LM Studio itself ignores files at other depths."""
    for item in _files_at_depth("lmstudio", root, 3):
        if isinstance(item, Found):
            yield item
        elif _is_model_file(item[1][-1]):
            yield _file("lmstudio", "/".join(item[1]), item[0], root)


def _is_dir(e: os.DirEntry) -> bool:
    try:
        return e.is_dir()
    except OSError:
        return False


def _file(store: str, name: str, path: str, root: Path | str) -> Found:
    """A model file a store lists: skipped with a note when it cannot be opened (a dangling
    link, a symlink loop, no permission)."""
    try:
        os.stat(path)
    except OSError as e:
        return Found(store, name, path, str(root), f"cannot read it ({_why(e)})")
    if os.path.isdir(path):
        return Found(store, name, path, str(root), "a folder named like a GGUF file")
    return Found(store, name, path, str(root))


# -- the Hugging Face cache (and llama.cpp's, in the same layout) -------------------------------

def hf_root() -> Path:
    from specli.resolve.hfcache import cache_root
    return cache_root()


def _hf(root: Path, store: str = "hf") -> Iterator[Found]:
    """Every GGUF of every cached revision, through huggingface-hub's ``scan_cache_dir``; a file
    linked from several revisions is listed once, by the revision a ref points to first."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound
    try:
        info = scan_cache_dir(root)
    except CacheNotFound:
        return
    except OSError as e:
        yield Found(store, str(root), None, str(root), f"cannot read the cache ({_why(e)})")
        return
    for w in info.warnings:  # "Repo path is not a directory: /path", ...
        why, _, where = str(w).rpartition(": ")
        if store == "llama.cpp" and where.lower().endswith(".gguf") and os.path.isfile(where):
            continue  # llama.cpp's flat files beside the Hub layout (_flat lists them)
        yield Found(store, where, None, str(root), f"skipped by huggingface-hub: {why or w}")
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        seen: set[str] = set()
        for rev in sorted(repo.revisions, key=lambda r: (not r.refs, r.commit_hash)):
            for f in sorted(rev.files, key=lambda f: f.file_name):
                rel = f.file_path.relative_to(rev.snapshot_path).as_posix()
                if not _is_model_file(rel) or str(f.blob_path) in seen:
                    continue
                seen.add(str(f.blob_path))
                name = f"{repo.repo_id}/{rel}" + ("" if rev.refs else f"@{rev.commit_hash[:12]}")
                sha = f.blob_path.name if re.fullmatch(r"[0-9a-f]{64}", f.blob_path.name) else None
                found = _file(store, name, str(f.file_path), root)
                yield Found(found.store, found.name, found.path, found.root, found.note, sha)


def llamacpp_root() -> Path:
    if os.environ.get("LLAMA_CACHE"):
        return Path(os.path.expanduser(os.environ["LLAMA_CACHE"]))
    base = os.environ.get("XDG_CACHE_HOME") or str(_home() / ".cache")
    return Path(base) / "llama.cpp"


def _flat(store: str, root: Path) -> Iterator[Found]:
    """The GGUF files directly in a folder (llama.cpp's and specli's caches)."""
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except FileNotFoundError:
        return
    except OSError as e:
        yield Found(store, str(root), None, str(root), f"cannot read it ({_why(e)})")
        return
    for e in entries:
        if not e.name.startswith(".") and _is_model_file(e.name):
            yield _file(store, e.name, e.path, root)


def _llamacpp(root: Path) -> Iterator[Found]:
    yield from _flat("llama.cpp", root)
    if any(p.name.startswith("models--") for p in _listdir(root)):
        yield from _hf(root, "llama.cpp")


def _listdir(root: Path) -> list[Path]:
    try:
        return list(root.iterdir())
    except OSError:
        return []


# -- specli's cache and the user's folders ------------------------------------------------------

def specli_root() -> Path:
    return cache_dir()


def _specli(root: Path) -> Iterator[Found]:
    from specli.resolve import wheels
    known = {str(wheels.cached_path(src)): f"pypi:{key}" for key, src in wheels.BUILTIN.items()}
    for f in _flat("specli", root):
        name = known.get(f.path or "", f.name)
        yield Found(f.store, name, f.path, f.root, f.note, f.sha256)


def _folder(root: Path) -> Iterator[Found]:
    """Every model GGUF under a folder, following links to folders once each (a link back up the
    tree is a loop: noted, not followed)."""
    try:
        st = os.stat(root)
    except OSError as e:
        yield Found("folder", str(root), None, str(root), f"cannot read it ({_why(e)})")
        return
    seen = {(st.st_dev, st.st_ino)}

    def walk(d: Path, depth: int) -> Iterator[Found]:
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError as e:
            yield Found("folder", str(d), None, str(root), f"cannot read it ({_why(e)})")
            return
        for e in entries:
            if e.name.startswith("."):
                continue
            if _is_dir(e):
                try:
                    s = os.stat(e.path)
                except OSError as err:
                    yield Found("folder", e.path, None, str(root), f"cannot read it ({_why(err)})")
                    continue
                if (s.st_dev, s.st_ino) in seen:
                    if e.is_symlink():
                        yield Found("folder", e.path, None, str(root),
                                    f"symlink loop ({e.path} -> {os.readlink(e.path)}): not followed")
                    continue
                seen.add((s.st_dev, s.st_ino))
                if depth < MAX_DEPTH:
                    yield from walk(Path(e.path), depth + 1)
            elif _is_model_file(e.name):
                yield _file("folder", e.path, e.path, root)

    yield from walk(root, 1)


# -- all of them --------------------------------------------------------------------------------

def roots() -> list[tuple[str, Path]]:
    """Every store folder searched, in order (store key, folder), each real folder once."""
    out = [("ollama", r) for r in ollama_roots()] + [("lmstudio", r) for r in lmstudio_roots()]
    out += [("hf", hf_root()), ("llama.cpp", llamacpp_root()), ("specli", specli_root())]
    out += [("folder", d) for d in user_dirs()]
    seen, unique = set(), []
    for store, r in out:
        key = os.path.realpath(r)
        if key not in seen:
            seen.add(key)
            unique.append((store, r))
    return unique


_SCAN = {"ollama": _ollama, "lmstudio": _lmstudio, "hf": _hf, "llama.cpp": _llamacpp, "specli": _specli,
         "folder": _folder}


def discover(only: str | None = None) -> list[Found]:
    """Every model in every store (or in one kind of store), skipped ones with their note."""
    out: list[Found] = []
    for store, root in roots():
        if only and store != only:
            continue
        try:
            out.extend(_SCAN[store](root))
        except PermissionError as e:
            out.append(Found(store, str(root), None, str(root), f"cannot read it ({_why(e)})"))
    return out
