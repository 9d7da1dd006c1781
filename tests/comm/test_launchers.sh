#!/usr/bin/env bash
# tests/comm/test_launchers.sh — loom's ranks as torchrun's agent and
# Slurm's srun start them, without either installed: torchrun's agent store
# is tests/comm/stand_in_store.py (PyTorch's TCPStore protocol), srun's
# environment is set by hand. Checks the rendezvous through the store, the
# key per restart, torchrun's error file, and srun's variables and host
# list. Prints "N passed, N failed".
#   test_launchers.sh COMM_WORKER STAND_IN_STORE
set -u
W=$1
STORE=$2
source "$(dirname "${BASH_SOURCE[0]}")/../lib/mp_harness.sh"
tmp=$(mktemp -d)
store_pid=
trap '[ -n "$store_pid" ] && kill "$store_pid" 2>/dev/null; rm -rf "$tmp"' EXIT

command -v python3 >/dev/null || { echo "python3 missing (bazel/install_deps.sh installs it)"; echo "0 passed, 1 failed"; exit 1; }

# The stand-in store on a free port: $SPORT, its command log $tmp/store.log.
python3 "$STORE" "$tmp/port" "$tmp/store.log" 2>"$tmp/store.err" &
store_pid=$!
for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.1; done
SPORT=$(cat "$tmp/port" 2>/dev/null)
[ -n "$SPORT" ] || { echo "the stand-in store did not start:"; cat "$tmp/store.err"; echo "0 passed, 1 failed"; exit 1; }

# torchrun's worker environment (PyTorch 2.x's LocalElasticAgent):
# agentrun WORLD RESTART SCENARIO [RANK...] (default all ranks).
agentrun() {
	local world=$1 restart=$2 what=$3 r
	shift 3
	for r in ${@:-$(seq 0 $((world - 1)))}; do
		RANK=$r LOCAL_RANK=$r WORLD_SIZE=$world LOCAL_WORLD_SIZE=$world GROUP_RANK=0 \
			GROUP_WORLD_SIZE=1 ROLE_RANK=$r ROLE_WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 \
			MASTER_PORT=$SPORT TORCHELASTIC_USE_AGENT_STORE=True \
			TORCHELASTIC_RESTART_COUNT=$restart TORCHELASTIC_MAX_RESTARTS=1 \
			TORCHELASTIC_RUN_ID=none TORCHELASTIC_ERROR_FILE=$tmp/error_$r.json \
			OMP_NUM_THREADS=1 timeout 60 "$W" "$what" &
	done
	wait
}

out=$(agentrun 2 0 allreduce 2>&1)
check "torchrun agent store, 2 ranks: exact sums" "$out" "OK allreduce world 2 local [01]/2 via env://" 2
check "... no rank listens on MASTER_PORT (the store's)" "$out" "Address already in use" 0
log=$(cat "$tmp/store.log")
check "... each rank validates first (PyTorch 2.x's handshake)" "$log" "^VALIDATE ok" 2
check "... rank 0 publishes its address under the attempt's key" "$log" \
	"^SET /worker/attempt_0/loom_rank0_addr loom1 127.0.0.1 [0-9][0-9]*$" 1
check "... rank 1 waits for that key and reads it" "$log" "^GET /worker/attempt_0/loom_rank0_addr$" 1
check "... the store dropped no connection" "$log" "DROPPED" 0
: >"$tmp/store.log"
out=$(agentrun 3 1 allreduce 2>&1)
check "torchrun agent store, restart 1, 3 ranks: exact sums" "$out" "OK allreduce world 3 .* via env://" 3
check "... the restart's own key (no stale address from attempt 0)" "$(cat "$tmp/store.log")" \
	"^SET /worker/attempt_1/loom_rank0_addr " 1

# A store on IPv6's loopback (MASTER_ADDR=::1): rank 0's listener is IPv4,
# so it publishes 127.0.0.1, not ::1. Skipped where the host has no ::1.
python3 "$STORE" "$tmp/port6" "$tmp/store6.log" ::1 2>"$tmp/store6.err" &
store6_pid=$!
for _ in $(seq 100); do [ -s "$tmp/port6" ] && break; kill -0 $store6_pid 2>/dev/null || break; sleep 0.1; done
if [ -s "$tmp/port6" ]; then
	out=$(SPORT=$(cat "$tmp/port6") && for r in 0 1; do
		RANK=$r WORLD_SIZE=2 MASTER_ADDR=::1 MASTER_PORT=$SPORT TORCHELASTIC_USE_AGENT_STORE=True \
			timeout 60 "$W" allreduce &
	done 2>&1; wait)
	check "agent store on ::1: the ranks meet (rank 0 publishes its IPv4 loopback)" "$out" \
		"OK allreduce world 2 .* via env://" 2
	check "... published as 127.0.0.1" "$(cat "$tmp/store6.log")" \
		"^SET /worker/attempt_0/loom_rank0_addr loom1 127.0.0.1 " 1
else
	echo "skip agent store on ::1: no IPv6 loopback here ($(head -c 200 "$tmp/store6.err"))"
fi
kill $store6_pid 2>/dev/null

# Without TORCHELASTIC_USE_AGENT_STORE rank 0 listens on MASTER_PORT itself
# (plain env://): there it finds the store, as issue 33 found torchrun's.
out=$(RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$SPORT timeout 30 "$W" allreduce 2>&1)
check "plain env:// on the store's port: rank 0 cannot listen (why the store path exists)" "$out" \
	"rank 0 (MASTER_PORT): listen on port $SPORT: Address already in use" 1

# A rank whose rank 0 never publishes: it names what it waited for, and
# torchrun's error file carries that line, in the JSON torchrun reads.
rm -f "$tmp"/error_*.json
out=$(LOOM_COMM_TIMEOUT_S=1 agentrun 2 5 allreduce 1 2>&1)
check "agent store: rank 0 never publishes, rank 1 names the key it waited for" "$out" \
	"rank 1 waited 3.5 s for rank 0's address in torchrun's store .*key '/worker/attempt_5/loom_rank0_addr' did not appear" 1
ef=$tmp/error_1.json
if [ -s "$ef" ] && msg=$(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
m = d["message"]
int(m["extraInfo"]["timestamp"])  # torchrun parses it so
assert "py_callstack" in m["extraInfo"]
print(m["message"])' "$ef" 2>&1); then
	check "... TORCHELASTIC_ERROR_FILE: torchrun's JSON, the message is loom's error" "$msg" \
		"^rank 1: ERROR .*rank 1 waited 3.5 s for rank 0's address in torchrun's store" 1
else
	bad "... TORCHELASTIC_ERROR_FILE: no readable file" "${msg:-missing $ef}"
fi
rm -f "$tmp"/error_*.json
out=$(agentrun 1 0 allreduce 2>&1)
check "agent store, world 1: runs, no error file on success" "$out" "OK allreduce world 1" 1
[ ! -e "$tmp/error_0.json" ] && ok "... no error file after exit 0" || bad "... error file after exit 0" "$(cat "$tmp/error_0.json")"

out=$(TORCHELASTIC_USE_AGENT_STORE=maybe RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 "$W" allreduce 2>&1)
check "TORCHELASTIC_USE_AGENT_STORE=maybe is refused, naming it" "$out" \
	"TORCHELASTIC_USE_AGENT_STORE='maybe' is neither True nor False" 1
# A closed port where the store should be: named within the join timeout.
closed=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
out=$(LOOM_COMM_TIMEOUT_S=1 RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$closed \
	TORCHELASTIC_USE_AGENT_STORE=True timeout 30 "$W" allreduce 2>&1)
check "agent store: nothing on MASTER_PORT is named, with the variables" "$out" \
	"torchrun's store at MASTER_ADDR=127.0.0.1 MASTER_PORT=$closed: Connection refused" 1

# Slurm's srun: srunrun NTASKS NODELIST SCENARIO [VAR=VALUE...] (for every
# task; one step id for all, as srun gives).
srunrun() {
	local n=$1 nodes=$2 what=$3 r step=$RANDOM
	shift 3
	for r in $(seq 0 $((n - 1))); do
		env SLURM_PROCID=$r SLURM_NTASKS=$n SLURM_LOCALID=$r SLURM_NODEID=0 SLURM_NNODES=1 \
			SLURM_STEP_NODELIST="$nodes" SLURM_NODELIST="$nodes" SLURM_JOB_ID=$$ \
			SLURM_STEP_ID=$step SLURM_STEP_NUM_TASKS=$n "$@" timeout 60 "$W" "$what" &
	done
	wait
}
out=$(srunrun 2 localhost allreduce 2>&1)
check "srun, 2 tasks: the first node of SLURM_STEP_NODELIST, a port from the job" "$out" \
	"OK allreduce world 2 local [01]/2 via srun" 2
out=$(srunrun 3 'localhost,node[02-04,07]' allreduce 2>&1)
check "srun, 3 tasks, a compressed node list: its first host" "$out" "OK allreduce world 3 .* via srun" 3
port=$((port + 1))
out=$(srunrun 2 'gpu[01-02]' allreduce MASTER_ADDR=127.0.0.1 MASTER_PORT=$port 2>&1)
check "srun with MASTER_ADDR and MASTER_PORT: they win over the node list" "$out" \
	"OK allreduce world 2 .* via srun" 2
out=$(env SLURM_PROCID=2 SLURM_NTASKS=2 SLURM_STEP_NODELIST=localhost "$W" allreduce 2>&1)
check "srun: SLURM_PROCID out of range is named" "$out" "SLURM_PROCID='2' is out of range \[0, 1\]" 1
out=$(env SLURM_PROCID=0 SLURM_NTASKS=2 SLURM_STEP_NODELIST='node[04-01]' "$W" allreduce 2>&1)
check "srun: a malformed node list is named" "$out" \
	"srun: SLURM_STEP_NODELIST='node\[04-01\]': bad range in brackets" 1
# A batch script (no step node list) is not a rank: one process.
out=$(env SLURM_PROCID=0 SLURM_NTASKS=4 SLURM_NODELIST=localhost "$W" allreduce 2>&1)
check "sbatch's script (no SLURM_STEP_NODELIST): a single process, not rank 0 of 4" "$out" \
	"OK allreduce world 1 .* via single" 1

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
