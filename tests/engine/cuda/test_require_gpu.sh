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

for bin in "$@"; do
	name=$(basename "$bin")
	plain=$("$bin" --verbose 2>&1)
	rc_plain=$?
	req=$(LOOM_REQUIRE_GPU=1 "$bin" --verbose 2>&1)
	rc_req=$?
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
