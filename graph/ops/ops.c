/*
 * graph/ops/ops.c — the op table, one row per op (the entries live in the
 * family files and are declared only here), and the helpers gradient rules
 * share.
 */
#include "graph/ops/ops.h"

/* The entries, one per op, defined in the family files. */
extern const loom_op_def loom_op_input, loom_op_param, loom_op_buffer;         /* leaf.c */
extern const loom_op_def loom_op_conv2d, loom_op_conv2d_bwd_data,
	loom_op_conv2d_bwd_filter;                                              /* conv.c */
extern const loom_op_def loom_op_batchnorm2d, loom_op_bn_bwd_data,
	loom_op_bn_bwd_gamma;                                                   /* batchnorm.c */
extern const loom_op_def loom_op_maxpool2d, loom_op_maxpool2d_bwd, loom_op_global_avgpool,
	loom_op_global_avgpool_bwd;                                             /* pool.c */
extern const loom_op_def loom_op_linear, loom_op_matmul;                       /* dense.c */
extern const loom_op_def loom_op_relu, loom_op_relu_bwd, loom_op_add,
	loom_op_cast;                                                           /* elementwise.c */
#define UNARY_EXTERN(NAME, low) extern const loom_op_def loom_op_##low, loom_op_##low##_bwd;
LOOM_UNARY_OPS(UNARY_EXTERN)                                                   /* unary.c */
#undef UNARY_EXTERN
extern const loom_op_def loom_op_reshape;                                      /* view.c */
extern const loom_op_def loom_op_sum, loom_op_broadcast, loom_op_channel_sum;  /* reduce.c */
extern const loom_op_def loom_op_softmax_ce, loom_op_softmax_ce_bwd,
	loom_op_grad_seed;                                                      /* loss.c */
extern const loom_op_def loom_op_allreduce, loom_op_allgather;                 /* comm.c */
extern const loom_op_def loom_op_embedding, loom_op_embedding_bwd;             /* embedding.c */
extern const loom_op_def loom_op_layernorm, loom_op_layernorm_bwd_data,
	loom_op_layernorm_bwd_gamma;                                            /* layernorm.c */
extern const loom_op_def loom_op_attn_probs, loom_op_attn_probs_bwd, loom_op_attention,
	loom_op_attention_bwd_probs, loom_op_attention_bwd_qkv;                 /* attention.c */
extern const loom_op_def loom_op_reorder;                                      /* reorder.c */

const loom_op_def *const loom_op_defs[] = {
	[LOOM_OP_INPUT] = &loom_op_input,
	[LOOM_OP_PARAM] = &loom_op_param,
	[LOOM_OP_BUFFER] = &loom_op_buffer,
	[LOOM_OP_CONV2D] = &loom_op_conv2d,
	[LOOM_OP_CONV2D_BWD_DATA] = &loom_op_conv2d_bwd_data,
	[LOOM_OP_CONV2D_BWD_FILTER] = &loom_op_conv2d_bwd_filter,
	[LOOM_OP_CHANNEL_SUM] = &loom_op_channel_sum,
	[LOOM_OP_BATCHNORM2D] = &loom_op_batchnorm2d,
	[LOOM_OP_BN_BWD_DATA] = &loom_op_bn_bwd_data,
	[LOOM_OP_BN_BWD_GAMMA] = &loom_op_bn_bwd_gamma,
	[LOOM_OP_RELU] = &loom_op_relu,
	[LOOM_OP_RELU_BWD] = &loom_op_relu_bwd,
	[LOOM_OP_MAXPOOL2D] = &loom_op_maxpool2d,
	[LOOM_OP_MAXPOOL2D_BWD] = &loom_op_maxpool2d_bwd,
	[LOOM_OP_LINEAR] = &loom_op_linear,
	[LOOM_OP_MATMUL] = &loom_op_matmul,
	[LOOM_OP_ADD] = &loom_op_add,
	[LOOM_OP_RESHAPE] = &loom_op_reshape,
	[LOOM_OP_SUM] = &loom_op_sum,
	[LOOM_OP_BROADCAST] = &loom_op_broadcast,
	[LOOM_OP_SOFTMAX_CE] = &loom_op_softmax_ce,
	[LOOM_OP_SOFTMAX_CE_BWD] = &loom_op_softmax_ce_bwd,
	[LOOM_OP_GRAD_SEED] = &loom_op_grad_seed,
	[LOOM_OP_CAST] = &loom_op_cast,
	[LOOM_OP_GLOBAL_AVGPOOL] = &loom_op_global_avgpool,
	[LOOM_OP_GLOBAL_AVGPOOL_BWD] = &loom_op_global_avgpool_bwd,
#define UNARY_ROW(NAME, low) [LOOM_OP_##NAME] = &loom_op_##low, [LOOM_OP_##NAME##_BWD] = &loom_op_##low##_bwd,
	LOOM_UNARY_OPS(UNARY_ROW)
#undef UNARY_ROW
	[LOOM_OP_ALLREDUCE] = &loom_op_allreduce,
	[LOOM_OP_EMBEDDING] = &loom_op_embedding,
	[LOOM_OP_EMBEDDING_BWD] = &loom_op_embedding_bwd,
	[LOOM_OP_LAYERNORM] = &loom_op_layernorm,
	[LOOM_OP_LAYERNORM_BWD_DATA] = &loom_op_layernorm_bwd_data,
	[LOOM_OP_LAYERNORM_BWD_GAMMA] = &loom_op_layernorm_bwd_gamma,
	[LOOM_OP_ATTN_PROBS] = &loom_op_attn_probs,
	[LOOM_OP_ATTN_PROBS_BWD] = &loom_op_attn_probs_bwd,
	[LOOM_OP_ATTENTION] = &loom_op_attention,
	[LOOM_OP_ATTENTION_BWD_PROBS] = &loom_op_attention_bwd_probs,
	[LOOM_OP_ATTENTION_BWD_QKV] = &loom_op_attention_bwd_qkv,
	[LOOM_OP_REORDER] = &loom_op_reorder,
	[LOOM_OP_ALLGATHER] = &loom_op_allgather,
};

/* A new op last in the enum with no row here fails to compile; a hole in
 * the middle is a NULL row, which tests/graph/test_op_table.c catches. */
_Static_assert(sizeof(loom_op_defs) / sizeof(loom_op_defs[0]) == LOOM_OP_COUNT,
	       "graph/ops/ops.c: the op table must have one row per loom_op");

loom_value loom_grad_node(loom_graph *g, loom_op op, loom_value like, int nsrc,
			  const loom_value *src)
{
	const loom_node *l = &g->nodes[like];
	loom_value v = loom_node_add(g, op, l->dtype, l->shape, nsrc, src);
	if (v != LOOM_NONE)
		g->nodes[v].flags |= LOOM_NODE_BACKWARD;
	return v;
}

loom_value loom_grad_channel_sum(loom_graph *g, loom_value dy, loom_value like)
{
	return loom_grad_node(g, LOOM_OP_CHANNEL_SUM, like, 1, &dy);
}

loom_value loom_grad_broadcast(loom_graph *g, loom_value x, loom_value like, double scale)
{
	loom_value v = loom_grad_node(g, LOOM_OP_BROADCAST, like, 1, &x);
	if (v != LOOM_NONE)
		g->nodes[v].a.bc.scale = scale;
	return v;
}

loom_value loom_grad_matmul(loom_graph *g, loom_value a, int ta, loom_value b, int tb,
			    loom_value like)
{
	loom_value s[2] = { a, b };
	loom_value v = loom_grad_node(g, LOOM_OP_MATMUL, like, 2, s);
	if (v != LOOM_NONE) {
		g->nodes[v].a.mm.ta = ta;
		g->nodes[v].a.mm.tb = tb;
	}
	return v;
}

loom_value loom_grad_rows(loom_graph *g, loom_value v)
{
	loom_shape s = g->nodes[v].shape;
	if (s.ndim == 2 || s.ndim < 1)
		return v;
	int64_t c = s.dims[s.ndim - 1];
	int64_t d[2] = { c ? loom_shape_numel(&s) / c : 0, c };
	loom_value r = loom_node_add(g, LOOM_OP_RESHAPE, g->nodes[v].dtype, loom_shape_make(2, d),
				     1, &v);
	if (r != LOOM_NONE)
		g->nodes[r].flags |= LOOM_NODE_BACKWARD;
	return r;
}
