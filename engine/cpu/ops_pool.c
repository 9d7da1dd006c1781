/*
 * engine/cpu/ops_pool.c — the CPU entries of the pooling ops: max pooling
 * (with the relu graph/fuse.c may fold into it) and global average pooling,
 * forward and backward.
 */
#include "engine/cpu/blocked.h"
#include "engine/cpu/ops.h"

loom_status loom_cpu_op_maxpool2d(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				  const loom_cpu_io *io)
{
	loom_pool_shape ps;
	loom_cpu_node_side *e = loom_cpu_side_of(ctx, v);
	/* oneDNN's pooling, its argmax kept for the backward (side.c); loom's
	 * loops where oneDNN fails */
	if (e && e->kind == LOOM_CPU_SIDE_POOL_DNNL &&
	    !loom_cpu_dnnl_pool_fwd(e->pool, io->src[0], io->out, loom_cpu_side_ptr(ctx, e))) {
		e->run = ctx->run;
		return LOOM_OK;
	}
	if (e)
		e->run = 0;
	loom_pool_shape_of(plan->g, v, &ps);
	if (plan->g->nodes[v].format == LOOM_FORMAT_NCHW8C) { /* graph/formats.c */
		loom_cpu_maxpool8_fwd(&ps, io->src[0], io->out);
		return LOOM_OK;
	}
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(&plan->g->nodes[v]), loom_cpu_maxpool2d_fwd, &ps,
			  io->src[0], io->out);
	return LOOM_OK;
}

loom_status loom_cpu_op_maxpool2d_bwd(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				      const loom_cpu_io *io)
{
	loom_pool_shape ps;
	loom_cpu_node_side *e = loom_cpu_side_of(ctx, v);
	/* oneDNN's backward on the argmax its forward kept in this run */
	if (e && e->kind == LOOM_CPU_SIDE_POOL_DNNL && ctx->side[e->owner].run == ctx->run &&
	    !loom_cpu_dnnl_pool_bwd(ctx->side[e->owner].pool, io->src[0], io->src[1], io->out,
				    loom_cpu_side_ptr(ctx, e)))
		return LOOM_OK;
	loom_pool_shape_of(plan->g, v, &ps);
	if (plan->g->nodes[v].format == LOOM_FORMAT_NCHW8C) {
		loom_cpu_maxpool8_bwd(&ps, io->src[0], io->src[1], io->out);
		return LOOM_OK;
	}
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(&plan->g->nodes[v]), loom_cpu_maxpool2d_bwd, &ps,
			  io->src[0], io->src[1], io->out);
	return LOOM_OK;
}

/* Global average pooling, forward x [N, C, H, W] -> y [N, C] and backward
 * dy [N, C] -> dx [N, C, H, W]: N C from the 2-D side, H W from the 4-D. */
loom_status loom_cpu_op_global_avgpool(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				       const loom_cpu_io *io)
{
	const loom_node *n = &plan->g->nodes[v], *src = &plan->g->nodes[n->src[0]];
	const int bwd = n->op == LOOM_OP_GLOBAL_AVGPOOL_BWD;
	const loom_node *img = bwd ? n : src, *vec = bwd ? src : n;
	const int64_t nc = loom_shape_numel(&vec->shape);
	const int64_t hw = img->shape.dims[2] * img->shape.dims[3];
	(void)ctx;
	if (bwd)
		LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(n), loom_cpu_global_avgpool_bwd, nc, hw,
				  io->src[0], io->out);
	else
		LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(n), loom_cpu_global_avgpool_fwd, nc, hw,
				  io->src[0], io->out);
	return LOOM_OK;
}
