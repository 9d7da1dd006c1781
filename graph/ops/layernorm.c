/*
 * graph/ops/layernorm.c — layer normalisation over the last dimension
 * (torch.nn.LayerNorm(C)): y = (x - mean) / sqrt(var + eps) * gamma + beta
 * with the biased variance of each row, and its backward: dx from
 * (x, gamma, dy), dgamma from (x, dy), dbeta the column sums of dy seen as
 * [rows, C] (a view, no copy). Statistics are fp32 (f64 for f64 graphs) on
 * every backend and at every opt level.
 */
#include "graph/ops/ops.h"

loom_value loom_layernorm(loom_graph *g, loom_value x, loom_value gamma, loom_value beta,
			  double eps)
{
	loom_node n;
	loom_value src[3] = { x, gamma, beta };
	loom_op_init(&n, LOOM_OP_LAYERNORM, 3, src);
	n.a.ln.eps = eps;
	return loom_op_build(g, &n);
}

/* Layer norm's shape rule and RMS norm's (no beta): x [..., C] floating,
 * each parameter [C] in x's dtype, eps > 0; the output has x's dtype and
 * shape. Messages name the op and the parameter as its table row does. */
int loom_shape_norm_rows(loom_graph *g, loom_node *n)
{
	const loom_op_def *def = loom_op_defs[n->op];
	char bx[96], bp[96];
	const loom_node *x = &g->nodes[n->src[0]];
	if (!loom_check_float(g, n, 0))
		return 0;
	for (int i = 1; i < n->nsrc; i++)
		if (!loom_check_same_dtype(g, n, 0, i))
			return 0;
	for (int i = 1; i < n->nsrc; i++)
		if (!loom_check_ndim(g, n, i, 1))
			return 0;
	if (x->shape.ndim < 1)
		return loom_graph_fail(g, LOOM_ERR_SHAPE, "%s: input is a scalar", def->name), 0;
	int64_t c = x->shape.dims[x->shape.ndim - 1];
	for (int i = 1; i < n->nsrc; i++) {
		const loom_node *p = &g->nodes[n->src[i]];
		if (p->shape.dims[0] != c)
			return loom_graph_fail(g, LOOM_ERR_SHAPE, "%s: %s %s must be [%lld] for input %s",
					       def->name, def->src_names[i],
					       loom_shape_str(&p->shape, bp, sizeof(bp)), (long long)c,
					       loom_shape_str(&x->shape, bx, sizeof(bx))), 0;
	}
	if (!(n->a.ln.eps > 0))
		return loom_graph_fail(g, LOOM_ERR_INVALID, "%s: eps %g must be positive", def->name,
				       n->a.ln.eps), 0;
	n->shape = x->shape;
	n->dtype = x->dtype;
	return 1;
}

static void grad_layernorm(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_node n = g->nodes[v];
	/* dy's rows view (beta's gradient sums them) first, so that all three
	 * gradients read only values older than dx: graph/fuse.c may then
	 * have one kernel make them together (siblings). */
	loom_value rows = loom_grad_needed(ctx, n.src[2]) ? loom_grad_rows(g, dy) : LOOM_NONE;
	loom_grad_norm(g, &n, dy, ctx, LOOM_OP_LAYERNORM_BWD_DATA, LOOM_OP_LAYERNORM_BWD_GAMMA);
	if (loom_grad_needed(ctx, n.src[2]))
		loom_grad_accum(ctx, n.src[2], loom_grad_channel_sum(g, rows, n.src[2]));
}

/* fp32 under O1 (apex's FP32 list), half storage under O2 with fp32
 * statistics inside the kernels. */
const loom_op_def loom_op_layernorm = {
	.name = "layernorm",
	.kind = LOOM_OPK_FORWARD,
	.attrs = LOOM_ATTRS_LN,
	.src_names = { "input", "gamma", "beta" },
	.shape = loom_shape_norm_rows,
	.grad = grad_layernorm,
	.amp = { .cls = LOOM_AMP_DENY },
	.recompute = 2,
};

LOOM_BACKWARD_OP(layernorm_bwd_data, "layernorm_bwd_data", LOOM_ATTRS_LN, "input", "gamma", "dy");

LOOM_BACKWARD_OP(layernorm_bwd_gamma, "layernorm_bwd_gamma", LOOM_ATTRS_LN, "input", "dy");
