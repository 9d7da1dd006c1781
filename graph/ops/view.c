/*
 * graph/ops/view.c — reshape (and flatten, a reshape to [N, -1]): a view
 * of its source's storage, with no kernel of its own. The fusion passes
 * also turn fused-away nodes into views (graph/fuse.c).
 */
#include "graph/ops/ops.h"

loom_value loom_reshape(loom_graph *g, loom_value x, int ndim, const int64_t *dims)
{
	if (!g || !loom_check_value(g, x, "reshape", "input"))
		return LOOM_NONE;
	if (ndim < 0 || ndim > LOOM_MAX_DIMS || (ndim > 0 && !dims))
		return loom_graph_fail(g, LOOM_ERR_SHAPE, "reshape: %d dims (0..%d allowed)", ndim,
				       LOOM_MAX_DIMS);
	loom_node n;
	loom_op_init(&n, LOOM_OP_RESHAPE, 1, &x);
	n.shape = loom_shape_make(ndim, dims);
	return loom_op_build(g, &n);
}

loom_value loom_flatten(loom_graph *g, loom_value x)
{
	if (!g || !loom_check_value(g, x, "flatten", "input"))
		return LOOM_NONE;
	if (g->nodes[x].shape.ndim < 1)
		return loom_graph_fail(g, LOOM_ERR_SHAPE, "flatten: a scalar has no batch dim");
	int64_t d[2] = { g->nodes[x].shape.dims[0], -1 };
	return loom_reshape(g, x, 2, d);
}

/* n->shape is the shape asked for: one dim may be -1 (inferred). */
static int shape_reshape(loom_graph *g, loom_node *n)
{
	char bx[96];
	const loom_node *x = &g->nodes[n->src[0]];
	loom_shape *s = &n->shape;
	int infer = -1;
	int64_t known = 1, total = loom_shape_numel(&x->shape);
	for (int i = 0; i < s->ndim; i++) {
		if (s->dims[i] == -1 && infer < 0) {
			infer = i;
		} else if (s->dims[i] <= 0) {
			return loom_graph_fail(g, LOOM_ERR_SHAPE,
					       "reshape: dim %d is %lld (one -1 allowed, others positive)",
					       i, (long long)s->dims[i]), 0;
		} else {
			known *= s->dims[i];
		}
	}
	if (infer >= 0) {
		if (total % known)
			return loom_graph_fail(g, LOOM_ERR_SHAPE, "reshape: %s cannot be split by %lld",
					       loom_shape_str(&x->shape, bx, sizeof(bx)),
					       (long long)known), 0;
		s->dims[infer] = total / known;
		known *= s->dims[infer];
	}
	if (known != total)
		return loom_graph_fail(g, LOOM_ERR_SHAPE,
				       "reshape: %s has %lld elements, the new shape %lld",
				       loom_shape_str(&x->shape, bx, sizeof(bx)), (long long)total,
				       (long long)known), 0;
	n->dtype = x->dtype;
	return 1;
}

static void grad_reshape(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_grad_op(g, ctx, g->nodes[v].src[0], LOOM_OP_RESHAPE, 1, &dy, NULL);
}

LOOM_FORWARD_OP(reshape, .flags = LOOM_OPF_VIEW, .src_names = { "input" },
		.amp = { .cls = LOOM_AMP_FOLLOW });
