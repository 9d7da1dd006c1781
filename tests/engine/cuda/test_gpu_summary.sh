#!/usr/bin/env bash
# tests/engine/cuda/test_gpu_summary.sh — the GPU suite's verdicts
# (gpu_summary.sh) on made-up logs: a Criterion run with a skipped case
# FAILs though it exited 0, as do a failing case, a missing synthesis, a
# sanitizer error, a low or missing accuracy, a timeout and a step the
# budget left out; clean logs PASS; a missing PyTorch is N/A.
# Then the speed table (gpu_speed.sh) on made-up logs of each kind: loom's
# and PyTorch's images/s (one line per PyTorch mode), tokens/s with MFU, and
# "-" with the log's last line where a run gave no figure.
# args: gpu_summary.sh gpu_speed.sh
set -u
summary=$1
speed_sh=${2:?usage: test_gpu_summary.sh gpu_summary.sh gpu_speed.sh}
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
failed=0
fail() {
	echo "FAIL: $*"
	failed=$((failed + 1))
}

cat >"$d/clean.log" <<'L'
[----] tests/engine/cuda/test_cuda_ops.c:1: device 0: NVIDIA H100 (sm_90, 79.1 GiB)
[PASS] cuda_ops::table: (12.00s)
[====] Synthesis: Tested: 17 | Passing: 17 | Failing: 0 | Crashing: 0
L
cat >"$d/skip.log" <<'L'
[SKIP] cuda_ops::table: needs a CUDA device: none is usable: cuInit: CUDA_ERROR_NO_DEVICE
[PASS] cuda_device::name_rejects_bad_buffer: (0.00s)
[====] Synthesis: Tested: 16 | Passing: 16 | Failing: 0 | Crashing: 0
L
cat >"$d/failing.log" <<'L'
[----] tests/engine/cuda/test_cuda_ops.c:1057: Assertion Failed
[----]   needs a CUDA device (LOOM_REQUIRE_GPU=1): none is usable: cuInit: CUDA_ERROR_NO_DEVICE
[----]   
[FAIL] cuda_ops::table: (3.00s)
[====] Synthesis: Tested: 17 | Passing: 16 | Failing: 1 | Crashing: 0
L
printf '[PASS] a::b: (0.00s)\n' >"$d/nosyn.log"
cat >"$d/filtered.log" <<'L'
[SKIP] cuda_ops::table: Test is disabled
[PASS] cuda_nccl::env_world1_collectives: (2.00s)
[====] Synthesis: Tested: 1 | Passing: 1 | Failing: 0 | Crashing: 0
L
cat >"$d/san_ok.log" <<'L'
========= COMPUTE-SANITIZER
[====] Synthesis: Tested: 17 | Passing: 17 | Failing: 0 | Crashing: 0
========= ERROR SUMMARY: 0 errors
L
cat >"$d/san_bad.log" <<'L'
========= Invalid __global__ read of size 4 bytes
[====] Synthesis: Tested: 17 | Passing: 17 | Failing: 0 | Crashing: 0
========= ERROR SUMMARY: 3 errors
L
cat >"$d/race_ok.log" <<'L'
[PASS] cuda_convnet::o2_fp16: (2.01s)
[====] Synthesis: Tested: 1 | Passing: 1 | Failing: 0 | Crashing: 0
========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)
L
sed 's/0 hazards displayed (0 errors, 0 warnings)/2 hazards displayed (1 errors, 1 warnings)/' \
	"$d/race_ok.log" >"$d/race_bad.log"
printf 'step    20/20  loss 3.19  49744 tok/s  164.7 ms/step  MFU 40.1%%\n' >"$d/gpt_ok.log"
cat >"$d/train_ok.log" <<'L'
epoch 1 step   600/600  loss 0.4  acc 86.0%  51234.5 img/s  ETA 0s  batch 100
epoch 1 done: test loss 0.3690, test accuracy 86.93%, train 1.2 s
L
sed 's/86.93%/41.00%/' "$d/train_ok.log" >"$d/train_low.log"
printf 'mnist_ddp: device cuda: no CUDA device is available\n' >"$d/train_none.log"
printf '| O0 f32  | cuda   |    51234 |    50000 |\n' >"$d/bench_ok.log"
printf 'bench_convnet: cuda: out of memory\n' >"$d/bench_bad.log"
printf 'no python3 with CUDA PyTorch on this host\n' >"$d/torch.log"
: >"$d/empty.log"

# expect name verdict: the row's verdict in the table
verdict_of() { awk -v n="$1" '$1 == n { print $2 }' "$d/out"; }
check() { # rows-file expected-exit, then name=verdict pairs
	local rows=$1 want_rc=$2 rc
	shift 2
	bash "$summary" "$rows" >"$d/out" 2>&1
	rc=$?
	[ $rc -eq "$want_rc" ] || fail "$rows: exit $rc, want $want_rc"
	for p in "$@"; do
		local n=${p%%=*} v=${p#*=} got
		got=$(verdict_of "$n")
		[ "$got" = "$v" ] || fail "$n: verdict '$got', want '$v'"
	done
}

T=$'\t'
cat >"$d/rows_good" <<R
versions${T}info${T}0${T}0${T}$d/clean.log${T}
test_cuda_ops${T}criterion${T}0${T}12.0${T}$d/clean.log${T}
nccl_env_world1${T}criterion${T}0${T}2.0${T}$d/filtered.log${T}
memcheck${T}sanitizer${T}0${T}80.0${T}$d/san_ok.log${T}
racecheck${T}sanitizer${T}0${T}8.0${T}$d/race_ok.log${T}
gpt_ddp_O0${T}bench${T}0${T}3.0${T}$d/gpt_ok.log${T}
mnist_ddp_O0${T}train${T}0${T}20.0${T}$d/train_ok.log${T}80
bench_convnet${T}bench${T}0${T}5.0${T}$d/bench_ok.log${T}
torch${T}optional${T}absent${T}0${T}$d/torch.log${T}
R
check "$d/rows_good" 0 versions=PASS test_cuda_ops=PASS nccl_env_world1=PASS memcheck=PASS \
	racecheck=PASS gpt_ddp_O0=PASS mnist_ddp_O0=PASS \
	bench_convnet=PASS torch=N/A
grep -q 'verdict: PASS' "$d/out" || fail "no overall PASS line"
grep -q 'test accuracy 86.93% (minimum 80%)' "$d/out" || fail "the accuracy is not in the table"

# The case the bundle exists for: exit 0, everything skipped or one skip.
cat >"$d/rows_skip" <<R
test_cuda_ops${T}criterion${T}0${T}1.0${T}$d/skip.log${T}
R
check "$d/rows_skip" 1 test_cuda_ops=FAIL
grep -q 'skipped 1' "$d/out" || fail "the skip count is not in the table"
grep -q 'CUDA_ERROR_NO_DEVICE' "$d/out" || fail "the first skip's reason is not in the table"
cat "$d/out"

cat >"$d/rows_bad" <<R
failing${T}criterion${T}1${T}3.0${T}$d/failing.log${T}
nosyn${T}criterion${T}0${T}1.0${T}$d/nosyn.log${T}
san_bad${T}sanitizer${T}0${T}1.0${T}$d/san_bad.log${T}
san_nosummary${T}sanitizer${T}0${T}1.0${T}$d/clean.log${T}
race_bad${T}sanitizer${T}0${T}1.0${T}$d/race_bad.log${T}
train_low${T}train${T}0${T}1.0${T}$d/train_low.log${T}80
train_none${T}train${T}1${T}1.0${T}$d/train_none.log${T}80
bench_bad${T}bench${T}1${T}1.0${T}$d/bench_bad.log${T}
slow${T}criterion${T}124${T}300.0${T}$d/clean.log${T}
late${T}bench${T}budget${T}0${T}$d/empty.log${T}
gone${T}criterion${T}absent${T}0${T}$d/empty.log${T}
R
check "$d/rows_bad" 1 failing=FAIL nosyn=FAIL san_bad=FAIL san_nosummary=FAIL race_bad=FAIL train_low=FAIL \
	train_none=FAIL bench_bad=FAIL slow=FAIL late=FAIL gone=FAIL
grep -q 'verdict: FAIL (11 row(s))' "$d/out" || fail "overall line: $(tail -n 1 "$d/out")"
grep -q 'failing .*first failure: needs a CUDA device (LOOM_REQUIRE_GPU=1): none is usable: cuInit' "$d/out" ||
	fail "a failed case's message is not in the table"
grep -q 'train_none .*last line: mnist_ddp: device cuda: no CUDA device' "$d/out" ||
	fail "a failed run's reason is not in the table"

# ---- the speed table
cat >"$d/r50.log" <<'L'
step   1/10 (warm-up)  loss 6.9100  3.10 s  20.6 img/s on rank 0
step  10/10  loss 6.8000  0.08 s  800.0 img/s on rank 0
rank 0: 812.34 img/s (batch 64, 8 steps)
total: 812.34 img/s over 1 rank (global batch 64; the slowest rank's pace: 812.34)
MFU 12.5% (12.30 GFLOP per image from the plan, 9991.8 GFLOP/s achieved; peak 79934.4 GFLOP/s, a 8192^3 loom matmul, measured)
L
cat >"$d/convnet.log" <<'L'
| level   | device | img/s (median step) | img/s (mean) | params MiB | master MiB | grads MiB | optim MiB | activations MiB | last loss | img/s per CPU-s | MFLOP/img | GFLOP/s (median step) | MFU % |
| ------- | ------ | -------- | -------- | --------- | --------- | --------- | --------- | ----------- | -------- | -------- | ------- | ------ | ----- |
| O0      | cuda   |   176000 |   170000 |     0.111 |     0.000 |     0.111 |     0.111 |      18.542 |   0.0265 |     2339 |   16.40 | 2886.40 |  4.81 |
| O2 fp16 | cuda   |   190000 |   185000 |     0.111 |     0.000 |     0.111 |     0.111 |      19.291 |   0.0265 |     1905 |   16.40 | 3116.00 |  0.52 |

O0: input fixed, loom_set_input, 314000 bytes a step copied by the host
L
cat >"$d/r50_crash.log" <<'L'
step   1/10 (warm-up)  loss 6.9100  3.10 s  20.6 img/s on rank 0
resnet50_synthetic: step 2: cuda conv: an illegal memory access
L
cat >"$d/torch_r50.log" <<'L'
{"side": "torch 2.11.0", "model": "resnet50", "batch": 64, "mode": "eager-fp32", "device": "NVIDIA H100", "layout": "nchw", "img_per_s": 1500.25, "peak_bytes": 1000}
torch resnet50 b64 eager-fp32: 1500 img/s, peak 1 MiB
{"side": "torch 2.11.0", "model": "resnet50", "batch": 64, "mode": "amp-bf16", "device": "NVIDIA H100", "layout": "nchw", "img_per_s": 2999.5, "peak_bytes": 1000}
{"side": "torch 2.11.0", "model": "resnet50", "batch": 64, "mode": "compile-fp16", "device": "NVIDIA H100", "layout": "nchw", "skipped": "torch.compile is not in this torch"}
L
cat >"$d/gpt.log" <<'L'
step     4/12  loss 10.9000  20000 tok/s  400.0 ms/step  MFU 8.0%  lr 0.0003  grad norm 1.2
step     8/12  loss 10.1000  50001 tok/s  163.8 ms/step  MFU 20.1%  lr 0.0003  grad norm 1.1
step    12/12  loss 9.5000  50123 tok/s  163.4 ms/step  MFU 21.5%  lr 0.0003  grad norm 1.0
L
cat >"$d/torch_gpt.log" <<'L'
torch 2.11.0 eager bf16 autocast on cuda: 124439808 parameters, 12 steps, 74.1 ms/step, 110534 tok/s
torch cpu: 99 tok/s per CPU-second, peak RSS 2000 MiB
L
cat >"$d/torch_nanogpt.log" <<'L'
torch 2.11.0 compiled nanoGPT (SDPA causal, fused AdamW, bf16 autocast, table 50304, tanh GELU) on cuda: 124475904 parameters, 30 steps (10 untimed), 30.0 ms/step, 273066 tok/s
torch cpu: 99 tok/s per CPU-second, peak RSS 2000 MiB
torch mfu: 273066 tok/s, MFU 23.6% (855.4 MFLOP per token: 6N + 12LCT, N 123689472 without the position table; peak 989.0 TFLOP/s (H100/H200 SXM bf16 dense))
L
cat >"$d/llmc.log" <<'L'
step   19/20 | loss 7.213210 (+nanz)| norm 1.2345 (+nanz)| lr 3.00e-04 | 45.10 ms | 40.1% bf16 MFU | 181000 tok/s
step   20/20 | loss 7.113210 (+nanz)| norm 1.1345 (+nanz)| lr 3.00e-04 | 45.00 ms | 40.3% bf16 MFU | 181234 tok/s
val loss 7.1
L
cat >"$d/speed" <<R
speed_r50_fp32${T}loom_img${T}$d/r50.log
speed_r50_crash${T}loom_img${T}$d/r50_crash.log
speed_torch_r50_nchw${T}torch_img${T}$d/torch_r50.log
speed_gpt2${T}loom_tok${T}$d/gpt.log
speed_torch_gpt2${T}torch_tok${T}$d/torch_gpt.log
speed_torch_nanogpt${T}torch_tok${T}$d/torch_nanogpt.log
speed_gone${T}loom_img${T}$d/never_written.log
speed_llmc${T}llmc_tok${T}$d/llmc.log
speed_convnet${T}loom_table${T}$d/convnet.log
R
bash "$speed_sh" "$d/speed" >"$d/speed_out" 2>&1 || fail "gpu_speed.sh exited $?"
cat "$d/speed_out"
sp() { # label regex: the table's line for label matches regex
	grep -qE "^$1 +$2" "$d/speed_out" || fail "speed table: $1 does not match '$2'"
}
sp speed_r50_fp32 '812\.34 img/s +12\.5% *$'
sp 'speed_convnet O0' '176000 img/s +4\.81% +median step'
sp 'speed_convnet O2 fp16' '190000 img/s +0\.52% +median step'
sp speed_r50_crash '- img/s +- +resnet50_synthetic: step 2: cuda conv'
sp 'speed_torch_r50_nchw eager-fp32' '1500\.2 img/s'
sp 'speed_torch_r50_nchw amp-bf16' '2999\.5 img/s'
sp 'speed_torch_r50_nchw compile-fp16' '- img/s +- +torch.compile is not in this torch'
sp speed_gpt2 '50123 tok/s +21\.5% +last logged step'
sp speed_torch_gpt2 '110534 tok/s +- *$'
sp speed_torch_nanogpt '273066 tok/s +23\.6% *$'
sp speed_gone '- +- +- +no log'
sp speed_llmc '181234 tok/s +40\.3% +llm.c'
[ "$(grep -c . "$d/speed_out")" -eq 14 ] || fail "speed table: $(grep -c . "$d/speed_out") lines, want 14"

echo "$failed failed"
[ $failed -eq 0 ]
