#!/bin/bash
# Every #include "folder/..." of the library points down the folder table of
# DESIGN.md: a folder includes itself, base/ (everyone's) and the rooms
# below it; parallel/ reaches engine/ through the plan and pass headers
# only and io/ through the header engine exports for it, so that no file
# outside engine/ includes engine/program_internal.h and engine/ names
# neither parallel/ nor io/. No file of parallel/ or io/ reaches
# engine/program_internal.h or engine/backend.h (a strategy never touches
# a backend: it asks the engine through engine/pass.h) through a chain of
# includes either. The
# arguments are the library's sources (every folder's :sources
# filegroup); public headers ("loom.h") and a folder's own unprefixed
# headers are not arrows.
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
# No file of parallel/ or io/ reaches the engine's own headers through the
# headers it includes either (an engine header that includes one, or a
# folder's own header that includes such a header); the chain is named.
engine_own="engine/program_internal.h engine/backend.h"
declare -A path_of # an include's text ("engine/pass.h") -> the file given
for f in "$@"; do
	for folder in $folders; do
		case "/$f" in */"$folder"/*)
			g="/$f"
			path_of["$folder/${g##*/"$folder"/}"]=$f
			;;
		esac
	done
done
includes() { # the quoted includes of file $1
	sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]*)".*/\1/p' "$1"
}
resolve() { # the file given that include $2 of file $1 names, else nothing
	if [ -n "${path_of[$2]:-}" ]; then
		echo "${path_of[$2]}"
	elif [[ "$2" != */* ]] && [ -f "$(dirname "$1")/$2" ]; then
		echo "$(dirname "$1")/$2"
	fi
}
# chain_of[h]: "" when h reaches no $target, "!" for that header itself,
# else the includes that lead there ("engine/pass.h -> engine/backend.h").
declare -A chain_of
target=""
reaches() {
	local h=$1 inc to
	[ -n "${chain_of[$h]+set}" ] && return
	chain_of[$h]="" # a cycle ends here
	case "/$h" in */"$target")
		chain_of[$h]="!"
		return
		;;
	esac
	while IFS= read -r inc; do
		to=$(resolve "$h" "$inc")
		[ -z "$to" ] && continue
		reaches "$to"
		case "${chain_of[$to]}" in
		"") ;;
		"!") chain_of[$h]=$inc && return ;;
		*) chain_of[$h]="$inc -> ${chain_of[$to]}" && return ;;
		esac
	done < <(includes "$h")
}
for target in $engine_own; do
	chain_of=()
	for f in "$@"; do
		case "/$f" in */parallel/* | */io/*) ;; *) continue ;; esac
		while IFS= read -r inc; do
			to=$(resolve "$f" "$inc")
			[ -z "$to" ] && continue
			reaches "$to"
			case "${chain_of[$to]}" in
			"") continue ;;
			"!") via=$inc ;;
			*) via="$inc -> ${chain_of[$to]}" ;;
			esac
			echo "$f: reaches $target through $via"
			bad=1
			break
		done < <(includes "$f")
	done
done

if [ "$n" -lt 100 ]; then
	echo "only $n source files given: the filegroups are missing some folders"
	exit 1
fi
[ $bad -eq 0 ] && echo "$arrows include arrows in $n library sources, all pointing down"
exit $bad
