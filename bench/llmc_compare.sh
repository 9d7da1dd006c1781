#!/usr/bin/env bash
# bench/llmc_compare.sh — examples/gpt_ddp against llm.c's CPU trainer
# (karpathy/llm.c, train_gpt2.c) from the same initial weights on the same
# tokens with llm.c's settings (B 4, T 64, AdamW lr 1e-4, betas 0.9/0.999,
# eps 1e-8, no weight decay, no clipping, constant lr, tanh GELU):
#   - gpt_ddp --write-llmc writes its initial model as an llm.c checkpoint
#     (gpt2_124M.bin's layout), the text's bytes become llm.c token files;
#   - llm.c's train_gpt2.c is built beside this repository (never committed),
#     with two edits to the copy: the training loader reads in order
#     (should_shuffle 0, as gpt_ddp --sequential) and the loop stops after
#     STEPS steps (its sampling at step 20 needs the GPT-2 tokenizer file);
#   - both train STEPS steps; the table gives each step's loss and ms/step;
#   - then tokens/s and MFU of loom, llm.c and (with bench/setup_torch.sh's
#     venv) PyTorch eager on the same model, against bench/bf16_peak's fp32
#     peak (issue 21's figures).
# The vocabulary is GPT-2's 50257 (the bytes are ids 0-255): llm.c's trainer
# starts generation from token 50256, which a 256-entry table does not have.
# Usage: bench/llmc_compare.sh [TEXT]. LLMC_SRC (a clone of karpathy/llm.c,
# default /work/.mirror/karpathy+llm.c/repo), LLMC_DIR (the build, default
# ../llm.c beside the repo), LOOM_BIN, THREADS (2), STEPS (20), LAYERS (2),
# HEADS (4), EMBD (64).
set -eu
cd "$(dirname "$0")/.."
LOOM=${LOOM_BIN:-bazel-bin/examples/gpt_ddp}
SRC=${LLMC_SRC:-/work/.mirror/karpathy+llm.c/repo}
DIR=${LLMC_DIR:-$(cd .. && pwd)/llm.c}
THREADS=${THREADS:-2} STEPS=${STEPS:-20} LAYERS=${LAYERS:-2} HEADS=${HEADS:-4} EMBD=${EMBD:-64}
export OMP_NUM_THREADS=$THREADS
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ ! -f "$DIR/train_gpt2.c" ]; then
	git clone -q "$SRC" "$DIR" || { echo "no llm.c: clone karpathy/llm.c to $DIR"; exit 1; }
fi
sed -e 's/dataloader_init(&train_loader, train_tokens, B, T, 0, 1, 1);/dataloader_init(\&train_loader, train_tokens, B, T, 0, 1, 0);/' \
	-e "s/for (int step = 0; step <= 40; step++)/for (int step = 0; step < $STEPS; step++)/" \
	"$DIR/train_gpt2.c" >"$DIR/train_gpt2_loom.c"
grep -q "B, T, 0, 1, 0);" "$DIR/train_gpt2_loom.c" && grep -q "step < $STEPS;" "$DIR/train_gpt2_loom.c" ||
	{ echo "llm.c's train_gpt2.c changed: the two edits did not apply"; exit 1; }
# -O3, not the Makefile's -Ofast: IEEE arithmetic on both sides.
(cd "$DIR" && gcc -O3 -fopenmp -I. train_gpt2_loom.c -lm -o train_gpt2_loom) ||
	{ echo "llm.c did not build"; exit 1; }

text=${1:-}
if [ -z "$text" ]; then
	cat /usr/share/games/fortunes/* 2>/dev/null | head -c 1000000 >"$work/text.txt"
	text=$work/text.txt
fi
python3 bench/llmc_tokens.py "$text" "$work"
model=(--layers "$LAYERS" --heads "$HEADS" --embd "$EMBD" --context 64 --vocab 50257 --gelu tanh)
run=(--tokens "$work/train.bin" --val-tokens "$work/val.bin" --batch-size 4 --lr 1e-4
	--weight-decay 0 --clip-grad 0 --constant-lr --sequential --device cpu --threads "$THREADS"
	--sample 0 --val-interval 0 --seed 7)
"$LOOM" "${model[@]}" "${run[@]}" --write-llmc "$work/gpt2_124M.bin" >/dev/null
mkdir -p "$work/dev/data/tinyshakespeare"
ln -s "$work/train.bin" "$work/dev/data/tinyshakespeare/tiny_shakespeare_train.bin"
ln -s "$work/val.bin" "$work/dev/data/tinyshakespeare/tiny_shakespeare_val.bin"

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, $THREADS threads each; $(date -u '+%Y-%m-%d %H:%M UTC'); $(uptime | sed 's/.*load/load/')"
echo "llm.c $(git -C "$DIR" log --oneline -1 | cut -c1-7); model: $LAYERS layers, $HEADS heads, $EMBD wide, context 64, vocabulary 50257 (llm.c pads to 50304), B 4"
t0=$(date +%s.%N)
(cd "$work" && "$DIR/train_gpt2_loom") >"$work/llmc.out" 2>&1 || { cat "$work/llmc.out"; exit 1; }
t1=$(date +%s.%N)
"$LOOM" "${model[@]}" "${run[@]}" --max-steps "$STEPS" --log-interval "$STEPS" \
	--loss-file "$work/loom.txt" --peak-flops 1 >"$work/loom.out" 2>&1 || { cat "$work/loom.out"; exit 1; }
t2=$(date +%s.%N)
grep '^step [0-9]*: train loss' "$work/llmc.out" | awk '{ print $2 + 1, $5, $7 }' >"$work/llmc.txt"
echo "step  llm.c loss   loom loss    |diff|"
paste "$work/llmc.txt" "$work/loom.txt" | awk '{ d = $2 - $5; if (d < 0) d = -d; if (d > m) m = d; printf "%4d  %.6f  %.6f  %.1e\n", $1, $2, $5, d } END { printf "largest |diff| %.2g (llm.c prints 6 decimals)\n", m }'
echo "llm.c ms/step (its own timer, mean of steps 2-$STEPS): $(awk 'NR > 1 { s += $3; n++ } END { printf "%.1f", s / n }' "$work/llmc.txt")"
echo "loom: $(grep '^step .*ms/step' "$work/loom.out" | tail -1 | sed 's/.*tok\/s  //; s/  MFU.*//') (all $STEPS steps, the first included)"
echo "wall: llm.c $(echo "$t1 - $t0" | bc) s, loom $(echo "$t2 - $t1" | bc) s (start-up included)"

# Tokens/s and MFU of the three engines on this model (PyTorch eager when the
# venv of bench/setup_torch.sh is there): llm.c from its own per-step timer
# (steps 2-STEPS), loom from a second run whose last progress line covers
# steps 2-STEPS, PyTorch from bench/torch_gpt.py (steps 2-STEPS, the same
# model, V 50257, T 64, B 4, tanh GELU). MFU: against bench/bf16_peak's fp32
# peak on all the cores (run THREADS = the cores), with the FLOPs per token
# gpt_ddp prints (nanoGPT's 6N + 12LCT) for all three.
PY=${TORCH_PY:-/work/venv-torch/bin/python}
PEAK=${PEAK_BIN:-bazel-bin/bench/bf16_peak}
# Its last line: "peak: fp32 X GFLOP/s on N threads (...)", N the cores.
core=$("$PEAK" 2>&1 | sed -n 's/^peak: fp32 \([0-9.]*\) GFLOP\/s on .*/\1/p' | head -n 1 || true)
out=$("$LOOM" "${model[@]}" "${run[@]}" --max-steps "$STEPS" --log-interval $((STEPS > 2 ? STEPS - 1 : 1)) 2>&1)
flop=$(sed -n 's/.*, \([0-9.]*\) MFLOP per token.*/\1/p' <<<"$out" | head -n 1)
ltok=$(grep '^step .*tok/s' <<<"$out" | tail -n 1 | sed 's/.*  \([0-9]*\) tok\/s.*/\1/')
ctok=$(awk 'NR > 1 { s += $3; n++ } END { if (n) printf "%.0f", 4 * 64 * 1000 / (s / n) }' "$work/llmc.txt")
ptok=
if [ -x "$PY" ]; then
	ptok=$("$PY" bench/torch_gpt.py --data "$text" --layers "$LAYERS" --heads "$HEADS" --embd "$EMBD" \
		--context 64 --vocab 50257 --batch-size 4 --steps "$STEPS" --threads "$THREADS" --gelu tanh \
		--weight-decay 0 --clip-grad 0 --lr 1e-4 2>&1 | sed -n 's/.* \([0-9]*\) tok\/s$/\1/p')
	tv=$("$PY" -c 'import torch; print(torch.__version__)')
fi
mfu() { # tok/s -> MFU % (or n/a)
	[ -n "$1" ] && [ -n "$core" ] && [ -n "$flop" ] &&
		awk -v t="$1" -v f="$flop" -v p="$core" 'BEGIN { printf "%.1f%%", 100 * t * f * 1e6 / (p * 1e9) }' ||
		echo n/a
}
echo "fp32 peak: ${core:-?} GFLOP/s on all cores (bench/bf16_peak); ${flop:-?} MFLOP per token (6N + 12LCT)"
echo "| engine | tok/s (steps 2-$STEPS) | MFU |"
echo "| --- | --- | --- |"
echo "| loom gpt_ddp | ${ltok:-n/a} | $(mfu "$ltok") |"
echo "| llm.c train_gpt2.c | ${ctok:-n/a} | $(mfu "$ctok") |"
echo "| PyTorch ${tv:-(no venv)} eager | ${ptok:-n/a} | $(mfu "$ptok") |"
echo "after: $(uptime | sed 's/.*load/load/')"
