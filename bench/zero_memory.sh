#!/usr/bin/env bash
# ZeRO-1 on the CPU: optimizer-state and O2 master memory per rank at 1, 2
# and 3 ranks (ConvNet on Fashion-MNIST through mnist_ddp, ResNet-18 on
# synthetic CIFAR-shaped images through cifar_ddp; AdamW, O2), as planned
# (--memory-report) and as measured (each rank's peak RSS, GNU time), with
# and without --zero 1; then the step time with and without --zero 1 at 2
# ranks, alternating in one run. Prints markdown for bench/RESULTS.md.
#   bench/zero_memory.sh [STEPS]   (default 20 steps per run)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-20}
. bench/common.sh
bench_build //examples:mnist_ddp //examples:cifar_ddp
bin=$bazel_bin/examples
bench_mpi_env 300

run() { # NP ZERO MODEL: one run, every rank's output in $tmp/out, RSS in $tmp/rss.N
	local np=$1 zero=$2 model=$3 cmd
	if [ "$model" = convnet ]; then
		cmd=("$bin/mnist_ddp" --device cpu --epochs 1 --batch-size 32 --max-steps "$steps"
			--log-interval 1000 --optimizer adamw --lr 0.001 --opt-level O2)
	else
		cmd=("$bin/cifar_ddp" --device cpu --synthetic --depth 18 --epochs 1 --batch-size 8
			--max-steps "$steps" --log-interval 1000 --optimizer adamw --lr 0.001 --opt-level O2
			--train-images $((8 * np * steps)) --test-images 8)
	fi
	bench_mpirun_rss "$np" "${cmd[@]}" --zero "$zero" --memory-report
}

mib() { awk -v k="$1" '$0 ~ k { for (i = 1; i <= NF; i++) if ($i == "MiB") { print $(i-1); exit } }' "$tmp/out"; }
maxrss() { cat "$tmp"/rss.* | sort -n | tail -1; }

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $(date -u '+%Y-%m-%d %H:%M UTC');" \
	"load average before: $(cut -d' ' -f1-3 /proc/loadavg); OMP_NUM_THREADS=1 per rank, $steps steps"
echo
echo "| model | ranks | --zero | optimizer state MiB (planned, per rank) | master weights MiB (planned) | arena MiB (planned) | peak RSS MiB (largest rank) |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for model in convnet resnet18; do
	for np in 1 2 3; do
		for zero in 0 1; do
			[ "$np" = 1 ] && [ "$zero" = 1 ] && continue
			run "$np" "$zero" "$model" || { echo "| $model | $np | $zero | run failed: $(tail -1 "$tmp/out") |"; continue; }
			echo "| $model | $np | $zero | $(mib 'optimizer state') | $(mib 'master weights') |" \
				"$(mib 'peak .the arena.') | $(awk "BEGIN { printf \"%.1f\", $(maxrss) / 1024 }") |"
		done
	done
done
echo
echo "Step time at 2 ranks, alternating runs (median of each run's img/s line):"
echo
echo "| model | --zero | img/s per run |"
echo "| --- | --- | --- |"
for model in convnet resnet18; do
	a="" b=""
	for rep in 1 2 3; do
		for zero in 0 1; do
			run 2 "$zero" "$model"
			r=$(sed -n 's/.*(\([0-9.]*\) img\/s).*/\1/p' "$tmp/out" | head -1)
			if [ "$zero" = 0 ]; then a="$a ${r:-?}"; else b="$b ${r:-?}"; fi
		done
	done
	echo "| $model | 0 |$a |"
	echo "| $model | 1 |$b |"
done
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
