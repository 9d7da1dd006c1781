/*
 * graph/ops/reduce.c — reductions and their adjoint: sum of all elements
 * -> [], broadcast of a scalar to a shape (times a scale; mean is sum then
 * a 1/numel broadcast), and the per-channel sum that makes bias gradients.
 */
#include "graph/ops/ops.h"

loom_value loom_sum(loom_graph *g, loom_value x)
{
	return loom_op_build_plain(g, LOOM_OP_SUM, 1, &x);
}

static int shape_sum(loom_graph *g, loom_node *n)
{
	if (!loom_check_float(g, n, 0))
		return 0;
	n->shape = loom_shape_make(0, NULL);
	n->dtype = g->nodes[n->src[0]].dtype;
	return 1;
}

static void grad_sum(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_value x = g->nodes[v].src[0];
	if (loom_grad_needed(ctx, x))
		loom_grad_accum(ctx, x, loom_grad_broadcast(g, dy, x, 1.0));
}

loom_value loom_mean(loom_graph *g, loom_value x)
{
	loom_value s = loom_sum(g, x);
	if (s == LOOM_NONE)
		return s;
	loom_node n;
	loom_op_init(&n, LOOM_OP_BROADCAST, 1, &s);
	n.shape = loom_shape_make(0, NULL);
	n.a.bc.scale = 1.0 / (double)loom_shape_numel(&g->nodes[x].shape);
	return loom_op_build(g, &n);
}

/* n->shape is the shape asked for; the source is a scalar. */
static int shape_broadcast(loom_graph *g, loom_node *n)
{
	char bx[96];
	const loom_node *x = &g->nodes[n->src[0]];
	if (x->shape.ndim != 0)
		return loom_graph_fail(g, LOOM_ERR_SHAPE, "broadcast: input %s must be a scalar",
				       loom_shape_str(&x->shape, bx, sizeof(bx))), 0;
	n->dtype = x->dtype;
	return 1;
}

static void grad_broadcast(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_node n = g->nodes[v];
	if (!loom_grad_needed(ctx, n.src[0]))
		return;
	loom_value d = dy;
	if (n.shape.ndim > 0)
		d = loom_grad_node(g, LOOM_OP_SUM, n.src[0], 1, &dy);
	loom_grad_accum(ctx, n.src[0], loom_grad_broadcast(g, d, n.src[0], n.a.bc.scale));
}

/* FP32: the loss's reductions. */
LOOM_FORWARD_OP(sum, .src_names = { "input" }, .amp = { .cls = LOOM_AMP_FP32 });

LOOM_FORWARD_OP(broadcast, .attrs = LOOM_ATTRS_BC, .src_names = { "input" },
		.amp = { .cls = LOOM_AMP_FP32 });

/* [N, C, ...] -> [C]: a bias's gradient, made only by gradient rules. */
LOOM_BACKWARD_OP(channel_sum, "channel_sum", LOOM_ATTRS_NONE, "dy");
