#!/usr/bin/env bash
# tests/ddp/test_fp8_ddp.sh — fp8 delayed scaling across data-parallel
# ranks: the amaxes max-reduced at every step end, so every rank holds the
# same scales (and parameters) though each rank's own amaxes differ, at 2
# and 3 ranks; a rank scaling by another recipe fails every rank's compile,
# naming it. Prints "N passed, N failed".
set -u
W=$1
source "$(dirname "${BASH_SOURCE[0]}")/../lib/mp_harness.sh"
mp_setup

for n in 2 3; do
	out=$("${MPIRUN[@]}" -np $n "$W" fp8 2>&1)
	check "fp8 delayed scaling, $n ranks: the same scales everywhere, amaxes max-reduced" "$out" \
		"OK fp8 scales world $n: [0-9]* tensors alike, x amax $((50 * n))" $n
done
out=$("${MPIRUN[@]}" -np 2 "$W" fp8_mismatch 2>&1)
check "fp8 current scaling on rank 1 only: every rank fails naming it" "$out" \
	"ERROR compile: .*rank 1: node [0-9]* fp8_qdq .*current scaling.*rank 0 has .*delayed scaling (history 16, margin 0)" 2

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
