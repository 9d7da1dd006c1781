/*
 * engine/cpu/ops_bn.c — the CPU entries of batch norm (forward in training
 * and eval mode, with the relu graph/fuse.c may fold into it; the data and
 * gamma gradients) and of the per-channel sum
 * that makes beta's and a conv bias's gradient.
 */
#include "engine/cpu/ops.h"

/* x [N, C, H, W] as batch norm's kernels take it. */
static void nchw(const loom_plan *plan, const loom_node *n, int *nb, int *c, int64_t *hw)
{
	const loom_node *x = &plan->g->nodes[n->src[0]];
	*nb = (int)x->shape.dims[0];
	*c = (int)x->shape.dims[1];
	*hw = x->shape.dims[2] * x->shape.dims[3];
}

loom_status loom_cpu_op_batchnorm2d(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				    const loom_cpu_io *io)
{
	const loom_node *n = &plan->g->nodes[v];
	loom_dtype dt = loom_cpu_kernel_dtype(n);
	int nb, c;
	int64_t hw;
	nchw(plan, n, &nb, &c, &hw);
	if (ctx->train)
		LOOM_CPU_DISPATCH(dt, loom_cpu_bn_fwd_train, nb, c, hw, io->src[0], io->src[1],
				  io->src[2], io->src[3], io->src[4], n->a.bn.momentum, n->a.bn.eps,
				  io->out);
	else
		LOOM_CPU_DISPATCH(dt, loom_cpu_bn_fwd_eval, nb, c, hw, io->src[0], io->src[1],
				  io->src[2], io->src[3], io->src[4], n->a.bn.eps, io->out);
	if (n->a.bn.relu) /* fused (graph/fuse.c), before any rounding to half */
		LOOM_CPU_DISPATCH(dt, loom_cpu_relu_fwd, loom_shape_numel(&n->shape), io->out,
				  io->out);
	return LOOM_OK;
}

loom_status loom_cpu_op_bn_bwd_data(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				    const loom_cpu_io *io)
{
	const loom_node *n = &plan->g->nodes[v];
	int nb, c;
	int64_t hw;
	(void)ctx;
	nchw(plan, n, &nb, &c, &hw);
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(n), loom_cpu_bn_bwd_data, nb, c, hw, io->src[0],
			  io->src[1], io->src[2], n->a.bn.eps, io->out);
	return LOOM_OK;
}

loom_status loom_cpu_op_bn_bwd_gamma(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				     const loom_cpu_io *io)
{
	const loom_node *n = &plan->g->nodes[v];
	int nb, c;
	int64_t hw;
	(void)ctx;
	nchw(plan, n, &nb, &c, &hw);
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(n), loom_cpu_bn_bwd_gamma, nb, c, hw, io->src[0],
			  io->src[1], n->a.bn.eps, io->out);
	return LOOM_OK;
}

loom_status loom_cpu_op_channel_sum(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				    const loom_cpu_io *io)
{
	const loom_node *n = &plan->g->nodes[v];
	const loom_node *x = &plan->g->nodes[n->src[0]];
	int64_t hw = 1;
	(void)ctx;
	for (int i = 2; i < x->shape.ndim; i++)
		hw *= x->shape.dims[i];
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(n), loom_cpu_channel_sum, (int)x->shape.dims[0],
			  (int)x->shape.dims[1], hw, io->src[0], io->out);
	return LOOM_OK;
}
