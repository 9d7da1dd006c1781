/*
 * engine/cpu/ops_dense.c — the CPU entries of the dense ops: linear (with a
 * relu graph/fuse.c may fold into it), matrix product (each on the kernel
 * ksearch.c chose: loom's split GEMM or oneDNN's matmul primitive).
 */
#include "engine/cpu/ops.h"

/* Runs node v on the oneDNN matmul primitive ksearch.c chose for it, if it
 * did; 0 if it ran. Where oneDNN fails the node runs loom's own GEMM. */
static int run_matmul(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
		      const loom_cpu_io *io)
{
	if (!ctx->kern || v >= ctx->n_kern || !ctx->kern[v].mm)
		return -1;
	return loom_cpu_kern_run(plan, v, &ctx->kern[v], io->src, io->out, io->ws);
}

loom_status loom_cpu_op_linear(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			       const loom_cpu_io *io)
{
	const loom_node *n = &plan->g->nodes[v];
	const loom_node *x = &plan->g->nodes[n->src[0]];
	const loom_node *w = &plan->g->nodes[n->src[1]];
	loom_dtype dt = loom_cpu_kernel_dtype(n);
	int in = (int)w->shape.dims[1], rows = (int)loom_shape_rows(&x->shape);
	if (run_matmul(ctx, plan, v, io) == 0)
		; /* oneDNN's matmul primitive, chosen when the plan was made */
	else if (dt == LOOM_F64)
		loom_cpu_linear_fwd_f64(rows, in, (int)w->shape.dims[0], io->src[0], io->src[1],
					n->nsrc > 2 ? io->src[2] : NULL, io->out);
	else
		loom_cpu_linear_fwd_f32(rows, in, (int)w->shape.dims[0], io->src[0], io->src[1],
					n->nsrc > 2 ? io->src[2] : NULL, io->out);
	if (n->a.mm.relu) /* fused (graph/fuse.c), before any rounding to half */
		LOOM_CPU_DISPATCH(dt, loom_cpu_relu_fwd, loom_shape_numel(&n->shape), io->out,
				  io->out);
	return LOOM_OK;
}

loom_status loom_cpu_op_matmul(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			       const loom_cpu_io *io)
{
	const loom_node *n = &plan->g->nodes[v];
	const loom_node *x = &plan->g->nodes[n->src[0]];
	int ta = n->a.mm.ta, tb = n->a.mm.tb;
	int k = (int)(ta ? loom_shape_rows(&x->shape) : loom_shape_last(&x->shape));
	if (run_matmul(ctx, plan, v, io) == 0)
		return LOOM_OK;
	/* Operands of more than 2 dims are their rows (autodiff's linear over
	 * [B, T, C]): [..., last] as [numel / last, last]. */
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(n), loom_cpu_gemm, ta, tb,
			  (int)loom_shape_rows(&n->shape), (int)loom_shape_last(&n->shape), k, 1.0,
			  io->src[0], io->src[1], 0.0, io->out);
	return LOOM_OK;
}
