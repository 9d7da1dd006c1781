/*
 * engine/cuda/backend.cu — the CUDA backend: one cudaMalloc'd arena with the
 * CPU backend's layout (persist, act, ws, state) plus a small control block,
 * a compute stream and a communication stream, per-node plans (cuBLASLt,
 * cuDNN, staged casts) made in plan_create, and a table from each op to its
 * entry (loom_cuda_op_<op>, in its family's file). CPU twin:
 * engine/cpu/backend.c.
 *
 * Host and device meet only at upload (pinned staging, no wait), download,
 * and synchronize (once per step, after the loss is read: it brings the
 * control block back). The loss scaler and step counter live on the device;
 * synchronize brings them back into the training state, and a host-side
 * change (loom_load) is pushed, from pinned memory, before the next launch.
 * The step path reads no host memory that a call's return frees, so a
 * captured step can be replayed.
 */
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/options.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_internal.h"

extern "C" {
#include "engine/cuda/device.h"
#include "engine/input_slots.h"
#include "graph/ops/ops.h"
}

int loom_cuda_poison_on;
int loom_cuda_own_kernels_on;

extern "C" void loom_cuda_test_poison(int on)
{
	loom_cuda_poison_on = on;
}

extern "C" void loom_cuda_test_own_kernels(int on)
{
	loom_cuda_own_kernels_on = on;
}

/* Every op's entry; NULL: no CUDA kernel (supports_op). f64 nodes are
 * refused by supports_node: they run on the CPU only. nvcc's C++17
 * has no designated array initialisers, so a constexpr function fills the
 * table by op, which keeps each row keyed by its enum value. */
struct cuda_op_table {
	loom_cuda_op_fn *fn[LOOM_OP_COUNT];
};

static constexpr cuda_op_table make_cuda_ops()
{
	cuda_op_table t = {};
	t.fn[LOOM_OP_INPUT] = loom_cuda_op_nothing;
	t.fn[LOOM_OP_PARAM] = loom_cuda_op_nothing;
	t.fn[LOOM_OP_BUFFER] = loom_cuda_op_nothing;
	t.fn[LOOM_OP_CONV2D] = loom_cuda_op_conv2d;
	t.fn[LOOM_OP_CONV2D_BWD_DATA] = loom_cuda_op_conv2d_bwd_data;
	t.fn[LOOM_OP_CONV2D_BWD_FILTER] = loom_cuda_op_conv2d_bwd_filter;
	t.fn[LOOM_OP_CHANNEL_SUM] = loom_cuda_op_channel_sum;
	t.fn[LOOM_OP_BATCHNORM2D] = loom_cuda_op_batchnorm2d;
	t.fn[LOOM_OP_BN_BWD_DATA] = loom_cuda_op_bn_bwd_data;
	t.fn[LOOM_OP_BN_BWD_GAMMA] = loom_cuda_op_bn_bwd_gamma;
	t.fn[LOOM_OP_RELU] = loom_cuda_op_relu;
	t.fn[LOOM_OP_RELU_BWD] = loom_cuda_op_relu_bwd;
	t.fn[LOOM_OP_MAXPOOL2D] = loom_cuda_op_maxpool2d;
	t.fn[LOOM_OP_MAXPOOL2D_BWD] = loom_cuda_op_maxpool2d_bwd;
	t.fn[LOOM_OP_LINEAR] = loom_cuda_op_linear;
	t.fn[LOOM_OP_MATMUL] = loom_cuda_op_matmul;
	t.fn[LOOM_OP_ADD] = loom_cuda_op_add;
	t.fn[LOOM_OP_RESHAPE] = loom_cuda_op_nothing;
	t.fn[LOOM_OP_SUM] = loom_cuda_op_sum;
	t.fn[LOOM_OP_BROADCAST] = loom_cuda_op_broadcast;
	t.fn[LOOM_OP_SOFTMAX_CE] = loom_cuda_op_softmax_ce;
	t.fn[LOOM_OP_SOFTMAX_CE_BWD] = loom_cuda_op_softmax_ce_bwd;
	t.fn[LOOM_OP_GRAD_SEED] = loom_cuda_op_grad_seed;
	t.fn[LOOM_OP_CAST] = loom_cuda_op_cast;
	t.fn[LOOM_OP_REORDER] = loom_cuda_op_reorder;
	t.fn[LOOM_OP_GLOBAL_AVGPOOL] = loom_cuda_op_global_avgpool;
	t.fn[LOOM_OP_GLOBAL_AVGPOOL_BWD] = loom_cuda_op_global_avgpool_bwd;
#define UNARY_ENTRY(NAME, low) \
	t.fn[LOOM_OP_##NAME] = loom_cuda_op_unary; \
	t.fn[LOOM_OP_##NAME##_BWD] = loom_cuda_op_unary;
	LOOM_UNARY_OPS(UNARY_ENTRY)
#undef UNARY_ENTRY
	t.fn[LOOM_OP_EMBEDDING] = loom_cuda_op_embedding;
	t.fn[LOOM_OP_EMBEDDING_BWD] = loom_cuda_op_embedding_bwd;
	t.fn[LOOM_OP_LAYERNORM] = loom_cuda_op_layernorm;
	t.fn[LOOM_OP_LAYERNORM_BWD_DATA] = loom_cuda_op_layernorm_bwd_data;
	t.fn[LOOM_OP_LAYERNORM_BWD_GAMMA] = loom_cuda_op_layernorm_bwd_gamma;
	t.fn[LOOM_OP_ATTN_PROBS] = loom_cuda_op_attn_probs;
	t.fn[LOOM_OP_ATTN_PROBS_BWD] = loom_cuda_op_attn_probs_bwd;
	t.fn[LOOM_OP_ATTENTION] = loom_cuda_op_attention;
	t.fn[LOOM_OP_ATTENTION_BWD_PROBS] = loom_cuda_op_attention_bwd_probs;
	t.fn[LOOM_OP_ATTENTION_BWD_QKV] = loom_cuda_op_attention_bwd_qkv;
	t.fn[LOOM_OP_FP8_QDQ] = loom_cuda_op_fp8_qdq;
	return t;
}

static constexpr cuda_op_table cuda_ops = make_cuda_ops();

loom_status loom_cuda_op_nothing(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				 const loom_cuda_io *io)
{
	(void)c;
	(void)plan;
	(void)v;
	(void)io;
	return LOOM_OK;
}

extern "C" void loom_cuda_test_library_use(const void *be_ctx, int *bn_cudnn,
					   int *bgrad_epilogue)
{
	const loom_cuda_ctx *c = (const loom_cuda_ctx *)be_ctx;
	*bn_cudnn = *bgrad_epilogue = 0;
	for (int v = 0; c && v < c->n_plans; v++) {
		*bn_cudnn += c->plans[v].kind == LOOM_CUDA_PLAN_BN;
		*bgrad_epilogue += c->plans[v].kind == LOOM_CUDA_PLAN_MM &&
				   c->plans[v].mm.bgrad != LOOM_NONE;
	}
}

extern "C" void loom_cuda_test_fallbacks(const void *be_ctx, int *conv_f32, int *mm_unfused)
{
	const loom_cuda_ctx *c = (const loom_cuda_ctx *)be_ctx;
	*conv_f32 = *mm_unfused = 0;
	for (int v = 0; c && v < c->n_plans; v++) {
		const loom_cuda_node_plan *np = &c->plans[v];
		*conv_f32 += np->kind == LOOM_CUDA_PLAN_CONV && np->conv.f32;
		*mm_unfused += np->kind == LOOM_CUDA_PLAN_MM &&
			       (np->mm.bias_after || np->mm.relu_after);
	}
}

/* ------------------------------------------------------------ context */

static void cuda_free(void *ctx);

/* The context's device, made current on the calling thread by every entry:
 * a program may be run from a thread other than the one that compiled it
 * (a loader's, a user's), whose current device is another (0 unless set).
 * cudaSetDevice on the device already current is a cheap thread-local
 * check. */
loom_status loom_cuda_use_device(loom_cuda_ctx *c)
{
	return LOOM_CUDA_CHECK(cudaSetDevice(c->device), c->err, sizeof(c->err));
}

/* Every host wait of the backend passes through these two, counted
 * (cuda_counters): a replayed step should have none between run_begin
 * and run_end. */
cudaError_t loom_cuda_sync_stream(loom_cuda_ctx *c, cudaStream_t s)
{
	c->host_syncs++;
	c->syncs_in_step += c->in_step;
	return cudaStreamSynchronize(s);
}

static cudaError_t sync_event(loom_cuda_ctx *c, cudaEvent_t e)
{
	c->host_syncs++;
	c->syncs_in_step += c->in_step;
	return cudaEventSynchronize(e);
}

/* bytes of pinned host memory at *host and a pair of events (no timing)
 * that say when each of its two halves or slots was last read: the
 * double-buffered uploads, the staged inputs and the late loss. */
static loom_status pinned_pair(loom_cuda_ctx *c, void **host, size_t bytes, cudaEvent_t ev[2])
{
	loom_status st = LOOM_CUDA_CHECK(cudaMallocHost(host, bytes), c->err, sizeof(c->err));
	for (int k = 0; k < 2 && st == LOOM_OK; k++)
		st = LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&ev[k], cudaEventDisableTiming),
				     c->err, sizeof(c->err));
	return st;
}

/* Handles, both streams and the events; no plan, no memory yet. */
static loom_status cuda_init(void **out, char *err, size_t errlen)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)calloc(1, sizeof(*c));
	loom_status st;
	char dev[96];

	*out = c;
	if (!c) {
		snprintf(err, errlen, "cuda: out of host memory");
		return LOOM_ERR_NOMEM;
	}
	c->host_lr = NAN; /* the first run_begin sets the control block's */
	if ((st = LOOM_CUDA_CHECK(cudaGetDevice(&c->device), err, errlen)) != LOOM_OK)
		return st;
	st = LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), err,
			     errlen);
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&c->comm, cudaStreamNonBlocking),
				     err, errlen);
	for (int i = 0; i < LOOM_BACKEND_EVENTS && st == LOOM_OK; i++)
		st = LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&c->events[i], cudaEventDisableTiming),
				     err, errlen);
	if (st == LOOM_OK)
		st = LOOM_CUBLAS_CHECK(cublasLtCreate(&c->lt), err, errlen);
	if (st == LOOM_OK)
		st = LOOM_CUDNN_CHECK(cudnnCreate(&c->dnn), err, errlen);
	if (st == LOOM_OK)
		st = LOOM_CUDNN_CHECK(cudnnSetStream(c->dnn, c->stream), err, errlen);
	if (st != LOOM_OK)
		return st;
	if (loom_cuda_device_name(c->device, dev, sizeof(dev)) != LOOM_OK)
		snprintf(dev, sizeof(dev), "device %d", c->device);
	snprintf(c->describe, sizeof(c->describe), "cuda: %s", dev);
	return LOOM_OK;
}

static const char *cuda_error(void *ctx)
{
	return ((loom_cuda_ctx *)ctx)->err;
}

static const char *cuda_describe(void *ctx)
{
	return ((loom_cuda_ctx *)ctx)->describe;
}

static int cuda_supports_op(void *ctx, loom_op op)
{
	(void)ctx;
	return (unsigned)op < LOOM_OP_COUNT && cuda_ops.fn[op] != NULL;
}

/* Every op with an entry, in f32, f16 and bf16 (i32 labels); f64 runs on
 * the CPU only. */
static int cuda_supports_node(void *ctx, const loom_plan *p, loom_value v)
{
	const loom_node *n = &p->g->nodes[v];
	if (!cuda_supports_op(ctx, n->op) || n->dtype == LOOM_F64)
		return 0;
	for (int i = 0; i < n->nsrc; i++)
		if (p->g->nodes[n->src[i]].dtype == LOOM_F64)
			return 0;
	return 1;
}

/*
 * The ops whose CUDA entries are own kernels that read each source in its
 * dtype and write theirs in its own (loom_ld / loom_st, fp32 inside, one
 * rounding on the way out): a narrowing cast after one of them folds into
 * it, a widening cast before them goes into its readers (graph/fuse.c).
 * Not the library calls (products, convolutions, cuDNN's batch norm: one
 * dtype for all operands), nor the attention (its cuBLASLt products want
 * their sources alike), nor pooling and batch norm's own kernels (not
 * checked for it).
 */
static int loom_cuda_takes_any_dtype(loom_op op)
{
	switch (op) {
	case LOOM_OP_ADD:
	case LOOM_OP_RELU:
	case LOOM_OP_RELU_BWD:
	case LOOM_OP_CHANNEL_SUM:
	case LOOM_OP_SOFTMAX_CE:
	case LOOM_OP_SOFTMAX_CE_BWD:
	case LOOM_OP_EMBEDDING:
	case LOOM_OP_EMBEDDING_BWD:
	case LOOM_OP_LAYERNORM:
	case LOOM_OP_LAYERNORM_BWD_DATA:
	case LOOM_OP_LAYERNORM_BWD_GAMMA:
#define UNARY_CASE(NAME, low) case LOOM_OP_##NAME: case LOOM_OP_##NAME##_BWD:
	LOOM_UNARY_OPS(UNARY_CASE)
#undef UNARY_CASE
		return 1;
	default:
		return 0;
	}
}

/* ------------------------------------------------------------ planning */

/* Library calls take every operand in the node's dtype: a source of another
 * dtype is cast into ws first (nsrc_lib: how many sources the library reads). */
static size_t plan_stages(const loom_plan *p, const loom_node *n, loom_cuda_node_plan *np,
			  int nsrc_lib)
{
	size_t off = np->lib_ws;
	for (int i = 0; i < nsrc_lib && i < n->nsrc; i++) {
		const loom_node *s = &p->g->nodes[n->src[i]];
		if (s->dtype == n->dtype)
			continue;
		np->stage[i].src = i;
		np->stage[i].ws_off = off;
		off += loom_cuda_align((size_t)loom_shape_numel(&s->shape) * loom_dtype_size(n->dtype));
	}
	return off;
}

/* Node v's plan and the workspace it needs. */
static loom_status plan_node(loom_cuda_ctx *c, const loom_plan *p, loom_value v)
{
	const loom_node *n = &p->g->nodes[v];
	loom_cuda_node_plan *np = &c->plans[v];
	loom_status st = LOOM_OK;

	switch (n->op) {
	case LOOM_OP_CONV2D:
	case LOOM_OP_CONV2D_BWD_DATA:
	case LOOM_OP_CONV2D_BWD_FILTER:
		st = loom_cuda_conv_plan_make(p, c, v, np);
		np->ws = plan_stages(p, n, np, 2); /* a conv bias is read as it is */
		np->ws = loom_cuda_conv_f32_ws(p, v, np, np->ws);
		np->ws = loom_cuda_conv_ro_ws(p, v, np, np->ws);
		break;
	case LOOM_OP_LINEAR:
	case LOOM_OP_MATMUL:
		st = loom_cuda_mm_plan_make(p, c, v, np);
		np->ws = plan_stages(p, n, np, 3);
		break;
	case LOOM_OP_BATCHNORM2D:
	case LOOM_OP_BN_BWD_DATA:
		st = loom_cuda_bn_plan_make(p, c, v, np);
		np->ws = np->lib_ws; /* cuDNN's path needs its dtypes as they are */
		if (np->ws < loom_cuda_bn_sync_ws(p, v)) /* sync: its sums, own kernels */
			np->ws = loom_cuda_bn_sync_ws(p, v);
		if (np->kind == LOOM_CUDA_PLAN_NONE && np->ws < loom_cuda_bn_split_ws(p, v))
			np->ws = loom_cuda_bn_split_ws(p, v);
		break;
	case LOOM_OP_BN_BWD_GAMMA:
		np->ws = loom_cuda_bn_sync_ws(p, v);
		if (np->ws < loom_cuda_bn_split_ws(p, v))
			np->ws = loom_cuda_bn_split_ws(p, v);
		break;
	case LOOM_OP_LAYERNORM_BWD_DATA: /* one pass with its siblings (layernorm.cu) */
		st = loom_cuda_ln_plan_make(p, c, v, np);
		break;
	case LOOM_OP_LAYERNORM_BWD_GAMMA:
		np->ws = loom_cuda_ln_bwd_gamma_ws(p, v);
		break;
	case LOOM_OP_EMBEDDING_BWD:
		np->ws = loom_cuda_embedding_bwd_ws(p, v);
		break;
	case LOOM_OP_ATTN_PROBS:
	case LOOM_OP_ATTN_PROBS_BWD:
		if (n->a.attn.fused) /* cuDNN's SDPA (sdpa_cudnn.cu) */
			st = loom_cuda_sdpa_plan_make(p, c, v, np);
		else
			np->ws = loom_cuda_attn_ws(p, v);
		break;
	case LOOM_OP_SOFTMAX_CE:
		np->ws = loom_cuda_align(sizeof(double) * (size_t)p->g->nodes[n->src[0]].shape.dims[0]);
		break;
	case LOOM_OP_CHANNEL_SUM: /* LOOM_CUDA_BGRAD=kernel's column parts (elementwise.cu) */
		loom_cuda_colsum_plan(p, v, np);
		break;
	case LOOM_OP_SUM: /* the per-block sums (elementwise.cu) */
		np->ws = loom_cuda_align(sizeof(double) * LOOM_CUDA_SUM_PARTS);
		break;
	default:
		np->ws = 0;
		break;
	}
	return st;
}

/* A switch of the environment (its row of base/options.def): 0 when it is
 * "0", 1 when set otherwise, the row's default when unset or empty. */
static int env_switch(loom_opt id)
{
	const char *e = loom_opt_env(id);
	return e && *e ? strcmp(e, "0") != 0 : loom_opt_bool(id);
}

/* A switch that picks a path by name (a choice row): 1 when it is val. */
static int env_is(loom_opt id, const char *val)
{
	const char *e = loom_opt_env(id);
	return e && !strcmp(e, val);
}

static loom_status cuda_plan_create(void *ctx, const loom_plan *p, size_t *ws_bytes)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	loom_status st;

	*ws_bytes = 0;
	if ((st = loom_cuda_use_device(c)) != LOOM_OK)
		return st;
	c->plans = (loom_cuda_node_plan *)calloc(p->g->n ? p->g->n : 1, sizeof(*c->plans));
	if (!c->plans)
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_NOMEM, "cuda: out of host memory");
	c->n_plans = p->g->n;
	c->tf32 = loom_cuda_tf32_on(p);
	c->attn_off = loom_cuda_sdpa_off();
	loom_cuda_vec_on = loom_opt_bool(LOOM_OPT_CUDA_VEC);
	loom_cuda_fp8_vec_on = loom_opt_bool(LOOM_OPT_CUDA_FP8_CAST_VEC);
	loom_cuda_ln_bwd_warp_on = env_is(LOOM_OPT_CUDA_LN_BWD, "warp");
	loom_cuda_adamw_f32_on = env_is(LOOM_OPT_CUDA_ADAMW, "f32");
	loom_cuda_bgrad_kernel_on = env_is(LOOM_OPT_CUDA_BGRAD, "kernel");
	c->bn_relu_bwd = env_switch(LOOM_OPT_CUDA_BN_RELU_BWD);
	c->bn_add = env_switch(LOOM_OPT_CUDA_BN_ADD);
	c->bn_bwd_ex = env_switch(LOOM_OPT_CUDA_BN_BWD_EX);
	c->bn_bwd_fuse = env_switch(LOOM_OPT_CUDA_BN_BWD_FUSE);
	c->conv_krsc = env_switch(LOOM_OPT_CUDA_CONV_KRSC);
	c->gelu_epi = env_switch(LOOM_OPT_CUDA_GELU_EPILOGUE);
	c->bgrad_epi = env_switch(LOOM_OPT_CUDA_BGRAD_EPILOGUE) && !loom_cuda_bgrad_kernel_on;
	c->lt_align = env_switch(LOOM_OPT_CUDA_LT_ALIGN);
	c->lt_pad = env_switch(LOOM_OPT_CUDA_LT_PAD);
	c->fp8_gemm = env_switch(LOOM_OPT_CUDA_FP8_GEMM);
	c->fp8_amax_producer = env_switch(LOOM_OPT_CUDA_FP8_AMAX_PRODUCER);
	c->fp8_amax_optim = env_switch(LOOM_OPT_CUDA_FP8_AMAX_OPTIM);
	c->fp8_fast_accum = loom_cuda_fp8_fast_accum_mode();
	for (int v = 0; v < p->g->n; v++) {
		c->plans[v].bn_add = c->plans[v].bn_add_z = c->plans[v].bn_add_by = LOOM_NONE;
		for (int i = 0; i < LOOM_MAX_SRC; i++)
			c->plans[v].stage[i].src = -1;
		c->plans[v].mm.bgrad = LOOM_NONE;
		c->plans[v].mm.gelu = c->plans[v].mm.aux = LOOM_NONE;
		c->plans[v].bn.dgamma = c->plans[v].bn.dbeta = LOOM_NONE;
		c->plans[v].saved_by = LOOM_NONE;
		c->plans[v].fused_into = LOOM_NONE;
		c->plans[v].ce_bwd = LOOM_NONE;
		c->plans[v].fp8_amax = LOOM_NONE;
		c->plans[v].fp8_wamax = -1;
		c->plans[v].bn.relu_bwd = c->plans[v].bn.relu_y = c->plans[v].bn.relu_dy = LOOM_NONE;
		c->plans[v].bn.fuse.relu_bwd = c->plans[v].bn.fuse.y = LOOM_NONE;
		c->plans[v].bn.fuse.dy = c->plans[v].bn.fuse.beta = LOOM_NONE;
		c->plans[v].conv.krsc_by = LOOM_NONE;
	}
	/* FP8: the capability check and the scale slots the products read. */
	if ((st = loom_cuda_fp8_plan(c, p)) != LOOM_OK)
		return st;
	/* The convolutions' algorithm search measures on scratch memory of
	 * its own, freed before the arena is allocated (alloc, later). */
	loom_cuda_conv_search_begin(p, c);
	st = LOOM_OK;
	for (int v = 0; v < p->g->n && st == LOOM_OK; v++)
		st = plan_node(c, p, v);
	loom_cuda_conv_search_end(c);
	if (st == LOOM_OK)
		st = loom_cuda_fuse_plan(c, p);
	/* The shared workspace: the largest any node asks for, after the
	 * passes over the plan (fuse_plan.cu) that widen some. */
	for (loom_value v = 0; v < p->g->n && st == LOOM_OK; v++)
		if (c->plans[v].ws > *ws_bytes)
			*ws_bytes = c->plans[v].ws;
	for (loom_value v = 0; v < p->g->n && st == LOOM_OK; v++)
		if (!loom_cuda_formats_ok(c, p, v)) {
			char lb[96];
			st = loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_UNSUPPORTED,
				       "cuda: %s holds NHWC but its kernel here is NCHW only "
				       "(LOOM_CUDA_NHWC=0 plans NCHW)",
				       loom_node_label(p->g, v, lb, sizeof(lb)));
		}
	return st;
}

/* LOOM_CUDA_UPLOAD=graph: every input this rank holds, by arena address,
 * for the staged upload (loom_cuda_input). */
static loom_status list_inputs(loom_cuda_ctx *c, const loom_plan *p, const loom_arena *arena)
{
	c->in_graph = loom_opt_choice(LOOM_OPT_CUDA_UPLOAD) == 0; /* graph */
	if (!c->in_graph)
		return LOOM_OK;
	free(c->inputs);
	c->n_inputs = 0;
	if (!(c->inputs = (loom_cuda_input *)calloc((size_t)p->g->n, sizeof(*c->inputs))))
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_NOMEM, "cuda: out of memory for the staged inputs");
	for (int v = 0; v < p->g->n; v++) {
		if (p->g->nodes[v].op != LOOM_OP_INPUT || !loom_plan_holds(p, v))
			continue;
		loom_cuda_input *in = &c->inputs[c->n_inputs++];
		in->dst = loom_arena_ptr(arena, p, v);
		in->bytes = loom_plan_value_bytes(p, v);
		in->slot = -1;
		in->out = -1;
	}
	return LOOM_OK;
}

/* The one device allocation: persist | bucket | act | ws | state | ctl |
 * slots | chunks | the chunks' norm parts | the saved region (plan_saved),
 * carved into arena and c; *o_ctl: where the part a run zeroes ends. */
static loom_status arena_carve(loom_cuda_ctx *c, const loom_plan *p, loom_arena *arena,
			       size_t *o_ctl)
{
	c->n_chunks = 0;
	for (int s = 0; s < p->n_pieces; s++)
		c->n_chunks += (int)((p->pieces[s].n + LOOM_CUDA_OPT_CHUNK - 1) / LOOM_CUDA_OPT_CHUNK);

	size_t o_bucket = loom_cuda_align(p->mp.persist_bytes);
	size_t o_act = o_bucket + loom_cuda_align(p->mp.bucket_bytes);
	size_t o_ws = o_act + loom_cuda_align(p->mp.act_bytes);
	size_t o_state = o_ws + loom_cuda_align(p->ws_bytes);
	*o_ctl = o_state + loom_cuda_align(loom_plan_state_region_bytes(p));
	size_t o_slots = *o_ctl + loom_cuda_align(sizeof(loom_cuda_ctl));
	size_t o_chunks = o_slots + loom_cuda_align(sizeof(loom_cuda_opt_slot) * p->n_pieces);
	size_t o_norm = o_chunks + loom_cuda_align(sizeof(loom_cuda_opt_chunk) * c->n_chunks);
	size_t o_saved = o_norm + loom_cuda_align(sizeof(double) * c->n_chunks);
	size_t total = o_saved + c->saved_bytes;

	loom_status st = LOOM_CUDA_CHECK(cudaMalloc((void **)&c->base, total), c->err, sizeof(c->err));
	if (st != LOOM_OK)
		return st;
	c->base_bytes = total;
	arena->persist = c->base;
	arena->bucket = c->base + o_bucket;
	arena->act = c->base + o_act;
	arena->ws = c->base + o_ws;
	arena->state = c->base + o_state;
	c->arena = arena;
	c->ctl = (loom_cuda_ctl *)(c->base + *o_ctl);
	c->d_slots = (loom_cuda_opt_slot *)(c->base + o_slots);
	c->d_chunks = (loom_cuda_opt_chunk *)(c->base + o_chunks);
	c->d_norm_parts = (double *)(c->base + o_norm);
	c->saved = c->saved_bytes ? c->base + o_saved : NULL;
	return LOOM_OK;
}

/* Zeros as the CPU arena, or (test hook) all-ones bytes: NaN in f32, f16
 * and bf16, so an element no kernel writes cannot pass a test. The hook is
 * the program's from here on: every run of it poisons too. */
static loom_status arena_clear(loom_cuda_ctx *c, size_t o_ctl)
{
	c->poison = loom_cuda_poison_on;
	loom_status st =
		LOOM_CUDA_CHECK(cudaMemsetAsync(c->base, c->poison ? 0xff : 0, o_ctl, c->stream),
				c->err, sizeof(c->err));
	/* The saved slots too under the hook: a backward that reads a slot
	 * its forward did not fill gets NaN statistics or argmax 255 (no
	 * gradient), and fails the comparison with the CPU. */
	if (st == LOOM_OK && c->poison && c->saved_bytes)
		st = LOOM_CUDA_CHECK(cudaMemsetAsync(c->saved, 0xff, c->saved_bytes, c->stream),
				     c->err, sizeof(c->err));
	return st;
}

/* The pinned host buffers (the double-buffered upload, the control block's
 * stage) and their events. */
static loom_status pinned_make(loom_cuda_ctx *c)
{
	c->pinned_half = (size_t)4 << 20;
	loom_status st = pinned_pair(c, (void **)&c->pinned, 2 * c->pinned_half, c->pinned_ev);
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(cudaMallocHost((void **)&c->ctl_stage, sizeof(loom_cuda_ctl)),
				     c->err, sizeof(c->err));
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&c->ctl_stage_ev,
							      cudaEventDisableTiming),
				     c->err, sizeof(c->err));
	return st;
}

/* The control block's first contents (ts's scaler and step, no verdicts)
 * uploaded through its stage, which the host keeps as its own copy. */
static loom_status ctl_start(loom_cuda_ctx *c, const loom_train_state *ts)
{
	loom_cuda_ctl *ctl = c->ctl_stage;
	memset(ctl, 0, sizeof(*ctl));
	ctl->scaler = ts->scaler;
	ctl->step = ts->step;
	ctl->ce_node = -1;
	ctl->ce_row = INT32_MAX;
	ctl->first_nonfinite = -1;
	ctl->emb_node = -1;
	ctl->emb_pos = INT64_MAX;
	loom_status st = LOOM_CUDA_CHECK(cudaMemcpyAsync(c->ctl, ctl, sizeof(*ctl),
							 cudaMemcpyHostToDevice, c->stream),
					 c->err, sizeof(c->err));
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(cudaEventRecord(c->ctl_stage_ev, c->stream), c->err,
				     sizeof(c->err));
	if (st != LOOM_OK)
		return st;
	c->host_scaler = ts->scaler;
	c->host_step = ts->step;
	return LOOM_OK;
}

static loom_status cuda_alloc(void *ctx, const loom_plan *p, const loom_train_state *ts,
			      loom_arena *arena)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	loom_status st;
	size_t o_ctl;

	if ((st = loom_cuda_use_device(c)) != LOOM_OK)
		return st;
	if ((st = arena_carve(c, p, arena, &o_ctl)) != LOOM_OK ||
	    (st = arena_clear(c, o_ctl)) != LOOM_OK)
		return st;

	if ((st = list_inputs(c, p, arena)) != LOOM_OK)
		return st;
	c->loss_node_on = loom_opt_bool(LOOM_OPT_CUDA_LOSS_NODE);

	if ((st = pinned_make(c)) != LOOM_OK || (st = ctl_start(c, ts)) != LOOM_OK ||
	    (st = loom_cuda_opt_tables_upload(c, p)) != LOOM_OK)
		return st;
	return LOOM_CUDA_CHECK(loom_cuda_sync_stream(c, c->stream), c->err, sizeof(c->err));
}

/* Teardown: errors here have nowhere to go and nothing to undo. */

/* The streams idle: no bucket's sum still writes into the arena freed
 * after (the executor waited for its collectives: loom_program_free). */
static void free_sync_streams(loom_cuda_ctx *c)
{
	if (c->stream)
		(void)loom_cuda_sync_stream(c, c->stream);
	if (c->comm)
		(void)loom_cuda_sync_stream(c, c->comm);
}

/* The captured graph and its progress marks. */
static void free_graph(loom_cuda_ctx *c)
{
	if (c->graph_exec)
		(void)cudaGraphExecDestroy(c->graph_exec);
	if (c->graph)
		(void)cudaGraphDestroy(c->graph);
	if (c->mark_host)
		(void)cudaFreeHost(c->mark_host);
	if (c->serial_dev)
		(void)cudaFree(c->serial_dev);
}

/* The staged inputs' slots and the asynchronous loss's copies. */
static void free_inputs(loom_cuda_ctx *c)
{
	for (int i = 0; i < c->n_inputs; i++) {
		if (c->inputs[i].host[0])
			(void)cudaFreeHost(c->inputs[i].host[0]);
		for (int k = 0; k < 2; k++)
			if (c->inputs[i].read[k])
				(void)cudaEventDestroy(c->inputs[i].read[k]);
	}
	free(c->inputs);
	if (c->async)
		(void)cudaFreeHost(c->async);
	for (int i = 0; i < 2; i++)
		if (c->async_ev[i])
			(void)cudaEventDestroy(c->async_ev[i]);
}

/* The per-node library plans. */
static void free_plans(loom_cuda_ctx *c)
{
	for (int v = 0; v < c->n_plans; v++) {
		if (c->plans[v].kind == LOOM_CUDA_PLAN_CONV)
			loom_cuda_conv_plan_free(&c->plans[v]);
		else if (c->plans[v].kind == LOOM_CUDA_PLAN_MM)
			loom_cuda_mm_plan_free(&c->plans[v]);
		else if (c->plans[v].kind == LOOM_CUDA_PLAN_BN)
			loom_cuda_bn_plan_free(&c->plans[v]);
		else if (c->plans[v].kind == LOOM_CUDA_PLAN_SDPA)
			loom_cuda_sdpa_plan_free(&c->plans[v]);
	}
	free(c->plans);
	loom_cuda_fp8_wamax_free(c);
	loom_cuda_fp8_free(c);
}

/* The timers, the arena, the sums, the pinned buffers and their events. */
static void free_memory(loom_cuda_ctx *c)
{
	for (int i = 0; i < c->n_timers; i++)
		if (c->timers[i])
			(void)cudaEventDestroy(c->timers[i]);
	free(c->timers);
	if (c->base)
		(void)cudaFree(c->base);
	if (c->accum_base)
		(void)cudaFree(c->accum_base);
	if (c->pinned)
		(void)cudaFreeHost(c->pinned);
	if (c->ctl_stage)
		(void)cudaFreeHost(c->ctl_stage);
	for (int i = 0; i < 2; i++)
		if (c->pinned_ev[i])
			(void)cudaEventDestroy(c->pinned_ev[i]);
	if (c->ctl_stage_ev)
		(void)cudaEventDestroy(c->ctl_stage_ev);
	loom_cuda_fp8_state_free(c);
}

/* What init made: the events, the library handles, the streams. */
static void free_handles(loom_cuda_ctx *c)
{
	for (int i = 0; i < LOOM_BACKEND_EVENTS; i++)
		if (c->events[i])
			(void)cudaEventDestroy(c->events[i]);
	if (c->dnn)
		(void)cudnnDestroy(c->dnn);
	if (c->lt)
		(void)cublasLtDestroy(c->lt);
	if (c->comm)
		(void)cudaStreamDestroy(c->comm);
	if (c->stream)
		(void)cudaStreamDestroy(c->stream);
}

static void cuda_free(void *ctx)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	if (!c)
		return;
	(void)loom_cuda_use_device(c);
	free_sync_streams(c);
	free_graph(c);
	free_inputs(c);
	free_plans(c);
	free_memory(c);
	free_handles(c);
	(void)cudaGetLastError();
	free(c);
}

/* ------------------------------------------------------------ host <-> device */

/* The staged input whose arena address and size are dst and bytes, or
 * NULL (LOOM_CUDA_UPLOAD=graph only). */
static loom_cuda_input *staged_input(loom_cuda_ctx *c, const void *dst, size_t bytes)
{
	for (int i = 0; c->in_graph && i < c->n_inputs; i++)
		if (c->inputs[i].dst == dst && c->inputs[i].bytes == bytes)
			return &c->inputs[i];
	return NULL;
}

/* Input in's two pinned slots and their events, made at its first use. */
static loom_status input_slots_make(loom_cuda_ctx *c, loom_cuda_input *in)
{
	loom_status st = LOOM_OK;
	if (!in->host[0]) {
		st = pinned_pair(c, (void **)&in->host[0], 2 * in->bytes, in->read);
		if (st != LOOM_OK)
			return st;
		in->host[1] = in->host[0] + in->bytes;
	}
	return st;
}

/* The host fills a slot of input in: the one it filled last while that
 * is not queued yet, else the other one, once the last copy that read it
 * has run (the only wait, outside any step). */
static loom_status input_fill(loom_cuda_ctx *c, loom_cuda_input *in, const void *src)
{
	loom_status st = input_slots_make(c, in);
	if (st != LOOM_OK)
		return st;
	int k = loom_input_slot_fill(in->slot, in->pending);
	/* An event never recorded counts as passed. */
	if ((st = LOOM_CUDA_CHECK(sync_event(c, in->read[k]), c->err, sizeof(c->err))) != LOOM_OK)
		return st;
	memcpy(in->host[k], src, in->bytes);
	in->slot = k;
	in->pending = 1;
	return LOOM_OK;
}

/* loom_input_buffer: the slot other than the one filled last (whose batch
 * a run still to come may take), once the last copy that read it has run,
 * handed to the host to write the next batch into; LOOM_ERR_UNSUPPORTED
 * for an input not staged (the program stages it itself). */
static loom_status cuda_input_slot(void *ctx, void *dst, size_t bytes, void **host)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	loom_status st;
	if ((st = loom_cuda_use_device(c)) != LOOM_OK)
		return st;
	loom_cuda_input *in = staged_input(c, dst, bytes);
	if (!in)
		return LOOM_ERR_UNSUPPORTED;
	if (in->out >= 0)
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_STATE,
				  "cuda: the staged input at %p has its slot handed out already", dst);
	if ((st = input_slots_make(c, in)) != LOOM_OK)
		return st;
	int k = loom_input_slot_take(in->slot);
	/* An event never recorded counts as passed. */
	if ((st = LOOM_CUDA_CHECK(sync_event(c, in->read[k]), c->err, sizeof(c->err))) != LOOM_OK)
		return st;
	in->out = k;
	*host = in->host[k];
	return LOOM_OK;
}

/* The slot handed out holds the next batch: the next run copies it (an
 * eager run's copy, or the graph's node pointed at it), no host copy. */
static loom_status cuda_input_commit(void *ctx, void *dst, size_t bytes)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	loom_cuda_input *in = staged_input(c, dst, bytes);
	if (!in || in->out < 0)
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_STATE,
				  "cuda: no slot of the staged input at %p is handed out", dst);
	in->slot = in->out;
	in->pending = 1;
	in->out = -1;
	return LOOM_OK;
}

static loom_status cuda_input_release(void *ctx, void *dst, size_t bytes)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	loom_cuda_input *in = staged_input(c, dst, bytes);
	if (in)
		in->out = -1;
	return LOOM_OK;
}

/* The inputs filled since their last copy, copied now in the compute
 * stream's order (an eager run; a graph's own copy nodes otherwise);
 * with_node: also those the captured graph copies itself. */
static loom_status inputs_queue(loom_cuda_ctx *c, int with_node)
{
	loom_status st = LOOM_OK;
	for (int i = 0; i < c->n_inputs && st == LOOM_OK; i++) {
		loom_cuda_input *in = &c->inputs[i];
		if (!in->pending || (in->node && !with_node))
			continue;
		st = LOOM_CUDA_CHECK(cudaMemcpyAsync(in->dst, in->host[in->slot], in->bytes,
						     cudaMemcpyHostToDevice, c->stream),
				     c->err, sizeof(c->err));
		if (st == LOOM_OK)
			st = LOOM_CUDA_CHECK(cudaEventRecord(in->read[in->slot], c->stream), c->err,
					     sizeof(c->err));
		in->pending = 0;
	}
	return st;
}

/* The captured graph g gains a copy node per input uploaded so far, from
 * the slot filled last, ahead of every node it recorded. */
static loom_status inputs_into_graph(loom_cuda_ctx *c, cudaGraph_t g)
{
	size_t n = 0;
	cudaGraphNode_t *roots = NULL;
	if (!c->in_graph)
		return LOOM_OK;
	loom_status st = LOOM_CUDA_CHECK(cudaGraphGetRootNodes(g, NULL, &n), c->err,
					 sizeof(c->err));
	if (st != LOOM_OK)
		return st;
	if (n && !(roots = (cudaGraphNode_t *)malloc(n * sizeof(*roots))))
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_NOMEM, "cuda: out of memory for the graph's roots");
	if (n)
		st = LOOM_CUDA_CHECK(cudaGraphGetRootNodes(g, roots, &n), c->err, sizeof(c->err));
	for (int i = 0; i < c->n_inputs && st == LOOM_OK; i++) {
		loom_cuda_input *in = &c->inputs[i];
		in->node = NULL;
		if (in->slot < 0)
			continue;
		st = LOOM_CUDA_CHECK(cudaGraphAddMemcpyNode1D(&in->node, g, NULL, 0, in->dst,
							      in->host[in->slot], in->bytes,
							      cudaMemcpyHostToDevice),
				     c->err, sizeof(c->err));
		for (size_t r = 0; r < n && st == LOOM_OK; r++)
#if CUDART_VERSION >= 13000
			st = LOOM_CUDA_CHECK(cudaGraphAddDependencies(g, &in->node, &roots[r], NULL, 1),
					     c->err, sizeof(c->err));
#else
			st = LOOM_CUDA_CHECK(cudaGraphAddDependencies(g, &in->node, &roots[r], 1),
					     c->err, sizeof(c->err));
#endif
		in->node_slot = in->slot;
	}
	free(roots);
	if (st != LOOM_OK)
		for (int i = 0; i < c->n_inputs; i++)
			c->inputs[i].node = NULL;
	return st;
}

/* The copy of the loss and of the control block into async slot k, as
 * the arguments of a memcpy node. */
static void loss_copy_args(loom_cuda_ctx *c, int k, int which, void **dst, const void **src,
			   size_t *bytes)
{
	loom_cuda_async_slot *a = &c->async[k];
	if (which == 0) {
		*dst = c->loss_f64 ? (void *)&a->loss64 : (void *)&a->loss32;
		*src = c->loss_src;
		*bytes = c->loss_f64 ? sizeof(double) : sizeof(float);
	} else {
		*dst = &a->ctl;
		*src = c->ctl;
		*bytes = sizeof(a->ctl);
	}
}

/* LOOM_CUDA_LOSS_NODE=1, the loss read one step late (a loss_async before
 * the capture): the captured graph g ends with the copies of the loss and
 * of the control block into the slot loss_async takes next, after every
 * node it recorded (its leaves). */
static loom_status loss_into_graph(loom_cuda_ctx *c, cudaGraph_t g)
{
	size_t n = 0, n_leaves = 0;
	cudaGraphNode_t *nodes = NULL;
	loom_status st;
	c->loss_node[0] = c->loss_node[1] = NULL;
	if (!c->loss_node_on || !c->async || !c->loss_src)
		return LOOM_OK;
	if ((st = LOOM_CUDA_CHECK(cudaGraphGetNodes(g, NULL, &n), c->err, sizeof(c->err))) !=
	    LOOM_OK)
		return st;
	if (n && !(nodes = (cudaGraphNode_t *)malloc(n * sizeof(*nodes))))
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_NOMEM, "cuda: out of memory for the graph's nodes");
	if (n)
		st = LOOM_CUDA_CHECK(cudaGraphGetNodes(g, nodes, &n), c->err, sizeof(c->err));
	/* The leaves: nodes nothing depends on, gathered at the front. */
	for (size_t i = 0; i < n && st == LOOM_OK; i++) {
		size_t deps = 0;
#if CUDART_VERSION >= 13000
		st = LOOM_CUDA_CHECK(cudaGraphNodeGetDependentNodes(nodes[i], NULL, NULL, &deps),
				     c->err, sizeof(c->err));
#else
		st = LOOM_CUDA_CHECK(cudaGraphNodeGetDependentNodes(nodes[i], NULL, &deps), c->err,
				     sizeof(c->err));
#endif
		if (st == LOOM_OK && deps == 0)
			nodes[n_leaves++] = nodes[i];
	}
	int k = c->async_next;
	for (int w = 0; w < 2 && st == LOOM_OK; w++) {
		void *dst;
		const void *src;
		size_t bytes;
		loss_copy_args(c, k, w, &dst, &src, &bytes);
		st = LOOM_CUDA_CHECK(cudaGraphAddMemcpyNode1D(&c->loss_node[w], g, nodes, n_leaves, dst,
							      src, bytes, cudaMemcpyDeviceToHost),
				     c->err, sizeof(c->err));
	}
	free(nodes);
	if (st != LOOM_OK) {
		c->loss_node[0] = c->loss_node[1] = NULL;
		return st;
	}
	c->loss_node_slot = k;
	return LOOM_OK;
}

/* Before a launch: the loss nodes write the slot loss_async takes next. */
static loom_status loss_before_launch(loom_cuda_ctx *c)
{
	loom_status st = LOOM_OK;
	if (!c->loss_node[0])
		return LOOM_OK;
	int k = c->async_next;
	for (int w = 0; w < 2 && st == LOOM_OK && k != c->loss_node_slot; w++) {
		void *dst;
		const void *src;
		size_t bytes;
		loss_copy_args(c, k, w, &dst, &src, &bytes);
		st = LOOM_CUDA_CHECK(cudaGraphExecMemcpyNodeSetParams1D(c->graph_exec, c->loss_node[w],
									dst, src, bytes,
									cudaMemcpyDeviceToHost),
				     c->err, sizeof(c->err));
	}
	if (st == LOOM_OK) {
		c->loss_node_slot = k;
		c->loss_nodes_ran = 1;
	}
	return st;
}

/* Before a launch of the graph: each copy node reads the slot filled
 * last (an update of the executable's node, no new graph; an eager run
 * since may have copied it already, the graph copies it again); inputs
 * the graph has no node for are copied ahead of it. */
static loom_status inputs_before_launch(loom_cuda_ctx *c)
{
	loom_status st = LOOM_OK;
	for (int i = 0; i < c->n_inputs && st == LOOM_OK; i++) {
		loom_cuda_input *in = &c->inputs[i];
		if (!in->node)
			continue;
		if (in->slot != in->node_slot)
			st = LOOM_CUDA_CHECK(cudaGraphExecMemcpyNodeSetParams1D(
						     c->graph_exec, in->node, in->dst,
						     in->host[in->slot], in->bytes,
						     cudaMemcpyHostToDevice),
					     c->err, sizeof(c->err));
		in->node_slot = in->slot;
		in->pending = 0;
	}
	return st == LOOM_OK ? inputs_queue(c, 0) : st;
}

/* After a launch: the slot each copy node read is busy until it ran. */
static loom_status inputs_after_launch(loom_cuda_ctx *c)
{
	loom_status st = LOOM_OK;
	for (int i = 0; i < c->n_inputs && st == LOOM_OK; i++)
		if (c->inputs[i].node)
			st = LOOM_CUDA_CHECK(cudaEventRecord(c->inputs[i].read[c->inputs[i].node_slot],
							     c->stream),
					     c->err, sizeof(c->err));
	return st;
}

/* Copies through the two pinned halves: the host copies into one half while
 * the DMA of the other may still run; it waits only when it comes back to a
 * half whose copy has not finished. No stream sync. */
static loom_status cuda_upload(void *ctx, void *dst, const void *src, size_t bytes)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	const unsigned char *s = (const unsigned char *)src;
	unsigned char *d = (unsigned char *)dst;
	loom_status st = LOOM_OK;

	/* a weight's or master's bytes: its cast's amax from the optimizer
	 * is stale until the next update (LOOM_CUDA_FP8_AMAX_OPTIM) */
	if ((st = loom_cuda_use_device(c)) != LOOM_OK ||
	    (st = loom_cuda_fp8_wamax_touch(c, dst, bytes)) != LOOM_OK)
		return st;
	loom_cuda_input *in = staged_input(c, dst, bytes);
	if (in)
		return input_fill(c, in, src);

	while (bytes > 0 && st == LOOM_OK) {
		size_t n = bytes < c->pinned_half ? bytes : c->pinned_half;
		int k = c->pinned_next;
		unsigned char *stage = c->pinned + (size_t)k * c->pinned_half;
		st = LOOM_CUDA_CHECK(sync_event(c, c->pinned_ev[k]), c->err, sizeof(c->err));
		if (st != LOOM_OK)
			break;
		memcpy(stage, s, n);
		st = LOOM_CUDA_CHECK(cudaMemcpyAsync(d, stage, n, cudaMemcpyHostToDevice, c->stream),
				     c->err, sizeof(c->err));
		if (st == LOOM_OK)
			st = LOOM_CUDA_CHECK(cudaEventRecord(c->pinned_ev[k], c->stream),
					     c->err, sizeof(c->err));
		c->pinned_next = k ^ 1;
		s += n;
		d += n;
		bytes -= n;
	}
	return st;
}

/* A host-side change of the scaler or step (loom_load) since the last sync
 * goes to the device before anything reads it there. Async, from pinned
 * memory the context owns (never from this stack frame). */
loom_status loom_cuda_push_host_state(loom_cuda_ctx *c, const loom_train_state *ts)
{
	if (memcmp(&ts->scaler, &c->host_scaler, sizeof(ts->scaler)) == 0 &&
	    ts->step == c->host_step)
		return LOOM_OK;
	/* The staging may still feed the previous push's copy. */
	loom_status st = LOOM_CUDA_CHECK(sync_event(c, c->ctl_stage_ev), c->err,
					 sizeof(c->err));
	if (st != LOOM_OK)
		return st;
	memset(c->ctl_stage, 0, sizeof(*c->ctl_stage));
	c->ctl_stage->scaler = ts->scaler;
	c->ctl_stage->step = ts->step;
	/* scaler and step lead the struct: one copy, the flags untouched. */
	st = LOOM_CUDA_CHECK(cudaMemcpyAsync(c->ctl, c->ctl_stage, offsetof(loom_cuda_ctl, t),
					     cudaMemcpyHostToDevice, c->stream),
			     c->err, sizeof(c->err));
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(cudaEventRecord(c->ctl_stage_ev, c->stream), c->err,
				     sizeof(c->err));
	if (st == LOOM_OK) {
		c->host_scaler = ts->scaler;
		c->host_step = ts->step;
	}
	return st;
}

static loom_status cuda_download(void *ctx, void *dst, const void *src, size_t bytes)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	loom_status st = LOOM_OK;

	if ((st = loom_cuda_use_device(c)) != LOOM_OK || (st = inputs_queue(c, 1)) != LOOM_OK)
		return st;

	if (bytes > 0)
		st = LOOM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost,
						     c->stream),
				     c->err, sizeof(c->err));
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(loom_cuda_sync_stream(c, c->stream), c->err, sizeof(c->err));
	return st;
}

loom_status loom_cuda_clear_faults(loom_cuda_ctx *c)
{
	/* static: the copies may read them after this returns */
	static const int32_t ce[2] = { -1, INT32_MAX }, emb_node = -1;
	static const int64_t emb_pos = INT64_MAX;
	loom_status st;

	st = LOOM_CUDA_CHECK(cudaMemcpyAsync(&c->ctl->ce_node, ce, sizeof(ce),
					     cudaMemcpyHostToDevice, c->stream),
			     c->err, sizeof(c->err));
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(cudaMemcpyAsync(&c->ctl->emb_node, &emb_node,
						     sizeof(emb_node), cudaMemcpyHostToDevice,
						     c->stream),
				     c->err, sizeof(c->err));
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(cudaMemcpyAsync(&c->ctl->emb_pos, &emb_pos, sizeof(emb_pos),
						     cudaMemcpyHostToDevice, c->stream),
				     c->err, sizeof(c->err));
	return st;
}

/* A fault's culprit (a bad label, a bad id: the int32 at src on the
 * device) read back, every fault flag cleared, and the stream drained.
 * An error path: it waits. */
loom_status loom_cuda_fault_read(loom_cuda_ctx *c, const int32_t *src, int32_t *val)
{
	loom_status st = LOOM_CUDA_CHECK(cudaMemcpyAsync(val, src, sizeof(*val),
							 cudaMemcpyDeviceToHost, c->stream),
					 c->err, sizeof(c->err));
	if (st == LOOM_OK)
		st = loom_cuda_clear_faults(c);
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(loom_cuda_sync_stream(c, c->stream), c->err, sizeof(c->err));
	return st;
}

/*
 * The training state the device kept (h, a copy of the control block)
 * into ts and the host's own copy; a bad label or a bad id it saw,
 * reported in the CPU's words. Every path that brings the control block
 * back comes here: synchronize, which loom_run's synchronous path calls
 * right after downloading the loss (so the failed step's loom_run
 * returns the error, as the CPU's does; a later checkpoint save or free
 * synchronizes too), and loss_async's take (LOOM_ASYNC_LOSS: one step
 * late). The step itself changed nothing: the decision kernel skipped the
 * update (optim.cu). Both faults in one step: the CPU stops at the first
 * of the two nodes in step order, so that one is reported; every flag is
 * cleared either way.
 */
static loom_status ctl_into_ts(loom_cuda_ctx *c, const loom_plan *p, loom_train_state *ts,
			       const loom_cuda_ctl *h)
{
	ts->scaler = c->host_scaler = h->scaler;
	ts->step = c->host_step = h->step;
	ts->grad_norm = h->grad_norm;
	const int ce = h->ce_node >= 0 && h->ce_node < p->g->n;
	const int emb = h->emb_node >= 0 && h->emb_node < p->g->n;
	if (emb && (!ce || loom_step_of(p, h->emb_node) < loom_step_of(p, h->ce_node)))
		return loom_cuda_report_bad_id(c, p, h);
	if (ce)
		return loom_cuda_report_bad_label(c, p, h);
	return LOOM_OK;
}

static loom_status cuda_synchronize(void *ctx, const loom_plan *p, loom_train_state *ts)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	loom_cuda_ctl h;
	loom_status st;

	if ((st = loom_cuda_use_device(c)) != LOOM_OK || (st = inputs_queue(c, 1)) != LOOM_OK)
		return st;
	if ((st = loom_cuda_push_host_state(c, ts)) != LOOM_OK)
		return st;
	st = LOOM_CUDA_CHECK(cudaMemcpyAsync(&h, c->ctl, sizeof(h), cudaMemcpyDeviceToHost,
					     c->stream),
			     c->err, sizeof(c->err));
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(loom_cuda_sync_stream(c, c->stream), c->err, sizeof(c->err));
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(loom_cuda_sync_stream(c, c->comm), c->err, sizeof(c->err));
	if (st != LOOM_OK)
		return st;
	/* A loss read late (loss_async) still pending: its copy has landed. */
	if (c->async && c->async_pending >= 0) {
		const loom_cuda_async_slot *a = &c->async[c->async_pending];
		ts->last_loss = a->f64 ? a->loss64 : (double)a->loss32;
		c->async_pending = -1;
	}
	return ctl_into_ts(c, p, ts, &h);
}

/* Slot k's copy has landed: its step's loss, scaler and step into ts. */
static loom_status async_take(loom_cuda_ctx *c, const loom_plan *p, loom_train_state *ts, int k)
{
	loom_status st = LOOM_CUDA_CHECK(sync_event(c, c->async_ev[k]), c->err,
					 sizeof(c->err));
	if (st != LOOM_OK)
		return st;
	const loom_cuda_async_slot *a = &c->async[k];
	loom_cuda_ctl h = a->ctl;
	ts->last_loss = a->f64 ? a->loss64 : (double)a->loss32;
	return ctl_into_ts(c, p, ts, &h);
}

static loom_status cuda_loss_async(void *ctx, const loom_plan *p, const void *loss, int f64,
				   loom_train_state *ts)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	loom_status st;

	if ((st = loom_cuda_use_device(c)) != LOOM_OK)
		return st;
	if (!c->async) {
		st = pinned_pair(c, (void **)&c->async, 2 * sizeof(*c->async), c->async_ev);
		if (st != LOOM_OK)
			return st;
		c->async_next = 0;
		c->async_pending = -1;
	}
	int k = c->async_next;
	if (c->async_pending == k && (st = async_take(c, p, ts, k)) != LOOM_OK)
		return st;
	loom_cuda_async_slot *a = &c->async[k];
	a->f64 = f64;
	c->loss_src = loss;
	c->loss_f64 = f64;
	/* The graph just launched copied both into slot k itself. */
	if (!c->loss_nodes_ran)
		st = LOOM_CUDA_CHECK(cudaMemcpyAsync(f64 ? (void *)&a->loss64 : (void *)&a->loss32,
						     loss, f64 ? sizeof(double) : sizeof(float),
						     cudaMemcpyDeviceToHost, c->stream),
				     c->err, sizeof(c->err));
	if (st == LOOM_OK && !c->loss_nodes_ran)
		st = LOOM_CUDA_CHECK(cudaMemcpyAsync(&a->ctl, c->ctl, sizeof(a->ctl),
						     cudaMemcpyDeviceToHost, c->stream),
				     c->err, sizeof(c->err));
	c->loss_nodes_ran = 0;
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(cudaEventRecord(c->async_ev[k], c->stream), c->err,
				     sizeof(c->err));
	if (st != LOOM_OK)
		return st;
	int prev = c->async_pending;
	c->async_pending = k;
	c->async_next = k ^ 1;
	return prev >= 0 ? async_take(c, p, ts, prev) : LOOM_OK;
}

static cudaStream_t stream_of(loom_cuda_ctx *c, loom_stream s)
{
	return s == LOOM_STREAM_COMM ? c->comm : c->stream;
}

/* Whether event is one of the context's, its device made current. */
static loom_status event_ready(loom_cuda_ctx *c, int event)
{
	if (event < 0 || event >= LOOM_BACKEND_EVENTS)
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_INVALID, "cuda: no event %d", event);
	return loom_cuda_use_device(c);
}

static loom_status cuda_event_record(void *ctx, int event, loom_stream stream)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	loom_status st = event_ready(c, event);
	if (st != LOOM_OK)
		return st;
	return LOOM_CUDA_CHECK(cudaEventRecord(c->events[event], stream_of(c, stream)), c->err,
			       sizeof(c->err));
}

static loom_status cuda_event_wait(void *ctx, int event, loom_stream stream)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	loom_status st = event_ready(c, event);
	if (st != LOOM_OK)
		return st;
	return LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream_of(c, stream), c->events[event], 0),
			       c->err, sizeof(c->err));
}

/* ------------------------------------------------------------ dispatch */

loom_status loom_cuda_run_staged(loom_cuda_ctx *c, const loom_plan *p, loom_value v,
				 const loom_cuda_io *io, loom_cuda_run_fn *run)
{
	const loom_node *n = &p->g->nodes[v];
	const loom_cuda_node_plan *np = &c->plans[v];
	void *src[LOOM_MAX_SRC];
	loom_status st;

	memcpy(src, io->src, sizeof(src));
	for (int i = 0; i < n->nsrc; i++) {
		if (np->stage[i].src < 0)
			continue;
		const loom_node *s = &p->g->nodes[n->src[i]];
		void *dst = c->arena->ws + np->stage[i].ws_off;
		st = loom_cuda_cast(c->err, c->stream, src[i], s->dtype, dst, n->dtype,
				    loom_shape_numel(&s->shape));
		if (st != LOOM_OK)
			return st;
		src[i] = dst;
	}
	return run(p, c, v, np, src, io->out);
}

static loom_status run_node(loom_cuda_ctx *c, const loom_plan *p, loom_value v)
{
	const loom_node *n = &p->g->nodes[v];
	loom_cuda_io io;

	/* A relu backward the split batch-norm backward does (plan_relu_bwd). */
	if (c->plans[v].fused_into != LOOM_NONE && loom_cuda_relu_fusion_on(c))
		return LOOM_OK;
	/* Batch norm + add + relu (plan_bn_add): the add runs both. */
	if (c->plans[v].bn_add_by != LOOM_NONE && loom_cuda_bn_add_on(c))
		return LOOM_OK;
	if (c->plans[v].bn_add != LOOM_NONE && loom_cuda_bn_add_on(c)) {
		loom_status st = loom_cuda_bn_add_run(p, c, v);
		if (st != LOOM_ERR_UNSUPPORTED)
			return st;
		/* Refused at run time: both nodes as they are from now on. */
		loom_value b = c->plans[v].bn_add;
		c->plans[v].bn_add = LOOM_NONE;
		c->plans[b].bn_add_by = LOOM_NONE;
		c->err[0] = 0;
		if ((st = run_node(c, p, b)) != LOOM_OK)
			return st;
	}
	memset(&io, 0, sizeof(io));
	for (int i = 0; i < n->nsrc; i++) {
		io.src[i] = loom_arena_ptr(c->arena, p, n->src[i]);
		io.dt[i] = p->g->nodes[n->src[i]].dtype;
	}
	io.out = loom_arena_ptr(c->arena, p, v);
	io.odt = n->dtype;
	/* Stored fp8 sources this node does not read as codes (fp8.cu). */
	if (c->plans[v].fp8_dec) {
		loom_status st = loom_cuda_fp8_decode_sources(c, p, v, &io);
		if (st != LOOM_OK)
			return st;
	}
	return cuda_ops.fn[n->op](c, p, v, &io);
}

/* Test hook: NaN into the value v writes, before it runs, and into the
 * values its library call makes besides. */
static loom_status poison_node(loom_cuda_ctx *c, const loom_plan *p, loom_value v)
{
	loom_status st = LOOM_OK;
	/* A relu backward the batch-norm backward does writes nothing (its
	 * output may share bytes with the sources that backward reads). */
	if (c->plans[v].fused_into != LOOM_NONE && loom_cuda_relu_fusion_on(c))
		return LOOM_OK;
	const loom_cuda_bn_plan *bp = &c->plans[v].bn;
	int keep_out = 0; /* v's bytes hold the relu's y or dy it reads */
	if (bp->relu_bwd != LOOM_NONE && loom_cuda_relu_fusion_on(c)) {
		int same;
		keep_out = loom_cuda_bytes_meet(p, v, bp->relu_y, &same) ||
			   loom_cuda_bytes_meet(p, v, bp->relu_dy, &same);
	}
	if (bp->fuse.ops != LOOM_CUDA_BN_EX_NONE && loom_cuda_relu_fusion_on(c)) {
		int same; /* cuDNN's Ex backward: dx may lie exactly on y or dy */
		keep_out |= loom_cuda_bytes_meet(p, v, bp->fuse.y, &same) ||
			    loom_cuda_bytes_meet(p, v, bp->fuse.dy, &same);
	}
	/* The Ex backward with BN_ADD_ACTIVATION writes the relu backward's
	 * output (dz), apart from all it reads (bn_fuse.c). */
	if (bp->fuse.ops == LOOM_CUDA_BN_EX_ADD_ACT && loom_cuda_relu_fusion_on(c) &&
	    p->mp.root[bp->fuse.relu_bwd] == bp->fuse.relu_bwd &&
	    p->mp.inplace[bp->fuse.relu_bwd] == LOOM_NONE)
		st = LOOM_CUDA_CHECK(cudaMemsetAsync(loom_arena_ptr(c->arena, p, bp->fuse.relu_bwd),
						     0xff, loom_plan_value_bytes(p, bp->fuse.relu_bwd),
						     c->stream),
				     c->err, sizeof(c->err));
	for (loom_value w = v; w != LOOM_NONE && st == LOOM_OK;
	     w = w == v ? loom_sibling_first(p, v) : loom_sibling_next(p, w)) {
		const loom_node *n = &p->g->nodes[w];
		if ((w != v && !loom_cuda_plan_makes(&c->plans[v], w)) || (w == v && keep_out))
			continue;
		/* A value written in place over its source would poison the source. */
		if (loom_op_is_leaf((loom_op)n->op) || n->op == LOOM_OP_RESHAPE || p->mp.root[w] != w ||
		    p->mp.inplace[w] != LOOM_NONE)
			continue;
		st = LOOM_CUDA_CHECK(cudaMemsetAsync(loom_arena_ptr(c->arena, p, w), 0xff,
						     loom_plan_value_bytes(p, w), c->stream),
				     c->err, sizeof(c->err));
	}
	return st;
}

/* Diagnosis (LOOM_EXEC_DIAGNOSE): waits for the verdict of the per-node
 * checks so that loom_run reports it after this run, as on the CPU. */
static loom_status diagnose_verdict(loom_cuda_ctx *c, loom_train_state *ts)
{
	int32_t first = -1;
	loom_status st = LOOM_CUDA_CHECK(cudaMemcpyAsync(&first, &c->ctl->first_nonfinite,
							 sizeof(first), cudaMemcpyDeviceToHost,
							 c->stream),
					 c->err, sizeof(c->err));
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(loom_cuda_sync_stream(c, c->stream), c->err, sizeof(c->err));
	if (st == LOOM_OK && first >= 0)
		ts->first_nonfinite = first;
	return st;
}

static loom_status cuda_run_begin(void *ctx, const loom_plan *p, const loom_arena *arena,
				  loom_train_state *ts, unsigned flags)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	loom_status st;

	c->arena = arena;
	c->train = (flags & LOOM_EXEC_TRAIN) != 0;
	c->flags = flags;
	c->diagnose = (flags & LOOM_EXEC_DIAGNOSE) && ts->first_nonfinite == LOOM_NONE;
	if ((st = loom_cuda_use_device(c)) != LOOM_OK ||
	    (st = loom_cuda_push_host_state(c, ts)) != LOOM_OK)
		return st;
	/* Staged inputs: an eager run copies them now; a replay leaves them
	 * to the graph's copy nodes. */
	if (!(flags & LOOM_EXEC_REPLAY) && (st = inputs_queue(c, 1)) != LOOM_OK)
		return st;
	if (!(flags & LOOM_EXEC_REPLAY))
		c->loss_nodes_ran = 0;
	/* The schedule's rate into the control block (a kernel launch, no
	 * wait), where a captured update reads it. */
	if (!(ts->lr == c->host_lr)) {
		if ((st = loom_cuda_set_lr(c, ts->lr, c->stream)) != LOOM_OK)
			return st;
		c->host_lr = ts->lr;
	}
	c->in_step = 1;
	if (c->poison)
		return LOOM_CUDA_CHECK(cudaMemsetAsync(arena->ws, 0xff, p->ws_bytes, c->stream),
				       c->err, sizeof(c->err));
	return LOOM_OK;
}

static loom_status cuda_run_end(void *ctx, const loom_plan *p, const loom_arena *arena,
				loom_train_state *ts)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	(void)p;
	(void)arena;
	c->in_step = 0;
	return c->diagnose ? diagnose_verdict(c, ts) : LOOM_OK;
}

/* ------------------------------------------------------------ the step as a graph */

/*
 * Progress marks: how the host (the communicator's watchdog) sees each
 * collective of a replayed step end, a captured event being unqueryable for
 * a replay. The graph's head bumps a serial in device memory; after each
 * collective the communication stream runs a one-thread kernel that copies
 * that serial into the collective's word of mapped pinned memory, which
 * the host reads without a call. Why a kernel and not cuStreamWriteValue64
 * (also capturable): a write-value node writes the value fixed at capture,
 * the same in every replay, so the host could not tell this launch's write
 * from the last one's without resetting the word between launches (racing
 * the previous launch still running) or patching the node before each
 * replay (a host call per launch and per collective); the kernel reads the
 * serial the launch itself bumped, so nothing changes on the host between
 * replays. It costs one tiny launch per collective, inside the graph.
 */
__global__ void mark_bump_kernel(unsigned long long *serial)
{
	*serial += 1;
}

__global__ void mark_write_kernel(const unsigned long long *serial, volatile unsigned long long *word)
{
	*word = *serial;
	__threadfence_system();
}

static loom_status cuda_mark_words(void *ctx, int n, const volatile uint64_t **words)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	loom_status st;
	*words = NULL;
	if ((st = loom_cuda_use_device(c)) != LOOM_OK)
		return st;
	if (n <= 0)
		return LOOM_OK;
	if (c->mark_host && c->n_marks >= n) {
		*words = c->mark_host;
		return LOOM_OK;
	}
	if (c->mark_host)
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_STATE, "cuda: progress marks made for %d, not %d",
				 c->n_marks, n);
	size_t bytes = sizeof(uint64_t) * (size_t)n;
	void *dev = NULL;
	if ((st = LOOM_CUDA_CHECK(cudaHostAlloc((void **)&c->mark_host, bytes, cudaHostAllocMapped),
				  c->err, sizeof(c->err))) != LOOM_OK)
		return st;
	memset(c->mark_host, 0, bytes);
	if ((st = LOOM_CUDA_CHECK(cudaHostGetDevicePointer(&dev, c->mark_host, 0), c->err,
				  sizeof(c->err))) != LOOM_OK ||
	    (!c->serial_dev &&
	     (st = LOOM_CUDA_CHECK(cudaMalloc((void **)&c->serial_dev, sizeof(uint64_t)), c->err,
				   sizeof(c->err))) != LOOM_OK) ||
	    (st = LOOM_CUDA_CHECK(cudaMemset(c->serial_dev, 0, sizeof(uint64_t)), c->err,
				  sizeof(c->err))) != LOOM_OK) {
		(void)cudaFreeHost(c->mark_host);
		c->mark_host = NULL;
		return st;
	}
	c->mark_dev = (uint64_t *)dev;
	c->n_marks = n;
	c->mark_serial = 0;
	*words = c->mark_host;
	return LOOM_OK;
}

static loom_status cuda_mark_record(void *ctx, int slot, loom_stream stream)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	if (!c->capturing)
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_STATE, "cuda: a progress mark outside a capture");
	if (slot < 0 || slot >= c->n_marks)
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_INVALID, "cuda: no progress mark %d (of %d)", slot,
				 c->n_marks);
	mark_write_kernel<<<1, 1, 0, stream_of(c, stream)>>>(
		(const unsigned long long *)c->serial_dev,
		(volatile unsigned long long *)(c->mark_dev + slot));
	return LOOM_CUDA_CHECK(cudaGetLastError(), c->err, sizeof(c->err));
}

static uint64_t cuda_mark_serial(void *ctx)
{
	return ((loom_cuda_ctx *)ctx)->mark_serial;
}

/* Records what the executor queues next (ThreadLocal: another thread, the
 * communicator's watchdog, may still query its events meanwhile). From
 * here on the update reads its rate from the control block. */
static loom_status cuda_capture_begin(void *ctx, const loom_plan *p)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	loom_status st;
	(void)p;
	if ((st = loom_cuda_use_device(c)) != LOOM_OK)
		return st;
	if (c->graph_exec)
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_STATE, "cuda: the step was captured already");
	c->lr_device = 1;
	st = LOOM_CUDA_CHECK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal),
			     c->err, sizeof(c->err));
	c->capturing = st == LOOM_OK;
	/* The graph's head: the launch's serial, which its marks write. */
	if (st == LOOM_OK && c->serial_dev) {
		mark_bump_kernel<<<1, 1, 0, c->stream>>>((unsigned long long *)c->serial_dev);
		st = LOOM_CUDA_CHECK(cudaGetLastError(), c->err, sizeof(c->err));
	}
	return st;
}

static loom_status cuda_capture_end(void *ctx, const loom_plan *p, int keep)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	cudaGraph_t g = NULL;
	loom_status st;
	(void)p;
	if (!c->capturing)
		return keep ? loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_STATE, "cuda: no capture to end") : LOOM_OK;
	c->capturing = 0;
	cudaError_t e = cudaStreamEndCapture(c->stream, &g);
	if (!keep || e != cudaSuccess) {
		if (g)
			(void)cudaGraphDestroy(g);
		(void)cudaGetLastError(); /* an invalidated capture is not sticky */
		if (!keep)
			return LOOM_OK;
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_BACKEND, "cuda: capturing the step: %s",
				 cudaGetErrorString(e));
	}
	if ((st = inputs_into_graph(c, g)) == LOOM_OK && (st = loss_into_graph(c, g)) == LOOM_OK)
		st = LOOM_CUDA_CHECK(cudaGraphInstantiate(&c->graph_exec, g, 0), c->err,
				     sizeof(c->err));
	if (st != LOOM_OK) {
		(void)cudaGraphDestroy(g);
		c->graph_exec = NULL;
		return st;
	}
	c->graph = g;
	c->captures++;
	/* Recorded, not run: the captured step runs now (its marks' serial
	 * is the launch's count, as the head's bump on the device). */
	c->mark_serial++;
	c->loss_nodes_ran = c->loss_node[0] != NULL;
	st = LOOM_CUDA_CHECK(cudaGraphLaunch(c->graph_exec, c->stream), c->err, sizeof(c->err));
	return st == LOOM_OK ? inputs_after_launch(c) : st;
}

static loom_status cuda_replay(void *ctx, const loom_plan *p)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	loom_status st;
	(void)p;
	if ((st = loom_cuda_use_device(c)) != LOOM_OK)
		return st;
	if (!c->graph_exec)
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_STATE, "cuda: replay before a capture");
	if ((st = inputs_before_launch(c)) != LOOM_OK || (st = loss_before_launch(c)) != LOOM_OK)
		return st;
	c->graph_launches++;
	c->mark_serial++;
	st = LOOM_CUDA_CHECK(cudaGraphLaunch(c->graph_exec, c->stream), c->err, sizeof(c->err));
	return st == LOOM_OK ? inputs_after_launch(c) : st;
}

static void cuda_counters(void *ctx, loom_backend_counters *out)
{
	const loom_cuda_ctx *c = (const loom_cuda_ctx *)ctx;
	out->host_syncs = c->host_syncs;
	out->syncs_in_step = c->syncs_in_step;
	out->captures = c->captures;
	out->replays = c->graph_launches;
}

static loom_status cuda_run_node(void *ctx, const loom_plan *p, const loom_arena *arena,
				 loom_value v)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	loom_status st;
	c->arena = arena;
	if (c->poison && (st = poison_node(c, p, v)) != LOOM_OK)
		return st;
	return run_node(c, p, v);
}

/* The library call for v (cuBLASLt's bias-gradient epilogue, cuDNN's batch
 * norm backward) wrote sibling w already. */
static int cuda_makes_sibling(void *ctx, const loom_plan *p, loom_value v, loom_value w)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	return loom_cuda_plan_makes(&c->plans[v], w) || loom_cuda_ln_residual_makes(p, v, w);
}

/* Marks the device's first non-finite node; run_end reads the verdict. */
static loom_status cuda_check_finite(void *ctx, const loom_plan *p, const loom_arena *arena,
				     loom_train_state *ts, loom_value w)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	const loom_node *n = &p->g->nodes[w];
	(void)ts;
	/* a batch norm the add ran (its own output never written) */
	if (c->plans[w].bn_add_by != LOOM_NONE && loom_cuda_bn_add_on(c))
		return LOOM_OK;
	/* fp8 codes (a stored rounding, or a view of one): not in n's dtype;
	 * finite where their source is, which was checked before them */
	if (loom_fp8_stored_under(p->g, w))
		return LOOM_OK;
	return loom_cuda_mark_nonfinite(c->err, c->stream, loom_arena_ptr(arena, p, w), n->dtype,
					loom_shape_numel(&n->shape), w, c->ctl);
}

static loom_status cuda_accum(void *ctx, const loom_plan *p, const loom_arena *arena, int s,
			      int fold)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	c->arena = arena;
	return loom_cuda_accum(c, p, s, fold);
}

static loom_status cuda_alloc_accum(void *ctx, const loom_plan *p, loom_arena *arena)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	size_t bytes = p->accum_bytes ? p->accum_bytes : 64;
	loom_status st = loom_cuda_use_device(c);
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(cudaMalloc((void **)&c->accum_base, bytes), c->err,
				     sizeof(c->err));
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(cudaMemsetAsync(c->accum_base, 0, bytes, c->stream), c->err,
				     sizeof(c->err));
	if (st != LOOM_OK)
		return st;
	arena->accum = c->accum_base;
	return LOOM_OK;
}

static void *cuda_stream_handle(void *ctx, loom_stream s)
{
	return (void *)stream_of((loom_cuda_ctx *)ctx, s);
}

static loom_status cuda_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	loom_status st = loom_cuda_fp8_wamax_touch(c, dst, bytes); /* as upload */
	if (st != LOOM_OK)
		return st;
	return LOOM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream),
			       c->err, sizeof(c->err));
}

/* Trace timers: timing events, made as the trace first needs them. Slot 0
 * opens a run's record: its host time is taken as the event's, and the
 * others are read as that time plus the device's elapsed time. */
static loom_status cuda_timer_record(void *ctx, int slot, loom_stream s)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	loom_status st;
	if (slot < 0)
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_INVALID, "cuda: no trace timer %d", slot);
	if (slot >= c->n_timers) {
		int n = slot < 256 ? 512 : 2 * slot;
		cudaEvent_t *t = (cudaEvent_t *)realloc(c->timers, sizeof(*t) * (size_t)n);
		if (!t)
			return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_NOMEM, "cuda: out of memory for trace timers");
		memset(t + c->n_timers, 0, sizeof(*t) * (size_t)(n - c->n_timers));
		c->timers = t;
		c->n_timers = n;
	}
	if (!c->timers[slot] &&
	    (st = LOOM_CUDA_CHECK(cudaEventCreate(&c->timers[slot]), c->err, sizeof(c->err))) != LOOM_OK)
		return st;
	if (slot == 0) {
		/* The origin: the compute stream's work so far is done first. */
		if ((st = LOOM_CUDA_CHECK(loom_cuda_sync_stream(c, c->stream), c->err,
					  sizeof(c->err))) != LOOM_OK)
			return st;
		c->timer0_host = loom_trace_now();
	}
	return LOOM_CUDA_CHECK(cudaEventRecord(c->timers[slot], stream_of(c, s)), c->err,
			       sizeof(c->err));
}

static loom_status cuda_timer_read(void *ctx, int slot, double *seconds)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	float ms = 0;
	if (slot < 0 || slot >= c->n_timers || !c->timers[slot] || !c->timers[0])
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_INVALID, "cuda: no trace timer %d", slot);
	loom_status st = LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, c->timers[0], c->timers[slot]),
					 c->err, sizeof(c->err));
	*seconds = c->timer0_host + ms * 1e-3;
	return st;
}

/* The planning group's ln_bwd_accum_fusable, by the gradient node's op. */
static int cuda_bwd_accum_fusable(const loom_graph *g, loom_value d, loom_value s, int other)
{
	if (g->nodes[d].op == LOOM_OP_EMBEDDING_BWD)
		return loom_cuda_emb_bwd_accum_fusable(g, d, s, other);
	return g->nodes[d].op == LOOM_OP_LAYERNORM_BWD_DATA &&
	       loom_cuda_ln_bwd_accum_fusable(g, d, s, other);
}

/* --dump-graph: each family's note on how node v runs (conv_cudnn.cu,
 * sdpa_cudnn.cu, loss.cu, layernorm.cu, matmul_cublaslt.cu, bn.cu), and
 * what does a node's work where another node's call does it. */
static void cuda_node_note(void *ctx, const loom_plan *p, loom_value v, char *buf, size_t len)
{
	const loom_cuda_ctx *c = (const loom_cuda_ctx *)ctx;
	buf[0] = 0;
	if (!c || !c->plans || v < 0 || v >= c->n_plans)
		return;
	const loom_cuda_node_plan *np = &c->plans[v];
	const loom_node *n = &p->g->nodes[v];
	if (np->kind == LOOM_CUDA_PLAN_CONV) {
		loom_cuda_conv_note(n, &np->conv, buf, len);
		return;
	}
	if (n->op == LOOM_OP_ATTN_PROBS || n->op == LOOM_OP_ATTN_PROBS_BWD) {
		loom_cuda_sdpa_note(p, v, np, c->attn_off, buf, len);
		return;
	}
	if (np->fused_into != LOOM_NONE) {
		const loom_op by = (loom_op)p->g->nodes[np->fused_into].op;
		snprintf(buf, len, "done by %d (%s)", (int)np->fused_into,
			 by == LOOM_OP_SOFTMAX_CE ? "the fused classifier's forward" :
			 by == LOOM_OP_LINEAR || by == LOOM_OP_MATMUL ? "the product's GELU epilogue" :
			 c->plans[np->fused_into].kind == LOOM_CUDA_PLAN_BN ?
								      "cudnn's Ex batch-norm backward" :
								      "the split batch-norm backward");
		return;
	}
	if (n->op == LOOM_OP_SOFTMAX_CE || n->op == LOOM_OP_SOFTMAX_CE_BWD) {
		loom_cuda_ce_note(c, p, v, buf, len);
		return;
	}
	if (n->op == LOOM_OP_LAYERNORM || n->op == LOOM_OP_LAYERNORM_BWD_DATA) {
		loom_cuda_ln_note(c, p, v, buf, len);
		return;
	}
	if ((n->op == LOOM_OP_LINEAR || n->op == LOOM_OP_MATMUL) &&
	    (np->mm.gelu != LOOM_NONE || np->kind == LOOM_CUDA_PLAN_MM)) {
		loom_cuda_mm_note(np, buf, len);
		return;
	}
	if (n->op == LOOM_OP_FP8_QDQ && loom_cuda_fp8_amax_note(c, p, v, buf, len))
		return;
	if (n->op == LOOM_OP_EMBEDDING_BWD && (n->flags & LOOM_NODE_ACCUM)) {
		snprintf(buf, len, "rows added into the tied table's other gradient");
		return;
	}
	loom_cuda_bn_note(c, p, v, buf, len);
}

/* The fp8 storage pass's question (engine/compile_passes.c), before the
 * context exists: under LOOM_CUDA_FP8_GEMM=1 the products cuBLASLt's FP8
 * path takes read their stored operands' codes as they are (matmul_fp8.cu;
 * one it declines at plan time has them decoded first, fp8.cu); off, the
 * emulation's products read bf16 values, and nothing is stored. */
static int cuda_reads_fp8(const loom_graph *g, loom_value v, int i)
{
	return env_switch(LOOM_OPT_CUDA_FP8_GEMM) && loom_cuda_mm_fp8_reads(g, v, i);
}

static const loom_backend_planning cuda_planning = {
	.takes_any_dtype = loom_cuda_takes_any_dtype,
	.node_formats = loom_cuda_node_formats,
	.attn_fusable = loom_cuda_attn_fusable,
	.ln_residual_fusable = loom_cuda_ln_residual_fusable,
	.ln_bwd_accum_fusable = cuda_bwd_accum_fusable,
	/* the classifier's rows a multiple of 128 (50257 -> 50304, llm.c's),
	 * so its three products run at aligned leading dimensions */
	.vocab_pad = 128,
	.node_note = cuda_node_note,
	.makes_sibling = cuda_makes_sibling,
	.reads_fp8 = cuda_reads_fp8,
};

static const loom_backend_accumulate cuda_accumulate = {
	.alloc_accum = cuda_alloc_accum,
	.accum = cuda_accum,
};

static const loom_backend_sharded cuda_sharded = {
	.grads_finite = loom_cuda_grads_finite,
	.grads_finite_device = loom_cuda_grads_finite_device,
	.grad_sumsq = loom_cuda_grad_sumsq,
	.grad_sumsq_device = loom_cuda_grad_sumsq_device,
};

static const loom_backend_timing cuda_timing = {
	.timer_record = cuda_timer_record,
	.timer_read = cuda_timer_read,
	.counters = cuda_counters,
};

static const loom_backend_async_loss cuda_async_loss = {
	.loss_async = cuda_loss_async,
};

static const loom_backend_graph_ops cuda_graph_ops = {
	.capture_begin = cuda_capture_begin,
	.capture_end = cuda_capture_end,
	.replay = cuda_replay,
};

static const loom_backend_marks cuda_marks = {
	.mark_words = cuda_mark_words,
	.mark_record = cuda_mark_record,
	.mark_serial = cuda_mark_serial,
};

static const loom_backend_input cuda_input = {
	.input_slot = cuda_input_slot,
	.input_commit = cuda_input_commit,
	.input_release = cuda_input_release,
};

static const loom_backend_fp8 cuda_fp8 = {
	.fp8_upload = loom_cuda_fp8_state_upload,
	.fp8_download = loom_cuda_fp8_state_download,
	.fp8_reduce_begin = loom_cuda_fp8_state_reduce_begin,
	.fp8_step_end = loom_cuda_fp8_state_step_end,
};

static const loom_backend loom_cuda_backend = {
	.name = "cuda",
	.caps = LOOM_BE_FUSES_ALL | LOOM_BE_ASYNC_STREAMS | LOOM_BE_CLIPS_GRAD |
		LOOM_BE_FUSES_SOME_CASTS | LOOM_BE_FUSES_ATTENTION | LOOM_BE_FUSES_LN_RESIDUAL |
		LOOM_BE_FUSES_LN_BWD_ACCUM,
	.init = cuda_init,
	.free = cuda_free,
	.error = cuda_error,
	.describe = cuda_describe,
	.supports_op = cuda_supports_op,
	.supports_node = cuda_supports_node,
	.plan_create = cuda_plan_create,
	.alloc = cuda_alloc,
	.run_begin = cuda_run_begin,
	.run_end = cuda_run_end,
	.run_node = cuda_run_node,
	.check_finite = cuda_check_finite,
	.optim = loom_cuda_optim,
	.stream_handle = cuda_stream_handle,
	.upload = cuda_upload,
	.download = cuda_download,
	.copy = cuda_copy,
	.synchronize = cuda_synchronize,
	.event_record = cuda_event_record,
	.event_wait = cuda_event_wait,
	.planning = &cuda_planning,
	.accumulate = &cuda_accumulate,
	.sharded = &cuda_sharded,
	.timing = &cuda_timing,
	.async_loss = &cuda_async_loss,
	.graph = &cuda_graph_ops,
	.marks = &cuda_marks,
	.input = &cuda_input,
	.fp8 = &cuda_fp8,
};

extern "C" const loom_backend *loom_cuda_backend_get(void)
{
	return &loom_cuda_backend;
}
