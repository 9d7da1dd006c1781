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
state() { # the namespaces, the veths of test_comm.sh, and whether /run/netns is a mount
	"$IP" netns list 2>/dev/null | sort
	"$IP" -o link show 2>/dev/null | sed -n 's/^[0-9]*: \(mpt[0-9]*[xy]\)@.*/\1/p' | sort
	awk '$5 == "/run/netns" { print "mount /run/netns" }' /proc/self/mountinfo
}
before=$(state)
out=$(PATH="$shim:$PATH" timeout -s KILL 30 bash "$S" "$W" netns 2>&1)
after=$(state)
check "ip -n missing: the two-host cases are skipped, saying why" "$out" "^skip two hosts" 1
[ "$before" = "$after" ] && ok "ip -n missing: nothing left behind (namespaces, veth, /run/netns mount)" ||
	bad "ip -n missing: nothing left behind (namespaces, veth, /run/netns mount)" \
		"before:" "$before" "after:" "$after" "test_comm.sh said:" "$out"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
