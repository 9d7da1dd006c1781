#!/usr/bin/env bash
# tests/examples/test_common_flags.sh — every example on examples/train.c's
# driver, each common flag run on each and its effect checked, from one
# table: --metrics (a step row per progress line, an epoch row), --export
# then --init-from (the imported weights are the ones trained: the first
# loss equals the one computed from the file), --reinit, --init-strict,
# --checkpoint with --save-every then --resume (the resumed run ends on the
# straight run's loss, bit for bit), --nproc 2 with --max-restarts 1 and a
# rank killed (the restart finishes the run), --trace (a Chrome trace
# written), --memory-report. Tiny models and data, so that the whole table
# stays within about a minute. Prints "N passed, N failed".
#
# Usage: test_common_flags.sh MNIST_DDP CIFAR_DDP RESNET50_SYNTHETIC GPT_DDP
set -u
declare -A bin=([mnist_ddp]=$1 [cifar_ddp]=$2 [resnet50_synthetic]=$3 [gpt_ddp]=$4)
source "$(dirname "${BASH_SOURCE[0]}")/../lib/mp_harness.sh"
export LOOM_COMM_TIMEOUT_S=120 OMP_NUM_THREADS=1
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/flags.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# An MNIST-format folder of 8 training and 8 test images (a batch: every
# step sees the whole set, in another order).
idx() { # FILE MAGIC COUNT [ROWS COLS] then COUNT*ROWS*COLS bytes
	local f=$1 magic=$2 n=$3 elems=1
	{
		printf "\\x00\\x00\\x08\\x$magic\\x00\\x00\\x00\\x$(printf %02x "$n")"
		if [ -n "$4" ]; then
			printf "\\x00\\x00\\x00\\x1c\\x00\\x00\\x00\\x1c"
			elems=784
		fi
		LC_ALL=C awk -v n=$((n * elems)) -v lab=$((elems == 1)) -v s="$5" \
			'BEGIN { x = s; for (i = 0; i < n; i++) { x = (x * 1103515245 + 12345) % 2147483648;
			  printf "%c", lab ? 1 + i % 9 : 1 + int(x / 65536) % 255 } }'
	} >"$f"
}
mkdir -p "$tmp/mnist"
idx "$tmp/mnist/train-images-idx3-ubyte" 03 8 28 1
idx "$tmp/mnist/train-labels-idx1-ubyte" 01 8 "" 2
idx "$tmp/mnist/t10k-images-idx3-ubyte" 03 8 28 3
idx "$tmp/mnist/t10k-labels-idx1-ubyte" 01 8 "" 4
for i in $(seq 1 200); do
	echo "the cat sat on the mat. the dog sat on the log. $((i % 7)) cats, $((i % 5)) dogs."
done >"$tmp/text.txt"

# The table: each program's tiny run; its progress line; how the import is
# checked ("next": the first loss from a 1-step run's export equals a 2-step
# run's second loss, the data of every step the same set; "seed": at lr 0
# under --sequential, a run of another seed from the file has the file's
# first loss); a tensor for --reinit; a file of another model for
# --init-strict; whether it takes the checkpoint flags.
common=(--device cpu --threads 1)
declare -A run=(
	[mnist_ddp]="--data $tmp/mnist --batch-size 8 --epochs 4 --log-interval 1"
	[cifar_ddp]="--synthetic --train-images 8 --test-images 8 --depth 18 --width 4 --batch-size 8
		     --epochs 4 --log-interval 1 --no-augment"
	[resnet50_synthetic]="--depth 18 --width 4 --size 32 --batch-size 2 --warmup 0"
	[gpt_ddp]="--data $tmp/text.txt --layers 1 --heads 2 --embd 16 --context 16 --batch-size 4
		   --sample 0 --val-interval 0 --peak-flops 1e9 --log-interval 1 --sequential"
)
declare -A steps=([mnist_ddp]="--max-steps" [cifar_ddp]="--max-steps" [resnet50_synthetic]="--steps"
		  [gpt_ddp]="--max-steps")
declare -A line=([mnist_ddp]='^epoch [0-9] step ' [cifar_ddp]='^epoch [0-9] step '
		 [resnet50_synthetic]='^step .* img/s on rank 0' [gpt_ddp]='^step .* tok/s')
declare -A import=([mnist_ddp]=next [cifar_ddp]=next [resnet50_synthetic]=next [gpt_ddp]=seed)
declare -A reinit=([mnist_ddp]=fc [cifar_ddp]=fc [resnet50_synthetic]=fc [gpt_ddp]=transformer.ln_f)
declare -A other=([mnist_ddp]=gpt_ddp [cifar_ddp]=gpt_ddp [resnet50_synthetic]=gpt_ddp
		  [gpt_ddp]=mnist_ddp)
declare -A ckpt=([mnist_ddp]=1 [cifar_ddp]=1 [resnet50_synthetic]=0 [gpt_ddp]=1)

# go PROG OUT ARGS...: runs PROG's tiny run with ARGS, output to OUT.
go() {
	local p=$1 out=$2
	shift 2
	# shellcheck disable=SC2086
	"${bin[$p]}" ${run[$p]} "${common[@]}" "$@" >"$out" 2>&1
}
# loss FILE N: the N-th step row's loss in a --metrics log.
loss() { grep '"type":"step"' "$1" 2>/dev/null | sed -n "$2p" | sed 's/.*"loss":\([^,]*\),.*/\1/'; }
same() { awk -v a="$1" -v b="$2" -v r="$3" 'BEGIN { d = a - b; if (d < 0) d = -d;
	exit !(a != "" && b != "" && d <= r * (a < 0 ? -a : a)) }'; }

# Another model's file for --init-strict (no name in common).
for p in gpt_ddp mnist_ddp; do
	go "$p" "$tmp/$p.out" ${steps[$p]} 1 --export "$tmp/$p.st" || bad "$p writes a file for the others" "$(cat "$tmp/$p.out")"
done

# Under a sanitizer (bazel test --config=asan; 188 s for the whole table at
# load 11) the image task and the GPT's: mnist_ddp and gpt_ddp, every flag;
# LOOM_TEST_FULL=1 runs all four.
progs=(mnist_ddp cifar_ddp resnet50_synthetic gpt_ddp)
[ -n "${ASAN_OPTIONS:-}" ] && [ -z "${LOOM_TEST_FULL:-}" ] && progs=(mnist_ddp gpt_ddp)
for p in "${progs[@]}"; do
	d=$tmp/$p
	mkdir -p "$d"
	s=${steps[$p]}
	# --metrics: one step row per progress line, an epoch row; --export.
	if [ "${import[$p]}" = seed ]; then
		go "$p" "$d/a.out" $s 2 --lr 0 --seed 1 --export "$d/a.st" --metrics "$d/a.jsonl"
	else
		go "$p" "$d/a.out" $s 1 --seed 1 --export "$d/a.st" --metrics "$d/a.jsonl"
	fi
	n=$(grep -c -- "${line[$p]}" "$d/a.out")
	rows=$(grep -c '"type":"step"' "$d/a.jsonl" 2>/dev/null)
	epochs=$(grep -c '"type":"epoch"' "$d/a.jsonl" 2>/dev/null)
	if [ "$n" -ge 1 ] && [ "$rows" = "$n" ] && [ "$epochs" -ge 1 ]; then
		ok "$p --metrics: $rows step rows for $n progress lines, $epochs epoch row(s)"
	else
		bad "$p --metrics" "$n progress lines, ${rows:-no} step rows, ${epochs:-no} epoch rows" "$(cat "$d/a.out")"
	fi
	[ -s "$d/a.st" ] && grep -q "^exported the weights to $d/a.st" "$d/a.out" &&
		ok "$p --export writes the file" || bad "$p --export" "$(cat "$d/a.out")"

	# `bazel run` semantics: the program starts elsewhere (its runfiles)
	# with the user's directory in BUILD_WORKING_DIRECTORY; relative output
	# paths land where the user is.
	mkdir -p "$d/user" "$d/runfiles"
	exe=$(realpath "${bin[$p]}")
	(cd "$d/runfiles" && export BUILD_WORKING_DIRECTORY="$d/user" && bin[$p]=$exe &&
		go "$p" "$d/w.out" $s 1 --export w.st --metrics w.jsonl)
	[ -s "$d/user/w.st" ] && [ -s "$d/user/w.jsonl" ] && [ ! -e "$d/runfiles/w.st" ] &&
		ok "$p under bazel run: relative --export and --metrics land in BUILD_WORKING_DIRECTORY" ||
		bad "$p under bazel run" "$(ls "$d/user" "$d/runfiles")" "$(cat "$d/w.out")"

	# --init-from: the file's weights are the ones trained.
	if [ "${import[$p]}" = seed ]; then
		go "$p" "$d/b.out" $s 1 --lr 0 --seed 2 --init-from "$d/a.st" --metrics "$d/b.jsonl"
		want=$(loss "$d/a.jsonl" 1) got=$(loss "$d/b.jsonl" 1) r=0
		how="another seed's run from the file has the file's first loss"
	else
		go "$p" "$d/c.out" $s 2 --seed 1 --metrics "$d/c.jsonl"
		go "$p" "$d/b.out" $s 1 --seed 1 --init-from "$d/a.st" --metrics "$d/b.jsonl"
		want=$(loss "$d/c.jsonl" 2) got=$(loss "$d/b.jsonl" 1) r=1e-5
		how="the first loss from a 1-step export equals a 2-step run's second"
	fi
	if grep -q "^initialised from $d/a.st" "$d/b.out" && same "$want" "$got" $r &&
		[ "$want" != "$(loss "$d/c.jsonl" 1)" ]; then
		ok "$p --init-from: $how ($got)"
	else
		bad "$p --init-from" "want loss '$want', got '$got'" "$(cat "$d/b.out")"
	fi
	go "$p" "$d/r.out" $s 1 --init-from "$d/a.st" --reinit "${reinit[$p]}"
	check "$p --reinit ${reinit[$p]}" "$(cat "$d/r.out")" "tensors, [0-9]* left as initialised (--reinit" 1

	# --init-strict: another model's file is refused naming the flag, and
	# loaded for the names both have without it (none here).
	o=$tmp/${other[$p]}.st
	go "$p" "$d/s.out" $s 1 --init-from "$o"
	rc=$?
	[ "$rc" = 1 ] && grep -q -- "(strict;.*(--init-strict false" "$d/s.out" &&
		ok "$p --init-from another model's file: refused, naming --init-strict false" ||
		bad "$p strict import" "exit $rc" "$(cat "$d/s.out")"
	go "$p" "$d/s.out" $s 1 --init-from "$o" --init-strict false
	rc=$?
	[ "$rc" = 0 ] && grep -q "^initialised from $o: 0 tensors, [0-9]* not in the file" "$d/s.out" &&
		ok "$p --init-strict false: loads what both have, counts the rest" ||
		bad "$p --init-strict false" "exit $rc" "$(cat "$d/s.out")"

	# --trace and --memory-report on a 4-step run (the straight run below).
	go "$p" "$d/t.out" $s 4 --trace "$d/trace.json" --trace-steps 2 --memory-report --metrics "$d/t.jsonl"
	grep -q traceEvents "$d/trace.json" 2>/dev/null && grep -q "^trace: 2 steps" "$d/t.out" &&
		ok "$p --trace: 2 steps written" || bad "$p --trace" "$(cat "$d/t.out")"
	check "$p --memory-report" "$(cat "$d/t.out")" "^memory of the compiled plan" 1

	# --checkpoint, --save-every, --resume: 2 steps saved, then resumed to
	# 4 ends on the straight run's loss.
	if [ "${ckpt[$p]}" = 1 ]; then
		go "$p" "$d/k1.out" $s 2 --checkpoint "$d/ck" --save-every 1
		saves=$(grep -c "^saved $d/ck" "$d/k1.out")
		[ -s "$d/ck" ] && [ -s "$d/ck.cursor" ] && [ "$saves" -ge 2 ] &&
			ok "$p --checkpoint --save-every 1: $saves saves" || bad "$p --checkpoint" "$(cat "$d/k1.out")"
		go "$p" "$d/k2.out" $s 4 --checkpoint "$d/ck" --resume --metrics "$d/k2.jsonl"
		want=$(loss "$d/t.jsonl" 4) got=$(loss "$d/k2.jsonl" 2)
		grep -q "^resumed $d/ck at step 2" "$d/k2.out" && [ -n "$want" ] && [ "$want" = "$got" ] &&
			ok "$p --resume at step 2 ends on the straight run's loss ($got)" ||
			bad "$p --resume" "straight: '$want', resumed: '$got'" "$(cat "$d/k2.out")"
		ck=(--checkpoint "$d/ck2")
	else
		go "$p" "$d/k1.out" $s 1 --checkpoint "$d/ck"
		rc=$?
		[ "$rc" = 2 ] && grep -q "unknown or incomplete option '--checkpoint'" "$d/k1.out" &&
			ok "$p: --checkpoint is not its flag (refused, exit 2)" || bad "$p --checkpoint" "exit $rc" "$(cat "$d/k1.out")"
		ck=()
	fi

	# --nproc 2 --max-restarts 1, rank 1 killed at its second step: the
	# launcher restarts both and the run ends.
	LOOM_TEST_KILL_AT_STEP=1 go "$p" "$d/n.out" $s 3 --batch-size 4 --nproc 2 --max-restarts 1 "${ck[@]}"
	rc=$?
	[ "$rc" = 0 ] && grep -q "restarting all 2 workers (restart 1 of 1)" "$d/n.out" &&
		grep -q "data parallel: 2 ranks" "$d/n.out" &&
		ok "$p --nproc 2 --max-restarts 1: a killed rank restarted, the run ends" ||
		bad "$p --nproc --max-restarts" "exit $rc" "$(tail -20 "$d/n.out")"
done

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
