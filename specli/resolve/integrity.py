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
    from specli.resolve.wheels import cache_dir
    return cache_dir().parent / "verified.json"


def _key(path: str | os.PathLike) -> str:
    st = os.stat(path)
    return f"{os.path.realpath(path)}:{st.st_size}:{st.st_mtime_ns}"


def _load() -> dict[str, str]:
    try:
        db = json.loads(_db_path().read_text())
        return db if isinstance(db, dict) else {}
    except (OSError, ValueError):
        return {}


def remember(path: str | os.PathLike, sha256: str) -> None:
    """Record that ``path``, as it is now, hashes to ``sha256`` (older versions of it forgotten).
    Written atomically; two processes racing here at worst make a later run hash again."""
    key = _key(path)
    real = key.rsplit(":", 2)[0]
    db = {k: v for k, v in _load().items() if k.rsplit(":", 2)[0] != real}
    db[key] = sha256
    dbp, tmp = _db_path(), None
    try:
        dbp.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dbp.parent, prefix=".verified-", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(db, f)
        os.replace(tmp, dbp)
    except OSError:  # a full or read-only disk only costs a re-hash next time
        if tmp:
            Path(tmp).unlink(missing_ok=True)


def known_sha256(path: str | os.PathLike) -> str | None:
    """The SHA-256 recorded for ``path`` as it is now, or None (never hashed, or changed since)."""
    return _load().get(_key(path))


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
