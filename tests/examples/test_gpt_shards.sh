#!/usr/bin/env bash
# tests/examples/test_gpt_shards.sh EX FIXTURE data|memory — examples/gpt_ddp
# on llm.c token shards (--tokens a file, a folder or a glob; memory-mapped).
# data: a text's tokens cut into 3 shards train, through a folder and a
# glob, as the one file does and as the text itself does; --val-tokens; a
# bad shard refused naming it before any step; an id over --vocab named
# with its shard. memory: a 256 MB set under 2 ranks (--nproc 2) adds far
# less than its size to each rank's peak RSS (gpt_ddp's "peak RSS" line,
# ru_maxrss) over the same run on a 4 MB set. Prints "N passed, N failed".
set -u
EX=$1 FIX=$2 PART=${3:-}
case $PART in data | memory) ;; *) echo "usage: $0 EX FIXTURE data|memory"; exit 2 ;; esac
source "$(dirname "${BASH_SOURCE[0]}")/../lib/mp_harness.sh"
export LOOM_COMM_TIMEOUT_S=120 OMP_NUM_THREADS=1
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/gptshards.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

if [ "$PART" = data ]; then
for i in $(seq 1 300); do
	echo "the cat sat on the mat. the dog sat on the log. $((i % 7)) cats, $((i % 5)) dogs."
done >"$tmp/text.txt"
"$FIX" text "$tmp/text.txt" "$tmp/one.bin" "$tmp/s" 3 || bad "fixture" "could not write the shards"
tiny=(--layers 1 --heads 2 --embd 16 --context 16 --batch-size 4 --device cpu --threads 1
      --max-steps 3 --log-interval 3 --sample 0 --val-interval 0 --constant-lr --vocab 256)

# One file, its folder of 3 shards, a glob over them, and the text: the
# same tokens, so the same losses bit for bit.
"$EX" "${tiny[@]}" --data "$tmp/text.txt" --loss-file "$tmp/l_text.txt" >"$tmp/o_text.txt" 2>&1
"$EX" "${tiny[@]}" --tokens "$tmp/one.bin" --loss-file "$tmp/l_one.txt" >"$tmp/o_one.txt" 2>&1
"$EX" "${tiny[@]}" --tokens "$tmp/s" --loss-file "$tmp/l_dir.txt" >"$tmp/o_dir.txt" 2>&1
out=$("$EX" "${tiny[@]}" --tokens "$tmp/s/x_train_*.bin" --loss-file "$tmp/l_glob.txt" 2>&1)
check "the glob's start-up line names its 3 mapped shards" "$out" "on $tmp/s/x_train_\*.bin (3 shards, mapped; 17280 train, 1920 held-out tokens)" 1
check "a rank's peak RSS said" "$out" "^rank 0: peak RSS [0-9.]* MiB (ru_maxrss; data mapped)" 1
if [ -s "$tmp/l_one.txt" ] && cmp -s "$tmp/l_one.txt" "$tmp/l_dir.txt" && cmp -s "$tmp/l_one.txt" "$tmp/l_glob.txt" &&
	cmp -s "$tmp/l_one.txt" "$tmp/l_text.txt"; then
	ok "a folder and a glob of 3 shards train as the one file and the text, bit for bit"
else
	bad "folder and glob as one file" "one: $(tr '\n' ' ' <"$tmp/l_one.txt" 2>&1)" \
		"folder: $(tr '\n' ' ' <"$tmp/l_dir.txt" 2>&1) $(tail -3 "$tmp/o_dir.txt")" \
		"glob: $(tr '\n' ' ' <"$tmp/l_glob.txt" 2>&1)" "text: $(tr '\n' ' ' <"$tmp/l_text.txt" 2>&1)"
fi
expect "--val-tokens: shards of their own, named" 0 "held out: $tmp/s/x_train_000003.bin (1 shard)" -- \
	"${tiny[@]}" --tokens "$tmp/s/x_train_00000[12].bin" --val-tokens "$tmp/s/x_train_000003.bin"

# A bad shard among good ones: refused naming it and its fault, before a step.
cp -r "$tmp/s" "$tmp/bad"
truncate -s 2000 "$tmp/bad/x_train_000002.bin"
out=$("$EX" "${tiny[@]}" --tokens "$tmp/bad/*.bin" 2>&1)
rc=$?
if [ $rc -eq 1 ] && grep -q "gpt_ddp: $tmp/bad/x_train_000002.bin: header says 6400 tokens, the file holds 976 bytes" <<<"$out" &&
	! grep -q '^step' <<<"$out"; then
	ok "a shard cut short refused naming it, before any step"
else
	bad "a shard cut short refused" "exit $rc (want 1):" "$out"
fi
expect "a pattern matching nothing named" 1 "$tmp/none/\*.bin: no file matches this pattern" -- \
	"${tiny[@]}" --tokens "$tmp/none/*.bin"
expect "an id over --vocab named with its shard, at the batch that holds it" 1 \
	"x_train_00000[123].bin: token [0-9]* is id 1[0-9][0-9], not below the vocabulary 100 (--vocab)" -- \
	"${tiny[@]}" --tokens "$tmp/s" --vocab 100

fi

if [ "$PART" = memory ]; then
# Memory: 2 shards of 64 Mi tokens (256 MiB) under 2 ranks, no --vocab (so
# every rank also scans every token for the largest id). Each rank's peak
# RSS may exceed that of the same run on 2 shards of 1 Mi tokens by less
# than an eighth of the set (32 MiB): the tokens are mapped, not copied
# (held as 4-byte ids, with a held-out copy, they added 4.4 times the set).
"$FIX" fill $((1 << 20)) 2 257 "$tmp/small" && "$FIX" fill $((1 << 26)) 2 257 "$tmp/big" ||
	bad "fixture" "could not write the big shards"
mem=(--layers 1 --heads 2 --embd 16 --context 256 --batch-size 2 --device cpu --threads 1
     --max-steps 2 --log-interval 2 --sample 0 --val-interval 0 --val-batches 1 --nproc 2)
small=$("$EX" "${mem[@]}" --tokens "$tmp/small" 2>&1)
big=$("$EX" "${mem[@]}" --tokens "$tmp/big" 2>&1)
bytes=$(cat "$tmp"/big/*.bin | wc -c)
for r in 0 1; do
	a=$(sed -n "s/.*rank $r: peak RSS \([0-9.]*\) MiB.*/\1/p" <<<"$small")
	b=$(sed -n "s/.*rank $r: peak RSS \([0-9.]*\) MiB.*/\1/p" <<<"$big")
	if [ -n "$a" ] && [ -n "$b" ] && awk -v a="$a" -v b="$b" -v f="$bytes" 'BEGIN { exit !((b - a) * 1048576 < f / 8) }'; then
		ok "rank $r: a $((bytes >> 20)) MiB set adds $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.1f", b - a }') MiB to the peak RSS ($a -> $b MiB)"
	else
		bad "rank $r: peak RSS on a $((bytes >> 20)) MiB set" "small set: '$a' MiB, big set: '$b' MiB (want less than $((bytes >> 23)) MiB more)" "$big"
	fi
done
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
