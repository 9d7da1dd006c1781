# tests/lib/mp_harness.sh — what the multi-process script tests share
# (tests/comm, tests/ddp): Open MPI as root in a container, a free-ish port,
# and the pass/fail bookkeeping behind their "N passed, N failed" line.
# Sourced, not run.

pass=0 fail=0
# Cases that succeed get a long timeout, so that a loaded machine cannot
# fail them; cases that must wait for a timeout set LOOM_COMM_TIMEOUT_S=$T
# themselves (and the waiting side is given longer than the reporting side
# by comm/ itself).
export LOOM_COMM_TIMEOUT_S=60
T=2
# Open MPI refuses root unless told; containers have no CMA for vader.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
# The first MASTER_PORT of this script, each case taking the next: below
# Linux's ephemeral range (32768 up: the ports other programs' outgoing
# connections get, where a test's listen once found one taken, "Address
# already in use"), and 128 apart for scripts whose pids are near (tests
# that start together), each using a few dozen.
port=$((20000 + ($$ * 128) % 12672))
# Under ASan (bazel test --config=asan): Open MPI's and PMIx's allocations
# kept until exit are suppressed by library (lsan_mpi.supp), never loom's
# own; for their frames to be attributed at all, Open MPI keeps its plugins
# loaded and the unwinder walks frames without frame pointers.
export LSAN_OPTIONS="${LSAN_OPTIONS:-}${LSAN_OPTIONS:+:}suppressions=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lsan_mpi.supp:print_suppressions=0"
export OMPI_MCA_mca_base_component_disable_dlclose=1
[ -n "${ASAN_OPTIONS:-}" ] && export ASAN_OPTIONS="$ASAN_OPTIONS:fast_unwind_on_malloc=0"
# Under TSan (bazel test --config=tsan): races and lock-order cycles inside
# Open MPI, PMIx and libevent (not built with TSan) are suppressed by
# library (tsan_mpi.supp); any report with a loom frame fails the test.
[ -n "${TSAN_OPTIONS:-}" ] &&
	export TSAN_OPTIONS="$TSAN_OPTIONS:suppressions=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/tsan_mpi.supp"

ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() {
	fail=$((fail + 1))
	echo "FAIL $1"
	shift
	printf '%s\n' "$@" | head -20 | sed 's/^/     /'
}

# check NAME OUTPUT PATTERN COUNT: PATTERN on exactly COUNT lines.
check() {
	local n
	n=$(grep -c -- "$3" <<<"$2")
	if [ "$n" -eq "$4" ]; then ok "$1"; else bad "$1" "want $4 lines with '$3', got $n:" "$2"; fi
}

# expect NAME WANT_RC PATTERN -- ARGS...: runs "$EX" ARGS (the script's
# program under test) and wants exit status WANT_RC and a line matching.
expect() {
	local name=$1 want=$2 pat=$3 out rc
	shift 4
	out=$("$EX" "$@" 2>&1)
	rc=$?
	if [ "$rc" -eq "$want" ] && grep -q -- "$pat" <<<"$out"; then ok "$name"; else
		bad "$name" "exit $rc (want $want), no line with '$pat':" "$out"; fi
}

# envrun WORLD ARGS...: env:// ranks of the script's program "$W" started by
# hand (torchrun's variables), each with a 60 s limit; waits for all.
envrun() {
	local world=$1 r
	shift
	port=$((port + 1))
	for r in $(seq 0 $((world - 1))); do
		RANK=$r WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
			timeout 60 "$W" "$@" &
	done
	wait
}

# mp_setup: one OpenMP thread per rank, MPIRUN (mpirun as root, oversubscribed,
# passing both settings on), a scratch folder $tmp removed at exit; ends the
# script with "0 passed, 1 failed" where mpirun is missing.
mp_setup() {
	export OMP_NUM_THREADS=1
	MPIRUN=(mpirun --allow-run-as-root --oversubscribe -x LOOM_COMM_TIMEOUT_S -x OMP_NUM_THREADS)
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	command -v mpirun >/dev/null || { echo "mpirun missing (openmpi-bin)"; echo "0 passed, 1 failed"; exit 1; }
}
