# shellcheck shell=bash
# The CMake flags of llama-cpp-python's CUDA build, shared by run.sh (building on the GPU machine)
# and prepare.sh (CUDA_ARCH=NN, building here for it): CUDA for one architecture, llama.cpp's
# libraries alone (no tests, tools, server or multimodal library), FlashAttention's kernels on or
# off (CUDA_FA, see run.sh).
cuda_cmake_args() {  # ARCH FA
  echo "-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$1 -DGGML_CUDA_FA=$2 -DGGML_CUDA_NCCL=OFF" \
       "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF" \
       "-DLLAVA_BUILD=OFF -DGGML_CCACHE=OFF"
}
