/*
 * engine/cuda/cuda_internal.h — what the CUDA backend's files share: the
 * backend context (handles, streams, events, per-node plans, the device
 * control block), the plan passes (fuse_plan.cu), the op entries
 * (loom_cuda_op_<op>, each in its family's file, with the backend entries
 * a family holds), the launchers of the own kernels, and the cuBLASLt /
 * cuDNN plan calls. CUDA C++ only (nvcc); the public side is cuda_backend.h.
 */
#ifndef LOOM_ENGINE_CUDA_INTERNAL_H
#define LOOM_ENGINE_CUDA_INTERNAL_H

#include <cuda_runtime_api.h>
#include <cublasLt.h>
#include <cudnn.h>

extern "C" {
#include "engine/backend.h"
#include "graph/ops/geometry.h"
#include "engine/cuda/formats.h"
#include "engine/cuda/bn_fuse.h"
}

#include "base/check.h"

/* Arena sub-allocations are aligned to this (cuBLASLt and cuDNN like 256). */
#define LOOM_CUDA_ALIGN 256
/* The most cuBLASLt workspace a matrix-product node's algorithm may ask
 * for: 32 MiB as llm.c gives it on Hopper (4 MiB before;
 * LOOM_CUDA_LT_WS_MB=4 measures the old cap against the new). */
#define LOOM_CUDA_LT_WS_DEFAULT_MB 32
size_t loom_cuda_lt_ws(void);
/* The most workspace a cuDNN algorithm may ask for to be chosen. */
#define LOOM_CUDA_CONV_WS_MAX ((size_t)512 << 20)
/* Elements per optimizer chunk (one block each). */
#define LOOM_CUDA_OPT_CHUNK 4096

/* Whether plan p's fp32 convolutions and products run on TF32 tensor
 * cores (loom_compile_opts.no_tf32, `--tf32 off`). */
static inline int loom_cuda_tf32_on(const loom_plan *p)
{
	return !p->opts.no_tf32;
}

static inline size_t loom_cuda_align(size_t x)
{
	return (x + LOOM_CUDA_ALIGN - 1) & ~(size_t)(LOOM_CUDA_ALIGN - 1);
}

/*
 * The device control block, at the end of the arena: the device copy of the
 * loss scaler (the skip decision is taken here, without a host sync), the
 * step counter the optimizer kernels read, and the error flags kernels raise
 * for run-time faults that the next sync reports.
 */
typedef struct loom_cuda_ctl {
	loom_scaler scaler;
	int64_t step;        /* optimizer steps applied (mirrors p->step) */
	int64_t t;           /* step + 1 of the update being applied */
	double inv_scale;    /* 1 / scale, as the CPU computes it */
	int32_t found_inf;   /* set by the finite check of this step */
	int32_t apply;       /* the scaler's decision for this step */
	int32_t ce_node;     /* softmax-CE node with a bad label, or -1 */
	int32_t ce_row;      /* its first bad row (atomicMin), INT32_MAX if none */
	int32_t first_nonfinite; /* diagnose: first node with inf/NaN, or -1 */
	/* The first embedding node (in launch order: the CPU's step order)
	 * that saw an id outside its table's real rows, or -1, and that
	 * node's first bad position (atomicMin), INT64_MAX if none. */
	int32_t emb_node;
	int64_t emb_pos;
	double grad_norm;    /* clipping: the last update's global norm */
	/* The learning rate the update applies, set by a one-thread kernel
	 * launched (eagerly, outside any captured graph) when the host's
	 * schedule changes it: a replayed step reads it here. */
	double lr;
	/* ZeRO's clipping on the device: this rank's sum of squares, then
	 * (after the executor's all-reduce) every rank's, which the clip
	 * reads (LOOM_CUDA_NORM_DEVICE). */
	double sumsq;
} loom_cuda_ctl;

/* Where the fused optimizer's clipping takes the global norm from. */
enum {
	LOOM_CUDA_NORM_PARTS = 0, /* its own pieces' sums of squares: all of them (no ZeRO) */
	LOOM_CUDA_NORM_DEVICE,    /* sqrt(ctl->sumsq), summed over the ranks on the device */
	LOOM_CUDA_NORM_HOST,      /* the host's value, by launch argument */
};

/* One chunk of one parameter for the fused optimizer kernels. */
typedef struct loom_cuda_opt_chunk {
	int32_t slot;
	int32_t pad_;
	int64_t off;
} loom_cuda_opt_chunk;

/* One optimizer piece (engine/plan.h: a whole parameter, or under ZeRO
 * the part of one in this rank's shard) as the kernels see it: device
 * addresses of its element 0. */
typedef struct loom_cuda_opt_slot {
	void *param;
	const void *grad;
	void *master; /* NULL unless O2 (the slot's, or ZeRO's shard) */
	void *st0, *st1;
	void *pack;   /* ZeRO: the piece's place in the bucket, for the all-gather */
	int64_t numel;
	int32_t param_dt, grad_dt, state_dt;
	int32_t matrix; /* loom_param_slot.matrix: decayed under decay_matrices_only */
	int32_t pad_;
	/* LOOM_CUDA_FP8_AMAX_OPTIM (fp8.cu's loom_cuda_fp8_wamax_plan): the
	 * weight's cell, which the update fills with the max |w| of what it
	 * stores into param (the bits, by atomicMax; zeroed by the decision
	 * of an applied step); NULL: none (every piece under ZeRO). */
	unsigned *amax;
} loom_cuda_opt_slot;

/* One slot of the loss read one step late (backend.cu, loss_async). */
typedef struct loom_cuda_async_slot {
	double loss64;
	float loss32;
	int32_t f64;
	loom_cuda_ctl ctl;
} loom_cuda_async_slot;

/* A source cast into workspace before a library call (dtype mismatch). */
typedef struct loom_cuda_stage {
	int src;        /* source index, -1 when unused */
	size_t ws_off;  /* where its copy lives in ws */
} loom_cuda_stage;

typedef struct loom_cuda_conv_plan {
	cudnnTensorDescriptor_t x, y;
	cudnnFilterDescriptor_t w;
	cudnnConvolutionDescriptor_t conv;
	int algo; /* fwd, bwd-data or bwd-filter algorithm, by node op */
	size_t ws;
	int f32;           /* a half node run in f32: no half algorithm (or test hook) */
	size_t f32_off[3]; /* ws offsets of the f32 copies: sources 0, 1, the output */
	/* The layout cuDNN runs this convolution in (LOOM_FORMAT_NCHW or
	 * NHWC: x, y and the filter, KRSC, alike), and the operands (sources
	 * 0, 1, the output) held in another format: reordered into ws at
	 * ro_off (the filter always, in NHWC). */
	int fmt;
	int ro[3];
	size_t ro_off[3];
	/* The filter kept KRSC for the step (LOOM_CUDA_CONV_KRSC; compiled,
	 * not run): the node that reorders it into the saved region at
	 * krsc_off (the first of the NHWC convolutions reading that filter;
	 * itself, or an earlier one whose copy this one reads), LOOM_NONE: the
	 * reorder into ws at each call. */
	loom_value krsc_by;
	size_t krsc_off;
	/* How algo was chosen (--dump-graph): LOOM_CUDA_CONV_HOW_*, the math
	 * type set, the measured time of algo (0: not measured) and the
	 * heuristic's own first choice with its measured time. */
	int how;
	int math;
	float ms;
	int heur_algo;
	float heur_ms;
} loom_cuda_conv_plan;

/* loom_cuda_conv_plan.how. */
enum {
	LOOM_CUDA_CONV_HOW_HEURISTIC = 0, /* the _v7 heuristic's first usable: search off */
	LOOM_CUDA_CONV_HOW_MEASURED,      /* cudnnFind*AlgorithmEx now */
	LOOM_CUDA_CONV_HOW_CACHED,        /* measured earlier in this process, same key */
	LOOM_CUDA_CONV_HOW_BUDGET,        /* heuristic: the search's time budget was spent */
	LOOM_CUDA_CONV_HOW_NO_SCRATCH,    /* heuristic: no device memory for the search */
	LOOM_CUDA_CONV_HOW_FIND_FAILED,   /* heuristic: Find failed or found nothing usable */
};

/* The scratch of the convolution search, alive during one plan_create
 * (the arena does not exist yet): the largest x, w and y of the plan's
 * convolutions (f32 bytes) and a workspace up to LOOM_CUDA_CONV_WS_MAX,
 * one cudaMalloc made at the first node that is measured. */
typedef struct loom_cuda_conv_search {
	int off;          /* kernel search off: heuristic everywhere */
	int state;        /* 0 not tried, 1 allocated, -1 unavailable */
	unsigned char *base;
	size_t x_bytes, w_bytes, y_bytes, ws_bytes;
	double budget_ms, spent_ms;
} loom_cuda_conv_search;

typedef struct loom_cuda_mm_plan {
	cublasLtMatmulDesc_t desc;
	cublasLtMatrixLayout_t a, b, c; /* cuBLAS operands: a = B rows, b = A */
	cublasLtMatmulAlgo_t algo;
	int bias;         /* the epilogue adds the linear's bias */
	int bias_after;   /* a bias no epilogue took: own kernel, in place */
	int relu_after;   /* a fused relu no epilogue took: own kernel, in place */
	loom_value bgrad; /* the sibling the BGRADB epilogue writes, or LOOM_NONE */
	/* LOOM_CUDA_GELU_EPILOGUE: the GELU (or GELU backward, dgelu) node
	 * whose output this product's epilogue writes (its own output is the
	 * epilogue's aux, the pre-activation: GELU_AUX(_BIAS); or, dgelu, aux is
	 * the pre-activation it reads: DGELU), LOOM_NONE if none; aux_same:
	 * the GELU's output is the product's own (in place, eval: no aux). */
	loom_value gelu;
	int dgelu, aux_same;
	loom_value aux; /* dgelu: the pre-activation value */
	/* LOOM_CUDA_LT_ALIGN: the heuristic's answer for operands aligned to
	 * wide_align bytes (> 16: what the plan's offsets promise), taken at
	 * run time when the pointers are that aligned; algo is the answer for
	 * 16, the fallback. wide_align 0: none. */
	cublasLtMatmulAlgo_t wide_algo;
	uint32_t wide_align;
	/* LOOM_CUDA_LT_PAD: operands whose rows are not 16-byte aligned (the
	 * GPT's logits and dlogits, rows of 50257) copied into ws with rows of
	 * ld_pad elements (a multiple of 64) around the call, as llm.c's
	 * vocabulary padded to 50304 would hold them: [0] loom's A, [1] its B
	 * (both copied in before), [2] the output (copied out after). ld_pad 0:
	 * as it is. lt_ws: cuBLASLt's own part of lib_ws (the copies follow). */
	struct {
		int ld, ld_pad, rows;
		size_t off;
	} pad[3];
	size_t lt_ws;
	/* LOOM_CUDA_FP8_GEMM (matmul_fp8.cu): on, the product runs in FP8 on
	 * operands cast from its FP8_QDQ sources q[0] (loom's A) and q[1]
	 * (its B), formats fmt[], into ws at off[] (trans[]: cast transposed,
	 * for cuBLASLt's "TN" layout); stored[]: that QDQ keeps its fp8
	 * codes (the fp8 storage pass, a.fp8.store), read as they are, or
	 * transposed from the codes into ws where trans[]; fast: cuBLASLt's
	 * fast accumulation (LOOM_CUDA_FP8_FAST_ACCUM took this product). */
	struct {
		int on, fmt[2], trans[2], stored[2], fast;
		loom_value q[2];
		size_t off[2];
	} fp8;
} loom_cuda_mm_plan;

typedef struct loom_cuda_bn_plan {
	cudnnTensorDescriptor_t x;     /* x, y, dy, dx: [N, C, H, W] */
	cudnnTensorDescriptor_t param; /* gamma, beta, statistics: [1, C, 1, 1] f32 */
	loom_value dgamma, dbeta;      /* siblings the backward call writes, or LOOM_NONE */
	int own_makes; /* the own split backward (kind NONE) writes dgamma, dbeta too */
	/* The relu's backward fused into this split backward (LOOM_CUDA_BN_RELU_BWD,
	 * plan_relu_bwd in fuse_plan.cu): it reads the relu backward's sources
	 * (relu_y, the batch norm's relu'd output, and relu_dy) and masks dy
	 * by y > 0 itself; relu_bwd is the node it stands for, which does
	 * nothing. LOOM_NONE: not fused. */
	loom_value relu_bwd, relu_y, relu_dy;
	/* A forward with a fused relu through cudnnBatchNormalizationForwardTrainingEx
	 * (CUDNN_BATCHNORM_OPS_BN_ACTIVATION), where cuDNN took the NCHW
	 * descriptors at plan time; its workspace and reserve at the start
	 * of ws. 0 after a run-time NOT_SUPPORTED. */
	int ex;
	int ex_ops; /* cudnnBatchNormOps_t: BN_ACTIVATION, or BN (NHWC without a relu) */
	cudnnActivationDescriptor_t act;
	size_t ex_ws, ex_reserve;
	/* NHWC descriptors (the format pass's choice), and the cudnnBatchNormMode_t
	 * of the training calls: SPATIAL_PERSISTENT in NHWC, else SPATIAL. */
	int nhwc, mode;
	/* cuDNN's Ex backward (LOOM_CUDA_BN_BWD_EX; compiled, not run). On a
	 * forward: reserve_max, the largest reserve its Ex calls may ask
	 * (OPS_BN, BN_ACTIVATION, BN_ADD_ACTIVATION); reserve_slot, its saved
	 * slot holds the reserve (plan_saved, from loom_cuda_bn_reserve_off);
	 * ran_ex, what its last training run called (LOOM_CUDA_BN_EX_*, NONE:
	 * the legacy call), which its backward must match. On a backward:
	 * bwd_ex, the Ex call with the forward's reserve (plan_bn_bwd_ex in
	 * fuse_plan.cu), its workspace bwd_ws after the dgamma/dbeta scratch, and
	 * the relu's (or add + relu's) backward it does (fuse.ops NONE: none;
	 * LOOM_CUDA_BN_BWD_FUSE). */
	size_t reserve_max;
	int reserve_slot, ran_ex;
	int bwd_ex;
	size_t bwd_ws;
	loom_cuda_bn_bwd_fusion fuse;
} loom_cuda_bn_plan;

/* A fused attention node's cuDNN SDPA plan (sdpa_cudnn.cu). */
struct loom_sdpa_graph;
typedef struct loom_cuda_sdpa_plan {
	struct loom_sdpa_graph *g; /* the graph, its execution plan and workspace size */
	loom_value y;              /* forward: the ATTENTION node whose y it writes */
} loom_cuda_sdpa_plan;

/* Layer norm's one-pass backward (layernorm.cu): the siblings it writes. */
typedef struct loom_cuda_ln_plan {
	loom_value dgamma, dbeta; /* LOOM_NONE: not this node's sibling */
	int warp; /* the warp backward (LOOM_CUDA_LN_BWD=warp when planned), its ws */
} loom_cuda_ln_plan;

/* What prepare decided for one node. */
typedef struct loom_cuda_node_plan {
	int kind; /* LOOM_CUDA_PLAN_* */
	loom_cuda_stage stage[LOOM_MAX_SRC];
	size_t lib_ws; /* library workspace at the start of ws */
	size_t ws;     /* everything this node uses of ws */
	loom_cuda_conv_plan conv;
	loom_cuda_mm_plan mm;
	loom_cuda_bn_plan bn;
	loom_cuda_ln_plan ln;
	/* CHANNEL_SUM: LOOM_CUDA_BGRAD=kernel's column sums, its ws planned
	 * (elementwise.cu's colsum_takes when the plan was made). */
	int colsum;
	/* A slot of the saved region (between the forward and its backward,
	 * outside the graph's values): the forward node whose slot this node
	 * writes (itself) or reads, LOOM_NONE if none; where it starts in
	 * the region. Batch norm: its statistics (cuDNN's saved mean and
	 * inverse std, f32, or the own kernels' mean and biased variance,
	 * f64); max pool: each output's argmax in its window (one byte). */
	loom_value saved_by;
	size_t saved_off;
	/* A node whose work another's call does (LOOM_NONE: none): a relu
	 * backward the split batch-norm backward fused_into does, a
	 * softmax-CE backward its forward does (the fused classifier), a GELU
	 * or GELU backward its product's epilogue does. Skipped, except under
	 * the diagnosis run mode (loom_cuda_relu_fusion_on), where the node
	 * that does its work leaves it to it. */
	loom_value fused_into;
	/* Batch norm + residual add + relu as one cuDNN call
	 * (CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION, NHWC, training runs;
	 * plan_bn_add in fuse_plan.cu): on the ADD node, the batch norm it runs
	 * (bn_add), the add's other source (bn_add_z) and the call's workspace
	 * and reserve; on that batch norm, the add that runs it (bn_add_by).
	 * LOOM_NONE: not fused. */
	loom_value bn_add, bn_add_z, bn_add_by;
	size_t bn_add_ws, bn_add_reserve;
	/* softmax-CE forward: the backward whose dlogits it writes over the
	 * logits in a training run (the fused classifier, plan_classifier in
	 * fuse_plan.cu), LOOM_NONE if none. */
	loom_value ce_bwd;
	loom_cuda_sdpa_plan sdpa;
	/* LOOM_CUDA_FP8_AMAX_PRODUCER (fp8.cu's loom_cuda_fp8_amax_plan): on
	 * a layer norm or GELU (forward, or backward: GELU_BWD,
	 * LAYERNORM_BWD_DATA), the FP8_QDQ node whose amax slot its kernel
	 * fills with the max |y| of what it stores; on that FP8_QDQ,
	 * the producer, so its amax pass is not launched. LOOM_NONE: none. */
	loom_value fp8_amax;
	/* LOOM_CUDA_FP8_AMAX_OPTIM (fp8.cu's loom_cuda_fp8_wamax_plan): on an
	 * FP8_QDQ of a weight, the cell (loom_cuda_wamax) the optimizer fills
	 * with the weight's amax, -1: none. */
	int fp8_wamax;
	/* FP8 storage (fp8.cu's loom_cuda_fp8_storage_plan): the sources
	 * (bit i: source i) stored as fp8 codes that this node does not read
	 * as codes, decoded into ws from fp8_dec_off before it runs. */
	unsigned fp8_dec;
	size_t fp8_dec_off;
} loom_cuda_node_plan;

enum {
	LOOM_CUDA_PLAN_NONE = 0, /* own kernels */
	LOOM_CUDA_PLAN_CONV,
	LOOM_CUDA_PLAN_MM,
	LOOM_CUDA_PLAN_BN,
	LOOM_CUDA_PLAN_LN, /* layer norm's one-pass backward */
	LOOM_CUDA_PLAN_SDPA,
};

/*
 * An input staged for the captured step (LOOM_CUDA_UPLOAD=graph): two
 * fixed pinned slots the host fills in turn (loom_set_input's copy, or
 * the loader's writes into the slot input_slot hands out); the
 * host-to-device copy is queued at the start of an eager run, and in the
 * captured graph it is a memcpy node ahead of every other node, pointed at
 * the slot filled last before each replay. read[k] marks the last queued
 * copy (eager, or a launch of the graph) that reads slot k: the host waits
 * for it before it fills slot k again, so a replay still to run never
 * reads a slot the host is writing.
 */
typedef struct loom_cuda_input {
	void *dst;              /* the input's arena address */
	size_t bytes;
	unsigned char *host[2]; /* pinned, made at its first upload */
	cudaEvent_t read[2];
	int slot;               /* the slot filled last; -1 before the first upload */
	int pending;            /* filled, its copy not queued yet */
	/* The slot handed out to the host (loom_input_buffer: the loader
	 * writes there, no copy of the host's), -1: none. Never the slot
	 * filled last, whose batch a run still to be queued takes. */
	int out;
	cudaGraphNode_t node;   /* its copy in the captured graph; NULL: none */
	int node_slot;          /* the slot that node reads */
} loom_cuda_input;

/*
 * LOOM_CUDA_FP8_AMAX_OPTIM (fp8.cu): one cell per weight whose FP8 casts
 * take their amax from the optimizer. amax[i] (device) is the max |w| of
 * what the last applied update stored into the weight; valid[i] (device)
 * is 1 only while that update's values are the weight's bytes: the
 * decision of an applied step clears it as it zeroes the cell, the update
 * sets it, any host write or device copy into the weight or its master
 * (upload, copy: fp8_wamax_touch) clears it, and it starts at 0, so the
 * first step's casts and those after a checkpoint's load take their own
 * pass. Host side: each cell's weight (param node), its p->params slot,
 * and the byte ranges of the weight and its master ([lo, hi), two per
 * cell; the arena's, known at alloc).
 */
typedef struct loom_cuda_wamax {
	float *amax;
	int *valid;
	loom_value *param;
	int *slot;
	uintptr_t *lo, *hi;
	int n;
} loom_cuda_wamax;

/* FP8 scaling's state on the device (fp8.cu): ts.fp8's tensors
 * (amp/fp8_scaling.h), under delayed scaling their amax histories and the
 * ring's {filled, pos}, and the packed buffers of the reduction over the
 * ranks, one allocation; t is NULL where the plan has none. */
typedef struct loom_cuda_fp8_dev {
	loom_fp8_tensor *t;
	float *hist;
	int *ring;
	float *amax;     /* the step's amaxes and saturation counts, packed for */
	double *sat;     /* the all-reduces over the ranks (fp8_reduce_begin) */
	int n, len, margin;
	int delayed;     /* 0: current scaling (len 0, no history; the ring unused) */
	size_t bytes;
} loom_cuda_fp8_dev;

typedef struct loom_cuda_ctx {
	char err[LOOM_ERR_MAX]; /* the last failure's message */
	/* The step as one CUDA graph (capture_begin / capture_end / replay):
	 * the graph, its executable, and what the counters report. lr_device:
	 * the update reads ctl->lr (from the first capture on; before, the
	 * rate by value, the old path); host_lr: the rate last set there. */
	cudaGraph_t graph;
	cudaGraphExec_t graph_exec;
	int capturing, lr_device;
	double host_lr;
	long host_syncs, syncs_in_step, graph_launches, captures;
	/* Progress marks (mark_words / mark_record / mark_serial): n_marks
	 * words of mapped pinned memory (mark_host for the host, mark_dev
	 * for the kernels), the launch serial the graph's head bumps on the
	 * device (serial_dev), and the host's count of launches (mark_serial). */
	uint64_t *mark_host, *mark_dev, *serial_dev;
	int n_marks;
	uint64_t mark_serial;
	int in_step; /* between run_begin and run_end */
	char describe[128];     /* "cuda: <device name>" */
	int device;             /* made current by every entry (loom_cuda_use_device) */
	cudaStream_t stream;    /* compute: every node and the optimizer */
	cudaStream_t comm;      /* communication (all-reduce), created at init */
	cudaEvent_t events[LOOM_BACKEND_EVENTS];
	int train;              /* the current run is in training mode */
	cublasLtHandle_t lt;
	cudnnHandle_t dnn;
	loom_cuda_node_plan *plans; /* one per node */
	int n_plans;
	loom_cuda_conv_search search; /* during plan_create only */

	unsigned char *base;    /* the one cudaMalloc */
	size_t base_bytes;
	const loom_arena *arena; /* the program's: persist, act, ws, state inside base */
	loom_cuda_ctl *ctl;     /* in the arena */
	loom_cuda_opt_slot *d_slots;
	loom_cuda_opt_chunk *d_chunks;
	int n_chunks;
	double *d_norm_parts; /* clipping: each chunk's sum of squares, in the arena */
	/* ZeRO's clipping: where this run's norm over the ranks is
	 * (LOOM_CUDA_NORM_DEVICE or _HOST, set by grad_sumsq_device or
	 * grad_sumsq; 0: not taken), read and cleared by optim. */
	int zero_norm;

	unsigned char *pinned; /* upload staging, two halves */
	size_t pinned_half;
	cudaEvent_t pinned_ev[2];
	int pinned_next;

	/* The loss read one step late (loss_async): two pinned slots, each
	 * the loss and the control block as a step left them, an event each;
	 * the slot whose copy is queued and not yet taken (-1: none). */
	struct loom_cuda_async_slot *async;
	cudaEvent_t async_ev[2];
	int async_next, async_pending;
	/* LOOM_CUDA_LOSS_NODE=1 (read at alloc; off; compiled, not yet run):
	 * those two copies as the captured graph's last nodes (loss_node:
	 * the loss's and the control block's), pointed before each replay at
	 * the slot loss_async takes next; loss_src/loss_f64: the loss as the
	 * last loss_async saw it; loss_nodes_ran: the run just launched made
	 * the copies, so loss_async only marks them. */
	int loss_node_on, loss_f64, loss_node_slot, loss_nodes_ran;
	const void *loss_src;
	cudaGraphNode_t loss_node[2];

	/* LOOM_CUDA_UPLOAD=graph (read at alloc; off by default; compiled,
	 * not yet run): the plan's inputs staged for the graph. */
	int in_graph;
	loom_cuda_input *inputs;
	int n_inputs;

	loom_scaler host_scaler; /* the scaler as last synced with the device */
	int64_t host_step;
	/* Pinned staging of a host-side change of scaler and step, read by the
	 * device after push_host_state returns; reused once ctl_stage_ev has
	 * passed. */
	loom_cuda_ctl *ctl_stage;
	cudaEvent_t ctl_stage_ev;

	int tf32;   /* fp32 products and convolutions on TF32 tensor cores (!opts.no_tf32) */
	/* LOOM_CUDA_BN_RELU_BWD (1 unless its variable is 0 when the plan is
	 * made): the relu's backward fused into the split batch-norm backward
	 * where the memory plan allows it. */
	int bn_relu_bwd;
	int bn_add; /* LOOM_CUDA_BN_ADD: batch norm + add + relu in one cuDNN call (NHWC) */
	/* LOOM_CUDA_BN_BWD_EX (1): NHWC batch norm's backward through
	 * cudnnBatchNormalizationBackwardEx with the forward's reserve (0: the
	 * legacy backward, 93 of 113 ms of an H100 ResNet-50 O2 step);
	 * LOOM_CUDA_BN_BWD_FUSE (1): the relu's and the add + relu's backward
	 * inside it (BN_ACTIVATION, BN_ADD_ACTIVATION). Compiled, not run. */
	int bn_bwd_ex, bn_bwd_fuse;
	int conv_krsc; /* LOOM_CUDA_CONV_KRSC (1): NHWC filters reordered once a step (plan_conv_krsc) */
	/* LOOM_CUDA_GELU_EPILOGUE (1 unless its variable is 0 when the plan
	 * is made): a linear read by a tanh GELU computes it in cuBLASLt's
	 * GELU_AUX(_BIAS) epilogue, and the product making the GELU
	 * backward's dy its DGELU (matmul_cublaslt.cu). */
	int gelu_epi;
	/* The products' cuBLASLt use against llm.c's (matmul_cublaslt.cu),
	 * each 1 unless its variable is 0 when the plan is made:
	 * LOOM_CUDA_BGRAD_EPILOGUE: a weight gradient's bias-gradient sibling
	 * in the BGRADB epilogue (0: the sibling's own channel-sum kernel, as
	 * llm.c, whose bias gradient is a kernel of its own);
	 * LOOM_CUDA_LT_ALIGN: the heuristic told the operands' real alignment
	 * (up to 256, from the plan's offsets, checked per call) instead of
	 * 16; LOOM_CUDA_LT_PAD (0 unless 1): a product's operands with rows
	 * not 16-byte aligned copied into padded rows around the call
	 * (loom_cuda_mm_plan.pad). Compiled, not run. */
	int bgrad_epi, lt_align, lt_pad;
	unsigned char *saved;   /* the saved region (in base), saved_bytes long */
	size_t saved_bytes;
	int poison; /* test hook: loom_cuda_poison_on when this program was prepared */
	int attn_off; /* loom_cuda_sdpa_off() when the plan was made */
	/* FP8 (fp8.h): LOOM_CUDA_FP8_GEMM (0: the products on the QDQ'd bf16
	 * values, the emulation), and the per-node scale slots. */
	int fp8_gemm;
	int fp8_amax_producer; /* LOOM_CUDA_FP8_AMAX_PRODUCER (0) */
	int fp8_amax_optim;    /* LOOM_CUDA_FP8_AMAX_OPTIM (0) */
	int fp8_fast_accum;    /* LOOM_CUDA_FP8_FAST_ACCUM: 0 off, 1 fwd, 2 all */
	float *fp8_slots;
	loom_cuda_wamax wamax; /* the weights' amax cells (n 0: none) */
	/* fp8's per-tensor state on the device (fp8.cu, a copy of ts.fp8's):
	 * t NULL without fp8; under current scaling the tensors alone. */
	loom_cuda_fp8_dev fp8_dev;

	unsigned flags;            /* the current run's LOOM_EXEC_* */
	int diagnose;              /* the current run marks non-finite values */
	unsigned char *accum_base; /* gradient accumulation's sums (arena->accum), or NULL */
	/* Trace timers: events with timing, made on first use; timer 0's
	 * host time is the origin the others are measured from. */
	cudaEvent_t *timers;
	int n_timers;
	double timer0_host;
} loom_cuda_ctx;

/* Test hook state (cuda_backend.h). */
extern int loom_cuda_poison_on;
extern int loom_cuda_own_kernels_on;
/* The 128-bit half elementwise kernels (elementwise.cu): 1 unless
 * LOOM_CUDA_VEC=0 when the latest plan was made (plan_create reads it). */
extern int loom_cuda_vec_on;
/* The FP8 casts' 128-bit paths (fp8.cu): LOOM_CUDA_FP8_CAST_VEC=1 when the
 * latest plan was made, default 0. */
extern int loom_cuda_fp8_vec_on;
extern int loom_cuda_ln_bwd_warp_on; /* LOOM_CUDA_LN_BWD=warp (layernorm.cu), default 0 */
extern int loom_cuda_adamw_f32_on; /* LOOM_CUDA_ADAMW=f32 (optim.cu), default 0 */
/* LOOM_CUDA_BGRAD=kernel (elementwise.cu), default 0: a linear's bias
 * gradient by the column-sum kernel, the weight gradient's product
 * without BGRADB; and whether channel-sum node v takes that kernel, with
 * its workspace, into its plan. */
extern int loom_cuda_bgrad_kernel_on;
void loom_cuda_colsum_plan(const loom_plan *p, loom_value v, loom_cuda_node_plan *np);
/* --dump-graph's note on a layer-norm node (layernorm.cu) and on a
 * softmax-CE node (loss.cu): which path it took. */
void loom_cuda_ln_note(const loom_cuda_ctx *c, const loom_plan *p, loom_value v, char *buf,
		       size_t len);
void loom_cuda_ce_note(const loom_cuda_ctx *c, const loom_plan *p, loom_value v, char *buf,
		       size_t len);

/* ------------------------------------------------------------ plan passes */
/* fuse_plan.cu: the passes over the whole plan after each node's own plan
 * (the fused classifier, the saved region, NHWC filters kept KRSC, the relu
 * backward in the split batch-norm backward, batch norm + add + relu,
 * cuDNN's Ex batch-norm backward, an FP8 cast's amax from its producer,
 * FP8 storage's decoded copies), in that order; they widen some nodes'
 * workspace. */
loom_status loom_cuda_fuse_plan(loom_cuda_ctx *c, const loom_plan *p);
/* formats.cu: whether node v's kernel takes its operands in the formats
 * the planner gave them (formats.c decides; this checks that the plans
 * made agree, so that a mismatch is a compile error naming the node,
 * never NHWC bytes read as NCHW). */
int loom_cuda_formats_ok(const loom_cuda_ctx *c, const loom_plan *p, loom_value v);

/* ------------------------------------------------------------ op entries */

/* What one node runs on: its sources' and its own address and dtype. */
typedef struct loom_cuda_io {
	void *src[LOOM_MAX_SRC];
	int dt[LOOM_MAX_SRC];
	void *out;
	int odt;
} loom_cuda_io;

/* An op entry: node v of the plan run on its sources' and its own
 * addresses (io); the entries below are declared through it. */
typedef loom_status loom_cuda_op_fn(loom_cuda_ctx *ctx, const loom_plan *plan, loom_value v,
				    const loom_cuda_io *io);

/* backend.cu: the context's device made current (every entry does it
 * first); a host wait on stream s, counted (cuda_counters); a host-side
 * change of scaler or step (loom_load) queued for the device before
 * anything there reads it (async, from pinned memory). */
loom_status loom_cuda_use_device(loom_cuda_ctx *c);
cudaError_t loom_cuda_sync_stream(loom_cuda_ctx *c, cudaStream_t s);
loom_status loom_cuda_push_host_state(loom_cuda_ctx *c, const loom_train_state *ts);
/* backend.cu: the control block's fault flags (a bad label's, a bad
 * id's) reset on the stream for the next step, after a report. */
loom_status loom_cuda_clear_faults(loom_cuda_ctx *c);
/* backend.cu: the int32 at src on the device read into *val (a fault's
 * label or id), the fault flags cleared, the stream drained. Waits. */
loom_status loom_cuda_fault_read(loom_cuda_ctx *c, const int32_t *src, int32_t *val);
/* backend.cu: leaves and views have nothing to compute. */
loom_cuda_op_fn loom_cuda_op_nothing;
/* A library call's node (a convolution, a product) run on src (0, 1, ...)
 * into out, by its plan np. */
typedef loom_status loom_cuda_run_fn(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
				     const loom_cuda_node_plan *np, void *const *src, void *out);
/* backend.cu: the entry of such a node: the sources whose dtype differs
 * from the node's cast into its workspace (np->stage), then run on them. */
loom_status loom_cuda_run_staged(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				 const loom_cuda_io *io, loom_cuda_run_fn *run);

/* formats.cu: the REORDER node, the backend's node_formats */
loom_cuda_op_fn loom_cuda_op_reorder;
extern "C" void loom_cuda_node_formats(void *ctx, const loom_plan *plan, loom_value v,
				       loom_format_caps *caps);
/* conv_cudnn.cu */
loom_cuda_op_fn loom_cuda_op_conv2d;
loom_cuda_op_fn loom_cuda_op_conv2d_bwd_data;
loom_cuda_op_fn loom_cuda_op_conv2d_bwd_filter;
/* matmul_cublaslt.cu */
loom_cuda_op_fn loom_cuda_op_linear;
loom_cuda_op_fn loom_cuda_op_matmul;
/* bn.cu: cuDNN's calls where the node's plan took them, else own kernels;
 * --dump-graph's note on a batch-norm, max-pool or fused ADD node. */
void loom_cuda_bn_note(const loom_cuda_ctx *c, const loom_plan *p, loom_value v, char *buf,
		       size_t len);
loom_cuda_op_fn loom_cuda_op_batchnorm2d;
loom_cuda_op_fn loom_cuda_op_bn_bwd_data;
loom_cuda_op_fn loom_cuda_op_bn_bwd_gamma;
/* pool.cu */
loom_cuda_op_fn loom_cuda_op_maxpool2d;
loom_cuda_op_fn loom_cuda_op_maxpool2d_bwd;
loom_cuda_op_fn loom_cuda_op_global_avgpool;
loom_cuda_op_fn loom_cuda_op_global_avgpool_bwd;
/* comm.cu: gradient accumulation on segment s of plan->accum, on the compute stream:
 * add it into its sum, or (fold) add the sum into it and clear the sum. */
loom_status loom_cuda_accum(loom_cuda_ctx *ctx, const loom_plan *plan, int s, int fold);
/* optim.cu: the backend's optimizer entries (engine/backend.h's optim,
 * grad_sumsq(_device), grads_finite(_device)), and the slot and chunk
 * tables uploaded once at alloc (waits: the host tables are freed). */
loom_status loom_cuda_opt_tables_upload(loom_cuda_ctx *c, const loom_plan *p);
loom_status loom_cuda_optim(void *ctx, const loom_plan *p, const loom_arena *arena,
			    loom_train_state *ts, int first, int last, int finite);
loom_status loom_cuda_grad_sumsq_device(void *ctx, const loom_plan *p, const loom_arena *arena,
					const loom_train_state *ts, int first, int last,
					void **sumsq);
loom_status loom_cuda_grad_sumsq(void *ctx, const loom_plan *p, const loom_arena *arena,
				 const loom_train_state *ts, int first, int last, double *sumsq);
loom_status loom_cuda_grads_finite_device(void *ctx, const loom_plan *p,
					  const loom_arena *arena, int first, int last,
					  void **flag);
loom_status loom_cuda_grads_finite(void *ctx, const loom_plan *p, const loom_arena *arena,
				   int first, int last, int *finite);
/* loss.cu */
loom_cuda_op_fn loom_cuda_op_softmax_ce;
loom_cuda_op_fn loom_cuda_op_softmax_ce_bwd;
/* A bad label the softmax-CE kernel flagged in the control block
 * (h, read back), reported as the CPU does; every fault flag cleared
 * (loom_cuda_clear_faults). Waits. */
loom_status loom_cuda_report_bad_label(loom_cuda_ctx *c, const loom_plan *p,
				       const loom_cuda_ctl *h);
/* elementwise.cu */
loom_cuda_op_fn loom_cuda_op_cast;
loom_cuda_op_fn loom_cuda_op_relu;
loom_cuda_op_fn loom_cuda_op_relu_bwd;
/* Every unary op of graph/unary.h, forward and backward. */
loom_cuda_op_fn loom_cuda_op_unary;
loom_cuda_op_fn loom_cuda_op_add;
loom_cuda_op_fn loom_cuda_op_sum;
loom_cuda_op_fn loom_cuda_op_broadcast;
loom_cuda_op_fn loom_cuda_op_channel_sum;
loom_cuda_op_fn loom_cuda_op_grad_seed;

/* embedding.cu */
loom_cuda_op_fn loom_cuda_op_embedding;
loom_cuda_op_fn loom_cuda_op_embedding_bwd;
/* A bad id the embedding's forward flagged in the control block (h, read
 * back), reported as the CPU does (loom_bad_id); every fault flag
 * cleared (loom_cuda_clear_faults). Waits. */
loom_status loom_cuda_report_bad_id(loom_cuda_ctx *c, const loom_plan *p, const loom_cuda_ctl *h);
/* Workspace bytes of an EMBEDDING_BWD node (fp32 sums, or the bucketed
 * backward's sort). */
size_t loom_cuda_embedding_bwd_ws(const loom_plan *p, loom_value v);
/* An embedding's gradient added into the tied table's other gradient
 * (graph/fuse.c's loom_fuse_emb_bwd_accum; LOOM_CUDA_EMB_BWD_ACCUM, read
 * at compile): the planning question. The EMBEDDING_BWD entry adds into
 * the node's last source wherever it carries LOOM_NODE_ACCUM. */
int loom_cuda_emb_bwd_accum_fusable(const loom_graph *g, loom_value d, loom_value s, int other);
/* layernorm.cu */
loom_cuda_op_fn loom_cuda_op_layernorm;
loom_cuda_op_fn loom_cuda_op_layernorm_bwd_data;
loom_cuda_op_fn loom_cuda_op_layernorm_bwd_gamma;
/* A LAYERNORM_BWD_DATA node's plan: the one-pass kernel with the siblings
 * it makes (LOOM_CUDA_PLAN_LN) where the row fits it, else none. */
loom_status loom_cuda_ln_plan_make(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
				   loom_cuda_node_plan *np);
/* The residual add with its layer norm (graph/fuse.c's
 * loom_fuse_ln_residual; LOOM_CUDA_LN_RESIDUAL, read at compile):
 * fusable answers the planning question; makes: whether add node v's
 * kernel wrote w; loom_cuda_ln_residual runs add node v with the layer
 * norm it makes and returns 1 (its status in *st), or returns 0 where v
 * makes none. */
int loom_cuda_ln_residual_fusable(const loom_graph *g, loom_value a, loom_value ln);
int loom_cuda_ln_residual_makes(const loom_plan *p, loom_value v, loom_value w);
int loom_cuda_ln_residual(loom_cuda_ctx *c, const loom_plan *p, loom_value v,
			  const loom_cuda_io *io, loom_status *st);
/* Layer norm's dx added into the residual's other gradient (graph/fuse.c's
 * loom_fuse_ln_bwd_accum; LOOM_CUDA_LN_BWD_ACCUM, read at compile): the
 * planning question. The LAYERNORM_BWD_DATA entry adds dx into the
 * node's last source wherever it carries LOOM_NODE_ACCUM. */
int loom_cuda_ln_bwd_accum_fusable(const loom_graph *g, loom_value d, loom_value s, int other);
/* Workspace bytes of a LAYERNORM_BWD_GAMMA node (row statistics, chunk
 * parts). */
size_t loom_cuda_ln_bwd_gamma_ws(const loom_plan *p, loom_value v);
/* attention.cu: the unfused attention (a fused node's entry calls
 * sdpa_cudnn.cu) */
loom_cuda_op_fn loom_cuda_op_attn_probs;
loom_cuda_op_fn loom_cuda_op_attn_probs_bwd;
loom_cuda_op_fn loom_cuda_op_attention;
loom_cuda_op_fn loom_cuda_op_attention_bwd_probs;
loom_cuda_op_fn loom_cuda_op_attention_bwd_qkv;
/* Workspace bytes of an unfused ATTN_PROBS or ATTN_PROBS_BWD node (fp32
 * scores, ds); 0 for the others. */
size_t loom_cuda_attn_ws(const loom_plan *p, loom_value v);

/* ------------------------------------------------------------ launchers */
/* Plain arguments, an explicit stream, a status; a failure's message goes
 * into err (LOOM_ERR_MAX bytes). */
/* elementwise.cu */
extern "C" {
/* formats.cu: n images of [c, hw] from format `from` into `to` (NCHW or
 * NHWC), any element size of 2, 4 or 8 bytes; a copy where they agree. */
loom_status loom_cuda_reorder(char *err, cudaStream_t s, int from, int to, size_t esz, int64_t n,
			      int64_t c, int64_t hw, const void *x, void *y);
loom_status loom_cuda_cast(char *err, cudaStream_t s, const void *x, int xdt, void *y,
			   int ydt, int64_t n);
loom_status loom_cuda_relu_fwd(char *err, cudaStream_t s, const void *x, int xdt,
			       void *y, int ydt, int64_t n);
loom_status loom_cuda_relu_bwd(char *err, cudaStream_t s, const void *x, int xdt,
			       const void *dy, int dydt, void *dx, int dxdt, int64_t n);
/* relu: apply a fused relu (attrs.ew.relu) before rounding. */
loom_status loom_cuda_add(char *err, cudaStream_t s, const void *a, int adt,
			  const void *b, int bdt, void *y, int ydt, int64_t n, int relu);
/* The sum of x's n elements into y[0], in double: part (the node's
 * workspace, LOOM_CUDA_SUM_PARTS doubles) holds the per-block sums. */
#define LOOM_CUDA_SUM_PARTS 1024
loom_status loom_cuda_sum(char *err, cudaStream_t s, const void *x, int xdt, int64_t n,
			  void *y, int ydt, double *part);
loom_status loom_cuda_broadcast_scalar(char *err, cudaStream_t s, const void *x,
				       int xdt, double scale, void *y, int ydt, int64_t n);
loom_status loom_cuda_channel_sum(char *err, cudaStream_t s, int n, int c, int64_t hw,
				  const void *x, int xdt, void *y, int ydt);
loom_status loom_cuda_bias_add(char *err, cudaStream_t s, int n, int c, int64_t hw,
			       void *y, int ydt, const void *b, int bdt);
loom_status loom_cuda_grad_seed(char *err, cudaStream_t s, const loom_cuda_ctl *ctl,
				void *y, int ydt);
loom_status loom_cuda_mark_nonfinite(char *err, cudaStream_t s, const void *x, int xdt,
				     int64_t n, int node, loom_cuda_ctl *ctl);

/* bn.cu */
loom_status loom_cuda_bn_fwd(char *err, cudaStream_t s, int train, int n, int c,
			     int64_t hw, const void *x, int xdt, const void *gamma, int gdt,
			     const void *beta, int bdt, void *rmean, int rmdt, void *rvar,
			     int rvdt, double momentum, double eps, int relu, void *y, int ydt);

/* pool.cu — the geometry struct of graph/ops/geometry.h, passed by value;
 * relu: the pool carries a fused relu (graph/fuse.c). */
/* nhwc: x, y (dy, dx) in NHWC, else NCHW. idx, where not NULL: the argmax
 * of each output (one byte: its place in the window, 255: no gradient; in
 * y's memory order), saved by the forward and read by the backward in
 * place of x. */
loom_status loom_cuda_maxpool_fwd(char *err, cudaStream_t s, loom_pool_shape ps,
				  const void *x, int xdt, void *y, int ydt, unsigned char *idx,
				  int nhwc);
loom_status loom_cuda_maxpool_bwd(char *err, cudaStream_t s, loom_pool_shape ps,
				  const void *x, int xdt, const unsigned char *idx, const void *dy,
				  int dydt, void *dx, int dxdt, int nhwc);
/* Global average pooling of n images of c planes of hw values, x NCHW
 * [n, c, hw] or (nhwc) [n, hw, c]: forward y[n, c] = the plane's mean,
 * backward (x: dy [n, c], y: dx) dx[n, c, i] = dy[n, c] / hw. */
loom_status loom_cuda_global_avgpool(char *err, cudaStream_t s, int fwd, int nhwc, const void *x,
				     int xdt, void *y, int ydt, int64_t n, int64_t c, int64_t hw);

/* loss.cu: n rows of pitch ld (elements), the first `classes` of each the
 * real classes (ld > classes: a padded vocabulary's logits, whose dlogits
 * get zero in the padding columns; engine/vocab_pad.c). */
loom_status loom_cuda_softmax_ce_bwd(char *err, cudaStream_t s, int n, int classes, int ld,
				     const void *logits, int ldt, const int32_t *labels,
				     const void *dloss, int dldt, void *dlogits, int dxdt);

/* optim.cu: the fused check, decision and update over every piece
 * (errors into c->err). verdict: -1, check the pieces here; 0 or 1, the
 * executor's verdict over the ranks (ZeRO). norm_from (LOOM_CUDA_NORM_*)
 * and host_norm: where clipping takes the global norm. */
loom_status loom_cuda_optim_launch(loom_cuda_ctx *c, const loom_plan *p, double lr,
				   int micro, int verdict, double clip, int matrices_only,
				   int norm_from, double host_norm, cudaStream_t s);
/* optim.cu: ZeRO's clipping, this rank's pieces' sum of squares as the
 * update will apply them (unscaled by the scale before the decision) into
 * ctl->sumsq, in chunk order; no wait. */
loom_status loom_cuda_shard_sumsq(loom_cuda_ctx *c, const loom_plan *p, int micro,
				  cudaStream_t s);
/* optim.cu: the pieces' overflow check alone, into ctl->found_inf (ZeRO's
 * grads_finite reads it back). */
loom_status loom_cuda_optim_check(loom_cuda_ctx *c, const loom_plan *p, cudaStream_t s);
/* optim.cu: ctl->lr = lr on stream s (a one-thread kernel); the update
 * reads it when given a NaN rate. */
loom_status loom_cuda_set_lr(loom_cuda_ctx *c, double lr, cudaStream_t s);
}

/* ------------------------------------------------------------ libraries */
/* matmul_cublaslt.cu: LINEAR and MATMUL. */
loom_status loom_cuda_mm_plan_make(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
				   loom_cuda_node_plan *np);
void loom_cuda_mm_plan_free(loom_cuda_node_plan *np);
/* The GELU (forward: *dgelu 0; backward: 1, *aux the pre-activation it
 * reads) whose output product v's epilogue may write, LOOM_NONE if none
 * (LOOM_CUDA_GELU_EPILOGUE; plan-level only: cuBLASLt may still have no
 * algorithm). */
loom_value loom_cuda_gelu_partner(const loom_plan *p, loom_value v, int *dgelu, loom_value *aux);
loom_status loom_cuda_mm_run(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
			     const loom_cuda_node_plan *np, void *const *src, void *out);
/* --dump-graph's note on a product with a GELU epilogue or a MM plan. */
void loom_cuda_mm_note(const loom_cuda_node_plan *np, char *buf, size_t len);

/*
 * matmul_cublaslt.cu: C_i = alpha op(A_i) op(B_i) + beta C_i for i < batch,
 * row-major as loom stores them (op(A) [m, k], op(B) [k, n], C [m, n]), each
 * operand at its row stride (ld) and batch stride (elements), A and B of
 * type abt, C of type ct, fp32 accumulation: attention's per-head products
 * over the fused qkv without copies. Descriptors are made per call, with
 * no library workspace. done says whether cuBLASLt had an algorithm (the
 * caller falls back to its own kernel when not).
 */
typedef struct loom_cuda_gemm {
	int ta, tb, m, n, k, batch;
	float alpha, beta;
	const void *a, *b;
	void *c;
	int lda, ldb, ldc;
	int64_t sa, sb, sc;
	cudaDataType_t abt, ct;
} loom_cuda_gemm;
loom_status loom_cuda_gemm_strided(loom_cuda_ctx *c, const loom_cuda_gemm *g, int *done);

/* conv_cudnn.cu: CONV2D and its two backward nodes. */
loom_status loom_cuda_conv_plan_make(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
				     loom_cuda_node_plan *np);
void loom_cuda_conv_plan_free(loom_cuda_node_plan *np);
/* The convolution search around plan_create's nodes: begin reads the
 * switch (opts.kernel_search, LOOM_KERNEL_SEARCH=off) and sizes the
 * scratch; end frees it. */
void loom_cuda_conv_search_begin(const loom_plan *p, loom_cuda_ctx *c);
void loom_cuda_conv_search_end(loom_cuda_ctx *c);
/* One line on a conv node's algorithm for --dump-graph. */
void loom_cuda_conv_note(const loom_node *n, const loom_cuda_conv_plan *cp, char *buf, size_t len);
/* Places the f32 copies of a conv plan's fallback in ws from offset at;
 * returns the end (at when the plan has no fallback). */
size_t loom_cuda_conv_f32_ws(const loom_plan *p, loom_value v, loom_cuda_node_plan *np,
			     size_t at);
/* Places the copies of the operands not in the plan's layout (fmt) in ws
 * from offset at, in the node's dtype; returns the end. */
size_t loom_cuda_conv_ro_ws(const loom_plan *p, loom_value v, loom_cuda_node_plan *np, size_t at);
loom_status loom_cuda_conv_run(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
			       const loom_cuda_node_plan *np, void *const *src, void *out);

/* bn_cudnn.cu: BATCHNORM2D and BN_BWD_DATA (with its dgamma and dbeta
 * siblings) through cuDNN; the plan stays NONE (own kernels) where cuDNN
 * does not take the dtypes. */
/* Synchronised batch norm's f64 sums in the workspace of node v (bn.cu); 0
 * unless the node is synchronised. */
size_t loom_cuda_bn_sync_ws(const loom_plan *p, loom_value v);
/* The split kernels' workspace of batch-norm node v (bn.cu): partial sums
 * and statistics. */
size_t loom_cuda_bn_split_ws(const loom_plan *p, loom_value v);
loom_status loom_cuda_bn_plan_make(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
				   loom_cuda_node_plan *np);
void loom_cuda_bn_plan_free(loom_cuda_node_plan *np);
loom_status loom_cuda_bn_run(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
			     const loom_cuda_node_plan *np, int train, void *const *src, void *out);
/* The workspace and reserve of batch norm b's forward with the add and
 * relu (BN_ADD_ACTIVATION); LOOM_ERR_UNSUPPORTED where cuDNN refuses. */
loom_status loom_cuda_bn_add_sizes(loom_cuda_ctx *c, const loom_cuda_node_plan *bnp, size_t *ws,
				   size_t *reserve);
/* Backward node np's Ex workspace (the largest of OPS_BN,
 * BN_ACTIVATION and BN_ADD_ACTIVATION that cuDNN takes; makes the
 * activation descriptor); LOOM_ERR_UNSUPPORTED where cuDNN takes none. */
loom_status loom_cuda_bn_bwd_ex_ws(loom_cuda_ctx *c, loom_cuda_node_plan *np, size_t *ws);
/* ADD node a's fused call: relu(bn(x) + z) into a's output, batch norm b's
 * statistics saved and its running ones updated; LOOM_ERR_UNSUPPORTED
 * (nothing run, message cleared) where cuDNN refuses it at run time. */
loom_status loom_cuda_bn_add_run(const loom_plan *p, loom_cuda_ctx *c, loom_value a);

/* sdpa_cudnn.cu: the fused attention nodes (graph/fuse_attention.c)
 * through cuDNN's SDPA. fusable: the backend's answer to the pass
 * (LOOM_CUDA_ATTN=unfused says no; else cuDNN builds the graphs once per
 * shape on a handle of its own). */
extern "C" int loom_cuda_attn_fusable(const loom_graph *g, loom_value probs, int train);
loom_status loom_cuda_sdpa_plan_make(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
				     loom_cuda_node_plan *np);
void loom_cuda_sdpa_plan_free(loom_cuda_node_plan *np);
loom_status loom_cuda_sdpa_fwd(loom_cuda_ctx *c, const loom_plan *p, loom_value v,
			       const loom_cuda_node_plan *np, const loom_cuda_io *io);
loom_status loom_cuda_sdpa_bwd(loom_cuda_ctx *c, const loom_plan *p, loom_value v,
			       const loom_cuda_node_plan *np, const loom_cuda_io *io);
/* Why attention is not fused whatever the shape, read when a plan is
 * made: 0 it may be, 1 LOOM_CUDA_ATTN=unfused, 2 the own-kernels hook. */
int loom_cuda_sdpa_off(void);
/* --dump-graph: how an attention node runs (fused, or why not; off: the
 * plan's loom_cuda_sdpa_off). */
void loom_cuda_sdpa_note(const loom_plan *p, loom_value v, const loom_cuda_node_plan *np, int off,
			 char *buf, size_t len);

/* Does node plan np's library call also write sibling w? */
static inline int loom_cuda_plan_makes(const loom_cuda_node_plan *np, loom_value w)
{
	if (np->kind == LOOM_CUDA_PLAN_BN || np->bn.own_makes)
		return w == np->bn.dgamma || w == np->bn.dbeta;
	if (np->kind == LOOM_CUDA_PLAN_MM)
		return w == np->mm.bgrad;
	if (np->kind == LOOM_CUDA_PLAN_LN)
		return w == np->ln.dgamma || w == np->ln.dbeta;
	if (np->kind == LOOM_CUDA_PLAN_SDPA)
		return w == np->sdpa.y;
	return 0;
}

/* Whether the plan's relu-backward fusions hold in this run: not under
 * the per-node diagnosis (it reads each node's output). */
static inline int loom_cuda_relu_fusion_on(const loom_cuda_ctx *c)
{
	return !c->diagnose;
}

/* Whether the batch norm + add + relu fusions hold in this run: training
 * (eval runs both nodes as they are), not under the diagnosis. */
static inline int loom_cuda_bn_add_on(const loom_cuda_ctx *c)
{
	return c->train && !c->diagnose;
}

/* Node v of plan p, and its source i. */
static inline const loom_node *loom_cuda_node(const loom_plan *p, loom_value v)
{
	return &p->g->nodes[v];
}

static inline const loom_node *loom_cuda_src(const loom_plan *p, loom_value v, int i)
{
	return &p->g->nodes[p->g->nodes[v].src[i]];
}

/* The other gradient a fused gradient node v adds its result into (its
 * last source where it carries LOOM_NODE_ACCUM: graph/fuse.c's
 * loom_fuse_ln_bwd_accum and loom_fuse_emb_bwd_accum), and its dtype in
 * *dt; else NULL. */
static inline const void *loom_cuda_addend(const loom_plan *p, loom_value v,
					   const loom_cuda_io *io, int *dt)
{
	const loom_node *n = loom_cuda_node(p, v);
	if (!(n->flags & LOOM_NODE_ACCUM))
		return NULL;
	*dt = io->dt[n->nsrc - 1];
	return io->src[n->nsrc - 1];
}

/* The saved slot node v writes (want == v: only a slot of its own) or
 * reads (want == LOOM_NONE: its forward's); NULL if it has none. */
static inline void *loom_cuda_saved_slot(const loom_cuda_ctx *c, loom_value v, loom_value want)
{
	const loom_cuda_node_plan *np = &c->plans[v];
	if (!c->saved || np->saved_by == LOOM_NONE || (want != LOOM_NONE && np->saved_by != want))
		return NULL;
	return c->saved + np->saved_off;
}

/* The dtype a library call runs a node in: its own (f32, f16, bf16). */
static inline cudaDataType_t loom_cuda_data_type(loom_dtype dt)
{
	return dt == LOOM_F16 ? CUDA_R_16F : dt == LOOM_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

static inline cudnnDataType_t loom_cudnn_data_type(loom_dtype dt)
{
	return dt == LOOM_F16 ? CUDNN_DATA_HALF : dt == LOOM_BF16 ? CUDNN_DATA_BFLOAT16 :
							  CUDNN_DATA_FLOAT;
}

#include "engine/cuda/fp8.h"

#endif /* LOOM_ENGINE_CUDA_INTERNAL_H */
