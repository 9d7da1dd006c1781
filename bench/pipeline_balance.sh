#!/usr/bin/env bash
# bench/pipeline_balance.sh — the two cuts of a pipeline (--pipeline-balance
# time|memory) on ResNet-50 (resnet50_synthetic, batch 16 of 4 micro-batches
# at 96x96, 2 stages, 1F1B, one thread per rank): each stage's planned peak
# (the start-up table, which is each rank's own plan), the step time of each
# cut (the configurations alternate, REPS times, so that they see the same
# state of the machine), and the smallest --memory-limit (to 0.01 MiB) under
# which each cut is the one that trains: the time cut from its largest
# stage's peak (below it, the compile falls back to the memory cut, which the
# run says), the memory cut likewise (below it, the compile is refused naming
# both), each checked one 0.01 MiB below and trained 1 step at the limit.
# Prints markdown for bench/RESULTS.md.
#   bench/pipeline_balance.sh [STEPS] [REPS]   (default 3 timed steps after 1
#                                               warm-up, 2 repeats)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-3}
reps=${2:-2}
. bench/common.sh
bench_build //examples:resnet50_synthetic
bin=$bazel_bin/examples/resnet50_synthetic
export OMP_NUM_THREADS=1
R=("$bin" --device cpu --size 96 --batch-size 16 --nproc 2 --pipeline 2 --micro-batches 4)

echo "uptime before: $(uptime)"
echo
echo '| cut | stage | nodes | parameters | activations MiB x in flight | planned peak MiB | est. ms per micro-batch |'
echo '| --- | --- | --- | --- | --- | --- | --- |'
declare -A top
for cut in time memory; do
	out=$("${R[@]}" --pipeline-balance "$cut" --dry-run 2>&1)
	sed -n 's/.*stage \([0-9]\): \([0-9]*\) nodes, \([0-9]*\) parameters, .*activations \([0-9.]*\) MiB per micro-batch x \([0-9]*\) in flight, planned peak \([0-9.]*\) MiB, .*est. \([0-9.]*\) ms.*/| '"$cut"' | \1 | \2 | \3 | \4 x \5 | \6 | \7 |/p' <<<"$out"
	top[$cut]=$(sed -n 's/.*stage [0-9]: .*planned peak \([0-9.]*\) MiB.*/\1/p' <<<"$out" | sort -g | tail -1)
done

echo
echo '| cut | repeat | step times s (rank 0, after 1 warm-up) | img/s |'
echo '| --- | --- | --- | --- |'
for rep in $(seq 1 "$reps"); do
	for cut in time memory; do
		out=$("${R[@]}" --pipeline-balance "$cut" --steps "$steps" --warmup 1 2>&1)
		st=$(sed -n 's/.*step *[0-9]*\/[0-9]*  loss .*  \([0-9.]*\) s  .*/\1/p' <<<"$out" | tail -n "$steps" | tr '\n' ' ')
		ips=$(sed -n 's/.*rank 0: \([0-9.]*\) img\/s.*/\1/p' <<<"$out" | head -1)
		echo "| $cut | $rep | $st| $ips |"
	done
done

# The smallest limit a cut trains under, with two decimals: its largest
# peak rounded up (the check refuses a peak above the limit).
echo
echo '| cut | largest stage peak MiB | --memory-limit | at the limit | 0.01 MiB below |'
echo '| --- | --- | --- | --- | --- |'
for cut in time memory; do
	lim=$(awk -v p="${top[$cut]}" 'BEGIN { printf "%.2f", p }')
	below=$(awk -v p="$lim" 'BEGIN { printf "%.2f", p - 0.01 }')
	at=$("${R[@]}" --pipeline-balance "$cut" --memory-limit "$lim" --steps 1 --warmup 0 2>&1) || true
	bl=$("${R[@]}" --pipeline-balance "$cut" --memory-limit "$below" --dry-run 2>&1) || true
	say() { # what a run under a limit did, in a few words
		if grep -q "needs more memory" <<<"$1"; then
			sed -n 's/.*pipeline: \(.*\)/refused: \1/p' <<<"$1" | head -1
		elif grep -q "the memory-balanced cut, since" <<<"$1"; then
			echo "memory cut (fallback)$(grep -q 'step *1/1' <<<"$1" && echo ', trained 1 step')"
		else
			echo "$(sed -n 's/.*cut balancing \([a-z]*\).*/\1/p' <<<"$1" | head -1) cut$(grep -q 'step *1/1' <<<"$1" && echo ', trained 1 step')"
		fi
	}
	echo "| $cut | ${top[$cut]} | $lim | $(say "$at") | $(say "$bl") |"
done
echo
echo "uptime after: $(uptime)"
