#!/usr/bin/env bash
# tests/engine/cuda/gpu_suite.sh — what runs on a GPU host, from a bundle made
# by bazel/gpu_bundle.sh (bin/ next to this script; run.sh unpacks it fresh,
# sets the library path and calls this). In this order, each a row of one
# table with a verdict read from its log (gpu_summary.sh):
#   1. the device, driver and library versions;
#   2. test_device and 3. test_cuda_ops, with LOOM_REQUIRE_GPU=1 (a missing
#      device fails, never skips; any skipped case fails the row);
#   3a. the versus section (versus.md, gpu_versus.py): loom's GPT-2 124M
#      O2 bf16 against PyTorch the nanoGPT way (eager and compiled) and
#      llm.c's train_gpt2cu, loom's ResNet-50 O2 fp16 / O1 bf16 / fp32
#      against PyTorch channels-last eager and compiled, PyTorch's best per
#      row, one MFU for all; and the per-kernel profile (kernels.md,
#      gpu_kprof.sh under Nsight Systems, gpu_kernels.py): loom's GPT-2 step
#      beside llm.c's, by kernel family; in 480 s (LOOM_GPU_VERSUS_S);
#      LOOM_GPU_REST=0 ends the suite there (a lease for these alone);
#   3b. the speed section: ResNet-50 and GPT-2 124M, loom (kernel search on
#      and off) alternating with PyTorch, one table (speed.txt), in 360 s;
#   3c. the fp8 section (issue 42): GPT-2 124M, 350M and 774M, loom O2 bf16
#      against fp8 (emulated, and on cuBLASLt FP8: LOOM_CUDA_FP8_GEMM=1)
#      and PyTorch compiled bf16 / torchao float8, one table (fp8.txt), in
#      600 s (LOOM_GPU_FP8_S; LOOM_GPU_FP8=0 leaves it out);
#   4. one epoch of mnist_ddp on the GPU at O0, O1, O2 fp16 and O2 bf16,
#      with the test accuracy;
#   5. an env:// world-1 run (RANK=0 WORLD_SIZE=1 MASTER_ADDR MASTER_PORT):
#      the NCCL test (init, broadcast, all-reduce, all-gather, teardown) and
#      mnist_ddp started that way, also with its bucket all-reduces
#      (LOOM_DDP_WORLD1_BUCKETS=1) captured in the step's graph and with
#      LOOM_CUDA_GRAPH_RANKS=0; 2 pipeline stages on one GPU through host
#      buffers (tests/ddp's pipe_worker, equiv), and over NCCL where there
#      are 2 GPUs; data parallelism at world 2 on one GPU, the collectives
#      staged through host buffers over MPI, its test loss against world 1
#      at the same global batch (gpu_ddp_shared.sh). NCCL at world > 1
#      (data parallelism over NCCL between ranks) waits for a lease with
#      several GPUs: one GPU takes one NCCL rank;
#   6. gpt_ddp (small GPT at O0, O1/O2 bf16; GPT-2 124M for speed),
#      bench_convnet, resnet50_synthetic, and their PyTorch twins
#      (bench/torch_gpu.py, bench/torch_gpt.py) one after the other;
#   7. test_cuda_ops under compute-sanitizer memcheck, and racecheck on the
#      own kernels' cases, when the host has compute-sanitizer (last, so a
#      short lease gets the rest first; LOOM_GPU_SANITIZER=0 leaves it out).
# cuBLASLt's log (CUBLASLT_LOG_LEVEL) and cuDNN's error log are on throughout.
# The whole run keeps to a 20-minute budget (LOOM_GPU_BUDGET_S); a step that
# would start after it is a FAIL row "not run". Logs, the table and the
# whole output go into one folder: $OUT when set (the device tool copies it
# back), else results/ here.
set -u
here=$(cd "$(dirname "$0")" && pwd)
bin=$here/bin
res=${OUT:-$here/results}
logs=$res/logs
mkdir -p "$logs"
rows=$res/rows.tsv
: >"$rows"
budget=${LOOM_GPU_BUDGET_S:-1200}
t_start=$(date +%s)
export LOOM_REQUIRE_GPU=1
# Kernels fixed (the CPU's shape rule, cuDNN's heuristic), as .bazelrc runs
# the tests: rows that compare processes bit for bit (pipe_worker equiv)
# must not see two measurements choose differently. The speed section's
# search-on rows and test_cuda_ops's conv_algorithm_search turn it back on.
export LOOM_KERNEL_SEARCH=off
# Where cuBLASLt and cuDNN say what went wrong (their logs go with ours):
# cuBLASLt's errors and hints (mask 1 | 4; level 1 for older versions);
# cuDNN's errors (CUDNN_LOGERR_DBG; cuDNN 9 reads CUDNN_LOGLEVEL_DBG).
export CUBLASLT_LOG_LEVEL=${CUBLASLT_LOG_LEVEL:-1}
export CUBLASLT_LOG_MASK=${CUBLASLT_LOG_MASK:-5}
export CUBLASLT_LOG_FILE=$logs/cublaslt_%i.log
export CUDNN_LOGERR_DBG=1
export CUDNN_LOGLEVEL_DBG=${CUDNN_LOGLEVEL_DBG:-1}
export CUDNN_LOGDEST_DBG=$logs/cudnn.log
exec > >(tee "$res/suite.log") 2>&1

left() { echo $((budget - ($(date +%s) - t_start))); }

# row name kind limit_s [min_accuracy] -- command...
row() {
	local name=$1 kind=$2 limit=$3 min=$4
	shift 5
	local log=$logs/$name.log rc t0 t1 rem
	if [ ! -x "$1" ] && ! command -v "$1" >/dev/null 2>&1; then
		echo "$1: not in this bundle or on this host" >"$log"
		printf '%s\t%s\tabsent\t0\t%s\t%s\n' "$name" "$kind" "$log" "$min" >>"$rows"
		return
	fi
	rem=$(left)
	if [ "$rem" -le 5 ]; then
		: >"$log"
		printf '%s\t%s\tbudget\t0\t%s\t%s\n' "$name" "$kind" "$log" "$min" >>"$rows"
		return
	fi
	[ "$limit" -gt "$rem" ] && limit=$rem
	echo "=== $name (limit ${limit} s): $*"
	t0=$(date +%s.%N)
	timeout -k 10 "$limit" "$@" >"$log" 2>&1
	rc=$?
	t1=$(date +%s.%N)
	tail -n 5 "$log"
	printf '%s\t%s\t%s\t%.1f\t%s\t%s\n' "$name" "$kind" "$rc" \
		"$(awk "BEGIN { print $t1 - $t0 }")" "$log" "$min" >>"$rows"
}

versions() {
	if ! command -v nvidia-smi >/dev/null 2>&1; then
		echo "nvidia-smi: not found (no NVIDIA driver on this host?)"
		return 1
	fi
	nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader || return 1
	nvidia-smi | head -n 4 | tail -n 2
	command -v nvcc >/dev/null 2>&1 && nvcc --version | tail -n 2
	echo "libraries the loom binaries load:"
	ldd "$bin/test_cuda_ops" | grep -E 'cudart|cublas|cudnn|nccl|cuda\.so' || true
	[ -f "$bin/libloom_cuda.so" ] &&
		ldd "$bin/libloom_cuda.so" | grep -E 'cudart|cublas|cudnn|nccl|cuda\.so'
	command -v compute-sanitizer >/dev/null 2>&1 && compute-sanitizer --version | tail -n 1
	return 0
}
echo "=== versions"
versions >"$logs/versions.log" 2>&1
printf 'versions\tinfo\t%s\t0\t%s\t\n' "$?" "$logs/versions.log" >>"$rows"
cat "$logs/versions.log"

row test_device criterion 120 "" -- "$bin/test_device" --verbose
row test_cuda_ops criterion 300 "" -- "$bin/test_cuda_ops" --verbose

# finish [note]: the summary table, then the speed, versus and kernel
# tables under it, into summary.txt; exits with the summary's verdict.
finish() {
	local rc f
	echo
	echo "=== summary ($(($(date +%s) - t_start)) s of ${budget} s${1:-})"
	bash "$here/gpu_summary.sh" "$rows" | tee "$res/summary.txt"
	rc=${PIPESTATUS[0]}
	for f in speed.txt fp8.txt versus.md kernels.md; do
		[ -f "$res/$f" ] && { echo; cat "$res/$f"; } | tee -a "$res/summary.txt"
	done
	echo "logs and table: $res"
	exit "$rc"
}

# What the speed rows below and the versus section share: gpt_ddp's text,
# the python3 with CUDA PyTorch (LOOM_GPU_TORCH=0: none).
text=()
[ -f "$here/data/fortunes.txt" ] && text=(--data "$here/data/fortunes.txt")
py=$(command -v python3 || true)
torch_ok=0
[ "${LOOM_GPU_TORCH:-1}" != 0 ] && [ -n "$py" ] &&
	"$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null &&
	torch_ok=1
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)

# The versus section (issue 41): loom beside what users run, early in the
# lease, in one table (versus.md, gpu_versus.py: per workload loom's rate,
# PyTorch's best mode and llm.c's, every MFU against one peak and one FLOP
# count). GPT-2 124M b8 T1024: loom O2 bf16; PyTorch the nanoGPT way
# (bench/torch_gpt.py --nanogpt: SDPA causal, fused AdamW, bf16 autocast,
# table 50304, tanh GELU) eager, then compiled; llm.c's train_gpt2cu where
# the bundle has it (its token files made here from the text when the
# bundle has none). ResNet-50 b64: loom O2 fp16, O1 bf16 and fp32 (TF32);
# PyTorch channels-last (bench/torch_gpu.py) eager amp-fp16, amp-bf16,
# eager-fp32, then each compiled (torch.compile(model,
# mode="reduce-overhead"): CUDA graphs), the three in one process. Every run:
# 10 or more untimed warm-up steps, then 20 timed. The compiled rows come
# last, after the kernel profile, so that a short lease cuts them first;
# LOOM_GPU_VERSUS_S (default 480) bounds the section, LOOM_GPU_VERSUS=0
# leaves it out, LOOM_GPU_R50_COMPILE lists the compiled ResNet-50 modes
# (default "amp-fp16 amp-bf16 eager-fp32"; "" for none).
vs=$res/versus.tsv
: >"$vs"
vs_budget=${LOOM_GPU_VERSUS_S:-480}
vs_t0=$(date +%s)
# vrow workload side kind name limit -- command...: a row of the summary
# (kind optional: no figure is FAIL, a missing program N/A) and a line of
# the versus table, within the section's time.
vrow() {
	local w=$1 side=$2 kind=$3 name=$4 limit=$5 rem
	shift 6
	rem=$((vs_budget - ($(date +%s) - vs_t0)))
	if [ "$rem" -le 15 ]; then
		echo "not run: the versus section's ${vs_budget} s (LOOM_GPU_VERSUS_S) were spent" \
			>"$logs/$name.log"
		printf '%s\toptional\tabsent\t0\t%s\t\n' "$name" "$logs/$name.log" >>"$rows"
	else
		[ "$limit" -gt "$rem" ] && limit=$rem
		row "$name" optional "$limit" "" -- "$@"
	fi
	printf '%s\t%s\t%s\t%s\t%s\n' "$w" "$side" "$name" "$kind" "$logs/$name.log" >>"$vs"
}
# vnone workload side kind name why: a run this host cannot make.
vnone() {
	echo "$5" >"$logs/$4.log"
	printf '%s\toptional\tabsent\t0\t%s\t\n' "$4" "$logs/$4.log" >>"$rows"
	printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$4" "$3" "$logs/$4.log" >>"$vs"
}
gpt_w=gpt2_124m_b8_t1024_bf16
# gpt_ddp: 40 steps, the last logged rate over steps 21-40.
vs_gpt=(--device cuda "${text[@]}" --preset gpt2 --batch-size 8 --max-steps 40
	--log-interval 20 --val-interval 0 --sample 0 --peak-flops 989e12)
vs_r50=(--device cuda --batch-size 64 --steps 20 --warmup 10)
torch_vs_gpt=("$here/bench/torch_gpt.py" --nanogpt --device cuda "${text[@]}" --layers 12 --heads 12
	--embd 768 --context 1024 --vocab 50257 --batch-size 8 --steps 30 --warmup 10)
torch_vs_r50=("$here/bench/torch_gpu.py" resnet50 --batch 64 --steps 20 --warmup 10
	--layout channels-last --compile-mode reduce-overhead)
# llm.c's token files, made by bazel/gpu_bundle.sh from the text.
llmc_data=$here/llmc
# train_gpt2cu as the versus and profile rows run it, -x (steps) after it:
# GPT-2 124M from random weights (-e d12), batch 8, T 1024, no recompute,
# evaluation and samples only at the first and last steps.
llmc_cmd=("$bin/train_gpt2cu" -e d12 -b 8 -t 1024 -v 1000 -s 1000 -m 2 -r 0
	-o /tmp/llmc_out_unused -i "$llmc_data/train.bin" -j "$llmc_data/val.bin")
if [ "${LOOM_GPU_VERSUS:-1}" != 0 ]; then
	vrow $gpt_w loom loom_tok versus_gpt2_loom_O2_bf16 60 -- env LOOM_KERNEL_SEARCH=on \
		"$bin/gpt_ddp" "${vs_gpt[@]}" --opt-level O2 --precision bf16
	if [ $torch_ok = 1 ]; then
		vrow $gpt_w torch torch_tok versus_gpt2_torch_eager 90 -- "$py" "${torch_vs_gpt[@]}"
	else
		vnone $gpt_w torch torch_tok versus_gpt2_torch_eager \
			"no python3 with CUDA PyTorch on this host (or LOOM_GPU_TORCH=0)"
	fi
	if [ -x "$bin/train_gpt2cu" ] && [ -f "$llmc_data/train.bin" ]; then
		# 30 steps, the table's rate over steps 11-30 (its per-step ms).
		vrow $gpt_w llmc llmc_tok versus_gpt2_llmc 60 -- "${llmc_cmd[@]}" -x 30
	else
		vnone $gpt_w llmc llmc_tok versus_gpt2_llmc \
			"llm.c's train_gpt2cu is not in this bundle (LOOM_LLMC_BIN at bazel/gpu_bundle.sh)"
	fi
	for cfg in "O2 fp16:r50_b64_fp16:--opt-level O2" \
		"O1 bf16:r50_b64_bf16:--opt-level O1 --precision bf16" \
		"fp32 TF32:r50_b64_fp32:--peak-flops 494.5e12"; do
		IFS=: read -r lbl w args <<<"$cfg"
		[ "$w" != r50_b64_fp32 ] && args="$args --peak-flops 989e12"
		# shellcheck disable=SC2086 # args is a list of flags
		vrow "$w" loom loom_img "versus_r50_loom_${lbl// /_}" 60 -- env LOOM_KERNEL_SEARCH=on \
			"$bin/resnet50_synthetic" "${vs_r50[@]}" $args
	done
	# One process for the three eager modes; its log feeds all three rows.
	if [ $torch_ok = 1 ]; then
		vrow r50_b64_fp16 torch torch_img versus_r50_torch_eager 120 -- "$py" "${torch_vs_r50[@]}" \
			--modes amp-fp16 amp-bf16 eager-fp32
	else
		vnone r50_b64_fp16 torch torch_img versus_r50_torch_eager \
			"no python3 with CUDA PyTorch on this host (or LOOM_GPU_TORCH=0)"
	fi
	# The same log for the other two types (gpu_versus.py takes each
	# type's modes from it).
	for w in r50_b64_bf16 r50_b64_fp32; do
		printf '%s\ttorch\tversus_r50_torch_eager\ttorch_img\t%s\n' "$w" \
			"$logs/versus_r50_torch_eager.log" >>"$vs"
	done
fi

# The per-kernel profile (issue 41 item 4): GPT-2 124M b8 T1024, loom O2
# bf16 against llm.c's train_gpt2cu, under Nsight Systems, or CUPTI through
# bin/libloom_kprof.so where the host has no nsys (gpu_kprof.sh);
# each program twice, 5 and 15 steps, so that the difference over 10 steps
# is one steady step's kernels (start-up, the kernel search, evaluation
# cancel); gpu_kernels.py makes kernels.md: each side's top 20 kernels by
# family. About 80 s with llm.c; LOOM_GPU_PROFILE=0 leaves it out, neither
# way there gives an N/A row that says so.
prof=$res/profile
kprof_sides=()
if [ "${LOOM_GPU_PROFILE:-1}" != 0 ]; then
	mkdir -p "$prof"
	if nsys_bin=$(bash "$here/gpu_kprof.sh" --which); then
		echo "=== profile: $nsys_bin"
		for n in 5 15; do
			row "profile_gpt2_loom_O2_$n" optional 90 "" -- bash "$here/gpu_kprof.sh" \
				"$prof/loom_$n" -- env LOOM_KERNEL_SEARCH=on "$bin/gpt_ddp" --device cuda \
				"${text[@]}" --preset gpt2 --opt-level O2 --precision bf16 --batch-size 8 \
				--max-steps $n --log-interval 5 --val-interval 0 --sample 0 --peak-flops 989e12
		done
		[ -s "$prof/loom_5.csv" ] && [ -s "$prof/loom_15.csv" ] &&
			kprof_sides+=(--side loom "$prof/loom_15.csv" 15 "$prof/loom_5.csv" 5)
		# The same step with issue 41 item 3's kernels on (LOOM_CUDA_LN_BWD=warp,
		# LOOM_CUDA_ADAMW=f32, LOOM_CUDA_BGRAD=kernel): their kernels' times
		# beside the ones they replace.
		for n in 5 15; do
			row "profile_gpt2_loom_O2_gk_$n" optional 90 "" -- bash "$here/gpu_kprof.sh" \
				"$prof/loom_gk_$n" -- env LOOM_KERNEL_SEARCH=on LOOM_CUDA_LN_BWD=warp \
				LOOM_CUDA_ADAMW=f32 LOOM_CUDA_BGRAD=kernel "$bin/gpt_ddp" --device cuda \
				"${text[@]}" --preset gpt2 --opt-level O2 --precision bf16 --batch-size 8 \
				--max-steps $n --log-interval 5 --val-interval 0 --sample 0 --peak-flops 989e12
		done
		[ -s "$prof/loom_gk_5.csv" ] && [ -s "$prof/loom_gk_15.csv" ] &&
			kprof_sides+=(--side loom+gk "$prof/loom_gk_15.csv" 15 "$prof/loom_gk_5.csv" 5)
		if [ -x "$bin/train_gpt2cu" ] && [ -f "$llmc_data/train.bin" ]; then
			for n in 5 15; do
				row "profile_gpt2_llmc_$n" optional 90 "" -- bash "$here/gpu_kprof.sh" \
					"$prof/llmc_$n" -- "${llmc_cmd[@]}" -x $n
			done
			[ -s "$prof/llmc_5.csv" ] && [ -s "$prof/llmc_15.csv" ] &&
				kprof_sides+=(--side llm.c "$prof/llmc_15.csv" 15 "$prof/llmc_5.csv" 5)
		fi
	else
		echo "no nsys on this host (looked on PATH, under \$CUDA_HOME, /usr/local/cuda*, /opt/nvidia/nsight-systems*) and no bin/libloom_kprof.so in the bundle" \
			>"$logs/profile_gpt2.log"
		printf 'profile_gpt2\toptional\tabsent\t0\t%s\t\n' "$logs/profile_gpt2.log" >>"$rows"
	fi
	if [ ${#kprof_sides[@]} -gt 0 ] && [ -n "$py" ]; then
		"$py" "$here/gpu_kernels.py" "${kprof_sides[@]}" --top 20 \
			--title "GPU kernels of one GPT-2 124M b8 T1024 step, ${gpu_name:-GPU}" \
			>"$res/kernels.md" 2>&1
	fi
	# The reports are large and the CSVs hold what the table needs
	# (LOOM_GPU_KEEP_NSYS=1 keeps them).
	[ "${LOOM_GPU_KEEP_NSYS:-0}" = 1 ] || rm -f "$prof"/*.nsys-rep
fi

# The compiled PyTorch rows of the versus table, each in its own process.
if [ "${LOOM_GPU_VERSUS:-1}" != 0 ]; then
	if [ $torch_ok = 1 ]; then
		vrow $gpt_w torch torch_tok versus_gpt2_torch_compiled 150 -- "$py" "${torch_vs_gpt[@]}" \
			--compile
		# One process for the compiled modes (one import, one pool of
		# compile workers): each mode's JSON line is written as it ends,
		# so a row cut by the time keeps the modes done.
		cm=()
		for m in ${LOOM_GPU_R50_COMPILE-amp-fp16 amp-bf16 eager-fp32}; do
			cm+=("compile-$m")
		done
		if [ ${#cm[@]} -gt 0 ]; then
			vrow r50_b64_fp16 torch torch_img versus_r50_torch_compiled 400 -- "$py" \
				"${torch_vs_r50[@]}" --modes "${cm[@]}"
			for w in r50_b64_bf16 r50_b64_fp32; do
				printf '%s\ttorch\tversus_r50_torch_compiled\ttorch_img\t%s\n' "$w" \
					"$logs/versus_r50_torch_compiled.log" >>"$vs"
			done
		fi
	fi
	echo "=== versus ($(($(date +%s) - vs_t0)) s of ${vs_budget} s)"
	if [ -n "$py" ]; then
		"$py" "$here/gpu_versus.py" "$vs" --device "${gpu_name:-the GPU}" >"$res/versus.md" 2>&1
	else
		echo "no python3 on this host: the versus table is not made (runs in $vs)" >"$res/versus.md"
	fi
fi
# LOOM_GPU_REST=0: the summary now, the rows below left out (a lease for
# the versus table and the profile alone).
[ "${LOOM_GPU_REST:-1}" = 0 ] && finish "; LOOM_GPU_REST=0: the rows after the profile left out"

# The speed section (issue 30), early so that a short lease gets it, within
# its own LOOM_GPU_SPEED_S (360 s): ResNet-50 b64 at fp32 (TF32, the
# default), fp32 exact (--tf32 off), O2 fp16 and O1 bf16, with the
# convolutions' algorithm search on and off (LOOM_KERNEL_SEARCH=on|off;
# off, the option's default: cuDNN's heuristic, the former choice), and GPT-2 124M O1 bf16
# (GELU in cuBLASLt's epilogue off, then the default), alternating with
# their PyTorch twins (bench/torch_gpu.py in channels-last and NCHW,
# bench/torch_gpt.py). Few steps: figures to compare side by side, not to
# quote to the last percent. One table, speed.txt (gpu_speed.sh); each run
# is also a row of the summary (no figure: FAIL; a row the section's time
# left out: N/A). LOOM_GPU_SPEED=0 leaves the section out.
speed=$res/speed.tsv
: >"$speed"
speed_budget=${LOOM_GPU_SPEED_S:-360}
speed_t0=$(date +%s)
# srow name speed_kind row_kind limit -- command...: a row of the summary
# and a line of the speed table, within the section's time.
srow() {
	local name=$1 skind=$2 rkind=$3 limit=$4 rem
	shift 5
	rem=$((speed_budget - ($(date +%s) - speed_t0)))
	if [ "$rem" -le 15 ]; then
		echo "not run: the speed section's ${speed_budget} s (LOOM_GPU_SPEED_S) were spent" \
			>"$logs/$name.log"
		printf '%s\toptional\tabsent\t0\t%s\t\n' "$name" "$logs/$name.log" >>"$rows"
	else
		[ "$limit" -gt "$rem" ] && limit=$rem
		row "$name" "$rkind" "$limit" "" -- "$@"
	fi
	printf '%s\t%s\t%s\n' "$name" "$skind" "$logs/$name.log" >>"$speed"
}
r50=(--device cuda --batch-size 64 --steps 20 --warmup 3)
torch_r50() { # name layout modes...
	local name=$1 layout=$2
	shift 2
	if [ $torch_ok = 1 ]; then
		srow "$name" torch_img optional 120 -- "$py" "$here/bench/torch_gpu.py" resnet50 \
			--batch 64 --steps 20 --warmup 5 --layout "$layout" --modes "$@"
	else
		echo "no python3 with CUDA PyTorch on this host (or LOOM_GPU_TORCH=0)" >"$logs/$name.log"
		printf '%s\toptional\tabsent\t0\t%s\t\n' "$name" "$logs/$name.log" >>"$rows"
		printf '%s\ttorch_img\t%s\n' "$name" "$logs/$name.log" >>"$speed"
	fi
}
if [ "${LOOM_GPU_SPEED:-1}" != 0 ]; then
	# LOOM_GPU_SEARCHES="off" (a rerun where the search was measured
	# already) leaves the search-on half out; LOOM_GPU_TORCH_R50=0 the
	# PyTorch ResNet-50 twins (~150 s).
	for search in ${LOOM_GPU_SEARCHES:-on off}; do
		env_s=(LOOM_KERNEL_SEARCH=$search)
		srow "speed_r50_fp32_tf32_search_$search" loom_img bench 60 -- env "${env_s[@]}" \
			"$bin/resnet50_synthetic" "${r50[@]}"
		srow "speed_r50_fp32_exact_search_$search" loom_img bench 60 -- env "${env_s[@]}" \
			"$bin/resnet50_synthetic" "${r50[@]}" --tf32 off
		srow "speed_r50_O2_fp16_search_$search" loom_img bench 60 -- env "${env_s[@]}" \
			"$bin/resnet50_synthetic" "${r50[@]}" --opt-level O2
		srow "speed_r50_O1_bf16_search_$search" loom_img bench 60 -- env "${env_s[@]}" \
			"$bin/resnet50_synthetic" "${r50[@]}" --opt-level O1 --precision bf16
		# PyTorch between loom's two halves, then after them.
		if [ "${LOOM_GPU_TORCH_R50:-1}" = 0 ]; then
			:
		elif [ $search = on ] || [ "${LOOM_GPU_SEARCHES:-on off}" = off ]; then
			torch_r50 speed_torch_r50_channels_last channels-last eager-fp32 exact-fp32 \
				amp-fp16 amp-bf16
		else
			torch_r50 speed_torch_r50_nchw nchw eager-fp32 amp-fp16 amp-bf16
		fi
	done
	# --preset gpt2 is GPT-2's tanh GELU (gelu_new), the form cuBLASLt's
	# GELU epilogue computes, so the epilogue applies; the PyTorch twins
	# run torch_gpt.py --gelu tanh to match, and llm.c's is tanh too.
	# (Rows before 2026-12-06 ran the preset with the exact GELU.)
	# GELU in cuBLASLt's epilogue off (LOOM_CUDA_GELU_EPILOGUE=0),
	# everything else at its default (~20 s): against the next row, it
	# decides the switch.
	srow speed_gpt2_124m_O1_bf16_gelu_epilogue_off loom_tok bench 60 -- env \
		LOOM_KERNEL_SEARCH=on LOOM_CUDA_GELU_EPILOGUE=0 "$bin/gpt_ddp" --device cuda "${text[@]}" \
		--preset gpt2 --opt-level O1 --precision bf16 --batch-size 8 --max-steps 20 \
		--log-interval 5 --val-interval 0 --sample 0
	srow speed_gpt2_124m_O1_bf16 loom_tok bench 90 -- env LOOM_KERNEL_SEARCH=on \
		"$bin/gpt_ddp" --device cuda "${text[@]}" \
		--preset gpt2 --opt-level O1 --precision bf16 --batch-size 8 --max-steps 20 \
		--log-interval 5 --val-interval 0 --sample 0
	if [ $torch_ok = 1 ] && [ ${#text[@]} -gt 0 ]; then
		srow speed_torch_gpt2_124m_bf16 torch_tok optional 90 -- "$py" "$here/bench/torch_gpt.py" \
			--device cuda "${text[@]}" --layers 12 --heads 12 --embd 768 --context 1024 \
			--vocab 50257 --batch-size 8 --steps 20 --autocast bf16 --gelu tanh
	else
		echo "no python3 with CUDA PyTorch or no text on this host" >"$logs/speed_torch_gpt2_124m_bf16.log"
		printf 'speed_torch_gpt2_124m_bf16\toptional\tabsent\t0\t%s\t\n' \
			"$logs/speed_torch_gpt2_124m_bf16.log" >>"$rows"
		printf 'speed_torch_gpt2_124m_bf16\ttorch_tok\t%s\n' \
			"$logs/speed_torch_gpt2_124m_bf16.log" >>"$speed"
	fi
	# llm.c's train_gpt2cu (karpathy/llm.c, built beside the repo with cuDNN
	# attention and bundled only when LOOM_LLMC_BIN names it: never part of
	# the build), GPT-2 124M from random weights (-e d12), batch 8, T 1024,
	# no recompute, on random tokens in its own file format: the twin of
	# loom's O2 bf16 (bf16 weights, fp32 masters).
	if [ -x "$bin/train_gpt2cu" ] && [ -f "$llmc_data/train.bin" ]; then
		srow speed_llmc_gpt2_124m_bf16 llmc_tok optional 60 -- "$bin/train_gpt2cu" -e d12 \
			-b 8 -t 1024 -x 20 -v 1000 -s 1000 -m 2 -r 0 -o /tmp/llmc_out_unused \
			-i "$llmc_data/train.bin" -j "$llmc_data/val.bin"
		srow speed_gpt2_124m_O2_bf16 loom_tok bench 40 -- env LOOM_KERNEL_SEARCH=on \
			"$bin/gpt_ddp" --device cuda "${text[@]}" \
			--preset gpt2 --opt-level O2 --precision bf16 --batch-size 8 --max-steps 20 \
			--log-interval 5 --val-interval 0 --sample 0
	fi
	# The GPT's products against llm.c's (engine/cuda/README.md): GPT-2
	# 124M O2 bf16 with the product switches at the old paths (BGRADB,
	# the heuristic told 16-byte alignment, the logits' rows as they are,
	# DGELU not chosen: LOOM_INPLACE_DY=0), then with llm.c's choices (the
	# bias gradient by its own kernel, the plan's alignment, the unaligned
	# rows through padded copies, DGELU). 20 steps each, ~25 s in all.
	srow speed_gpt2_124m_O2_bf16_lt_off loom_tok bench 40 -- env LOOM_KERNEL_SEARCH=on \
		LOOM_CUDA_BGRAD_EPILOGUE=1 LOOM_CUDA_LT_ALIGN=0 LOOM_CUDA_LT_PAD=0 LOOM_INPLACE_DY=0 \
		"$bin/gpt_ddp" --device cuda "${text[@]}" \
		--preset gpt2 --opt-level O2 --precision bf16 --batch-size 8 --max-steps 20 \
		--log-interval 5 --val-interval 0 --sample 0
	srow speed_gpt2_124m_O2_bf16_lt_on loom_tok bench 40 -- env LOOM_KERNEL_SEARCH=on \
		LOOM_CUDA_BGRAD_EPILOGUE=0 LOOM_CUDA_LT_ALIGN=1 LOOM_CUDA_LT_PAD=1 LOOM_INPLACE_DY=1 \
		"$bin/gpt_ddp" --device cuda "${text[@]}" \
		--preset gpt2 --opt-level O2 --precision bf16 --batch-size 8 --max-steps 20 \
		--log-interval 5 --val-interval 0 --sample 0
	# Issue 41 item 3's kernels, each A/B on GPT-2 124M O2 bf16 (20 steps,
	# ~15 s a row): every switch at its default (today's path), then each
	# new path alone, then all three: layer norm's backward a warp per row
	# in fp32 (LOOM_CUDA_LN_BWD=warp), AdamW in fp32 with 128-bit loads
	# (LOOM_CUDA_ADAMW=f32), the bias gradient by a column-sum kernel with
	# no BGRADB (LOOM_CUDA_BGRAD=kernel). The faster of each pair becomes
	# the default (engine/cuda/README.md).
	for gk in base:LOOM_CUDA_LN_BWD=legacy ln_bwd_warp:LOOM_CUDA_LN_BWD=warp \
		adamw_f32:LOOM_CUDA_ADAMW=f32 bgrad_kernel:LOOM_CUDA_BGRAD=kernel; do
		srow "speed_gpt2_124m_O2_bf16_gk_${gk%%:*}" loom_tok bench 40 -- env \
			LOOM_KERNEL_SEARCH=on "${gk#*:}" "$bin/gpt_ddp" --device cuda "${text[@]}" \
			--preset gpt2 --opt-level O2 --precision bf16 --batch-size 8 --max-steps 20 \
			--log-interval 5 --val-interval 0 --sample 0
	done
	srow speed_gpt2_124m_O2_bf16_gk_all loom_tok bench 40 -- env LOOM_KERNEL_SEARCH=on \
		LOOM_CUDA_LN_BWD=warp LOOM_CUDA_ADAMW=f32 LOOM_CUDA_BGRAD=kernel \
		"$bin/gpt_ddp" --device cuda "${text[@]}" \
		--preset gpt2 --opt-level O2 --precision bf16 --batch-size 8 --max-steps 20 \
		--log-interval 5 --val-interval 0 --sample 0
	# The classifier over a padded vocabulary (engine/vocab_pad.c: the tied
	# table, its gradients and the logits laid out at 50304 rows/columns,
	# softmax-CE over the real 50257), off and on side by side: GPT-2 124M
	# O1 bf16, 20 steps each, ~25 s in all.
	srow speed_gpt2_124m_O1_bf16_vocab_pad0 loom_tok bench 40 -- env LOOM_KERNEL_SEARCH=on \
		LOOM_VOCAB_PAD=0 "$bin/gpt_ddp" --device cuda "${text[@]}" \
		--preset gpt2 --opt-level O1 --precision bf16 --batch-size 8 --max-steps 20 \
		--log-interval 5 --val-interval 0 --sample 0
	srow speed_gpt2_124m_O1_bf16_vocab_pad128 loom_tok bench 40 -- env LOOM_KERNEL_SEARCH=on \
		LOOM_VOCAB_PAD=128 "$bin/gpt_ddp" --device cuda "${text[@]}" \
		--preset gpt2 --opt-level O1 --precision bf16 --batch-size 8 --max-steps 20 \
		--log-interval 5 --val-interval 0 --sample 0
	# ResNet-50's default at search off and 10 steps, the reference of
	# the 10-step rows below; last, so that a short budget cuts these
	# first.
	r50s=(--device cuda --batch-size 64 --steps 10 --warmup 2)
	srow speed_r50_O2_fp16_default10 loom_img bench 40 -- env LOOM_KERNEL_SEARCH=off \
		"$bin/resnet50_synthetic" "${r50s[@]}" --opt-level O2
	# NHWC through the planner's formats (engine/cuda/formats.c): off by
	# default since the fourth GPU run (3-4x slower on an H100 with the
	# legacy batch-norm backward), so the rows above and
	# speed_r50_O2_fp16_default10 run NCHW, as these =0 rows do;
	# speed_r50_O2_fp16_bn_add_off runs NHWC without the fused batch norm
	# + add + relu, against speed_r50_O2_fp16_nhwc_bn_bwd_ex below (NHWC,
	# the defaults). 10 steps each.
	srow speed_r50_O2_fp16_nhwc_off loom_img bench 40 -- env LOOM_KERNEL_SEARCH=off \
		LOOM_CUDA_NHWC=0 "$bin/resnet50_synthetic" "${r50s[@]}" --opt-level O2
	srow speed_r50_O2_fp16_bn_add_off loom_img bench 40 -- env LOOM_KERNEL_SEARCH=off \
		LOOM_CUDA_NHWC=half LOOM_CUDA_BN_ADD=0 "$bin/resnet50_synthetic" "${r50s[@]}" \
		--opt-level O2
	srow speed_r50_O1_bf16_nhwc_off loom_img bench 40 -- env LOOM_KERNEL_SEARCH=off \
		LOOM_CUDA_NHWC=0 "$bin/resnet50_synthetic" "${r50s[@]}" --opt-level O1 --precision bf16
	# NHWC (LOOM_CUDA_NHWC=half) with NHWC batch norm's backward through
	# cuDNN's Ex call with the forward's reserve, the relu's and the add +
	# relu's backward inside it (LOOM_CUDA_BN_BWD_EX, _FUSE: on), and with
	# the legacy backward (LOOM_CUDA_BN_BWD_EX=0: 93 of 113 ms of a step
	# on an H100), side by side at 10 steps (~30 s for the two rows).
	srow speed_r50_O2_fp16_nhwc_bn_bwd_ex loom_img bench 40 -- env LOOM_KERNEL_SEARCH=off \
		LOOM_CUDA_NHWC=half "$bin/resnet50_synthetic" "${r50s[@]}" --opt-level O2
	srow speed_r50_O2_fp16_nhwc_bn_bwd_legacy loom_img bench 40 -- env LOOM_KERNEL_SEARCH=off \
		LOOM_CUDA_NHWC=half LOOM_CUDA_BN_BWD_EX=0 "$bin/resnet50_synthetic" "${r50s[@]}" \
		--opt-level O2
	# The step as one CUDA graph (loom_compile_opts.cuda_graph, on by
	# default) against every step eager (--no-cuda-graph): the ConvNet
	# at batch 100, launch-bound (O0 and O2, 100 steps, ~5 s each), and
	# GPT-2 124M O1 bf16 (10 steps, ~12 s each); the loss one step late
	# (LOOM_ASYNC_LOSS=1) so that the host does not wait for each step.
	cg=(--device cuda --levels 02 --steps 100 --warmup 5)
	srow speed_convnet_graph loom_table bench 30 -- env LOOM_ASYNC_LOSS=1 \
		"$bin/bench_convnet" "${cg[@]}"
	srow speed_convnet_no_graph loom_table bench 30 -- env LOOM_ASYNC_LOSS=1 \
		"$bin/bench_convnet" "${cg[@]}" --no-cuda-graph
	gg=(--device cuda "${text[@]}" --preset gpt2 --opt-level O1 --precision bf16
		--batch-size 8 --max-steps 10 --log-interval 5 --val-interval 0 --sample 0)
	srow speed_gpt2_124m_O1_bf16_graph loom_tok bench 40 -- env LOOM_ASYNC_LOSS=1 \
		"$bin/gpt_ddp" "${gg[@]}"
	srow speed_gpt2_124m_O1_bf16_no_graph loom_tok bench 40 -- env LOOM_ASYNC_LOSS=1 \
		"$bin/gpt_ddp" "${gg[@]}" --no-cuda-graph
	# The inputs and the loss as the graph's own copy nodes
	# (LOOM_CUDA_UPLOAD=graph, LOOM_CUDA_LOSS_NODE=1) against the rows
	# above (copies queued around each launch).
	srow speed_convnet_graph_inputs_staged loom_table bench 30 -- env LOOM_ASYNC_LOSS=1 \
		LOOM_CUDA_UPLOAD=graph LOOM_CUDA_LOSS_NODE=1 "$bin/bench_convnet" "${cg[@]}"
	# Staged inputs from a loader (bench_convnet --loader): converted into
	# the bench's buffers and copied into the pinned slot by
	# loom_set_input (own), or converted straight into the slot
	# loom_input_buffer hands out (into); each log's "input" lines say
	# the bytes the host copied a step.
	srow speed_convnet_staged_loader_own loom_table bench 30 -- env LOOM_ASYNC_LOSS=1 \
		LOOM_CUDA_UPLOAD=graph "$bin/bench_convnet" "${cg[@]}" --loader own
	srow speed_convnet_staged_loader_into loom_table bench 30 -- env LOOM_ASYNC_LOSS=1 \
		LOOM_CUDA_UPLOAD=graph "$bin/bench_convnet" "${cg[@]}" --loader into
	grep -a "^O[0-3]: input" "$logs/speed_convnet_staged_loader_own.log" \
		"$logs/speed_convnet_staged_loader_into.log" 2>/dev/null
	# Host waits inside a step (loom_program_info.syncs_in_step; 0 for a
	# replayed step) and the captures and replays, as each graph row said.
	for n in speed_convnet_graph speed_convnet_no_graph speed_convnet_graph_inputs_staged \
		speed_gpt2_124m_O1_bf16_graph speed_gpt2_124m_O1_bf16_no_graph; do
		grep -a "^launches" "$logs/$n.log" 2>/dev/null | sed "s/^/$n: /"
	done
	echo "=== speed ($(($(date +%s) - speed_t0)) s of ${speed_budget} s)"
	bash "$here/gpu_speed.sh" "$speed" | tee "$res/speed.txt"
fi

# The fp8 section (issue 42 item 5): GPT-2 124M (--preset gpt2), 350M and
# 774M (the preset with --layers/--heads/--embd 24/16/1024 and 36/20/1280),
# b8 T1024, loom O2 at --precision bf16, then fp8 with the products on the
# QDQ'd bf16 values (LOOM_CUDA_FP8_GEMM=0, the emulation) and on cuBLASLt's
# FP8 (=1), and PyTorch compiled, bf16 autocast and torchao's float8
# (bench/torch_gpt.py --nanogpt --compile [--float8]); the fp8 cases of
# test_cuda_ops first. One table, fp8.txt (gpu_speed.sh), within
# LOOM_GPU_FP8_S (600 s); LOOM_GPU_FP8=0 leaves it out. 15 steps each (the
# rate over the last 5), so the figures are side by side, not final.
fp8_tsv=$res/fp8.tsv
: >"$fp8_tsv"
fp8_budget=${LOOM_GPU_FP8_S:-600}
fp8_t0=$(date +%s)
# frow name speed_kind row_kind limit -- command...: srow's twin for this section.
frow() {
	local name=$1 skind=$2 rkind=$3 limit=$4 rem
	shift 5
	rem=$((fp8_budget - ($(date +%s) - fp8_t0)))
	if [ "$rem" -le 15 ]; then
		echo "not run: the fp8 section's ${fp8_budget} s (LOOM_GPU_FP8_S) were spent" \
			>"$logs/$name.log"
		printf '%s\toptional\tabsent\t0\t%s\t\n' "$name" "$logs/$name.log" >>"$rows"
	else
		[ "$limit" -gt "$rem" ] && limit=$rem
		row "$name" "$rkind" "$limit" "" -- "$@"
	fi
	printf '%s\t%s\t%s\n' "$name" "$skind" "$logs/$name.log" >>"$fp8_tsv"
}
if [ "${LOOM_GPU_FP8:-1}" != 0 ]; then
	row test_cuda_ops_fp8 criterion 120 "" -- "$bin/test_cuda_ops" --verbose --filter 'cuda_ops/fp8_*'
	for size in 124m 350m 774m; do
		case $size in
		124m) shape=() tshape=(--layers 12 --heads 12 --embd 768) ;;
		350m) shape=(--layers 24 --heads 16 --embd 1024) tshape=("${shape[@]}") ;;
		774m) shape=(--layers 36 --heads 20 --embd 1280) tshape=("${shape[@]}") ;;
		esac
		g=("$bin/gpt_ddp" --device cuda "${text[@]}" --preset gpt2 "${shape[@]}" --opt-level O2
			--batch-size 8 --max-steps 15 --log-interval 5 --val-interval 0 --sample 0
			--peak-flops 989e12)
		frow "fp8_gpt2_${size}_O2_bf16" loom_tok bench 120 -- env LOOM_KERNEL_SEARCH=on \
			"${g[@]}" --precision bf16
		frow "fp8_gpt2_${size}_O2_fp8_emulated" loom_tok bench 120 -- env LOOM_KERNEL_SEARCH=on \
			LOOM_CUDA_FP8_GEMM=0 "${g[@]}" --precision fp8
		frow "fp8_gpt2_${size}_O2_fp8_gemm" loom_tok bench 120 -- env LOOM_KERNEL_SEARCH=on \
			LOOM_CUDA_FP8_GEMM=1 "${g[@]}" --precision fp8
		if [ $torch_ok = 1 ]; then
			tg=("$py" "$here/bench/torch_gpt.py" --nanogpt --compile --device cuda "${text[@]}"
				"${tshape[@]}" --context 1024 --vocab 50257 --batch-size 8 --steps 25
				--warmup 10)
			frow "fp8_torch_gpt2_${size}_bf16_compiled" torch_tok optional 180 -- "${tg[@]}"
			frow "fp8_torch_gpt2_${size}_float8_compiled" torch_tok optional 180 -- "${tg[@]}" \
				--float8
		fi
	done
	echo "=== fp8 ($(($(date +%s) - fp8_t0)) s of ${fp8_budget} s)"
	bash "$here/gpu_speed.sh" "$fp8_tsv" | tee "$res/fp8.txt"
fi

data=()
[ -d "$here/data" ] && data=(--data "$here/data")
for lvl in O0 O1 O2 O2_bf16; do
	prec=()
	[ $lvl = O2_bf16 ] && prec=(--precision bf16)
	row "mnist_ddp_$lvl" train 240 80 -- "$bin/mnist_ddp" --device cuda "${data[@]}" --epochs 1 \
		--opt-level "${lvl%_bf16}" "${prec[@]}" --log-interval 200
done

# env:// at world 1: rank 0 makes the NCCL id, rendezvous with itself,
# NCCL on its one device; the test drives broadcast, all-reduce, all-gather
# and the teardown, then mnist_ddp starts the same way for a few steps.
port=$((29500 + RANDOM % 2000))
row nccl_env_world1 criterion 120 "" -- env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 \
	MASTER_PORT=$port "$bin/test_cuda_ops" --verbose --filter 'cuda_nccl/*'
row mnist_ddp_env_world1 train 180 0 -- env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 \
	MASTER_ADDR=127.0.0.1 MASTER_PORT=$((port + 1)) "$bin/mnist_ddp" --device cuda "${data[@]}" \
	--epochs 1 --max-steps 100 --log-interval 50
# The same with its bucket all-reduces (LOOM_DDP_WORLD1_BUCKETS=1), NCCL
# inside the step's CUDA graph and the watchdog reading progress marks;
# then with LOOM_CUDA_GRAPH_RANKS=0 (the collectives' steps eager, the old
# path) for before/after.
row mnist_ddp_env_world1_graph train 180 0 -- env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 \
	LOOM_DDP_WORLD1_BUCKETS=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((port + 2)) \
	"$bin/mnist_ddp" --device cuda "${data[@]}" --epochs 1 --max-steps 100 --log-interval 50
row mnist_ddp_env_world1_graph_off train 180 0 -- env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 \
	LOOM_DDP_WORLD1_BUCKETS=1 LOOM_CUDA_GRAPH_RANKS=0 MASTER_ADDR=127.0.0.1 \
	MASTER_PORT=$((port + 3)) "$bin/mnist_ddp" --device cuda "${data[@]}" --epochs 1 \
	--max-steps 100 --log-interval 50
# ZeRO-2 with clipping asked at world 1 through env://: ZeRO is off at one
# rank (nothing to shard), so this is clipping under the graph over a
# process group; its "launches:" line gives the captures and the host
# waits inside a step. ZeRO's norm summed on the device needs two GPUs.
row mnist_ddp_env_world1_zero2_clip train 180 0 -- env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 \
	MASTER_ADDR=127.0.0.1 MASTER_PORT=$((port + 4)) "$bin/mnist_ddp" --device cuda "${data[@]}" \
	--epochs 1 --max-steps 100 --log-interval 50 --zero 2 --clip-grad 1.0
grep -a "^launches" "$logs/mnist_ddp_env_world1_zero2_clip.log" 2>/dev/null

# Pipeline stages on the CUDA backend (compiled, never run before this
# row): two ranks of the launcher on one GPU, where NCCL refuses two ranks
# ("Duplicate GPU detected"), so the group has no device communicator and
# the values go through host buffers over the host communicator (the staged
# transport); 20 steps of 2 stages against one process accumulating on the
# same GPU (the worker prints OK and bit-identical, or DIFFERENT with the
# relative difference). GPipe and 1F1B, O0 and O2. LOOM_DETERMINISTIC=1:
# cuDNN's heuristic may now answer with an algorithm that adds with atomics
# (the convolution search takes every algorithm unless deterministic).
row pipe_cuda_staged_gpipe ranks 180 2 -- env LOOM_WORKER_DEVICE=cuda LOOM_DETERMINISTIC=1 "$bin/pipe_worker" \
	--nproc 2 equiv mlp O0 gpipe 4
row pipe_cuda_staged_1f1b_O2 ranks 180 2 -- env LOOM_WORKER_DEVICE=cuda LOOM_DETERMINISTIC=1 "$bin/pipe_worker" \
	--nproc 2 equiv cnn O2 1f1b 4
# Data parallelism at world 2 on one GPU (issue 41 item 6): mnist_ddp
# --nproc 2 with the buckets and sync_bn's sums staged through host buffers
# over MPI (the group opens no NCCL where ranks share a GPU), 100 steps,
# its test loss against one process at the same global batch within a
# relative 1e-3 (gpu_ddp_shared.sh says why that bound). NCCL at world > 1
# waits for a lease with several GPUs.
row ddp_cuda_shared_gpu ranks 300 1 -- bash "$here/gpu_ddp_shared.sh" "$bin" "${data[@]}"
# With a GPU per rank the group opens NCCL, and GPipe's values go through it
# (ncclSend / ncclRecv); one GPU: not run.
if [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -ge 2 ]; then
	row mnist_ddp_pipeline2_nccl train 240 70 -- "$bin/mnist_ddp" --device cuda --nproc 2 \
		--pipeline 2 --schedule gpipe "${data[@]}" --epochs 1 --log-interval 200
else
	echo "mnist_ddp --nproc 2 --pipeline 2 over NCCL needs 2 GPUs; this host has fewer" \
		>"$logs/mnist_ddp_pipeline2_nccl.log"
	printf 'mnist_ddp_pipeline2_nccl\toptional\tabsent\t0\t%s\t\n' \
		"$logs/mnist_ddp_pipeline2_nccl.log" >>"$rows"
fi

# loom and PyTorch side by side, one after the other on the same GPU.
row bench_convnet bench 180 "" -- "$bin/bench_convnet" --device cuda --steps 50 --warmup 5
# fp32 exact (--tf32 off, the first GPU run's setting) against the default
# TF32 tensor cores, side by side.
row resnet50_synthetic_tf32_off bench 180 "" -- "$bin/resnet50_synthetic" --device cuda \
	--batch-size 64 --steps 20 --warmup 3 --tf32 off
row resnet50_synthetic bench 180 "" -- "$bin/resnet50_synthetic" --device cuda --batch-size 64 \
	--steps 20 --warmup 3
# Mixed precision, the twins of PyTorch's amp-fp16 and amp-bf16 rows.
row resnet50_synthetic_O2 bench 180 "" -- "$bin/resnet50_synthetic" --device cuda --batch-size 64 \
	--steps 20 --warmup 3 --opt-level O2
row resnet50_synthetic_O1_bf16 bench 180 "" -- "$bin/resnet50_synthetic" --device cuda \
	--batch-size 64 --steps 20 --warmup 3 --opt-level O1 --precision bf16
# The transformer: the small default GPT at O0, O1 bf16 and O2 bf16 for
# 300 steps (the loss must fall; a sample of text at the end), then GPT-2
# 124M (vocabulary 50257, context 1024) at batch 8 for speed, loom and
# PyTorch (bench/torch_gpt.py, the same model) one after the other.
for lvl in O0 O1_bf16 O2_bf16; do
	prec=()
	[ $lvl != O0 ] && prec=(--precision bf16)
	row "gpt_ddp_$lvl" bench 120 "" -- "$bin/gpt_ddp" --device cuda "${text[@]}" \
		--opt-level "${lvl%_bf16}" "${prec[@]}" --max-steps 300 --log-interval 50 \
		--val-interval 100 --sample 200
done
for lvl in O1 O2; do
	row "gpt2_124m_${lvl}_bf16" bench 150 "" -- "$bin/gpt_ddp" --device cuda "${text[@]}" \
		--preset gpt2 --opt-level $lvl --precision bf16 --batch-size 8 --max-steps 20 \
		--log-interval 5 --val-interval 0 --sample 0 --memory-report
done
# cuBLASLt's workspace cap: the 4 MiB of the first GPU run against today's
# 32 MiB (the row above), O1 bf16.
row gpt2_124m_O1_bf16_ws4 bench 150 "" -- env LOOM_CUDA_LT_WS_MB=4 "$bin/gpt_ddp" --device cuda \
	"${text[@]}" --preset gpt2 --opt-level O1 --precision bf16 --batch-size 8 --max-steps 20 \
	--log-interval 5 --val-interval 0 --sample 0
# LOOM_GPU_TORCH=0 leaves the PyTorch twins out (a rerun on a machine
# where they were measured already).
if [ "${LOOM_GPU_TORCH:-1}" = 0 ] || [ "${LOOM_GPU_TORCH_END:-1}" = 0 ]; then
	echo "PyTorch twins: left out (LOOM_GPU_TORCH=0 or LOOM_GPU_TORCH_END=0)" >"$logs/torch.log"
	printf 'torch\toptional\tabsent\t0\t%s\t\n' "$logs/torch.log" >>"$rows"
elif [ -n "$py" ] && "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
	row torch_convnet optional 180 "" -- "$py" "$here/bench/torch_gpu.py" convnet --batch 100 "${data[@]}"
	row torch_resnet50 optional 180 "" -- "$py" "$here/bench/torch_gpu.py" resnet50 --batch 64 --steps 20
	if [ ${#text[@]} -gt 0 ]; then
		for ac in none bf16; do
			row "torch_gpt2_124m_$ac" optional 150 "" -- "$py" "$here/bench/torch_gpt.py" \
				--device cuda "${text[@]}" --layers 12 --heads 12 --embd 768 --context 1024 \
				--vocab 50257 --batch-size 8 --steps 20 --autocast $ac --gelu tanh
		done
	fi
else
	echo "no python3 with CUDA PyTorch on this host" >"$logs/torch.log"
	printf 'torch\toptional\tabsent\t0\t%s\t\n' "$logs/torch.log" >>"$rows"
fi

# The sanitizer rows come last, so that a short lease gets the tests,
# training and benchmarks first; LOOM_GPU_SANITIZER=0 leaves them out.
if [ "${LOOM_GPU_SANITIZER:-1}" = 0 ]; then
	echo "compute-sanitizer: left out (LOOM_GPU_SANITIZER=0)" >"$logs/memcheck_cuda_ops.log"
	printf 'memcheck_cuda_ops\toptional\tabsent\t0\t%s\t\n' "$logs/memcheck_cuda_ops.log" >>"$rows"
elif command -v compute-sanitizer >/dev/null 2>&1; then
	# --report-api-errors no: NCCL's start-up probes a kernel image for
	# every architecture it was built for and takes the "no kernel image"
	# answers as expected (8 reports inside ncclInitKernelsForDevice on an
	# H200, none from loom); loom checks every CUDA call's status itself,
	# and a failing call fails its test. Memory errors are all reported.
	row memcheck_cuda_ops sanitizer 300 "" -- compute-sanitizer --tool memcheck \
		--report-api-errors no --target-processes all --error-exitcode 86 \
		"$bin/test_cuda_ops" --verbose
	# racecheck (shared-memory hazards) is slow: the cases whose own kernels
	# share memory in a block (elementwise.cu's sums, optim.cu's fused
	# update and overflow check, the block reductions of dtype.cuh): the
	# own batch-norm kernels, and ConvNet steps with the O2 optimizer.
	row racecheck_bn sanitizer 150 "" -- compute-sanitizer --tool racecheck \
		--target-processes all --error-exitcode 86 "$bin/test_cuda_ops" --verbose \
		--filter 'cuda_ops/sync_batchnorm_one_rank'
	row racecheck_convnet sanitizer 150 "" -- compute-sanitizer --tool racecheck \
		--target-processes all --error-exitcode 86 "$bin/test_cuda_ops" --verbose \
		--filter 'cuda_convnet/o2_fp16'
else
	echo "compute-sanitizer: not on this host" >"$logs/memcheck_cuda_ops.log"
	printf 'memcheck_cuda_ops\toptional\tabsent\t0\t%s\t\n' "$logs/memcheck_cuda_ops.log" >>"$rows"
fi

finish
