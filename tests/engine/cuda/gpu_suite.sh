#!/usr/bin/env bash
# tests/engine/cuda/gpu_suite.sh — what runs on a GPU host, from a bundle made
# by bazel/gpu_bundle.sh (bin/ next to this script; run.sh sets the library
# path and calls this). Runs the CUDA test suites, a short ConvNet benchmark
# on CUDA, the example's --help and, when the bundle carries Fashion-MNIST,
# two epochs of the example under O0, O1 and O2 on the GPU; then
# prints one table: what ran, its exit status, seconds, and the last line.
set -u
here=$(cd "$(dirname "$0")" && pwd)
bin=$here/bin
logs=$here/logs
mkdir -p "$logs"
rows=()
failed=0

run() { # name, command...
	local name=$1
	shift
	if [ ! -x "$1" ]; then
		rows+=("$name|absent|0|not in this bundle")
		return
	fi
	local t0 t1 rc
	t0=$(date +%s.%N)
	"$@" >"$logs/$name.log" 2>&1
	rc=$?
	t1=$(date +%s.%N)
	[ $rc -ne 0 ] && failed=$((failed + 1))
	rows+=("$name|$rc|$(awk "BEGIN { print $t1 - $t0 }")|$(grep -v '^$' "$logs/$name.log" | tail -n 1 | cut -c1-90)")
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
	echo "nvidia-smi: not found"
run test_device "$bin/test_device" --verbose
run test_cuda_ops "$bin/test_cuda_ops" --verbose
run bench_convnet "$bin/bench_convnet" --device cuda --steps 50 --warmup 5
run mnist_ddp_help "$bin/mnist_ddp" --help
if [ -d "$here/data" ]; then
	for lvl in O0 O1 O2; do
		run "mnist_ddp_$lvl" "$bin/mnist_ddp" --device cuda --data "$here/data" --epochs 2 \
			--opt-level "$lvl" --log-interval 200
	done
fi
# PyTorch on the same GPU in the same call (bench/torch_gpu.py), when the
# host's python has torch: the other side of the issue-13 comparison.
py=$(command -v python3 || true)
if [ -n "$py" ] && [ -f "$here/bench/torch_gpu.py" ] &&
	"$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
	data_flag=()
	[ -d "$here/data" ] && data_flag=(--data "$here/data")
	run torch_convnet_b100 "$py" "$here/bench/torch_gpu.py" convnet --batch 100 "${data_flag[@]}"
	run torch_convnet_b1024 "$py" "$here/bench/torch_gpu.py" convnet --batch 1024 "${data_flag[@]}"
	run torch_resnet50_b128 "$py" "$here/bench/torch_gpu.py" resnet50 --batch 128 --steps 50
else
	rows+=("torch|absent|0|no python3 with CUDA torch on this host")
fi

printf '\n%-16s %-6s %-8s %s\n' what rc seconds "last line"
for r in "${rows[@]}"; do
	IFS='|' read -r name rc secs last <<<"$r"
	printf '%-16s %-6s %-8.1f %s\n' "$name" "$rc" "$secs" "$last"
done
echo "logs: $logs ($failed failed)"
[ $failed -eq 0 ]
