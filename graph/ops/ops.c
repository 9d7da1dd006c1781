/*
 * graph/ops/ops.c — the op table, one row per op of graph_internal.h's
 * LOOM_OPS (the entries live in the family files and are declared only
 * here), and the helpers gradient rules share.
 */
#include "graph/ops/ops.h"

/* The entries, one per op (graph_internal.h's LOOM_OPS), each defined in
 * its family's file. */
#define OP_EXTERN(NAME, low) extern const loom_op_def loom_op_##low;
#define OP_EXTERN_PAIR(NAME, low) OP_EXTERN(NAME, low) OP_EXTERN(NAME##_BWD, low##_bwd)
LOOM_OPS(OP_EXTERN, OP_EXTERN_PAIR)
#undef OP_EXTERN
#undef OP_EXTERN_PAIR

const loom_op_def *const loom_op_defs[] = {
#define OP_ROW(NAME, low) [LOOM_OP_##NAME] = &loom_op_##low,
#define OP_ROW_PAIR(NAME, low) OP_ROW(NAME, low) OP_ROW(NAME##_BWD, low##_bwd)
	LOOM_OPS(OP_ROW, OP_ROW_PAIR)
#undef OP_ROW
#undef OP_ROW_PAIR
};

/* Every row of LOOM_OPS has its entry here by construction: an op whose
 * family file defines no loom_op_<low> fails to link. */
_Static_assert(sizeof(loom_op_defs) / sizeof(loom_op_defs[0]) == LOOM_OP_COUNT,
	       "graph/ops/ops.c: the op table must have one row per loom_op");

loom_value loom_grad_node(loom_graph *g, loom_op op, loom_value like, int nsrc,
			  const loom_value *src)
{
	const loom_node *l = &g->nodes[like];
	loom_value v = loom_node_add(g, op, l->dtype, l->shape, nsrc, src);
	if (v != LOOM_NONE)
		g->nodes[v].flags |= LOOM_NODE_BACKWARD;
	return v;
}

loom_value loom_grad_channel_sum(loom_graph *g, loom_value dy, loom_value like)
{
	return loom_grad_node(g, LOOM_OP_CHANNEL_SUM, like, 1, &dy);
}

void loom_grad_op(loom_graph *g, void *ctx, loom_value x, loom_op op, int nsrc,
		  const loom_value *src, const loom_attrs *a)
{
	if (!loom_grad_needed(ctx, x))
		return;
	loom_value d = loom_grad_node(g, op, x, nsrc, src);
	if (d != LOOM_NONE && a)
		g->nodes[d].a = *a;
	loom_grad_accum(ctx, x, d);
}

void loom_grad_norm(loom_graph *g, const loom_node *n, loom_value dy, void *ctx, loom_op data_op,
		    loom_op gamma_op)
{
	loom_value sx[3] = { n->src[0], n->src[1], dy }, sg[2] = { n->src[0], dy };
	loom_grad_op(g, ctx, n->src[0], data_op, 3, sx, &n->a);
	loom_grad_op(g, ctx, n->src[1], gamma_op, 2, sg, &n->a);
}

loom_value loom_grad_broadcast(loom_graph *g, loom_value x, loom_value like, double scale)
{
	loom_value v = loom_grad_node(g, LOOM_OP_BROADCAST, like, 1, &x);
	if (v != LOOM_NONE)
		g->nodes[v].a.bc.scale = scale;
	return v;
}

loom_value loom_grad_matmul(loom_graph *g, loom_value a, int ta, loom_value b, int tb,
			    loom_value like)
{
	loom_value s[2] = { a, b };
	loom_value v = loom_grad_node(g, LOOM_OP_MATMUL, like, 2, s);
	if (v != LOOM_NONE) {
		g->nodes[v].a.mm.ta = ta;
		g->nodes[v].a.mm.tb = tb;
	}
	return v;
}

loom_value loom_grad_rows(loom_graph *g, loom_value v)
{
	loom_shape s = g->nodes[v].shape;
	if (s.ndim == 2 || s.ndim < 1)
		return v;
	int64_t c = s.dims[s.ndim - 1];
	int64_t d[2] = { c ? loom_shape_numel(&s) / c : 0, c };
	loom_value r = loom_node_add(g, LOOM_OP_RESHAPE, g->nodes[v].dtype, loom_shape_make(2, d),
				     1, &v);
	if (r != LOOM_NONE)
		g->nodes[r].flags |= LOOM_NODE_BACKWARD;
	return r;
}
