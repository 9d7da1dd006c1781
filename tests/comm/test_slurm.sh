#!/usr/bin/env bash
# tests/comm/test_slurm.sh — loom's ranks started by a real srun: Debian's
# Slurm (slurmctld, slurmd, munge; bazel/install_deps.sh installs them) is
# started here on this machine with a private configuration, ports, state
# and munge socket (about 3 s), used, and stopped by its process ids. Needs
# root (slurmd runs the tasks); skips, saying why, without it or without
# the programs. Prints "N passed, N failed".
#   test_slurm.sh COMM_WORKER
set -u
W=$(realpath "$1")
source "$(dirname "${BASH_SOURCE[0]}")/../lib/mp_harness.sh"
skip() { echo "skip real srun: $1"; echo "$pass passed, $fail failed"; exit 0; }
for p in /usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/munged; do
	[ -x "$p" ] || skip "$p missing (slurmctld, slurmd, munge: bazel/install_deps.sh)"
done
command -v srun >/dev/null || skip "srun missing (slurm-client)"
[ "$(id -u)" -eq 0 ] || skip "slurmd must run as root"
[ -r /etc/munge/munge.key ] || skip "no /etc/munge/munge.key (the munge package makes it)"

d=$(mktemp -d /tmp/loom-slurm.XXXXXX)
pids=()
# The daemons get 5 s to stop on SIGTERM, then SIGKILL: a slurmd that waits
# on a step it is ending must not hold the test to its bazel timeout (once
# it did, for 4 minutes, after a failing case).
cleanup() {
	local p
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	for _ in $(seq 50); do
		local alive=0
		for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
		[ $alive = 0 ] && break
		sleep 0.1
	done
	for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
	rm -rf "$d"
}
trap cleanup EXIT
mkdir -p "$d/state" "$d/spool"
# munged insists on a key readable by its user only and a private socket dir.
cp /etc/munge/munge.key "$d/munge.key"
chmod 600 "$d/munge.key"
/usr/sbin/munged --foreground --force --socket="$d/munge.sock" --key-file="$d/munge.key" \
	--pid-file="$d/munged.pid" --log-file="$d/munged.log" --seed-file="$d/munged.seed" 2>"$d/munged.err" &
pids+=($!)
host=$(hostname -s)
base=$((30000 + ($$ % 1000) * 2))
export SLURM_CONF=$d/slurm.conf
cat >"$SLURM_CONF" <<EOF
ClusterName=loomtest
SlurmctldHost=$host
SlurmctldPort=$base
SlurmdPort=$((base + 1))
AuthType=auth/munge
AuthInfo=socket=$d/munge.sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmctldLogFile=$d/slurmctld.log
SlurmdLogFile=$d/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=loom Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
EOF
for _ in $(seq 50); do [ -S "$d/munge.sock" ] && break; sleep 0.1; done
/usr/sbin/slurmctld -D -c -f "$SLURM_CONF" >"$d/slurmctld.out" 2>&1 &
pids+=($!)
/usr/sbin/slurmd -D -f "$SLURM_CONF" >"$d/slurmd.out" 2>&1 &
pids+=($!)
# Up within a time bound (LOOM_TEST_SLURM_UP_S, 10 s; it takes about 3),
# each sinfo held to 2 s: one that slurmctld never answers waits out its
# message timeout (10 s) every call, and 100 such calls once ran into
# bazel's timeout with an empty log where the diagnosis below belongs.
up=0
until_s=$((SECONDS + ${LOOM_TEST_SLURM_UP_S:-10}))
while [ $SECONDS -lt $until_s ]; do
	timeout -s KILL 2 sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)' && { up=1; break; }
	sleep 0.2
done
if [ $up = 0 ]; then
	said=$(timeout -s KILL 2 sinfo 2>&1)
	[ $? -eq 137 ] && said="sinfo did not answer within 2 s${said:+: $said}"
	alive=
	for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive+=" $(ps -o comm= -p "$p")"; done
	bad "Slurm came up (slurmctld, slurmd, munged on $host) within ${LOOM_TEST_SLURM_UP_S:-10} s" \
		"$said" "still running:${alive:- none}" \
		"$(tail -n 5 "$d/slurmctld.log" "$d/slurmd.log" "$d/munged.err" 2>&1)"
	echo "$pass passed, $fail failed"
	exit 1
fi
ok "Slurm up on $host (private slurmctld, slurmd and munged)"

out=$(timeout 60 srun -n 2 --overcommit "$W" allreduce 2>&1)
check "srun -n 2: exact sums, the group formed from srun's variables" "$out" \
	"OK allreduce world 2 local [01]/2 via srun" 2
out=$(timeout 60 srun -n 3 --overcommit "$W" allreduce 2>&1)
check "srun -n 3: exact sums" "$out" "OK allreduce world 3 local [0-2]/3 via srun" 3
port=$((port + 1))
out=$(MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 srun -n 2 --overcommit "$W" broadcast 2>&1)
check "srun -n 2 with MASTER_ADDR/MASTER_PORT exported: broadcast" "$out" "OK broadcast" 2
# Two steps of one allocation, one after the other: each its own port.
out=$(timeout 60 salloc -n 2 --overcommit sh -c 'srun "$0" allreduce && srun "$0" allreduce' "$W" 2>&1)
check "salloc, two srun steps in a row: each step forms its group" "$out" \
	"OK allreduce world 2 .* via srun" 4
# A rank that dies: the other names it, as under every launcher.
out=$(LOOM_COMM_TIMEOUT_S=$T LOOM_TEST_VICTIM=1 timeout 60 srun -n 2 --overcommit -K0 "$W" die 2>&1)
check "srun: SIGKILL of rank 1, rank 0 names it" "$out" "ERROR .* \(failed\|timed out\) after [0-9.]* s: rank 1 died" 1

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
