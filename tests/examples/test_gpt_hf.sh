#!/usr/bin/env bash
# tests/examples/test_gpt_hf.sh — Hugging Face GPT-2 weights in and out of
# examples/gpt_ddp against golden files that transformers wrote
# (tools/hf_gpt2_golden.py make; tests/examples/golden/hf_gpt2): a random
# GPT2LMHeadModel (2 layers, 2 heads, 32 wide, context 32, vocabulary 256)
# and its logits on the first 32 bytes of text.txt, in f32 and f64.
# --init-from reads its save_pretrained folder with no size or GELU flag
# (config.json gives them: gelu_new is the tanh GELU), the first window's
# loss within 1e-5 of the loss of transformers' logits; the file with
# config.json beside it; its file alone with the flags (Conv1D weights
# transposed), and the same weights under GPT2Model's names with the mask
# buffers and a tied lm_head; the logits (--write-logits) are within 1e-5 of
# transformers' in f32 and 1e-10 in f64; the exact GELU is not GPT-2's
# (more than 1e-5 apart); a flag that disagrees with config.json, a
# malformed config and an unknown activation are refused naming them;
# layer_norm_epsilon is followed; --export --export-format hf writes the
# Conv1D layout and a config.json, and reads back to the same logits.
# transformers reading
# loom's export: tools/hf_gpt2_golden.py check, by hand (the suite does not
# depend on torch). Prints "N passed, N failed".
set -u
EX=$1
G=$(cd "$(dirname "$2")" && pwd) # the golden folder, from its model.safetensors
source "$(dirname "${BASH_SOURCE[0]}")/../lib/mp_harness.sh"
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/gpthf.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

run=(--data "$G/text.txt" --batch-size 1 --device cpu --threads 1)
gpt=("${run[@]}" --layers 2 --heads 2 --embd 32 --context 32 --gelu tanh)
# The weights alone, no config.json beside them: the flags give the model.
mkdir -p "$tmp/bare"
cp "$G/model.safetensors" "$G/legacy.safetensors" "$tmp/bare/"
# maxdiff A B [N]: the largest |a - b| over the first N (8192) f64 of two files.
maxdiff() {
	paste <(od -An -v -t f8 "$1" | tr -s ' ' '\n' | sed '/^$/d') \
		<(od -An -v -t f8 "$2" | tr -s ' ' '\n' | sed '/^$/d') |
		awk -v want="${3:-8192}" 'BEGIN { m = -1 } NF == 2 && n < want { d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; n++ }
		     END { if (n != want) m = "count " n; print m }'
}
# golden_loss LOGITS TEXT T V: the mean over t < T of the cross-entropy of
# the logits [T, V] (f64) at t against the text's byte t + 1 (gpt_ddp's
# first window: inputs bytes 0..T-1, targets 1..T), in double.
golden_loss() {
	{ od -An -v -t u1 -j 1 -N "$3" "$2"; echo "--"; od -An -v -t f8 "$1"; } | tr -s ' ' '\n' |
		sed '/^$/d' | awk -v T="$3" -v V="$4" '$0 == "--" { l = 1; next }
		!l { tgt[n++] = $1; next }
		{ z[k++] = $1 + 0 }
		END { if (n != T || k != T * V) { print "count " n " " k; exit }
		      for (t = 0; t < T; t++) {
			m = z[t * V]; for (j = 1; j < V; j++) if (z[t * V + j] > m) m = z[t * V + j]
			e = 0; for (j = 0; j < V; j++) e += exp(z[t * V + j] - m)
			s += m + log(e) - z[t * V + tgt[t]] }
		      printf "%.17g\n", s / T }'
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

# The folder, no size or GELU flag: config.json gives the model; the first
# window's loss (step 1, --lr 0) is the loss of transformers' logits.
want=$(golden_loss "$G/logits_f32.bin" "$G/text.txt" 32 256)
out=$("$EX" "${run[@]}" --init-from "$G" --sequential --max-steps 1 --lr 0 --sample 0 \
	--val-interval 0 --peak-flops 1e9 --loss-file "$tmp/loss.txt" 2>&1)
check "the folder: config.json gives the model" "$out" \
	"^model from $G/config.json: 2 layers, 2 heads, 32 wide, n_positions 32, vocabulary 256, gelu_new (--gelu tanh), layer norm epsilon 1e-05$" 1
check "the folder: its model.safetensors read" "$out" \
	"^initialised from $G/model.safetensors: 28 tensors (8 Conv1D weights transposed)$" 1
got=$(awk 'NR == 1 { print $2 }' "$tmp/loss.txt" 2>/dev/null)
awk -v a="$got" -v b="$want" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 1e-5) }' &&
	ok "the folder, no flags: first loss $got, transformers' logits' $want (within 1e-5)" ||
	bad "the folder, no flags: first loss" "loom '$got', transformers' logits' '$want'" "$out"

out=$("$EX" "${run[@]}" --init-from "$G/model.safetensors" --write-logits "$tmp/f32.bin" 2>&1)
check "save_pretrained's file, config.json beside it: 28 tensors, 8 Conv1D weights transposed" "$out" \
	"^initialised from .*: 28 tensors (8 Conv1D weights transposed)$" 1
within "f32 logits equal transformers' (no flags)" "$tmp/f32.bin" "$G/logits_f32.bin" 1e-5 "$out"

out=$("$EX" "${run[@]}" --dtype f64 --init-from "$G" --write-logits "$tmp/f64.bin" 2>&1)
within "f64 logits equal transformers' (no flags)" "$tmp/f64.bin" "$G/logits_f64.bin" 1e-10 "$out"

# Flags that agree with config.json are taken; no config.json beside the
# file: the flags give the model, as before.
out=$("$EX" "${gpt[@]}" --init-from "$G" --write-logits "$tmp/agree.bin" 2>&1)
within "the flags agreeing with config.json: the same logits" "$tmp/agree.bin" "$G/logits_f32.bin" 1e-5 "$out"
out=$("$EX" "${gpt[@]}" --init-from "$tmp/bare/model.safetensors" --write-logits "$tmp/bare.bin" 2>&1)
check "no config.json beside the file: none read" "$out" "^model from " 0
within "no config.json: the flags' model, the same logits" "$tmp/bare.bin" "$G/logits_f32.bin" 1e-5 "$out"

out=$("$EX" "${gpt[@]}" --init-from "$tmp/bare/legacy.safetensors" --write-logits "$tmp/legacy.bin" 2>&1)
check "GPT2Model's names, mask buffers and a tied lm_head: read, 5 ignored" "$out" \
	"28 tensors (8 Conv1D weights transposed), 5 of the file's ignored" 1
within "GPT2Model's file: the same logits" "$tmp/legacy.bin" "$G/logits_f32.bin" 1e-5 "$out"

# A shorter context than the file's n_positions: wpe's first 16 rows, and
# (a causal model) the first 16 positions' logits.
out=$("$EX" "${run[@]}" --context 16 --init-from "$G" --write-logits "$tmp/c16.bin" 2>&1)
check "--context 16 from n_positions 32: wpe read in part" "$out" ", 1 read in part (the file's first rows)" 1
d=$(maxdiff "$tmp/c16.bin" "$G/logits_f32.bin" 4096)
awk -v d="$d" 'BEGIN { exit !(d >= 0 && d <= 1e-5) }' 2>/dev/null && ok "--context 16: the first 16 positions' logits ($d)" ||
	bad "--context 16 logits" "max |diff| $d" "$out"

# The exact GELU is not GPT-2's: the golden logits tell them apart.
out=$("$EX" "${gpt[@]}" --gelu erf --init-from "$tmp/bare/model.safetensors" --write-logits "$tmp/erf.bin" 2>&1)
check "--gelu erf on a GPT-2 file: a note names --gelu tanh" "$out" "^note: .*GPT-2's GELU is the tanh form (--gelu tanh)" 1
d=$(maxdiff "$tmp/erf.bin" "$G/logits_f32.bin")
awk -v d="$d" 'BEGIN { exit !(d ~ /^[0-9]/ && d > 1e-4) }' 2>/dev/null && ok "--gelu erf differs from GPT-2's gelu_new ($d)" ||
	bad "--gelu erf" "max |diff| $d: the test cannot tell the GELUs apart"

# A flag or --preset that disagrees with config.json: refused, naming both.
expect "--layers against n_layer: refused naming both" 2 \
	"^gpt_ddp: --layers 3 conflicts with config.json n_layer 2 ($G/config.json)$" -- "${run[@]}" \
	--layers 3 --init-from "$G"
expect "--gelu erf against gelu_new: refused naming both" 2 \
	"^gpt_ddp: --gelu erf conflicts with config.json activation_function gelu_new ($G/config.json)$" \
	-- "${run[@]}" --gelu erf --init-from "$G/model.safetensors"
expect "--context beyond n_positions: refused" 2 \
	"^gpt_ddp: --context 64 conflicts with config.json n_positions 32 (the longest context) " \
	-- "${run[@]}" --context 64 --init-from "$G"
expect "--preset gpt2 against a small config: refused naming the preset" 2 \
	"^gpt_ddp: --preset gpt2 (--embd 768) conflicts with config.json n_embd 32 " \
	-- "${run[@]}" --preset gpt2 --init-from "$G"

# A malformed config.json, an activation gpt_ddp lacks, a folder without
# one: errors naming the file and the key.
cfg() { # NAME, then sed expressions applied to the golden config.json
	mkdir -p "$tmp/$1"
	ln -sf "$G/model.safetensors" "$tmp/$1/model.safetensors"
	local d=$1
	shift
	sed "$@" "$G/config.json" >"$tmp/$d/config.json"
}
cfg notjson -e 's/"n_layer": 2,/"n_layer": 2/'
expect "config.json not JSON: the file and the place" 1 \
	"^gpt_ddp: --init-from: $tmp/notjson/config.json: not JSON (line [0-9]*, column" -- "${run[@]}" \
	--init-from "$tmp/notjson"
cfg strlayer -e 's/"n_layer": 2,/"n_layer": "2",/'
expect "n_layer a string: the file and the key" 1 \
	"^gpt_ddp: --init-from: $tmp/strlayer/config.json: n_layer: expected an integer from 1 to 16777216, got \"2\"$" \
	-- "${run[@]}" --init-from "$tmp/strlayer"
cfg nohead -e '/"n_head"/d'
expect "no n_head: the file and the key" 1 "$tmp/nohead/config.json: no n_head " -- "${run[@]}" \
	--init-from "$tmp/nohead/model.safetensors"
cfg relu -e 's/"gelu_new"/"relu"/'
expect "activation_function relu: refused naming it" 1 \
	"$tmp/relu/config.json: activation_function \"relu\": gpt_ddp has gelu_new" -- "${run[@]}" \
	--init-from "$tmp/relu"
mkdir -p "$tmp/noconfig"
ln -sf "$G/model.safetensors" "$tmp/noconfig/model.safetensors"
expect "a folder without config.json: refused" 1 "$tmp/noconfig: a folder without config.json" -- \
	"${run[@]}" --init-from "$tmp/noconfig"

# layer_norm_epsilon is followed: 0.5 moves the logits, and the export keeps it.
cfg eps -e 's/"layer_norm_epsilon": 1e-05/"layer_norm_epsilon": 0.5/'
out=$("$EX" "${run[@]}" --init-from "$tmp/eps" --write-logits "$tmp/eps.bin" 2>&1)
check "layer_norm_epsilon 0.5 read" "$out" "layer norm epsilon 0.5$" 1
d=$(maxdiff "$tmp/eps.bin" "$G/logits_f32.bin")
awk -v d="$d" 'BEGIN { exit !(d ~ /^[0-9]/ && d > 1e-3) }' 2>/dev/null && ok "layer_norm_epsilon 0.5 moves the logits ($d)" ||
	bad "layer_norm_epsilon" "max |diff| $d: the epsilon was not followed" "$out"
mkdir -p "$tmp/epsout"
out=$("$EX" "${run[@]}" --init-from "$tmp/eps" --max-steps 1 --lr 0 --sample 0 --val-interval 0 \
	--peak-flops 1e9 --export "$tmp/epsout/model.safetensors" --export-format hf 2>&1)
grep -q '"layer_norm_epsilon": 0.5,' "$tmp/epsout/config.json" 2>/dev/null &&
	ok "--export-format hf writes the epsilon read" || bad "exported epsilon" "$(cat "$tmp/epsout/config.json" 2>&1)" "$out"

# Out: Hugging Face's layout and config.json; read back, the same logits.
mkdir -p "$tmp/hf"
out=$("$EX" "${run[@]}" --init-from "$G" --max-steps 1 --lr 0 --sample 0 \
	--val-interval 0 --peak-flops 1e9 --export "$tmp/hf/model.safetensors" --export-format hf 2>&1)
check "--export-format hf says so" "$out" "^exported the weights to .*(safetensors, Hugging Face's names and layout)" 1
check "config.json beside it" "$out" "^wrote $tmp/hf/config.json (GPT2Config" 1
grep -q '"activation_function": "gelu_new"' "$tmp/hf/config.json" && grep -q '"n_positions": 32' "$tmp/hf/config.json" &&
	ok "config.json: gelu_new, n_positions 32" || bad "config.json" "$(cat "$tmp/hf/config.json" 2>&1)"
head -c 4000 "$tmp/hf/model.safetensors" | grep -aq '"transformer.h.0.attn.c_attn.weight":{"dtype":"F32","shape":\[32,96\]' &&
	ok "c_attn exported as Conv1D [32, 96]" || bad "Conv1D export" "$(head -c 600 "$tmp/hf/model.safetensors" | tr -c '[:print:]' .)"
out=$("$EX" "${run[@]}" --init-from "$tmp/hf" --write-logits "$tmp/back.bin" 2>&1)
within "loom's hf export read back: transformers' logits" "$tmp/back.bin" "$G/logits_f32.bin" 1e-5 "$out"
expect "--export-format names its values" 2 "--export-format must be loom or hf, got 'onnx'" -- --export-format onnx
expect "--export-format hf needs --export" 2 "--export-format hf applies to --export FILE" -- "${gpt[@]}" --export-format hf

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
