/*
 * graph/ops/elementwise.c — ops that map each element on its own: relu and
 * its backward (x, dy) -> dx, add of two same-shaped values, and the cast
 * the AMP pass inserts between dtypes (the unary ops of graph/unary.h:
 * graph/ops/unary.c).
 */
#include "graph/ops/ops.h"

loom_value loom_relu(loom_graph *g, loom_value x)
{
	return loom_op_build_plain(g, LOOM_OP_RELU, 1, &x);
}

int loom_shape_like_input(loom_graph *g, loom_node *n)
{
	const loom_node *x = &g->nodes[n->src[0]];
	if (!loom_check_float(g, n, 0))
		return 0;
	n->shape = x->shape;
	n->dtype = x->dtype;
	return 1;
}

static void grad_relu(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_value x = g->nodes[v].src[0], s[2] = { x, dy };
	loom_grad_op(g, ctx, x, LOOM_OP_RELU_BWD, 2, s, NULL);
}

loom_value loom_add(loom_graph *g, loom_value a, loom_value b)
{
	loom_value src[2] = { a, b };
	return loom_op_build_plain(g, LOOM_OP_ADD, 2, src);
}

static int shape_add(loom_graph *g, loom_node *n)
{
	char ba[96], bb[96];
	const loom_node *a = &g->nodes[n->src[0]], *b = &g->nodes[n->src[1]];
	if (!loom_check_float(g, n, 0) || !loom_check_same_dtype(g, n, 0, 1))
		return 0;
	if (!loom_shape_eq(&a->shape, &b->shape))
		return loom_graph_fail(g, LOOM_ERR_SHAPE, "add: shapes %s and %s differ",
				       loom_shape_str(&a->shape, ba, sizeof(ba)),
				       loom_shape_str(&b->shape, bb, sizeof(bb))), 0;
	n->shape = a->shape;
	n->dtype = a->dtype;
	return 1;
}

static void grad_add(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_node n = g->nodes[v];
	for (int i = 0; i < 2; i++)
		if (loom_grad_needed(ctx, n.src[i]))
			loom_grad_accum(ctx, n.src[i], dy);
}

/* The gradient of a cast is dy cast back to the source's dtype. */
static void grad_cast(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_grad_op(g, ctx, g->nodes[v].src[0], LOOM_OP_CAST, 1, &dy, NULL);
}

const loom_op_def loom_op_relu = {
	.name = "relu",
	.kind = LOOM_OPK_FORWARD,
	.src_names = { "input" },
	.shape = loom_shape_like_input,
	.grad = grad_relu,
	.amp = { .cls = LOOM_AMP_FOLLOW },
};

LOOM_BACKWARD_OP(relu_bwd, "relu_bwd", LOOM_ATTRS_NONE, "input", "dy");

LOOM_FORWARD_OP(add, .attrs = LOOM_ATTRS_EW, .src_names = { "a", "b" },
		.amp = { .cls = LOOM_AMP_FOLLOW });

const loom_op_def loom_op_cast = {
	.name = "cast",
	.kind = LOOM_OPK_PASS,
	.src_names = { "input" },
	.grad = grad_cast,
	.amp = { .cls = LOOM_AMP_FOLLOW },
};
