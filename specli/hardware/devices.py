"""What this machine and this llama.cpp build can do: backend, GPUs and their free memory."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from dataclasses import dataclass, field

from specli.hardware.plan import parse_size


@dataclass
class Device:
    name: str
    total: int  # bytes
    free: int  # bytes
    kind: str  # "cuda", "metal"


@dataclass
class Hardware:
    backends: list[str]
    can_offload: bool
    devices: list[Device] = field(default_factory=list)
    budget: int | None = None  # free bytes specli plans with (None: no GPU)
    budget_source: str = "none"  # "detected", "--vram", "SPECLI_VRAM"
    threads: int = 1
    system_info: str = ""
    llama_cpp_python: str = ""


def _backends(info: str, can_offload: bool) -> list[str]:
    found = ["CPU"]
    for name in ("CUDA", "Metal", "Vulkan", "SYCL", "HIP", "ROCm", "OpenCL", "BLAS", "RPC"):
        if name.upper() in info.upper():
            found.append(name)
    if can_offload and len(found) == 1:
        found.append("GPU")
    return found


def nvidia_devices() -> list[Device]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        r = subprocess.run([exe, "--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    out = []
    for line in r.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            out.append(Device(parts[0], int(parts[1]) << 20, int(parts[2]) << 20, "cuda"))
    return out


def apple_devices() -> list[Device]:
    if platform.system() != "Darwin" or platform.machine() != "arm64":
        return []
    try:
        mem = int(subprocess.run(["sysctl", "-n", "hw.memsize"], capture_output=True, text=True,
                                 timeout=5).stdout.strip())
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return []
    # Metal's recommended working set on Apple silicon: about 2/3 of RAM, 3/4 above 36 GB
    ws = int(mem * (0.75 if mem > 36 * (1 << 30) else 2 / 3))
    return [Device("Apple silicon GPU (unified memory)", ws, ws, "metal")]


def detect(vram: str | None = None) -> Hardware:
    from specli import engine

    can = engine.supports_gpu_offload()
    info = engine.system_info()
    try:
        import llama_cpp
        ver = getattr(llama_cpp, "__version__", "?")
    except ImportError:  # pragma: no cover
        ver = "?"
    hw = Hardware(_backends(info, can), can, nvidia_devices() + apple_devices(), threads=os.cpu_count() or 1,
                  system_info=info, llama_cpp_python=ver)
    if vram:
        hw.budget, hw.budget_source = parse_size(vram), "--vram"
    elif os.environ.get("SPECLI_VRAM"):
        hw.budget, hw.budget_source = parse_size(os.environ["SPECLI_VRAM"]), "SPECLI_VRAM"
    elif hw.devices and can:
        hw.budget, hw.budget_source = hw.devices[0].free, "detected"
    return hw


def reinstall_hint(hw: Hardware) -> str | None:
    """The exact command that gives this machine a llama.cpp build that can use its GPU."""
    if hw.can_offload:
        return None
    if any(d.kind == "cuda" for d in hw.devices):
        return ('CMAKE_ARGS="-DGGML_CUDA=on" pip install --force-reinstall --no-cache-dir '
                '--no-binary llama-cpp-python llama-cpp-python')
    if any(d.kind == "metal" for d in hw.devices):
        return ('CMAKE_ARGS="-DGGML_METAL=on" pip install --force-reinstall --no-cache-dir '
                '--no-binary llama-cpp-python llama-cpp-python')
    return None
