#!/usr/bin/env bash
# Run HERE (a machine that reaches PyPI), once, before `bash benchmarks/gpu/run.sh` on the GPU machine.
# Fills benchmarks/gpu/cache/ (git-ignored; the device tool carries it with `carry`):
#   llama_cpp_python-0.3.36.tar.gz  the sdist, trimmed of what a CUDA build of the Python package
#                                   never reads (llama.cpp's vocab test files, docs, web UI, other
#                                   backends' sources...): 73 MiB -> ~11 MiB
#   wheels/                         fallbacks for every Python package the build, specli and the
#                                   chosen tests import, for the device's Python (DEVICE_PY, 3.12)
#   smollm2-tokenizer.gguf          the SmolLM2 tokenizer alone (no tensors): the tiny test models and
#                                   the synthetic benchmark models are built on it there
#   traces/                         left for recorded traces (research/studies/replay.py --traces)
#   llama_cpp_cuda.whl (+ .txt)     only with CUDA_ARCH=NN and nvcc here: llama-cpp-python built with
#                                   CUDA for that architecture, which run.sh unpacks instead of building
# and prints its size (the whole travelling tree must stay under 64 MiB; this aims under 60).
#
#   SDIST=/path/llama_cpp_python-0.3.36.tar.gz DEVICE_PY=3.12 [CUDA_ARCH=90] bash benchmarks/gpu/prepare.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
HERE=benchmarks/gpu
CACHE=$HERE/cache
SDIST=${SDIST:-/tmp/sdist/llama_cpp_python-0.3.36.tar.gz}
DEVICE_PY=${DEVICE_PY:-3.12}   # the GPU image's python3 is 3.12 (.library/device/KINDS.md)
PY=${PYTHON:-python3}
NAME=llama_cpp_python-0.3.36

git check-ignore -q "$CACHE/x" || { echo "prepare: $CACHE/ is not git-ignored (see .gitignore)" >&2; exit 1; }
mkdir -p "$CACHE/wheels" "$CACHE/traces"

# 1. the trimmed sdist ------------------------------------------------------------------------
if [ ! -f "$CACHE/$NAME.tar.gz" ]; then
  [ -f "$SDIST" ] || { echo "prepare: no sdist at $SDIST (set SDIST=...)" >&2; exit 1; }
  tmp=$(mktemp -d)
  tar -xzf "$SDIST" -C "$tmp"
  v=$tmp/$NAME/vendor/llama.cpp
  # nothing here is read when CMake configures and builds llama + ggml (+ CUDA) for the package
  rm -rf "$tmp/$NAME"/{.git,.github,examples,docs,docker,tests} \
         "$v"/{models,docs,media,benches,tests,examples,pocs,app,gguf-py,conversion,.devops,.github,ci,skills,requirements} \
         "$v"/tools/{ui,server} \
         "$v"/ggml/src/{ggml-sycl,ggml-vulkan,ggml-opencl,ggml-hexagon,ggml-metal,ggml-et,ggml-cann,ggml-openvino,ggml-virtgpu,ggml-webgpu,ggml-zdnn,ggml-zendnn}
  tar -C "$tmp" -czf "$CACHE/$NAME.tar.gz" "$NAME"
  rm -rf "$tmp"
fi

# 2. wheels for the device's Python -------------------------------------------------------------
# Pinned to what is installed here where it is (what the tests ran with), newest otherwise.
# The GPU image already has most of these (KINDS.md): run.sh installs only what is missing there.
# Not carried: cmake (28 MiB; the image has CMake), huggingface-hub (only `specli models` uses it).
PKGS="numpy typing-extensions diskcache jinja2 markupsafe pyyaml gguf tqdm filelock
      typer click shellingham rich markdown-it-py mdurl pygments
      scikit-build-core pathspec packaging ninja pytest pluggy iniconfig"
reqs=$($PY - $PKGS <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
out = []
for name in sys.argv[1:]:
    try:
        out.append(f"{name}=={version(name)}")
    except PackageNotFoundError:
        out.append(name)
print(" ".join(out))
EOF
)
$PY -m pip download -q --no-deps --only-binary=:all: --python-version "$DEVICE_PY" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
  --disable-pip-version-check -d "$CACHE/wheels" $reqs 2>&1 | { grep -v "is ignored: it is neither" || true; }

# 3. the tokenizer ----------------------------------------------------------------------------
[ -f "$CACHE/smollm2-tokenizer.gguf" ] || $PY $HERE/synth_models.py tokenizer --out "$CACHE/smollm2-tokenizer.gguf"

# 4. optional: a CUDA wheel for one GPU architecture, built here -------------------------------
# CUDA_ARCH=90 (H100/H200): with nvcc here, the wheel the GPU machine would spend ~4 minutes of
# its 10 building is built here instead (2 cores: ~40 minutes), and run.sh only unpacks it when the
# GPU's compute capability matches. cuBLAS comes from PyPI (nvidia-cublas, the toolkit's major
# version) and the driver library is linked against a stand-in (the real libcuda.so.1 is on the GPU
# machine); both stay in a temporary folder, nothing is installed. CPU code: x86-64-v3 (AVX2, FMA,
# F16C, BMI2), not this machine's -march=native. FlashAttention kernels off unless CUDA_FA=ON, as in run.sh.
if [ -n "${CUDA_ARCH:-}" ] && [ ! -f "$CACHE/llama_cpp_cuda.whl" ]; then
  NVCC=${CUDACXX:-$(command -v nvcc || true)}
  [ -n "$NVCC" ] || { echo "prepare: CUDA_ARCH is set but there is no nvcc here" >&2; exit 1; }
  # the real nvcc, not a wrapper script (CMake takes the toolkit's folders from its location)
  real=$(sed -n 's/^exec \([^ ]*nvcc\) .*/\1/p' "$NVCC" 2>/dev/null | head -1 || true)
  if [ -n "$real" ] && [ -x "$real" ]; then NVCC=$real; fi
  cuda=$("$NVCC" --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1.\2/p')
  major=${cuda%%.*}
  if [ "$major" -ge 13 ]; then blas="nvidia-cublas==$cuda.*"; else blas="nvidia-cublas-cu$major"; fi
  tk=$(mktemp -d)
  $PY -m pip download -q --no-deps --disable-pip-version-check -d "$tk" "$blas" 2>&1 | { grep -v "is ignored" || true; }
  $PY -m zipfile -e "$tk"/nvidia_cublas*.whl "$tk/x"
  mkdir -p "$tk/lib/stubs" "$tk/include"
  cp "$(dirname "$(find "$tk/x" -name 'cublas_v2.h' | head -1)")"/*.h "$tk/include/"
  for f in $(find "$tk/x" -name 'libcublas*.so.*'); do
    cp "$f" "$tk/lib/"; b=$(basename "$f"); ln -sf "$b" "$tk/lib/${b%%.so.*}.so"
  done
  # the driver functions ggml-cuda calls, for the linker only
  printf 'int %s(void){return 999;}\n' cuMemUnmap cuMemSetAccess cuMemRelease cuMemMap \
    cuMemGetAllocationGranularity cuMemCreate cuMemAddressReserve cuMemAddressFree cuGetErrorString \
    cuDeviceGetAttribute cuDeviceGet > "$tk/stub.c"
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$tk/lib/stubs/libcuda.so" "$tk/stub.c"
  . "$HERE/cuda_flags.sh"
  flags="$(cuda_cmake_args "$CUDA_ARCH" "${CUDA_FA:-OFF}") -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON \
-DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
  echo "prepare: building llama-cpp-python with CUDA $cuda for sm_$CUDA_ARCH here (long)"
  # --no-cache-dir: pip would otherwise hand back a wheel it cached from this same sdist, built
  # with other flags (another architecture)
  CUDACXX=$NVCC CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
  CMAKE_ARGS="$flags -DCMAKE_LIBRARY_PATH=$tk/lib;$tk/lib/stubs -DCMAKE_CUDA_FLAGS=-I$tk/include -DCMAKE_CXX_FLAGS=-I$tk/include" \
    $PY -m pip wheel -q --no-deps --no-build-isolation --no-cache-dir --disable-pip-version-check -w "$tk/wheel" \
      "$CACHE/$NAME.tar.gz"
  # the wheel holds each library up to six times (.so, .so.0 and .so.0.x.y, under llama_cpp/lib
  # and lib/): keep llama_cpp/ with the names the loaders ask for (~29 of 185 MiB)
  $PY - "$tk"/wheel/llama_cpp_python-*.whl "$CACHE/llama_cpp_cuda.whl" <<'EOF'
import re, sys, zipfile
src, dst = sys.argv[1:]
lib = re.compile(r"llama_cpp/lib/(libllama\.so|libggml\.so|lib[\w-]+\.so\.\d+)$")
with zipfile.ZipFile(src) as z, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as out:
    for i in z.infolist():
        name = i.filename
        if name.startswith("llama_cpp_python-") or (name.startswith("llama_cpp/") and (
                not name.startswith("llama_cpp/lib/") or lib.match(name))):
            out.writestr(i, z.read(i))
EOF
  printf 'arch=%s\ncuda=%s\ncublas=%s\nflags=%s\n' "$CUDA_ARCH" "$cuda" "$(basename "$tk"/nvidia_cublas*.whl)" \
    "$flags" > "$CACHE/llama_cpp_cuda.txt"
  rm -rf "$tk"
fi

# 5. sizes ------------------------------------------------------------------------------------
echo "cache:"
du -sh "$CACHE"/* | sed 's/^/  /'
cache_b=$(du -sb "$CACHE" | cut -f1)
tree_b=$(git ls-files -z -co --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
echo "carried cache: $((cache_b / 1048576)) MiB; tracked + untracked tree: $((tree_b / 1048576)) MiB;" \
     "travels in all: $(((cache_b + tree_b) / 1048576)) MiB (limit 64)"
if [ $((cache_b + tree_b)) -gt $((60 * 1048576)) ]; then
  echo "prepare: over 60 MiB: trim $CACHE or the tree before running on the device" >&2
  exit 1
fi
