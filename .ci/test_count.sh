#!/usr/bin/env bash
# .ci/test_count.sh — .ci/count.sh on made-up bazel summaries and test
# logs: a target with NO STATUS counts as a failure even when an old
# test.log of it says "5 passed, 0 failed"; a target that FAILED TO BUILD
# counts one failure; a passing script test counts its own cases; bazel's
# exit code 4 (no test targets) is a failure note, never green.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
source .ci/count.sh
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
errors=0
expect() { # WHAT GOT WANT
	if [ "$2" != "$3" ]; then
		echo "ci count self-test: $1: got '$2', want '$3'"
		errors=$((errors + 1))
	fi
}

mkdir -p "$d/logs/a/old" "$d/logs/a/fresh" "$d/logs/a/broken"
echo "5 passed, 0 failed" >"$d/logs/a/old/test.log"
echo "3 passed, 0 failed" >"$d/logs/a/fresh/test.log"
echo "7 passed, 0 failed" >"$d/logs/a/broken/test.log"
cat >"$d/summary" <<'LOG'
//a:old                                                                  NO STATUS
//a:fresh                                                                PASSED in 2.0s
//a:broken                                                               FAILED TO BUILD
LOG
passed=0 failed=0 skipped=0 crit_skipped=0 have_crit_skipped=0
report=()
count_suite "$d/summary" "$d/logs" ""
expect "passes (only //a:fresh's 3)" "$passed" 3
expect "failures (NO STATUS and FAILED TO BUILD)" "$failed" 2
expect "bazel exit 4" "$(bazel_note 4 "normal suite" 60 | grep -c 'counted as a failure')" 1
expect "bazel exit 0" "$(bazel_note 0 "normal suite" 60)" ""

[ "$errors" -eq 0 ] && echo "ci count self-test: ok"
[ "$errors" -eq 0 ]
