#!/usr/bin/env bash
# bench/gpu/fp8.sh — issue 42's lease rows, from a bundle (bazel/gpu_bundle.sh,
# carried as .gpu-bundle), the short twin of gpu_suite.sh's fp8 section:
#   bench/gpu/fp8.sh OUT [sizes...]      sizes: 124m 350m 774m (default all)
# First test_cuda_ops' fp8 cases with LOOM_REQUIRE_GPU=1 (FP8_QDQ bit for bit
# against the CPU, the cuBLASLt FP8 product within its bound), then per size
# GPT-2 b8 T1024 at O2: --precision bf16, fp8 emulated (LOOM_CUDA_FP8_GEMM=0:
# the QDQ kernels, bf16 products), fp8 on cuBLASLt FP8 (=1) by current scaling
# (the device default) and, at 124M and 350M, by delayed scaling
# (--fp8-scaling delayed: the scales and amax histories on the device, the
# amax taken in the cast's pass; the two decide the device default), with
# fast accumulation in the forward's products (LOOM_CUDA_FP8_FAST_ACCUM=fwd)
# and with the casts' 128-bit paths (LOOM_CUDA_FP8_CAST_VEC=1); then PyTorch
# compiled (bench/torch_gpt.py --nanogpt --compile) bf16 and torchao float8
# (--float8) unless LOOM_FP8_TORCH=0. 124M is --preset gpt2; 350M and 774M
# the preset with --layers/--heads/--embd 24/16/1024 and 36/20/1280.
# Issue 42's goal: fp8 >= 1.3x loom's bf16 O2 at 350M and 774M, and >= 1.2x
# torchao's float8. Last, the accuracy rows: LOOM_FP8_VAL_STEPS (500) steps
# of bf16 and of fp8 at LOOM_FP8_VAL (124m; none: left out), their
# validation losses and the gap (the goal: within 1%). One line per run (its
# rc, seconds, last rate line); logs in OUT. LIM (default 150) bounds each
# run, LOOM_FP8_VAL_LIM (240) the accuracy rows; python: LOOM_PY or python3
# (torchao from the bundle's wheel where the host lacks it: run.sh). There:
#   LOOM_BUNDLE_ENV_ONLY=1 .gpu-bundle/run.sh bash bench/gpu/fp8.sh $OUT 124m 350m
b=.gpu-bundle/bin
d=.gpu-bundle/data
o=${1:?usage: bench/gpu/fp8.sh OUT [124m|350m|774m ...]}
shift
mkdir -p "$o"
sizes=("$@")
[ ${#sizes[@]} -eq 0 ] && sizes=(124m 350m 774m)
py=${LOOM_PY:-python3}
text=()
[ -f "$d/fortunes.txt" ] && text=(--data "$d/fortunes.txt")

. "$(dirname "$0")/lease_gate.sh"
r() { # name command...: one run, one summary line (lease_gate: the lease's filters)
	local n=$1 t0=$(date +%s) rc lim
	shift
	lease_gate "$n" "${LIM:-150}" || return 0
	timeout -k 5 "$lim" "$@" >"$o/$n.log" 2>&1
	rc=$?
	echo "== $n rc=$rc $(($(date +%s) - t0))s: $(grep -aE 'tok/s|Synthesis|needs' \
		"$o/$n.log" | tail -n 1 | cut -c1-160)"
}

LIM=180 r test_cuda_ops_fp8 env LOOM_REQUIRE_GPU=1 $b/test_cuda_ops --verbose \
	--filter 'cuda_ops/fp8_*'
grep -a "FAIL\|Assertion\|^\[----\]   [a-z]" "$o/test_cuda_ops_fp8.log" | head -20
shape_of() { # size -> shape (gpt_ddp's flags over --preset gpt2), tshape (torch_gpt.py's)
	case $1 in
	124m) shape=() tshape=(--layers 12 --heads 12 --embd 768) ;;
	350m) shape=(--layers 24 --heads 16 --embd 1024) tshape=("${shape[@]}") ;;
	774m) shape=(--layers 36 --heads 20 --embd 1280) tshape=("${shape[@]}") ;;
	*) echo "fp8.sh: unknown size '$1' (124m, 350m, 774m)" >&2; exit 2 ;;
	esac
}
for size in "${sizes[@]}" "${LOOM_FP8_VAL:-124m}"; do
	[ "$size" = none ] || shape_of "$size"
done
for size in "${sizes[@]}"; do
	shape_of "$size"
	g=($b/gpt_ddp --device cuda "${text[@]}" --preset gpt2 "${shape[@]}" --opt-level O2
		--batch-size 8 --max-steps 15 --log-interval 5 --val-interval 0 --sample 0
		--peak-flops 989e12)
	r "gpt2_${size}_O2_bf16" env LOOM_KERNEL_SEARCH=on "${g[@]}" --precision bf16
	r "gpt2_${size}_O2_fp8_emulated" env LOOM_KERNEL_SEARCH=on LOOM_CUDA_FP8_GEMM=0 "${g[@]}" \
		--precision fp8
	r "gpt2_${size}_O2_fp8_gemm" env LOOM_KERNEL_SEARCH=on LOOM_CUDA_FP8_GEMM=1 "${g[@]}" \
		--precision fp8 --dump-graph
	# cuBLASLt's fast accumulation in the forward's FP8 products, as
	# Transformer Engine (LOOM_CUDA_FP8_FAST_ACCUM=fwd, default off), and the
	# casts' 128-bit paths (LOOM_CUDA_FP8_CAST_VEC=1, default 0), each against
	# gpt2_${size}_O2_fp8_gemm: fast accumulation's losses differ slightly,
	# the casts' are the same bits.
	r "gpt2_${size}_O2_fp8_gemm_fastacc" env LOOM_KERNEL_SEARCH=on LOOM_CUDA_FP8_GEMM=1 \
		LOOM_CUDA_FP8_FAST_ACCUM=fwd "${g[@]}" --precision fp8
	r "gpt2_${size}_O2_fp8_gemm_cast_vec" env LOOM_KERNEL_SEARCH=on LOOM_CUDA_FP8_GEMM=1 \
		LOOM_CUDA_FP8_CAST_VEC=1 "${g[@]}" --precision fp8
	grep -a "^step +15/15" "$o/gpt2_${size}_O2_fp8_gemm.log" "$o/gpt2_${size}_O2_fp8_gemm_fastacc.log" \
		"$o/gpt2_${size}_O2_fp8_gemm_cast_vec.log" | cut -c1-160
	case $size in
	124m | 350m)
		r "gpt2_${size}_O2_fp8_gemm_delayed" env LOOM_KERNEL_SEARCH=on LOOM_CUDA_FP8_GEMM=1 \
			"${g[@]}" --precision fp8 --fp8-scaling delayed --amp-report
		# The casts' amax from the layer norm and GELU kernels, no amax pass
		# (LOOM_CUDA_FP8_AMAX_PRODUCER) against gpt2_${size}_O2_fp8_gemm.
		r "gpt2_${size}_O2_fp8_gemm_producer" env LOOM_KERNEL_SEARCH=on LOOM_CUDA_FP8_GEMM=1 \
			LOOM_CUDA_FP8_AMAX_PRODUCER=1 "${g[@]}" --precision fp8 ;;
	esac
	# How many products took cuBLASLt FP8 (their note in --dump-graph).
	echo "   cuBLASLt FP8 products: $(grep -ac 'cuBLASLt FP8' "$o/gpt2_${size}_O2_fp8_gemm.log")"
	if [ "${LOOM_FP8_TORCH:-1}" != 0 ]; then
		tg=("$py" .gpu-bundle/bench/torch_gpt.py --nanogpt --compile --device cuda "${text[@]}"
			"${tshape[@]}" --context 1024 --vocab 50257 --batch-size 8 --steps 25 --warmup 10)
		r "torch_gpt2_${size}_bf16_compiled" "${tg[@]}"
		r "torch_gpt2_${size}_float8_compiled" "${tg[@]}" --float8
	fi
done

# Issue 42's accuracy goal: after 500 steps on the same tokens (the same
# text, seed and batches), fp8's validation loss within 1% of bf16's. GPT-2
# at LOOM_FP8_VAL (124m by default; none leaves it out) b8 T1024 O2,
# LOOM_FP8_VAL_STEPS steps (500), bf16 and then fp8 on cuBLASLt FP8 at the
# device default scaling, the validation loss over 16 batches at the end.
vsize=${LOOM_FP8_VAL:-124m}
if [ "$vsize" != none ]; then
	shape_of "$vsize"
	vs=${LOOM_FP8_VAL_STEPS:-500}
	v=($b/gpt_ddp --device cuda "${text[@]}" --preset gpt2 "${shape[@]}" --opt-level O2
		--batch-size 8 --max-steps "$vs" --log-interval 100 --val-interval 0 --val-batches 16
		--sample 0 --peak-flops 989e12)
	LIM=${LOOM_FP8_VAL_LIM:-240} r "gpt2_${vsize}_O2_bf16_val$vs" env LOOM_KERNEL_SEARCH=on \
		"${v[@]}" --precision bf16
	LIM=${LOOM_FP8_VAL_LIM:-240} r "gpt2_${vsize}_O2_fp8_val$vs" env LOOM_KERNEL_SEARCH=on \
		LOOM_CUDA_FP8_GEMM=1 "${v[@]}" --precision fp8
	val() { grep -a 'validation loss' "$o/gpt2_${vsize}_O2_$1_val$vs.log" | tail -n 1 | awk '{print $NF}'; }
	bv=$(val bf16) fv=$(val fp8)
	if [ -n "$bv" ] && [ -n "$fv" ]; then
		awk -v b="$bv" -v f="$fv" -v s="$vsize" -v n="$vs" 'BEGIN {
			g = (f - b) / b * 100
			printf "   validation after %d steps, %s: bf16 %s, fp8 %s, fp8 %+.2f%% (goal: within 1%%: %s)\n",
				n, s, b, f, g, (g <= 1 && g >= -1) ? "met" : "NOT met" }'
	else
		echo "   validation after $vs steps, $vsize: no loss from ${bv:+fp8}${bv:-bf16} (see its log)"
	fi
fi
