#!/usr/bin/env bash
# bench/ddp_accuracy.sh — issue 9's accuracy figure: two epochs of the
# ConvNet on Fashion-MNIST at 1 rank x batch 100 and at 2 ranks x batch 50
# (the same global batch, the same seed), test accuracy of each after every
# epoch and the difference, which the issue wants within 0.5 points. Prints
# a markdown table for bench/RESULTS.md.
#
#   bench/ddp_accuracy.sh [LEVEL...]     (default O0; e.g. O0 O2)
#   MNIST_DDP=path   the binary (default: bazel build -c opt, then bazel-bin)
#   DATA=dir         the data (default /usr/share/datasets/fashion-mnist)
#   EPOCHS=n         epochs (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
levels=("$@")
[ "${#levels[@]}" -eq 0 ] && levels=(O0)
data=${DATA:-/usr/share/datasets/fashion-mnist}
epochs=${EPOCHS:-2}
bin=${MNIST_DDP:-}
if [ -z "$bin" ]; then
	bazel build //examples:mnist_ddp >/dev/null 2>&1
	bin=$(bazel info bazel-bin 2>/dev/null)/examples/mnist_ddp
fi
# Open MPI as root in a container (the launcher's ranks join through it).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $(date -u '+%Y-%m-%d %H:%M UTC'); load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| level | ranks x batch | epoch 1 test acc | epoch 2 test acc | test loss | train img/s (epochs) |"
echo "| --- | --- | --- | --- | --- | --- |"
# run LEVEL NPROC BATCH: one training, its row; the last epoch's accuracy
# goes to $last.
run() {
	local lvl=$1 np=$2 b=$3 out acc ips loss
	local flags=(--data "$data" --device cpu --epochs "$epochs" --batch-size "$b"
		--opt-level "$lvl" --seed 0 --log-interval 100000)
	if [ "$np" -eq 1 ]; then
		out=$("$bin" "${flags[@]}" 2>&1)
	else
		# One kernel thread per rank: the ranks share this host's cores.
		out=$(OMP_NUM_THREADS=1 "$bin" --nproc "$np" "${flags[@]}" --threads 1 2>&1)
	fi
	acc=$(sed -n 's/.*done: .*test accuracy \([0-9.]*\)%.*/\1/p' <<<"$out")
	if [ "$(wc -l <<<"$acc")" -ne "$epochs" ] || [ -z "$acc" ]; then
		echo "ddp_accuracy: $lvl at $np ranks failed:" >&2
		tail -20 <<<"$out" >&2
		exit 1
	fi
	loss=$(sed -n 's/.*done: test loss \([0-9.]*\),.*/\1/p' <<<"$out" | tail -n 1)
	ips=$(sed -n 's/.*train [0-9.]* s (\([0-9]*\) img\/s).*/\1/p' <<<"$out" | paste -sd/)
	echo "| $lvl | $np x $b | $(sed -n 1p <<<"$acc")% | $(sed -n 2p <<<"$acc")% | $loss | $ips |"
	last=$(tail -n 1 <<<"$acc")
}
for lvl in "${levels[@]}"; do
	run "$lvl" 1 100
	a1=$last
	run "$lvl" 2 50
	a2=$last
	diffs+=("$lvl: 2 ranks minus 1 rank after epoch $epochs: $(awk -v a="$a2" -v b="$a1" 'BEGIN { d = a - b; printf "%+.2f points (%s)", d, (d < 0 ? -d : d) <= 0.5 ? "within 0.5" : "NOT within 0.5" }')")
done
echo
printf '%s\n' "${diffs[@]}"
