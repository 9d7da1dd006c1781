/*
 * engine/cpu/ops_conv.c — the CPU entries of the convolution ops: forward,
 * and the data and filter gradients, on the geometry graph/ops/geometry.h
 * derives once for both backends.
 */
#include "engine/cpu/ops.h"

static size_t align64(size_t x)
{
	return (x + 63) & ~(size_t)63;
}

size_t loom_cpu_conv_workspace(const loom_plan *plan, loom_value v, size_t elem)
{
	loom_conv_shape s;
	loom_conv_shape_of(plan->g, v, &s);
	return align64(loom_cpu_conv2d_workspace(&s, elem));
}

loom_status loom_cpu_op_conv2d(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			       const loom_cpu_io *io)
{
	const loom_node *n = &plan->g->nodes[v];
	loom_conv_shape cs;
	(void)ctx;
	loom_conv_shape_of(plan->g, v, &cs);
	if (loom_cpu_kernel_dtype(n) == LOOM_F64)
		loom_cpu_conv2d_fwd_f64(&cs, io->src[0], io->src[1],
					n->nsrc > 2 ? io->src[2] : NULL, io->out, io->ws);
	else
		loom_cpu_conv2d_fwd_f32(&cs, io->src[0], io->src[1],
					n->nsrc > 2 ? io->src[2] : NULL, io->out, io->ws);
	return LOOM_OK;
}

loom_status loom_cpu_op_conv2d_bwd_data(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
					const loom_cpu_io *io)
{
	loom_conv_shape cs;
	(void)ctx;
	loom_conv_shape_of(plan->g, v, &cs);
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(&plan->g->nodes[v]), loom_cpu_conv2d_bwd_data, &cs,
			  io->src[0], io->src[1], io->out, io->ws);
	return LOOM_OK;
}

loom_status loom_cpu_op_conv2d_bwd_filter(loom_cpu_ctx *ctx, const loom_plan *plan,
					  loom_value v, const loom_cpu_io *io)
{
	loom_conv_shape cs;
	(void)ctx;
	loom_conv_shape_of(plan->g, v, &cs);
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(&plan->g->nodes[v]), loom_cpu_conv2d_bwd_filter,
			  &cs, io->src[0], io->src[1], io->out, io->ws);
	return LOOM_OK;
}
