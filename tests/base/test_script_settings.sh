#!/bin/bash
# Every LOOM_* variable the GPU lease scripts and the benchmarks set is read
# by someone: a row of base/options.def, a launcher name of base/options.c,
# a test program (LOOM_REQUIRE_GPU), or a script that reads it (${LOOM_X}).
# The library ignores a LOOM_* name it does not know, so a misspelt switch
# in an A/B pair (LOOM_CUDA_LN_BWD_ACUM=1) would run the default twice and
# a lease would decide a switch on two equal runs. The arguments are those
# files: .def, .c and .h files are readers (their quoted names); .sh files
# are both (what they read, what they set).
set -u
readers=()
scripts=()
for f in "$@"; do
	case "$f" in
	*.sh) scripts+=("$f") ;;
	*) readers+=("$f") ;;
	esac
done
if [ ${#scripts[@]} -eq 0 ] || [ ${#readers[@]} -eq 0 ]; then
	echo "no scripts or no readers among the arguments"
	exit 1
fi
known=$( (grep -hoE '"LOOM_[A-Z0-9_]+"' "${readers[@]}" | tr -d '"'
	cat "${scripts[@]}" | grep -oE '\$\{?LOOM_[A-Z0-9_]+' | grep -oE 'LOOM_[A-Z0-9_]+') | sort -u)
bad=0
n=0
for f in "${scripts[@]}"; do
	for name in $(grep -oE '(^|[[:space:];(])LOOM_[A-Z0-9_]+=' "$f" | grep -oE 'LOOM_[A-Z0-9_]+' |
		sort -u); do
		n=$((n + 1))
		if ! printf '%s\n' "$known" | grep -qx "$name"; then
			echo "$f sets $name, which nothing reads (not a row of base/options.def, a"
			echo "launcher name, a test's variable or a script's): a misspelt setting?"
			bad=1
		fi
	done
done
echo "$n variables set in ${#scripts[@]} scripts, against $(printf '%s\n' "$known" | wc -l) names read"
exit $bad
