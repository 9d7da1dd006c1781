/*
 * graph/ops/embedding.c — the embedding lookup: rows of a table [V, C]
 * gathered by i32 ids of any shape, giving [..., C], and its backward, the
 * scatter-add of dy's rows into a [V, C] gradient (repeated ids add up). A
 * table used twice (GPT-2's tied token embedding and output projection)
 * gets the sum of both gradients from autodiff, as any value used twice.
 */
#include "graph/ops/ops.h"

loom_value loom_embedding(loom_graph *g, loom_value ids, loom_value table)
{
	loom_value src[2] = { ids, table };
	return loom_op_build_plain(g, LOOM_OP_EMBEDDING, 2, src);
}

static int shape_embedding(loom_graph *g, loom_node *n)
{
	char bi[96];
	const loom_node *ids = &g->nodes[n->src[0]], *w = &g->nodes[n->src[1]];
	if (!loom_check_float(g, n, 1) || !loom_check_ndim(g, n, 1, 2))
		return 0;
	if (ids->dtype != LOOM_I32)
		return loom_graph_fail(g, LOOM_ERR_DTYPE, "embedding: ids have dtype %s, expected i32",
				       loom_dtype_name(ids->dtype)), 0;
	if (ids->shape.ndim >= LOOM_MAX_DIMS)
		return loom_graph_fail(g, LOOM_ERR_SHAPE, "embedding: ids %s have too many dims",
				       loom_shape_str(&ids->shape, bi, sizeof(bi))), 0;
	n->shape = ids->shape;
	n->shape.dims[n->shape.ndim++] = w->shape.dims[1];
	n->dtype = w->dtype;
	return 1;
}

static void grad_embedding(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_node n = g->nodes[v];
	loom_value s[2] = { n.src[0], dy };
	loom_grad_op(g, ctx, n.src[1], LOOM_OP_EMBEDDING_BWD, 2, s, NULL);
}

/* The table's dtype under every level: half under O2, else the table's
 * (FOLLOW: the i32 ids are kept and count for nothing). */
LOOM_FORWARD_OP(embedding, .src_names = { "ids", "table" }, .nondiff = LOOM_SRC(0),
		.amp = { .cls = LOOM_AMP_FOLLOW, .keep = LOOM_SRC(0) });

LOOM_BACKWARD_OP(embedding_bwd, "embedding_bwd", LOOM_ATTRS_NONE, "ids", "dy");
