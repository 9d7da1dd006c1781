#!/usr/bin/env bash
# tests/engine/cuda/test_gpu_ddp_shared.sh — the verdict of the GPU suite's
# world-2-on-one-GPU row (gpu_ddp_shared.sh) on a stand-in mnist_ddp that
# prints the lines the real one does: OK within the relative 1e-3, WRONG
# past it, WRONG when the two ranks did not stage their collectives, ERROR
# when a run fails. Prints "N passed, N failed".
set -u
S=$1
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
pass=0
fail=0

# fake LOSS1 LOSS2 STAGED RC2: world 1 says LOSS1; --nproc 2 says LOSS2,
# the group's staging line when STAGED is 1, and exits RC2.
fake() {
	cat >"$t/mnist_ddp" <<EOF
#!/usr/bin/env bash
case " \$* " in
*" --nproc 2 "*)
	[ $3 = 1 ] && echo "[rank 0] loom: ranks 0 and 1 share GPU 0 of their host (2 local ranks, 1 visible device): NCCL takes one rank per GPU, so the collectives are staged through host memory (MPI)" >&2
	echo "[rank 0] epoch 1 done: test loss $2, test accuracy 80.00%, train 1.0 s"
	exit $4 ;;
*)
	echo "epoch 1 done: test loss $1, test accuracy 80.00%, train 1.0 s" ;;
esac
EOF
	chmod +x "$t/mnist_ddp"
}

# want NAME PATTERN RC
want() {
	local out rc
	out=$(bash "$S" "$t" --data /nonexistent 2>&1)
	rc=$?
	if grep -q -- "$2" <<<"$out" && [ $rc -eq "$3" ]; then
		pass=$((pass + 1))
		echo "ok   $1"
	else
		fail=$((fail + 1))
		echo "FAIL $1: rc $rc, want $3 and a line with '$2':"
		echo "$out"
	fi
}

fake 0.512345 0.512400 1 0
want "within a relative 1e-3: OK" "^\[world 2\] OK test loss 0.512400, world 1 0.512345" 0
fake 0.512345 0.530000 1 0
want "past a relative 1e-3: WRONG" "^\[world 2\] WRONG test loss 0.530000" 1
fake 0.512345 0.512345 0 0
want "not staged through host memory: WRONG" "^WRONG: the world-2 run on one GPU did not stage" 1
fake 0.512345 0.512345 1 3
want "a failed run: ERROR" "^ERROR: world 1 rc 0 test loss '0.512345', world 2 rc 3" 1
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
