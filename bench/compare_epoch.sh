#!/usr/bin/env bash
# Whole epochs of the ConvNet on Fashion-MNIST (batch 100, SGD lr 0.01
# momentum 0.9, seed 0, 2 threads), loom and PyTorch 1.13 alternating in one
# run so that each round sees the same state of a shared machine, printed as
# markdown for bench/RESULTS.md. Columns:
#   loom O0             //examples:mnist_ddp as the README runs it, no variable
#   loom O0 im2col      the same with LOOM_CPU_CONV=im2col (conv nodes on
#                       im2col + GEMM instead of oneDNN's conv primitives)
#   PyTorch O0          bench/torch_convnet.py train, /usr/bin/python3
#   loom O1 bf16        --opt-level O1 --precision bf16 (exact emulation)
#   loom O1 bf16 native the same with LOOM_CPU_BF16=native (bf16 GEMMs)
# Each cell: epoch img/s (train loop, as each prints it) / test accuracy /
# img/s per CPU-second of the whole process (user + sys, incl. loading and
# the test pass).
#   bench/compare_epoch.sh [rounds]     (default 2)
# LOOM_BIN overrides the folder with the built binaries (bazel-bin).
set -uo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
bin=${LOOM_BIN:-}
if [ -z "$bin" ]; then
	bazel build //examples:mnist_ddp >/dev/null 2>&1
	bin=$(bazel info bazel-bin 2>/dev/null)
fi
tf=$(mktemp)
trap 'rm -f "$tf"' EXIT

cell() { # img/s acc cpu_s -> "img/s / acc / per CPU-s"
	awk -v r="$1" -v a="$2" -v c="$3" 'BEGIN { printf "%s / %s / %.0f", r, a, 60000 / c }'
}

loom() { # env... -> cell of one epoch
	local out
	out=$(env "$@" /usr/bin/time -f "%U %S" -o "$tf" "$bin/examples/mnist_ddp" --epochs 1 \
		--device cpu --threads 2 ${LOOM_ARGS:-} 2>/dev/null | grep '^epoch 1 done')
	cell "$(sed -n 's/.*(\([0-9.]*\) img\/s).*/\1/p' <<<"$out")" \
		"$(sed -n 's/.*test accuracy \([0-9.]*%\).*/\1/p' <<<"$out")" \
		"$(awk '{ print $1 + $2 }' "$tf")"
}

torch() {
	local out
	out=$(/usr/bin/time -f "%U %S" -o "$tf" /usr/bin/python3 bench/torch_convnet.py train \
		--epochs 1 --threads 2 2>/dev/null | grep '^torch epoch 1')
	cell "$(sed -n 's/.*, \([0-9]*\) img\/s/\1/p' <<<"$out")" \
		"$(sed -n 's/.*test accuracy \([0-9.]*%\).*/\1/p' <<<"$out")" \
		"$(awk '{ print $1 + $2 }' "$tf")"
}

echo "machine: $(lscpu | sed -n 's/^Model name: *//p') (family $(sed -n 's/^cpu family\t*: //p' /proc/cpuinfo | head -1), model $(sed -n 's/^model\t*: //p' /proc/cpuinfo | head -1)), $(nproc) cores; $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "loom: $("$bin/examples/mnist_ddp" --epochs 1 --max-steps 1 --device cpu --threads 2 2>&1 | grep -m1 '^cpu:')"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "ConvNet, Fashion-MNIST, 1 epoch, batch 100, 2 threads; each cell: epoch img/s / test accuracy / img/s per CPU-second of the process"
echo
echo "| round | loom O0 | loom O0 im2col conv | PyTorch 1.13 O0 | loom O1 bf16 | loom O1 bf16 native | load avg |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for r in $(seq "$rounds"); do
	a=$(loom)
	b=$(loom LOOM_CPU_CONV=im2col)
	p=$(torch)
	h=$(LOOM_ARGS="--opt-level O1 --precision bf16" loom)
	n=$(LOOM_ARGS="--opt-level O1 --precision bf16" loom LOOM_CPU_BF16=native)
	echo "| $r | $a | $b | $p | $h | $n | $(cut -d' ' -f1 /proc/loadavg) |"
done
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
