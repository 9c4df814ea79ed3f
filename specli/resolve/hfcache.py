"""The local Hugging Face cache, read through huggingface-hub's own cache API (never walked by
hand): which files of a revision are there, where one file is, the SHA-256 a blob was
downloaded under, and the partial downloads that killed processes left behind."""

from __future__ import annotations

import os
import re
from pathlib import Path


def cache_root() -> Path:
    from huggingface_hub import constants
    return Path(constants.HF_HUB_CACHE)


def _cached_revision(repo: str, revision: str | None):
    """huggingface-hub's record of the cached snapshot of a revision (``main`` when none is
    named; a branch, tag or full commit hash), or None."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound
    try:
        repos = scan_cache_dir().repos
    except CacheNotFound:
        return None
    rev = revision or "main"
    for info in repos:
        if info.repo_id == repo and info.repo_type == "model":
            for r in info.revisions:
                if rev in r.refs or r.commit_hash == rev:
                    return r
    return None


def cached_files(repo: str, revision: str | None = None) -> dict[str, Path]:
    """Files of a revision of ``repo`` in the cache, by repo path (complete files only:
    huggingface-hub links a file into a snapshot once it is whole)."""
    r = _cached_revision(repo, revision)
    if r is None:
        return {}
    return {f.file_path.relative_to(r.snapshot_path).as_posix(): f.file_path for f in r.files}


def cached_path(repo: str, filename: str, revision: str | None = None) -> str | None:
    """The cached copy of one file of a revision, or None."""
    from huggingface_hub import try_to_load_from_cache
    p = try_to_load_from_cache(repo, filename, revision=revision)
    return p if isinstance(p, str) and os.path.exists(p) else None


def blob_sha256(path: str) -> str | None:
    """The SHA-256 of a cached Hub file as the Hub gave it: huggingface-hub names a blob by its
    ETag, which for a Git LFS file (every GGUF) is the SHA-256 of its content."""
    name = os.path.basename(os.path.realpath(path))
    return name if re.fullmatch(r"[0-9a-f]{64}", name) else None


def drop_orphans(repo: str) -> None:
    """Remove the partial downloads of ``repo`` that killed processes left behind: the client
    names them per process and never resumes them. A file whose lock is held is a download
    running now, and is left alone."""
    from filelock import FileLock, Timeout
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound
    from huggingface_hub.file_download import repo_folder_name
    folder = repo_folder_name(repo_id=repo, repo_type="model")
    try:
        partial = [f.file_path for f in scan_cache_dir().incomplete_files if f.file_path.parent.parent.name == folder]
    except CacheNotFound:
        return
    for p in partial:
        lock = FileLock(str(cache_root() / ".locks" / folder / (p.name.split(".")[0] + ".lock")))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            continue
        except OSError:  # no lock folder: no download of it has run since the cache was made
            lock = None
        try:
            p.unlink(missing_ok=True)
        except OSError:
            pass
        finally:
            if lock is not None:
                lock.release()
