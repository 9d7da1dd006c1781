/*
 * graph/graph.c — the graph object: node storage, the sticky error, names,
 * dumps, cloning and the fingerprint. The builder calls live in builder.c.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/graph_internal.h"
#include "graph/ops/ops.h"

static const char *const status_names[LOOM_STATUS_COUNT] = {
	[LOOM_OK] = "ok",
	[LOOM_ERR_INVALID] = "invalid argument",
	[LOOM_ERR_SHAPE] = "shape mismatch",
	[LOOM_ERR_DTYPE] = "dtype mismatch",
	[LOOM_ERR_NOT_FOUND] = "not found",
	[LOOM_ERR_IO] = "i/o error",
	[LOOM_ERR_FORMAT] = "malformed file",
	[LOOM_ERR_CORRUPT] = "corrupted data",
	[LOOM_ERR_MISMATCH] = "does not match",
	[LOOM_ERR_NOMEM] = "out of memory",
	[LOOM_ERR_UNSUPPORTED] = "unsupported",
	[LOOM_ERR_STATE] = "invalid state",
	[LOOM_ERR_BACKEND] = "backend failure",
};

const char *loom_status_string(loom_status s)
{
	if ((unsigned)s >= LOOM_STATUS_COUNT)
		return "unknown status";
	return status_names[s];
}

int64_t loom_shape_numel(const loom_shape *s)
{
	int64_t n = 1;
	for (int i = 0; i < s->ndim; i++)
		n *= s->dims[i];
	return n;
}

int loom_shape_eq(const loom_shape *a, const loom_shape *b)
{
	if (a->ndim != b->ndim)
		return 0;
	for (int i = 0; i < a->ndim; i++)
		if (a->dims[i] != b->dims[i])
			return 0;
	return 1;
}

loom_shape loom_shape_make(int ndim, const int64_t *dims)
{
	loom_shape s = { .ndim = ndim };
	for (int i = 0; i < ndim && i < LOOM_MAX_DIMS; i++)
		s.dims[i] = dims[i];
	return s;
}

const char *loom_shape_str(const loom_shape *s, char *buf, size_t len)
{
	size_t o = 0;
	o += snprintf(buf + o, len - o, "[");
	for (int i = 0; i < s->ndim && o < len; i++)
		o += snprintf(buf + o, len - o, "%s%lld", i ? ", " : "",
			      (long long)s->dims[i]);
	if (o < len)
		snprintf(buf + o, len - o, "]");
	return buf;
}

loom_status loom_graph_new(loom_graph **out)
{
	if (!out)
		return LOOM_ERR_INVALID;
	*out = calloc(1, sizeof(**out));
	return *out ? LOOM_OK : LOOM_ERR_NOMEM;
}

void loom_graph_free(loom_graph *g)
{
	if (!g)
		return;
	free(g->nodes);
	free(g);
}

loom_status loom_graph_status(const loom_graph *g)
{
	return g ? g->err.st : LOOM_ERR_INVALID;
}

const char *loom_graph_error(const loom_graph *g)
{
	return g ? g->err.msg : "null graph";
}

void loom_graph_set_seed(loom_graph *g, uint64_t seed)
{
	if (g)
		g->seed = seed;
}

loom_value loom_graph_fail(loom_graph *g, loom_status st, const char *fmt, ...)
{
	if (g->err.st != LOOM_OK)
		return LOOM_NONE;
	va_list ap;
	va_start(ap, fmt);
	loom_error_vset(&g->err, st, fmt, ap);
	va_end(ap);
	return LOOM_NONE;
}

loom_value loom_node_add(loom_graph *g, loom_op op, loom_dtype dt, loom_shape shape,
			 int nsrc, const loom_value *src)
{
	/* src may point into the node array (a node's own src[]); copy it
	 * before growing the array can free that storage. The shape comes by
	 * value for the same reason. */
	loom_value s[LOOM_MAX_SRC];
	if (nsrc < 0 || nsrc > LOOM_MAX_SRC)
		return loom_graph_fail(g, LOOM_ERR_INVALID, "a node with %d sources (0..%d allowed)",
				       nsrc, LOOM_MAX_SRC);
	for (int i = 0; i < LOOM_MAX_SRC; i++)
		s[i] = i < nsrc ? src[i] : LOOM_NONE;
	if (g->n == g->cap) {
		int cap = g->cap ? 2 * g->cap : 64;
		loom_node *nodes = realloc(g->nodes, cap * sizeof(*nodes));
		if (!nodes)
			return loom_graph_fail(g, LOOM_ERR_NOMEM,
					       "out of memory growing the graph to %d nodes", cap);
		g->nodes = nodes;
		g->cap = cap;
	}
	loom_node *n = &g->nodes[g->n];
	memset(n, 0, sizeof(*n));
	n->op = op;
	n->dtype = dt;
	n->shape = shape;
	n->nsrc = nsrc;
	memcpy(n->src, s, sizeof(s));
	n->grad = LOOM_NONE;
	n->master = LOOM_NONE;
	n->made_by = LOOM_NONE;
	n->bwd_of = LOOM_NONE;
	return g->n++;
}

const char *loom_node_label(const loom_graph *g, loom_value v, char *buf,
			    size_t len)
{
	const loom_node *n = &g->nodes[v];
	if (n->name[0])
		snprintf(buf, len, "%s '%s'", loom_op_defs[n->op]->name, n->name);
	else
		snprintf(buf, len, "%s #%d", loom_op_defs[n->op]->name, (int)v);
	return buf;
}

loom_value loom_set_name(loom_graph *g, loom_value v, const char *name)
{
	if (!g || v < 0 || v >= g->n || !name)
		return v;
	snprintf(g->nodes[v].name, LOOM_NAME_MAX, "%s", name);
	return v;
}

loom_dtype loom_value_dtype(const loom_graph *g, loom_value v)
{
	if (!g || v < 0 || v >= g->n)
		return LOOM_DTYPE_COUNT;
	return g->nodes[v].dtype;
}

loom_shape loom_value_shape(const loom_graph *g, loom_value v)
{
	loom_shape s = { 0 };
	if (!g || v < 0 || v >= g->n)
		return s;
	return g->nodes[v].shape;
}

/* Sets flag on value v of g; what names the call in the error. */
static loom_status mark_value(loom_graph *g, loom_value v, uint32_t flag, const char *what)
{
	if (!g)
		return LOOM_ERR_INVALID;
	if (v < 0 || v >= g->n) {
		loom_graph_fail(g, LOOM_ERR_INVALID, "%s: no value %d", what, (int)v);
		return LOOM_ERR_INVALID;
	}
	g->nodes[v].flags |= flag;
	return LOOM_OK;
}

loom_status loom_mark_output(loom_graph *g, loom_value v)
{
	return mark_value(g, v, LOOM_NODE_OUTPUT, "mark_output");
}

loom_status loom_stage_boundary(loom_graph *g, loom_value v)
{
	return mark_value(g, v, LOOM_NODE_STAGE_CUT, "stage_boundary");
}

void loom_graph_dump(const loom_graph *g, FILE *out)
{
	char sh[96], lb[96];
	for (int v = 0; g && v < g->n; v++) {
		const loom_node *n = &g->nodes[v];
		fprintf(out, "%4d %-28s %-4s %-18s", v, loom_node_label(g, v, lb, sizeof(lb)),
			loom_dtype_name(n->dtype), loom_shape_str(&n->shape, sh, sizeof(sh)));
		for (int i = 0; i < n->nsrc; i++)
			fprintf(out, " %%%d", (int)n->src[i]);
		if (n->flags & LOOM_NODE_BACKWARD)
			fprintf(out, " (bwd)");
		if (n->flags & LOOM_NODE_AMP)
			fprintf(out, " (amp)");
		fprintf(out, "\n");
	}
}

loom_status loom_graph_clone(const loom_graph *g, loom_graph **out)
{
	loom_graph *c = calloc(1, sizeof(*c));
	if (!c)
		return LOOM_ERR_NOMEM;
	*c = *g;
	c->nodes = malloc((size_t)(g->cap ? g->cap : 1) * sizeof(loom_node));
	if (!c->nodes) {
		free(c);
		return LOOM_ERR_NOMEM;
	}
	memcpy(c->nodes, g->nodes, (size_t)g->n * sizeof(loom_node));
	*out = c;
	return LOOM_OK;
}

/* FNV-1a over the bytes that define the computation. */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 1099511628211ull;
	}
	return h;
}

uint64_t loom_graph_fingerprint(const loom_graph *g)
{
	uint64_t h = 1469598103934665603ull;
	for (int v = 0; v < g->n; v++) {
		const loom_node *n = &g->nodes[v];
		int32_t hdr[3] = { n->op, n->dtype, n->nsrc };
		h = fnv(h, hdr, sizeof(hdr));
		h = fnv(h, &n->shape.ndim, sizeof(n->shape.ndim));
		h = fnv(h, n->shape.dims, sizeof(int64_t) * n->shape.ndim);
		h = fnv(h, n->src, sizeof(loom_value) * n->nsrc);
		h = fnv(h, &n->a, sizeof(n->a));
		h = fnv(h, n->name, strlen(n->name));
	}
	return h;
}
