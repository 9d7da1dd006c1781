/*
 * graph/ops/rmsnorm.c — RMS normalisation over the last dimension
 * (torch.nn.RMSNorm(C), as LLaMA-style GPTs use it): y = x / sqrt(mean(x^2)
 * + eps) * gamma, no centring and no bias, and its backward: dx from
 * (x, gamma, dy), dgamma from (x, dy). Statistics are fp32 (f64 for f64
 * graphs) on every backend and at every opt level.
 */
#include "graph/ops/ops.h"

loom_value loom_rms_norm(loom_graph *g, loom_value x, loom_value gamma, double eps)
{
	loom_node n;
	loom_value src[2] = { x, gamma };
	loom_op_init(&n, LOOM_OP_RMSNORM, 2, src);
	n.a.ln.eps = eps;
	return loom_op_build(g, &n);
}

static void grad_rmsnorm(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_node n = g->nodes[v];
	loom_grad_norm(g, &n, dy, ctx, LOOM_OP_RMSNORM_BWD_DATA, LOOM_OP_RMSNORM_BWD_GAMMA);
}

/* fp32 under O1 as layer norm (a normalisation: apex's FP32 list), half
 * storage under O2 with fp32 statistics inside the kernels. */
const loom_op_def loom_op_rmsnorm = {
	.name = "rms_norm",
	.kind = LOOM_OPK_FORWARD,
	.attrs = LOOM_ATTRS_LN,
	.src_names = { "input", "gamma" },
	.shape = loom_shape_norm_rows, /* layernorm.c */
	.grad = grad_rmsnorm,
	.amp = { .cls = LOOM_AMP_DENY },
	.recompute = 2,
};

LOOM_BACKWARD_OP(rmsnorm_bwd_data, "rms_norm_bwd_data", LOOM_ATTRS_LN, "input", "gamma", "dy");

LOOM_BACKWARD_OP(rmsnorm_bwd_gamma, "rms_norm_bwd_gamma", LOOM_ATTRS_LN, "input", "dy");
