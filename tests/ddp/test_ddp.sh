#!/usr/bin/env bash
# tests/ddp/test_ddp.sh — data-parallel training across real processes
# (mpirun, env://, the launcher): parameters bit-identical on every rank
# after every step (O0, O2; 2 and 3 ranks), N ranks at batch B equal to one
# process at batch N*B, a plan mismatch and a killed rank reported by every
# rank, an overflow on one rank skipped by all, checkpoints across world
# sizes, synchronised batch norm, ZeRO-1 against plain data parallelism and
# its checkpoints, the buckets staged through host buffers
# (LOOM_DDP_STAGE_HOST=1). Prints "N passed, N failed".
set -u
W=$1
EX=${2:-}
source "$(dirname "${BASH_SOURCE[0]}")/../lib/mp_harness.sh"
mp_setup

# Under a sanitizer (bazel test --config=asan) each scenario runs once, at
# one world size, level and optimizer, so that every code path is checked
# under ASan in about a third of the time (each mpirun costs seconds there);
# the repeats over world sizes, levels and optimizers run in the normal
# suite (and under ASan with LOOM_TEST_FULL=1).
# pick FULL_LIST SANITIZER_LIST
pick() { if [ -n "${ASAN_OPTIONS:-}" ] && [ -z "${LOOM_TEST_FULL:-}" ]; then echo "$2"; else echo "$1"; fi; }

for n in $(pick "2 3" 2); do
	for lv in $(pick "O0 O2" O2); do
		out=$("${MPIRUN[@]}" -np $n "$W" identical $lv conv 2>&1)
		check "mpirun $n ranks $lv: parameters bit-identical after every step" "$out" \
			"OK identical $lv convnet world $n steps 8" $n
	done
done
out=$(envrun 2 identical O0 2>&1)
check "env:// 2 ranks: parameters bit-identical (MLP)" "$out" "OK identical O0 mlp world 2" 2
out=$("$W" --nproc 2 identical O2 2>&1)
check "launcher 2 ranks O2: parameters bit-identical (MLP)" "$out" "^\[rank [01]\] .*OK identical O2 mlp world 2" 2

for n in $(pick "2 3" 3); do
	out=$("${MPIRUN[@]}" -np $n "$W" equiv 2>&1)
	check "equivalence: $n ranks x batch 4 = 1 rank x batch $((4 * n)) after 20 SGD steps" "$out" \
		"OK equiv world $n" $n
done

# LOOM_DDP_STAGE_HOST=1: the buckets and sync_bn's sums through the
# host-staged communicator (parallel/ddp_staged.c), the path of ranks that
# share a GPU, here on the CPU over real MPI.
out=$("${MPIRUN[@]}" -x LOOM_DDP_STAGE_HOST=1 -np 2 "$W" equiv 2>&1)
check "staged through host buffers: 2 ranks x batch 4 = 1 rank x batch 8 after 20 SGD steps" \
	"$out" "OK equiv world 2" 2
out=$("${MPIRUN[@]}" -x LOOM_DDP_STAGE_HOST=1 -np 2 "$W" syncbn_equiv sync 2>&1)
check "staged through host buffers: sync_bn ConvNet 2 ranks x batch 4 = 1 rank x batch 8" "$out" \
	"OK syncbn_equiv sync world 2 .* 14 values" 2
out=$("${MPIRUN[@]}" -x LOOM_DDP_STAGE_HOST=1 -np 2 "$W" zero O0 sgd 2>&1)
check "staged through host buffers: ZeRO refused at compile, naming it" "$out" \
	"ERROR compile (zero): .*staged through host memory .*ZeRO (its reduce-scatter and all-gather) is not staged yet" 2

# Synchronised batch norm (loom_compile_opts.sync_bn).
for n in $(pick "2 3" 2); do
	out=$("${MPIRUN[@]}" -np $n "$W" syncbn_equiv sync 2>&1)
	check "sync_bn: ConvNet $n ranks x batch 4 = 1 rank x batch $((4 * n)), parameters and running stats" \
		"$out" "OK syncbn_equiv sync world $n .* 14 values" $n
done
out=$("${MPIRUN[@]}" -np 2 "$W" syncbn_equiv nosync 2>&1)
check "without sync_bn the same ConvNet run differs from 1 rank (per-rank statistics)" "$out" \
	"OK syncbn_equiv nosync world 2 .* 14 values" 2
for n in $(pick "2 3" 3); do
	out=$("${MPIRUN[@]}" -np $n "$W" syncbn_grad 2>&1)
	check "sync_bn: $n ranks, input, gamma and beta gradients = central differences of the global loss" \
		"$out" "OK syncbn_grad world $n: 8 gradients" $n
done
out=$("$W" syncbn_world1 2>&1)
check "sync_bn at world 1: bit for bit plain batch norm" "$out" "OK syncbn_world1 world 1" 1
for lv in $(pick "O0 O1 O2" O1); do
	out=$("${MPIRUN[@]}" -np 2 "$W" identical $lv conv sync 2>&1)
	check "sync_bn: 2 ranks $lv: parameters bit-identical after every step" "$out" \
		"OK identical $lv convnet sync_bn world 2 steps 8" 2
done
out=$("${MPIRUN[@]}" -np 2 "$W" syncbn_fused 2>&1)
check "sync_bn with batch norm + relu fused: bit for bit the unfused plan" "$out" \
	"OK syncbn_fused world 2: relu carried by the sync batch norm 1" 2
out=$("${MPIRUN[@]}" -np 3 "$W" syncbn_mismatch 2>&1)
check "sync_bn on rank 1 only: every rank fails naming it" "$out" \
	"ERROR compile: .*rank 1: node [0-9]* batchnorm2d has f32 \[4, 16, 28, 28\] with sync_bn=1, rank 0 has sync_bn=0" 3

out=$("${MPIRUN[@]}" -np 3 "$W" mismatch 2>&1)
check "mismatch: rank 1 built another graph, every rank fails naming the node" "$out" \
	"ERROR compile: .*rank 1: node [0-9]* input has f32 \[8, 20\], rank 0 has \[4, 20\]" 3

# A dead rank is found by the wait's watchdog, long before the 60 s timeout.
out=$(LOOM_COMM_TIMEOUT_S=60 LOOM_TEST_VICTIM=1 "${MPIRUN[@]}" --enable-recovery -x LOOM_TEST_VICTIM -np 3 "$W" die 2>&1)
check "SIGKILL of rank 1 mid-training: the others name it within 5 s" "$out" \
	"ERROR step: .*failed after [0-4]\.[0-9] s: rank 1 died" 2
out=$(LOOM_COMM_TIMEOUT_S=60 LOOM_TEST_VICTIM=1 "$W" --nproc 2 die 2>&1)
check "launcher: the survivor names rank 1 within 5 s" "$out" "^\[rank 0\] .*failed after [0-4]\.[0-9] s: rank 1 died" 1
check "launcher: reports rank 1 killed" "$out" "^launch: failed: rank 1 was killed by signal 9" 1

out=$("${MPIRUN[@]}" -np 2 "$W" overflow 2>&1)
check "O1: overflow on rank 1 only, every rank skips that step, same scale" "$out" \
	"OK overflow skipped 1 steps 5 scale 32768 identical 1" 2

# Checkpoints across world sizes: what rank 0 saved at one world size is
# what every rank loads at the other, and training goes on in step.
hash_of() { sed -n "s/.*rank 0: OK $2 world [0-9]* step 5 hash \([0-9a-f]*\).*/\1/p" <<<"$1"; }
a=$("$W" save "$tmp/w1.ckpt" 5 2>&1)
b=$("${MPIRUN[@]}" -np 2 "$W" load "$tmp/w1.ckpt" 2>&1)
check "resume at world 2 from world 1: every rank at step 5, in step after" "$b" "OK load world 2 step 5" 2
h=$(hash_of "$a" save)
check "resume 1 -> 2: every rank loaded world 1's parameters" "$b" "OK load world 2 step 5 hash ${h:-none}" 2
a=$("${MPIRUN[@]}" -np 2 "$W" save "$tmp/w2.ckpt" 5 2>&1)
b=$("$W" load "$tmp/w2.ckpt" 2>&1)
h=$(hash_of "$a" save)
check "resume 2 -> 1: world 2's parameters at step 5" "$b" "OK load world 1 step 5 hash ${h:-none}" 1

# ZeRO-1 (loom_compile_opts.zero_stage): 20 steps side by side with plain
# data parallelism, bit for bit, at 2 and 3 ranks, O0 and O2, SGD and AdamW.
for n in $(pick "2 3" 3); do
	for lv in $(pick "O0 O2" O2); do
		for op in $(pick "sgd adamw" adamw); do
			out=$("${MPIRUN[@]}" -np $n "$W" zero $lv $op 2>&1)
			check "zero 1, $n ranks $lv $op: 20 steps bit-identical to plain DDP, on every rank" \
				"$out" "OK zero $lv $op world $n steps [0-9]*: bit-identical" $n
		done
	done
done
# Gradient clipping under ZeRO-1 (loom_optim_opts.clip_grad 0.1: every step
# clips): the shards' sums of squares added over the ranks, so the norm
# may differ from plain's in the last bits (within 1e-12) and the
# parameters by 1e-6 relative at most; O2 also skips a step (overflow).
for n in 2 3; do
	for lv in O0 O2; do
		out=$("${MPIRUN[@]}" -np $n "$W" zero $lv adamw 0.1 2>&1)
		check "zero 1 + clip_grad, $n ranks $lv adamw: 20 steps as plain DDP with clipping, every rank" \
			"$out" "OK zero clip $lv adamw world $n steps [0-9]*: .* 20 of 20 steps clipped" $n
	done
done
out=$("${MPIRUN[@]}" -np 2 "$W" zero O2 sgd 0.1 2>&1)
check "zero 1 + clip_grad, 2 ranks O2 sgd: as plain DDP with clipping" "$out" \
	"OK zero clip O2 sgd world 2 steps [0-9]*: .* 20 of 20 steps clipped" 2

# ZeRO-2 (zero_stage 2: the gradients' shards kept, the buckets reused once
# reduced): 20 steps side by side with plain data parallelism on the same
# (small) buckets, bit for bit, at 2 and 3 ranks, O0 and O2, SGD and AdamW;
# the arena smaller than ZeRO-1's by what the bucket region saves.
for n in $(pick "2 3" 3); do
	for lv in $(pick "O0 O2" O2); do
		for op in $(pick "sgd adamw" adamw); do
			out=$("${MPIRUN[@]}" -np $n "$W" zero $lv $op 0 2 2>&1)
			check "zero 2, $n ranks $lv $op: 20 steps bit-identical to plain DDP, gradients sharded" \
				"$out" "OK zero 2 $lv $op world $n steps [0-9]*: bit-identical .* ([1-9][0-9]* fewer than ZeRO-1's buckets)" $n
		done
	done
done
# Gradient accumulation (3 micro-steps per update: the sums are folded
# into each bucket before its reduce-scatter): as plain, bit for bit.
for n in $(pick "2 3" 3); do
	out=$("${MPIRUN[@]}" -np $n "$W" zero O2 adamw 0 2 3 2>&1)
	check "zero 2 + accumulation (3 micro-steps), $n ranks O2 adamw: bit-identical to plain DDP" \
		"$out" "OK zero 2 accum O2 adamw world $n steps [0-9]*: bit-identical" $n
done
for n in 2 3; do
	out=$("${MPIRUN[@]}" -np $n "$W" zero O2 adamw 0.1 2 2>&1)
	check "zero 2 + clip_grad, $n ranks O2 adamw: 20 steps as plain DDP with clipping, every rank" \
		"$out" "OK zero 2 clip O2 adamw world $n steps [0-9]*: .* 20 of 20 steps clipped" $n
done

# ZeRO checkpoints are plain DDP's: the same file at the same step; a ZeRO
# file resumes without ZeRO at world 1, a plain file with ZeRO at world 3
# exactly as without, and a ZeRO file at another world size with ZeRO.
zhash() { sed -n "s/.*rank 0: OK zload zero $2 world $3 step [0-9]* hash \([0-9a-f]*\).*/\1/p" <<<"$1"; }
# LABEL FILE ZERO REF: FILE resumed at 3 ranks under --zero ZERO ends its
# steps as REF resumed at 3 ranks without ZeRO, bit for bit (the hash of
# rank 0's parameters).
resumes_as_plain() {
	local a b h
	a=$("${MPIRUN[@]}" -np 3 "$W" zload "$2" "$3" 2>&1)
	b=$("${MPIRUN[@]}" -np 3 "$W" zload "$4" 0 2>&1)
	h=$(zhash "$b" 0 3)
	check "$1" "$a" "OK zload zero $3 world 3 step [0-9]* hash ${h:-none}" 3
}
a=$("${MPIRUN[@]}" -np 2 "$W" zsave "$tmp/z2.ckpt" 5 1 2>&1)
b=$("${MPIRUN[@]}" -np 2 "$W" zsave "$tmp/p2.ckpt" 5 0 2>&1)
check "zero 1 save: every rank took part" "$a" "OK zsave zero 1 world 2 step 5" 2
out=$(cmp "$tmp/z2.ckpt" "$tmp/p2.ckpt" 2>&1 && echo SAME)
check "zero 1 save at 2 ranks (O2 masters, AdamW moments): the same bytes as plain DDP's" "$out" "^SAME" 1
out=$(cmp "$tmp/z2.ckpt.safetensors" "$tmp/p2.ckpt.safetensors" 2>&1 && echo SAME)
check "zero 1 export at 2 ranks (O2: the gathered masters): the same bytes as plain DDP's" "$out" "^SAME" 1
if [ "$(pick full quick)" = full ]; then
	"${MPIRUN[@]}" -np 3 "$W" zsave "$tmp/z3.ckpt" 5 1 >/dev/null 2>&1
	"${MPIRUN[@]}" -np 3 "$W" zsave "$tmp/p3.ckpt" 5 0 >/dev/null 2>&1
	out=$(cmp "$tmp/z3.ckpt" "$tmp/p3.ckpt" 2>&1 && echo SAME)
	check "zero 1 save at 3 ranks: the same bytes as plain DDP's" "$out" "^SAME" 1
fi
out=$("$W" zload "$tmp/z2.ckpt" 0 2>&1)
check "resume zero (2 ranks) -> plain (1 rank): step 8" "$out" "OK zload zero 0 world 1 step 8" 1
"$W" zsave "$tmp/p1.ckpt" 5 0 >/dev/null 2>&1
resumes_as_plain "resume plain (1 rank) -> zero 1 (3 ranks): as plain at 3 ranks, bit for bit" \
	"$tmp/p1.ckpt" 1 "$tmp/p1.ckpt"
resumes_as_plain "resume zero 1 (2 ranks) -> zero 1 (3 ranks): as plain at 3 ranks, bit for bit" \
	"$tmp/z2.ckpt" 1 "$tmp/z2.ckpt"

# ZeRO-2's checkpoints: the same file as plain DDP's at 2 ranks; it resumes
# as plain data parallelism at 3 ranks exactly as a plain file would, and a
# plain file at 1 rank resumes under ZeRO-2 at 3 ranks as plain at 3.
"${MPIRUN[@]}" -np 2 "$W" zsave "$tmp/zz2.ckpt" 5 2 >/dev/null 2>&1
out=$(cmp "$tmp/zz2.ckpt" "$tmp/p2.ckpt" 2>&1 && echo SAME)
check "zero 2 save at 2 ranks (O2 masters, AdamW moments): the same bytes as plain DDP's" "$out" "^SAME" 1
out=$(cmp "$tmp/zz2.ckpt.safetensors" "$tmp/p2.ckpt.safetensors" 2>&1 && echo SAME)
check "zero 2 export at 2 ranks (the gathered masters): the same bytes as plain DDP's" "$out" "^SAME" 1
resumes_as_plain "resume zero 2 (2 ranks) -> plain DDP (3 ranks): as the plain file, bit for bit" \
	"$tmp/zz2.ckpt" 0 "$tmp/p2.ckpt"
resumes_as_plain "resume plain (1 rank) -> zero 2 (3 ranks): as plain at 3 ranks, bit for bit" \
	"$tmp/p1.ckpt" 2 "$tmp/p1.ckpt"

# ZeRO-3 (zero_stage 3: the parameters sharded too, each bucket's gathered
# before its forward and its backward readers into buffers the memory plan
# places): 20 steps side by side with plain data parallelism, bit for bit,
# at 2 and 3 ranks, O0 and O2, SGD and AdamW; this rank's parameters,
# optimizer state and masters its shards.
for n in $(pick "2 3" 3); do
	for lv in $(pick "O0 O2" O2); do
		for op in $(pick "sgd adamw" adamw); do
			out=$("${MPIRUN[@]}" -np $n "$W" zero $lv $op 0 3 2>&1)
			check "zero 3, $n ranks $lv $op: 20 steps bit-identical to plain DDP, parameters sharded" \
				"$out" "OK zero 3 $lv $op world $n steps [0-9]*: bit-identical .* parameters [0-9]* of [0-9]* bytes" $n
		done
	done
done
for n in $(pick "2 3" 3); do
	out=$("${MPIRUN[@]}" -np $n "$W" zero O2 adamw 0 3 3 2>&1)
	check "zero 3 + accumulation (3 micro-steps), $n ranks O2 adamw: bit-identical to plain DDP" \
		"$out" "OK zero 3 accum O2 adamw world $n steps [0-9]*: bit-identical" $n
	out=$("${MPIRUN[@]}" -np $n "$W" zero O2 adamw 0.1 3 2>&1)
	check "zero 3 + clip_grad, $n ranks O2 adamw: 20 steps as plain DDP with clipping, every rank" \
		"$out" "OK zero 3 clip O2 adamw world $n steps [0-9]*: .* 20 of 20 steps clipped" $n
done
# The prefetch depth moves the gathers (none ahead, 2 ahead), not the bits.
for pf in -1 2; do
	out=$("${MPIRUN[@]}" -np 3 "$W" zero3pf $pf 2>&1)
	check "zero 3, prefetch $pf, 3 ranks O2 adamw: bit-identical to plain DDP" \
		"$out" "OK zero 3 O2 adamw world 3 steps [0-9]*: bit-identical" 3
done
# Its checkpoints and exports: plain DDP's bytes at 2 ranks (the parameters
# and masters gathered from the shards); the file resumes as plain DDP at 3
# ranks exactly as the plain file does, and a plain file at 1 rank resumes
# under ZeRO-3 at 3 ranks as plain at 3 ranks.
"${MPIRUN[@]}" -np 2 "$W" zsave "$tmp/z32.ckpt" 5 3 >/dev/null 2>&1
out=$(cmp "$tmp/z32.ckpt" "$tmp/p2.ckpt" 2>&1 && echo SAME)
check "zero 3 save at 2 ranks (O2 parameters and masters, AdamW moments): the same bytes as plain DDP's" \
	"$out" "^SAME" 1
out=$(cmp "$tmp/z32.ckpt.safetensors" "$tmp/p2.ckpt.safetensors" 2>&1 && echo SAME)
check "zero 3 export at 2 ranks (the gathered weights): the same bytes as plain DDP's" "$out" "^SAME" 1
resumes_as_plain "resume zero 3 (2 ranks) -> plain DDP (3 ranks): as the plain file, bit for bit" \
	"$tmp/z32.ckpt" 0 "$tmp/p2.ckpt"
resumes_as_plain "resume plain (1 rank) -> zero 3 (3 ranks): as plain at 3 ranks, bit for bit" \
	"$tmp/p1.ckpt" 3 "$tmp/p1.ckpt"
resumes_as_plain "resume zero 3 (2 ranks) -> zero 3 (3 ranks): as plain at 3 ranks, bit for bit" \
	"$tmp/z32.ckpt" 3 "$tmp/p2.ckpt"

# The example at 2 ranks on Fashion-MNIST: the launcher, mpirun and
# torchrun's variables; a resume at world 1 continues at the same sample.
if [ -n "$EX" ]; then
	flags=(--device cpu --epochs 1 --batch-size 50 --max-steps 4 --log-interval 2)
	out=$("$EX" --nproc 2 "${flags[@]}" --checkpoint "$tmp/ex.ckpt" 2>&1)
	check "mnist_ddp --nproc 2: a group of 2, global batch 100" "$out" \
		"^\[rank 0\] data parallel: 2 ranks (env://), global batch 100" 1
	check "mnist_ddp --nproc 2: rank 0 alone prints progress" "$out" "^\[rank 1\]" 0
	check "mnist_ddp --nproc 2: the progress line shows the global batch" "$out" \
		"^\[rank 0\] epoch 1 step .* batch 100 " 2
	check "mnist_ddp --nproc 2: test accuracy over the whole test set" "$out" \
		"^\[rank 0\] epoch 1 done: test loss [0-9.]*, test accuracy" 1
	out=$("$EX" "${flags[@]}" --checkpoint "$tmp/ex.ckpt" --resume --max-steps 9 2>&1)
	check "mnist_ddp: resume at world 1 from world 2 at sample 400 (batch 8 of 50)" "$out" \
		"resumed .* at step 8 (epoch 1, batch 8)" 1
	out=$("${MPIRUN[@]}" -np 2 "$EX" "${flags[@]}" 2>&1)
	check "mpirun -np 2 mnist_ddp" "$out" "data parallel: 2 ranks (mpirun)" 1

	# ZeRO-1 with AdamW under O2 at 2 ranks: the memory report shows the
	# optimizer state and the fp32 masters at half of plain DDP's.
	mflags=(--device cpu --epochs 1 --batch-size 50 --max-steps 1 --optimizer adamw
		--opt-level O2 --memory-report)
	a=$("$EX" --nproc 2 "${mflags[@]}" 2>&1)
	b=$("$EX" --nproc 2 "${mflags[@]}" --zero 1 2>&1)
	mib() { sed -n "s/^\[rank 0\]   $2  *\([0-9.]*\) MiB.*/\1/p" <<<"$1" | head -1; }
	for what in "master weights (fp32)" "optimizer state"; do
		pa=$(mib "$a" "$what")
		pb=$(mib "$b" "$what")
		out=$(awk -v a="${pa:-0}" -v b="${pb:-0}" \
			'BEGIN { if (a > 0 && b > 0 && b < a && 2 * b <= a + 0.002) print "HALF" }')
		check "mnist_ddp --zero 1, 2 ranks, AdamW O2: $what ${pb:-?} MiB per rank, plain ${pa:-?}" \
			"$out" "^HALF" 1
	done
	check "mnist_ddp --zero 1: the report names the shard" "$b" \
		"^\[rank 0\]   master weights (fp32) .*(ZeRO-1: this rank's shard, 1/2)" 1
	# ZeRO-2 on buckets of 0.005 MiB: the gradients this rank holds (its
	# shards and the buckets in flight) below plain's.
	c=$("$EX" --nproc 2 "${mflags[@]}" --bucket-cap-mb 0.005 --zero 2 2>&1)
	pa=$(mib "$a" gradients)
	pc=$(mib "$c" gradients)
	out=$(awk -v a="${pa:-0}" -v b="${pc:-0}" 'BEGIN { if (a > 0 && b > 0 && b < 0.8 * a) print "LESS" }')
	check "mnist_ddp --zero 2, 2 ranks: gradients ${pc:-?} MiB per rank, plain ${pa:-?}" "$out" "^LESS" 1
	check "mnist_ddp --zero 2: the report names the gradients' shards" "$c" \
		"^\[rank 0\]   gradients .*(ZeRO-2: this rank's shards" 1
	# ZeRO-3: this rank's parameters at half of plain's, the gathered
	# buckets planned among the activations.
	c=$("$EX" --nproc 2 "${mflags[@]}" --bucket-cap-mb 0.005 --zero 3 2>&1)
	pa=$(mib "$a" parameters)
	pc=$(mib "$c" parameters)
	out=$(awk -v a="${pa:-0}" -v b="${pc:-0}" \
		'BEGIN { if (a > 0 && b > 0 && b < a && 2 * b <= a + 0.002) print "HALF" }')
	check "mnist_ddp --zero 3, 2 ranks: parameters ${pc:-?} MiB per rank, plain ${pa:-?}" "$out" "^HALF" 1
	check "mnist_ddp --zero 3: the report names the gathers" "$c" \
		"^\[rank 0\]   gathered at once (peak) .*(ZeRO-3: [0-9]* gathers" 1
	check "mnist_ddp --zero 3: trains and evaluates" "$c" "^\[rank 0\] epoch 1 done: test loss [0-9]" 1

	# A restart resumes from the checkpoint (no --resume given) and never
	# overwrites it with an earlier step: rank 1 killed before step 6 of
	# the first attempt, the checkpoint then at step 4.
	out=$(LOOM_TEST_KILL_AT_STEP=5 "$EX" --nproc 2 --max-restarts 1 "${flags[@]}" --max-steps 8 \
		--save-every 2 --checkpoint "$tmp/rs.ckpt" 2>&1)
	rc=$?
	check "mnist_ddp --max-restarts: rank 1 killed, one restart" "$out" "restarting all 2 workers (restart 1 of 1)" 1
	check "mnist_ddp --max-restarts: the restart resumes from the checkpoint" "$out" \
		"^\[rank 0\] resumed .* at step 4 (epoch 1, batch 4)" 1
	after=$(sed -n '/restarting all 2 workers/,$p' <<<"$out")
	check "mnist_ddp --max-restarts: no save of an earlier step after the restart" "$after" \
		"saved .* (step [0-4])" 0
	check "mnist_ddp --max-restarts: the run ends at step 8 (saved once)" "$after" "saved .* (step 8)" 1
	[ $rc -eq 0 ] && ok "mnist_ddp --max-restarts: exit code 0" || bad "mnist_ddp --max-restarts: exit code" "rc $rc"
	out=$("$EX" --nproc 1 --max-restarts 1 "${flags[@]}" --max-steps 1 2>&1)
	check "mnist_ddp: --max-restarts without --checkpoint warns at start-up" "$out" \
		"^mnist_ddp: warning: --max-restarts without --checkpoint: a restart begins again from step 0" 1

	# A setting that differs on one rank (mpirun's MPMD form) is refused at
	# start-up on every rank, naming it and both values.
	n=0
	while read -r flag v0 v1; do
		# Under a sanitizer, one of the eleven (the check's code is one).
		n=$((n + 1))
		[ "$n" -gt "$(pick 11 1)" ] && continue
		out=$("${MPIRUN[@]}" -np 1 "$EX" "${flags[@]}" "$flag" "$v0" : \
			-np 1 "$EX" "${flags[@]}" "$flag" "$v1" 2>&1 </dev/null)
		check "mnist_ddp: $flag $v0 on rank 0, $v1 on rank 1: refused naming both" "$out" \
			"^mnist_ddp: rank [01]: rank 1 has $flag $v1, rank 0 has $v0: every rank must run with the same $flag" 2
	done <<-EOF
		--opt-level O0 O2
		--optimizer sgd adamw
		--lr 0.1 0.2
		--momentum 0.9 0.5
		--weight-decay 0 0.0001
		--seed 1 2
		--accumulate 1 2
		--max-steps 4 5
		--epochs 1 2
		--loss-scale 128 1024
		--clip-grad 0 1
	EOF
	# --micro-batches under --pipeline: named by its flag at start-up, not by
	# the plan fingerprint's "header ... differs at byte 48" (every compared
	# flag is held to the parser's table in tests/examples/test_settings.c).
	pf=("${flags[@]}" --batch-size 40 --pipeline 2)
	out=$("${MPIRUN[@]}" -np 1 "$EX" "${pf[@]}" --micro-batches 2 : \
		-np 1 "$EX" "${pf[@]}" --micro-batches 4 2>&1 </dev/null)
	check "mnist_ddp --pipeline 2: --micro-batches 2 on rank 0, 4 on rank 1: refused naming the flag" "$out" \
		"^mnist_ddp: rank [01]: rank 1 has --micro-batches 4, rank 0 has 2: every rank must run with the same --micro-batches" 2

	# An output path rank 0 cannot write stops every rank before step 1.
	out=$("$EX" --nproc 2 "${flags[@]}" --export / 2>&1)
	check "mnist_ddp --nproc 2 --export /: rank 0 names the path" "$out" \
		"^\[rank 0\] mnist_ddp: --export /: is a directory, expected a file path" 1
	check "mnist_ddp --nproc 2 --export /: rank 1 stops too" "$out" \
		"^\[rank 1\] mnist_ddp: rank 1: stopping: rank 0 refused an output path" 1
	check "mnist_ddp --nproc 2 --export /: no step taken" "$out" "^\[rank 0\] epoch 1 step" 0
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
