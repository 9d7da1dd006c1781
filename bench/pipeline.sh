#!/usr/bin/env bash
# Pipeline stages on the CPU against one rank and plain data parallelism at
# the same global batch: step time (img/s) and each rank's planned peak
# (--memory-report's per-rank line) and measured peak RSS (GNU time), for 1
# rank, 2 data-parallel ranks, 2 stages under 1F1B and under GPipe (M
# micro-batches). Models: mnist_ddp's ConvNet on Fashion-MNIST and cifar_ddp's
# ResNet-18 (width 16) on synthetic CIFAR-shaped images. The configurations alternate,
# REPS times, so that they see the same state of the machine. Prints markdown
# for bench/RESULTS.md.
#   bench/pipeline.sh [STEPS] [REPS] [M]   (default 10 steps, 2 repeats, M 4)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-10}
reps=${2:-2}
micro=${3:-4}
. bench/common.sh
bench_build //examples:mnist_ddp //examples:cifar_ddp
bin=$bazel_bin/examples
bench_mpi_env 300
export OMPI_MCA_btl_vader_single_copy_mechanism=none

run() { # MODEL CONFIG: one run, every rank's output in $tmp/out, RSS in $tmp/rss.N
	local model=$1 cfg=$2 np gb cmd extra=()
	if [ "$model" = convnet ]; then
		gb=64
		cmd=("$bin/mnist_ddp" --device cpu --epochs 1 --max-steps "$steps" --log-interval 1000)
	else
		gb=16
		cmd=("$bin/cifar_ddp" --device cpu --synthetic --depth 18 --width 16 --epochs 1 --max-steps "$steps"
			--log-interval 1000 --train-images $((gb * steps)) --test-images 4)
	fi
	case $cfg in
	plain) np=1 extra=(--batch-size $gb) ;;
	ddp) np=2 extra=(--batch-size $((gb / 2))) ;;
	1f1b | gpipe) np=2 extra=(--batch-size $gb --pipeline 2 --micro-batches "$micro" --schedule "$cfg") ;;
	esac
	rm -f "$tmp"/rss.*
	mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS -x LOOM_COMM_TIMEOUT_S \
		-x OMPI_MCA_btl_vader_single_copy_mechanism -np "$np" \
		sh -c '/usr/bin/time -f "%M" -o '"$tmp"'/rss.${OMPI_COMM_WORLD_RANK:-0} "$@"' sh \
		"${cmd[@]}" "${extra[@]}" --memory-report >"$tmp/out" 2>&1
}

# Per rank: the planned peak (the per-rank line, or the report's arena at 1 rank).
planned() {
	local p
	p=$(sed -n 's/.*rank \([0-9]\)[^:]*: planned peak \([0-9.]*\) MiB.*/\1:\2/p' "$tmp/out" | sort | tr '\n' ' ')
	[ -n "$p" ] && { echo "$p"; return; }
	awk '/peak .the arena./ { for (i = 1; i <= NF; i++) if ($i == "MiB") { print "0:" $(i-1); exit } }' "$tmp/out"
}
rss() { for f in "$tmp"/rss.*; do printf '%s:%.1f ' "${f##*.}" "$(awk '{ print $1 / 1024 }' "$f")"; done; }
ips() { sed -n 's/.*trained [0-9]* steps: \([0-9.]*\) img\/s.*/\1/p' "$tmp/out" | head -1; }

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $(date -u '+%Y-%m-%d %H:%M UTC');" \
	"load average before: $(cut -d' ' -f1-3 /proc/loadavg); OMP_NUM_THREADS=1 per rank, $steps steps," \
	"M $micro micro-batches under --pipeline 2"
echo
echo "| model | config | ranks | img/s per repeat (global batch) | planned peak MiB per rank | peak RSS MiB per rank |"
echo "| --- | --- | --- | --- | --- | --- |"
for model in convnet resnet18; do
	declare -A speed=() plan=() mem=()
	for rep in $(seq "$reps"); do
		for cfg in plain ddp 1f1b gpipe; do
			if run "$model" "$cfg"; then
				speed[$cfg]="${speed[$cfg]:-} $(ips)"
				plan[$cfg]=$(planned)
				mem[$cfg]=$(rss)
			else
				speed[$cfg]="${speed[$cfg]:-} failed($(tail -1 "$tmp/out"))"
			fi
		done
	done
	for cfg in plain ddp 1f1b gpipe; do
		np=2
		[ "$cfg" = plain ] && np=1
		echo "| $model | $cfg | $np |${speed[$cfg]} | ${plan[$cfg]:-} | ${mem[$cfg]:-} |"
	done
	unset speed plan mem
done
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
