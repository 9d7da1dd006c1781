#!/usr/bin/env bash
# bench/gpt_compare.sh — examples/gpt_ddp against bench/torch_gpt.py (PyTorch,
# from a virtual environment outside the repository) from the same initial
# weights on the same bytes in the same order:
#   1. f64, 50 AdamW steps (warm-up, cosine, clipping, decay on matrices):
#      the largest relative difference of the two loss curves;
#   2. f32, the loss after one update (step 2) and over 10 steps;
#   3. speed of the default model (4 layers, 4 heads, 128 wide, context 128,
#      batch 8), f32, alternating loom / torch eager / torch.compile runs.
# Usage: bench/gpt_compare.sh [TEXT] (default: the first 2 MB of the
# fortunes package's text). LOOM_BIN (default bazel-bin/examples/gpt_ddp),
# TORCH_PY (default /work/venv-torch/bin/python), THREADS (default 2),
# ROUNDS (default 2), STEPS (speed runs, default 30).
set -eu
cd "$(dirname "$0")/.."
. bench/common.sh
LOOM=${LOOM_BIN:-bazel-bin/examples/gpt_ddp}
PY=${TORCH_PY:-/work/venv-torch/bin/python}
THREADS=${THREADS:-2} ROUNDS=${ROUNDS:-2} STEPS=${STEPS:-30}
bench_tmp
bench_text "${1:-}"
export OMP_NUM_THREADS=$THREADS
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; $(date -u '+%Y-%m-%d %H:%M UTC'); $(uptime | sed 's/.*load/load/')"
echo "torch: $($PY -c 'import torch; print(torch.__version__)')"

small=(--layers 2 --heads 2 --embd 32 --context 32 --batch-size 4 --warmup-steps 20 --lr 1e-3)
loom_ref=(--sequential --sample 0 --val-interval 0 --device cpu --threads "$THREADS" --seed 1)
maxrel() { paste "$1" "$2" | awk -v n="$3" 'NR <= n { d = $2 - $4; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); if (r > m) m = r } END { printf "%.3g", m }'; }

# 1. f64
"$PY" bench/torch_gpt.py --data "$text" "${small[@]}" --steps 50 --dtype f64 --threads "$THREADS" \
	--init "$tmp/w64" --losses "$tmp/t64" >/dev/null
"$LOOM" --data "$text" "${small[@]}" --max-steps 50 --dtype f64 --init "$tmp/w64" \
	--loss-file "$tmp/l64" "${loom_ref[@]}" --log-interval 50 >/dev/null
echo "f64, 50 AdamW steps: loss $(sed -n 1p "$tmp/t64" | cut -d' ' -f2) -> $(sed -n 50p "$tmp/t64" | cut -d' ' -f2) (torch), largest relative difference of the curves $(maxrel "$tmp/t64" "$tmp/l64" 50)"

# 2. f32
"$PY" bench/torch_gpt.py --data "$text" "${small[@]}" --steps 10 --dtype f32 --threads "$THREADS" \
	--init "$tmp/w32" --losses "$tmp/t32" >/dev/null
"$LOOM" --data "$text" "${small[@]}" --max-steps 10 --init "$tmp/w32" \
	--loss-file "$tmp/l32" "${loom_ref[@]}" --log-interval 10 >/dev/null
echo "f32: loss after one update: torch $(sed -n 2p "$tmp/t32" | cut -d' ' -f2), loom $(sed -n 2p "$tmp/l32" | cut -d' ' -f2), relative difference $(paste "$tmp/t32" "$tmp/l32" | awk 'NR == 2 { d = $2 - $4; if (d < 0) d = -d; printf "%.3g", d / $2 }'); over 10 steps at most $(maxrel "$tmp/t32" "$tmp/l32" 10)"

# 3. speed, alternating
def=(--layers 4 --heads 4 --embd 128 --context 128 --batch-size 8)
for r in $(seq 1 "$ROUNDS"); do
	l=$("$LOOM" --data "$text" "${def[@]}" --max-steps "$STEPS" --log-interval "$STEPS" "${loom_ref[@]}" \
		--peak-flops 1 2>&1 | grep "^step .*tok/s" | tail -1)
	echo "round $r loom f32: $(sed 's/.*loss [0-9.]*  //; s/  MFU.*//' <<<"$l")  (all $STEPS steps, the first included)"
	echo "round $r $("$PY" bench/torch_gpt.py --data "$text" "${def[@]}" --steps "$STEPS" --threads "$THREADS" | tail -1)"
	if [ "${COMPILE:-1}" = 1 ]; then
		echo "round $r $("$PY" bench/torch_gpt.py --data "$text" "${def[@]}" --steps "$STEPS" --threads "$THREADS" --compile 2>&1 | tail -1)"
	fi
done
echo "after: $(uptime | sed 's/.*load/load/')"
