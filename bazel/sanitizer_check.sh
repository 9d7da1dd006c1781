#!/usr/bin/env bash
# bazel/sanitizer_check.sh — runs a test under `bazel test --config=asan` or
# --config=tsan (.bazelrc: --run_under) and fails it when any process it
# started wrote a sanitizer report. Criterion runs each test in a worker
# process and ignores a worker's exit code once the test has passed, so a leak
# found at the worker's exit would otherwise be printed and forgotten. Reports
# go to files (log_path) in a directory every process can write to (a test may
# drop privileges), and are copied into the test log.
set -u
dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/sanitizer.XXXXXX") || exit 1
chmod 1777 "$dir"
for v in ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS TSAN_OPTIONS; do
	export "$v=${!v:-}${!v:+:}log_path=$dir/report"
done
"$@"
rc=$?
reports=("$dir"/report*)
if [ -e "${reports[0]}" ]; then
	echo "sanitizer_check: ${#reports[@]} sanitizer report(s):" >&2
	cat "${reports[@]}" >&2
	[ "$rc" -eq 0 ] && rc=1
fi
rm -rf "$dir"
exit "$rc"
