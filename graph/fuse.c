/*
 * graph/fuse.c — the relu + max-pool fusion pass, run by loom_compile after
 * autodiff and before memory planning. maxpool(relu(x)) equals
 * relu(maxpool(x)) exactly (max and relu commute, ties and NaN included), so
 * the pool can read x and apply relu to its 4x smaller output; its backward
 * routes dy only where the window's max is > 0, which is relu's backward
 * too. The relu and its backward turn into views: two full-size passes and
 * their buffers disappear from every ConvNet/ResNet block that ends in
 * relu -> pool.
 */
#include <stdlib.h>

#include "graph/graph_internal.h"

/* The nodes reading v (at most max of them), or -1 if there are more. */
static int readers(const loom_graph *g, loom_value v, loom_value *out, int max)
{
	int n = 0;
	for (int u = v + 1; u < g->n; u++) {
		const loom_node *nd = &g->nodes[u];
		for (int i = 0; i < nd->nsrc; i++) {
			if (nd->src[i] != v)
				continue;
			if (n == max)
				return -1;
			out[n++] = u;
			break;
		}
	}
	return n;
}

/* Turns node v into a view of src: no kernel, no storage of its own. */
static void make_view(loom_graph *g, loom_value v, loom_value src)
{
	loom_node *n = &g->nodes[v];
	n->op = LOOM_OP_RESHAPE;
	n->nsrc = 1;
	n->src[0] = src;
	for (int i = 1; i < LOOM_MAX_SRC; i++)
		n->src[i] = LOOM_NONE;
}

int loom_fuse_relu_pool(loom_graph *g)
{
	int fused = 0;
	for (int r = 0; r < g->n; r++) {
		loom_node *rn = &g->nodes[r];
		if (rn->op != LOOM_OP_RELU || (rn->flags & (LOOM_NODE_OUTPUT | LOOM_NODE_GRAD)))
			continue;
		loom_value x = rn->src[0];
		/* The relu must feed exactly one pool and that pool's backward. */
		loom_value rd[3];
		int nr = readers(g, r, rd, 2);
		loom_value pool = LOOM_NONE, pool_bwd = LOOM_NONE;
		for (int i = 0; i < nr; i++) {
			const loom_node *u = &g->nodes[rd[i]];
			if (u->op == LOOM_OP_MAXPOOL2D && u->src[0] == r && pool == LOOM_NONE)
				pool = rd[i];
			else if (u->op == LOOM_OP_MAXPOOL2D_BWD && u->src[0] == r && pool_bwd == LOOM_NONE)
				pool_bwd = rd[i];
			else
				pool = pool_bwd = LOOM_NONE, nr = -1;
		}
		if (nr < 1 || pool == LOOM_NONE)
			continue;
		/* In training the pool's backward feeds only relu's backward. */
		loom_value relu_bwd = LOOM_NONE;
		if (pool_bwd != LOOM_NONE) {
			loom_value pr[2];
			if (readers(g, pool_bwd, pr, 1) != 1)
				continue;
			const loom_node *u = &g->nodes[pr[0]];
			if (u->op != LOOM_OP_RELU_BWD || u->src[0] != x || u->src[1] != pool_bwd ||
			    (g->nodes[pool_bwd].flags & (LOOM_NODE_OUTPUT | LOOM_NODE_GRAD)))
				continue;
			relu_bwd = pr[0];
		}
		g->nodes[pool].src[0] = x;
		g->nodes[pool].a.pool.relu = 1;
		if (pool_bwd != LOOM_NONE) {
			g->nodes[pool_bwd].src[0] = x;
			g->nodes[pool_bwd].a.pool.relu = 1;
			make_view(g, relu_bwd, pool_bwd);
		}
		make_view(g, r, x);
		fused++;
	}
	return fused;
}
