#!/usr/bin/env bash
# bench/gpu/build_llmc.sh — builds llm.c's train_gpt2cu, the GPU suite's GPT-2
# reference (bazel/gpu_bundle.sh bundles it from LOOM_LLMC_BIN), beside the
# repo and never part of loom's build: bf16, cuDNN attention, one GPU, no
# MPI, sm_90 (H100/H200), as the 2026-11-27 runs measured it.
# usage: bench/gpu/build_llmc.sh LLMC_SRC FRONTEND_SRC OUT_DIR
#   LLMC_SRC      a karpathy/llm.c checkout or bare git dir (f1e2ace measured)
#   FRONTEND_SRC  an NVIDIA/cudnn-frontend checkout or bare git dir (3929da2)
#   OUT_DIR       where train_gpt2cu lands (a work folder beside it)
# cuDNN's headers and library come from the PyTorch venv (TORCH_VENV, default
# /work/venv-torch: site-packages/nvidia/cudnn), nvcc from CUDA_HOME (default
# /usr/local/cuda). One edit for CUDA 13, where cudaMemAdvise takes a
# cudaMemLocation, not a device id. A few minutes of nvcc on two cores.
set -euo pipefail
src=${1:?usage: build_llmc.sh LLMC_SRC FRONTEND_SRC OUT_DIR}
fe=${2:?usage: build_llmc.sh LLMC_SRC FRONTEND_SRC OUT_DIR}
out=${3:?usage: build_llmc.sh LLMC_SRC FRONTEND_SRC OUT_DIR}
cuda=${CUDA_HOME:-/usr/local/cuda}
venv=${TORCH_VENV:-/work/venv-torch}
cudnn=$(ls -d "$venv"/lib/python3*/site-packages/nvidia/cudnn 2>/dev/null | head -n 1)
[ -n "$cudnn" ] && [ -f "$cudnn/include/cudnn.h" ] ||
	{ echo "build_llmc: no cuDNN in $venv (bench/setup_torch.sh installs torch with it)" >&2; exit 1; }
[ -x "$cuda/bin/nvcc" ] || { echo "build_llmc: no nvcc in $cuda/bin" >&2; exit 1; }

mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$out/work
rm -rf "$work"
# The Makefile looks for ./cudnn-frontend/include (or ~/cudnn-frontend).
fe_dir=$work/llmc/cudnn-frontend
mkdir -p "$work/llmc" "$fe_dir" "$work/lib"
# A checkout or a bare mirror alike: its committed tree.
tree() { # repo dest
	if [ -d "$1/.git" ] || [ "$(git -C "$1" rev-parse --is-bare-repository 2>/dev/null)" = true ]; then
		git -C "$1" archive HEAD | tar -x -C "$2"
	else
		cp -r "$1"/. "$2"/
	fi
}
tree "$src" "$work/llmc"
tree "$fe" "$fe_dir"
echo "llm.c $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo '?'), cudnn-frontend $(git -C "$fe" rev-parse --short HEAD 2>/dev/null || echo '?')"

# CUDA 13: cudaMemAdvise(ptr, bytes, advice, cudaMemLocation).
if "$cuda/bin/nvcc" --version | grep -q 'release 1[3-9]'; then
	sed -i 's/cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' \
		"$work/llmc/llmc/cuda_utils.cuh"
fi
# -lcudnn: the wheel ships libcudnn.so.9 only. -lnvidia-ml (the Makefile
# always asks for it; the driver's library, absent on a build machine
# without one, and unused where the toolkit has no nvml.h): an empty
# stand-in with the driver library's soname. cudnn-frontend's kernel
# compiler needs NVRTC and the driver (-lcuda: the toolkit's stub), last on
# the line (NVCC_LDLIBS: empty without NCCL and MPI).
ln -sf "$cudnn/lib/libcudnn.so.9" "$work/lib/libcudnn.so"
if ! ls /usr/lib/x86_64-linux-gnu/libnvidia-ml.so* "$cuda"/lib64/stubs/libnvidia-ml.so >/dev/null 2>&1; then
	echo 'void loom_nvml_stand_in(void) {}' >"$work/lib/nvml.c"
	gcc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o "$work/lib/libnvidia-ml.so" "$work/lib/nvml.c"
fi
make -C "$work/llmc" train_gpt2cu NVCC="$cuda/bin/nvcc" USE_CUDNN=1 NO_MULTI_GPU=1 NO_USE_MPI=1 \
	GPU_COMPUTE_CAPABILITY=90 CUDNN_FRONTEND_PATH="$fe_dir/include" \
	PFLAGS="-I$cudnn/include -L$work/lib -L$cuda/lib64 -L$cuda/lib64/stubs" \
	NVCC_LDLIBS="-lnvrtc -lcuda"
cp "$work/llmc/train_gpt2cu" "$out/train_gpt2cu"
echo "built: $out/train_gpt2cu"
echo "bundle: bash bazel/gpu_bundle.sh (from ../llmc, beside the repo; else LOOM_LLMC_BIN=$out/train_gpt2cu)"
