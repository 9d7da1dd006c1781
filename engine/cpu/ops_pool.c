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

/* x [N, C, H, W] -> y [N, C] */
loom_status loom_cpu_op_global_avgpool(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				       const loom_cpu_io *io)
{
	const loom_node *n = &plan->g->nodes[v];
	const loom_node *x = &plan->g->nodes[n->src[0]];
	(void)ctx;
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(n), loom_cpu_global_avgpool_fwd,
			  loom_shape_numel(&n->shape), x->shape.dims[2] * x->shape.dims[3],
			  io->src[0], io->out);
	return LOOM_OK;
}

/* dy [N, C] -> dx [N, C, H, W] */
loom_status loom_cpu_op_global_avgpool_bwd(loom_cpu_ctx *ctx, const loom_plan *plan,
					   loom_value v, const loom_cpu_io *io)
{
	const loom_node *n = &plan->g->nodes[v];
	const loom_node *x = &plan->g->nodes[n->src[0]];
	(void)ctx;
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(n), loom_cpu_global_avgpool_bwd,
			  loom_shape_numel(&x->shape), n->shape.dims[2] * n->shape.dims[3],
			  io->src[0], io->out);
	return LOOM_OK;
}
