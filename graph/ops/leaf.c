/*
 * graph/ops/leaf.c — the leaves: inputs (fed by the user each step),
 * parameters (trained) and buffers (state kept across steps, e.g. batch-norm
 * statistics). A leaf's dtype and shape are what its builder call asks for;
 * its shape rule only checks them and that its name is free.
 */
#include <stdio.h>
#include <string.h>

#include "graph/ops/ops.h"

static int leaf_rule(loom_graph *g, loom_node *n, int float_only)
{
	const char *kind = loom_op_defs[n->op]->name, *name = n->name;
	int ndim = n->shape.ndim;
	if ((unsigned)n->dtype >= LOOM_DTYPE_COUNT)
		return loom_graph_fail(g, LOOM_ERR_DTYPE, "%s '%s': unknown dtype %d", kind,
				       name, (int)n->dtype), 0;
	/* storage types today (base/fp8.h): no op, kernel or collective reads
	 * them, so none may enter a graph */
	if (n->dtype == LOOM_FP8_E4M3 || n->dtype == LOOM_FP8_E5M2)
		return loom_graph_fail(g, LOOM_ERR_DTYPE,
				       "%s '%s': dtype %s is not supported by graph ops yet", kind,
				       name, loom_dtype_name(n->dtype)), 0;
	if (float_only && !loom_is_float(n->dtype))
		return loom_graph_fail(g, LOOM_ERR_DTYPE, "%s '%s': dtype %s, expected a float type",
				       kind, name, loom_dtype_name(n->dtype)), 0;
	if (ndim < 0 || ndim > LOOM_MAX_DIMS)
		return loom_graph_fail(g, LOOM_ERR_SHAPE, "%s '%s': %d dims (0..%d allowed)",
				       kind, name, ndim, LOOM_MAX_DIMS), 0;
	for (int i = 0; i < ndim; i++)
		if (n->shape.dims[i] <= 0)
			return loom_graph_fail(g, LOOM_ERR_SHAPE,
					       "%s '%s': dim %d is %lld, must be positive",
					       kind, name, i, (long long)n->shape.dims[i]), 0;
	if ((unsigned)n->a.leaf.init >= LOOM_INIT_COUNT)
		return loom_graph_fail(g, LOOM_ERR_INVALID, "%s '%s': unknown initialiser %d",
				       kind, name, (int)n->a.leaf.init), 0;
	/* Leaves are found by name (loom_set_input, checkpoints). */
	for (int v = 0; v < g->n; v++)
		if (loom_op_is_leaf(g->nodes[v].op) && strcmp(g->nodes[v].name, name) == 0)
			return loom_graph_fail(g, LOOM_ERR_INVALID, "%s '%s': the name is already taken",
					       kind, name), 0;
	return 1;
}

/* An input takes whatever dtype its data has (i32 labels included). */
static int shape_input(loom_graph *g, loom_node *n)
{
	return leaf_rule(g, n, 0);
}

static int shape_param(loom_graph *g, loom_node *n)
{
	return leaf_rule(g, n, 1);
}

static loom_value leaf(loom_graph *g, loom_op op, const char *name, loom_dtype dt,
		       int ndim, const int64_t *dims, loom_init init, int64_t fan_in)
{
	const char *kind = loom_op_defs[op]->name;
	if (!g || g->err.st != LOOM_OK)
		return LOOM_NONE;
	if (!name || !name[0])
		return loom_graph_fail(g, LOOM_ERR_INVALID, "%s: a name is required", kind);
	if (strlen(name) >= LOOM_NAME_MAX)
		return loom_graph_fail(g, LOOM_ERR_INVALID, "%s '%s': name longer than %d bytes",
				       kind, name, LOOM_NAME_MAX - 1);
	/* The rule sees a loom_shape: a missing dims array is refused here. */
	if (ndim > 0 && !dims)
		return loom_graph_fail(g, LOOM_ERR_SHAPE, "%s '%s': %d dims (0..%d allowed)",
				       kind, name, ndim, LOOM_MAX_DIMS);
	loom_node n;
	loom_op_init(&n, op, 0, NULL);
	n.dtype = dt;
	n.shape = loom_shape_make(ndim, dims);
	n.a.leaf.init = init;
	n.a.leaf.fan_in = fan_in;
	snprintf(n.name, LOOM_NAME_MAX, "%s", name);
	return loom_op_build(g, &n);
}

loom_value loom_input(loom_graph *g, const char *name, loom_dtype dt, int ndim,
		      const int64_t *dims)
{
	return leaf(g, LOOM_OP_INPUT, name, dt, ndim, dims, LOOM_INIT_ZEROS, 0);
}

loom_value loom_param(loom_graph *g, const char *name, loom_dtype dt, int ndim,
		      const int64_t *dims, loom_init init, int64_t fan_in)
{
	if (g && g->err.st == LOOM_OK && fan_in <= 0 &&
	    (init == LOOM_INIT_KAIMING_UNIFORM || init == LOOM_INIT_UNIFORM_FAN_IN))
		return loom_graph_fail(g, LOOM_ERR_INVALID,
				       "param '%s': fan_in %lld must be positive for a uniform initialiser",
				       name ? name : "?", (long long)fan_in);
	return leaf(g, LOOM_OP_PARAM, name, dt, ndim, dims, init, fan_in);
}

loom_value loom_buffer(loom_graph *g, const char *name, loom_dtype dt, int ndim,
		       const int64_t *dims, loom_init init)
{
	return leaf(g, LOOM_OP_BUFFER, name, dt, ndim, dims, init, 0);
}

/* A leaf op's row, as LOOM_FORWARD_OP (ops.h) makes a forward op's: the
 * leaf attributes, AMP follows what the leaf holds. */
#define LEAF_OP(low, shape_fn, ...)                   \
	const loom_op_def loom_op_##low = {           \
		.name = #low,                         \
		.kind = LOOM_OPK_LEAF,                \
		.attrs = LOOM_ATTRS_LEAF,             \
		.shape = shape_fn,                    \
		.amp = { .cls = LOOM_AMP_FOLLOW },    \
		__VA_ARGS__                           \
	}

LEAF_OP(input, shape_input, .flags = LOOM_OPF_FED);
LEAF_OP(param, shape_param, .flags = LOOM_OPF_TRAINABLE);
LEAF_OP(buffer, shape_param);
