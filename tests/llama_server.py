"""``llama-server`` built from the llama.cpp that the installed llama-cpp-python vendors, so
the export tests run the exact llama.cpp version specli itself links against.

The sdist is fetched with pip (PyPI only), unpacked and built once per version into
``~/.cache/specli/llama-server/<version>/`` (override the root with
``SPECLI_LLAMA_SERVER_CACHE``), outside the repository. A lock file makes concurrent test
runs wait for one build instead of starting two. Network-free build: no curl, no OpenSSL,
no web UI download. ``python tests/llama_server.py`` builds it and prints the time taken.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "llama-cpp-python"
CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",       # one self-contained binary
    "-DGGML_NATIVE=ON",
    "-DLLAMA_CURL=OFF",              # deprecated in this llama.cpp, harmless; older ones need it
    "-DLLAMA_OPENSSL=OFF",           # no HTTPS: models are local files in the tests
    "-DLLAMA_USE_PREBUILT_UI=OFF",   # otherwise the web UI is downloaded from the Hub
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
]


def version() -> str:
    return importlib.metadata.version(PACKAGE)


def cache_dir(ver: str | None = None) -> Path:
    root = os.environ.get("SPECLI_LLAMA_SERVER_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "specli" / "llama-server"
    return base / (ver or version())


@contextlib.contextmanager
def _locked(directory: Path, what: str) -> Iterator[None]:
    """One process at a time per ``what`` ("unpack", "build"); the others wait for it."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f".{what}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _unpack_sdist(directory: Path, ver: str) -> Path:
    src = directory / "src"
    if (src / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
        return src / "vendor" / "llama.cpp"
    with _locked(directory, "unpack"):
        if not (src / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
            _download_and_unpack(directory, ver, src)
    return src / "vendor" / "llama.cpp"


def _download_and_unpack(directory: Path, ver: str, src: Path) -> None:
    dl = directory / "sdist"
    dl.mkdir(exist_ok=True)
    if not list(dl.glob("*.tar.gz")):
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--no-binary", ":all:", f"{PACKAGE}=={ver}", "-d", str(dl)],
            check=True,
        )
    (archive,) = dl.glob("*.tar.gz")
    tmp = Path(tempfile.mkdtemp(dir=directory, prefix="unpack-"))
    with tarfile.open(archive) as tar:
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(tmp, **kwargs)
    (top,) = tmp.iterdir()
    shutil.rmtree(src, ignore_errors=True)
    top.rename(src)
    tmp.rmdir()


def source(ver: str | None = None) -> Path:
    """The vendored ``llama.cpp`` source tree of this llama-cpp-python version."""
    ver = ver or version()
    return _unpack_sdist(cache_dir(ver), ver)


def build(ver: str | None = None, jobs: int = 2) -> Path:
    """The built ``llama-server`` binary; builds it (once per version) when missing."""
    ver = ver or version()
    directory = cache_dir(ver)
    binary = directory / "bin" / "llama-server"
    tree = _unpack_sdist(directory, ver)
    with _locked(directory, "build"):
        if binary.is_file():
            return binary
        build_dir = directory / "build"
        log = directory / "build.log"
        start = time.monotonic()
        with open(log, "w") as out:
            for cmd in (
                ["cmake", "-S", str(tree), "-B", str(build_dir), *CMAKE_FLAGS],
                ["cmake", "--build", str(build_dir), "--target", "llama-server", "-j", str(jobs)],
            ):
                if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False).returncode:
                    tail = log.read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"llama-server build failed ({' '.join(cmd)}):\n{tail}")
        (built,) = build_dir.glob("bin/llama-server")
        binary.parent.mkdir(exist_ok=True)
        shutil.copy2(built, binary)
        (directory / "build-seconds.txt").write_text(f"{time.monotonic() - start:.0f}\n")
        return binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:     # 503 while the model loads
        return e.code, e.read()


def post_json(url: str, body: dict, timeout: float = 600.0) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


@contextlib.contextmanager
def running(argv: list[str], log: Path, tries: int = 600, interval: float = 1.0) -> Iterator[str]:
    """Start a llama-server command line (``--port`` already set), wait for ``/health`` to
    answer 200 (at most ``tries`` polls ``interval`` apart: a bound, not a timing test), and
    yield its base URL; the server is stopped afterwards."""
    port = argv[argv.index("--port") + 1]
    base = f"http://127.0.0.1:{port}"
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            for _ in range(tries):
                if proc.poll() is not None:
                    raise RuntimeError(f"llama-server exited {proc.returncode}:\n"
                                       + log.read_text(errors="replace")[-3000:])
                with contextlib.suppress(OSError):
                    if _get(base + "/health")[0] == 200:
                        break
                time.sleep(interval)
            else:
                raise RuntimeError("llama-server never became healthy:\n"
                                   + log.read_text(errors="replace")[-3000:])
            yield base
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


if __name__ == "__main__":
    t0 = time.monotonic()
    path = build(sys.argv[1] if len(sys.argv) > 1 else None)
    print(f"{path} ({time.monotonic() - t0:.0f} s; build-seconds.txt: "
          f"{(path.parent.parent / 'build-seconds.txt').read_text().strip()} s)")
