#!/usr/bin/env bash
# tools/torchrun_check.sh — runs a loom example under the REAL torchrun (from
# the PyTorch venv bench/setup_torch.sh makes, outside the repo) in the ways
# people start it, and prints one verdict per mode:
#   default      torchrun --nproc-per-node 2 --master-port P
#   standalone   torchrun --standalone --nproc-per-node 2
#   c10d         torchrun --rdzv-backend c10d --rdzv-endpoint localhost:P --nnodes 1
#   restart      --max-restarts 1, rank 1 killed (SIGKILL) at step 12 of the
#                first attempt; the restart resumes from the checkpoint
#   failure      a run that fails: torchrun's report carries loom's message
#                (TORCHELASTIC_ERROR_FILE), not "error_file: <N/A>"
#   two_nodes    torchrun --nnodes 2 --rdzv-backend c10d on two "hosts": two
#                network namespaces joined by a veth, each its own host name
#                and /etc/hosts (needs root for ip netns; skipped otherwise)
# Each training mode must end as loom's own `--nproc 2` does (the same test
# loss, to the printed digit). Not part of the test suite (it needs torch);
# tests/comm:test_launchers checks the same protocol against a stand-in.
#   tools/torchrun_check.sh [PROGRAM]   (default bazel-bin/examples/mnist_ddp)
# TORCH_VENV: the venv (default /work/venv-torch). Exits non-zero if a mode fails.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
BIN=$(realpath "${1:-bazel-bin/examples/mnist_ddp}")
VENV=${TORCH_VENV:-/work/venv-torch}
TR=$VENV/bin/torchrun
[ -x "$TR" ] || { echo "torchrun_check: no $TR (run bench/setup_torch.sh)"; exit 2; }
[ -x "$BIN" ] || { echo "torchrun_check: no $BIN (bazel build //examples:mnist_ddp)"; exit 2; }
# bazel-bin follows the last build's configuration: an ASan build ends every
# rank with Open MPI's exit-time leaks (exit 1) and other rounding.
ldd "$BIN" 2>/dev/null | grep -q libasan &&
	{ echo "torchrun_check: $BIN is an ASan build: bazel build //examples:mnist_ddp (no --config) first"; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
FLAGS=(--epochs 1 --max-steps 20 --threads 1 --batch-size 100)
free_port() { "$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'; }
loss_of() { sed -n 's/.*epoch 1 done: test loss \([0-9.]*\),.*/\1/p' <<<"$1" | head -n 1; }
pass=0 fail=0 failed=()
verdict() { # MODE OK? TEXT
	if [ "$2" = 1 ]; then pass=$((pass + 1)); echo "torchrun_check: $1: PASS ($3)"; else
		fail=$((fail + 1)); failed+=("$1"); echo "torchrun_check: $1: FAIL ($3)"; fi
}

echo "torchrun_check: $("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'), $BIN ${FLAGS[*]}"
ref=$("$BIN" --nproc 2 "${FLAGS[@]}" 2>&1)
want=$(loss_of "$ref")
[ -n "$want" ] || { echo "torchrun_check: loom's own --nproc 2 did not train:"; tail -5 <<<"$ref"; exit 1; }
echo "torchrun_check: loom --nproc 2: test loss $want (the figure every mode must reach)"

run_mode() { # MODE TORCHRUN-ARGS... -- PROGRAM-ARGS...
	local mode=$1 out rc got
	shift
	local targs=()
	while [ "$1" != -- ]; do targs+=("$1"); shift; done
	shift
	out=$(cd "$tmp" && timeout 300 "$TR" "${targs[@]}" --no-python "$BIN" "${FLAGS[@]}" "$@" 2>&1)
	rc=$?
	echo "$out" >"$tmp/$mode.log"
	got=$(loss_of "$out")
	if [ $rc -ne 0 ]; then
		verdict "$mode" 0 "torchrun exited $rc: $(grep -m1 -E 'error|Error' <<<"$out")"
	elif [ "$got" != "$want" ]; then
		verdict "$mode" 0 "test loss '$got', --nproc 2 had $want"
	elif [ "$mode" = restart ] && ! grep -q "restart 1: resuming from" <<<"$out"; then
		verdict "$mode" 0 "no worker resumed from the checkpoint"
	else
		local extra=""
		[ "$mode" = restart ] && extra=", a worker killed, $(grep -c 'restart 1: resuming from' <<<"$out") resumed"
		verdict "$mode" 1 "exit 0, $(grep -o 'data parallel: 2 ranks ([^)]*)' <<<"$out" | head -n 1), test loss $got = --nproc 2's$extra"
	fi
}

run_mode default --nproc-per-node 2 --master-port "$(free_port)" --
run_mode standalone --standalone --nproc-per-node 2 --
run_mode c10d --rdzv-backend c10d --rdzv-endpoint "localhost:$(free_port)" --nnodes 1 --nproc-per-node 2 --
LOOM_TEST_KILL_AT_STEP=12 run_mode restart --nproc-per-node 2 --master-port "$(free_port)" --max-restarts 1 -- \
	--checkpoint "$tmp/run.ckpt" --save-every 5
export -n LOOM_TEST_KILL_AT_STEP

# A failing run: torchrun's report must carry loom's own line.
out=$(cd "$tmp" && timeout 300 "$TR" --nproc-per-node 2 --master-port "$(free_port)" --no-python "$BIN" \
	"${FLAGS[@]}" --data "$tmp/no-such-dir" 2>&1)
rc=$?
echo "$out" >"$tmp/failure.log"
if [ $rc -ne 0 ] && grep -q "error_file: <N/A>" <<<"$out"; then
	verdict failure 0 "torchrun exited $rc but shows error_file: <N/A>"
elif [ $rc -ne 0 ] && grep -q "traceback *: .*no-such-dir" <<<"$out"; then
	verdict failure 1 "torchrun exited $rc; its report: $(grep -m1 'traceback *: ' <<<"$out" | sed 's/^ *//')"
else
	verdict failure 0 "torchrun exited $rc; no report line naming the missing --data"
fi
# Two nodes of one rank each, as two hosts: network namespaces joined by a
# veth (10.198.0.1 and .2), each with its own host name and /etc/hosts
# (torch resolves the machine's name), the c10d rendezvous on node a.
ns=trc$$
if ip netns add ${ns}a 2>/dev/null && ip netns add ${ns}b && ip link add ${ns}x type veth peer name ${ns}y &&
	ip link set ${ns}x netns ${ns}a && ip link set ${ns}y netns ${ns}b &&
	ip -n ${ns}a addr add 10.198.0.1/24 dev ${ns}x && ip -n ${ns}b addr add 10.198.0.2/24 dev ${ns}y &&
	ip -n ${ns}a link set ${ns}x up && ip -n ${ns}b link set ${ns}y up &&
	ip -n ${ns}a link set lo up && ip -n ${ns}b link set lo up; then
	printf '127.0.0.1 localhost\n10.198.0.1 hosta\n10.198.0.2 hostb\n' >"$tmp/hosts"
	pids=()
	for n in a b; do
		ip netns exec ${ns}$n unshare --uts --mount sh -c 'mount --bind "$0" /etc/hosts && hostname "$1" && shift && cd /tmp && exec "$@"' \
			"$tmp/hosts" host$n timeout 300 "$TR" --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d \
			--rdzv-endpoint 10.198.0.1:29455 --rdzv-id loomcheck --no-python "$BIN" "${FLAGS[@]}" \
			>"$tmp/two_nodes_$n.log" 2>&1 &
		pids+=($!)
	done
	rcs=""
	for p in "${pids[@]}"; do
		wait "$p"
		rcs="$rcs $?"
	done
	ip netns del ${ns}a
	ip netns del ${ns}b
	out=$(cat "$tmp/two_nodes_a.log" "$tmp/two_nodes_b.log")
	cp "$tmp/two_nodes_a.log" "$tmp/two_nodes.log"
	got=$(loss_of "$out")
	if [ "$rcs" != " 0 0" ]; then
		verdict two_nodes 0 "the two torchruns exited$rcs"
	elif [ "$got" = "$want" ] && grep -q "data parallel: 2 ranks" <<<"$out"; then
		verdict two_nodes 1 "both torchruns exit 0, hosta and hostb, 2 ranks (env://), test loss $got = --nproc 2's"
	else
		verdict two_nodes 0 "test loss '$got', --nproc 2 had $want"
	fi
else
	ip netns del ${ns}a 2>/dev/null
	ip netns del ${ns}b 2>/dev/null
	echo "torchrun_check: two_nodes: skipped (ip netns needs root)"
fi

for m in "${failed[@]}"; do
	echo "torchrun_check: the end of $m's log:"
	tail -n 15 "$tmp/$m.log"
done
echo "torchrun_check: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
