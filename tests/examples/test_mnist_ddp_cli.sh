#!/usr/bin/env bash
# tests/examples/test_mnist_ddp_cli.sh — the example's command line: --help,
# every kind of bad flag, a missing or malformed data directory, a corrupted
# checkpoint on --resume. Each must exit non-zero (2 for flags) with a message
# naming the fault, and never crash. Prints "N passed, N failed".
set -u
bin=$1
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/cli.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0

# expect NAME WANT_RC PATTERN -- ARGS...
expect() {
	local name=$1 want=$2 pat=$3
	shift 4
	local out rc
	out=$("$bin" "$@" 2>&1)
	rc=$?
	if [ "$rc" -eq "$want" ] && grep -q -- "$pat" <<<"$out"; then
		pass=$((pass + 1))
	else
		fail=$((fail + 1))
		echo "FAIL $name: exit $rc (want $want), output:"
		echo "$out" | head -5
	fi
}

expect help 0 "usage: mnist_ddp" -- --help
expect bad_level 2 "opt-level must be O0, O1, O2 or O3, got 'O7'" -- --opt-level O7
expect bad_lr 2 "--lr expects a number, got 'fast'" -- --lr fast
expect bad_epochs 2 "--epochs expects an integer" -- --epochs 0
expect bad_precision 2 "precision must be fp16 or bf16" -- --precision fp8
expect bad_device 2 "device must be auto, cpu or cuda" -- --device tpu
expect bad_optimizer 2 "optimizer must be sgd or adamw" -- --optimizer lbfgs
expect unknown_flag 2 "unknown or incomplete option '--frobnicate'" -- --frobnicate
expect missing_arg 2 "unknown or incomplete option" -- --lr
expect stray_arg 2 "unexpected argument 'extra'" -- extra
expect resume_no_ckpt 2 "need --checkpoint PATH" -- --resume
expect missing_dir 1 "dataset-fashion-mnist" -- --data "$tmp/none"

# A malformed data file: a truncated training image file.
mkdir -p "$tmp/bad"
printf '\x00\x00\x08\x03\x00\x00\x00\x02\x00\x00\x00\x1c\x00\x00\x00\x1c\x01\x02' >"$tmp/bad/train-images-idx3-ubyte"
printf '\x00\x00\x08\x01\x00\x00\x00\x02\x01\x02' >"$tmp/bad/train-labels-idx1-ubyte"
expect truncated_data 1 "train-images-idx3-ubyte" -- --data "$tmp/bad"

# A corrupted checkpoint is refused on --resume and left in place.
data=/usr/share/datasets/fashion-mnist
if [ -d "$data" ]; then
	# An override apex refuses: the compile step names it.
	expect o1_keep_bn 1 "keep_batchnorm_fp32 applies to O2 and O3" -- --opt-level O1 \
		--keep-batchnorm-fp32 true
	head -c 4096 /dev/urandom >"$tmp/ck.bin"
	cp "$tmp/ck.bin" "$tmp/ck.orig"
	expect corrupt_ckpt 1 "ck.bin" -- --checkpoint "$tmp/ck.bin" --resume --max-steps 1
	if cmp -s "$tmp/ck.bin" "$tmp/ck.orig"; then
		pass=$((pass + 1))
	else
		fail=$((fail + 1))
		echo "FAIL corrupt_ckpt_kept: the refused checkpoint was changed"
	fi
else
	echo "SKIP o1_keep_bn, corrupt_ckpt: need the Debian package dataset-fashion-mnist"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
