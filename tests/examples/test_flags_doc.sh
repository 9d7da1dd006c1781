#!/usr/bin/env bash
# tests/examples/test_flags_doc.sh — docs/examples.md's table of flags,
# between <!-- flags:begin --> and <!-- flags:end -->, is exactly what
# tools/options_doc --flags prints from base/options.def. To refresh it:
#   bazel run //tools:options_doc -- --flags, pasted between the markers.
set -u
gen=$1 doc=$2
want=$("$gen" --flags) || { echo "FAIL: $gen --flags exited $?"; exit 1; }
have=$(sed -n '/^<!-- flags:begin -->$/,/^<!-- flags:end -->$/p' "$doc" | sed '1d;$d')
if [ -z "$have" ]; then
	echo "FAIL: $doc has no table between <!-- flags:begin --> and <!-- flags:end -->"
	exit 1
fi
if [ "$have" != "$want" ]; then
	echo "FAIL: $doc's table of flags differs from tools/options_doc --flags:"
	diff <(echo "$have") <(echo "$want") | head -20
	exit 1
fi
echo "PASS: $doc's table of flags is base/options.def's ($(echo "$want" | wc -l) lines)"
