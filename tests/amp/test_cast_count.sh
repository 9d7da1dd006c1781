#!/usr/bin/env bash
# tests/amp/test_cast_count.sh — the standalone casts on activations in the
# O1 and O2 plans of the ConvNet (examples/mnist_ddp) and the GPT
# (examples/gpt_ddp), counted from --dump-graph by cast_count.awk, fp16 and
# bf16: none between two ops that compute in half (looking through views and
# casts), no narrowing cast left unfolded where its producer could write
# half itself (graph/fuse.c, loom_fuse_casts), every cast explained by its
# fp32 side and listed with it (cast_count.awk: "deny", an op AMP keeps in
# fp32 or its backward: layer norm, batch norm; "loss"; "param", a
# parameter's fp32 gradient sum; "follow", an op that follows its sources'
# precision with an fp32 source that is no cast: the residual stream's adds,
# max pooling after batch norm), and no more casts than today's plans hold. The
# checker itself first meets a plan with a round trip bf16 -> f32 -> bf16
# between two bf16 ops, which it must report. Prints "N passed, N failed".
set -u
MNIST=$1 GPT=$2 AWK=$3
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/casts.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0

# A hand-made MNIST directory (all pixels 0, labels 1) and a small text.
be32() { printf "\\x$(printf %02x $(($1 >> 24 & 255)))\\x$(printf %02x $(($1 >> 16 & 255)))\\x$(printf %02x $(($1 >> 8 & 255)))\\x$(printf %02x $(($1 & 255)))"; }
split() { # DIR SPLIT N
	{ printf '\x00\x00\x08\x03'; be32 "$3"; be32 28; be32 28; head -c $(($3 * 784)) /dev/zero; } >"$1/$2-images-idx3-ubyte"
	{ printf '\x00\x00\x08\x01'; be32 "$3"; head -c "$3" /dev/zero | tr '\0' '\1'; } >"$1/$2-labels-idx1-ubyte"
}
mkdir -p "$tmp/mnist"
split "$tmp/mnist" train 200
split "$tmp/mnist" t10k 100
for i in $(seq 1 200); do echo "the cat sat on the mat. the dog sat on the log."; done >"$tmp/text.txt"

# check NAME MAX_CASTS -- COMMAND...
check() {
	local name=$1 max=$2
	shift 3
	local got
	if ! "$@" --dump-graph --dry-run >"$tmp/plan" 2>"$tmp/err"; then
		echo "FAIL $name: the dry run failed: $(tail -1 "$tmp/err")"
		fail=$((fail + 1))
		return
	fi
	got=$(awk -v list=1 -f "$AWK" "$tmp/plan")
	read -r _ casts _ between _ unfolded _ unexplained <<<"$(tail -1 <<<"$got")"
	if [ "$between" = 0 ] && [ "$unfolded" = 0 ] && [ "$unexplained" = 0 ] && [ "$casts" -le "$max" ]; then
		echo "PASS $name: $casts casts on activations (at most $max), each at an fp32 op:"
		grep "^cast " <<<"$got" | sed 's/^/    /'
		pass=$((pass + 1))
	else
		echo "FAIL $name: $casts casts (at most $max), $between between half ops, $unfolded unfolded," \
			"$unexplained unexplained:"
		grep -E "BETWEEN-HALF|UNFOLDED|UNEXPLAINED" <<<"$got" | head -20
		fail=$((fail + 1))
	fi
}

# The checker on a hand-made plan: relu (bf16) -> cast f32 -> cast bf16 ->
# gelu (bf16), the f32 copy also read by an f32 relu: both casts between
# half ops and unexplained.
cat >"$tmp/fake" <<'EOF'
plan: 6 nodes (6 forward), backend cpu
   0 input 'x'                      f32  [4]                P+0
   1 relu #1                        bf16 [4]                A+0         %0
   2 cast #2                        f32  [4]                A+64        %1
   3 cast #3                        bf16 [4]                A+128       %2
   4 gelu #4                        bf16 [4]                A+192       %3
   5 relu #5                        f32  [4]                A+256       %2
steps:
EOF
if [ "$(awk -f "$AWK" "$tmp/fake")" = "casts 2 between_half 2 unfolded 0 unexplained 2" ]; then
	echo "PASS the checker reports a round trip between two bf16 ops"
	pass=$((pass + 1))
else
	echo "FAIL the checker on a round trip between two bf16 ops: $(awk -f "$AWK" "$tmp/fake")"
	fail=$((fail + 1))
fi

for half in bf16 fp16; do
	check "convnet O1 $half" 6 -- "$MNIST" --data "$tmp/mnist" --device cpu --opt-level O1 --precision "$half"
	check "convnet O2 $half" 1 -- "$MNIST" --data "$tmp/mnist" --device cpu --opt-level O2 --precision "$half"
	check "gpt O1 $half" 19 -- "$GPT" --data "$tmp/text.txt" --device cpu --opt-level O1 --precision "$half"
	check "gpt O2 $half" 1 -- "$GPT" --data "$tmp/text.txt" --device cpu --opt-level O2 --precision "$half"
done

# The fold itself, where the plan shows it: the GPT's layer norms write
# half (fp32 inside) for the products, and attention reads the qkv
# product's half output with no cast (O1 as autocast).
"$GPT" --data "$tmp/text.txt" --device cpu --opt-level O1 --precision bf16 --dump-graph --dry-run \
	>"$tmp/plan" 2>/dev/null
if grep -qE "^ *[0-9]+ layernorm .* bf16 .*\(f32 inside\)" "$tmp/plan" &&
	grep -qE "^ *[0-9]+ attn_probs .* bf16 " "$tmp/plan"; then
	echo "PASS gpt O1: layer norm writes bf16 (f32 inside), attn_probs runs in bf16"
	pass=$((pass + 1))
else
	echo "FAIL gpt O1: no layer norm writing bf16, or attn_probs not in bf16"
	fail=$((fail + 1))
fi

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
