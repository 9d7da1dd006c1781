#!/usr/bin/env bash
b=.gpu-bundle/bin; o=$1; mkdir -p $o; d=.gpu-bundle/data
. "$(dirname "$0")/lease_gate.sh"
r() { local n=$1 lim; shift; lease_gate $n ${LIM:-60} || return 0; local t0=$(date +%s); timeout -k 3 $lim "$@" > $o/$n.log 2>&1; local rc=$?; echo "== $n rc=$rc $(( $(date +%s) - t0 ))s: $(grep -aE 'total: .*img/s|^step +20/20|^step +12/12|Synthesis|SUMMARY|accuracy|tok/s' $o/$n.log | tail -1 | cut -c1-150)"; }
LIM=120 r test_cuda_ops env LOOM_REQUIRE_GPU=1 $b/test_cuda_ops --verbose
grep -a "FAIL\|Assertion\|^\[----\]   [a-z]" $o/test_cuda_ops.log | grep -v "^\[----\]   $" | head -30
# In order of what the next lease must decide first (the run may be cut by
# its time limit): GPT-2 and llm.c, the GPT switches, then world 2 on one
# GPU, ResNet-50, the rest.
G="--device cuda --data $d/fortunes.txt --preset gpt2 --precision bf16 --batch-size 8 --max-steps 20 --log-interval 5 --val-interval 0 --sample 0"
r gpt_O2 $b/gpt_ddp $G --opt-level O2
r llmc $b/train_gpt2cu -e d12 -b 8 -t 1024 -x 20 -v 1000 -s 1000 -m 2 -r 0 -i .gpu-bundle/llmc/train.bin -j .gpu-bundle/llmc/val.bin
r gpt_O1 $b/gpt_ddp $G --opt-level O1
r gpt_O1_nograph $b/gpt_ddp $G --opt-level O1 --no-cuda-graph
r gpt_O2_lt_off env LOOM_CUDA_BGRAD_EPILOGUE=1 LOOM_CUDA_LT_ALIGN=0 LOOM_CUDA_LT_PAD=0 LOOM_INPLACE_DY=0 $b/gpt_ddp $G --opt-level O2
r gpt_O2_lt_on env LOOM_CUDA_BGRAD_EPILOGUE=0 LOOM_CUDA_LT_ALIGN=1 LOOM_CUDA_LT_PAD=1 LOOM_INPLACE_DY=1 $b/gpt_ddp $G --opt-level O2
# Issue 41 item 3's kernels against gpt_O2 (every switch at its default):
# each alone, then all three (engine/cuda/README.md's switch table).
r gpt_O2_ln_bwd_warp env LOOM_CUDA_LN_BWD=warp $b/gpt_ddp $G --opt-level O2
r gpt_O2_adamw_f32 env LOOM_CUDA_ADAMW=f32 $b/gpt_ddp $G --opt-level O2
r gpt_O2_bgrad_kernel env LOOM_CUDA_BGRAD=kernel $b/gpt_ddp $G --opt-level O2
r gpt_O2_gk_all env LOOM_CUDA_LN_BWD=warp LOOM_CUDA_ADAMW=f32 LOOM_CUDA_BGRAD=kernel $b/gpt_ddp $G --opt-level O2
# The residual add with its layer norm in one kernel (layernorm.cu), off and on
# side by side (default off: not yet run on a GPU); the same losses.
r gpt_O2_ln_residual0 env LOOM_CUDA_LN_RESIDUAL=0 $b/gpt_ddp $G --opt-level O2
r gpt_O2_ln_residual1 env LOOM_CUDA_LN_RESIDUAL=1 $b/gpt_ddp $G --opt-level O2
grep -a "^step +20/20" $o/gpt_O2_ln_residual0.log $o/gpt_O2_ln_residual1.log | cut -c1-160
# FP8 casts taking their amax from the layer norm and GELU kernels that write
# their tensors (LOOM_CUDA_FP8_AMAX_PRODUCER, default 0: the cast's own amax
# pass), on cuBLASLt FP8, current and delayed scaling; the same losses.
F="--device cuda --data $d/fortunes.txt --preset gpt2 --precision fp8 --opt-level O2 --batch-size 8 --max-steps 20 --log-interval 5 --val-interval 0 --sample 0"
r gpt_O2_fp8_amax_pass env LOOM_CUDA_FP8_GEMM=1 LOOM_CUDA_FP8_AMAX_PRODUCER=0 $b/gpt_ddp $F
r gpt_O2_fp8_amax_producer env LOOM_CUDA_FP8_GEMM=1 LOOM_CUDA_FP8_AMAX_PRODUCER=1 $b/gpt_ddp $F --dump-graph
r gpt_O2_fp8_delayed_amax_pass env LOOM_CUDA_FP8_GEMM=1 LOOM_CUDA_FP8_AMAX_PRODUCER=0 $b/gpt_ddp $F --fp8-scaling delayed
r gpt_O2_fp8_delayed_amax_producer env LOOM_CUDA_FP8_GEMM=1 LOOM_CUDA_FP8_AMAX_PRODUCER=1 $b/gpt_ddp $F --fp8-scaling delayed
grep -a "^step +20/20" $o/gpt_O2_fp8_*amax_*.log | cut -c1-160
echo "   casts with the producer's amax: $(grep -ac 'amax by its producer' $o/gpt_O2_fp8_amax_producer.log)"
# cuBLASLt's fast accumulation in the forward's FP8 products, as Transformer
# Engine (LOOM_CUDA_FP8_FAST_ACCUM=fwd; default off: not yet run on a GPU),
# beside gpt_O2_fp8_amax_pass; the losses differ slightly (not bit-equal).
# And the casts' 128-bit loads and stores (LOOM_CUDA_FP8_CAST_VEC=1, default
# 0): the same losses as gpt_O2_fp8_amax_pass, bit for bit.
r gpt_O2_fp8_fastacc env LOOM_CUDA_FP8_GEMM=1 LOOM_CUDA_FP8_AMAX_PRODUCER=0 LOOM_CUDA_FP8_FAST_ACCUM=fwd $b/gpt_ddp $F --dump-graph
r gpt_O2_fp8_cast_vec env LOOM_CUDA_FP8_GEMM=1 LOOM_CUDA_FP8_AMAX_PRODUCER=0 LOOM_CUDA_FP8_CAST_VEC=1 $b/gpt_ddp $F
grep -a "^step +20/20" $o/gpt_O2_fp8_amax_pass.log $o/gpt_O2_fp8_fastacc.log $o/gpt_O2_fp8_cast_vec.log | cut -c1-160
echo "   FP8 products with fast accumulation: $(grep -ac 'cuBLASLt FP8.*fast accumulation' $o/gpt_O2_fp8_fastacc.log) of $(grep -ac 'cuBLASLt FP8' $o/gpt_O2_fp8_fastacc.log)"
# The same with the layer norm's dx summed into the residual's gradient in its
# kernel (LOOM_CUDA_LN_BWD_ACCUM=1), so that the E5M2 casts of the attention
# and MLP projections' output gradients take the sum's amax from it too (with
# the GELU backward's: issue 42 item 2's backward casts); the same losses.
r gpt_O2_fp8_amax_pass_ln_accum env LOOM_CUDA_FP8_GEMM=1 LOOM_CUDA_FP8_AMAX_PRODUCER=0 LOOM_CUDA_LN_BWD_ACCUM=1 $b/gpt_ddp $F
r gpt_O2_fp8_amax_producer_ln_accum env LOOM_CUDA_FP8_GEMM=1 LOOM_CUDA_FP8_AMAX_PRODUCER=1 LOOM_CUDA_LN_BWD_ACCUM=1 $b/gpt_ddp $F --dump-graph
grep -a "^step +20/20" $o/gpt_O2_fp8_amax_*ln_accum.log | cut -c1-160
echo "   casts with the producer's amax: $(grep -ac 'amax by its producer' $o/gpt_O2_fp8_amax_producer_ln_accum.log) (of them the backward's: $(grep -ac "amax by its producer.*\(backward\|dx\)" $o/gpt_O2_fp8_amax_producer_ln_accum.log))"
# The weights' FP8 casts taking their amax from the optimizer that wrote them
# (LOOM_CUDA_FP8_AMAX_OPTIM, default 0: each weight cast's own amax pass; the
# first step takes the pass), on cuBLASLt FP8, current scaling; the same
# losses, and how many casts say so.
r gpt_O2_fp8_amax_optim0 env LOOM_CUDA_FP8_GEMM=1 LOOM_CUDA_FP8_AMAX_OPTIM=0 $b/gpt_ddp $F
r gpt_O2_fp8_amax_optim1 env LOOM_CUDA_FP8_GEMM=1 LOOM_CUDA_FP8_AMAX_OPTIM=1 $b/gpt_ddp $F --dump-graph
grep -a "^step +20/20" $o/gpt_O2_fp8_amax_optim0.log $o/gpt_O2_fp8_amax_optim1.log | cut -c1-160
echo "   casts with the optimizer's amax: $(grep -ac 'amax by the optimizer' $o/gpt_O2_fp8_amax_optim1.log)"
# --amp-report under current scaling (the device default: the casts record
# each tensor's amax, scale and saturated count on the device, issue 42
# item 6): a row per scaled tensor with its amax, the losses and tok/s
# gpt_O2_fp8_amax_pass's (the step computes the same; the report syncs at the
# log lines only).
r gpt_O2_fp8_amp_report env LOOM_CUDA_FP8_GEMM=1 $b/gpt_ddp $F --amp-report
grep -a "^step +20/20" $o/gpt_O2_fp8_amax_pass.log $o/gpt_O2_fp8_amp_report.log | cut -c1-160
grep -a "^amp: fp8" $o/gpt_O2_fp8_amp_report.log | tail -1; grep -aE "^  [0-9]+ " $o/gpt_O2_fp8_amp_report.log | tail -4
# Layer norm's dx added into the residual's gradient in its own pass, no add
# kernel (layernorm.cu, LOOM_CUDA_LN_BWD_ACCUM), off and on side by side, on
# the default backward and the warp one (default off: not yet run on a GPU);
# the same losses.
r gpt_O2_ln_bwd_accum0 env LOOM_CUDA_LN_BWD_ACCUM=0 $b/gpt_ddp $G --opt-level O2
r gpt_O2_ln_bwd_accum1 env LOOM_CUDA_LN_BWD_ACCUM=1 $b/gpt_ddp $G --opt-level O2
r gpt_O2_ln_bwd_accum1_warp env LOOM_CUDA_LN_BWD_ACCUM=1 LOOM_CUDA_LN_BWD=warp $b/gpt_ddp $G --opt-level O2
grep -a "^step +20/20" $o/gpt_O2_ln_bwd_accum0.log $o/gpt_O2_ln_bwd_accum1.log $o/gpt_O2_ln_bwd_accum1_warp.log | cut -c1-160
# The embedding's gradient added into the tied table's other gradient (the
# classifier's dW, which the memory plan places in the gradient's bytes): no
# [50304, 768] add kernel and no embedding-gradient buffer (embedding.cu,
# LOOM_CUDA_EMB_BWD_ACCUM), off and on side by side (default off: not yet run
# on a GPU); the same losses.
r gpt_O2_emb_bwd_accum0 env LOOM_CUDA_EMB_BWD_ACCUM=0 $b/gpt_ddp $G --opt-level O2
r gpt_O2_emb_bwd_accum1 env LOOM_CUDA_EMB_BWD_ACCUM=1 $b/gpt_ddp $G --opt-level O2
grep -a "^step +20/20" $o/gpt_O2_emb_bwd_accum0.log $o/gpt_O2_emb_bwd_accum1.log | cut -c1-160
# The padded vocabulary (engine/vocab_pad.c: 50257 -> 50304; the CUDA backend's
# default, so gpt_O1 and gpt_O2 run padded), off and on side by side.
r gpt_O1_vpad0 env LOOM_VOCAB_PAD=0 $b/gpt_ddp $G --opt-level O1
r gpt_O1_vpad128 env LOOM_VOCAB_PAD=128 $b/gpt_ddp $G --opt-level O1
r gpt_O2_vpad0 env LOOM_VOCAB_PAD=0 $b/gpt_ddp $G --opt-level O2
r gpt_O2_vpad128 env LOOM_VOCAB_PAD=128 $b/gpt_ddp $G --opt-level O2
grep -a "vocab_pad\|padded" $o/gpt_O1_vpad128.log | head -3
# Activations made again in the backward (graph/recompute.c): level 2 against
# none, the same losses, the planned activations on the model line.
r gpt_O1_recompute2 $b/gpt_ddp $G --opt-level O1 --recompute 2
grep -a "^model:" $o/gpt_O1.log $o/gpt_O1_recompute2.log | cut -c1-240
# Data parallelism at world 2 on one GPU (issue 41 item 6): the buckets staged
# through host buffers over MPI, the test loss against world 1 at the same
# global batch (tests/engine/cuda/gpu_ddp_shared.sh; OK or WRONG).
LIM=150 r ddp_shared_gpu bash .gpu-bundle/gpu_ddp_shared.sh $b --data $d
grep -aE " OK | WRONG|ERROR|staged through host" $o/ddp_shared_gpu.log | head -4
R="--device cuda --batch-size 64 --steps 10 --warmup 2"
r r50_O2 $b/resnet50_synthetic $R --opt-level O2
r r50_O2_nograph $b/resnet50_synthetic $R --opt-level O2 --no-cuda-graph
r r50_O1bf16 $b/resnet50_synthetic $R --opt-level O1 --precision bf16
r r50_fp32 $b/resnet50_synthetic $R
r r50_O2_nhwc_bn_bwd_ex env LOOM_CUDA_NHWC=half $b/resnet50_synthetic $R --opt-level O2
r r50_O2_nhwc_bn_bwd_legacy env LOOM_CUDA_NHWC=half LOOM_CUDA_BN_BWD_EX=0 $b/resnet50_synthetic $R --opt-level O2
# The undecided switches engine/cuda/README.md's table names these rows for:
# each off against its reference row (NHWC ones against r50_O2_nhwc_bn_bwd_ex,
# the relu backward on the own split kernels at O2 bf16, the 128-bit loads
# against r50_O2).
r r50_O2_nhwc_bn_bwd_nofuse env LOOM_CUDA_NHWC=half LOOM_CUDA_BN_BWD_FUSE=0 $b/resnet50_synthetic $R --opt-level O2
r r50_O2_nhwc_krsc_off env LOOM_CUDA_NHWC=half LOOM_CUDA_CONV_KRSC=0 $b/resnet50_synthetic $R --opt-level O2
r r50_O2_nhwc_pool_nchw env LOOM_CUDA_NHWC=half LOOM_CUDA_POOL_NHWC=0 $b/resnet50_synthetic $R --opt-level O2
r r50_O2bf16 $b/resnet50_synthetic $R --opt-level O2 --precision bf16
r r50_O2bf16_bn_relu_bwd_off env LOOM_CUDA_BN_RELU_BWD=0 $b/resnet50_synthetic $R --opt-level O2 --precision bf16
r r50_O2_vec_off env LOOM_CUDA_VEC=0 $b/resnet50_synthetic $R --opt-level O2
# bf16 batch norm on cuDNN (LOOM_CUDA_BN_BF16_CUDNN, default 0: the own
# kernels) at O2 and at O1 with --bn-half (batch norm in bf16, as autocast),
# 0 against 1 side by side; --bn-half itself against O1's default fp32
# batch norm: r50_O1bf16_bn_half_* against r50_O1bf16, r50_O1_bn_half
# against r50_O1 (fp16, batch norm on cuDNN either way).
r r50_O2bf16_bn_cudnn0 env LOOM_CUDA_BN_BF16_CUDNN=0 $b/resnet50_synthetic $R --opt-level O2 --precision bf16
r r50_O2bf16_bn_cudnn1 env LOOM_CUDA_BN_BF16_CUDNN=1 $b/resnet50_synthetic $R --opt-level O2 --precision bf16
r r50_O1bf16_bn_half_cudnn0 env LOOM_CUDA_BN_BF16_CUDNN=0 $b/resnet50_synthetic $R --opt-level O1 --precision bf16 --bn-half
r r50_O1bf16_bn_half_cudnn1 env LOOM_CUDA_BN_BF16_CUDNN=1 $b/resnet50_synthetic $R --opt-level O1 --precision bf16 --bn-half
r r50_O1 $b/resnet50_synthetic $R --opt-level O1
r r50_O1_bn_half $b/resnet50_synthetic $R --opt-level O1 --bn-half
r convnet $b/bench_convnet --device cuda --steps 50 --warmup 5
r convnet_nograph $b/bench_convnet --device cuda --steps 50 --warmup 5 --no-cuda-graph
r convnet_staged env LOOM_CUDA_UPLOAD=graph $b/bench_convnet --device cuda --steps 50 --warmup 5
# The loss copied inside the graph (LOOM_CUDA_LOSS_NODE=1) against the
# same loss one step late without it.
r convnet_staged_async env LOOM_CUDA_UPLOAD=graph LOOM_ASYNC_LOSS=1 $b/bench_convnet --device cuda --steps 50 --warmup 5
r convnet_staged_loss_node env LOOM_CUDA_UPLOAD=graph LOOM_CUDA_LOSS_NODE=1 LOOM_ASYNC_LOSS=1 $b/bench_convnet --device cuda --steps 50 --warmup 5
# Staged inputs fed by a loader: converted into the bench's buffers and copied
# into the slot by loom_set_input (own), or converted straight into the pinned
# slot (into: loom_input_buffer); the input line says the bytes the host copied.
r convnet_staged_loader_own env LOOM_CUDA_UPLOAD=graph $b/bench_convnet --device cuda --steps 50 --warmup 5 --loader own
r convnet_staged_loader_into env LOOM_CUDA_UPLOAD=graph $b/bench_convnet --device cuda --steps 50 --warmup 5 --loader into
grep -a "^| O" $o/convnet.log $o/convnet_nograph.log $o/convnet_staged.log $o/convnet_staged_loader_own.log $o/convnet_staged_loader_into.log | cut -c1-140
grep -a "^O[0-3]: input" $o/convnet_staged_loader_own.log $o/convnet_staged_loader_into.log | cut -c1-160
# Captures, replays and host waits inside a step (0 for a replayed one).
grep -a "^launches" $o/r50_O2.log $o/r50_O2_nograph.log $o/gpt_O1.log $o/gpt_O1_nograph.log $o/convnet.log $o/convnet_nograph.log $o/convnet_staged.log | cut -c1-200
W1="env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOOM_DDP_WORLD1_BUCKETS=1 MASTER_ADDR=127.0.0.1"
r mnist_w1_graph $W1 MASTER_PORT=29611 $b/mnist_ddp --device cuda --data $d --epochs 1 --max-steps 100 --log-interval 50
r mnist_w1_graph_off $W1 MASTER_PORT=29613 LOOM_CUDA_GRAPH_RANKS=0 $b/mnist_ddp --device cuda --data $d --epochs 1 --max-steps 100 --log-interval 50
grep -a "cuda graph\|^launches" $o/mnist_w1_graph.log $o/mnist_w1_graph_off.log | cut -c1-200
r mnist_O0 $b/mnist_ddp --device cuda --data $d --epochs 1 --log-interval 200
r mnist_O2 $b/mnist_ddp --device cuda --data $d --epochs 1 --opt-level O2 --log-interval 200
r gpt_small_O1 $b/gpt_ddp --device cuda --data $d/fortunes.txt --opt-level O1 --precision bf16 --max-steps 300 --log-interval 100 --val-interval 100 --sample 100
r trace_r50_nhwc env LOOM_CUDA_NHWC=half $b/resnet50_synthetic --device cuda --batch-size 64 --steps 3 --warmup 1 --opt-level O2 --trace $o/r50_nhwc.json --trace-steps 1
r trace_gpt_O2 $b/gpt_ddp $G --opt-level O2 --max-steps 4 --trace $o/gpt_O2.json --trace-steps 1
LIM=110 r memcheck compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 86 $b/test_cuda_ops --verbose
grep -a "ERROR SUMMARY\|Synthesis" $o/memcheck.log
LIM=40 r racecheck_cls compute-sanitizer --tool racecheck --error-exitcode 86 $b/test_cuda_ops --verbose --filter 'cuda_ops/fused_classifier'
LIM=40 r racecheck_vpad compute-sanitizer --tool racecheck --error-exitcode 86 $b/test_cuda_ops --verbose --filter 'cuda_ops/padded_vocabulary'
LIM=40 r racecheck_ln compute-sanitizer --tool racecheck --error-exitcode 86 $b/test_cuda_ops --verbose --filter 'cuda_ops/layernorm_saved_statistics'
LIM=40 r racecheck_ln_residual compute-sanitizer --tool racecheck --error-exitcode 86 $b/test_cuda_ops --verbose --filter 'cuda_ops/layernorm_residual'
LIM=40 r racecheck_ln_bwd_accum compute-sanitizer --tool racecheck --error-exitcode 86 $b/test_cuda_ops --verbose --filter 'cuda_ops/layernorm_backward_accum'
LIM=40 r racecheck_emb_bwd_accum compute-sanitizer --tool racecheck --error-exitcode 86 $b/test_cuda_ops --verbose --filter 'cuda_ops/embedding_backward_accum'
