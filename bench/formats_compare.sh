#!/bin/sh
# bench/formats_compare.sh — training step speed with every value NCHW
# (LOOM_FORMATS=nchw, each oneDNN convolution reordering inside) against the
# planner's formats (LOOM_FORMATS=auto: nChw8c through the blocked runs),
# side by side: each workload alternates nchw, auto, nchw, auto ... so the
# load of a shared machine falls on both. f32 (O0) and O1 bf16 in each run.
# Usage: bench/formats_compare.sh [ROUNDS] (default 2), after
#   bazel build //bench:bench_convnet //bench:bench_resnet
set -eu
ROUNDS=${1:-2}
BIN=${BIN:-bazel-bin/bench}
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), load $(cut -d' ' -f1-3 /proc/loadavg)"
run() { # name, then the command
	name=$1
	shift
	r=1
	while [ "$r" -le "$ROUNDS" ]; do
		for mode in nchw auto; do
			LOOM_FORMATS=$mode "$@" 2>/dev/null | grep -E '^\| (O[0-3]|ResNet)' |
				sed "s/^/$name round $r $mode /" || true
		done
		r=$((r + 1))
	done
}
run convnet "$BIN/bench_convnet" --steps 20 --warmup 3 --levels 01 --bf16
run resnet18 "$BIN/bench_resnet" --depth 18 --size 32 --batch-size 16 --steps 3 --warmup 1 --levels 01 --bf16
run resnet50 "$BIN/bench_resnet" --depth 50 --size 96 --batch-size 4 --steps 2 --warmup 1 --levels 01 --bf16
echo "# load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
