#!/usr/bin/env bash
# tests/amp/test_native_bf16.sh — the GPT (examples/gpt_ddp) trained a few
# steps at O1 and O2 bf16 on the CPU with the native bf16 transformer kernels
# (the *_bf16 kernels of engine/cpu's family files, the default) and with
# LOOM_CPU_BF16_NATIVE_GPT=0
# (backend.c's widen / f32 / round path): the same losses, bit for bit, as
# both paths round the same f32 results once. Odd sizes (context 24, 3
# heads of 8, vocabulary 256) so that no block or batch divides evenly.
# Prints "N passed, N failed".
set -u
GPT=$1
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/native.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
for i in $(seq 1 60); do echo "the cat sat on the mat. the dog sat on the log. $i"; done >"$tmp/text.txt"

for level in O1 O2; do
	for sw in 0 1; do
		if ! LOOM_CPU_BF16_NATIVE_GPT=$sw "$GPT" --data "$tmp/text.txt" --device cpu --opt-level "$level" \
			--precision bf16 --layers 2 --heads 3 --embd 24 --context 24 --batch-size 5 --max-steps 4 \
			--sequential --val-interval 0 --val-batches 1 --loss-file "$tmp/loss.$level.$sw" \
			>"$tmp/out.$level.$sw" 2>&1; then
			echo "FAIL $level bf16, LOOM_CPU_BF16_NATIVE_GPT=$sw: the run failed: $(tail -2 "$tmp/out.$level.$sw")"
			fail=$((fail + 1))
			continue 2
		fi
	done
	if [ -s "$tmp/loss.$level.1" ] && cmp -s "$tmp/loss.$level.0" "$tmp/loss.$level.1"; then
		echo "PASS $level bf16: the same $(wc -l <"$tmp/loss.$level.1") losses on both paths"
		pass=$((pass + 1))
	else
		echo "FAIL $level bf16: the losses differ (old path | native):"
		paste "$tmp/loss.$level.0" "$tmp/loss.$level.1"
		fail=$((fail + 1))
	fi
done
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
