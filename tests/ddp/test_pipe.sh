#!/usr/bin/env bash
# tests/ddp/test_pipe.sh — pipeline stages (loom_compile_opts.pipeline_stages)
# across real processes: 2 and 3 stages of M micro-batches end 20 steps with
# the parameters of one process accumulating over the same micro-batches
# (GPipe and 1F1B, O0 and O2, an MLP and a ConvNet without batch norm), under
# mpirun, env:// and the launcher, and through host buffers (the staged
# transport's test hook); a user's cut; evaluation through the
# stages; the planner's activation slots; a stage built from another graph
# and a killed stage (named with its stage); a trace of every stage; the
# memory-balanced cut and its fallback under a memory limit. Prints
# "N passed, N failed".
set -u
W=$1
MNIST=${2:-}
CIFAR=${3:-}
source "$(dirname "${BASH_SOURCE[0]}")/../lib/mp_harness.sh"
mp_setup

# Bit-identical: the same kernels on the same micro-batches, the gradients
# summed over the micro-batches in the same order (ADD, ..., FOLD), one
# update dividing by M, so no bound is needed.
for n in 2 3; do
	for model in mlp cnn; do
		for lv in O0 O2; do
			for sc in gpipe 1f1b; do
				out=$("${MPIRUN[@]}" -np $n "$W" equiv $model $lv $sc 4 2>&1)
				check "$n stages, $model $lv $sc, M 4: 20 steps bit-identical to 1 process accumulating" \
					"$out" "OK equiv $model $lv $sc M 4 world $n: bit-identical" $n
			done
		done
	done
done
out=$("${MPIRUN[@]}" -np 2 "$W" equiv mlp O0 1f1b 1 2>&1)
check "2 stages, M 1: bit-identical to 1 process" "$out" "OK equiv mlp O0 1f1b M 1 world 2: bit-identical" 2
out=$("${MPIRUN[@]}" -np 3 "$W" equiv mlp O0 1f1b 8 2>&1)
check "3 stages, M 8 (more micro-batches than slots): bit-identical" "$out" \
	"OK equiv mlp O0 1f1b M 8 world 3: bit-identical" 3
out=$(envrun 2 equiv mlp O0 1f1b 4 2>&1)
check "env:// 2 stages: bit-identical" "$out" "OK equiv mlp O0 1f1b M 4 world 2: bit-identical" 2
out=$("$W" --nproc 2 equiv cnn O0 gpipe 4 2>&1)
check "launcher 2 stages: bit-identical" "$out" "^\[rank [01]\] .*OK equiv cnn O0 gpipe M 4 world 2: bit-identical" 2

# The staged transport (what a GPU without a device communicator takes:
# each send downloaded into a host copy, each receive into a host buffer
# uploaded at its step), forced on the CPU by its test hook: bit-identical
# too, under both schedules, 2 and 3 stages, early receives included.
for n in 2 3; do
	for sc in gpipe 1f1b; do
		out=$(LOOM_PIPE_STAGE_HOST=1 "${MPIRUN[@]}" -x LOOM_PIPE_STAGE_HOST -np $n "$W" equiv cnn O2 $sc 4 2>&1)
		check "staged through host buffers (LOOM_PIPE_STAGE_HOST=1), $n stages, cnn O2 $sc: bit-identical" \
			"$out" "OK equiv cnn O2 $sc M 4 world $n: bit-identical" $n
		check "LOOM_PIPE_STAGE_HOST=1: the stage table says the values go through host buffers" \
			"$out" "pipeline of $n stages .* values through host buffers over MPI (staged)" 1
	done
done
out=$(LOOM_PIPE_STAGE_HOST=1 "${MPIRUN[@]}" -x LOOM_PIPE_STAGE_HOST -np 3 "$W" equiv mlp O0 1f1b 8 2>&1)
check "staged, 3 stages, M 8 (slots reused): bit-identical" "$out" \
	"OK equiv mlp O0 1f1b M 8 world 3: bit-identical" 3

# Pipeline and data parallel: 2 stages x 2 replicas (ranks 0, 2 are stage 0's).
for model in mlp cnn; do
	out=$("${MPIRUN[@]}" -np 4 "$W" dpequiv $model 4 2>&1)
	check "2 stages x 2 replicas, $model: 1 process at the global batch within 1e-6" "$out" \
		"OK dpequiv $model M 4 stages 2 replicas 2" 4
done

for n in 2 3; do
	out=$("${MPIRUN[@]}" -np $n "$W" overflow 2>&1)
	check "O2, $n stages: an overflow in one micro-batch skips the step on every rank, same scale" \
		"$out" "OK overflow: skipped 1 steps 4 scale 32768, the same on every rank 1" $n
done

# The memory-balanced cut (loom_compile_opts.pipeline_balance): on imb (the
# convolutions take the time, the linear layers after them the memory) its
# largest stage plans less than the time cut's, the start-up table's peaks
# are the ranks' own plans, and it trains as one process does.
for run in "2 1f1b 4" "3 1f1b 4" "2 gpipe 4" "3 gpipe 6"; do
	set -- $run
	out=$("${MPIRUN[@]}" -np $1 "$W" balance $2 $3 2>&1)
	check "$1 stages, $2, M $3: the memory cut's largest planned peak below the time cut's; the table's peaks are the ranks'" \
		"$out" "OK balance $2 M $3 stages $1: .*the table's are the ranks' own: yes" $1
done
for run in "2 O0 1f1b" "2 O2 gpipe" "3 O0 1f1b" "3 O2 1f1b"; do
	set -- $run
	out=$("${MPIRUN[@]}" -np $1 "$W" equiv imb $2 $3 4 memory 2>&1)
	check "$1 stages, the memory cut, imb $2 $3, M 4: 20 steps bit-identical to 1 process accumulating" \
		"$out" "OK equiv imb $2 $3 M 4 world $1 memory cut: bit-identical" $1
done
out=$("${MPIRUN[@]}" -np 4 "$W" dpequiv imb 4 memory 12 2>&1)
check "2 stages x 2 replicas, the memory cut: 1 process at the global batch within 1e-6 (12 steps)" "$out" \
	"OK dpequiv imb M 4 stages 2 replicas 2 memory cut" 4
out=$("${MPIRUN[@]}" -np 2 "$W" fallback 4 2>&1)
check "a memory limit the time cut exceeds: the memory cut instead, said once, trains as 1 process; below both: refused naming both" \
	"$out" "OK fallback M 4: .* bit-identical to one process; limit [0-9.]*: .*neither cut fits the memory limit" 2

out=$("${MPIRUN[@]}" -np 2 "$W" cut 2>&1)
check "loom_stage_boundary (memory balance asked): the user's cut trains as 1 process; 2 marks for 2 stages refused" \
	"$out" "OK cut: bit-identical" 2
check "the start-up table shows stage 0 holding l1 only (32x20 + 32 = 672 parameters)" \
	"$out" "stage 0: [0-9]* nodes, 672 parameters" 1
check "the marks win over --pipeline-balance memory, and the table says so" \
	"$out" "loom: pipeline of 2 stages .*, cut at the loom_stage_boundary marks, values through" 1

for m in 2 4; do
	out=$("${MPIRUN[@]}" -np 2 "$W" eval $m 2>&1)
	check "EVAL through 2 stages, M $m: logits and loss of 1 process" "$out" "OK eval M $m: .* bit-identical" 2
done

out=$("${MPIRUN[@]}" -np 2 "$W" memory 8 2>&1)
check "planner: 1F1B's activations are (stages - stage)/M of GPipe's, <= stages/M" "$out" "OK memory M 8" 2
check "--memory-report: each rank prints its planned peak before step 1" "$out" \
	"rank [01] (stage [01], [0-9]* activation slots .*planned peak" 4

# Per-stage memory: a rank plans only its stage's parameters, gradients,
# O2 masters and optimizer state; the stages add up to one process's.
for n in 2 3; do
	out=$("${MPIRUN[@]}" -np $n "$W" pstate 2>&1)
	check "$n stages: each rank's parameter+gradient+master+state bytes are its stage's, summing to 1 process's" \
		"$out" "OK pstate stages $n" $n
done

# Checkpoints: the one file format whatever the strategy (O2, AdamW).
hash_of() { sed -n "s/.*rank 0: OK $2 .* hash \([0-9a-f]*\).*/\1/p" <<<"$1" | head -1; }
a=$("${MPIRUN[@]}" -np 2 "$W" psave "$tmp/p2.ckpt" 5 2 2>&1)
check "pipeline save: every rank took part, step 5" "$a" "OK psave stages 2 world 2 step 5" 2
h=$(hash_of "$a" psave)
b=$("$W" pload "$tmp/p2.ckpt" 1 2>&1)
check "resume a 2-stage checkpoint on 1 rank: its parameters, step 5" "$b" \
	"OK pload stages 1 world 1 step 5 hash ${h:-none}" 1
b=$("${MPIRUN[@]}" -np 2 "$W" pload "$tmp/p2.ckpt" 1 2>&1)
check "resume a 2-stage checkpoint under plain DDP at 2 ranks" "$b" \
	"OK pload stages 1 world 2 step 5 hash ${h:-none}" 2
b=$("${MPIRUN[@]}" -np 3 "$W" pload "$tmp/p2.ckpt" 3 2>&1)
check "resume a 2-stage checkpoint with another cut (3 stages)" "$b" \
	"OK pload stages 3 world 3 step 5 hash ${h:-none}" 3
a=$("$W" psave "$tmp/p1.ckpt" 5 1 2>&1)
h=$(hash_of "$a" psave)
b=$("${MPIRUN[@]}" -np 2 "$W" pload "$tmp/p1.ckpt" 2 2>&1)
check "and back: a 1-rank checkpoint resumes on 2 stages" "$b" \
	"OK pload stages 2 world 2 step 5 hash ${h:-none}" 2

out=$("${MPIRUN[@]}" -np 2 "$W" mismatch 2>&1)
check "a stage built from another graph: every rank fails naming the stage and node" "$out" \
	"OK mismatch: .*rank 1: stage 0's node 1 param has f32 \[33, 20\], rank 0 has \[32, 20\]" 2

# A killed stage: every survivor's error names the dead rank and its stage,
# found by the wait's watchdog long before the 60 s timeout (within 5 s:
# the process seen gone about a second into the wait, the liveness probe,
# room for a loaded machine). A survivor waiting on another survivor that
# has already failed may name both.
out=$(LOOM_COMM_TIMEOUT_S=60 "${MPIRUN[@]}" --enable-recovery -np 2 "$W" kill 2>&1)
check "a killed stage: the other stage's error names rank 1 and its stage" "$out" \
	"OK kill: .* failed after [0-9.]* s: rank 1 (pipeline stage 1) died" 1
out3=$(LOOM_COMM_TIMEOUT_S=60 "${MPIRUN[@]}" --enable-recovery -np 3 "$W" kill 2>&1)
check "3 stages, the last killed: both survivors' errors name rank 2 and its stage" "$out3" \
	"OK kill: .* failed after [0-9.]* s: .*2 (pipeline stage 2)[, ].*died" 2
late=$(sed -n 's/.*OK kill: after \([0-9.]*\) s:.*/\1/p' <<<"$out"$'\n'"$out3" |
	awk '$1 > 5')
n=$(grep -c "OK kill: after" <<<"$out"$'\n'"$out3")
if [ "$n" -eq 3 ] && [ -z "$late" ]; then ok "a killed stage: each survivor failed within 5 s (timeout 60 s)"; else
	bad "a killed stage: each survivor failed within 5 s (timeout 60 s)" "$out" "$out3"; fi

# The examples: --pipeline under the launcher, mpirun and env://; the same
# model as one process accumulating over the same micro-batches (batch norm
# per micro-batch in both), so the same test loss to the printed digit.
if [ -n "$MNIST" ]; then
	flags=(--device cpu --epochs 1 --log-interval 100 --batch-size 50 --max-steps 6)
	want=$("$MNIST" --device cpu --epochs 1 --log-interval 100 --batch-size 25 --accumulate 2 \
		--max-steps 12 2>&1 | sed -n 's/.*\(test loss [0-9.]*\).*/\1/p')
	out=$("$MNIST" --nproc 2 --pipeline 2 "${flags[@]}" --checkpoint "$tmp/m.ckpt" 2>&1)
	check "mnist_ddp --nproc 2 --pipeline 2: the stage table, one pipeline line" "$out" \
		"^\[rank 0\] pipeline: 2 stages x 1 replicas, 2 micro-batches of 25, 1f1b schedule" 1
	check "mnist_ddp --nproc 2 --pipeline 2: test loss of 1 process --accumulate 2 (${want:-none})" \
		"$out" "^\[rank 0\] epoch 1 done: ${want:-none}," 1
	out=$("${MPIRUN[@]}" -np 2 "$MNIST" --pipeline 2 --schedule gpipe "${flags[@]}" 2>&1)
	check "mpirun -np 2 mnist_ddp --pipeline 2 --schedule gpipe: the same test loss" "$out" \
		"^epoch 1 done: ${want:-none}," 1
	port=$((port + 1))
	for r in 0 1; do
		RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 120 \
			"$MNIST" --pipeline 2 "${flags[@]}" >"$tmp/env$r.out" 2>&1 &
	done
	wait
	check "env:// mnist_ddp --pipeline 2: the same test loss" "$(cat "$tmp/env0.out")" \
		"^epoch 1 done: ${want:-none}," 1
	out=$("$MNIST" --device cpu --batch-size 50 --dry-run --memory-limit 1 2>&1)
	check "--memory-limit 1: refused at compile with the planned peak" "$out" \
		"needs more memory than --memory-limit allows: .*the planned peak of [0-9.]* MiB .* exceeds the memory limit of 1.00 MiB" 1
	out=$("$MNIST" --nproc 2 --pipeline 2 --device cpu --batch-size 50 --dry-run --memory-limit 100 2>&1)
	check "--memory-limit 100: 2 stages compile" "$out" "^\[rank 0\] pipeline: 2 stages" 1
	out=$("$MNIST" --pipeline 2 --pipeline-balance bogus 2>&1)
	rc=$?
	if [ $rc -eq 2 ] && grep -q "^mnist_ddp: --pipeline-balance must be time or memory, got 'bogus'" <<<"$out"
	then ok "--pipeline-balance bogus: exit 2, naming the flag"; else
		bad "--pipeline-balance bogus: exit 2, naming the flag" "exit $rc:" "$out"; fi
	# The largest planned peak of each cut, from the start-up table; a
	# limit between them: the time cut is refused, the memory cut trains.
	largest() { sed -n 's/.*stage [0-9]*: .*planned peak \([0-9.]*\) MiB.*/\1/p' <<<"$1" | sort -g | tail -1; }
	t=$("$MNIST" --nproc 2 --pipeline 2 --device cpu --batch-size 50 --dry-run 2>&1)
	m=$("$MNIST" --nproc 2 --pipeline 2 --pipeline-balance memory --device cpu --batch-size 50 \
		--dry-run 2>&1)
	check "mnist_ddp --pipeline-balance memory: the table says the cut" "$m" \
		"^\[rank 0\] loom: pipeline of 2 stages .*, cut balancing memory (the time-balanced cut's largest: stage [01], planned peak $(largest "$t") MiB)" 1
	lim=$(awk -v a="$(largest "$t")" -v b="$(largest "$m")" 'BEGIN { if (b < a) printf "%.2f", (a + b) / 2 }')
	out=$("$MNIST" --nproc 2 --pipeline 2 "${flags[@]}" --memory-limit "${lim:-0.01}" 2>&1)
	check "mnist_ddp --memory-limit ${lim:-none} (memory cut $(largest "$m"), time cut $(largest "$t") MiB): the memory cut, said, trains" \
		"$out" "^\[rank 0\] loom: pipeline: the memory-balanced cut, since the time-balanced cut's stage [01] plans $(largest "$t") MiB, over the memory limit of ${lim:-none} MiB" 1
	check "mnist_ddp under the fallback: the same test loss" "$out" "^\[rank 0\] epoch 1 done: ${want:-none}," 1
	# The graph is the micro-batch's (25): one process resumes at that batch,
	# 300 images in.
	out=$("$MNIST" --device cpu --epochs 1 --log-interval 100 --batch-size 25 --max-steps 14 \
		--checkpoint "$tmp/m.ckpt" --resume 2>&1)
	check "mnist_ddp: a --pipeline 2 checkpoint resumes on 1 rank, 300 images in" "$out" \
		"resumed .* at step 12 (epoch 1, batch 12)" 1
fi
if [ -n "$CIFAR" ]; then
	out=$("$CIFAR" --nproc 4 --pipeline 2 --micro-batches 8 --synthetic --train-images 160 \
		--test-images 40 --width 8 --device cpu --batch-size 16 --epochs 1 --max-steps 3 \
		--log-interval 1 2>&1)
	check "cifar_ddp --nproc 4 --pipeline 2 --micro-batches 8: 2 stages x 2 replicas" "$out" \
		"^\[rank 0\] pipeline: 2 stages x 2 replicas, 8 micro-batches of 2" 1
	check "cifar_ddp 2 x 2: trains and evaluates through the stages" "$out" \
		"^\[rank 0\] epoch 1 done: test loss [0-9.]*, test accuracy" 1
	# A trace of a pipeline: one file with a track per stage, each with its
	# nodes and its receives (bench/pipeline_bubble.py reads it).
	rm -f "$tmp/pipe.json"
	out=$("$CIFAR" --nproc 2 --pipeline 2 --micro-batches 4 --synthetic --train-images 160 \
		--test-images 40 --width 8 --device cpu --batch-size 16 --epochs 1 --max-steps 4 \
		--log-interval 10 --trace "$tmp/pipe.json" --trace-steps 2 2>&1)
	check "cifar_ddp --pipeline 2 --trace: written once, by rank 0, for 2 ranks" "$out" \
		"trace: 2 steps on 2 ranks written to $tmp/pipe.json" 1
	tr=$(tr ',' '\n' <"$tmp/pipe.json" 2>/dev/null)
	n=$(grep -c '"name":"receive ' "$tmp/pipe.json" 2>/dev/null)
	if grep -q '"world":2' <<<"$tr" && grep -q '"name":"rank 1 (stage 1)"' <<<"$tr" &&
		grep -q '"pid":1' <<<"$tr" && [ "${n:-0}" -gt 0 ]; then
		ok "the pipeline's trace: both stages' tracks, their receives"
	else
		bad "the pipeline's trace: both stages' tracks, their receives" "$out" "$(head -c 600 "$tmp/pipe.json" 2>&1)"
	fi
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
