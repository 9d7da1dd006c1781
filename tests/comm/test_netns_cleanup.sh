#!/usr/bin/env bash
# tests/comm/test_netns_cleanup.sh — test_comm.sh's two-host cases leave no
# network namespace, veth or /run/netns mount behind, whichever step of
# their set-up fails: here `ip -n` (missing from an old iproute2) after both
# namespaces were made, through an `ip` first on PATH that refuses it. Needs
# root (ip netns); skips, saying so, without it. Prints "N passed, N failed".
#   test_netns_cleanup.sh TEST_COMM_SH COMM_WORKER
set -u
S=$(realpath "$1")
W=$(realpath "$2")
source "$(dirname "${BASH_SOURCE[0]}")/../lib/mp_harness.sh"
IP=$(command -v ip) || { echo "skip: no ip (iproute2)"; echo "0 passed, 0 failed"; exit 0; }
[ "$(id -u)" -eq 0 ] || { echo "skip: ip netns needs root"; echo "0 passed, 0 failed"; exit 0; }
shim=$(mktemp -d)
trap 'rm -rf "$shim"' EXIT
printf '#!/bin/sh\n[ "$1" = -n ] && { echo "Option \\"-n\\" is unknown, try \\"ip -help\\"." >&2; exit 255; }\nexec %s "$@"\n' \
	"$IP" >"$shim/ip"
chmod +x "$shim/ip"
mounted() { awk '$5 == "/run/netns" { m = 1 } END { exit !m }' /proc/self/mountinfo; }
mounted && was_mounted=1 || was_mounted=0
# test_comm.sh names its namespaces after its pid (mpt$$): what it left is
# told apart from what other tests on this host hold.
PATH="$shim:$PATH" bash "$S" "$W" netns >"$shim/out" 2>&1 &
inner=$!
wait $inner
out=$(cat "$shim/out")
ns=mpt$inner
check "ip -n missing: the two-host cases are skipped, saying why" "$out" "^skip two hosts .*unknown" 1
left=$("$IP" netns list 2>/dev/null | grep -E "^${ns}[ab]( |$)")
left+=$("$IP" -o link show 2>/dev/null | grep -oE "${ns}[xy]@" | tr -d @)
# /run/netns mounted by it and left empty (another test's namespaces would
# be in it, and would keep it).
[ $was_mounted = 0 ] && mounted && [ -z "$(ls -A /run/netns 2>/dev/null)" ] && left+=" the /run/netns mount"
[ -z "$left" ] && ok "ip -n missing: nothing left behind (namespaces, veth, /run/netns mount)" ||
	bad "ip -n missing: nothing left behind (namespaces, veth, /run/netns mount)" \
		"left: $left" "test_comm.sh said:" "$out"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
