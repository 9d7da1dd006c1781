#!/bin/bash
# Library code never writes to stderr itself: messages reach the user as a
# status plus the error object of the handle (or the thread's), and anything
# printed goes through the log sink (base/errf.h: loom_log), whose default
# is the one fputs to stderr allowed. The arguments are the library's
# sources (every folder's :sources filegroup).
set -u
bad=0
n=0
writes='\b(v?fprintf|fputs|fputc|putc|fwrite)\s*\([^;]*\bstderr\b|\bperror\s*\(|\b(v?dprintf|write)\s*\(\s*(2|STDERR_FILENO)\s*,'

for f in "$@"; do
	n=$((n + 1))
	case "$f" in
	*base/errf.c) continue ;;   # the sink's default
	*comm/errfile.c) continue ;; # stderr's own wrapper under torchrun (passes bytes to fd 2)
	esac
	# Comments are not code: strip /* ... */ and // before looking.
	hits=$(sed -e 's://.*$::' "$f" | perl -0pe 's:/\*.*?\*/::gs' |
		grep -nE "$writes" || true)
	if [ -n "$hits" ]; then
		echo "$f writes to stderr itself (use loom_log or the handle's error):"
		echo "$hits"
		bad=1
	fi
done
if [ "$n" -lt 100 ]; then
	echo "only $n source files given: the filegroups are missing some folders"
	exit 1
fi
[ $bad -eq 0 ] && echo "no stderr writes in $n library sources"
exit $bad
