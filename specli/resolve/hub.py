"""GGUF models on the Hugging Face Hub through huggingface-hub: its shared cache, HF_TOKEN,
HF_ENDPOINT (mirrors), HF_HUB_OFFLINE, downloads resumed after a dropped connection, each file
checked against the Hub's SHA-256; and GGUF headers read with HTTP range requests, so an
incompatible draft is refused before its weights are downloaded."""

from __future__ import annotations

import errno
import os
import re
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from specli.errors import SpecliError
from specli.resolve import hfcache, integrity
from specli.resolve.gguf_header import GGUFHeader, read_gguf, read_header
from specli.util import fmt_size

_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.I)
_QUANT = re.compile(r"(?:^|[-_.])((?:I?Q\d[_A-Z0-9]*)|F16|BF16|F32)(?:[-_.]|$)", re.I)


@dataclass(frozen=True)
class HubRef:
    repo: str
    quant: str | None = None
    filename: str | None = None
    revision: str | None = None

    def __str__(self) -> str:
        s = self.repo + (f"/{self.filename}" if self.filename else "") + (f":{self.quant}" if self.quant else "")
        return s + (f"@{self.revision}" if self.revision else "")


def parse_hub_ref(ref: str) -> HubRef | None:
    """``org/repo``, ``org/repo:QUANT``, ``org/repo/path/file.gguf`` (each with an optional
    ``@revision``); None when ``ref`` is not of that form."""
    rev = None
    if "@" in ref:
        ref, rev = ref.rsplit("@", 1)
    quant = None
    if ":" in ref:
        ref, quant = ref.split(":", 1)
        if not quant or "/" in quant:
            return None
    parts = ref.split("/")
    if len(parts) < 2 or not all(re.fullmatch(r"[\w.\-]+", p) for p in parts):
        return None
    if len(parts) == 2:
        return HubRef("/".join(parts), quant, None, rev)
    if not parts[-1].lower().endswith(".gguf") or quant:
        return None
    return HubRef("/".join(parts[:2]), None, "/".join(parts[2:]), rev)


def quant_of(filename: str) -> str | None:
    stem = _SPLIT.sub("", os.path.basename(filename))
    stem = re.sub(r"\.gguf$", "", stem, flags=re.I)
    found = _QUANT.findall(stem)
    return found[-1].upper() if found else None


def pick_files(files: list[str], ref: HubRef, note: Callable[[str], None] | None = None) -> list[str]:
    """The GGUF file (or the parts of a split GGUF, in order) a reference names. When the
    quantisation is there both as one file and as a split set, the single file (``note`` is
    told which was chosen)."""
    ggufs = [f for f in files if f.lower().endswith(".gguf") and "mmproj" not in f.lower()]
    if ref.filename:
        if ref.filename not in files:
            raise SpecliError(f"{ref.repo} has no file {ref.filename}")
        chosen = [ref.filename]
    else:
        if not ggufs:
            raise SpecliError(f"{ref.repo} has no GGUF files")
        groups: dict[str, list[str]] = {}
        for f in ggufs:
            groups.setdefault(_SPLIT.sub("", f), []).append(f)
        if ref.quant:
            want = ref.quant.upper()
            match = [g for g in groups if quant_of(g + ".gguf" if not g.endswith(".gguf") else g) == want]
            if not match:
                have = sorted({q for q in (quant_of(f) for f in ggufs) if q})
                raise SpecliError(f"{ref.repo} has no GGUF of quantisation {ref.quant}; it has: {', '.join(have)}")
        else:
            match = list(groups)
            if len(match) > 1:
                have = sorted({q for q in (quant_of(f) for f in ggufs) if q})
                raise SpecliError(f"{ref.repo} has several GGUF files; name one with {ref.repo}:QUANT "
                                  f"({', '.join(have)})")
        singles = [g for g in match if not _SPLIT.search(groups[g][0])]
        chosen = groups[sorted(singles or match, key=len)[0]]
        if singles and len(singles) < len(match) and note:
            note(f"{ref.repo}: {ref.quant or 'the model'} is there both as one file and split in parts; "
                 f"using the single file {chosen[0]}")
    first = chosen[0]
    m = _SPLIT.search(first)
    if m:
        base = _SPLIT.sub("", first)
        parts = sorted(f for f in files if _SPLIT.sub("", f) == base and _SPLIT.search(f))
        n = int(m.group(2))
        if len(parts) != n:
            raise SpecliError(f"{ref.repo}: split GGUF {os.path.basename(base)} has {len(parts)} of {n} parts")
        return parts
    return chosen


def offline() -> bool:
    from huggingface_hub import constants
    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")


def _explain(e: Exception, ref: HubRef) -> SpecliError:
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    if isinstance(e, GatedRepoError):
        return SpecliError(f"{ref.repo} is gated: accept its licence on the Hub and set HF_TOKEN to a token "
                           "that has access")
    if isinstance(e, RepositoryNotFoundError):
        auth = " (or it is private: set HF_TOKEN)" if not os.environ.get("HF_TOKEN") else ""
        return SpecliError(f"repository {ref.repo} not found on {_endpoint()}{auth}")
    if isinstance(e, RevisionNotFoundError):
        return SpecliError(f"{ref.repo} has no revision {ref.revision}")
    if isinstance(e, EntryNotFoundError):
        return SpecliError(f"{ref} not found in {ref.repo}")
    if isinstance(e, (LocalEntryNotFoundError, OfflineModeIsEnabled)):
        return SpecliError(f"cannot reach {_endpoint()} for {ref} and no complete copy is cached"
                           + (" (HF_HUB_OFFLINE is set)" if offline() else ""))
    if isinstance(e, HfHubHTTPError):
        code = getattr(getattr(e, "response", None), "status_code", "?")
        if code == 401:
            return SpecliError(f"{_endpoint()} refused {ref.repo} (401 unauthorised): set HF_TOKEN")
        return SpecliError(f"{_endpoint()} answered {code} for {ref}")
    if isinstance(e, SpecliError):
        return e
    return _unreachable(ref)


def _endpoint() -> str:
    from huggingface_hub import constants
    return constants.ENDPOINT


_reachable: dict[str, bool] = {}


def reachable(timeout: float = 3.0) -> bool:
    """One quick request to the endpoint, no retries: is the Hub (or mirror) there at all?
    The client itself retries a dead network for ~25 s, printing each retry."""
    import urllib.error
    import urllib.request

    ep = _endpoint()
    if ep not in _reachable:
        try:
            urllib.request.urlopen(urllib.request.Request(ep.rstrip("/") + "/api/models?limit=1", method="HEAD"),
                                   timeout=timeout)
            ok = True
        except urllib.error.HTTPError:
            ok = True  # it answered
        except (urllib.error.URLError, OSError, ValueError):
            ok = False
        _reachable[ep] = ok
    return _reachable[ep]


def _quiet_client() -> None:
    from huggingface_hub.utils import logging as hf_logging
    hf_logging.set_verbosity_error()


def _unreachable(ref: HubRef) -> SpecliError:
    cached = bool(hfcache.cached_files(ref.repo, ref.revision))
    return SpecliError(f"cannot reach {_endpoint()} for {ref}; "
                       + ("a cached copy exists: set HF_HUB_OFFLINE=1 to use it" if cached else "no cached copy"))


def list_files(ref: HubRef) -> list[str]:
    if offline():
        files = list(hfcache.cached_files(ref.repo, ref.revision))
        if not files:
            rev = f"@{ref.revision}" if ref.revision else ""
            raise SpecliError(f"HF_HUB_OFFLINE is set and {ref.repo}{rev} is not in the cache "
                              f"({hfcache.cache_root()})")
        return files
    if not reachable():
        raise _unreachable(ref)
    _quiet_client()
    from huggingface_hub import HfApi
    try:
        return HfApi().list_repo_files(ref.repo, revision=ref.revision)
    except Exception as e:  # the client's errors, whatever HTTP library this version uses
        raise _explain(e, ref) from None


def _progress_class():
    import sys
    if not sys.stderr.isatty() or os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS"):
        return None
    try:
        from tqdm import TqdmExperimentalWarning
        from tqdm.rich import tqdm as rich_tqdm
        warnings.filterwarnings("ignore", category=TqdmExperimentalWarning)
        return rich_tqdm
    except ImportError:  # pragma: no cover
        return None


# Bytes of one file as they arrive: (file name, its Hub digest or "", bytes so far, total)
OnBytes = Callable[[str, str, int, int], None]


def download(ref: HubRef, progress=None, sha256: str | None = None, refetch: bool = False,
             on_bytes: OnBytes | None = None) -> str:
    """Download (or find in the cache) the file(s) a reference names; the local path of the
    GGUF to load (the first part of a split GGUF, its siblings beside it). Each file is checked
    against its SHA-256 (``sha256``, a pin for the first file, else the Hub's own); a cached
    file that fails raises CorruptFile, or with ``refetch`` is downloaded again. ``on_bytes``
    hears each file's bytes as they arrive (serve's ``/api/pull`` streams them)."""
    files = pick_files(list_files(ref), ref, note=progress)
    paths = []
    for i, f in enumerate(files):
        fref = HubRef(ref.repo, ref.quant, f, ref.revision)
        was_cached = hfcache.cached_path(ref.repo, f, ref.revision) is not None
        if progress and not was_cached and not offline():
            progress(f"downloading {ref.repo}/{f} from {_endpoint()}")
        path = _fetch(fref, on_bytes=on_bytes)
        expect = (sha256 if i == 0 else None) or hfcache.blob_sha256(path)
        why = integrity.problem(path, expect)
        if why and was_cached and refetch and not offline():
            if progress:
                progress(f"{path} is corrupted ({why}); downloading it again")
            path, was_cached = _fetch(fref, force=True, on_bytes=on_bytes), False
            why = integrity.problem(path, expect)
        if why and was_cached:
            raise integrity.CorruptFile(path, why)
        if why:
            raise SpecliError(f"{ref.repo}/{f} as downloaded: {why}; not using it")
        paths.append(path)
    return paths[0]


def _byte_counter(ref: HubRef, on_bytes: OnBytes):
    """A tqdm class for huggingface-hub that draws nothing and reports the bytes so far."""
    import io

    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from tqdm import tqdm
    try:
        digest = get_hf_file_metadata(hf_hub_url(ref.repo, ref.filename, revision=ref.revision)).etag or ""
    except Exception:  # the digest is a courtesy for progress bars keyed by it
        digest = ""
    name = ref.filename or ""

    class Counter(tqdm):
        def __init__(self, *a, **kw):
            kw.pop("name", None)
            super().__init__(*a, **{**kw, "file": io.StringIO(), "disable": False})
            on_bytes(name, digest, int(self.n), int(self.total or 0))

        def update(self, n=1):
            out = super().update(n)
            on_bytes(name, digest, int(self.n), int(self.total or 0))
            return out

    return Counter


def _fetch(ref: HubRef, force: bool = False, on_bytes: OnBytes | None = None) -> str:
    """One file through huggingface-hub, under its per-file lock (a second process waits, then
    finds the file): written to a per-process ``.incomplete`` file, moved into the cache only
    when whole. A killed process's partial file is never resumed by the client (its name is
    per process), so it is removed here; a full disk is refused before the download starts."""
    from huggingface_hub import hf_hub_download
    bar = _progress_class()
    if not offline() and (force or hfcache.cached_path(ref.repo, ref.filename, ref.revision) is None):
        hfcache.drop_orphans(ref.repo)
        bar = _byte_counter(ref, on_bytes) if on_bytes else bar
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="Not enough free disk space")
        try:
            return hf_hub_download(ref.repo, ref.filename, revision=ref.revision, local_files_only=offline(),
                                   force_download=force, tqdm_class=bar)
        except Exception as e:
            if "Not enough free disk space" in str(e) or getattr(e, "errno", None) == errno.ENOSPC:
                raise _no_space(ref) from None
            raise _explain(e, ref) from None


def _no_space(ref: HubRef) -> SpecliError:
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    try:
        size = get_hf_file_metadata(hf_hub_url(ref.repo, ref.filename, revision=ref.revision)).size
    except Exception:  # the size is a courtesy: the message stands without it
        size = None
    root = hfcache.cache_root()
    need = f"{ref.filename} needs {fmt_size(size)}, " if size else f"{ref.filename} does not fit: "
    return SpecliError(f"not enough space in {root}: {need}{fmt_size(shutil.disk_usage(root).free)} is free; "
                       "free some space and run again")


def header(ref: HubRef, block_size: int = 1 << 20) -> GGUFHeader:
    """The GGUF header of a Hub file: from the cache when it is there, else by ranged reads
    (only the header's bytes cross the network)."""
    files = pick_files(list_files(ref), ref)
    cached = hfcache.cached_path(ref.repo, files[0], ref.revision)
    if cached is not None:
        try:
            return read_gguf(cached, check_size=False)
        except SpecliError:  # a damaged cached copy is said to be one, with the way to fix it
            why = integrity.problem(cached, hfcache.blob_sha256(cached))
            if why:
                raise integrity.CorruptFile(cached, why) from None
            raise
    if offline():
        raise SpecliError(f"HF_HUB_OFFLINE is set and {ref.repo}/{files[0]} is not cached")
    _quiet_client()
    from huggingface_hub import HfFileSystem
    path = f"{ref.repo}@{ref.revision}/{files[0]}" if ref.revision else f"{ref.repo}/{files[0]}"
    try:
        with HfFileSystem(skip_instance_cache=True).open(path, "rb", block_size=block_size) as f:
            h = read_header(f, name=f"{ref.repo}/{files[0]}")
    except Exception as e:
        raise _explain(e, ref) from None
    h.path = f"{ref.repo}/{files[0]}"
    return h


_SIZE_TOKEN = re.compile(r"(?:^|[-_.])(\d+(?:\.\d+)?)([bm])(?:[-_.]|$)", re.I)


def size_of(name: str) -> float | None:
    """Parameter count from a name like 'Qwen2.5-Coder-7B-Instruct' (7e9) or '...-135M-...'."""
    m = _SIZE_TOKEN.search(name)
    if not m:
        return None
    return float(m.group(1)) * (1e9 if m.group(2).lower() == "b" else 1e6)


def family_of(repo: str) -> str:
    """'Qwen/Qwen2.5-Coder-7B-Instruct-GGUF' -> 'Qwen2.5-Coder'."""
    name = repo.split("/")[-1]
    m = _SIZE_TOKEN.search(name)
    return name[:m.start()].strip("-_.") if m else re.sub(r"(?i)[-_]?gguf$", "", name)


def search_drafts(target: HubRef, target_header: GGUFHeader, limit: int = 40) -> list[HubRef]:
    """Smaller GGUF repos of the same family, smallest first."""
    from huggingface_hub import HfApi
    fam = family_of(target.repo)
    tsize = size_of(target.repo.split("/")[-1]) or float(target_header.n_params)
    if not reachable():
        raise _unreachable(target)
    try:
        found = list(HfApi().list_models(search=fam, filter="gguf", limit=limit))
    except Exception as e:
        raise _explain(e, target) from None
    out = []
    for mi in found:
        rid = getattr(mi, "id", None) or getattr(mi, "modelId", "")
        s = size_of(rid.split("/")[-1])
        if rid and rid != target.repo and s and s * 8 <= tsize:
            out.append((s, HubRef(rid, target.quant)))
    return [r for _, r in sorted(out, key=lambda x: x[0])]
