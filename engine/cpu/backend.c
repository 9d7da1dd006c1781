/*
 * engine/cpu/backend.c — the CPU backend: host memory for the arena and a
 * table from each op to its entry in ops.h. f32 and f64 run natively; f16
 * and bf16 are storage formats emulated exactly: half sources are widened
 * into f32 scratch, the f32 kernel runs, and a half result is rounded to
 * nearest even on the way out — the numerics of a GPU that reads half,
 * accumulates in fp32 and writes half.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/options.h"
#include "engine/cpu/bf16_node.h"
#include "engine/cpu/cpu_path.h"
#include "engine/cpu/ops.h"
#include "engine/cpu/optim.h"
#include "base/elem.h"
#include "graph/ops/ops.h"

/* The rows the family files define (one file per op family). */
extern const loom_cpu_op loom_cpu_embedding, loom_cpu_embedding_bwd;          /* embedding.c */
extern const loom_cpu_op loom_cpu_norm, loom_cpu_norm_bwd_data,
	loom_cpu_norm_bwd_gamma;            /* norm_bf16.c: layer norm's and RMS norm's */
extern const loom_cpu_op loom_cpu_attn_probs, loom_cpu_attn_probs_bwd, loom_cpu_attention,
	loom_cpu_attention_bwd_probs, loom_cpu_attention_bwd_qkv;             /* attention.c */
extern const loom_cpu_op loom_cpu_softmax_ce, loom_cpu_softmax_ce_bwd;        /* softmax_xent.c */
extern const loom_cpu_op loom_cpu_fp8_qdq;                                    /* fp8_qdq.c */

/* Batch norm's workspace needs no context: the table's shape for it. */
static size_t bn_ws(const loom_cpu_ctx *c, const loom_plan *pl, loom_value v, size_t elem)
{
	(void)c;
	return loom_cpu_bn_workspace(pl, v, elem);
}

/* A row for an older family's run function (ops_<family>.c). */
#define ROW(...) (&(const loom_cpu_op){ __VA_ARGS__ })

/* Every op's row, one per op (ops.h); NULL: the CPU cannot run it
 * (supports_op). */
static const loom_cpu_op *const cpu_ops[LOOM_OP_COUNT] = {
	[LOOM_OP_INPUT] = ROW(loom_cpu_op_nothing, .raw = 1),
	[LOOM_OP_PARAM] = ROW(loom_cpu_op_nothing, .raw = 1),
	[LOOM_OP_BUFFER] = ROW(loom_cpu_op_nothing, .raw = 1),
	[LOOM_OP_CONV2D] = ROW(loom_cpu_op_conv2d, .ws = loom_cpu_conv_node_ws),
	[LOOM_OP_CONV2D_BWD_DATA] = ROW(loom_cpu_op_conv2d_bwd_data, .ws = loom_cpu_conv_node_ws),
	[LOOM_OP_CONV2D_BWD_FILTER] = ROW(loom_cpu_op_conv2d_bwd_filter, .ws = loom_cpu_conv_node_ws),
	[LOOM_OP_CHANNEL_SUM] = ROW(loom_cpu_op_channel_sum),
	[LOOM_OP_BATCHNORM2D] = ROW(loom_cpu_op_batchnorm2d, .ws = bn_ws),
	[LOOM_OP_BN_BWD_DATA] = ROW(loom_cpu_op_bn_bwd_data, .ws = bn_ws),
	[LOOM_OP_BN_BWD_GAMMA] = ROW(loom_cpu_op_bn_bwd_gamma, .ws = bn_ws),
	[LOOM_OP_RELU] = ROW(loom_cpu_op_relu),
	[LOOM_OP_RELU_BWD] = ROW(loom_cpu_op_relu_bwd),
	[LOOM_OP_MAXPOOL2D] = ROW(loom_cpu_op_maxpool2d),
	[LOOM_OP_MAXPOOL2D_BWD] = ROW(loom_cpu_op_maxpool2d_bwd),
	[LOOM_OP_LINEAR] = ROW(loom_cpu_op_linear),
	[LOOM_OP_MATMUL] = ROW(loom_cpu_op_matmul),
	[LOOM_OP_ADD] = ROW(loom_cpu_op_add),
	[LOOM_OP_RESHAPE] = ROW(loom_cpu_op_nothing, .raw = 1),
	[LOOM_OP_SUM] = ROW(loom_cpu_op_sum),
	[LOOM_OP_BROADCAST] = ROW(loom_cpu_op_broadcast),
	[LOOM_OP_SOFTMAX_CE] = &loom_cpu_softmax_ce,
	[LOOM_OP_SOFTMAX_CE_BWD] = &loom_cpu_softmax_ce_bwd,
	[LOOM_OP_GRAD_SEED] = ROW(loom_cpu_op_grad_seed),
	[LOOM_OP_CAST] = ROW(loom_cpu_op_cast, .raw = 1),
	[LOOM_OP_GLOBAL_AVGPOOL] = ROW(loom_cpu_op_global_avgpool),
	[LOOM_OP_GLOBAL_AVGPOOL_BWD] = ROW(loom_cpu_op_global_avgpool),
#define UNARY_ENTRY(NAME, low) [LOOM_OP_##NAME] = ROW(loom_cpu_op_unary), [LOOM_OP_##NAME##_BWD] = ROW(loom_cpu_op_unary),
	LOOM_UNARY_OPS(UNARY_ENTRY)
#undef UNARY_ENTRY
	[LOOM_OP_EMBEDDING] = &loom_cpu_embedding,
	[LOOM_OP_EMBEDDING_BWD] = &loom_cpu_embedding_bwd,
	[LOOM_OP_LAYERNORM] = &loom_cpu_norm,
	[LOOM_OP_LAYERNORM_BWD_DATA] = &loom_cpu_norm_bwd_data,
	[LOOM_OP_LAYERNORM_BWD_GAMMA] = &loom_cpu_norm_bwd_gamma,
	[LOOM_OP_ATTN_PROBS] = &loom_cpu_attn_probs,
	[LOOM_OP_ATTN_PROBS_BWD] = &loom_cpu_attn_probs_bwd,
	[LOOM_OP_ATTENTION] = &loom_cpu_attention,
	[LOOM_OP_ATTENTION_BWD_PROBS] = &loom_cpu_attention_bwd_probs,
	[LOOM_OP_ATTENTION_BWD_QKV] = &loom_cpu_attention_bwd_qkv,
	[LOOM_OP_REORDER] = ROW(loom_cpu_op_reorder, .raw = 1),
	[LOOM_OP_RMSNORM] = &loom_cpu_norm,
	[LOOM_OP_RMSNORM_BWD_DATA] = &loom_cpu_norm_bwd_data,
	[LOOM_OP_RMSNORM_BWD_GAMMA] = &loom_cpu_norm_bwd_gamma,
	[LOOM_OP_FP8_QDQ] = &loom_cpu_fp8_qdq,
};
#undef ROW

/* Op op's row; an empty one (no run, no workspace) for an op the CPU
 * cannot run, which the plan may still hold (an all-reduce the executor
 * hands to the communicator). */
static const loom_cpu_op *cpu_op(loom_op op)
{
	static const loom_cpu_op none;
	return cpu_ops[op] ? cpu_ops[op] : &none;
}

loom_status loom_cpu_op_nothing(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				const loom_cpu_io *io)
{
	(void)ctx;
	(void)plan;
	(void)v;
	(void)io;
	return LOOM_OK;
}

static int is_half(loom_dtype dt)
{
	return dt == LOOM_F16 || dt == LOOM_BF16;
}

static size_t align64(size_t x)
{
	return (x + 63) & ~(size_t)63;
}

static const loom_node *src_node(const loom_plan *pl, const loom_node *n, int i)
{
	return &pl->g->nodes[n->src[i]];
}

static int emulated(const loom_plan *pl, const loom_node *n)
{
	if (cpu_op(n->op)->raw)
		return 0;
	if (is_half(n->dtype))
		return 1;
	for (int i = 0; i < n->nsrc; i++)
		if (is_half(src_node(pl, n, i)->dtype))
			return 1;
	return 0;
}

/* LOOM_CPU_BF16_NATIVE_GPT=0 in the environment: no row's bf16 entry runs
 * (the widen / f32 / round path for every op, as before they existed). */
static int family_bf16_on(void)
{
	static int on = -1;
	return loom_opt_bool_once(LOOM_OPT_CPU_BF16_NATIVE_GPT, &on);
}

/* The bf16 mask of node n for its row's bf16 entry (ops.h: bit i source i,
 * OUT the result), or ~0u when some float is neither f32 nor bf16 (f16,
 * f64: the emulation's). */
static unsigned bf16_mask(const loom_plan *pl, const loom_node *n)
{
	unsigned half = 0;
	for (int i = 0; i < n->nsrc; i++) {
		loom_dtype dt = src_node(pl, n, i)->dtype;
		if (dt == LOOM_BF16)
			half |= LOOM_CPU_BF16_SRC(i);
		else if (dt != LOOM_F32 && dt != LOOM_I32)
			return ~0u;
	}
	if (n->dtype == LOOM_BF16)
		half |= LOOM_CPU_BF16_OUT;
	else if (n->dtype != LOOM_F32)
		return ~0u;
	return half;
}

/* Bytes of scratch node v needs: its kernel's workspace, then the f32
 * copies of its half sources and result (fp8_decoded's go after). */
static size_t node_workspace_own(const loom_cpu_ctx *c, const loom_plan *pl, loom_value v)
{
	const loom_node *n = &pl->g->nodes[v];
	size_t ws = 0;
	/* Its ids grouped by row; no copies (emb_bwd_accum.c widens by rows). */
	if (n->op == LOOM_OP_EMBEDDING_BWD && (n->flags & LOOM_NODE_ACCUM))
		return loom_cpu_emb_bwd_accum_ws(pl, v);
	if (cpu_op(n->op)->ws)
		ws = cpu_op(n->op)->ws(c, pl, v, loom_dtype_size(loom_cpu_kernel_dtype(n)));
	if (emulated(pl, n)) {
		for (int i = 0; i < n->nsrc; i++)
			if (is_half(src_node(pl, n, i)->dtype))
				ws += align64(4 * loom_shape_numel(&src_node(pl, n, i)->shape));
		ws += align64(4 * loom_shape_numel(&n->shape));
	}
	return ws;
}

/* The products read their operands stored as fp8 (the fp8 storage pass,
 * engine/compile_passes.c): run_node decodes them first. */
static int cpu_reads_fp8(const loom_graph *g, loom_value v, int i)
{
	loom_op op = g->nodes[v].op;
	return (op == LOOM_OP_LINEAR || op == LOOM_OP_MATMUL) && i < 2;
}

/* Bytes of node v's sources stored as fp8, decoded into their dtype. */
static size_t fp8_decoded_bytes(const loom_plan *pl, loom_value v)
{
	const loom_node *n = &pl->g->nodes[v];
	size_t ws = 0;
	for (int i = 0; i < n->nsrc; i++)
		if (loom_fp8_stored_under(pl->g, n->src[i]))
			ws += align64(loom_dtype_size(src_node(pl, n, i)->dtype) *
				      loom_shape_numel(&src_node(pl, n, i)->shape));
	return ws;
}

static size_t node_workspace(const loom_cpu_ctx *c, const loom_plan *pl, loom_value v)
{
	size_t dec = fp8_decoded_bytes(pl, v);
	return dec ? align64(node_workspace_own(c, pl, v)) + dec : node_workspace_own(c, pl, v);
}

/* Node v's sources stored as fp8 (codes and scale) decoded into scratch
 * after its own workspace, to the bits the FP8_QDQ node writes unstored;
 * io then points at those copies, and the node runs as it always did. */
static void fp8_decode_sources(const loom_cpu_ctx *c, const loom_plan *pl, loom_value v,
			       loom_cpu_io *io)
{
	const loom_node *n = &pl->g->nodes[v];
	unsigned char *at = NULL;
	for (int i = 0; i < n->nsrc; i++) {
		const loom_node *q = loom_fp8_stored_under(pl->g, n->src[i]);
		if (!q)
			continue;
		if (!at)
			at = (unsigned char *)c->arena->ws + align64(node_workspace_own(c, pl, v));
		const loom_node *sn = src_node(pl, n, i);
		int64_t cnt = loom_shape_numel(&sn->shape);
		loom_cpu_fp8_decode(q->a.fp8.fwd, io->src[i], cnt, sn->dtype, at);
		io->src[i] = at;
		at += align64(loom_dtype_size(sn->dtype) * cnt);
	}
}

static loom_status cpu_init(void **out, char *err, size_t errlen)
{
	loom_cpu_ctx *c = calloc(1, sizeof(*c));
	if (!c) {
		snprintf(err, errlen, "cpu: out of host memory");
		return LOOM_ERR_NOMEM;
	}
	*out = c;
	return LOOM_OK;
}

static void kern_unplan(loom_cpu_ctx *c)
{
	for (int v = 0; c->kern && v < c->n_kern; v++)
		loom_cpu_kern_release(&c->kern[v]);
	free(c->kern);
	c->kern = NULL;
	c->n_kern = 0;
}

static void cpu_free(void *ctx)
{
	loom_cpu_ctx *c = ctx;
	if (!c)
		return;
	if (c->spin_held)
		loom_cpu_spin_step_end(); /* a run that failed before its end */
	kern_unplan(c);
	loom_cpu_side_release(c);
	free(c->base);
	free(c->accum_base);
	free(c->timer);
	free(c);
}

static const char *cpu_error(void *ctx)
{
	return ((loom_cpu_ctx *)ctx)->err;
}

static const char *cpu_describe(void *ctx)
{
	(void)ctx;
	return "cpu";
}

static int cpu_supports_op(void *ctx, loom_op op)
{
	(void)ctx;
	return (unsigned)op < LOOM_OP_COUNT && cpu_op(op)->run != NULL;
}

/* Every op in every dtype the graph allows: f32 and f64 natively, halves
 * emulated exactly, i32 labels. */
static int cpu_supports_node(void *ctx, const loom_plan *plan, loom_value v)
{
	return cpu_supports_op(ctx, plan->g->nodes[v].op);
}

/* The CPU plans each conv and product node's kernel (measured, ksearch.c)
 * and each node's scratch. */
static loom_status cpu_plan_create(void *ctx, const loom_plan *plan, size_t *ws_bytes)
{
	loom_cpu_ctx *c = ctx;
	kern_unplan(c);
	c->kern = calloc((size_t)plan->g->n, sizeof(*c->kern));
	if (!c->kern)
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_NOMEM,
				  "out of memory for %d nodes' kernels",
				  plan->g->n);
	c->n_kern = plan->g->n;
	loom_status st = loom_cpu_kern_plan(plan, c->kern, c->err);
	if (st != LOOM_OK)
		return st;
	*ws_bytes = 0;
	for (int v = 0; v < plan->g->n; v++) {
		size_t ws = node_workspace(c, plan, v);
		if (ws > *ws_bytes)
			*ws_bytes = ws;
	}
	/* The side buffers (side.c) after the scratch every node shares. */
	size_t side = 0;
	st = loom_cpu_side_plan(c, plan, &side);
	if (st != LOOM_OK)
		return st;
	c->side_base = align64(*ws_bytes);
	if (side)
		*ws_bytes = c->side_base + side;
	return LOOM_OK;
}

static void cpu_node_note(void *ctx, const loom_plan *plan, loom_value v, char *buf, size_t len)
{
	loom_cpu_ctx *c = ctx;
	buf[0] = 0;
	if (c->kern && v < c->n_kern)
		loom_cpu_kern_note(plan, v, &c->kern[v], buf, len);
	if (!buf[0])
		loom_cpu_side_note(c, v, buf, len);
}

static loom_status cpu_alloc(void *ctx, const loom_plan *plan, const loom_train_state *ts,
			     loom_arena *arena)
{
	loom_cpu_ctx *c = ctx;
	size_t total = plan->mp.persist_bytes + plan->mp.bucket_bytes + plan->mp.act_bytes +
		       plan->ws_bytes + loom_plan_state_region_bytes(plan);
	(void)ts;
	c->base = aligned_alloc(64, align64(total ? total : 64));
	if (!c->base)
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_NOMEM,
				  "cannot allocate the %.1f MiB arena",
				  total / 1048576.0);
	memset(c->base, 0, total);
	arena->persist = c->base;
	arena->bucket = c->base + plan->mp.persist_bytes;
	arena->act = arena->bucket + plan->mp.bucket_bytes;
	arena->ws = arena->act + plan->mp.act_bytes;
	arena->state = arena->ws + plan->ws_bytes;
	c->arena = arena;
	return LOOM_OK;
}

static loom_status cpu_alloc_accum(void *ctx, const loom_plan *plan, loom_arena *arena)
{
	loom_cpu_ctx *c = ctx;
	size_t bytes = align64(plan->accum_bytes ? plan->accum_bytes : 64);
	c->accum_base = aligned_alloc(64, bytes);
	if (!c->accum_base)
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_NOMEM,
				  "cannot allocate %.1f MiB for gradient accumulation", bytes / 1048576.0);
	memset(c->accum_base, 0, bytes);
	arena->accum = c->accum_base;
	return LOOM_OK;
}

static loom_status cpu_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
	(void)ctx;
	memcpy(dst, src, bytes);
	return LOOM_OK;
}

/* ------------------------------------------------------------ dispatch */

static loom_status run_node(loom_cpu_ctx *c, const loom_plan *pl, loom_value v)
{
	const loom_arena *a = c->arena;
	const loom_node *n = &pl->g->nodes[v];
	const loom_cpu_op *op = cpu_op(n->op);
	loom_cpu_op_fn fn = op->run;
	loom_cpu_io io = { .out = loom_arena_ptr(a, pl, v), .ws = a->ws };
	for (int i = 0; i < n->nsrc; i++)
		io.src[i] = loom_arena_ptr(a, pl, n->src[i]);
	/* A residual add with the layer norm it makes, in its own dtypes. */
	if (loom_cpu_ln_residual(pl, a, v))
		return LOOM_OK;
	/* A layer norm's dx added into the residual's other gradient. */
	if (loom_cpu_ln_bwd_accum(pl, a, v))
		return LOOM_OK;
	/* An embedding's gradient added into the tied table's other. */
	if (loom_cpu_emb_bwd_accum(pl, a, v))
		return LOOM_OK;
	if (!op->raw)
		fp8_decode_sources(c, pl, v, &io);
	if (!emulated(pl, n))
		return fn(c, pl, v, &io);
	/* bf16 products on CPUs that multiply bf16 natively (bf16_node.c). */
	if (loom_cpu_bf16_node(pl, v, io.src, io.out, a->ws))
		return LOOM_OK;
	/* bf16 add, relu, GELU and their backward: widen and round fused into
	 * the kernel (ops_elementwise.c), the same bits as below. */
	if (loom_cpu_ew_bf16_native(pl, v, &io))
		return LOOM_OK;
	/* Layer norm, attention, the loss and embedding likewise (their rows'
	 * bf16 entries, in their family files). */
	unsigned half;
	loom_status nst = LOOM_OK;
	if (op->bf16 && family_bf16_on() && (half = bf16_mask(pl, n)) != ~0u && half != 0 &&
	    op->bf16(c, pl, v, &io, half, &nst))
		return nst;

	/* Half storage: widen the half sources into f32 scratch after the
	 * kernel's own workspace, run in f32, round the result. */
	unsigned char *scratch = a->ws;
	if (op->ws)
		scratch += op->ws(c, pl, v, 4);
	for (int i = 0; i < n->nsrc; i++) {
		const loom_node *sn = src_node(pl, n, i);
		if (!is_half(sn->dtype))
			continue;
		int64_t cnt = loom_shape_numel(&sn->shape);
		loom_cpu_cast(sn->dtype, io.src[i], LOOM_F32, scratch, cnt);
		io.src[i] = scratch;
		scratch += align64(4 * cnt);
	}
	void *out = io.out;
	if (is_half(n->dtype))
		io.out = scratch;
	loom_status st = fn(c, pl, v, &io);
	if (st != LOOM_OK)
		return st;
	if (is_half(n->dtype))
		loom_cpu_cast(LOOM_F32, io.out, n->dtype, out, loom_shape_numel(&n->shape));
	/* Batch norm updates its running statistics in place: write half
	 * statistics back from their widened copies. */
	if (n->op == LOOM_OP_BATCHNORM2D && c->train)
		for (int i = 3; i < 5; i++)
			if (is_half(src_node(pl, n, i)->dtype))
				loom_cpu_cast(LOOM_F32, io.src[i], src_node(pl, n, i)->dtype,
					      loom_arena_ptr(a, pl, n->src[i]),
					      loom_shape_numel(&src_node(pl, n, i)->shape));
	return LOOM_OK;
}

static loom_status cpu_run_node(void *ctx, const loom_plan *plan, const loom_arena *arena,
				loom_value v)
{
	loom_cpu_ctx *c = ctx;
	c->arena = arena;
	return run_node(c, plan, v);
}

static loom_status cpu_run_begin(void *ctx, const loom_plan *plan, const loom_arena *arena,
				 loom_train_state *ts, unsigned flags)
{
	loom_cpu_ctx *c = ctx;
	(void)plan;
	c->arena = arena;
	c->train = (flags & LOOM_EXEC_TRAIN) != 0;
	c->flags = flags;
	c->seed_scale = ts->scaler.scale;
	c->fp8 = &ts->fp8;
	if (++c->run == 0) /* 0 marks a side buffer never written */
		c->run = 1;
	if (!c->spin_held) {
		loom_cpu_spin_step_begin();
		c->spin_held = 1;
	}
	return LOOM_OK;
}

/* Everything ran when each call returned. */
static loom_status cpu_run_end(void *ctx, const loom_plan *plan, const loom_arena *arena,
			       loom_train_state *ts)
{
	loom_cpu_ctx *c = ctx;
	(void)plan;
	(void)arena;
	(void)ts;
	if (c->spin_held) {
		loom_cpu_spin_step_end();
		c->spin_held = 0;
	}
	return LOOM_OK;
}

static loom_status cpu_check_finite(void *ctx, const loom_plan *pl, const loom_arena *arena,
				    loom_train_state *ts, loom_value v)
{
	const loom_node *n = &pl->g->nodes[v];
	int64_t cnt = loom_shape_numel(&n->shape);
	const void *d = loom_arena_ptr(arena, pl, v);
	/* fp8 codes (a stored value, or a view of one) are finite where
	 * their values are */
	const loom_node *q = loom_fp8_stored_under(pl->g, v);
	loom_dtype dt = q ? q->a.fp8.fwd : n->dtype;
	(void)ctx;
	if (n->dtype == LOOM_I32 || ts->first_nonfinite != LOOM_NONE)
		return LOOM_OK;
	for (int64_t i = 0; i < cnt; i++)
		if (!isfinite(loom_elem_get(dt, d, i))) {
			ts->first_nonfinite = v;
			break;
		}
	return LOOM_OK;
}

static loom_status cpu_accum(void *ctx, const loom_plan *plan, const loom_arena *arena, int s,
			     int fold)
{
	loom_cpu_accum(plan, arena, s, fold);
	(void)ctx;
	return LOOM_OK;
}

static loom_status cpu_optim(void *ctx, const loom_plan *plan, const loom_arena *arena,
			     loom_train_state *ts, int first, int last, int finite)
{
	(void)ctx;
	return loom_optim_step_host(plan, arena, ts, first, last, finite);
}

static loom_status cpu_grads_finite(void *ctx, const loom_plan *plan, const loom_arena *arena,
				    int first, int last, int *finite)
{
	(void)ctx;
	*finite = loom_optim_grads_finite_host(plan, arena, first, last);
	return LOOM_OK;
}

static loom_status cpu_grad_sumsq(void *ctx, const loom_plan *plan, const loom_arena *arena,
				  const loom_train_state *ts, int first, int last, double *sumsq)
{
	(void)ctx;
	*sumsq = loom_optim_grad_sumsq_host(plan, arena, loom_grad_unscale(plan, ts), first, last);
	return LOOM_OK;
}

/* Host memory: the communicator needs no stream. */
static void *cpu_stream_handle(void *ctx, loom_stream stream)
{
	(void)ctx;
	(void)stream;
	return NULL;
}

/* Nothing is queued: every call has finished when it returns. */
static loom_status cpu_synchronize(void *ctx, const loom_plan *plan, loom_train_state *ts)
{
	(void)ctx;
	(void)plan;
	(void)ts;
	return LOOM_OK;
}

/* One in-order stream: every event has already happened. */
static loom_status cpu_event(void *ctx, int event, loom_stream stream)
{
	(void)ctx;
	(void)event;
	(void)stream;
	return LOOM_OK;
}

/* A timer is the host clock now: the work queued before it is done. */
static loom_status cpu_timer_record(void *ctx, int slot, loom_stream stream)
{
	loom_cpu_ctx *c = ctx;
	(void)stream;
	if (slot >= c->n_timer) {
		int n = slot < 256 ? 512 : 2 * slot;
		double *t = realloc(c->timer, sizeof(*t) * (size_t)n);
		if (!t)
			return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_NOMEM,
					  "cpu: out of memory for trace timers");
		c->timer = t;
		c->n_timer = n;
	}
	c->timer[slot] = loom_trace_now();
	return LOOM_OK;
}

static loom_status cpu_timer_read(void *ctx, int slot, double *seconds)
{
	loom_cpu_ctx *c = ctx;
	if (slot < 0 || slot >= c->n_timer)
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_INVALID,
				  "cpu: no trace timer %d", slot);
	*seconds = c->timer[slot];
	return LOOM_OK;
}

static const loom_backend_planning cpu_planning = {
	.node_formats = loom_cpu_node_formats,
	.node_note = cpu_node_note,
	.ln_residual_fusable = loom_cpu_ln_residual_fusable,
	.ln_bwd_accum_fusable = loom_cpu_bwd_accum_fusable,
	/* a residual add's layer norm (ln_residual.c); every other sibling
	 * by its own kernel, right after its maker */
	.makes_sibling = loom_cpu_makes_sibling,
	.reads_fp8 = cpu_reads_fp8,
};

static const loom_backend_accumulate cpu_accumulate = {
	.alloc_accum = cpu_alloc_accum,
	.accum = cpu_accum,
};

static const loom_backend_sharded cpu_sharded = {
	.grads_finite = cpu_grads_finite,
	.grad_sumsq = cpu_grad_sumsq,
};

static const loom_backend_timing cpu_timing = {
	.timer_record = cpu_timer_record,
	.timer_read = cpu_timer_read,
};

const loom_backend loom_cpu_backend = {
	.name = "cpu",
	.caps = LOOM_BE_FUSES_ALL | LOOM_BE_FUSES_CASTS | LOOM_BE_HOST_MEMORY | LOOM_BE_CLIPS_GRAD |
		LOOM_BE_FUSES_LN_RESIDUAL | LOOM_BE_FUSES_LN_BWD_ACCUM,
	.init = cpu_init,
	.free = cpu_free,
	.error = cpu_error,
	.describe = cpu_describe,
	.supports_op = cpu_supports_op,
	.supports_node = cpu_supports_node,
	.plan_create = cpu_plan_create,
	.alloc = cpu_alloc,
	.run_begin = cpu_run_begin,
	.run_end = cpu_run_end,
	.run_node = cpu_run_node,
	.check_finite = cpu_check_finite,
	.optim = cpu_optim,
	.stream_handle = cpu_stream_handle,
	.upload = cpu_copy,
	.download = cpu_copy,
	.copy = cpu_copy,
	.synchronize = cpu_synchronize,
	.event_record = cpu_event,
	.event_wait = cpu_event,
	.planning = &cpu_planning,
	.accumulate = &cpu_accumulate,
	.sharded = &cpu_sharded,
	.timing = &cpu_timing,
};
