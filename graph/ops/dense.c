/*
 * graph/ops/dense.c — matrix products: linear y = x w^T + b (a relu may be
 * fused in, graph/fuse.c) and matmul c = op(a) op(b), whose transposed forms
 * only autodiff builds.
 */
#include "graph/ops/ops.h"

loom_value loom_linear(loom_graph *g, loom_value x, loom_value w, loom_value b)
{
	loom_value src[3] = { x, w, b };
	return loom_op_build_plain(g, LOOM_OP_LINEAR, b == LOOM_NONE ? 2 : 3, src);
}

/* x [..., in] (any leading dims: [N, in], GPT's [B, T, C]), w [out, in],
 * b [out]: y [..., out], the leading dims kept. */
static int shape_linear(loom_graph *g, loom_node *n)
{
	char bx[96], bw[96], bb[96];
	const loom_node *x = &g->nodes[n->src[0]], *w = &g->nodes[n->src[1]];
	if (!loom_check_float(g, n, 0) || !loom_check_same_dtype(g, n, 0, 1) ||
	    !loom_check_ndim(g, n, 1, 2))
		return 0;
	int last = x->shape.ndim - 1;
	if (last < 1)
		return loom_graph_fail(g, LOOM_ERR_SHAPE, "linear: input %s must have at least 2 dims",
				       loom_shape_str(&x->shape, bx, sizeof(bx))), 0;
	if (x->shape.dims[last] != w->shape.dims[1])
		return loom_graph_fail(g, LOOM_ERR_SHAPE,
				       "linear: input %s has %lld features, weight %s expects %lld",
				       loom_shape_str(&x->shape, bx, sizeof(bx)),
				       (long long)x->shape.dims[last],
				       loom_shape_str(&w->shape, bw, sizeof(bw)),
				       (long long)w->shape.dims[1]), 0;
	if (n->nsrc > 2) {
		const loom_node *b = &g->nodes[n->src[2]];
		if (!loom_check_same_dtype(g, n, 0, 2))
			return 0;
		if (b->shape.ndim != 1 || b->shape.dims[0] != w->shape.dims[0])
			return loom_graph_fail(g, LOOM_ERR_SHAPE, "linear: bias %s must be [%lld] for weight %s",
					       loom_shape_str(&b->shape, bb, sizeof(bb)),
					       (long long)w->shape.dims[0],
					       loom_shape_str(&w->shape, bw, sizeof(bw))), 0;
	}
	n->shape = x->shape;
	n->shape.dims[last] = w->shape.dims[0];
	n->dtype = x->dtype;
	return 1;
}

/* y = x w^T + b: dx = dy w, dw = dy^T x, db = column sums of dy, with x and
 * dy seen as [rows, features] (views, no copies) when they have more than 2
 * dims; dx is made in x's shape (a product writes rows of its output's last
 * dim whatever the leading dims). */
static void grad_linear(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_node n = g->nodes[v];
	loom_value dy2 = loom_grad_rows(g, dy);
	if (loom_grad_needed(ctx, n.src[0]))
		loom_grad_accum(ctx, n.src[0], loom_grad_matmul(g, dy2, 0, n.src[1], 0, n.src[0]));
	if (loom_grad_needed(ctx, n.src[1]))
		loom_grad_accum(ctx, n.src[1], loom_grad_matmul(g, dy2, 1, loom_grad_rows(g, n.src[0]),
								0, n.src[1]));
	if (n.nsrc > 2 && loom_grad_needed(ctx, n.src[2]))
		loom_grad_accum(ctx, n.src[2], loom_grad_channel_sum(g, dy2, n.src[2]));
}

loom_value loom_matmul(loom_graph *g, loom_value a, loom_value b)
{
	loom_value src[2] = { a, b };
	return loom_op_build_plain(g, LOOM_OP_MATMUL, 2, src);
}

static int shape_matmul(loom_graph *g, loom_node *n)
{
	char ba[96], bb[96];
	const loom_node *a = &g->nodes[n->src[0]], *b = &g->nodes[n->src[1]];
	if (!loom_check_float(g, n, 0) || !loom_check_same_dtype(g, n, 0, 1) ||
	    !loom_check_ndim(g, n, 0, 2) || !loom_check_ndim(g, n, 1, 2))
		return 0;
	if (a->shape.dims[1] != b->shape.dims[0])
		return loom_graph_fail(g, LOOM_ERR_SHAPE, "matmul: a %s and b %s: inner dims differ",
				       loom_shape_str(&a->shape, ba, sizeof(ba)),
				       loom_shape_str(&b->shape, bb, sizeof(bb))), 0;
	int64_t d[2] = { a->shape.dims[0], b->shape.dims[1] };
	n->shape = loom_shape_make(2, d);
	n->dtype = a->dtype;
	return 1;
}

/* c = op(a) op(b); only the untransposed form is built by users. */
static void grad_matmul(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_node n = g->nodes[v];
	if (n.a.mm.ta || n.a.mm.tb) {
		loom_graph_fail(g, LOOM_ERR_UNSUPPORTED,
				"autodiff: gradient of a transposed matmul (#%d)", (int)v);
		return;
	}
	if (loom_grad_needed(ctx, n.src[0]))
		loom_grad_accum(ctx, n.src[0], loom_grad_matmul(g, dy, 0, n.src[1], 1, n.src[0]));
	if (loom_grad_needed(ctx, n.src[1]))
		loom_grad_accum(ctx, n.src[1], loom_grad_matmul(g, n.src[0], 1, dy, 0, n.src[1]));
}

LOOM_FORWARD_OP(linear, .attrs = LOOM_ATTRS_MM, .src_names = { "input", "weight", "bias" },
		.amp = { .cls = LOOM_AMP_ALLOW, .fp8_src = LOOM_SRC(0) | LOOM_SRC(1) });

LOOM_FORWARD_OP(matmul, .attrs = LOOM_ATTRS_MM, .src_names = { "a", "b" },
		.amp = { .cls = LOOM_AMP_ALLOW, .fp8_src = LOOM_SRC(0) | LOOM_SRC(1) });
