#!/usr/bin/env bash
# The ConvNet trained data-parallel on the CPU at 1 and 2 ranks (mpirun),
# same global batch (100; 2 ranks: 50 each), O0: images/s, and from a trace
# of each run the all-reduce time per step and the part of it that lies
# before backward ends (hidden behind backward). Prints markdown for
# bench/RESULTS.md, with the machine, date, load and command.
#   bench/ddp_overlap.sh [STEPS]     (default 40 timed steps, 10 traced)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-40}
. bench/common.sh
bench_build //bench:bench_ddp --experimental_convenience_symlinks=ignore
bin=$bazel_bin/bench/bench_ddp
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
bench_tmp
mpi=(mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS -np 2)
cores=$(nproc)

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $cores cores; $(date -u '+%Y-%m-%d %H:%M UTC');" \
	"load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| ranks x threads | batch per rank | buckets first / cap MiB | buckets | img/s (median step) | traced step ms | all-reduces ms per step (sum of spans) | of it before backward ended | all-reduce in flight ms (union) | of it before backward ended | wait before optimizer ms |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
# 1 rank with every core, and with one thread (an oversubscribed machine
# punishes OpenMP's spinning); no buckets at world 1.
for th in $cores 1; do
	OMP_NUM_THREADS=$th "$bin" --steps "$steps" --trace "$tmp/w1.json"
done
# 2 ranks with cores / 2 threads each, as the launcher gives them: the
# default buckets (the ConvNet's 0.11 MiB of gradients in one), then small
# ones (5 buckets) so that all-reduces can start during backward.
for caps in "1 25" "0.01 0.03"; do
	set -- $caps
	OMP_NUM_THREADS=$((cores / 2 > 0 ? cores / 2 : 1)) "${mpi[@]}" "$bin" --steps "$steps" \
		--first-bucket-mb "$1" --bucket-cap-mb "$2" --trace "$tmp/w2.json"
done
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
