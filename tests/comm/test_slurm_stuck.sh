#!/usr/bin/env bash
# tests/comm/test_slurm_stuck.sh — test_slurm.sh's own start-up check when
# Slurm never answers: an sinfo that hangs (as one does while slurmctld is
# unreachable: it waits out its message timeout, each call) comes first on
# PATH. test_slurm.sh must give up after its time bound (2 s here) and print
# its diagnosis, rather than run into bazel's timeout with an empty log.
# Skips where test_slurm.sh skips (no root, no Slurm). Prints "N passed, N
# failed".
#   test_slurm_stuck.sh TEST_SLURM_SH COMM_WORKER
set -u
S=$(realpath "$1")
W=$(realpath "$2")
source "$(dirname "${BASH_SOURCE[0]}")/../lib/mp_harness.sh"
shim=$(mktemp -d)
trap 'rm -rf "$shim"' EXIT
printf '#!/bin/sh\nexec sleep 30\n' >"$shim/sinfo"
chmod +x "$shim/sinfo"
t0=$(date +%s)
out=$(PATH="$shim:$PATH" LOOM_TEST_SLURM_UP_S=2 timeout -s KILL 25 bash "$S" "$W" 2>&1)
rc=$?
took=$(($(date +%s) - t0))
if grep -q '^skip real srun' <<<"$out"; then
	echo "$out"
	echo "$pass passed, $fail failed"
	exit 0
fi
[ $rc -eq 1 ] && [ $took -le 15 ] && ok "Slurm never up: test_slurm.sh fails within 15 s (took $took s)" ||
	bad "Slurm never up: test_slurm.sh fails within 15 s" "exit $rc after $took s (137: killed at 25 s)" "$out"
check "... saying what it waited for" "$out" "^FAIL Slurm came up (slurmctld, slurmd, munged on .*) within 2 s" 1
check "... and what sinfo said" "$out" "sinfo did not answer within 2 s" 1
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
