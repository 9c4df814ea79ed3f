#!/usr/bin/env bash
# specli on one NVIDIA GPU, in one command, with nothing to download (see README.md beside this):
#   1 deps    install from benchmarks/gpu/cache/wheels whatever python3 lacks (into $WORK/site)
#   2 build   llama-cpp-python 0.3.36 with CUDA for this GPU's architecture only, from the carried sdist
#             (or the wheel prepare.sh built for it with CUDA_ARCH=NN, unpacked)
#   3 synth   synthetic Qwen2.5-7B / 0.5B-shaped Q4_K_M GGUFs (in the background, during the build)
#   4 load    the 0.5B loaded fully offloaded and decoded; on a crash, a backtrace and loading
#             variants (load_check.py) until one works, which the later phases then use
#   5 costs   the 7B's verify cost curve and the 0.5B's per-token cost -> $OUT/gpu-costs.json
#   6 replay  python -m research.studies.replay --no-measured --costs $OUT/gpu-costs.json --traces benchmarks/gpu/cache/traces
#   7 heads   what an EAGLE-3, a DFlash and an MTP-only head cost per pass on synthetic weights
#             (head_costs.py) -> gpu-costs.json's "heads"
#   8 tests   the exactness tests with every model offloaded
# Each phase has its own time limit inside a total of BUDGET seconds (570); a failed phase does not
# stop the later ones. Prints each phase's time; $OUT gets run.log, gpu-costs.json, models.json,
# build.log.gz, tests.xml, replay.md + replay.json, phases.json (8 files, the most that come back).
#
#   bash benchmarks/gpu/run.sh                 # on the GPU machine (OUT set by the device tool)
#   DRY_RUN=1 bash benchmarks/gpu/run.sh       # anywhere: no CUDA build (uses the installed
#                                              # llama_cpp), tiny models, a few tests
set -uo pipefail
cd "$(dirname "$0")/../.."
T0=$(date +%s)
BUDGET=${BUDGET:-570}
DRY=${DRY_RUN:-0}
HERE=$PWD/benchmarks/gpu
CACHE=$HERE/cache
if [ "$DRY" = 1 ]; then WORK=${WORK:-/tmp/specli-gpu-dry}; else WORK=${WORK:-/tmp/specli-gpu}; fi
OUT=${OUT:-$WORK/out}
SITE=$WORK/site
MODELS=$WORK/models
PY=${PYTHON:-python3}
JOBS=$(nproc)
SDIST=$CACHE/llama_cpp_python-0.3.36.tar.gz
if [ "$DRY" = 1 ]; then
  SCALE=tiny; K_MAX=${K_MAX:-8}; REPS=${REPS:-2}; TEST_K=${TEST_K:-prompt_lookup_is_plain}
else
  SCALE=full; K_MAX=${K_MAX:-32}; REPS=${REPS:-5}; TEST_K=${TEST_K:-not cli}
fi
GPU_LAYERS=${GPU_LAYERS:--1}
# FlashAttention kernels off by default: with them the CUDA build may not fit its 420 s on 16 cores
# (their ~80 template instances are the slowest files); specli's f32-KV tests disable FA anyway,
# and at the contexts measured (a few hundred tokens) a 7B pass is its weights, not its attention
CUDA_FA=${CUDA_FA:-OFF}
. "$HERE/cuda_flags.sh"
mkdir -p "$OUT" "$SITE" "$MODELS"
exec > >(tee -a "$OUT/run.log") 2>&1
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PATH="$SITE/bin:$PATH" PYTHONUNBUFFERED=1
export SPECLI_CACHE=$WORK/specli-cache SPECLI_TEST_CACHE=$WORK/test-models
command -v nvcc >/dev/null || export PATH="$PATH:/usr/local/cuda/bin"
export HERE CACHE WORK OUT SITE MODELS PY JOBS SDIST SCALE K_MAX REPS TEST_K GPU_LAYERS DRY CUDA_FA

MACHINE=$(nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>/dev/null | head -1)
MACHINE=${MACHINE:-no GPU visible (nvidia-smi failed)}
export MACHINE="$MACHINE; $(nproc) CPUs; $($PY -V 2>&1)"
echo "run.sh: $MACHINE; DRY_RUN=$DRY; WORK=$WORK; OUT=$OUT; budget ${BUDGET}s"

PHASES=()
record() {  # name rc seconds
  PHASES+=("{\"phase\": \"$1\", \"rc\": $2, \"seconds\": $3}")
  echo "== $1: $([ "$2" = 0 ] && echo ok || echo "FAILED (rc $2)") in $3 s (total $(( $(date +%s) - T0 )) s)"
}
phase() {  # name max_seconds function: runs it under its own timeout, clipped to the time left
  local name=$1 max=$2 fn=$3 left lim s rc
  left=$(( BUDGET - ($(date +%s) - T0) - 5 ))
  lim=$(( max < left ? max : left ))
  if [ "$lim" -lt 10 ]; then echo "== $name: SKIPPED (no time left)"; record "$name" 124 0; return; fi
  echo "== $name (limit ${lim} s)"
  s=$(date +%s)
  timeout -k 5 "$lim" bash -c "$fn"
  rc=$?
  [ $rc = 124 ] && echo "== $name: TIMED OUT after ${lim} s"
  record "$name" $rc $(( $(date +%s) - s ))
}

deps() {
  local missing
  missing=$($PY - <<'EOF'
import re
from importlib.metadata import PackageNotFoundError, version
REQS = """numpy>=1.24 typing-extensions>=4.5 diskcache>=5.6.1 jinja2>=3 markupsafe>=2 pyyaml>=6 gguf>=0.10
tqdm filelock typer>=0.12 click rich>=13 shellingham markdown-it-py mdurl pygments
scikit-build-core>=0.9.2 pathspec packaging ninja pytest>=7 pluggy iniconfig""".split()
def key(v):
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])
out = []
for r in REQS:
    name, _, low = r.partition(">=")
    try:
        if low and key(version(name)) < key(low):
            out.append(name)
    except PackageNotFoundError:
        out.append(name)
print(" ".join(out))
EOF
)
  missing="$missing ${DEPS_FORCE:-}"  # DEPS_FORCE="a b": install these from the wheelhouse anyway (tests this path)
  missing=$(echo $missing)
  echo "missing or too old: ${missing:-nothing}"
  [ -z "$missing" ] && return 0
  # shellcheck disable=SC2086
  $PY -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check \
      --find-links "$CACHE/wheels" --target "$SITE" $missing
}

build() {
  if [ "$DRY" = 1 ]; then
    echo "DRY_RUN: no build; llama_cpp from $($PY -c 'import llama_cpp, os; print(os.path.dirname(llama_cpp.__file__))')"
  fi
  if $PY -c 'import sys, llama_cpp; sys.exit(0 if llama_cpp.llama_supports_gpu_offload() else 1)' 2>/dev/null; then
    echo "llama_cpp with GPU offload is importable already: not building"; return 0
  fi
  local cc
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  [ -n "$cc" ] || { echo "build: nvidia-smi gave no compute capability"; [ "$DRY" = 1 ] && cc=90 || return 1; }
  # a wheel prepare.sh built for this architecture (CUDA_ARCH=NN) saves the build's minutes here
  local pre=$CACHE/llama_cpp_cuda.whl
  if [ -f "$pre" ] && grep -qx "arch=$cc" "$CACHE/llama_cpp_cuda.txt" 2>/dev/null; then
    echo "prebuilt wheel: $(tr '\n' ' ' < "$CACHE/llama_cpp_cuda.txt")"
    if [ "$DRY" = 1 ]; then echo "DRY_RUN: not unpacked"; return 0; fi
    $PY -m zipfile -e "$pre" "$SITE" \
      && $PY -c 'import sys, llama_cpp; ok = llama_cpp.llama_supports_gpu_offload(); print("prebuilt: GPU offload", ok); sys.exit(not ok)' \
      && return 0
    echo "the prebuilt wheel does not load here: building from the sdist"
    rm -rf "$SITE/llama_cpp" "$SITE"/llama_cpp_python-*.dist-info
  fi
  export CUDACXX=${CUDACXX:-$(command -v nvcc)}
  CMAKE_ARGS=$(cuda_cmake_args "$cc" "$CUDA_FA")
  export CMAKE_ARGS
  export CMAKE_BUILD_PARALLEL_LEVEL=$JOBS
  local cmd=("$PY" -m pip install --no-index --no-deps --no-build-isolation --no-compile --disable-pip-version-check
             -v --target "$SITE" --config-settings=build-dir="$WORK/build" "$SDIST")
  echo "nvcc: ${CUDACXX:-none}; cmake: $(cmake --version 2>/dev/null | head -1); CMAKE_ARGS=$CMAKE_ARGS"
  echo "${cmd[*]}"
  if [ "$DRY" = 1 ]; then echo "DRY_RUN: the command above is not run"; return 0; fi
  local rc
  "${cmd[@]}" > "$WORK/build.log" 2>&1 &
  local pid=$!
  local n=0
  while kill -0 $pid 2>/dev/null; do  # progress every 30 s: ninja's last [n/N]
    sleep 2; n=$((n + 1))
    [ $((n % 15)) = 0 ] && grep -o '^\[[0-9]*/[0-9]*\]' "$WORK/build.log" | tail -1 | sed "s/^/  build $((n * 2)) s: /"
  done
  wait $pid; rc=$?
  gzip -c "$WORK/build.log" > "$OUT/build.log.gz"
  [ $rc = 0 ] || { echo "build failed; the end of its log:"; tail -40 "$WORK/build.log"; return $rc; }
  $PY -c 'import llama_cpp; print("built: GPU offload", llama_cpp.llama_supports_gpu_offload())'
}

synth() {
  if [ -f "$MODELS/models.json" ]; then echo "models already written: $MODELS"; return 0; fi
  $PY "$HERE/synth_models.py" models --scale "$SCALE" --tokenizer "$CACHE/smollm2-tokenizer.gguf" --out "$MODELS"
}

loadcheck() {
  # the draft model fully offloaded, loaded and decoded, first as specli loads it; on a crash, a
  # native backtrace, then loading variants until one works: later phases take its environment
  local m=$MODELS/draft.gguf v rc
  local variants=(""
    "SPECLI_GPU_LLAMA_FIRST=1"
    "SPECLI_LLAMA_LOG=1"
    "SPECLI_LLAMA_LOG=1 GGML_CUDA_NO_PINNED=1"
    "SPECLI_LLAMA_LOG=1 SPECLI_GPU_MODEL_PARAMS=load_mode=0"
    "SPECLI_LLAMA_LOG=1 SPECLI_GPU_MODEL_PARAMS=use_extra_bufts=0,no_host=1"
    "SPECLI_LLAMA_LOG=1 GGML_CUDA_NO_PINNED=1 SPECLI_GPU_MODEL_PARAMS=load_mode=0,lazy_mode=0,use_extra_bufts=0,no_host=1")
  [ -f "$m" ] || { echo "load check: no $m"; return 1; }
  : > "$WORK/variant.env"
  for v in "${variants[@]}"; do
    echo "-- load check with: ${v:-the defaults}"
    # shellcheck disable=SC2086
    env $v timeout 60 $PY "$HERE/load_check.py" "$m" --gpu-layers "$GPU_LAYERS" < /dev/null > "$WORK/lc.log" 2>&1
    rc=$?
    grep -v '^llama_model_loader: - \|^print_info\|^load_tensors: layer ' "$WORK/lc.log" | tail -20
    if [ $rc = 0 ]; then
      # later phases keep specli's log callback unless doing without it was the whole fix
      for x in $v; do [ "$x" = SPECLI_LLAMA_LOG=1 ] && [ "$v" != "$x" ] || echo "export $x"; done > "$WORK/variant.env"
      echo "load check: OK with ${v:-the defaults}"; return 0
    fi
    if [ -z "$v" ] && command -v cuda-gdb >/dev/null; then
      echo "-- native backtrace (cuda-gdb)"
      timeout 90 cuda-gdb -q -batch -ex run -ex "bt 30" --args "$PY" "$HERE/load_check.py" "$m" < /dev/null 2>&1 \
        | grep -v '^\[New Thread\|^\[Thread\|^llama_model_loader: - ' | tail -45
    fi
  done
  echo "-- the same with no layer offloaded (does the loader crash with the GPU merely present?)"
  SPECLI_LLAMA_LOG=1 timeout 60 $PY "$HERE/load_check.py" "$m" --gpu-layers 0 < /dev/null 2>&1 \
    | grep -v '^llama_model_loader: - \|^print_info\|^load_tensors: layer \|^create_tensor\|^llama_graph_n_input' | tail -8
  echo "-- the C++ runtime each library needs, and any C++ locale code it carries itself"
  for f in "$SITE"/llama_cpp/lib/{libllama.so,libggml-cuda.so.0}; do
    [ -f "$f" ] && echo "$(basename "$f"): $(readelf -d "$f" 2>/dev/null | grep -o 'libstdc++[^]]*' | head -1 || true)" \
      "exports $(nm -DC --defined-only "$f" 2>/dev/null | grep -c ' std::locale\| std::codecvt' || true) std::locale/codecvt symbols"
  done
  echo "-- llama-cpp-python's own Llama class"
  timeout 60 $PY "$HERE/load_check.py" "$m" --llama-cpp < /dev/null 2>&1 | grep -v '^llama_model_loader: - ' | tail -20
  return 1
}

costs() {
  . "$WORK/variant.env" 2>/dev/null
  $PY "$HERE/gpu_costs.py" --models "$MODELS" --out "$OUT/gpu-costs.json" --gpu-layers "$GPU_LAYERS" \
      --threads "$JOBS" --k-max "$K_MAX" --reps "$REPS" --machine "$MACHINE"
}

tests() {
  . "$WORK/variant.env" 2>/dev/null
  # ggml-cuda asks cuBLAS for TF32 (CUBLAS_TF32_TENSOR_OP_MATH): f32 products of a batch keep 10
  # mantissa bits while one token's do not, which moves the tiny f32 models' logits by ~1e-3
  # between batch shapes (seen on an H200). The tests claim f32 exactness, so no TF32 for them.
  NVIDIA_TF32_OVERRIDE=${NVIDIA_TF32_OVERRIDE:-0} \
  SPECLI_TEST_GPU_LAYERS=$GPU_LAYERS SPECLI_TEST_TOKENIZER=$CACHE/smollm2-tokenizer.gguf PYTHONPATH="$HERE:$PYTHONPATH" \
    $PY -m pytest -q -rfE -p gpu_offload -p no:cacheprovider --junitxml="$OUT/tests.xml" \
      tests/test_engine_exact.py tests/test_hybrid.py -k "$TEST_K"
}

replay() {
  local later="python -m research.studies.replay --no-measured --costs gpu-costs.json --traces DIR --suites ..."
  if [ ! -f research/studies/replay.py ] || ! $PY -m research.studies.replay --help 2>&1 | grep -q -- '--traces'; then
    echo "REPLAY NOT RUN: research/studies/replay.py with --costs/--traces is not there; later, anywhere: $later"
    return 0
  fi
  local suites
  suites=$(cd "$CACHE/traces" 2>/dev/null && ls -- *.json 2>/dev/null | sed 's/\.json$//' | paste -sd, -)
  if [ -z "$suites" ]; then
    echo "REPLAY NOT RUN: no traces (SUITE.json) in $CACHE/traces (record them here, then carry); later: $later"
    return 0
  fi
  [ -f "$OUT/gpu-costs.json" ] || { echo "REPLAY NOT RUN: no $OUT/gpu-costs.json (the costs phase failed)"; return 1; }
  # --no-measured: the real target/draft are not here (traces only); a suite without a trace would
  # be recorded, which needs them, so only the carried suites are replayed. --grid-c "": no GPU-like
  # grid, only the curve just measured (the grid needs no GPU: research/results/replay.md has it)
  $PY -m research.studies.replay --no-measured --costs "$OUT/gpu-costs.json" --traces "$CACHE/traces" \
      --suites "$suites" --k-max "$K_MAX" --grid-c "" --out "$OUT/replay.md"
}

heads() {
  . "$WORK/variant.env" 2>/dev/null
  local quick=()
  [ "$DRY" = 1 ] && quick=(--quick)
  # into gpu-costs.json (under "heads"): the files that come back are few
  $PY "$HERE/head_costs.py" --tokenizer "$CACHE/smollm2-tokenizer.gguf" --out "$OUT/gpu-costs.json" \
      --cache "$WORK/head-models" --gpu-layers "$GPU_LAYERS" --threads "$JOBS" --reps "$REPS" "${quick[@]}"
}
export -f deps build synth loadcheck costs tests replay heads cuda_cmake_args

phase deps 90 deps
# the models need only numpy + gguf: write them while the build keeps the CPUs busy
SYNTH_LIMIT=$(( BUDGET - 120 ))
( s=$(date +%s); timeout -k 5 "$SYNTH_LIMIT" bash -c synth > "$WORK/synth.log" 2>&1; echo "$? $(( $(date +%s) - s ))" > "$WORK/synth.rc" ) &
SYNTH_PID=$!
phase build "${BUILD_LIMIT:-420}" build
echo "== synth (background since the start of the build): waiting"
wait $SYNTH_PID
cat "$WORK/synth.log"
read -r rc secs < "$WORK/synth.rc"
record synth "$rc" "$secs"
[ -f "$MODELS/models.json" ] && cp "$MODELS/models.json" "$OUT/models.json"
phase loadcheck 120 loadcheck
phase costs 150 costs
# the replay first: it is the figures this run is for, and takes seconds
phase replay 60 replay
phase heads 75 heads
phase tests 240 tests

printf '[%s]\n' "$(IFS=,; echo "${PHASES[*]}")" > "$OUT/phases.json"
echo "== done in $(( $(date +%s) - T0 )) s:"
for p in "${PHASES[@]}"; do echo "  $p"; done
[ -f "$OUT/gpu-costs.json" ] && echo "cost curve: $OUT/gpu-costs.json"
