#!/bin/bash
# The tables of docs/settings.md are the options table's (base/options.def)
# as tools/options_doc prints them: each section between
# "<!-- options_doc --PART: begin -->" and "<!-- options_doc --PART: end -->"
# must equal `options_doc --PART`, so the docs cannot drift from the rows.
# Arguments: the options_doc binary, then docs/settings.md.
set -u
tool=$1
doc=$2
bad=0
found=0
for part in env flags; do
	begin="<!-- options_doc --$part: begin -->"
	end="<!-- options_doc --$part: end -->"
	grep -qxF -- "$begin" "$doc" || continue
	found=$((found + 1))
	want=$("$tool" "--$part") || { echo "options_doc --$part failed"; exit 1; }
	have=$(awk -v b="$begin" -v e="$end" '$0 == e { on = 0 } on { print } $0 == b { on = 1 }' "$doc")
	if [ "$have" != "$want" ]; then
		echo "$doc: the --$part table differs from base/options.def; write it again with"
		echo "  bazel run //tools:options_doc -- --$part"
		diff <(printf '%s\n' "$have") <(printf '%s\n' "$want")
		bad=1
	fi
done
if ! grep -qxF -- "<!-- options_doc --env: begin -->" "$doc"; then
	echo "$doc has no --env table"
	exit 1
fi
[ $bad -eq 0 ] && echo "$found table(s) of $doc equal the options table"
exit $bad
