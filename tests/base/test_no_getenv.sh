#!/bin/bash
# Library and example code reads the environment through base/options.h
# alone: a setting through its row of base/options.def, a launcher's
# variable through loom_env, whose list in base/options.c names every one.
# So getenv appears in base/options.c and nowhere else, and every name given
# to loom_env is on that list; and a message that names a variable
# ("off (LOOM_CUDA_GRAPH=0)") names a row of base/options.def. The
# arguments are the sources (every code folder's :sources filegroup).
set -u
bad=0
n=0
opts=
table=
for f in "$@"; do
	case "$f" in
	*base/options.c) opts=$f ;;
	*base/options.def) table=$f ;;
	esac
done
if [ -z "$opts" ] || [ -z "$table" ]; then
	echo "base/options.c or base/options.def is not among the sources given"
	exit 1
fi

for f in "$@"; do
	n=$((n + 1))
	[ "$f" = "$opts" ] || [ "$f" = "$table" ] && continue
	# Comments are not code: strip /* ... */ and // before looking.
	code=$(sed -e 's://.*$::' "$f" | perl -0pe 's:/\*.*?\*/::gs')
	hits=$(printf '%s\n' "$code" | grep -nE 'getenv[[:space:]]*\(' || true)
	if [ -n "$hits" ]; then
		echo "$f reads the environment itself (use base/options.h: a row of"
		echo "base/options.def, or loom_env for a launcher's variable):"
		echo "$hits"
		bad=1
	fi
	for name in $(printf '%s\n' "$code" | grep -oE 'loom_env[[:space:]]*\([[:space:]]*"[A-Za-z0-9_]+"' |
		grep -oE '"[A-Za-z0-9_]+"' | tr -d '"' | sort -u); do
		if ! grep -q "\"$name\"" "$opts"; then
			echo "$f: loom_env(\"$name\"): not on base/options.c's list of launcher names"
			bad=1
		fi
	done
	for name in $(printf '%s\n' "$code" | grep -oE '"[^"]*LOOM_[A-Z][A-Z0-9_]*=[^"]*"' |
		grep -oE 'LOOM_[A-Z][A-Z0-9_]*=' | tr -d '=' | sort -u); do
		if ! grep -q "\"$name\"" "$table" "$opts"; then
			echo "$f: a message names $name, which is no row of base/options.def"
			bad=1
		fi
	done
done
if [ "$n" -lt 150 ]; then
	echo "only $n source files given: the filegroups are missing some folders"
	exit 1
fi
[ $bad -eq 0 ] && echo "getenv in base/options.c alone, of $n sources"
exit $bad
