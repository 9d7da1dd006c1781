#!/usr/bin/env bash
# bench/gpu/lease.sh — the next lease's prepared call, from the repo root
# with .gpu-bundle carried (bazel/gpu_bundle.sh):
#   LOOM_BUNDLE_ENV_ONLY=1 .gpu-bundle/run.sh bash bench/gpu/lease.sh $OUT [SECONDS [STAGE]]
# Runs final.sh's and fp8.sh's rows in the order the open work needs them,
# within SECONDS (540: a call's 600 s less the bundle's unpacking), each
# row's limit cut to what is left (lease_gate.sh), from stage STAGE (1) on:
#   1. test_cuda_ops, every case, LOOM_REQUIRE_GPU=1 (every kernel built
#      since the last lease against the CPU), GPT-2 124M O2 and llm.c;
#   2. issue 42: GPT-2 124M and 350M at O2 bf16 against fp8 (emulated, on
#      cuBLASLt FP8, its switches), then 500 steps of bf16 and fp8 and
#      their validation losses (fp8.sh, no PyTorch);
#   3. the rest of final.sh: the GPT switches, world 2 on one GPU,
#      ResNet-50, the sanitizers;
#   4. PyTorch compiled bf16 and torchao float8 at 124M and 350M.
# A second call goes on with the stage the first one did not finish (its
# rows already run can be left out with LOOM_LEASE_SKIP="name ...").
o=${1:?usage: bench/gpu/lease.sh OUT [SECONDS [STAGE]]}
secs=${2:-540}
from=${3:-1}
here=$(dirname "$0")
export LOOM_LEASE_END=$(($(date +%s) + secs))
mkdir -p "$o"
# a row left out leaves no log: the scripts' greps of it say nothing
exec 2> >(grep -av ': No such file or directory$' >&2)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 2
echo "loom bundle $(cat .gpu-bundle/COMMIT 2>/dev/null); lease until $(date -u -d "@$LOOM_LEASE_END" +%T) UTC"
first="test_cuda_ops gpt_O2 llmc"
stage() { # n: whether stage n runs
	[ "$1" -ge "$from" ] && [ $(($(date +%s) + 10)) -lt "$LOOM_LEASE_END" ] &&
		echo "=== stage $1 ($((LOOM_LEASE_END - $(date +%s))) s left)"
}
stage 1 && LOOM_LEASE_ONLY="$first" bash "$here/final.sh" "$o"
stage 2 && LOOM_FP8_TORCH=0 LOOM_LEASE_SKIP="test_cuda_ops_fp8 ${LOOM_LEASE_SKIP:-}" \
	bash "$here/fp8.sh" "$o" 124m 350m
stage 3 && LOOM_LEASE_SKIP="$first ${LOOM_LEASE_SKIP:-}" bash "$here/final.sh" "$o"
torch=
for s in 124m 350m; do
	torch="$torch torch_gpt2_${s}_bf16_compiled torch_gpt2_${s}_float8_compiled"
done
stage 4 && LOOM_LEASE_ONLY="$torch" LOOM_FP8_VAL=none bash "$here/fp8.sh" "$o" 124m 350m
echo "=== lease.sh done ($((LOOM_LEASE_END - $(date +%s))) s left)"
