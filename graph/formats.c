/*
 * graph/formats.c — the format pass: each 4-D activation gets its memory
 * format once, at compile time, from what the backend's kernels take
 * (a query per node), and a reorder node goes in only where a producer
 * and a consumer disagree. User-visible values (inputs, parameters and
 * their gradients, outputs: what loom_read, checkpoints and safetensors
 * see) stay NCHW, so reorders sit at those edges.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/ops/ops.h"

/* Whether v may be held in a format other than NCHW: a computed 4-D
 * float activation (not f64) whose channels fill whole blocks of 8, that
 * no user reads or writes. */
static int movable(const loom_graph *g, loom_value v)
{
	const loom_node *n = &g->nodes[v];
	if (n->shape.ndim != 4 || n->shape.dims[1] % 8 || !loom_is_float(n->dtype) ||
	    n->dtype == LOOM_F64 || loom_op_is_leaf(n->op))
		return 0;
	return !(n->flags & (LOOM_NODE_OUTPUT | LOOM_NODE_GRAD | LOOM_NODE_SHARDED));
}

/* A source the format applies to: a 4-D float value. */
static int is_act(const loom_graph *g, loom_value s)
{
	const loom_node *n = &g->nodes[s];
	return n->shape.ndim == 4 && loom_is_float(n->dtype);
}

/* Could a reorder of source s hold format f? (s itself may be a leaf.) */
static int reorderable(const loom_graph *g, loom_value s, loom_format f)
{
	const loom_node *n = &g->nodes[s];
	if (f == LOOM_FORMAT_NCHW)
		return 1;
	return n->shape.ndim == 4 && n->shape.dims[1] % 8 == 0 && n->dtype != LOOM_F64;
}

/* The format of a mixed node's result (a convolution: its kernel takes
 * each operand in its own format). A data gradient follows the format of
 * the forward input it is the gradient of, so that the backward chain
 * mirrors the forward one. */
static loom_format mixed_result(const loom_graph *g, const loom_format *fmt, loom_value v,
				const loom_format_caps *c)
{
	const loom_node *n = &g->nodes[v];
	/* a filter gradient is laid out as its weight [O, I, kh, kw] */
	if (!movable(g, v) || n->op == LOOM_OP_CONV2D_BWD_FILTER)
		return LOOM_FORMAT_NCHW;
	if (n->op == LOOM_OP_CONV2D_BWD_DATA && n->bwd_of != LOOM_NONE &&
	    g->nodes[n->bwd_of].op == LOOM_OP_CONV2D) {
		loom_format f = fmt[g->nodes[n->bwd_of].src[0]];
		if (c->accept & (1u << f))
			return f;
	}
	return c->accept & (1u << c->prefer) ? c->prefer : LOOM_FORMAT_NCHW;
}

/* The one format of a node whose 4-D operands share it: the format most
 * of its 4-D sources already have, if the node takes it, every source can
 * be reordered to it and the result may hold it. A forward value's vote
 * counts twice: a backward node (relu's, batch norm's, pooling's) then
 * follows the format its forward ran in, and the gradient coming in is
 * reordered once rather than the forward values it reads; a tie goes to
 * the non-NCHW format. */
static loom_format same_format(const loom_graph *g, const loom_format *fmt, loom_value v,
			       const loom_format_caps *c, int n_fwd)
{
	const loom_node *n = &g->nodes[v];
	int count[LOOM_FORMAT_COUNT] = { 0 };
	if (n->shape.ndim == 4 && !movable(g, v))
		return LOOM_FORMAT_NCHW;
	for (int i = 0; i < n->nsrc; i++)
		if (is_act(g, n->src[i]))
			count[fmt[n->src[i]]] += n->src[i] < n_fwd ? 2 : 1;
	loom_format best = LOOM_FORMAT_NCHW;
	for (int f = 1; f < LOOM_FORMAT_COUNT; f++)
		if (count[f] > 0 && count[f] >= count[best] && (c->accept & (1u << f)))
			best = (loom_format)f;
	for (int i = 0; best != LOOM_FORMAT_NCHW && i < n->nsrc; i++)
		if (is_act(g, n->src[i]) && !reorderable(g, n->src[i], best))
			return LOOM_FORMAT_NCHW;
	return best;
}

/* One reorder to insert: source value src in format f, before node `at`
 * (old numbering). */
typedef struct reorder_req {
	loom_value src;
	loom_format f;
	int at;
	loom_value id; /* its new value */
} reorder_req;

typedef struct pass_state {
	reorder_req *r;
	int n, cap;
} pass_state;

/* The request for (s, f), made or found; its index, -1 on no memory. */
static int request(pass_state *ps, loom_value s, loom_format f, int at)
{
	for (int i = 0; i < ps->n; i++)
		if (ps->r[i].src == s && ps->r[i].f == f) {
			if (at < ps->r[i].at)
				ps->r[i].at = at;
			return i;
		}
	if (ps->n == ps->cap) {
		int cap = ps->cap ? 2 * ps->cap : 16;
		reorder_req *r = realloc(ps->r, sizeof(*r) * cap);
		if (!r)
			return -1;
		ps->r = r;
		ps->cap = cap;
	}
	ps->r[ps->n] = (reorder_req){ s, f, at, LOOM_NONE };
	return ps->n++;
}

static loom_value remap(const loom_value *map, loom_value v)
{
	return v == LOOM_NONE ? LOOM_NONE : map[v];
}

/*
 * Rebuilds g's node array with the reorders placed before their first
 * reader (a reader a sibling makes runs at its maker's place), renumbering
 * every reference. *src_req[v * LOOM_MAX_SRC + i]: the request source i of
 * v reads instead, or -1.
 */
static loom_status insert_reorders(loom_graph *g, pass_state *ps, const int *src_req, int *n_fwd,
				   loom_value *loss)
{
	int n_old = g->n, n_new = g->n + ps->n;
	loom_node *nodes = calloc(n_new > 0 ? n_new : 1, sizeof(*nodes));
	loom_value *map = malloc(sizeof(*map) * (n_old > 0 ? n_old : 1));
	if (!nodes || !map) {
		free(nodes);
		free(map);
		return LOOM_ERR_NOMEM;
	}
	int k = 0, fwd = 0;
	for (int v = 0; v < n_old; v++) {
		for (int i = 0; i < ps->n; i++) {
			reorder_req *r = &ps->r[i];
			if (r->at != v)
				continue;
			loom_node *nd = &nodes[k];
			const loom_node *s = &g->nodes[r->src];
			nd->op = LOOM_OP_REORDER;
			nd->dtype = s->dtype;
			nd->shape = s->shape;
			nd->nsrc = 1;
			nd->src[0] = r->src; /* old numbering: remapped below */
			for (int j = 1; j < LOOM_MAX_SRC; j++)
				nd->src[j] = LOOM_NONE;
			nd->grad = nd->master = nd->made_by = LOOM_NONE;
			nd->bwd_of = g->nodes[v].bwd_of;
			nd->flags = LOOM_NODE_REORDER | (v >= *n_fwd ? LOOM_NODE_BACKWARD : 0);
			nd->format = r->f;
			snprintf(nd->name, sizeof(nd->name), "%.40s.%s", s->name, loom_format_name(r->f));
			r->id = k++;
			if (v < *n_fwd)
				fwd++;
		}
		nodes[k] = g->nodes[v];
		map[v] = k++;
		if (v < *n_fwd)
			fwd++;
	}
	for (int v = 0; v < n_new; v++) {
		loom_node *nd = &nodes[v];
		for (int i = 0; i < nd->nsrc; i++)
			nd->src[i] = remap(map, nd->src[i]);
		if (nd->op == LOOM_OP_REORDER)
			continue;
		nd->grad = remap(map, nd->grad);
		nd->master = remap(map, nd->master);
		nd->made_by = remap(map, nd->made_by);
		nd->bwd_of = remap(map, nd->bwd_of);
	}
	for (int i = 0; i < ps->n; i++)
		nodes[ps->r[i].id].bwd_of = remap(map, nodes[ps->r[i].id].bwd_of);
	for (int v = 0; v < n_old; v++)
		for (int i = 0; i < g->nodes[v].nsrc; i++) {
			int q = src_req[v * LOOM_MAX_SRC + i];
			if (q >= 0)
				nodes[map[v]].src[i] = ps->r[q].id;
		}
	*loss = remap(map, *loss);
	*n_fwd = fwd;
	free(g->nodes);
	free(map);
	g->nodes = nodes;
	g->n = g->cap = n_new;
	return LOOM_OK;
}

/* Where node v's work happens: its maker's place if a sibling makes it. */
static int place_of(const loom_graph *g, loom_value v)
{
	loom_value m = g->nodes[v].made_by;
	return m != LOOM_NONE && m < v ? m : v;
}

loom_status loom_formats_pass(loom_graph *g, int *n_fwd, loom_value *loss,
			      loom_format_query_fn query, void *ctx, int *n_reorders)
{
	if (n_reorders)
		*n_reorders = 0;
	if (!query || g->n == 0)
		return LOOM_OK;
	loom_format *fmt = calloc(g->n, sizeof(*fmt));
	int *src_req = malloc(sizeof(int) * LOOM_MAX_SRC * g->n);
	pass_state ps = { 0 };
	loom_status st = LOOM_OK;
	if (!fmt || !src_req) {
		st = LOOM_ERR_NOMEM;
		goto out;
	}
	for (int i = 0; i < LOOM_MAX_SRC * g->n; i++)
		src_req[i] = -1;
	for (loom_value v = 0; v < g->n; v++) {
		const loom_node *n = &g->nodes[v];
		loom_format_caps c = { .accept = 1u << LOOM_FORMAT_NCHW,
				       .prefer = LOOM_FORMAT_NCHW };
		if (loom_op_is_leaf(n->op))
			continue;
		query(ctx, g, v, &c);
		c.accept |= 1u << LOOM_FORMAT_NCHW;
		/* A view that changes the shape sees its source's storage as
		 * NCHW [N, C*H*W] or the like: its source must be NCHW. */
		if (loom_op_is_view(n->op) && n->nsrc > 0 &&
		    !loom_shape_eq(&n->shape, &g->nodes[n->src[0]].shape))
			c = (loom_format_caps){ .accept = 1u << LOOM_FORMAT_NCHW };
		loom_format f;
		if (c.mixed) {
			/* Each operand in its own format: the kernel converts what
			 * its library wants (a oneDNN convolution). */
			fmt[v] = mixed_result(g, fmt, v, &c);
			continue;
		}
		f = same_format(g, fmt, v, &c, *n_fwd);
		/* A view keeps its source's storage, so its format too. */
		if (loom_op_is_view(n->op) && n->nsrc > 0 && is_act(g, n->src[0]) &&
		    loom_shape_eq(&n->shape, &g->nodes[n->src[0]].shape) && n->shape.ndim == 4 &&
		    movable(g, v) && (c.accept & (1u << fmt[n->src[0]]))) {
			fmt[v] = fmt[n->src[0]];
			continue;
		}
		fmt[v] = n->shape.ndim == 4 ? f : LOOM_FORMAT_NCHW;
		for (int i = 0; i < n->nsrc; i++) {
			loom_value s = n->src[i];
			if (!is_act(g, s) || fmt[s] == f)
				continue;
			int q = request(&ps, s, f, place_of(g, v));
			if (q < 0) {
				st = LOOM_ERR_NOMEM;
				goto out;
			}
			src_req[v * LOOM_MAX_SRC + i] = q;
		}
	}
	for (loom_value v = 0; v < g->n; v++)
		g->nodes[v].format = fmt[v];
	if (ps.n > 0)
		st = insert_reorders(g, &ps, src_req, n_fwd, loss);
	if (st == LOOM_OK && n_reorders)
		*n_reorders = ps.n;
out:
	if (st == LOOM_ERR_NOMEM)
		loom_graph_fail(g, st, "format pass: out of memory");
	free(fmt);
	free(src_req);
	free(ps.r);
	return st;
}
