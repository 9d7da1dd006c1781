#!/usr/bin/env bash
# bench/formats_compare.sh — training step speed with every value NCHW
# (LOOM_FORMATS=nchw, each oneDNN convolution reordering inside) against the
# planner's formats (LOOM_FORMATS=auto: nChw8c through the blocked runs),
# side by side: each workload alternates nchw, auto, nchw, auto ... so the
# load of a shared machine falls on both. f32 (O0) and O1 bf16 in each run.
# Usage: bench/formats_compare.sh [ROUNDS] (default 2), after
#   bazel build //bench:bench_convnet //bench:bench_resnet
# WORKLOADS picks some (convnet resnet18 resnet50).
set -eu
ROUNDS=${1:-2}
BIN=${BIN:-bazel-bin/bench}
VARIANTS="nchw auto"
. "$(dirname "$0")/common.sh"
formats_env() { echo "LOOM_FORMATS=$1"; }
bench_machine_line
bench_cpu_workloads formats_env
echo "# load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
