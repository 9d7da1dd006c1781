#!/usr/bin/env bash
# tests/examples/test_mnist_ddp_cli.sh — the example's command line: --help,
# every kind of bad flag, a missing, malformed, too small or unreadable data
# directory, an unusable checkpoint path, corrupted and out-of-range
# checkpoints on --resume. Each must exit non-zero (2 for flags) with a message
# naming the fault, and never crash. Also: every output path refused before
# step 1, an export failing at the end falling back, one job per checkpoint
# (its lock), and a resume in epoch 2 ending byte for byte where a run never
# stopped ends. Prints "N passed, N failed".
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
expect bad_precision 2 "precision must be fp16, bf16 or fp8, got .fp4." -- --precision fp4
expect bad_device 2 "device must be auto, cpu or cuda" -- --device tpu
expect bad_tf32 2 "--tf32 must be on or off, got 'maybe'" -- --tf32 maybe
expect bad_optimizer 2 "optimizer must be sgd or adamw" -- --optimizer lbfgs
expect bad_balance 2 "--pipeline-balance must be time or memory, got 'bogus'" -- --pipeline 2 --pipeline-balance bogus
expect balance_alone 2 "--pipeline-balance apply to --pipeline N" -- --pipeline-balance memory
expect bad_ksearch 2 "--kernel-search must be off or on, got 'fast'" -- --kernel-search fast
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

# --device cuda without a GPU: an error with the driver's own reason, never
# a crash or a silent CPU run (the probe maps no CUDA library for it).
if [ -e /dev/nvidiactl ]; then
	echo "SKIP cuda_absent: this machine has an NVIDIA device"
else
	expect cuda_absent 1 "--device cuda: no CUDA device is available: .*driver" -- --device cuda --max-steps 1
fi

# Hand-made MNIST directories: mkdata DIR NTRAIN NTEST [TEST_H TEST_W], all
# pixels 0 and all labels 1.
be32() { printf "\\x$(printf %02x $(($1 >> 24 & 255)))\\x$(printf %02x $(($1 >> 16 & 255)))\\x$(printf %02x $(($1 >> 8 & 255)))\\x$(printf %02x $(($1 & 255)))"; }
split() { # DIR SPLIT N H W
	{ printf '\x00\x00\x08\x03'; be32 "$3"; be32 "$4"; be32 "$5"; head -c $(($3 * $4 * $5)) /dev/zero; } >"$1/$2-images-idx3-ubyte"
	{ printf '\x00\x00\x08\x01'; be32 "$3"; head -c "$3" /dev/zero | tr '\0' '\1'; } >"$1/$2-labels-idx1-ubyte"
}
mkdata() {
	mkdir -p "$1"
	split "$1" train "$2" 28 28
	split "$1" t10k "$3" "${4:-28}" "${5:-28}"
}
mkdata "$tmp/small" 200 100
mkdata "$tmp/notrain" 0 100
mkdata "$tmp/notest" 200 0
mkdata "$tmp/test32" 200 100 32 32

# Fewer images than one batch: refused naming both sizes (was SIGFPE).
expect small_train 1 "--batch-size 500 is larger than the training set in $tmp/small (200 images)" -- \
	--data "$tmp/small" --batch-size 500 --device cpu
expect empty_train 1 "training set in $tmp/notrain is empty" -- --data "$tmp/notrain" --device cpu
expect absurd_batch 1 "--batch-size 1048576 is larger than the training set" -- \
	--data "$tmp/small" --batch-size 1048576 --device cpu
# An empty test set trains and says there is nothing to evaluate.
expect empty_test 0 "no test images to evaluate" -- --data "$tmp/notest" --epochs 1 --device cpu
if grep -q "test accuracy" <<<"$("$bin" --data "$tmp/notest" --epochs 1 --device cpu 2>&1)"; then
	fail=$((fail + 1))
	echo "FAIL empty_test_no_accuracy: an accuracy was reported for an empty test set"
else
	pass=$((pass + 1))
fi
# Test images of another size: the message names the test file, not train.
expect test_size 1 "$tmp/test32/t10k-images-idx3-ubyte: the test images are 32x32" -- \
	--data "$tmp/test32" --device cpu

# A checkpoint that cannot be written is refused before any work.
expect ckpt_missing_dir 1 "directory $tmp/nodir: does not exist" -- --data "$tmp/small" \
	--checkpoint "$tmp/nodir/ck.bin"
expect ckpt_is_dir 1 "is a directory" -- --data "$tmp/small" --checkpoint "$tmp"

# Every output path is tried before step 1, with the real reason: nothing
# trains (no progress line) when one cannot be written.
# refused NAME PATTERN -- ARGS...: exit 1, PATTERN said, no step taken.
refused() {
	local name=$1 pat=$2 out rc
	shift 3
	out=$("$bin" --data "$tmp/small" --device cpu --log-interval 1 "$@" 2>&1)
	rc=$?
	if [ "$rc" -eq 1 ] && grep -q -- "$pat" <<<"$out" && ! grep -q "^epoch 1 step" <<<"$out"; then
		pass=$((pass + 1))
	else
		fail=$((fail + 1))
		echo "FAIL $name: exit $rc (want 1, '$pat' and no step), output:"
		echo "$out" | head -5
	fi
}
refused export_root "--export /: is a directory, expected a file path" -- --export /
refused export_missing_dir "--export /nonexistent_dir/x.safetensors: directory /nonexistent_dir: does not exist" -- \
	--export /nonexistent_dir/x.safetensors
refused metrics_missing_dir "--metrics $tmp/nodir/m.jsonl: directory $tmp/nodir: does not exist" -- \
	--metrics "$tmp/nodir/m.jsonl"
refused trace_is_dir "--trace $tmp: is a directory" -- --trace "$tmp"
refused dump_plan_missing_dir "--dump-plan $tmp/nodir/p.dot: directory $tmp/nodir: does not exist" -- \
	--dump-plan "$tmp/nodir/p.dot"

# An export that fails at the end all the same (its temporary file's name
# taken by a folder): the weights go to a file beside it, or stay in the
# checkpoint, and the message says where.
mkdir -p "$tmp/out/w.safetensors.tmp"
out=$("$bin" --data "$tmp/small" --device cpu --max-steps 1 --export "$tmp/out/w.safetensors" 2>&1)
if grep -q "the trained weights went to $tmp/out/w.safetensors.fallback.safetensors instead" <<<"$out" &&
	[ -s "$tmp/out/w.safetensors.fallback.safetensors" ]; then
	pass=$((pass + 1))
else
	fail=$((fail + 1))
	echo "FAIL export_fallback: no weights in $tmp/out/w.safetensors.fallback.safetensors, output:"
	echo "$out" | tail -5
fi
expect export_fallback_ckpt 1 "the trained weights are in the checkpoint $tmp/fb.ckpt (saved at step 1)" -- \
	--data "$tmp/small" --device cpu --max-steps 1 --export "$tmp/out/w.safetensors" --checkpoint "$tmp/fb.ckpt"

# One job per checkpoint: a second job on the path of a running one is
# refused naming its host and pid; once that job is killed, its lock is
# taken over, and said.
"$bin" --data "$tmp/small" --device cpu --epochs 1000 --checkpoint "$tmp/held.ckpt" >/dev/null 2>&1 &
holder=$!
for _ in $(seq 1 300); do
	grep -q "pid $holder" "$tmp/held.ckpt.lock" 2>/dev/null && break
	sleep 0.1
done
grep -q "pid $holder" "$tmp/held.ckpt.lock" 2>/dev/null ||
	echo "(the first job wrote no lock $tmp/held.ckpt.lock within 30 s)"
expect ckpt_locked 1 "--checkpoint $tmp/held.ckpt is in use by another job (host $(hostname) pid $holder program mnist_ddp)" -- \
	--data "$tmp/small" --device cpu --max-steps 1 --checkpoint "$tmp/held.ckpt"
{ kill -9 "$holder"; wait "$holder"; } 2>/dev/null
expect ckpt_stale_lock 0 "took over the lock $tmp/held.ckpt.lock of a job that is gone (host $(hostname) pid $holder" -- \
	--data "$tmp/small" --device cpu --max-steps 1 --checkpoint "$tmp/held.ckpt" --resume
if [ -e "$tmp/held.ckpt.lock" ]; then
	fail=$((fail + 1))
	echo "FAIL ckpt_lock_removed: $tmp/held.ckpt.lock left after a clean exit"
else
	pass=$((pass + 1))
fi

# Resume in a later epoch: stopped at epoch 2, batch 3 (step 13 of 10 per
# epoch), resumed, it ends with the checkpoint of a run never stopped, byte
# for byte (random images and labels, so that the order matters, and an lr
# halved every epoch).
mkdir -p "$tmp/rand"
for s in train:200 t10k:40; do
	n=${s#*:}
	{ printf '\x00\x00\x08\x03'; be32 "$n"; be32 28; be32 28; head -c $((n * 784)) /dev/urandom; } \
		>"$tmp/rand/${s%:*}-images-idx3-ubyte"
	{ printf '\x00\x00\x08\x01'; be32 "$n"; for i in $(seq 1 "$n"); do printf "\\x0$((RANDOM % 10))"; done; } \
		>"$tmp/rand/${s%:*}-labels-idx1-ubyte"
done
rf=(--data "$tmp/rand" --device cpu --threads 1 --epochs 3 --batch-size 20 --lr 0.02 --lr-step 1
    --lr-gamma 0.5 --log-interval 100)
"$bin" "${rf[@]}" --checkpoint "$tmp/whole.ckpt" >/dev/null 2>&1
"$bin" "${rf[@]}" --checkpoint "$tmp/cut.ckpt" --max-steps 13 >/dev/null 2>&1
expect resume_epoch2 0 "resumed $tmp/cut.ckpt at step 13 (epoch 2, batch 3)" -- "${rf[@]}" \
	--checkpoint "$tmp/cut.ckpt" --resume
if [ -s "$tmp/whole.ckpt" ] && cmp -s "$tmp/whole.ckpt" "$tmp/cut.ckpt"; then
	pass=$((pass + 1))
else
	fail=$((fail + 1))
	echo "FAIL resume_epoch2_same: resumed at epoch 2, batch 3, the run ends elsewhere than one never stopped"
fi

# A checkpoint whose step is -5, sealed with a valid CRC: refused at load
# naming the field, and left as it was. The run-time scalars are the last
# record, 6 doubles just before the 4-byte CRC.
if "$bin" --data "$tmp/small" --device cpu --max-steps 1 --checkpoint "$tmp/neg.ckpt" >/dev/null 2>&1; then
	size=$(stat -c %s "$tmp/neg.ckpt")
	{
		head -c $((size - 52)) "$tmp/neg.ckpt"
		printf '\x00\x00\x00\x00\x00\x00\x14\xc0' # -5.0, little-endian
		tail -c 44 "$tmp/neg.ckpt" | head -c 40
	} >"$tmp/neg.body"
	# gzip's trailer holds the CRC-32 of its input, little-endian, as ours.
	{ cat "$tmp/neg.body"; gzip -c <"$tmp/neg.body" | tail -c 8 | head -c 4; } >"$tmp/neg.ckpt"
	cp "$tmp/neg.ckpt" "$tmp/neg.orig"
	expect negative_step 1 "field 'step' is -5" -- --data "$tmp/small" --device cpu \
		--checkpoint "$tmp/neg.ckpt" --resume
	if cmp -s "$tmp/neg.ckpt" "$tmp/neg.orig"; then
		pass=$((pass + 1))
	else
		fail=$((fail + 1))
		echo "FAIL negative_step_kept: the refused checkpoint was changed"
	fi
else
	fail=$((fail + 1))
	echo "FAIL negative_step: could not train one step on $tmp/small"
fi

# A data directory that may not be searched: permission denied, not missing
# files. Root passes every permission check, so as root run as nobody.
locked=$(mktemp -d /tmp/loom-cli-locked.XXXXXX)
mkdata "$locked/d" 200 100
chmod 755 "$locked"
run_as=()
if [ "$(id -u)" -eq 0 ]; then
	chown -R 65534:65534 "$locked/d"
	command -v setpriv >/dev/null && run_as=(setpriv --reuid=65534 --regid=65534 --clear-groups)
fi
if [ "$(id -u)" -ne 0 ] || [ "${#run_as[@]}" -gt 0 ]; then
	chmod 600 "$locked/d"
	out=$("${run_as[@]}" "$bin" --data "$locked/d" --device cpu 2>&1)
	rc=$?
	if [ "$rc" -eq 1 ] && grep -q "Permission denied" <<<"$out" && ! grep -q "neither" <<<"$out"; then
		pass=$((pass + 1))
	else
		fail=$((fail + 1))
		echo "FAIL eacces: exit $rc, output:"
		echo "$out" | head -5
	fi
else
	echo "SKIP eacces: running as root without setpriv"
fi
chmod -R u+rwx "$locked"
rm -rf "$locked"

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
