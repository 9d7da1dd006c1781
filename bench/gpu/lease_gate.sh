# bench/gpu/lease_gate.sh — sourced by final.sh and fp8.sh: whether row $1
# runs under the lease's filters, and its time limit $2 cut to what the
# lease has left (sets lim). LOOM_LEASE_ONLY: the rows to run (names, space
# separated; unset: all); LOOM_LEASE_SKIP: rows not to run;
# LOOM_LEASE_END: the epoch second the lease's call must end by (lease.sh
# sets it): a row that would start with under 10 s left says so and runs
# not. Returns 1 for a row not to run.
lease_gate() {
	local n=$1 left
	lim=$2
	if [ -n "${LOOM_LEASE_ONLY:-}" ] && [[ " $LOOM_LEASE_ONLY " != *" $n "* ]]; then
		return 1
	fi
	[[ " ${LOOM_LEASE_SKIP:-} " == *" $n "* ]] && return 1
	if [ -n "${LOOM_LEASE_END:-}" ]; then
		left=$((LOOM_LEASE_END - $(date +%s)))
		if [ "$left" -lt 10 ]; then
			echo "== $n not run: the lease's time is spent"
			return 1
		fi
		[ "$left" -lt "$lim" ] && lim=$left
	fi
	return 0
}
