#!/usr/bin/env bash
# tests/engine/cuda/gpu_summary.sh — the GPU suite's table: one row per
# step with a verdict read from the step's log, never from its exit status
# alone. usage: gpu_summary.sh ROWS, where each line of ROWS is
#   name <TAB> kind <TAB> rc <TAB> seconds <TAB> log [<TAB> minimum accuracy %]
# kinds:
#   info       the exit status only (versions)
#   criterion  a Criterion suite run with --verbose: FAIL on a non-zero
#              status, a failing or crashing case, no synthesis line, no
#              case run, or any skipped case ([SKIP] lines; Criterion's
#              synthesis does not count them; "Test is disabled" is a case
#              --filter left out, not a skip)
#   sanitizer  criterion, and compute-sanitizer's "ERROR SUMMARY: 0 errors"
#              (memcheck) or "RACECHECK SUMMARY: ... (0 errors, ...)"
#   train      the last "test accuracy X%" at or above the minimum
#   bench      a non-zero img/s (or tok/s) figure
#   optional   like bench, but a missing tool (rc "absent") is N/A, not FAIL
#   ranks      a multi-rank worker (tests/ddp): at least <minimum> lines say
#              "OK", none says WRONG or ERROR
# rc "absent": the program is not there; "timeout" (or 124): it ran out of
# time; "budget": not run, the suite's time was spent. Prints the table;
# exits 1 when any row FAILs.
set -u
rows=${1:?usage: gpu_summary.sh ROWS}
fails=0

num() { # the first integer after label in text ("" when absent)
	sed -n "s/.*$1 *\([0-9][0-9]*\).*/\1/p" <<<"$2" | head -n 1
}

last_line() { # the log's last non-blank line, cut
	grep -av '^\s*$' "$1" 2>/dev/null | tail -n 1 | cut -c1-100
}

criterion_verdict() { # log -> sets verdict and detail
	local log=$1 syn tested passing failing crashing skipped
	syn=$(grep -a 'Synthesis:' "$log" | tail -n 1)
	# "Test is disabled": a case --filter left out (the world-1 NCCL row
	# runs one suite of the binary), not a skip.
	skipped=$(grep -a '\[SKIP\]' "$log" | grep -vc 'Test is disabled$')
	if [ -z "$syn" ]; then
		verdict=FAIL
		detail="no Criterion synthesis (crashed before the end?); $skipped skipped"
		return
	fi
	tested=$(num 'Tested:' "$syn")
	passing=$(num 'Passing:' "$syn")
	failing=$(num 'Failing:' "$syn")
	crashing=$(num 'Crashing:' "$syn")
	detail="tested ${tested:-?}, passed ${passing:-?}, failed ${failing:-?}, crashed ${crashing:-?}, skipped $skipped"
	if [ "${tested:-0}" -eq 0 ] || [ "${failing:-1}" -ne 0 ] || [ "${crashing:-1}" -ne 0 ] ||
		[ "$skipped" -ne 0 ]; then
		verdict=FAIL
		# The first assertion's message ("[----]   needs a CUDA device ...").
		first=$(grep -a '^\[----\]   *[^ ]' "$log" | head -n 1 | sed 's/^\[----\] *//' | cut -c1-120)
		[ "${failing:-0}" != 0 ] && [ -n "$first" ] && detail="$detail; first failure: $first"
		[ "$skipped" -ne 0 ] &&
			detail="$detail; first skip: $(grep -a '\[SKIP\]' "$log" | grep -v -m1 'Test is disabled$' | cut -c1-120)"
	fi
}

printf '%-24s %-7s %-7s %8s  %s\n' step verdict rc seconds detail
printf '%-24s %-7s %-7s %8s  %s\n' ------------------------ ------- ------- -------- ------
while IFS=$'\t' read -r name kind rc secs log min; do
	[ -z "$name" ] && continue
	verdict=PASS
	detail=""
	if [ "$rc" = absent ]; then
		if [ "$kind" = optional ]; then
			verdict=N/A
		else
			verdict=FAIL
		fi
		detail=$(head -c 200 "$log" 2>/dev/null | head -n 1)
		[ -z "$detail" ] && detail="not in this bundle or on this host"
	elif [ "$rc" = budget ]; then
		verdict=FAIL
		detail="not run: the suite's time budget (20 minutes, LOOM_GPU_BUDGET_S) was spent"
	elif [ "$rc" = timeout ] || [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
		verdict=FAIL
		detail="timed out; last line: $(last_line "$log")"
	elif [ ! -f "$log" ]; then
		verdict=FAIL
		detail="no log $log"
	else
		case $kind in
		info)
			detail=$(grep -av '^\s*$' "$log" | head -n 1 | cut -c1-120)
			;;
		criterion | sanitizer)
			criterion_verdict "$log"
			if [ "$kind" = sanitizer ]; then
				# memcheck: "ERROR SUMMARY: N errors"; racecheck:
				# "RACECHECK SUMMARY: H hazards displayed (E errors, W warnings)".
				errs=$( {
					grep -a 'ERROR SUMMARY:' "$log" | sed -n 's/.*ERROR SUMMARY: *\([0-9][0-9]*\).*/\1/p'
					grep -a 'RACECHECK SUMMARY:' "$log" | sed -n 's/.*(\([0-9][0-9]*\) errors.*/\1/p'
				} | awk '{ s += $1 } END { print (NR ? s : "") }')
				if [ -z "$errs" ]; then
					verdict=FAIL
					detail="$detail; no compute-sanitizer ERROR SUMMARY"
				else
					detail="$detail; sanitizer errors $errs"
					[ "$errs" -ne 0 ] && verdict=FAIL
				fi
			fi
			;;
		train)
			acc=$(grep -ao 'test accuracy [0-9.]*%' "$log" | tail -n 1 | sed 's/test accuracy \([0-9.]*\)%/\1/')
			if [ -z "$acc" ]; then
				verdict=FAIL
				detail="no test accuracy in the log; last line: $(last_line "$log")"
			else
				detail="test accuracy $acc% (minimum ${min:-0}%)"
				awk -v a="$acc" -v m="${min:-0}" 'BEGIN { exit !(a + 0 >= m + 0) }' || verdict=FAIL
			fi
			ips=$(grep -ao '[0-9.]* img/s' "$log" | tail -n 1)
			[ -n "$ips" ] && detail="$detail, last $ips"
			;;
		ranks)
			oks=$(grep -ac ' OK ' "$log")
			bads=$(grep -acE 'WRONG|ERROR' "$log")
			detail="$oks ranks OK, $bads WRONG or ERROR; $(grep -aE ' OK | WRONG | ERROR ' "$log" | head -n 1 | cut -c1-120)"
			[ "$oks" -ge "${min:-1}" ] && [ "$bads" -eq 0 ] || verdict=FAIL
			;;
		bench | optional)
			ips=$(grep -aoE '[0-9]+(\.[0-9]+)? (img|tok)/s|"img_per_s": *[0-9.]+|\| *[0-9]+ *\| *[0-9]+ *\|' "$log" | tail -n 1)
			if [ -z "$ips" ] || ! grep -q '[1-9]' <<<"$ips"; then
				verdict=FAIL
				detail="no images/s figure in the log; last line: $(last_line "$log")"
			else
				detail="$ips"
			fi
			;;
		*)
			verdict=FAIL
			detail="unknown kind $kind"
			;;
		esac
		if [ "$rc" != 0 ]; then
			verdict=FAIL
			detail="exit $rc; $detail"
		fi
	fi
	[ "$verdict" = FAIL ] && fails=$((fails + 1))
	printf '%-24s %-7s %-7s %8s  %s\n' "$name" "$verdict" "$rc" "$secs" "$detail"
done <"$rows"
echo
if [ $fails -eq 0 ]; then
	echo "verdict: PASS (every row)"
else
	echo "verdict: FAIL ($fails row(s))"
fi
[ $fails -eq 0 ]
