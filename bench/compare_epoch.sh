#!/usr/bin/env bash
# Whole epochs of the ConvNet on Fashion-MNIST (batch 100, SGD lr 0.01
# momentum 0.9, seed 0, 2 threads), loom and PyTorch 1.13 alternating in one
# run so that each round sees the same state of a shared machine, printed as
# markdown for bench/RESULTS.md. Columns, in the order each round runs them:
#   loom O0             //examples:mnist_ddp as the README runs it, no variable
#   loom O0 (B)         the same from a second build, for before/after
#                       (only with LOOM_BIN_B)
#   loom O0 im2col      LOOM_CPU_CONV=im2col: conv nodes on im2col + GEMM
#                       instead of oneDNN's conv primitives (only with IM2COL=1)
#   PyTorch O0          bench/torch_convnet.py train, /usr/bin/python3
#   loom O1 bf16        --opt-level O1 --precision bf16 (exact emulation)
#   loom O1 bf16 native the same with LOOM_CPU_BF16=native (bf16 GEMMs)
#                       (both bf16 columns left out with BF16=0)
# Each cell: epoch img/s (train loop, as each prints it) / test accuracy /
# img/s per CPU-second of the whole process (user + sys, incl. loading and
# the test pass). The last column is the 1-minute load average after the round.
#   bench/compare_epoch.sh [rounds]     (default 2)
# Variables:
#   LOOM_BIN    folder holding examples/mnist_ddp (a bazel-bin); default: build
#               it with $BAZEL (default `bazel`) and use its bazel-bin
#   LOOM_BIN_B  a second such folder (the "before" build); adds a column
#   LABEL, LABEL_B  column names of the two builds (default "loom O0", "loom O0 (B)")
#   BF16=0      leave out the two O1 bf16 columns
#   IM2COL=1    add the im2col column
# Before/after table, e.g.:
#   LOOM_BIN=/tmp/new LOOM_BIN_B=/tmp/old LABEL="loom O0 (new)" \
#     LABEL_B="loom O0 (old)" BF16=0 bench/compare_epoch.sh 3
set -uo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
bin=${LOOM_BIN:-}
bin_b=${LOOM_BIN_B:-}
bf16=${BF16:-1}
im2col=${IM2COL:-0}
if [ -z "$bin" ]; then
	${BAZEL:-bazel} build //examples:mnist_ddp >/dev/null 2>&1
	bin=$(${BAZEL:-bazel} info bazel-bin 2>/dev/null)
fi
tf=$(mktemp)
trap 'rm -f "$tf"' EXIT

cell() { # img/s acc cpu_s -> "img/s / acc / per CPU-s"
	awk -v r="$1" -v a="$2" -v c="$3" 'BEGIN { printf "%s / %s / %.0f", r, a, 60000 / c }'
}

loom() { # folder env... -> cell of one epoch
	local b=$1 out
	shift
	out=$(env "$@" /usr/bin/time -f "%U %S" -o "$tf" "$b/examples/mnist_ddp" --epochs 1 \
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
head="| round | ${LABEL:-loom O0} |"
[ -n "$bin_b" ] && head+=" ${LABEL_B:-loom O0 (B)} |"
[ "$im2col" = 1 ] && head+=" loom O0 im2col conv |"
head+=" PyTorch 1.13 O0 |"
[ "$bf16" = 1 ] && head+=" loom O1 bf16 | loom O1 bf16 native |"
head+=" load avg |"
echo "$head"
echo "$head" | sed 's/[^|]\+/ --- /g'
for r in $(seq "$rounds"); do
	row="| $r | $(loom "$bin") |"
	[ -n "$bin_b" ] && row+=" $(loom "$bin_b") |"
	[ "$im2col" = 1 ] && row+=" $(loom "$bin" LOOM_CPU_CONV=im2col) |"
	row+=" $(torch) |"
	if [ "$bf16" = 1 ]; then
		row+=" $(LOOM_ARGS="--opt-level O1 --precision bf16" loom "$bin") |"
		row+=" $(LOOM_ARGS="--opt-level O1 --precision bf16" loom "$bin" LOOM_CPU_BF16=native) |"
	fi
	echo "$row $(cut -d' ' -f1 /proc/loadavg) |"
done
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
