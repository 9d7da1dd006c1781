#!/usr/bin/env bash
# bench/gpt_memory.sh — examples/gpt_ddp's memory per rank at 2 ranks, as
# planned (--memory-report: the arena each rank allocates) and as measured
# (each rank's peak RSS, GNU time), for the default model (fortunes text,
# O0 and O2 bf16, STEPS steps) and for GPT-2 124M (--preset gpt2, batch 1
# per rank, context CTX, on a synthetic llm.c token file: one step, then a
# --dry-run that only compiles and allocates). Prints markdown for
# bench/RESULTS.md.
#   bench/gpt_memory.sh [TEXT]   (default: the first 2 MB of the fortunes
#   package's text); LOOM_BIN (default bazel-bin/examples/gpt_ddp),
#   STEPS (default 20), CTX (default 1024).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
LOOM=${LOOM_BIN:-bazel-bin/examples/gpt_ddp}
STEPS=${STEPS:-20} CTX=${CTX:-1024}
bench_mpi_env 600
bench_text "${1:-}"
# llm.c's token-file layout: 256 int32 (magic, version 1, count), uint16 ids;
# ids spread over the whole GPT-2 vocabulary, the last id included.
python3 - "$tmp/tok.bin" <<'EOF'
import struct, sys
n = 200000
ids = [(i * 7919 + 13) % 50257 for i in range(n)]
ids[-1] = 50256
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack("<%dH" % n, *ids))
EOF

run() { # NAME ARGS...: 2 ranks under mpirun, every rank's output in $tmp/out, RSS in $tmp/rss.N
	bench_mpirun_rss 2 "$LOOM" "$@" --device cpu --threads 1 --memory-report
}
mib() { awk -v k="$1" '$0 ~ k { for (i = 1; i <= NF; i++) if ($i == "MiB") { print $(i-1); exit } }' "$tmp/out"; }
rss() { awk '{ printf "%s%.1f", (NR > 1 ? " / " : ""), $1 / 1024 }' "$tmp"/rss.0 "$tmp"/rss.1; }
row() { # LABEL
	echo "| $1 | $(mib 'activations') | $(mib 'peak .the arena.') | $(rss) |"
}

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc --all) cores; $(date -u '+%Y-%m-%d %H:%M UTC');" \
	"load average before: $(cut -d' ' -f1-3 /proc/loadavg); 2 ranks (mpirun), OMP_NUM_THREADS=1 each"
echo
echo "| run | activations MiB (planned, per rank) | arena MiB (planned, per rank) | peak RSS MiB (rank 0 / rank 1) |"
echo "| --- | --- | --- | --- |"
for lvl in O0 O2; do
	extra=()
	[ "$lvl" = O2 ] && extra=(--precision bf16)
	run --data "$text" --max-steps "$STEPS" --log-interval 1000 --val-interval 0 --sample 0 \
		--opt-level "$lvl" "${extra[@]}" ||
		{ echo "| default $lvl | run failed: $(tail -1 "$tmp/out") |"; continue; }
	row "default model (4 layers, 4 heads, 128 wide, context 128, batch 8 per rank), $lvl${extra[*]:+ bf16}, $STEPS steps"
done
run --preset gpt2 --tokens "$tmp/tok.bin" --batch-size 1 --context "$CTX" --max-steps 1 \
	--log-interval 1000 --val-interval 0 --sample 0 ||
	echo "| gpt2 step | run failed: $(tail -1 "$tmp/out") |"
grep -q 'peak (the arena)' "$tmp/out" &&
	row "GPT-2 124M, batch 1 per rank, context $CTX, O0, 1 step"
run --preset gpt2 --batch-size 1 --context "$CTX" --dry-run ||
	echo "| gpt2 dry run | run failed: $(tail -1 "$tmp/out") |"
grep -q 'peak (the arena)' "$tmp/out" &&
	row "GPT-2 124M, batch 1 per rank, context $CTX, O0, --dry-run (compile and allocate only)"
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
