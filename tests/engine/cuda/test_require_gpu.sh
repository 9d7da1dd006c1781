#!/usr/bin/env bash
# tests/engine/cuda/test_require_gpu.sh — LOOM_REQUIRE_GPU=1 turns the CUDA
# suites' "no GPU" skips into failures that name why there is no device.
# args: the test binaries (test_device, test_cuda_ops). On a host without a
# GPU (no /dev/nvidia0) each must pass as usual without the variable and
# fail with it, every device test naming the reason; on a GPU host each
# must pass with the variable and skip nothing.
set -u
failed=0
fail() {
	echo "FAIL: $*"
	failed=$((failed + 1))
}

# Without a GPU, test_cuda_ops is checked on one suite (cuda_resnet: every
# case a device case): its 51 cases re-execute a binary that maps cuBLASLt
# and cuDNN, 0.3 s each, and its own target runs them all anyway; the
# check is need_gpu.h's, the same macro in every case.
for bin in "$@"; do
	name=$(basename "$bin")
	sel=()
	[ ! -e /dev/nvidia0 ] && [ "$name" = test_cuda_ops ] && sel=(--filter='cuda_resnet/*')
	# (Criterion lists the cases a filter leaves out as "[SKIP] ...: Test
	# is disabled": not skips of this test's kind.)
	plain=$("$bin" --verbose "${sel[@]}" 2>&1)
	rc_plain=$?
	plain=$(grep -v ': Test is disabled$' <<<"$plain")
	req=$(LOOM_REQUIRE_GPU=1 "$bin" --verbose "${sel[@]}" 2>&1)
	rc_req=$?
	req=$(grep -v ': Test is disabled$' <<<"$req")
	if [ -e /dev/nvidia0 ]; then
		[ $rc_req -eq 0 ] || fail "$name: LOOM_REQUIRE_GPU=1 on a GPU host exits $rc_req"
		if grep -q '\[SKIP\]' <<<"$req"; then
			fail "$name: skipped tests on a GPU host:"
			grep '\[SKIP\]' <<<"$req"
		fi
		continue
	fi
	[ $rc_plain -eq 0 ] || fail "$name: without LOOM_REQUIRE_GPU it exits $rc_plain: $plain"
	skips=$(grep -c '\[SKIP\]' <<<"$plain")
	[ "$skips" -gt 0 ] || fail "$name: no test skipped without a GPU (nothing to turn into a failure)"
	[ $rc_req -ne 0 ] || fail "$name: LOOM_REQUIRE_GPU=1 without a GPU exits 0"
	grep -q '\[SKIP\]' <<<"$req" && fail "$name: LOOM_REQUIRE_GPU=1 still skips"
	# Every skip became a failure with the reason (the probe's error or the
	# device count), never a bare "needs a GPU".
	named=$(grep -c 'needs a CUDA device (LOOM_REQUIRE_GPU=1): \(none is usable: .\|this build has no CUDA toolkit\)' <<<"$req")
	[ "$named" -eq "$skips" ] ||
		fail "$name: $skips skips without the variable, $named failures naming the reason with it"
	echo "$name: $skips skips -> $named failures, e.g.:"
	grep -m1 'needs a CUDA device (LOOM_REQUIRE_GPU=1)' <<<"$req"
done
echo "$failed failed"
[ $failed -eq 0 ]
