#!/usr/bin/env bash
# bench/zero_stage_memory.sh — one ZeRO stage against the stage below it and
# plain data parallelism on the CPU: parameter, gradient (bucket region),
# optimizer-state, master, gathered and activation memory per rank at 1, 2
# and 3 ranks, as planned (--memory-report) and as measured (each rank's peak
# RSS, GNU time), for ResNet-18 (cifar_ddp --synthetic --depth 18, batch 8
# per rank, AdamW, O2) and the GPT (gpt_ddp's default model on the fortunes
# text, AdamW, O2 bf16, clipping); then the step time of plain and --zero
# STAGE at 2 ranks, alternating in one run. Every run uses the same buckets
# (--bucket-cap-mb BUCKET_MB: ZeRO-2's reduce-scatter unit, ZeRO-3's
# gathering unit). Prints markdown for bench/RESULTS.md.
#   bench/zero_stage_memory.sh STAGE [STEPS]   (STAGE 1, 2 or 3: runs --zero
#   0, STAGE-1 and STAGE; default 3 steps per run);
#   BUCKET_MB (default 5); MODELS (default "resnet18 gpt"); RANKS (default
#   "1 2 3"); LOOM_BAZEL_OUTPUT_BASE: bazel's output base.
# bench/zero2_memory.sh and bench/zero3_memory.sh call this with stage 2 and 3.
set -euo pipefail
cd "$(dirname "$0")/.."
stage=${1:-}
case "$stage" in 1 | 2 | 3) ;; *) echo "usage: $0 STAGE(1|2|3) [STEPS]" >&2; exit 2 ;; esac
steps=${2:-3}
bucket=${BUCKET_MB:-5}
models=${MODELS:-resnet18 gpt}
ranks=${RANKS:-1 2 3}
stages=$(printf '%s\n' 0 $((stage - 1)) "$stage" | sort -nu | tr '\n' ' ')
. bench/common.sh
bench_build //examples:gpt_ddp //examples:cifar_ddp
bin=$bazel_bin/examples
bench_mpi_env 600
bench_text

run() { # NP ZERO MODEL: one run, every rank's output in $tmp/out, RSS in $tmp/rss.N
	local np=$1 zero=$2 model=$3 cmd
	if [ "$model" = gpt ]; then
		cmd=("$bin/gpt_ddp" --device cpu --data "$text" --max-steps "$steps"
			--log-interval 1 --val-interval 0 --sample 0 --opt-level O2 --precision bf16)
	else
		cmd=("$bin/cifar_ddp" --device cpu --synthetic --depth 18 --epochs 1 --batch-size 8
			--max-steps "$steps" --log-interval 1000 --optimizer adamw --lr 0.001 --opt-level O2
			--train-images $((8 * np * steps)) --test-images 8)
	fi
	bench_mpirun_rss "$np" "${cmd[@]}" --zero "$zero" --bucket-cap-mb "$bucket" --memory-report
}

# Rank 0's --memory-report line for one quantity ("-" where the plan has none).
mib() { awk -v k="^(\\[rank 0\\] )?  $1" '$0 ~ k { for (i = 1; i <= NF; i++) if ($i == "MiB") { v = $(i-1); exit } }
	END { print (v == "" ? "-" : v) }' "$tmp/out"; }
# Every rank's own figures: "loom: rank R[ (ZeRO-3: ...)]: planned peak P MiB = ... + buckets B + ..."
perrank() { # FIELD (peak | buckets): rank 0 / rank 1 / ...
	sed -n 's/.*loom: rank \([0-9]*\).*: planned peak \([0-9.]*\) MiB = .* + buckets \([0-9.]*\) + .*/\1 \2 \3/p' "$tmp/out" |
		sort -n | awk -v f="$1" '{ printf "%s%s", (NR > 1 ? " / " : ""), (f == "peak" ? $2 : $3) }
			END { if (!NR) printf "-" }'
}
rssall() { for f in "$tmp"/rss.*; do echo "${f##*.} $(cat "$f")"; done | sort -n |
	awk '{ printf "%s%.1f", (NR > 1 ? " / " : ""), $2 / 1024 }'; }
speed() { # img/s (cifar) or the median ms/step of the GPT's step lines after the first
	if [ "$1" = gpt ]; then
		sed -n 's/.* \([0-9.]*\) ms\/step.*/\1/p' "$tmp/out" | tail -n +2 | sort -n |
			awk '{ a[NR] = $1 } END { if (NR) printf "%s ms/step", a[int((NR + 1) / 2)]; else print "?" }'
	else
		sed -n 's/.*(\([0-9.]*\) img\/s).*/\1 img\/s/p' "$tmp/out" | head -1
	fi
}

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc --all) cores; $(date -u '+%Y-%m-%d %H:%M UTC');" \
	"load average before: $(cut -d' ' -f1-3 /proc/loadavg); OMP_NUM_THREADS=1 per rank, $steps steps," \
	"--bucket-cap-mb $bucket; ZeRO-$stage against --zero ${stages% }"
echo
echo "| model | ranks | --zero | parameters MiB | gradients MiB (rank 0's report) | bucket region MiB (planned, rank 0 / 1 / 2) | optimizer state MiB | master weights MiB | gathered at once MiB | activations MiB | planned peak MiB (rank 0 / 1 / 2) | peak RSS MiB (rank 0 / 1 / 2) |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for model in $models; do
	for np in $ranks; do
		for zero in $stages; do
			[ "$np" = 1 ] && [ "$zero" != 0 ] && continue
			run "$np" "$zero" "$model" || { echo "| $model | $np | $zero | run failed: $(tail -1 "$tmp/out") |"; continue; }
			echo "| $model | $np | $zero | $(mib 'parameters') | $(mib 'gradients') | $(perrank buckets) |" \
				"$(mib 'optimizer state') | $(mib 'master weights') | $(mib 'gathered at once') |" \
				"$(mib 'activations') | $(perrank peak) | $(rssall) |"
		done
	done
done
echo
echo "Step time at 2 ranks, alternating runs (cifar: the epoch line's img/s; GPT: median ms/step after the first):"
echo
echo "| model | --zero | per run |"
echo "| --- | --- | --- |"
for model in $models; do
	a="" b=""
	for rep in 1 2; do
		for zero in 0 "$stage"; do
			run 2 "$zero" "$model" || true
			r=$(speed "$model")
			if [ "$zero" = 0 ]; then a="$a ${r:-?};"; else b="$b ${r:-?};"; fi
		done
	done
	echo "| $model | 0 |$a |"
	echo "| $model | $stage |$b |"
done
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
