/*
 * engine/cpu/ops_gpt.c — the CPU entries of the transformer ops: embedding
 * and its scatter-add, layer norm over the last dim and its two backward
 * nodes, and the two halves of causal attention with their backward nodes
 * (kernels in gpt_impl.h).
 */
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

loom_status loom_cpu_op_embedding(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				  const loom_cpu_io *io)
{
	const loom_node *w = src(plan, v, 1);
	int64_t n = loom_shape_numel(&src(plan, v, 0)->shape), bad = -1;
	int vocab = (int)w->shape.dims[0], c = (int)w->shape.dims[1], r;
	char lb[96];
	if (is_f64(plan, v))
		r = loom_cpu_embedding_fwd_f64(n, vocab, c, io->src[0], io->src[1], io->out, &bad);
	else
		r = loom_cpu_embedding_fwd_f32(n, vocab, c, io->src[0], io->src[1], io->out, &bad);
	if (r < 0)
		return loom_errf(ctx->err, LOOM_ERR_INVALID,
				 "%s: id %d at position %lld is outside the table's [0, %d)",
				 loom_node_label(plan->g, v, lb, sizeof(lb)),
				 (int)((const int32_t *)io->src[0])[bad], (long long)bad, vocab);
	return LOOM_OK;
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
