/*
 * graph/rowpad.c — which values a padded vocabulary lays out with padded
 * rows (graph/rowpad.h). Node order is topological (sources first), so
 * one pass in order closes each set over its readers.
 */
#include <string.h>

#include "graph/ops/ops.h"
#include "graph/rowpad.h"

static int64_t last_dim(const loom_node *n)
{
	return n->shape.ndim > 0 ? n->shape.dims[n->shape.ndim - 1] : 0;
}

/* v through reshapes and casts back to what made it. */
static loom_value through_views(const loom_graph *g, loom_value v)
{
	while (g->nodes[v].op == LOOM_OP_RESHAPE || g->nodes[v].op == LOOM_OP_CAST)
		v = g->nodes[v].src[0];
	return v;
}

/* Whether w [V, C] is the weight (a leaf, or a cast of one, marked ROWS). */
static int is_rows(const unsigned char *mark, loom_value w)
{
	return w != LOOM_NONE && mark[w] == LOOM_ROWPAD_ROWS;
}

int64_t loom_rowpad_find(const loom_graph *g, int64_t multiple, unsigned char *mark,
			 int64_t *padded)
{
	memset(mark, 0, (size_t)g->n);
	*padded = 0;
	if (multiple <= 0)
		return -1;
	loom_value lin = LOOM_NONE, w = LOOM_NONE;
	for (loom_value v = 0; v < g->n && lin == LOOM_NONE; v++) {
		const loom_node *n = &g->nodes[v];
		if (n->op != LOOM_OP_SOFTMAX_CE)
			continue;
		loom_value p = through_views(g, n->src[0]);
		const loom_node *pn = &g->nodes[p];
		if (pn->op != LOOM_OP_LINEAR || pn->nsrc < 2)
			continue;
		loom_value leaf = through_views(g, pn->src[1]);
		const loom_node *ln = &g->nodes[leaf];
		const int64_t V = last_dim(pn);
		if (!loom_op_is_leaf((loom_op)ln->op) || ln->shape.ndim != 2 || ln->shape.dims[0] != V ||
		    V % multiple == 0)
			continue;
		lin = p;
		w = leaf;
	}
	if (lin == LOOM_NONE)
		return 0;
	const int64_t V = last_dim(&g->nodes[lin]);
	const loom_node *wn = &g->nodes[w];
	mark[w] = LOOM_ROWPAD_ROWS;
	mark[lin] = LOOM_ROWPAD_COLS;
	/* The weight's table readers: an embedding over it. */
	int embedded = 0;
	for (loom_value v = 0; v < g->n; v++) {
		const loom_node *n = &g->nodes[v];
		if (v == w || v == lin)
			continue;
		const int same_as_w = n->shape.ndim == 2 && n->shape.dims[0] == V &&
				      n->shape.dims[1] == wn->shape.dims[1];
		int cols_src = 0, rows_src = 0;
		for (int i = 0; i < n->nsrc; i++) {
			cols_src |= mark[n->src[i]] == LOOM_ROWPAD_COLS;
			rows_src |= is_rows(mark, n->src[i]);
		}
		switch (n->op) {
		case LOOM_OP_CAST: /* the weight's half copy, the logits widened */
		case LOOM_OP_RESHAPE:
			if (mark[n->src[0]] == LOOM_ROWPAD_COLS && last_dim(n) == V)
				mark[v] = LOOM_ROWPAD_COLS;
			else if (is_rows(mark, n->src[0]) && same_as_w)
				mark[v] = LOOM_ROWPAD_ROWS;
			break;
		case LOOM_OP_SOFTMAX_CE_BWD: /* dlogits */
			if (mark[n->src[0]] == LOOM_ROWPAD_COLS)
				mark[v] = LOOM_ROWPAD_COLS;
			break;
		case LOOM_OP_MATMUL: /* dW = dlogits^T x: [V, C]; dx reads, keeps its rows */
			if (cols_src && n->a.mm.ta && same_as_w)
				mark[v] = LOOM_ROWPAD_ROWS;
			break;
		case LOOM_OP_EMBEDDING:
			embedded |= rows_src && n->nsrc > 1 && is_rows(mark, n->src[1]);
			break;
		case LOOM_OP_EMBEDDING_BWD: /* the tied table's other gradient */
			if (embedded && same_as_w)
				mark[v] = LOOM_ROWPAD_ROWS;
			break;
		case LOOM_OP_ADD: /* the two gradients' sum */
			if (same_as_w && n->nsrc == 2 && is_rows(mark, n->src[0]) &&
			    is_rows(mark, n->src[1]))
				mark[v] = LOOM_ROWPAD_ROWS;
			break;
		default:
			break;
		}
	}
	*padded = (V + multiple - 1) / multiple * multiple;
	return V;
}
