#!/bin/sh
# bench/side_compare.sh — training step speed with oneDNN's max pooling
# and the batch-norm side buffers (engine/cpu/side.c) against loom's
# nChw8c loops, side by side: each workload alternates the variants in
# every round, so the load of a shared machine falls on all of them; f32
# (O0) and O1 bf16 in each run.
#   loops   LOOM_CPU_DNNL_POOL=0 LOOM_CPU_DNNL_BN=0 (as before side.c)
#   pool    LOOM_CPU_DNNL_POOL=1 LOOM_CPU_DNNL_BN=0 (oneDNN's pooling only)
#   saved   LOOM_CPU_DNNL_POOL=1 LOOM_CPU_DNNL_BN=saved (loom's BN loops keeping statistics)
#   dnnl    LOOM_CPU_DNNL_POOL=1 LOOM_CPU_DNNL_BN=1 (oneDNN's batch norm)
# Usage: bench/side_compare.sh [ROUNDS] (default 2), after
#   bazel build //bench:bench_convnet //bench:bench_resnet
# VARIANTS picks some ("loops saved"); WORKLOADS likewise (convnet resnet18 resnet50).
set -eu
ROUNDS=${1:-2}
BIN=${BIN:-bazel-bin/bench}
VARIANTS=${VARIANTS:-loops pool saved dnnl}
WORKLOADS=${WORKLOADS:-convnet resnet18 resnet50}
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), load $(cut -d' ' -f1-3 /proc/loadavg)"
run() { # name, then the command
	name=$1
	shift
	r=1
	while [ "$r" -le "$ROUNDS" ]; do
		for v in $VARIANTS; do
			case $v in
			loops) pool=0 bn=0 ;;
			pool) pool=1 bn=0 ;;
			saved) pool=1 bn=saved ;;
			dnnl) pool=1 bn=1 ;;
			esac
			LOOM_CPU_DNNL_POOL=$pool LOOM_CPU_DNNL_BN=$bn "$@" 2>/dev/null |
				grep -E '^\| (O[0-3]|ResNet)' | sed "s/^/$name round $r $v /" || true
		done
		r=$((r + 1))
	done
}
for w in $WORKLOADS; do
	case $w in
	convnet) run convnet "$BIN/bench_convnet" --steps 20 --warmup 3 --levels 01 --bf16 ;;
	resnet18) run resnet18 "$BIN/bench_resnet" --depth 18 --size 32 --batch-size 16 --steps 3 --warmup 1 --levels 01 --bf16 ;;
	resnet50) run resnet50 "$BIN/bench_resnet" --depth 50 --size 96 --batch-size 4 --steps 2 --warmup 1 --levels 01 --bf16 ;;
	esac
done
echo "# load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
