#!/usr/bin/env bash
# tests/examples/test_gpt_hf.sh — Hugging Face GPT-2 weights in and out of
# examples/gpt_ddp against golden files that transformers wrote
# (tools/hf_gpt2_golden.py make; tests/examples/golden/hf_gpt2): a random
# GPT2LMHeadModel (2 layers, 2 heads, 32 wide, context 32, vocabulary 256)
# and its logits on the first 32 bytes of text.txt, in f32 and f64.
# --init-from reads its save_pretrained file (Conv1D weights transposed) and
# the same weights under GPT2Model's names with the mask buffers and a tied
# lm_head; the logits (--write-logits) are within 1e-5 of transformers' in
# f32 and 1e-10 in f64; the exact GELU is not GPT-2's (more than 1e-5
# apart); --export --export-format hf writes the Conv1D layout and a
# config.json, and reads back to the same logits. transformers reading
# loom's export: tools/hf_gpt2_golden.py check, by hand (the suite does not
# depend on torch). Prints "N passed, N failed".
set -u
EX=$1
G=$(cd "$(dirname "$2")" && pwd) # the golden folder, from its model.safetensors
source "$(dirname "${BASH_SOURCE[0]}")/../lib/mp_harness.sh"
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/gpthf.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

gpt=(--data "$G/text.txt" --layers 2 --heads 2 --embd 32 --context 32 --batch-size 1 --device cpu
     --threads 1 --gelu tanh)
# maxdiff A B [N]: the largest |a - b| over the first N (8192) f64 of two files.
maxdiff() {
	paste <(od -An -v -t f8 "$1" | tr -s ' ' '\n' | sed '/^$/d') \
		<(od -An -v -t f8 "$2" | tr -s ' ' '\n' | sed '/^$/d') |
		awk -v want="${3:-8192}" 'BEGIN { m = -1 } NF == 2 && n < want { d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; n++ }
		     END { if (n != want) m = "count " n; print m }'
}
# within NAME LOGITS GOLDEN TOL OUT
within() {
	local d
	d=$(maxdiff "$2" "$3")
	if awk -v d="$d" -v t="$4" 'BEGIN { exit !(d >= 0 && d <= t) }' 2>/dev/null; then
		ok "$1 (max |diff| $d <= $4)"
	else
		bad "$1" "max |diff| $d, tolerance $4" "$5"
	fi
}

out=$("$EX" "${gpt[@]}" --init-from "$G/model.safetensors" --write-logits "$tmp/f32.bin" 2>&1)
check "save_pretrained's file: 28 tensors, 8 Conv1D weights transposed" "$out" \
	"^initialised from .*: 28 tensors (8 Conv1D weights transposed)$" 1
within "f32 logits equal transformers'" "$tmp/f32.bin" "$G/logits_f32.bin" 1e-5 "$out"

out=$("$EX" "${gpt[@]}" --dtype f64 --init-from "$G/model.safetensors" --write-logits "$tmp/f64.bin" 2>&1)
within "f64 logits equal transformers'" "$tmp/f64.bin" "$G/logits_f64.bin" 1e-10 "$out"

out=$("$EX" "${gpt[@]}" --init-from "$G/legacy.safetensors" --write-logits "$tmp/legacy.bin" 2>&1)
check "GPT2Model's names, mask buffers and a tied lm_head: read, 5 ignored" "$out" \
	"28 tensors (8 Conv1D weights transposed), 5 of the file's ignored" 1
within "GPT2Model's file: the same logits" "$tmp/legacy.bin" "$G/logits_f32.bin" 1e-5 "$out"

# A shorter context than the file's n_positions: wpe's first 16 rows, and
# (a causal model) the first 16 positions' logits.
out=$("$EX" "${gpt[@]}" --context 16 --init-from "$G/model.safetensors" --write-logits "$tmp/c16.bin" 2>&1)
check "--context 16 from n_positions 32: wpe read in part" "$out" ", 1 read in part (the file's first rows)" 1
d=$(maxdiff "$tmp/c16.bin" "$G/logits_f32.bin" 4096)
awk -v d="$d" 'BEGIN { exit !(d >= 0 && d <= 1e-5) }' 2>/dev/null && ok "--context 16: the first 16 positions' logits ($d)" ||
	bad "--context 16 logits" "max |diff| $d" "$out"

# The exact GELU is not GPT-2's: the golden logits tell them apart.
out=$("$EX" "${gpt[@]}" --gelu erf --init-from "$G/model.safetensors" --write-logits "$tmp/erf.bin" 2>&1)
check "--gelu erf on a GPT-2 file: a note names --gelu tanh" "$out" "^note: .*GPT-2's GELU is the tanh form (--gelu tanh)" 1
d=$(maxdiff "$tmp/erf.bin" "$G/logits_f32.bin")
awk -v d="$d" 'BEGIN { exit !(d > 1e-4) }' 2>/dev/null && ok "--gelu erf differs from GPT-2's gelu_new ($d)" ||
	bad "--gelu erf" "max |diff| $d: the test cannot tell the GELUs apart"

# Out: Hugging Face's layout and config.json; read back, the same logits.
mkdir -p "$tmp/hf"
out=$("$EX" "${gpt[@]}" --init-from "$G/model.safetensors" --max-steps 1 --lr 0 --sample 0 \
	--val-interval 0 --peak-flops 1e9 --export "$tmp/hf/model.safetensors" --export-format hf 2>&1)
check "--export-format hf says so" "$out" "^exported the weights to .*(safetensors, Hugging Face's names and layout)" 1
check "config.json beside it" "$out" "^wrote $tmp/hf/config.json (GPT2Config" 1
grep -q '"activation_function": "gelu_new"' "$tmp/hf/config.json" && grep -q '"n_positions": 32' "$tmp/hf/config.json" &&
	ok "config.json: gelu_new, n_positions 32" || bad "config.json" "$(cat "$tmp/hf/config.json" 2>&1)"
head -c 4000 "$tmp/hf/model.safetensors" | grep -aq '"transformer.h.0.attn.c_attn.weight":{"dtype":"F32","shape":\[32,96\]' &&
	ok "c_attn exported as Conv1D [32, 96]" || bad "Conv1D export" "$(head -c 600 "$tmp/hf/model.safetensors" | tr -c '[:print:]' .)"
out=$("$EX" "${gpt[@]}" --init-from "$tmp/hf/model.safetensors" --write-logits "$tmp/back.bin" 2>&1)
within "loom's hf export read back: transformers' logits" "$tmp/back.bin" "$G/logits_f32.bin" 1e-5 "$out"
expect "--export-format names its values" 2 "--export-format must be loom or hf, got 'onnx'" -- --export-format onnx
expect "--export-format hf needs --export" 2 "--export-format hf applies to --export FILE" -- "${gpt[@]}" --export-format hf

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
