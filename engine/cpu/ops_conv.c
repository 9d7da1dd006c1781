/*
 * engine/cpu/ops_conv.c — the CPU entries of the convolution ops: forward,
 * and the data and filter gradients, on the geometry graph/ops/geometry.h
 * derives once for both backends. Each f32 conv node runs the kernel
 * ksearch.c chose for its shape when the plan was made: oneDNN's
 * convolution primitive (conv_dnnl.c, on NCHW or blocked) or loom's im2col
 * + GEMM kernels (conv_impl.h).
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

size_t loom_cpu_conv_node_ws(const loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			     size_t elem)
{
	size_t ws = loom_cpu_conv_workspace(plan, v, elem);
	if (ctx->kern && v < ctx->n_kern) {
		size_t d = loom_cpu_kern_ws(plan, v, &ctx->kern[v]);
		if (d > ws)
			ws = d;
	}
	return ws;
}

/* Runs node v on its primitive if it has one; 0 if it did. */
static int run_dnnl(loom_cpu_ctx *ctx, loom_value v, const loom_cpu_io *io, const void *bias)
{
	if (!ctx->kern || v >= ctx->n_kern || !ctx->kern[v].conv)
		return -1;
	return loom_cpu_dnnl_conv_run(ctx->kern[v].conv, io->src[0], io->src[1], bias, io->out,
				      io->ws);
}

loom_status loom_cpu_op_conv2d(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			       const loom_cpu_io *io)
{
	const loom_node *n = &plan->g->nodes[v];
	const void *bias = n->nsrc > 2 ? io->src[2] : NULL;
	loom_conv_shape cs;
	if (run_dnnl(ctx, v, io, bias) == 0)
		return LOOM_OK;
	loom_conv_shape_of(plan->g, v, &cs);
	if (loom_cpu_kernel_dtype(n) == LOOM_F64)
		loom_cpu_conv2d_fwd_f64(&cs, io->src[0], io->src[1], bias, io->out, io->ws);
	else
		loom_cpu_conv2d_fwd_f32(&cs, io->src[0], io->src[1], bias, io->out, io->ws);
	return LOOM_OK;
}

loom_status loom_cpu_op_conv2d_bwd_data(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
					const loom_cpu_io *io)
{
	loom_conv_shape cs;
	if (run_dnnl(ctx, v, io, NULL) == 0)
		return LOOM_OK;
	loom_conv_shape_of(plan->g, v, &cs);
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(&plan->g->nodes[v]), loom_cpu_conv2d_bwd_data, &cs,
			  io->src[0], io->src[1], io->out, io->ws);
	return LOOM_OK;
}

loom_status loom_cpu_op_conv2d_bwd_filter(loom_cpu_ctx *ctx, const loom_plan *plan,
					  loom_value v, const loom_cpu_io *io)
{
	loom_conv_shape cs;
	if (run_dnnl(ctx, v, io, NULL) == 0)
		return LOOM_OK;
	loom_conv_shape_of(plan->g, v, &cs);
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(&plan->g->nodes[v]), loom_cpu_conv2d_bwd_filter,
			  &cs, io->src[0], io->src[1], io->out, io->ws);
	return LOOM_OK;
}
