#!/usr/bin/env bash
# Early-posted receives (issue 20), before against after: cifar_ddp's
# ResNet-18 (width 16, synthetic images) through 2 stages of M micro-batches
# under GPipe and 1F1B, run by two builds of cifar_ddp side by side. The runs
# alternate (rep, schedule, then before and after) so that both see the same
# state of a shared machine. Each run is traced (bench/pipeline_bubble.py
# reads the step time, each stage's idle share and the share spent inside
# receives); its own "img/s" line is printed too. Prints markdown for
# bench/RESULTS.md, with uptime before and after.
#   bench/pipeline_recv.sh BEFORE/cifar_ddp AFTER/cifar_ddp [REPS] [STEPS] [M]
set -euo pipefail
cd "$(dirname "$0")/.."
before=${1:?usage: pipeline_recv.sh BEFORE/cifar_ddp AFTER/cifar_ddp [REPS] [STEPS] [M]}
after=${2:?usage: pipeline_recv.sh BEFORE/cifar_ddp AFTER/cifar_ddp [REPS] [STEPS] [M]}
reps=${3:-3}
steps=${4:-12}
micro=${5:-4}
export OMP_NUM_THREADS=1 LOOM_COMM_TIMEOUT_S=300
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
echo "uptime before: $(uptime)"
echo "OMP_NUM_THREADS=1 per rank; cifar_ddp --nproc 2 --pipeline 2 --micro-batches $micro" \
	"--synthetic --width 16 --batch-size 32, $steps steps, the last $((steps - 2)) traced"
echo
traces=()
for rep in $(seq 1 "$reps"); do
	for sc in gpipe 1f1b; do
		for side in before after; do
			bin=$before
			[ $side = after ] && bin=$after
			t=$tmp/$side-$sc-$rep.json
			"$bin" --nproc 2 --pipeline 2 --micro-batches "$micro" --schedule $sc --synthetic \
				--train-images $((32 * steps)) --test-images 40 --width 16 --device cpu \
				--batch-size 32 --epochs 1 --max-steps "$steps" --log-interval 1000 \
				--trace "$t" --trace-steps $((steps - 2)) >"$tmp/out" 2>&1 ||
				{ cat "$tmp/out"; exit 1; }
			ips=$(sed -n 's/.*\[rank 0\] trained [0-9]* steps: \([0-9.]*\) img\/s.*/\1/p' "$tmp/out" | tail -1)
			echo "$side $sc rep $rep: ${ips:-?} img/s (steps 2.. of the run, loading included)"
			traces+=("$side-$sc-$rep=$t")
		done
	done
done
echo
python3 bench/pipeline_bubble.py --stages 2 --micro "$micro" "${traces[@]}"
echo
echo "uptime after: $(uptime)"
