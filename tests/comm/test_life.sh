#!/usr/bin/env bash
# tests/comm/test_life.sh — what a job leaves behind when it ends: workers
# of a SIGKILLed --nproc launcher (or mpirun, or torchrun's agent) are gone
# within 5 s and write no checkpoint after the kill; a worker whose
# launcher is gone says why;
# the progress files in /dev/shm go at exit (clean runs and killed ranks),
# and stale ones of dead processes are swept at start-up. Prints "N passed,
# N failed". Also: under --nproc a worker's stderr reaches the launcher's
# stderr (its stdout the launcher's stdout).
set -u
W=$1 M=$2
source "$(dirname "${BASH_SOURCE[0]}")/../lib/mp_harness.sh"
mp_setup
host=$(hostname)

# alive PID...: those still running (a zombie has ended: only its parent's
# wait is missing, and a killed launcher's workers are reaped by init).
alive() {
	local p s
	for p; do
		s=$(ps -o stat= -p "$p" 2>/dev/null)
		[ -n "$s" ] && [ "${s:0:1}" != Z ] && echo "$p"
	done
}
# gone_within5 PID...: 0 once none runs, polling for up to 5 s; else prints them.
gone_within5() {
	local i left
	for i in $(seq 50); do
		left=$(alive "$@")
		[ -z "$left" ] && return 0
		sleep 0.1
	done
	echo $left
	return 1
}
# files PID...: the progress files still there for these processes.
files() {
	local p
	for p; do [ -e "/dev/shm/loom-progress-$host-$p" ] && echo "/dev/shm/loom-progress-$host-$p"; done
}
no_files() { # NAME PID...
	local name=$1 left
	shift
	left=$(files "$@")
	[ -n "$*" ] && [ -z "$left" ] && ok "$name" || bad "$name" "pids: '$*'; left: $left"
}
# wait_for FILE PATTERN COUNT: until COUNT lines of FILE match (60 s at most).
wait_for() {
	local i
	for i in $(seq 600); do
		[ "$(grep -c -- "$2" "$1")" -ge "$3" ] && return 0
		sleep 0.1
	done
	return 1
}
pids_of() { sed -n 's/.* pid \([0-9]*\)$/\1/p' "$1"; }

# The launcher SIGKILLed (as the OOM killer does): its workers stop at
# once, each from its watcher (the liveness pipe reads EOF), which removes
# the worker's progress file: a worker killed by its parent-death signal
# alone would leave it behind.
"$W" --nproc 2 sleep >"$tmp/a" 2>&1 &
lp=$!
wait_for "$tmp/a" "OK allreduce" 2
pids=$(pids_of "$tmp/a")
kill -KILL $lp
{ wait $lp; } 2>/dev/null
left=$(gone_within5 $pids) && ok "launcher SIGKILLed: its 2 workers are gone within 5 s" ||
	bad "launcher SIGKILLed: its 2 workers are gone within 5 s" "still running: $left" "$(cat "$tmp/a")"
kill -KILL $left 2>/dev/null
no_files "launcher SIGKILLed: the workers removed their progress files" $pids

# ... even a worker that is stopped (SIGSTOP, a debugger) at that moment:
# the parent-death signal (SIGCONT once the watcher runs) wakes it.
"$W" --nproc 2 sleep >"$tmp/b" 2>&1 &
lp=$!
wait_for "$tmp/b" "OK allreduce" 2
pids=$(pids_of "$tmp/b")
kill -STOP $(sed -n 's/^\[rank 1\] .* pid \([0-9]*\)$/\1/p' "$tmp/b")
kill -KILL $lp
{ wait $lp; } 2>/dev/null
left=$(gone_within5 $pids) && ok "launcher SIGKILLed with a worker stopped: both gone within 5 s" ||
	bad "launcher SIGKILLed with a worker stopped: both gone within 5 s" "still running: $left"
kill -KILL $left 2>/dev/null

# The watcher's words, which a killed launcher cannot show: a worker whose
# liveness pipe is held by a stand-in launcher (a sleep on a FIFO) stops
# when that ends, naming why on stderr, with exit code 1.
mkfifo "$tmp/live"
sleep 60 >"$tmp/live" &
holder=$!
LOOM_LAUNCH_WORKER=1 LOOM_LAUNCH_LIVE_FD=7 LOOM_LAUNCH_PID=$holder "$W" sleep 7<"$tmp/live" >"$tmp/c" 2>&1 &
wp=$!
wait_for "$tmp/c" "OK allreduce" 1
kill $holder
{ wait $holder; } 2>/dev/null
left=$(gone_within5 $wp) || kill -KILL $wp
wait $wp
rc=$?
[ $rc -eq 1 ] && [ -z "$left" ] && check "a worker whose launcher is gone says why on stderr" "$(cat "$tmp/c")" \
	"^stopped: its launcher (pid $holder) is gone; stopping now, without saving$" 1 ||
	bad "a worker whose launcher is gone: exit code 1 within 5 s" "rc $rc, left '$left'" "$(cat "$tmp/c")"

# Under torchrun its agent starts the workers: a stand-in agent (a shell
# with the variables PyTorch 2.x's agent sets, world 1 so that no MPI
# starts) SIGKILLed, as the OOM killer may: its worker is gone within 5 s
# (its parent-death signal), not training on alone.
(
	export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 GROUP_RANK=0 GROUP_WORLD_SIZE=1 \
		MASTER_ADDR=127.0.0.1 MASTER_PORT=$((port + 1)) TORCHELASTIC_RESTART_COUNT=0 \
		TORCHELASTIC_MAX_RESTARTS=0 TORCHELASTIC_RUN_ID=none TORCHELASTIC_USE_AGENT_STORE=False
	exec bash -c '"$0" sleep & wait' "$W"
) >"$tmp/t" 2>&1 &
agent=$!
port=$((port + 1))
wait_for "$tmp/t" "OK allreduce" 1
pids=$(pids_of "$tmp/t")
kill -KILL $agent
{ wait $agent; } 2>/dev/null
left=$(gone_within5 $pids) && ok "torchrun's agent SIGKILLed: its worker is gone within 5 s" ||
	bad "torchrun's agent SIGKILLed: its worker is gone within 5 s" "still running: $left" "$(cat "$tmp/t")"
kill -KILL $left 2>/dev/null

# Under --nproc a worker's stderr reaches the launcher's stderr and its
# stdout the launcher's stdout, each line prefixed: with stdout thrown
# away, why a rank failed is still shown.
"$M" --nproc 2 --data "$tmp/none" --device cpu >"$tmp/o" 2>"$tmp/e"
check "launcher: a worker's error reaches the launcher's stderr, prefixed" "$(cat "$tmp/e")" \
	"^\[rank [01]\] mnist_ddp: mnist: directory '$tmp/none' does not exist" 2
check "launcher: ... and not its stdout" "$(cat "$tmp/o")" "does not exist" 0
out=$("$W" --nproc 2 allreduce 2>/dev/null)
check "launcher: a worker's stdout reaches the launcher's stdout, prefixed" "$out" \
	"^\[rank [01]\] rank [01]: OK allreduce world 2" 2

# mnist_ddp with a checkpoint saved every 2 steps (about 0.1 s here), its
# launcher SIGKILLed after the first save: the workers are gone within 5 s
# and the checkpoint is not written after the kill (its time is at most the
# kill's plus 0.25 s: a save renamed in place in the millisecond before the
# watcher ends the process; and it never changes again).
be32() { printf "\\x$(printf %02x $(($1 >> 24 & 255)))\\x$(printf %02x $(($1 >> 16 & 255)))\\x$(printf %02x $(($1 >> 8 & 255)))\\x$(printf %02x $(($1 & 255)))"; }
split() { # DIR SPLIT N: N blank 28x28 images, all labelled 1
	{ printf '\x00\x00\x08\x03'; be32 "$3"; be32 28; be32 28; head -c $(($3 * 784)) /dev/zero; } >"$1/$2-images-idx3-ubyte"
	{ printf '\x00\x00\x08\x01'; be32 "$3"; head -c "$3" /dev/zero | tr '\0' '\1'; } >"$1/$2-labels-idx1-ubyte"
}
mkdir -p "$tmp/data"
split "$tmp/data" train 512
split "$tmp/data" t10k 64
"$M" --data "$tmp/data" --device cpu --nproc 2 --epochs 500 --batch-size 16 --log-interval 1000 \
	--checkpoint "$tmp/ck" --save-every 2 >"$tmp/d" 2>&1 &
lp=$!
if wait_for "$tmp/d" "saved $tmp/ck" 1; then
	pids=$(pgrep -P $lp)
	t_kill=$(date +%s.%3N)
	kill -KILL $lp
	{ wait $lp; } 2>/dev/null
	left=$(gone_within5 $pids) && ok "mnist_ddp: launcher SIGKILLed mid-run: the workers are gone within 5 s" ||
		bad "mnist_ddp: launcher SIGKILLed mid-run: the workers are gone within 5 s" "still running: $left"
	kill -KILL $left 2>/dev/null
	sum=$(cksum <"$tmp/ck")
	t_ck=$(stat -c %.3Y "$tmp/ck")
	sleep 1
	awk -v k="$t_kill" -v c="$t_ck" 'BEGIN { exit !(c <= k + 0.25) }' && [ "$sum" = "$(cksum <"$tmp/ck")" ] &&
		ok "mnist_ddp: no checkpoint written after the kill" ||
		bad "mnist_ddp: no checkpoint written after the kill" "killed at $t_kill, checkpoint at $t_ck (then $(stat -c %.3Y "$tmp/ck"))"
	no_files "mnist_ddp: no progress file left by the orphaned workers" $pids
else
	kill -KILL $lp
	bad "mnist_ddp: the run saved no checkpoint" "$(cat "$tmp/d")"
fi

# mpirun SIGKILLed: Open MPI ends its ranks itself (they are its children;
# the ORTE/PMIx server goes with it). Their progress files stay (SIGKILL)
# until the next start-up on this host sweeps them (below).
"${MPIRUN[@]}" -np 2 "$W" sleep >"$tmp/e" 2>&1 &
mp=$!
wait_for "$tmp/e" "OK allreduce" 2
pids=$(pids_of "$tmp/e")
kill -KILL $mp
{ wait $mp; } 2>/dev/null
left=$(gone_within5 $pids) && ok "mpirun SIGKILLed: its 2 ranks are gone within 5 s" ||
	bad "mpirun SIGKILLed: its 2 ranks are gone within 5 s" "still running: $left"
kill -KILL $left 2>/dev/null
mpirun_pids=$pids

# Clean runs leave no progress file: the launcher, env://, mpirun.
out=$("$W" --nproc 2 allreduce 2>&1)
no_files "a clean --nproc run leaves no progress file" $(pids_of <(echo "$out"))
out=$(envrun 2 allreduce 2>&1)
no_files "a clean env:// run leaves no progress file" $(pids_of <(echo "$out"))
out=$("${MPIRUN[@]}" -np 2 "$W" allreduce 2>&1)
no_files "a clean mpirun run leaves no progress file" $(pids_of <(echo "$out"))
# A rank SIGKILLed: the survivors remove its file (they found its process
# gone) and their own at exit; under the launcher, the launcher too.
out=$(LOOM_TEST_VICTIM=1 envrun 3 die 2>&1)
no_files "env://: a killed rank's progress file and the survivors' are removed" \
	$(sed -n 's/^rank [0-9]: pid \([0-9]*\)$/\1/p' <<<"$out")
out=$(LOOM_TEST_VICTIM=1 "$W" --nproc 3 die 2>&1)
no_files "launcher: a killed rank's progress file and the survivors' are removed" \
	$(sed -n 's/^\[rank [0-9]\] rank [0-9]: pid \([0-9]*\)$/\1/p' <<<"$out")

# Stale files swept at start-up: the mpirun ranks killed above, and one
# made here for a pid that has ended; one for a live process (this
# script) and one of another host whose name starts like ours are kept.
dead=$(sh -c 'echo $$')
for f in "$host-$dead" "$host-$$" "${host}x-$dead"; do head -c 300 /dev/zero >"/dev/shm/loom-progress-$f"; done
out=$(envrun 2 allreduce 2>&1)
left=$(files $dead $mpirun_pids)
[ -z "$left" ] && ok "start-up sweeps the progress files of ended processes on this host" ||
	bad "start-up sweeps the progress files of ended processes on this host" "left: $left" "$out"
[ -e "/dev/shm/loom-progress-$host-$$" ] && [ -e "/dev/shm/loom-progress-${host}x-$dead" ] &&
	ok "start-up keeps a live process's file and another host's" || bad "start-up removed a file it must keep"
rm -f "/dev/shm/loom-progress-$host-$$" "/dev/shm/loom-progress-${host}x-$dead"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
