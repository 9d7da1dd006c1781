/*
 * graph/ops/batchnorm.c — 2-D batch normalisation in training mode (batch
 * statistics; the running statistics, buffers, are updated as a side
 * effect) and its backward ops: (x, gamma, dy) -> dx and (x, dy) -> dgamma
 * (dbeta is a channel sum of dy).
 */
#include "graph/ops/ops.h"

loom_value loom_batchnorm2d(loom_graph *g, loom_value x, loom_value gamma,
			    loom_value beta, loom_value running_mean,
			    loom_value running_var, double momentum, double eps)
{
	loom_node n;
	loom_value src[5] = { x, gamma, beta, running_mean, running_var };
	loom_op_init(&n, LOOM_OP_BATCHNORM2D, 5, src);
	n.a.bn.momentum = momentum;
	n.a.bn.eps = eps;
	return loom_op_build(g, &n);
}

static int shape_batchnorm2d(loom_graph *g, loom_node *n)
{
	char bx[96], bp[96];
	const loom_node *x = &g->nodes[n->src[0]];
	double momentum = n->a.bn.momentum, eps = n->a.bn.eps;
	if (!loom_check_float(g, n, 0) || !loom_check_ndim(g, n, 0, 4))
		return 0;
	int64_t c = x->shape.dims[1];
	for (int i = 1; i < 5; i++) {
		const loom_node *p = &g->nodes[n->src[i]];
		if (!loom_check_same_dtype(g, n, 0, i))
			return 0;
		if (p->shape.ndim != 1 || p->shape.dims[0] != c)
			return loom_graph_fail(g, LOOM_ERR_SHAPE,
					       "batchnorm2d: %s %s must be [%lld] for input %s",
					       loom_op_defs[n->op]->src_names[i],
					       loom_shape_str(&p->shape, bp, sizeof(bp)), (long long)c,
					       loom_shape_str(&x->shape, bx, sizeof(bx))), 0;
	}
	if (!(momentum >= 0 && momentum <= 1) || !(eps > 0))
		return loom_graph_fail(g, LOOM_ERR_INVALID,
				       "batchnorm2d: momentum %g must be in [0, 1] and eps %g positive",
				       momentum, eps), 0;
	n->shape = x->shape;
	n->dtype = x->dtype;
	return 1;
}

static void grad_batchnorm2d(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_node n = g->nodes[v];
	loom_grad_norm(g, &n, dy, ctx, LOOM_OP_BN_BWD_DATA, LOOM_OP_BN_BWD_GAMMA);
	if (loom_grad_needed(ctx, n.src[2]))
		loom_grad_accum(ctx, n.src[2], loom_grad_channel_sum(g, dy, n.src[2]));
}

LOOM_FORWARD_OP(batchnorm2d,
	.attrs = LOOM_ATTRS_BN,
	.src_names = { "input", "weight", "bias", "running_mean", "running_var" },
	.nondiff = LOOM_SRC(3) | LOOM_SRC(4),
	/* Only x takes the compute dtype; the affine parameters and the
	 * statistics keep their leaves' dtype (fp32 under keep_batchnorm_fp32:
	 * a half input with fp32 parameters, as cuDNN takes them). */
	.amp = {
		.cls = LOOM_AMP_DENY,
		.keep = LOOM_SRC(1) | LOOM_SRC(2) | LOOM_SRC(3) | LOOM_SRC(4),
		.bn_params = 1,
	});

LOOM_BACKWARD_OP(bn_bwd_data, "bn_bwd_data", LOOM_ATTRS_BN, "input", "weight", "dy");

LOOM_BACKWARD_OP(bn_bwd_gamma, "bn_bwd_gamma", LOOM_ATTRS_BN, "input", "dy");
