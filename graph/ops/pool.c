/*
 * graph/ops/pool.c — 2-D max pooling (square window; a relu before it may
 * be fused in, graph/fuse.c) and global average pooling [N, C, H, W] ->
 * [N, C], with their backward ops.
 */
#include "graph/ops/geometry.h"
#include "graph/ops/ops.h"

loom_value loom_maxpool2d(loom_graph *g, loom_value x, int kernel, int stride, int pad)
{
	loom_node n;
	loom_op_init(&n, LOOM_OP_MAXPOOL2D, 1, &x);
	n.a.pool.kernel = kernel;
	n.a.pool.stride = stride;
	n.a.pool.pad = pad;
	return loom_op_build(g, &n);
}

static int shape_maxpool2d(loom_graph *g, loom_node *n)
{
	char bx[96];
	const loom_node *x = &g->nodes[n->src[0]];
	int kernel = n->a.pool.kernel, stride = n->a.pool.stride, pad = n->a.pool.pad;
	if (!loom_check_float(g, n, 0) || !loom_check_ndim(g, n, 0, 4))
		return 0;
	if (kernel < 1 || stride < 1 || pad < 0 || 2 * pad > kernel)
		return loom_graph_fail(g, LOOM_ERR_INVALID,
				       "maxpool2d: kernel %d, stride %d, pad %d invalid (pad at most half the kernel)",
				       kernel, stride, pad), 0;
	if (!loom_window_result(n, x, x->shape.dims[1], kernel, kernel, stride, pad))
		return loom_graph_fail(g, LOOM_ERR_SHAPE, "maxpool2d: kernel %d larger than input %s",
				       kernel, loom_shape_str(&x->shape, bx, sizeof(bx))), 0;
	return 1;
}

static void grad_maxpool2d(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_node n = g->nodes[v];
	loom_value s[2] = { n.src[0], dy };
	loom_grad_op(g, ctx, n.src[0], LOOM_OP_MAXPOOL2D_BWD, 2, s, &n.a);
}

loom_value loom_global_avgpool(loom_graph *g, loom_value x)
{
	return loom_op_build_plain(g, LOOM_OP_GLOBAL_AVGPOOL, 1, &x);
}

static int shape_global_avgpool(loom_graph *g, loom_node *n)
{
	const loom_node *x = &g->nodes[n->src[0]];
	if (!loom_check_float(g, n, 0) || !loom_check_ndim(g, n, 0, 4))
		return 0;
	n->shape = loom_shape_make(2, x->shape.dims);
	n->dtype = x->dtype;
	return 1;
}

static void grad_global_avgpool(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_grad_op(g, ctx, g->nodes[v].src[0], LOOM_OP_GLOBAL_AVGPOOL_BWD, 1, &dy, NULL);
}

LOOM_FORWARD_OP(maxpool2d, .attrs = LOOM_ATTRS_POOL, .src_names = { "input" },
		.amp = { .cls = LOOM_AMP_FOLLOW });

LOOM_BACKWARD_OP(maxpool2d_bwd, "maxpool2d_bwd", LOOM_ATTRS_POOL, "input", "dy");

/* DENY: a reduction. */
LOOM_FORWARD_OP(global_avgpool, .src_names = { "input" }, .amp = { .cls = LOOM_AMP_DENY });

LOOM_BACKWARD_OP(global_avgpool_bwd, "global_avgpool_bwd", LOOM_ATTRS_NONE, "dy");
