/*
 * engine/cpu/ops_gpt.c — the CPU entries of the transformer ops: embedding
 * and its scatter-add, layer norm over the last dim and its two backward
 * nodes, and the two halves of causal attention with their backward nodes
 * (kernels in gpt_impl.h).
 */
#include <stdlib.h>
#include <string.h>

#include "engine/cpu/gpt_kernels.h"
#include "engine/cpu/ops.h"

static const loom_node *node(const loom_plan *plan, loom_value v)
{
	return &plan->g->nodes[v];
}

static const loom_node *src(const loom_plan *plan, loom_value v, int i)
{
	return &plan->g->nodes[plan->g->nodes[v].src[i]];
}

static int is_f64(const loom_plan *plan, loom_value v)
{
	return loom_cpu_kernel_dtype(node(plan, v)) == LOOM_F64;
}

static loom_status bad_id(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			  const loom_cpu_io *io, int64_t bad, int vocab)
{
	char lb[96];
	return loom_errf(ctx->err, LOOM_ERR_INVALID,
			 "%s: id %d at position %lld is outside the table's [0, %d)",
			 loom_node_label(plan->g, v, lb, sizeof(lb)),
			 (int)((const int32_t *)io->src[0])[bad], (long long)bad, vocab);
}

loom_status loom_cpu_op_embedding(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				  const loom_cpu_io *io)
{
	const loom_node *w = src(plan, v, 1);
	int64_t n = loom_shape_numel(&src(plan, v, 0)->shape), bad = -1;
	int vocab = (int)w->shape.dims[0], c = (int)w->shape.dims[1], r;
	if (is_f64(plan, v))
		r = loom_cpu_embedding_fwd_f64(n, vocab, c, io->src[0], io->src[1], io->out, &bad);
	else
		r = loom_cpu_embedding_fwd_f32(n, vocab, c, io->src[0], io->src[1], io->out, &bad);
	return r < 0 ? bad_id(ctx, plan, v, io, bad, vocab) : LOOM_OK;
}

loom_status loom_cpu_op_embedding_bwd(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				      const loom_cpu_io *io)
{
	const loom_node *n = node(plan, v);
	int64_t cnt = loom_shape_numel(&src(plan, v, 0)->shape);
	(void)ctx;
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(n), loom_cpu_embedding_bwd, cnt,
			  (int)n->shape.dims[0], (int)n->shape.dims[1], io->src[0], io->src[1],
			  io->out);
	return LOOM_OK;
}

loom_status loom_cpu_op_layernorm(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				  const loom_cpu_io *io)
{
	const loom_node *n = node(plan, v);
	(void)ctx;
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(n), loom_cpu_layernorm_fwd,
			  loom_shape_rows(&n->shape), (int)loom_shape_last(&n->shape), io->src[0],
			  io->src[1], io->src[2], n->a.ln.eps, io->out);
	return LOOM_OK;
}

loom_status loom_cpu_op_layernorm_bwd_data(loom_cpu_ctx *ctx, const loom_plan *plan,
					   loom_value v, const loom_cpu_io *io)
{
	const loom_node *n = node(plan, v);
	(void)ctx;
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(n), loom_cpu_layernorm_bwd_data,
			  loom_shape_rows(&n->shape), (int)loom_shape_last(&n->shape), io->src[0],
			  io->src[1], io->src[2], n->a.ln.eps, io->out);
	return LOOM_OK;
}

loom_status loom_cpu_op_layernorm_bwd_gamma(loom_cpu_ctx *ctx, const loom_plan *plan,
					    loom_value v, const loom_cpu_io *io)
{
	const loom_node *n = node(plan, v), *x = src(plan, v, 0);
	(void)ctx;
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(n), loom_cpu_layernorm_bwd_gamma,
			  loom_shape_rows(&x->shape), (int)loom_shape_last(&x->shape), io->src[0],
			  io->src[1], n->a.ln.eps, io->out, io->ws);
	return LOOM_OK;
}

/* The geometry of an attention node from its qkv source (index qi). */
static loom_attn_shape attn_shape(const loom_plan *plan, loom_value v, int qi)
{
	const loom_node *q = src(plan, v, qi);
	loom_attn_shape s = { (int)q->shape.dims[0], (int)q->shape.dims[1],
			      (int)(q->shape.dims[2] / 3), node(plan, v)->a.attn.n_head };
	return s;
}

loom_status loom_cpu_op_attn_probs(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				   const loom_cpu_io *io)
{
	loom_attn_shape s = attn_shape(plan, v, 0);
	(void)ctx;
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(node(plan, v)), loom_cpu_attn_probs_fwd, &s,
			  io->src[0], io->out);
	return LOOM_OK;
}

loom_status loom_cpu_op_attn_probs_bwd(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				       const loom_cpu_io *io)
{
	loom_attn_shape s = attn_shape(plan, v, 0);
	(void)ctx;
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(node(plan, v)), loom_cpu_attn_probs_bwd, &s,
			  io->src[0], io->src[1], io->src[2], io->out, io->ws);
	return LOOM_OK;
}

loom_status loom_cpu_op_attention(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				  const loom_cpu_io *io)
{
	loom_attn_shape s = attn_shape(plan, v, 1);
	(void)ctx;
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(node(plan, v)), loom_cpu_attention_fwd, &s,
			  io->src[0], io->src[1], io->out);
	return LOOM_OK;
}

loom_status loom_cpu_op_attention_bwd_probs(loom_cpu_ctx *ctx, const loom_plan *plan,
					    loom_value v, const loom_cpu_io *io)
{
	loom_attn_shape s = attn_shape(plan, v, 0);
	(void)ctx;
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(node(plan, v)), loom_cpu_attention_bwd_probs, &s,
			  io->src[0], io->src[1], io->out);
	return LOOM_OK;
}

/* (P, dy): the geometry from the output, dqkv [B, T, 3C]. */
loom_status loom_cpu_op_attention_bwd_qkv(loom_cpu_ctx *ctx, const loom_plan *plan,
					  loom_value v, const loom_cpu_io *io)
{
	const loom_node *n = node(plan, v);
	loom_attn_shape s = { (int)n->shape.dims[0], (int)n->shape.dims[1],
			      (int)(n->shape.dims[2] / 3), n->a.attn.n_head };
	(void)ctx;
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(n), loom_cpu_attention_bwd_qkv, &s, io->src[0],
			  io->src[1], io->out);
	return LOOM_OK;
}

size_t loom_cpu_gpt_workspace(const loom_plan *plan, loom_value v, size_t elem)
{
	const loom_node *n = node(plan, v);
	if (n->op == LOOM_OP_LAYERNORM_BWD_GAMMA)
		return loom_cpu_layernorm_bwd_gamma_ws((int)loom_shape_last(&n->shape));
	if (n->op == LOOM_OP_ATTN_PROBS_BWD)
		return loom_cpu_attn_probs_bwd_ws((int)n->shape.dims[1], elem);
	return 0;
}

/* ---------------------------------------------------- native bf16 path */

static size_t align64(size_t x)
{
	return (x + 63) & ~(size_t)63;
}

static int gpt_bf16_on(void)
{
	static int on = -1;
	int o = __atomic_load_n(&on, __ATOMIC_RELAXED);
	if (o < 0) {
		const char *e = getenv("LOOM_CPU_BF16_NATIVE_GPT");
		o = !(e && strcmp(e, "0") == 0);
		__atomic_store_n(&on, o, __ATOMIC_RELAXED);
	}
	return o;
}

/* The bf16 mask of node v (gpt_kernels.h: bit i source i, OUT the result),
 * or ~0u when some float is neither f32 nor bf16 (f16, f64: not ours). */
static unsigned bf16_mask(const loom_plan *plan, loom_value v)
{
	const loom_node *n = node(plan, v);
	unsigned half = 0;
	for (int i = 0; i < n->nsrc; i++) {
		loom_dtype dt = src(plan, v, i)->dtype;
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

static const loom_cpu_attn_kernel attn_kernel_of[LOOM_OP_COUNT] = {
	[LOOM_OP_ATTN_PROBS] = LOOM_CPU_ATTN_PROBS_FWD,
	[LOOM_OP_ATTN_PROBS_BWD] = LOOM_CPU_ATTN_PROBS_BWD,
	[LOOM_OP_ATTENTION] = LOOM_CPU_ATTENTION_FWD,
	[LOOM_OP_ATTENTION_BWD_PROBS] = LOOM_CPU_ATTENTION_BWD_PROBS,
	[LOOM_OP_ATTENTION_BWD_QKV] = LOOM_CPU_ATTENTION_BWD_QKV,
};

/* Softmax cross-entropy: its ws (a row or two, only for its bf16 arrays)
 * within the emulation's copies of them, which backend.c sized. */
static int ce_bf16(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v, const loom_cpu_io *io,
		   unsigned half, loom_status *st)
{
	const loom_node *n = node(plan, v), *x = src(plan, v, 0);
	int rows = (int)x->shape.dims[0], classes = (int)x->shape.dims[1], bad = -1;
	if (n->op == LOOM_OP_SOFTMAX_CE) {
		if (half & LOOM_CPU_BF16_OUT)
			return 0;
		if (loom_cpu_softmax_ce_fwd_bf16(rows, classes, io->src[0], io->src[1], io->out, &bad,
						 io->ws, half) < 0)
			*st = loom_bad_label(ctx->err, plan, v, ((const int32_t *)io->src[1])[bad], bad);
		return 1;
	}
	return loom_cpu_softmax_ce_bwd_bf16(rows, classes, io->src[0], io->src[1], io->src[2],
					    io->out, io->ws, half);
}

int loom_cpu_gpt_bf16_native(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			     const loom_cpu_io *io, loom_status *st)
{
	const loom_node *n = node(plan, v);
	unsigned half;
	*st = LOOM_OK;
	switch (n->op) {
	case LOOM_OP_EMBEDDING: case LOOM_OP_EMBEDDING_BWD:
	case LOOM_OP_LAYERNORM: case LOOM_OP_LAYERNORM_BWD_DATA: case LOOM_OP_LAYERNORM_BWD_GAMMA:
	case LOOM_OP_ATTN_PROBS: case LOOM_OP_ATTN_PROBS_BWD: case LOOM_OP_ATTENTION:
	case LOOM_OP_ATTENTION_BWD_PROBS: case LOOM_OP_ATTENTION_BWD_QKV:
	case LOOM_OP_SOFTMAX_CE: case LOOM_OP_SOFTMAX_CE_BWD:
		break;
	default:
		return 0;
	}
	if (!gpt_bf16_on() || (half = bf16_mask(plan, v)) == ~0u || half == 0)
		return 0;
	switch (n->op) {
	case LOOM_OP_EMBEDDING: {
		const loom_node *w = src(plan, v, 1);
		int64_t bad = -1;
		if (half != (LOOM_CPU_BF16_SRC(1) | LOOM_CPU_BF16_OUT))
			return 0;
		if (loom_cpu_embedding_fwd_bf16(loom_shape_numel(&src(plan, v, 0)->shape),
						(int)w->shape.dims[0], (int)w->shape.dims[1],
						io->src[0], io->src[1], io->out, &bad) < 0)
			*st = bad_id(ctx, plan, v, io, bad, (int)w->shape.dims[0]);
		return 1;
	}
	case LOOM_OP_EMBEDDING_BWD:
		/* Its f32 sums in ws: within the emulation's f32 copy of the table. */
		return loom_cpu_embedding_bwd_bf16(loom_shape_numel(&src(plan, v, 0)->shape),
						   (int)n->shape.dims[0], (int)n->shape.dims[1],
						   io->src[0], io->src[1], io->out, io->ws, half);
	case LOOM_OP_LAYERNORM:
		return loom_cpu_layernorm_fwd_bf16(loom_shape_rows(&n->shape),
						   (int)loom_shape_last(&n->shape), io->src[0],
						   io->src[1], io->src[2], n->a.ln.eps, io->out, half);
	case LOOM_OP_LAYERNORM_BWD_DATA:
		return loom_cpu_layernorm_bwd_data_bf16(loom_shape_rows(&n->shape),
							(int)loom_shape_last(&n->shape), io->src[0],
							io->src[1], io->src[2], n->a.ln.eps,
							io->out, half);
	case LOOM_OP_LAYERNORM_BWD_GAMMA: {
		const loom_node *x = src(plan, v, 0);
		return loom_cpu_layernorm_bwd_gamma_bf16(loom_shape_rows(&x->shape),
							 (int)loom_shape_last(&x->shape),
							 io->src[0], io->src[1], n->a.ln.eps,
							 io->out, io->ws, half);
	}
	case LOOM_OP_SOFTMAX_CE:
	case LOOM_OP_SOFTMAX_CE_BWD:
		return ce_bf16(ctx, plan, v, io, half, st);
	default: {
		/* Attention: within the ws backend.c sized for the emulation
		 * (node_workspace): the kernel's, then whole f32 copies of the
		 * bf16 arrays. */
		size_t avail = loom_cpu_gpt_workspace(plan, v, 4);
		for (int i = 0; i < n->nsrc; i++)
			if (half & LOOM_CPU_BF16_SRC(i))
				avail += align64(4 * (size_t)loom_shape_numel(&src(plan, v, i)->shape));
		if (half & LOOM_CPU_BF16_OUT)
			avail += align64(4 * (size_t)loom_shape_numel(&n->shape));
		loom_attn_shape s;
		if (n->op == LOOM_OP_ATTENTION_BWD_QKV)
			s = (loom_attn_shape){ (int)n->shape.dims[0], (int)n->shape.dims[1],
					       (int)(n->shape.dims[2] / 3), n->a.attn.n_head };
		else
			s = attn_shape(plan, v, n->op == LOOM_OP_ATTENTION ? 1 : 0);
		return loom_cpu_attn_bf16(attn_kernel_of[n->op], &s, (const void *const *)io->src,
					  io->out, io->ws, avail, half);
	}
	}
}
