#!/bin/bash
# Every #include "folder/..." of the library points down the folder table of
# DESIGN.md: a folder includes itself, base/ (everyone's) and the rooms
# below it; parallel/ reaches engine/ through the plan and pass headers
# only and io/ through the header engine exports for it, so that no file
# outside engine/ includes engine/program_internal.h and engine/ names
# neither parallel/ nor io/. The arguments are the library's sources
# (every folder's :sources filegroup); public headers ("loom.h") and a
# folder's own unprefixed headers are not arrows.
set -u

# What each folder may include besides itself and base/: folders, or
# single headers (a path with a file name).
allowed() {
	case "$1" in
	base) echo "" ;;
	graph) echo "" ;;
	amp) echo "graph" ;;
	comm) echo "" ;;
	datasets) echo "" ;;
	engine) echo "graph amp comm" ;;
	parallel) echo "graph comm engine/plan.h engine/pass.h" ;;
	io) echo "graph engine/io_view.h" ;;
	*) echo "UNKNOWN" ;;
	esac
}

folders="base graph amp comm datasets engine parallel io"
bad=0
n=0
arrows=0
for f in "$@"; do
	# the folder: the first path component that is a library folder
	from=""
	for part in ${f//\// }; do
		case " $folders " in *" $part "*) from=$part; break ;; esac
	done
	if [ -z "$from" ]; then
		echo "$f: in no library folder this test knows"
		bad=1
		continue
	fi
	n=$((n + 1))
	ok="$from base $(allowed "$from")"
	while IFS= read -r line; do
		inc=$(sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]*)".*/\1/' <<<"$line")
		case "$inc" in */*) ;; *) continue ;; esac # public or the folder's own
		to=${inc%%/*}
		arrows=$((arrows + 1))
		hit=0
		for a in $ok; do
			if [ "$a" = "$to" ] || [ "$a" = "$inc" ]; then
				hit=1
				break
			fi
		done
		if [ "$inc" = "engine/program_internal.h" ] && [ "$from" != engine ]; then
			hit=0
		fi
		if [ $hit -eq 0 ]; then
			echo "$f: $from/ may not include \"$inc\" (allowed: $ok)"
			bad=1
		fi
	done < <(grep -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" || true)
done
if [ "$n" -lt 100 ]; then
	echo "only $n source files given: the filegroups are missing some folders"
	exit 1
fi
[ $bad -eq 0 ] && echo "$arrows include arrows in $n library sources, all pointing down"
exit $bad
