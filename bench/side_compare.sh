#!/usr/bin/env bash
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
. "$(dirname "$0")/common.sh"
side_env() {
	case $1 in
	loops) echo LOOM_CPU_DNNL_POOL=0 LOOM_CPU_DNNL_BN=0 ;;
	pool) echo LOOM_CPU_DNNL_POOL=1 LOOM_CPU_DNNL_BN=0 ;;
	saved) echo LOOM_CPU_DNNL_POOL=1 LOOM_CPU_DNNL_BN=saved ;;
	dnnl) echo LOOM_CPU_DNNL_POOL=1 LOOM_CPU_DNNL_BN=1 ;;
	esac
}
bench_machine_line
bench_cpu_workloads side_env
echo "# load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
