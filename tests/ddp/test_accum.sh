#!/usr/bin/env bash
# tests/ddp/test_accum.sh — gradient accumulation (LOOM_RUN_ACCUMULATE) and
# the Chrome trace across real processes: N micro-steps equal one step of N
# times the batch (1 and 2 ranks), an overflow in one rank's micro-step
# skips the whole step everywhere, a trace shows every bucket's all-reduce
# once per step and started before backward ends. Prints "N passed, N failed".
set -u
W=$1
source "$(dirname "${BASH_SOURCE[0]}")/../lib/mp_harness.sh"
mp_setup

out=$("$W" equiv 4 2>&1)
check "no group: 4 micro-steps x batch 4 = 1 step x batch 16 after 10 steps (O0, 1e-5)" "$out" \
	"OK accum world 1: 4 micro-steps x batch 4 vs 1 x batch 16, 10 steps" 1
out=$("$W" load "$tmp/init.ckpt" 2>&1)
check "loom_load drops the gradients accumulated before it" "$out" "OK load drops" 1
out=$("${MPIRUN[@]}" -np 2 "$W" equiv 2 2>&1)
check "2 ranks: 2 micro-steps x batch 4 = 1 rank x batch 16 after 10 steps" "$out" \
	"OK accum world 2: 2 micro-steps x batch 4 vs 1 x batch 16, 10 steps" 2
out=$("${MPIRUN[@]}" -np 2 "$W" overflow 2>&1)
check "O1: overflow in rank 1's accumulate micro-step: every rank skips, scale halves once" \
	"$out" "OK accum overflow skipped 1 steps 4 scale 32768 steady 1 identical 1" 2

out=$("${MPIRUN[@]}" -np 2 "$W" trace "$tmp/t.json" 1 2>&1)
check "trace, 2 ranks: JSON, both tracks, each bucket's all-reduce before backward ends" "$out" \
	"rank 0: OK trace world 2 buckets [2-9][0-9]* micro-steps 1" 1
check "trace, 2 ranks: rank 1 sent its spans" "$out" "rank 1: OK trace sent" 1
out=$("${MPIRUN[@]}" -np 2 "$W" trace "$tmp/a.json" 2 2>&1)
check "trace of accumulation: all-reduces only in TRAIN runs, once per bucket" "$out" \
	"rank 0: OK trace world 2 buckets [2-9][0-9]* micro-steps 2" 1
out=$("$W" trace1 "$tmp/s.json" 2>&1)
check "no group: a traced accumulation, one track, sums added and folded" "$out" \
	"OK single trace: 8 accumulations, 8 folds, 4 runs" 1
out=$("${MPIRUN[@]}" -np 2 "$W" trace "$tmp/no/such/dir.json" 1 2>&1)
check "trace to a path rank 0 cannot create: every rank fails" "$out" \
	"ERROR trace: .*cannot create" 2

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
