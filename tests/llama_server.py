"""``llama-server`` built from the llama.cpp that the installed llama-cpp-python vendors, and
linked against the very libllama / libggml / libmtmd it installed, so the export tests run the
exact llama.cpp specli itself runs on.

The sdist of the installed version is fetched with pip (PyPI only) and unpacked into
``~/.cache/specli/llama-server/<version>/`` (override the root with
``SPECLI_LLAMA_SERVER_CACHE``), outside the repository. Its vendored headers are the ones the
installed libraries were built from (same sdist, same commit: the same ABI), so only the
server, ``common`` and cpp-httplib are compiled (``tests/llama-server/CMakeLists.txt``, which
runs upstream's CMakeLists for each), not llama.cpp and ggml again. One binary per version and
library folder; a lock file makes concurrent test runs wait for one build. Network-free build:
no curl, no OpenSSL, no web UI download. `.ci/run` builds it before the tests with
``python tests/llama_server.py`` (which prints the time taken); a test builds it on demand.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
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
PROJECT = Path(__file__).parent / "llama-server"  # the CMake project: server + common on the installed libs


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


def installed_libs() -> Path:
    """site-packages/llama_cpp/lib: the shared libraries llama-cpp-python installed."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        raise RuntimeError(f"{PACKAGE} is not installed")
    return Path(spec.origin).parent / "lib"


def build(jobs: int | None = None) -> Path:
    """The built ``llama-server`` binary; builds it (once per installed version and library
    folder) when missing."""
    ver, libs, jobs = version(), installed_libs(), jobs or os.cpu_count() or 2
    directory = cache_dir(ver)
    where = hashlib.sha256(str(libs.resolve()).encode()).hexdigest()[:12]
    binary = directory / f"bin-{where}" / "llama-server"
    tree = _unpack_sdist(directory, ver)
    with _locked(directory, "build"):
        if binary.is_file():
            return binary
        build_dir = directory / f"build-{where}"
        log = directory / "build.log"
        start = time.monotonic()
        with open(log, "w") as out:
            for cmd in (
                ["cmake", "-S", str(PROJECT), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                 f"-DLLAMA_SRC={tree}", f"-DLLAMA_LIB={libs}", f"-DLLAMA_CPP_PYTHON_VERSION={ver}"],
                ["cmake", "--build", str(build_dir), "--target", "llama-server", "-j", str(jobs)],
            ):
                if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False).returncode:
                    tail = log.read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"llama-server build failed ({' '.join(cmd)}):\n{tail}")
        binary.parent.mkdir(exist_ok=True)
        shutil.copy2(build_dir / "bin" / "llama-server", binary)  # its RPATH names the installed libraries
        (binary.parent / "build-seconds.txt").write_text(f"{time.monotonic() - start:.0f}\n")
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
    path = build()
    print(f"{path} ({time.monotonic() - t0:.0f} s; build-seconds.txt: "
          f"{(path.parent / 'build-seconds.txt').read_text().strip()} s)")
