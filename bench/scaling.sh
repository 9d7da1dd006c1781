#!/usr/bin/env bash
# bench/scaling.sh — how training speed scales from 1 to N ranks on this
# host, as the classic serial-versus-parallel notebook shows it: ResNet-50
# at 224x224 on one fixed random batch per rank (examples/resnet50_synthetic,
# the batch per rank fixed: weak scaling, as DDP benchmarks report) and
# ResNet-18 on synthetic CIFAR-10 (examples/cifar_ddp --synthetic, the
# global batch fixed: strong scaling). Prints the table: images/s, speed-up
# and efficiency (speed-up / N).
#
#   bench/scaling.sh [N]                 (default 2 ranks)
#   LAUNCH=mpirun bench/scaling.sh 2     mpirun instead of the built-in --nproc
#   R50_BATCH=8 R50_STEPS=3 CIFAR_BATCH=64 CIFAR_STEPS=6 DEVICE=cpu  the sizes
#   ONLY=resnet50 or ONLY=cifar          one workload only
#   BIN=dir                              where the binaries are (default: bazel-bin)
#
# Build first: bazel build -c opt //examples:resnet50_synthetic //examples:cifar_ddp
set -uo pipefail

n=${1:-2}
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
BIN=${BIN:-$(bazel info bazel-bin --experimental_convenience_symlinks=ignore 2>/dev/null)}
R50=$BIN/examples/resnet50_synthetic
CIFAR=$BIN/examples/cifar_ddp
R50_BATCH=${R50_BATCH:-8} R50_STEPS=${R50_STEPS:-3} R50_DEPTH=${R50_DEPTH:-50}
CIFAR_BATCH=${CIFAR_BATCH:-64} CIFAR_STEPS=${CIFAR_STEPS:-6}
DEVICE=${DEVICE:-auto}
cores=$(nproc)

for b in "$R50" "$CIFAR"; do
	[ -x "$b" ] || { echo "scaling: $b missing (bazel build -c opt //examples:all)" >&2; exit 1; }
done
if [ $((CIFAR_BATCH % n)) -ne 0 ]; then
	echo "scaling: CIFAR_BATCH $CIFAR_BATCH does not divide over $n ranks" >&2
	exit 1
fi

# run RANKS PROGRAM ARGS...: one rank alone, or RANKS under the launcher;
# each rank gets cores/RANKS threads (the launcher's rule, applied to mpirun too).
run() {
	local ranks=$1 threads
	shift
	threads=$((cores / ranks))
	[ "$threads" -lt 1 ] && threads=1
	if [ "$ranks" -eq 1 ]; then
		OMP_NUM_THREADS=$threads "$@" --threads "$threads"
	elif [ "${LAUNCH:-nproc}" = mpirun ]; then
		OMP_NUM_THREADS=$threads mpirun --allow-run-as-root --oversubscribe \
			-x OMP_NUM_THREADS -np "$ranks" "$@" --threads "$threads"
	else
		"$1" --nproc "$ranks" "${@:2}" --threads "$threads"
	fi
}

log=$(mktemp "${TMPDIR:-/tmp}/scaling.XXXXXX")
trap 'rm -f "$log"' EXIT
rows=()
base=""
measure() { # LABEL RANKS BATCH_PER_RANK PATTERN PROGRAM ARGS...
	local label=$1 ranks=$2 b=$3 pat=$4 ips
	shift 4
	run "$ranks" "$@" >"$log" 2>&1
	ips=$(sed -n "s/^\(\[rank 0\] \)\{0,1\}$pat \([0-9.]*\) img\/s.*/\2/p" "$log" | tail -n 1)
	if [ -z "$ips" ]; then
		echo "scaling: $label at $ranks rank(s) failed:" >&2
		tail -n 15 "$log" >&2
		ips=0
	fi
	[ "$ranks" -eq 1 ] && base=$ips
	rows+=("$(awk -v l="$label" -v r="$ranks" -v b="$b" -v ips="$ips" -v base="$base" 'BEGIN {
		s = base > 0 ? ips / base : 0
		printf "| %s | %d | %d | %d | %.2f | %.2f | %.0f%% |", l, r, b, r * b, ips, s, 100 * s / r }')")
}

for r in 1 "$n"; do
	[ "${ONLY:-}" = cifar ] && break
	measure "ResNet-$R50_DEPTH 224x224, fixed batch" "$r" "$R50_BATCH" "total:" "$R50" \
		--depth "$R50_DEPTH" --batch-size "$R50_BATCH" --steps "$R50_STEPS" --warmup 1 \
		--device "$DEVICE"
done
for r in 1 "$n"; do
	[ "${ONLY:-}" = resnet50 ] && break
	measure "ResNet-18 CIFAR --synthetic" "$r" $((CIFAR_BATCH / r)) "trained [0-9]* steps:" \
		"$CIFAR" --synthetic --train-images $((CIFAR_BATCH * (CIFAR_STEPS + 1))) \
		--test-images 16 --batch-size $((CIFAR_BATCH / r)) --max-steps "$CIFAR_STEPS" \
		--log-interval 1000 --device "$DEVICE"
done

echo "$(uname -m), $cores cores, $(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "launch: ${LAUNCH:-nproc}; threads per rank: cores / ranks"
echo
echo "| workload | ranks | batch per rank | global batch | img/s | speed-up | efficiency |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
printf '%s\n' "${rows[@]}"
