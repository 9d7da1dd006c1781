#!/usr/bin/env bash
# tests/examples/test_cifar_ddp.sh — examples/cifar_ddp and resnet50_synthetic
# on small CIFAR-10 files in the real format that cifar_fixture writes: flags
# and --help, the missing directory and missing file messages, a few steps,
# loss falling and accuracy rising on an easy task, resume mid-epoch, the
# cosine warm-up, --dump-plan through dot, the ResNet-34 batch-128 memory
# report (planned activations at most half the naive sum), 2 ranks under
# mpirun and --nproc. Narrow ResNets (--width 8) keep it to a minute or two.
# Prints "N passed, N failed".
set -u
EX=$1 FIX=$2 R50=$3
source "$(dirname "${BASH_SOURCE[0]}")/../lib/mp_harness.sh"
# Evaluation and compile take seconds on a loaded machine: not a dead rank.
export LOOM_COMM_TIMEOUT_S=120 OMP_NUM_THREADS=1
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -x LOOM_COMM_TIMEOUT_S -x OMP_NUM_THREADS)
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/cifar.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
small=(--width 8 --device cpu)


mkdir -p "$tmp/d" "$tmp/missing"
"$FIX" "$tmp/d" 240 100 || { bad "cifar_fixture wrote the data"; echo "$pass passed, $fail failed"; exit 1; }
cp "$tmp"/d/*.bin "$tmp/missing/"
rm "$tmp/missing/data_batch_3.bin"

expect "--help" 0 "usage: cifar_ddp" -- --help
expect "--help lists --synthetic" 0 "--synthetic" -- --help
expect "--depth 50 refused" 2 "--depth must be 18 or 34, got '50'" -- --depth 50
expect "bad --lr-schedule" 2 "lr-schedule must be step or cosine" -- --lr-schedule linear
expect "--warmup-epochs needs cosine" 2 "warmup-epochs applies to --lr-schedule cosine" -- --warmup-epochs 1
expect "missing dir: names the files" 1 "data_batch_1.bin, data_batch_2.bin, data_batch_3.bin, data_batch_4.bin, data_batch_5.bin and test_batch.bin" -- --data "$tmp/none"
expect "missing dir: names the URL" 1 "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz" -- --data "$tmp/none"
expect "missing file: names it" 1 "missing batch file $tmp/missing/data_batch_3.bin" -- --data "$tmp/missing"
expect "too few images for a batch" 1 "needs 500 training images" -- --data "$tmp/d" --batch-size 500 "${small[@]}"

# A few steps, then the run's speed.
out=$("$EX" --data "$tmp/d" "${small[@]}" --batch-size 10 --max-steps 3 --log-interval 1 2>&1)
check "3 steps: a progress line each" "$out" "^epoch 1 step .* loss [0-9.]*  acc .* img/s  ETA .* batch 10  lr 0.1  loss scale 1" 3
check "3 steps: the test accuracy after them" "$out" "^epoch 1 done: test loss [0-9.]*, test accuracy" 1
check "3 steps: the speed at the end" "$out" "^trained 3 steps: [0-9.]* img/s" 1

# An easy task: three epochs, one progress line each (rank 0's training
# loss and accuracy over the epoch): the loss falls, the accuracy rises.
# The training figures, not the test ones: after a few dozen steps the batch
# norms' running statistics lag the weights, and eval-mode accuracy swings
# from epoch to epoch (PyTorch's same model on these files: 18, 100, 44, 77%).
# lr 0.01, not 0.05: at 0.05 the 36 steps are chaotic enough that the ASan
# build's different rounding (its own code generation, the same arithmetic
# up to the last bits at step 4) ended with the loss 13% down instead of
# 37%; at 0.01 both builds end about 45% down and 25 points up (2026-11-26).
easy_task() {
	local name=$1 out first last
	shift
	out=$("$EX" --data "$tmp/d" "${small[@]}" --batch-size 20 --epochs 3 --lr 0.01 \
		--log-interval 12 "$@" 2>&1)
	first=$(grep "^epoch 1 step" <<<"$out" | sed -n 's/.* loss \([0-9.]*\)  acc *\([0-9.]*\)%.*/\1 \2/p')
	last=$(grep "^epoch 3 step" <<<"$out" | sed -n 's/.* loss \([0-9.]*\)  acc *\([0-9.]*\)%.*/\1 \2/p')
	if [ -n "$first" ] && [ -n "$last" ] && awk -v f="$first" -v l="$last" 'BEGIN {
		split(f, a, " "); split(l, b, " "); exit !(b[1] < 0.85 * a[1] && b[2] > a[2] + 5) }'; then
		ok "$name: loss falls, accuracy rises (epoch 1: $first, epoch 3: $last)"
	else
		bad "$name: loss falls, accuracy rises (epoch 1: '$first', epoch 3: '$last')" "$out"
	fi
}
easy_task "easy task"

# O1 bf16 with --bn-half: batch norm in bf16 with fp32 parameters and
# statistics, as torch.autocast runs it (amp.bn_half); the plan's batch
# norms are bf16, and the easy task learns as above (measured 2026-12-06,
# seeds 1-4: epoch 3's training loss 0.86-1.52 with the flag, 1.28-1.41
# without).
out=$("$EX" --data "$tmp/d" "${small[@]}" --batch-size 20 --opt-level O1 --precision bf16 \
	--bn-half --dry-run --dump-graph 2>&1)
check "--bn-half: O1's batch norms in bf16" "$out" "batchnorm2d .* bf16 " 20
check "--bn-half: no f32 batch norm" "$out" "batchnorm2d .* f32 " 0
easy_task "easy task, O1 bf16 --bn-half" --opt-level O1 --precision bf16 --bn-half

# Resume mid-epoch: 5 steps saved (cursor at sample 50), 3 more after.
"$EX" --data "$tmp/d" "${small[@]}" --batch-size 10 --max-steps 5 --test-images 10 \
	--checkpoint "$tmp/ck" >/dev/null 2>&1
out=$("$EX" --data "$tmp/d" "${small[@]}" --batch-size 10 --max-steps 8 --test-images 10 \
	--checkpoint "$tmp/ck" --resume 2>&1)
check "resume: at step 5, batch 5 of epoch 1" "$out" "^resumed .*ck at step 5 (epoch 1, batch 5)" 1
check "resume: 3 more steps" "$out" "^trained 3 steps" 1

# Cosine with one warm-up epoch of 12 steps: the first step's lr is 0.1/12.
out=$("$EX" --data "$tmp/d" "${small[@]}" --batch-size 20 --epochs 2 --lr-schedule cosine \
	--warmup-epochs 1 --max-steps 2 --log-interval 1 --test-images 10 2>&1)
check "cosine warm-up: lr 0.1/12 at step 1" "$out" "^epoch 1 step     1/12 .* lr 0.008333 " 1
check "cosine warm-up: lr 0.2/12 at step 2" "$out" "^epoch 1 step     2/12 .* lr 0.01667 " 1

# The plan as Graphviz, rendered when dot is installed.
out=$("$EX" --synthetic --train-images 20 --test-images 10 "${small[@]}" --batch-size 4 \
	--dry-run --dump-plan "$tmp/plan.dot" 2>&1)
check "--dump-plan --dry-run: written, stopped before step 1" "$out" "^dry run: compiled" 1
if ! grep -q "^digraph loom_plan" "$tmp/plan.dot" 2>/dev/null; then
	bad "--dump-plan: a digraph" "$(head -3 "$tmp/plan.dot" 2>&1)"
elif command -v sfdp >/dev/null; then
	# sfdp, not dot: dot's layered layout of this ResNet-18 plan (302
	# nodes) takes 5-6 minutes of CPU (mincross over the weights' edges to
	# both passes), most of CI's normal suite; sfdp parses the same file and
	# draws it in 0.2 s. tests/engine:test_report renders the ConvNet's
	# plan with dot itself.
	if sfdp -Tsvg "$tmp/plan.dot" -o "$tmp/plan.svg" 2>"$tmp/dot.err" && grep -q "<svg" "$tmp/plan.svg"; then
		ok "--dump-plan: Graphviz renders it"
	else
		bad "--dump-plan: Graphviz renders it" "$(cat "$tmp/dot.err")"
	fi
else
	echo "skip --dump-plan rendering: needs Graphviz (sfdp)"
fi

# ResNet-34 at batch 128 (compile only): the planned activations are at
# most half of one buffer each.
out=$("$EX" --synthetic --train-images 128 --test-images 10 --depth 34 --batch-size 128 \
	--device cpu --memory-report --dry-run 2>&1)
act=$(sed -n 's/^ *activations (reused) *\([0-9.]*\) MiB *(\([0-9.]*\) MiB with one buffer each).*/\1 \2/p' <<<"$out")
if [ -n "$act" ] && awk -v a="$act" 'BEGIN { split(a, v, " "); exit !(2 * v[1] <= v[2]) }'; then
	ok "ResNet-34 b128: planned activations at most half the naive sum ($act MiB)"
else
	bad "ResNet-34 b128: planned activations at most half the naive sum ('$act')" "$out"
fi

# Two ranks: mpirun and the launcher; rank 0 alone prints.
flags=(--synthetic --train-images 80 --test-images 20 "${small[@]}" --batch-size 10 --epochs 1 \
	--max-steps 2 --log-interval 1)
out=$("${MPIRUN[@]}" -np 2 "$EX" "${flags[@]}" 2>&1)
check "mpirun -np 2: a group of 2, global batch 20" "$out" "^data parallel: 2 ranks (mpirun), global batch 20" 1
check "mpirun -np 2: progress at the global batch" "$out" "^epoch 1 step .* batch 20 " 2
check "mpirun -np 2: test accuracy over both shards" "$out" "^epoch 1 done: test loss [0-9.]*, test accuracy" 1
out=$("$EX" --nproc 2 "${flags[@]}" 2>&1)
check "--nproc 2: rank 0 trains and evaluates" "$out" "^\[rank 0\] epoch 1 done: test loss" 1
check "--nproc 2: rank 1 prints no progress" "$out" "^\[rank 1\] epoch" 0

# Issue 12: with batch norm synchronised, 2 ranks x 10 end an epoch with the
# test loss of 1 rank x 20 (the same global batches: the sampler deals each
# global batch out across the ranks, augmentation depends on the item only);
# unsynchronised they differ. "Within rounding": the sync gap must be under a
# quarter of the unsynchronised one (rounding alone, 1 rank at 1 vs 2
# threads, moves this loss by about 1e-4 after 4 steps).
eq=(--synthetic --train-images 80 --test-images 40 "${small[@]}" --epochs 1 --lr 0.05 --log-interval 100)
tl() { sed -n 's/.*epoch 1 done: test loss \([0-9.]*\),.*/\1/p' <<<"$1"; }
one=$(tl "$("$EX" "${eq[@]}" --batch-size 20 --threads 2 2>&1)")
syn=$(tl "$("${MPIRUN[@]}" -np 2 "$EX" "${eq[@]}" --batch-size 10 --sync-bn 2>&1)")
own=$(tl "$("${MPIRUN[@]}" -np 2 "$EX" "${eq[@]}" --batch-size 10 2>&1)")
if [ -n "$one" ] && [ -n "$syn" ] && [ -n "$own" ] && awk -v a="$one" -v s="$syn" -v o="$own" 'BEGIN {
	ds = s - a; if (ds < 0) ds = -ds; do_ = o - a; if (do_ < 0) do_ = -do_
	exit !(do_ > 0 && ds < 0.25 * do_) }'; then
	ok "--sync-bn: 2 ranks x 10 test loss $syn = 1 rank x 20 $one (unsynchronised $own)"
else
	bad "--sync-bn: 2 ranks x 10 test loss equals 1 rank x 20" "1 rank '$one', 2 ranks sync '$syn', unsynchronised '$own'"
fi

# --accumulate and --trace: 2 ranks, 2 micro-batches per step, a trace file.
out=$("${MPIRUN[@]}" -np 2 "$EX" --synthetic --train-images 80 --test-images 20 "${small[@]}" \
	--batch-size 10 --epochs 1 --accumulate 2 --trace "$tmp/trace.json" --trace-steps 2 2>&1)
check "--accumulate 2: the images per update" "$out" "^gradient accumulation: 2 micro-batches per step, 40 images per update" 1
check "--trace: written by rank 0" "$out" "^trace: 2 steps on 2 ranks written to $tmp/trace.json" 1
if grep -q '"traceEvents"' "$tmp/trace.json" 2>/dev/null && grep -q '"pid":1' "$tmp/trace.json"; then
	ok "--trace: a Chrome trace with both ranks' tracks"
else
	bad "--trace: a Chrome trace with both ranks' tracks" "$(head -c 300 "$tmp/trace.json" 2>&1)"
fi
expect "--save-every not a multiple of --accumulate" 2 "must be a multiple of --accumulate" -- --accumulate 3 --save-every 4 --checkpoint "$tmp/c"

# resnet50_synthetic, narrow and small: per-rank and total images/s.
out=$("$R50" --depth 18 --size 32 --width 8 --batch-size 4 --steps 2 --warmup 1 --device cpu 2>&1)
check "resnet50_synthetic: 3 steps, one of them warm-up" "$out" "^step .*(warm-up)" 1
check "resnet50_synthetic: images/s of rank 0" "$out" "^rank 0: [0-9.]* img/s (batch 4, 2 steps)" 1
check "resnet50_synthetic: the total" "$out" "^total: [0-9.]* img/s over 1 rank" 1
check "resnet50_synthetic: MFU against a measured loom matmul" "$out" \
	"^MFU [0-9.]*% ([0-9.]* GFLOP per image from the plan, [0-9.]* GFLOP/s achieved; peak [0-9.]* GFLOP/s, a 1024\^3 loom matmul, measured)" 1
# Against --peak-flops 1e11 (100 GFLOP/s) the MFU in percent is the
# achieved GFLOP/s: the line's two numbers agree.
out=$("$R50" --depth 18 --size 32 --width 8 --batch-size 4 --steps 2 --warmup 1 --device cpu \
	--peak-flops 1e11 2>&1)
mfu=$(sed -n 's/^MFU \([0-9.]*\)% (.* \([0-9.]*\) GFLOP\/s achieved; peak 100\.0 GFLOP\/s, --peak-flops)$/\1 \2/p' <<<"$out")
if [ -n "$mfu" ] && [ "${mfu% *}" = "${mfu#* }" ] && [ "${mfu% *}" != 0.0 ]; then
	ok "resnet50_synthetic --peak-flops: MFU is the achieved rate over the given peak ($mfu)"
else
	bad "resnet50_synthetic --peak-flops: MFU is the achieved rate over the given peak" \
		"$(grep -a '^MFU' <<<"$out")"
fi
expect_r50() { # name pattern args...: resnet50_synthetic exits 2 naming the flag
	local name=$1 pat=$2
	shift 2
	local o rc
	o=$("$R50" "$@" 2>&1)
	rc=$?
	if [ $rc -eq 2 ] && grep -q -- "$pat" <<<"$o"; then ok "$name"; else bad "$name" "rc $rc: $o"; fi
}
expect_r50 "resnet50_synthetic --peak-flops -1: refused" "--peak-flops expects a number >= 0, got '-1'" \
	--peak-flops -1
out=$("${MPIRUN[@]}" -np 2 "$R50" --depth 18 --size 32 --width 8 --batch-size 4 --steps 2 \
	--warmup 1 --device cpu 2>&1)
check "resnet50_synthetic 2 ranks: both ranks' speed" "$out" "^rank [01]: [0-9.]* img/s" 2
check "resnet50_synthetic 2 ranks: the total" "$out" "^total: [0-9.]* img/s over 2 ranks (global batch 8" 1
check "resnet50_synthetic 2 ranks: one MFU line, rank 0's" "$out" "^MFU [0-9.]*% " 1
out=$("$R50" --epochs 3 2>&1)
check "resnet50_synthetic: training flags are not its own" "$out" "unknown or incomplete option '--epochs'" 1

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
