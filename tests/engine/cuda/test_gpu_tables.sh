#!/usr/bin/env bash
# tests/engine/cuda/test_gpu_tables.sh — the GPU suite's versus table
# (gpu_versus.py) and kernel table (gpu_kernels.py, fed by gpu_kprof.sh) on
# made-up logs and Nsight Systems summaries (testdata/kern_*.csv): each
# side's figure read from its own kind of log, PyTorch's best mode picked
# per type, one MFU for all; kernels per step by the difference of a 15-
# and a 5-step run (the warm-up's kernels cancel), grouped by family, the
# top N per side; a summary without its header refused; gpu_kprof.sh with a
# stand-in nsys writes the CSV and passes the program's output through.
# args: gpu_versus.py gpu_kernels.py gpu_kprof.sh testdata/kern_loom_5.csv
set -u
versus=$1
kernels=$2
kprof=$3
td=$(dirname "${4:?usage: test_gpu_tables.sh gpu_versus.py gpu_kernels.py gpu_kprof.sh testdata/kern_loom_5.csv}")
py=$(command -v python3) || { echo "FAIL: no python3"; exit 1; }
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
failed=0
fail() {
	echo "FAIL: $*"
	failed=$((failed + 1))
}
has() { # file regex what
	grep -qE -- "$2" "$1" || fail "$3: no line like '$2'"
}

# ---- the versus table
cat >"$d/loom_gpt.log" <<'L'
step    20/40  loss 9.1000  200001 tok/s  41.0 ms/step  MFU 17.3%  lr 0.0003  grad norm 1.1
step    40/40  loss 8.5000  220445 tok/s  37.2 ms/step  MFU 19.1%  lr 0.0003  grad norm 1.0
L
cat >"$d/torch_eager.log" <<'L'
torch 2.11.0 eager nanoGPT (SDPA causal, fused AdamW, bf16 autocast, table 50304, tanh GELU) on cuda: 124475904 parameters, 30 steps (10 untimed), 45.0 ms/step, 182044 tok/s
torch cpu: 9 tok/s per CPU-second, peak RSS 3000 MiB
torch mfu: 182044 tok/s, MFU 15.7% (855.4 MFLOP per token: 6N + 12LCT, N 123689472 without the position table; peak 989.0 TFLOP/s (H100/H200 SXM bf16 dense))
L
sed 's/ eager nanoGPT/ compiled nanoGPT/; s/182044 tok/300000 tok/g' "$d/torch_eager.log" >"$d/torch_compiled.log"
{
	printf 'step    1/30 | loss 11.0 (+nanz)| norm 9.0 (+nanz)| lr 3.00e-04 | 900.00 ms | 1.0%% bf16 MFU | 9102 tok/s\n'
	for i in $(seq 2 30); do
		ms=20.00
		[ "$i" -gt 10 ] && ms=16.00
		printf 'step %4d/30 | loss 7.0 (+nanz)| norm 1.0 (+nanz)| lr 3.00e-04 | %s ms | 41.0%% bf16 MFU | 500000 tok/s\n' "$i" $ms
	done
	echo "total average iteration time: 17.0 ms"
} >"$d/llmc.log"
cat >"$d/loom_r50.log" <<'L'
step  30/30  loss 6.8000  0.03 s  2200.0 img/s on rank 0
total: 2250.30 img/s over 1 rank (global batch 64; the slowest rank's pace: 2250.30)
MFU 5.5% (24.30 GFLOP per image from the plan, 54.7 TFLOP/s achieved; peak 989000.0 GFLOP/s, --peak-flops)
L
sed 's/2250.30/1522.10/g' "$d/loom_r50.log" >"$d/loom_r50_bf16.log"
printf 'resnet50_synthetic: cuda: out of memory\n' >"$d/loom_r50_fp32.log"
cat >"$d/torch_r50.log" <<'L'
{"side": "torch 2.11.0", "model": "resnet50", "batch": 64, "mode": "amp-fp16", "device": "NVIDIA H100", "warmup": 10, "steps": 20, "layout": "channels-last", "img_per_s": 2109.5, "flop_per_img": 24299077632.0, "mfu": 5.18}
{"side": "torch 2.11.0", "model": "resnet50", "batch": 64, "mode": "amp-bf16", "device": "NVIDIA H100", "warmup": 10, "steps": 20, "layout": "channels-last", "img_per_s": 2024.6}
{"side": "torch 2.11.0", "model": "resnet50", "batch": 64, "mode": "eager-fp32", "device": "NVIDIA H100", "warmup": 10, "steps": 20, "layout": "channels-last", "img_per_s": 2268.0}
L
cat >"$d/torch_r50_c16.log" <<'L'
{"side": "torch 2.11.0", "model": "resnet50", "batch": 64, "mode": "compile-amp-fp16", "device": "NVIDIA H100", "warmup": 10, "steps": 20, "compile_mode": "reduce-overhead", "layout": "channels-last", "img_per_s": 2600.0}
L
printf 'not run: the versus section'"'"'s 480 s (LOOM_GPU_VERSUS_S) were spent\n' >"$d/torch_r50_cbf16.log"
T=$'\t'
cat >"$d/versus.tsv" <<R
gpt2_124m_b8_t1024_bf16${T}loom${T}versus_gpt2_loom_O2_bf16${T}loom_tok${T}$d/loom_gpt.log
gpt2_124m_b8_t1024_bf16${T}torch${T}versus_gpt2_torch_eager${T}torch_tok${T}$d/torch_eager.log
gpt2_124m_b8_t1024_bf16${T}llmc${T}versus_gpt2_llmc${T}llmc_tok${T}$d/llmc.log
r50_b64_fp16${T}loom${T}versus_r50_loom_O2_fp16${T}loom_img${T}$d/loom_r50.log
r50_b64_bf16${T}loom${T}versus_r50_loom_O1_bf16${T}loom_img${T}$d/loom_r50_bf16.log
r50_b64_fp32${T}loom${T}versus_r50_loom_fp32_TF32${T}loom_img${T}$d/loom_r50_fp32.log
r50_b64_fp16${T}torch${T}versus_r50_torch_eager${T}torch_img${T}$d/torch_r50.log
r50_b64_bf16${T}torch${T}versus_r50_torch_eager${T}torch_img${T}$d/torch_r50.log
r50_b64_fp32${T}torch${T}versus_r50_torch_eager${T}torch_img${T}$d/torch_r50.log
gpt2_124m_b8_t1024_bf16${T}torch${T}versus_gpt2_torch_compiled${T}torch_tok${T}$d/torch_compiled.log
r50_b64_fp16${T}torch${T}versus_r50_torch_compile_amp-fp16${T}torch_img${T}$d/torch_r50_c16.log
r50_b64_bf16${T}torch${T}versus_r50_torch_compile_amp-bf16${T}torch_img${T}$d/torch_r50_cbf16.log
r50_b64_fp32${T}torch${T}versus_r50_torch_compiled${T}torch_img${T}$d/torch_r50_c16.log
R
"$py" "$versus" "$d/versus.tsv" --device "NVIDIA H100 80GB HBM3" >"$d/vs.md" 2>&1 ||
	fail "gpu_versus.py exited $?"
cat "$d/vs.md"
# GPT-2: loom's last interval, PyTorch's best (compiled), llm.c's steps
# 11-30 at 16 ms (8192 tokens / 16 ms = 512,000), MFU at 855.4 MFLOP/token.
has "$d/vs.md" '855\.4 MFLOP per token' "the FLOP count"
has "$d/vs.md" '^\| GPT-2 124M b8 T1024 bf16 \| O2 bf16 \| 220,445 \| 19\.1% \| nanoGPT compiled \| 300,000 \| 25\.9% \| 0\.73x \| 512,000 \| 44\.3% \| 0\.43x \|$' \
	"the GPT-2 row"
has "$d/vs.md" '^\| ResNet-50 b64 fp16 \| O2 fp16 \| 2,250 \| 5\.5% \| compile-amp-fp16 \(reduce-overhead\), channels-last \| 2,600 \| 6\.4% \| 0\.87x \| n/a' \
	"the fp16 row (compiled best)"
has "$d/vs.md" '^\| ResNet-50 b64 bf16 \| O1 bf16 \| 1,522 \| 3\.7% \| amp-bf16, channels-last \| 2,025 \| 5\.0% \| 0\.75x' \
	"the bf16 row (the compiled run out of time: eager best)"
# TF32's peak (494.5) for fp32: 2268 * 24.299e9 / 494.5e12 = 11.1%.
has "$d/vs.md" '^\| ResNet-50 b64 fp32 \(TF32\) \| - \| - \| - \| eager-fp32, channels-last \| 2,268 \| 11\.1% \| - \|' \
	"the fp32 row (loom failed)"
has "$d/vs.md" '\| loom \| versus_r50_loom_fp32_TF32 \| - \| - \| resnet50_synthetic: cuda: out of memory \|' \
	"a failed run's last line"
has "$d/vs.md" '\| torch \| versus_r50_torch_compile_amp-bf16 \| - \| - \| not run: the versus section' \
	"a run the time left out"
has "$d/vs.md" '\| llmc \| train_gpt2cu steps 11-30 \| 512,000 \|' "llm.c's steps"
# The compiled modes' process cut after fp16: fp32's row says so.
has "$d/vs.md" '\| torch \| versus_r50_torch_compiled \| - \| - \| no fp32 mode finished; last line: \{' \
	"a type the compiled process did not reach"
[ "$(grep -c '^| ResNet-50 b64 bf16 | torch' "$d/vs.md")" -eq 2 ] ||
	fail "bf16's PyTorch runs: want amp-bf16 and the missing compiled one"
"$py" "$versus" "$d/nothing.tsv" >"$d/none.md" 2>&1 || fail "a missing TSV is not exit 0"
has "$d/none.md" 'the versus section did not run' "a missing TSV"

# ---- the kernel table
"$py" "$kernels" --side loom "$td/kern_loom_15.csv" 15 "$td/kern_loom_5.csv" 5 \
	--side llm.c "$td/kern_llmc_15.csv" 15 >"$d/k.md" 2>&1 || fail "gpu_kernels.py exited $?"
cat "$d/k.md"
# loom: 28.65 ms a step once the 5-step run is taken off; the kernel search's
# candidates (start-up only) cancel and are not listed.
has "$d/k.md" '^\| \*\*total\*\* \| 13 kernels \| \*\*28\.650\*\* \| 387 \| 16 kernels \| \*\*17\.133\*\* \| 251 \|$' \
	"the totals"
grep -q 'search_candidate' "$d/k.md" && fail "a start-up kernel is listed"
has "$d/k.md" '^\| \*\*matmul\*\* \| 2 kernels \| \*\*18\.000\*\* \| 147 \| 3 kernels \| \*\*10\.033\*\* \| 147 \|$' \
	"matmul's totals"
has "$d/k.md" '^\| \| `loom_opt_update_kernel` \| 2\.000 \| 1\.0 \| `adamw_kernel3` \| 1\.100 \| 1\.0 \|$' \
	"the optimizers side by side, llm.c's argument list cut"
has "$d/k.md" '`loom_unary_gelu_kernel`' "GELU under gelu"
has "$d/k.md" '^\| \| .* \| `wte_backward_kernel<256>` \|' "the embedding's backward under embedding"
has "$d/k.md" 'llm.c 15 steps / 15, start-up included' "the one-run method said"
for f in matmul layernorm attention gelu adamw embedding other; do
	has "$d/k.md" "^\\| \\*\\*$f\\*\\* \\|" "family $f"
done
"$py" "$kernels" --side loom "$td/kern_loom_15.csv" 15 "$td/kern_loom_5.csv" 5 --top 3 >"$d/k3.md" 2>&1
[ "$(grep -c '^| | `' "$d/k3.md")" -eq 3 ] || fail "--top 3 lists $(grep -c '^| | `' "$d/k3.md") kernels"
printf 'no summary here\n' >"$d/bad.csv"
if "$py" "$kernels" --side x "$d/bad.csv" 3 >"$d/bad.out" 2>&1; then
	fail "a file without the header is taken"
fi
has "$d/bad.out" 'no kernel summary header' "the refusal's reason"

# ---- gpu_kprof.sh with a stand-in nsys
cat >"$d/nsys" <<N
#!/usr/bin/env bash
case \$1 in
--version) echo "stand-in nsys" ;;
profile) while [ \$# -gt 0 ] && [ "\$1" != -o ]; do shift; done; o=\$2; shift 2
	"\$@"; rc=\$?; : >"\$o.nsys-rep"; exit \$rc ;;
stats) printf 'Processing [x.sqlite] with [cuda_gpu_kern_sum.py]...\n'; cat "$td/kern_loom_5.csv" ;;
esac
N
chmod +x "$d/nsys"
[ "$(NSYS=$d/nsys bash "$kprof" --which)" = "$d/nsys" ] || fail "gpu_kprof.sh --which does not take \$NSYS"
NSYS=$d/nsys bash "$kprof" "$d/p/run" -- echo "step 5/5  123 tok/s" >"$d/kp.out" 2>&1 ||
	fail "gpu_kprof.sh exited $?"
has "$d/kp.out" '123 tok/s' "the program's output through gpu_kprof.sh"
has "$d/p/run.csv" '^Time \(%\),Total Time \(ns\)' "the CSV gpu_kprof.sh writes"
NSYS=$d/nsys bash "$kprof" "$d/p/fails" -- false >/dev/null 2>&1 && fail "a failing program's status is lost"

echo "$failed failed"
[ $failed -eq 0 ]
