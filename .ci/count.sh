# .ci/count.sh — how .ci/run counts a bazel test run (sourced; the caller
# holds passed, failed, skipped, crit_skipped, have_crit_skipped and the
# report array). .ci/test_count.sh checks it on made-up logs.

# Adds one suite's results to the counts above. One line per test target in
# bazel's summary: "//pkg:name  [(cached)] STATUS ...".
count_suite() { # LOG TESTLOGS_DIR TAG
	local suite_log=$1 testlogs=$2 tag=$3
	local target status pkg name file ok synth t p f s cs note plain
	while read -r target status; do
		pkg=${target#//}
		pkg=${pkg%%:*}
		name=${target##*:}
		file="$testlogs/${pkg:+$pkg/}$name/test.log"
		ok=0
		case "$status" in
		PASSED* | "(cached) PASSED"* | FLAKY* | "(cached) FLAKY"*) ok=1 ;;
		esac
		synth=""
		[ -f "$file" ] && synth=$(grep -a 'Synthesis: Tested:' "$file" | tail -n 1)
		if [ -n "$synth" ] && [[ "$status" != *"FAILED TO BUILD"* && "$status" != "NO STATUS"* ]]; then
			t=$(sed -n 's/.*Tested: *\([0-9]*\).*/\1/p' <<<"$synth")
			p=$(sed -n 's/.*Passing: *\([0-9]*\).*/\1/p' <<<"$synth")
			f=$(sed -n 's/.*Failing: *\([0-9]*\).*/\1/p' <<<"$synth")
			s=$(grep -ac '^\[SKIP\]' "$file")
			if grep -q 'Skipped: *[0-9]' <<<"$synth"; then
				have_crit_skipped=1
				cs=$(sed -n 's/.*Skipped: *\([0-9]*\).*/\1/p' <<<"$synth")
				crit_skipped=$((crit_skipped + cs))
				s=$cs
			fi
			note=""
			# A binary can fail beyond its test cases (a timeout, a crash after
			# the synthesis, a non-zero exit): that is one more failure.
			if [ "$ok" -eq 0 ] && [ "$f" -eq 0 ]; then
				f=1
				note=" (binary failed: $status)"
			fi
			# Tested: 0 and nothing skipped means the tests were never
			# registered (e.g. linked with --gc-sections), not a clean run.
			if [ "$t" -eq 0 ] && [ "$s" -eq 0 ] && [ "$f" -eq 0 ]; then
				f=1
				note=" (Criterion ran no tests: link with -Wl,--no-gc-sections)"
			fi
		elif plain=$(grep -aE '^[0-9]+ passed, [0-9]+ failed' "$file" 2>/dev/null | tail -n 1) &&
			[ -n "$plain" ] && [[ "$status" != *"FAILED TO BUILD"* && "$status" != "NO STATUS"* ]]; then
			# A script test that counts its own cases ("N passed, N failed").
			p=$(sed -n 's/^\([0-9]*\) passed.*/\1/p' <<<"$plain")
			f=$(sed -n 's/^[0-9]* passed, \([0-9]*\) failed.*/\1/p' <<<"$plain")
			s=$(grep -ac '^SKIP' "$file")
			note=""
			if [ "$ok" -eq 0 ] && [ "$f" -eq 0 ]; then
				f=1
				note=" (binary failed: $status)"
			fi
		else
			# Also NO STATUS (the target never ran this time: its test.log,
			# if any, is an old run's and counts for nothing).
			s=0
			if [ "$ok" -eq 1 ]; then p=1 f=0; else p=0 f=1; fi
			note=" ($status)"
		fi
		passed=$((passed + p))
		failed=$((failed + f))
		skipped=$((skipped + s))
		report+=("$(printf '  %-50s %4d passed %4d failed %4d skipped%s' "$target$tag" "$p" "$f" "$s" "$note")")
	done < <(grep -aE '^//[^ ]+ +(\(cached\) )?(PASSED|FAILED|FLAKY|TIMEOUT|NO STATUS|INCOMPLETE|SKIPPED|REMOTE)' "$suite_log" |
		sort -u)
}

# What a bazel exit code means once the tests are counted: "" when it adds
# no failure, else a note (and one failure is added if none was counted).
bazel_note() { # RC WHAT TIMEOUT_S
	case "$1" in
	0 | 3) ;; # built; 3 means some tests failed, already counted
	4) echo "$2: bazel found no test targets (counted as a failure: nothing was tested)" ;;
	124 | 137) echo "$2: bazel timed out after ${3}s" ;;
	*) echo "$2: bazel failed (exit code $1): see the errors above" ;;
	esac
}

