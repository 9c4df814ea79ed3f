"""Is a cached model file still the one that was downloaded? Size and SHA-256 checks, each file
hashed once per version: a small database of verified files, remembered by real path, size and
modification time (nanoseconds), so any later write to the file makes it be hashed again."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from specli.errors import SpecliError
from specli.util import cache_root


class CorruptFile(SpecliError):
    """A cached file that is not what was downloaded (truncated, overwritten, bit-flipped)."""

    def __init__(self, path: str | os.PathLike, why: str, hint: str = ""):
        self.path, self.why = os.fspath(path), why
        super().__init__(f"{self.path} is corrupted ({why})" + (f"; {hint}" if hint else ""))


def sha256_of(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _db_path() -> Path:
    return cache_root() / "verified.json"


def file_key(path: str | os.PathLike) -> str:
    """A file version: its real path, size and modification time (nanoseconds)."""
    st = os.stat(path)
    return f"{os.path.realpath(path)}:{st.st_size}:{st.st_mtime_ns}"


def load_db(dbp: Path) -> dict:
    """A JSON record keyed by file_key ({} when missing or unreadable)."""
    try:
        db = json.loads(dbp.read_text())
        return db if isinstance(db, dict) else {}
    except (OSError, ValueError):
        return {}


def store_db(dbp: Path, updates: dict) -> None:
    """Merge ``updates`` (file_key -> value) into the record at ``dbp``, forgetting older versions
    of the same files. Written atomically; two processes racing here at worst make a later run
    compute a value again, and a full or read-only disk only costs that too."""
    reals = {k.rsplit(":", 2)[0] for k in updates}
    db = {k: v for k, v in load_db(dbp).items() if k.rsplit(":", 2)[0] not in reals}
    db.update(updates)
    tmp = None
    try:
        dbp.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dbp.parent, prefix=f".{dbp.stem}-", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(db, f)
        os.replace(tmp, dbp)
    except OSError:
        if tmp:
            Path(tmp).unlink(missing_ok=True)


def _load() -> dict[str, str]:
    return load_db(_db_path())


def remember(path: str | os.PathLike, sha256: str) -> None:
    """Record that ``path``, as it is now, hashes to ``sha256`` (older versions of it forgotten)."""
    store_db(_db_path(), {file_key(path): sha256})


def cached_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file, hashed once per version (remembered like a verified file)."""
    known = known_sha256(path)
    if known:
        return known
    digest = sha256_of(path)
    remember(path, digest)
    return digest


def known_sha256(path: str | os.PathLike) -> str | None:
    """The SHA-256 recorded for ``path`` as it is now, or None (never hashed, or changed since)."""
    return _load().get(file_key(path))


def problem(path: str | os.PathLike, sha256: str | None = None, size: int | None = None) -> str | None:
    """Why the file at ``path`` is not the expected one, or None when it is (or nothing is known
    to check it against). "missing" when there is no file."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "missing"
    if size is not None and st.st_size != size:
        return f"{st.st_size:,} bytes, expected {size:,}"
    if not sha256:
        return None
    if known_sha256(path) == sha256:
        return None
    digest = sha256_of(path)
    if digest != sha256:
        return f"SHA-256 {digest[:16]}… is not the expected {sha256[:16]}…"
    remember(path, sha256)
    return None


def verify(path: str | os.PathLike, sha256: str | None = None, size: int | None = None) -> None:
    """Raise CorruptFile (one line) unless ``path`` has the expected size and SHA-256."""
    why = problem(path, sha256, size)
    if why == "missing":
        raise SpecliError(f"model file not found: {os.fspath(path)}")
    if why:
        raise CorruptFile(path, why)
