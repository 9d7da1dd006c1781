/*
 * graph/builder.c — how every public graph-building call records a node:
 * loom_op_build checks the sources, runs the op's shape rule (graph/ops/)
 * and appends the node. On bad input it sets the graph's sticky error,
 * naming the op and the shapes, and returns LOOM_NONE; every later call on
 * that graph then returns LOOM_NONE too. The layer helpers (a layer's
 * parameters plus its op) are in graph/layers.c.
 */
#include <stdio.h>
#include <string.h>

#include "graph/graph_internal.h"
#include "graph/ops/ops.h"

/* A usable value of graph g: in range, and the graph not already failed. */
int loom_check_value(loom_graph *g, loom_value v, const char *op, const char *what)
{
	if (g->err.st != LOOM_OK)
		return 0;
	if (v < 0 || v >= g->n) {
		loom_graph_fail(g, LOOM_ERR_INVALID, "%s: %s is not a value of this graph (%d)",
				op, what, (int)v);
		return 0;
	}
	return 1;
}

int loom_is_float(loom_dtype dt)
{
	return dt == LOOM_F32 || dt == LOOM_F64 || dt == LOOM_F16 || dt == LOOM_BF16;
}

static const loom_node *N(const loom_graph *g, loom_value v)
{
	return &g->nodes[v];
}

#define SH(v, buf) loom_shape_str(&N(g, v)->shape, buf, sizeof(buf))
#define OP(n) (loom_op_defs[(n)->op]->name)
#define SRC(n, i) (loom_op_defs[(n)->op]->src_names[i])

int loom_check_float(loom_graph *g, const loom_node *n, int i)
{
	loom_value v = n->src[i];
	if (!loom_is_float(N(g, v)->dtype)) {
		loom_graph_fail(g, LOOM_ERR_DTYPE, "%s: %s has dtype %s, expected a float type",
				OP(n), SRC(n, i), loom_dtype_name(N(g, v)->dtype));
		return 0;
	}
	return 1;
}

int loom_check_same_dtype(loom_graph *g, const loom_node *n, int i, int j)
{
	loom_value a = n->src[i], b = n->src[j];
	if (N(g, a)->dtype != N(g, b)->dtype) {
		loom_graph_fail(g, LOOM_ERR_DTYPE, "%s: %s is %s but %s is %s", OP(n), SRC(n, i),
				loom_dtype_name(N(g, a)->dtype), SRC(n, j),
				loom_dtype_name(N(g, b)->dtype));
		return 0;
	}
	return 1;
}

int loom_check_ndim(loom_graph *g, const loom_node *n, int i, int ndim)
{
	char b[96];
	loom_value v = n->src[i];
	if (N(g, v)->shape.ndim != ndim) {
		loom_graph_fail(g, LOOM_ERR_SHAPE, "%s: %s must have %d dims, got %s", OP(n),
				SRC(n, i), ndim, SH(v, b));
		return 0;
	}
	return 1;
}

/*
 * The operands every weighted op (conv2d, linear) shares: src 0 (x) and
 * src 1 (w) of one float dtype with ndim dims, x's dim 1 matching w's dim 1
 * (what names it: "channels" or "features"), and an optional src 2 (a bias
 * [w.dims[0]] of that dtype).
 */
int loom_check_weight_bias(loom_graph *g, const loom_node *n, int ndim, const char *what)
{
	char bx[96], bw[96], bb[96];
	const char *op = OP(n);
	loom_value x = n->src[0], w = n->src[1];
	if (!loom_check_float(g, n, 0) || !loom_check_same_dtype(g, n, 0, 1) ||
	    !loom_check_ndim(g, n, 0, ndim) || !loom_check_ndim(g, n, 1, ndim))
		return 0;
	const int64_t *xd = N(g, x)->shape.dims, *wd = N(g, w)->shape.dims;
	if (xd[1] != wd[1]) {
		loom_graph_fail(g, LOOM_ERR_SHAPE, "%s: input %s has %lld %s, weight %s expects %lld",
				op, SH(x, bx), (long long)xd[1], what, SH(w, bw), (long long)wd[1]);
		return 0;
	}
	if (n->nsrc < 3)
		return 1;
	loom_value b = n->src[2];
	if (!loom_check_same_dtype(g, n, 0, 2))
		return 0;
	if (N(g, b)->shape.ndim != 1 || N(g, b)->shape.dims[0] != wd[0]) {
		loom_graph_fail(g, LOOM_ERR_SHAPE, "%s: bias %s must be [%lld] for weight %s", op,
				SH(b, bb), (long long)wd[0], SH(w, bw));
		return 0;
	}
	return 1;
}

void loom_op_init(loom_node *n, loom_op op, int nsrc, const loom_value *src)
{
	/* All of it zeroed, the attribute union's unused bytes too: the graph
	 * fingerprint hashes them. */
	memset(n, 0, sizeof(*n));
	n->op = op;
	n->nsrc = nsrc;
	for (int i = 0; i < LOOM_MAX_SRC; i++)
		n->src[i] = i < nsrc ? src[i] : LOOM_NONE;
	n->grad = n->master = n->made_by = LOOM_NONE;
}

loom_value loom_op_build(loom_graph *g, loom_node *n)
{
	const loom_op_def *def = loom_op_defs[n->op];
	if (!g || g->err.st != LOOM_OK)
		return LOOM_NONE;
	for (int i = 0; i < n->nsrc; i++)
		if (!loom_check_value(g, n->src[i], def->name, def->src_names[i]))
			return LOOM_NONE;
	if (!def->shape(g, n))
		return LOOM_NONE;
	loom_value v = loom_node_add(g, n->op, n->dtype, n->shape, n->nsrc, n->src);
	if (v == LOOM_NONE)
		return v;
	g->nodes[v].a = n->a;
	memcpy(g->nodes[v].name, n->name, LOOM_NAME_MAX);
	return v;
}

loom_value loom_op_build_plain(loom_graph *g, loom_op op, int nsrc, const loom_value *src)
{
	loom_node n;
	loom_op_init(&n, op, nsrc, src);
	return loom_op_build(g, &n);
}
