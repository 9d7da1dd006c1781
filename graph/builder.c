/*
 * graph/builder.c — the public graph-building calls: each checks its inputs
 * (the op's shape rule), records one node and returns its value. On bad input
 * it sets the graph's sticky error, naming the op and the shapes, and returns
 * LOOM_NONE; every later call on that graph then returns LOOM_NONE too.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "graph/graph_internal.h"
#include "graph/ops/geometry.h"

/* A usable value of graph g: in range, and the graph not already failed. */
static int ok_value(loom_graph *g, loom_value v, const char *op, const char *what)
{
	if (g->err != LOOM_OK)
		return 0;
	if (v < 0 || v >= g->n) {
		loom_graph_fail(g, LOOM_ERR_INVALID, "%s: %s is not a value of this graph (%d)",
				op, what, (int)v);
		return 0;
	}
	return 1;
}

static int is_float(loom_dtype dt)
{
	return dt == LOOM_F32 || dt == LOOM_F64 || dt == LOOM_F16 || dt == LOOM_BF16;
}

static const loom_node *N(const loom_graph *g, loom_value v)
{
	return &g->nodes[v];
}

#define SH(v, buf) loom_shape_str(&N(g, v)->shape, buf, sizeof(buf))

static int want_float(loom_graph *g, loom_value v, const char *op, const char *what)
{
	if (!is_float(N(g, v)->dtype)) {
		loom_graph_fail(g, LOOM_ERR_DTYPE, "%s: %s has dtype %s, expected a float type",
				op, what, loom_dtype_name(N(g, v)->dtype));
		return 0;
	}
	return 1;
}

static int same_dtype(loom_graph *g, loom_value a, loom_value b, const char *op,
		      const char *wa, const char *wb)
{
	if (N(g, a)->dtype != N(g, b)->dtype) {
		loom_graph_fail(g, LOOM_ERR_DTYPE, "%s: %s is %s but %s is %s", op, wa,
				loom_dtype_name(N(g, a)->dtype), wb,
				loom_dtype_name(N(g, b)->dtype));
		return 0;
	}
	return 1;
}

static int want_ndim(loom_graph *g, loom_value v, int ndim, const char *op,
		     const char *what)
{
	char b[96];
	if (N(g, v)->shape.ndim != ndim) {
		loom_graph_fail(g, LOOM_ERR_SHAPE, "%s: %s must have %d dims, got %s", op,
				what, ndim, SH(v, b));
		return 0;
	}
	return 1;
}

/* ------------------------------------------------------------------ leaves */

static loom_value leaf(loom_graph *g, loom_op op, const char *kind, const char *name,
		       loom_dtype dt, int ndim, const int64_t *dims, loom_init init,
		       int64_t fan_in)
{
	if (!g)
		return LOOM_NONE;
	if (g->err != LOOM_OK)
		return LOOM_NONE;
	if (!name || !name[0])
		return loom_graph_fail(g, LOOM_ERR_INVALID, "%s: a name is required", kind);
	if (strlen(name) >= LOOM_NAME_MAX)
		return loom_graph_fail(g, LOOM_ERR_INVALID, "%s '%s': name longer than %d bytes",
				       kind, name, LOOM_NAME_MAX - 1);
	if ((unsigned)dt >= LOOM_DTYPE_COUNT)
		return loom_graph_fail(g, LOOM_ERR_DTYPE, "%s '%s': unknown dtype %d", kind,
				       name, (int)dt);
	if (op != LOOM_OP_INPUT && !is_float(dt))
		return loom_graph_fail(g, LOOM_ERR_DTYPE, "%s '%s': dtype %s, expected a float type",
				       kind, name, loom_dtype_name(dt));
	if (ndim < 0 || ndim > LOOM_MAX_DIMS || (ndim > 0 && !dims))
		return loom_graph_fail(g, LOOM_ERR_SHAPE, "%s '%s': %d dims (0..%d allowed)",
				       kind, name, ndim, LOOM_MAX_DIMS);
	for (int i = 0; i < ndim; i++)
		if (dims[i] <= 0)
			return loom_graph_fail(g, LOOM_ERR_SHAPE,
					       "%s '%s': dim %d is %lld, must be positive",
					       kind, name, i, (long long)dims[i]);
	if ((unsigned)init >= LOOM_INIT_COUNT)
		return loom_graph_fail(g, LOOM_ERR_INVALID, "%s '%s': unknown initialiser %d",
				       kind, name, (int)init);
	for (int v = 0; v < g->n; v++) {
		loom_op o = g->nodes[v].op;
		if ((o == LOOM_OP_INPUT || o == LOOM_OP_PARAM || o == LOOM_OP_BUFFER) &&
		    strcmp(g->nodes[v].name, name) == 0)
			return loom_graph_fail(g, LOOM_ERR_INVALID, "%s '%s': the name is already taken",
					       kind, name);
	}
	loom_shape s = loom_shape_make(ndim, dims);
	loom_value v = loom_node_add(g, op, dt, s, 0, NULL);
	if (v == LOOM_NONE)
		return v;
	loom_node *n = &g->nodes[v];
	n->a.leaf.init = init;
	n->a.leaf.fan_in = fan_in;
	snprintf(n->name, LOOM_NAME_MAX, "%s", name);
	return v;
}

loom_value loom_input(loom_graph *g, const char *name, loom_dtype dt, int ndim,
		      const int64_t *dims)
{
	return leaf(g, LOOM_OP_INPUT, "input", name, dt, ndim, dims, LOOM_INIT_ZEROS, 0);
}

loom_value loom_param(loom_graph *g, const char *name, loom_dtype dt, int ndim,
		      const int64_t *dims, loom_init init, int64_t fan_in)
{
	if (g && g->err == LOOM_OK && fan_in <= 0 &&
	    (init == LOOM_INIT_KAIMING_UNIFORM || init == LOOM_INIT_UNIFORM_FAN_IN))
		return loom_graph_fail(g, LOOM_ERR_INVALID,
				       "param '%s': fan_in %lld must be positive for a uniform initialiser",
				       name ? name : "?", (long long)fan_in);
	return leaf(g, LOOM_OP_PARAM, "param", name, dt, ndim, dims, init, fan_in);
}

loom_value loom_buffer(loom_graph *g, const char *name, loom_dtype dt, int ndim,
		       const int64_t *dims, loom_init init)
{
	return leaf(g, LOOM_OP_BUFFER, "buffer", name, dt, ndim, dims, init, 0);
}

/* --------------------------------------------------------------------- ops */

static loom_value add_node(loom_graph *g, loom_op op, loom_dtype dt, const loom_shape *s,
			   int nsrc, const loom_value *src)
{
	return loom_node_add(g, op, dt, *s, nsrc, src);
}

/*
 * The operands every weighted op (conv2d, linear) shares: x and w of one
 * float dtype with ndim dims, x's dim 1 matching w's dim 1 (what names it:
 * "channels" or "features"), and an optional bias [w.dims[0]] of that dtype.
 */
static int check_weight_bias(loom_graph *g, const char *op, loom_value x, loom_value w,
			     loom_value b, int ndim, const char *what)
{
	char bx[96], bw[96], bb[96];
	if (!ok_value(g, x, op, "input") || !ok_value(g, w, op, "weight"))
		return 0;
	if (b != LOOM_NONE && !ok_value(g, b, op, "bias"))
		return 0;
	if (!want_float(g, x, op, "input") || !same_dtype(g, x, w, op, "input", "weight") ||
	    !want_ndim(g, x, ndim, op, "input") || !want_ndim(g, w, ndim, op, "weight"))
		return 0;
	const int64_t *xd = N(g, x)->shape.dims, *wd = N(g, w)->shape.dims;
	if (xd[1] != wd[1]) {
		loom_graph_fail(g, LOOM_ERR_SHAPE, "%s: input %s has %lld %s, weight %s expects %lld",
				op, SH(x, bx), (long long)xd[1], what, SH(w, bw), (long long)wd[1]);
		return 0;
	}
	if (b == LOOM_NONE)
		return 1;
	if (!same_dtype(g, x, b, op, "input", "bias"))
		return 0;
	if (N(g, b)->shape.ndim != 1 || N(g, b)->shape.dims[0] != wd[0]) {
		loom_graph_fail(g, LOOM_ERR_SHAPE, "%s: bias %s must be [%lld] for weight %s", op,
				SH(b, bb), (long long)wd[0], SH(w, bw));
		return 0;
	}
	return 1;
}

loom_value loom_conv2d(loom_graph *g, loom_value x, loom_value w, loom_value b,
		       int stride, int pad)
{
	const char *op = "conv2d";
	char bx[96], bw[96];
	if (!g || !check_weight_bias(g, op, x, w, b, 4, "channels"))
		return LOOM_NONE;
	const int64_t *xd = N(g, x)->shape.dims, *wd = N(g, w)->shape.dims;
	if (stride < 1 || pad < 0)
		return loom_graph_fail(g, LOOM_ERR_INVALID, "conv2d: stride %d / pad %d invalid",
				       stride, pad);
	int64_t ho = loom_window_out(xd[2], wd[2], stride, pad);
	int64_t wo = loom_window_out(xd[3], wd[3], stride, pad);
	if (ho <= 0 || wo <= 0)
		return loom_graph_fail(g, LOOM_ERR_SHAPE,
				       "conv2d: kernel %s larger than padded input %s (pad %d)",
				       SH(w, bw), SH(x, bx), pad);
	loom_shape s = { 4, { xd[0], wd[0], ho, wo } };
	loom_value src[3] = { x, w, b };
	loom_value v = add_node(g, LOOM_OP_CONV2D, N(g, x)->dtype, &s, b == LOOM_NONE ? 2 : 3, src);
	if (v != LOOM_NONE) {
		g->nodes[v].a.conv.stride = stride;
		g->nodes[v].a.conv.pad = pad;
	}
	return v;
}

loom_value loom_batchnorm2d(loom_graph *g, loom_value x, loom_value gamma,
			    loom_value beta, loom_value running_mean,
			    loom_value running_var, double momentum, double eps)
{
	const char *op = "batchnorm2d";
	char bx[96], bp[96];
	if (!g || !ok_value(g, x, op, "input") || !ok_value(g, gamma, op, "weight") ||
	    !ok_value(g, beta, op, "bias") || !ok_value(g, running_mean, op, "running_mean") ||
	    !ok_value(g, running_var, op, "running_var"))
		return LOOM_NONE;
	if (!want_float(g, x, op, "input") || !want_ndim(g, x, 4, op, "input"))
		return LOOM_NONE;
	int64_t c = N(g, x)->shape.dims[1];
	loom_value ps[4] = { gamma, beta, running_mean, running_var };
	const char *pn[4] = { "weight", "bias", "running_mean", "running_var" };
	for (int i = 0; i < 4; i++) {
		if (!same_dtype(g, x, ps[i], op, "input", pn[i]))
			return LOOM_NONE;
		if (N(g, ps[i])->shape.ndim != 1 || N(g, ps[i])->shape.dims[0] != c)
			return loom_graph_fail(g, LOOM_ERR_SHAPE,
					       "batchnorm2d: %s %s must be [%lld] for input %s",
					       pn[i], SH(ps[i], bp), (long long)c, SH(x, bx));
	}
	if (!(momentum >= 0 && momentum <= 1) || !(eps > 0))
		return loom_graph_fail(g, LOOM_ERR_INVALID,
				       "batchnorm2d: momentum %g must be in [0, 1] and eps %g positive",
				       momentum, eps);
	loom_value src[5] = { x, gamma, beta, running_mean, running_var };
	loom_value v = add_node(g, LOOM_OP_BATCHNORM2D, N(g, x)->dtype, &N(g, x)->shape, 5, src);
	if (v != LOOM_NONE) {
		g->nodes[v].a.bn.momentum = momentum;
		g->nodes[v].a.bn.eps = eps;
	}
	return v;
}

loom_value loom_relu(loom_graph *g, loom_value x)
{
	if (!g || !ok_value(g, x, "relu", "input") || !want_float(g, x, "relu", "input"))
		return LOOM_NONE;
	return add_node(g, LOOM_OP_RELU, N(g, x)->dtype, &N(g, x)->shape, 1, &x);
}

loom_value loom_maxpool2d(loom_graph *g, loom_value x, int kernel, int stride, int pad)
{
	const char *op = "maxpool2d";
	char bx[96];
	if (!g || !ok_value(g, x, op, "input") || !want_float(g, x, op, "input") ||
	    !want_ndim(g, x, 4, op, "input"))
		return LOOM_NONE;
	if (kernel < 1 || stride < 1 || pad < 0 || 2 * pad > kernel)
		return loom_graph_fail(g, LOOM_ERR_INVALID,
				       "maxpool2d: kernel %d, stride %d, pad %d invalid (pad at most half the kernel)",
				       kernel, stride, pad);
	const int64_t *d = N(g, x)->shape.dims;
	int64_t ho = loom_window_out(d[2], kernel, stride, pad);
	int64_t wo = loom_window_out(d[3], kernel, stride, pad);
	if (ho <= 0 || wo <= 0)
		return loom_graph_fail(g, LOOM_ERR_SHAPE, "maxpool2d: kernel %d larger than input %s",
				       kernel, SH(x, bx));
	loom_shape s = { 4, { d[0], d[1], ho, wo } };
	loom_value v = add_node(g, LOOM_OP_MAXPOOL2D, N(g, x)->dtype, &s, 1, &x);
	if (v != LOOM_NONE) {
		g->nodes[v].a.pool.kernel = kernel;
		g->nodes[v].a.pool.stride = stride;
		g->nodes[v].a.pool.pad = pad;
	}
	return v;
}

loom_value loom_global_avgpool(loom_graph *g, loom_value x)
{
	const char *op = "global_avgpool";
	if (!g || !ok_value(g, x, op, "input") || !want_float(g, x, op, "input") ||
	    !want_ndim(g, x, 4, op, "input"))
		return LOOM_NONE;
	loom_shape s = { 2, { N(g, x)->shape.dims[0], N(g, x)->shape.dims[1] } };
	return add_node(g, LOOM_OP_GLOBAL_AVGPOOL, N(g, x)->dtype, &s, 1, &x);
}

loom_value loom_linear(loom_graph *g, loom_value x, loom_value w, loom_value b)
{
	const char *op = "linear";
	if (!g || !check_weight_bias(g, op, x, w, b, 2, "features"))
		return LOOM_NONE;
	const int64_t *xd = N(g, x)->shape.dims, *wd = N(g, w)->shape.dims;
	loom_shape s = { 2, { xd[0], wd[0] } };
	loom_value src[3] = { x, w, b };
	return add_node(g, LOOM_OP_LINEAR, N(g, x)->dtype, &s, b == LOOM_NONE ? 2 : 3, src);
}

loom_value loom_matmul(loom_graph *g, loom_value a, loom_value b)
{
	const char *op = "matmul";
	char ba[96], bb[96];
	if (!g || !ok_value(g, a, op, "a") || !ok_value(g, b, op, "b"))
		return LOOM_NONE;
	if (!want_float(g, a, op, "a") || !same_dtype(g, a, b, op, "a", "b") ||
	    !want_ndim(g, a, 2, op, "a") || !want_ndim(g, b, 2, op, "b"))
		return LOOM_NONE;
	const int64_t *ad = N(g, a)->shape.dims, *bd = N(g, b)->shape.dims;
	if (ad[1] != bd[0])
		return loom_graph_fail(g, LOOM_ERR_SHAPE, "matmul: a %s and b %s: inner dims differ",
				       SH(a, ba), SH(b, bb));
	loom_shape s = { 2, { ad[0], bd[1] } };
	loom_value src[2] = { a, b };
	return add_node(g, LOOM_OP_MATMUL, N(g, a)->dtype, &s, 2, src);
}

loom_value loom_add(loom_graph *g, loom_value a, loom_value b)
{
	const char *op = "add";
	char ba[96], bb[96];
	if (!g || !ok_value(g, a, op, "a") || !ok_value(g, b, op, "b"))
		return LOOM_NONE;
	if (!want_float(g, a, op, "a") || !same_dtype(g, a, b, op, "a", "b"))
		return LOOM_NONE;
	if (!loom_shape_eq(&N(g, a)->shape, &N(g, b)->shape))
		return loom_graph_fail(g, LOOM_ERR_SHAPE, "add: shapes %s and %s differ",
				       SH(a, ba), SH(b, bb));
	loom_value src[2] = { a, b };
	return add_node(g, LOOM_OP_ADD, N(g, a)->dtype, &N(g, a)->shape, 2, src);
}

loom_value loom_reshape(loom_graph *g, loom_value x, int ndim, const int64_t *dims)
{
	char bx[96];
	if (!g || !ok_value(g, x, "reshape", "input"))
		return LOOM_NONE;
	if (ndim < 0 || ndim > LOOM_MAX_DIMS || (ndim > 0 && !dims))
		return loom_graph_fail(g, LOOM_ERR_SHAPE, "reshape: %d dims (0..%d allowed)", ndim,
				       LOOM_MAX_DIMS);
	loom_shape s = loom_shape_make(ndim, dims);
	int infer = -1;
	int64_t known = 1, total = loom_shape_numel(&N(g, x)->shape);
	for (int i = 0; i < ndim; i++) {
		if (dims[i] == -1 && infer < 0) {
			infer = i;
		} else if (dims[i] <= 0) {
			return loom_graph_fail(g, LOOM_ERR_SHAPE,
					       "reshape: dim %d is %lld (one -1 allowed, others positive)",
					       i, (long long)dims[i]);
		} else {
			known *= dims[i];
		}
	}
	if (infer >= 0) {
		if (total % known)
			return loom_graph_fail(g, LOOM_ERR_SHAPE, "reshape: %s cannot be split by %lld",
					       SH(x, bx), (long long)known);
		s.dims[infer] = total / known;
		known *= s.dims[infer];
	}
	if (known != total)
		return loom_graph_fail(g, LOOM_ERR_SHAPE,
				       "reshape: %s has %lld elements, the new shape %lld",
				       SH(x, bx), (long long)total, (long long)known);
	return add_node(g, LOOM_OP_RESHAPE, N(g, x)->dtype, &s, 1, &x);
}

loom_value loom_flatten(loom_graph *g, loom_value x)
{
	if (!g || !ok_value(g, x, "flatten", "input"))
		return LOOM_NONE;
	if (N(g, x)->shape.ndim < 1)
		return loom_graph_fail(g, LOOM_ERR_SHAPE, "flatten: a scalar has no batch dim");
	int64_t d[2] = { N(g, x)->shape.dims[0], -1 };
	return loom_reshape(g, x, 2, d);
}

loom_value loom_sum(loom_graph *g, loom_value x)
{
	if (!g || !ok_value(g, x, "sum", "input") || !want_float(g, x, "sum", "input"))
		return LOOM_NONE;
	loom_shape s = { 0 };
	return add_node(g, LOOM_OP_SUM, N(g, x)->dtype, &s, 1, &x);
}

loom_value loom_mean(loom_graph *g, loom_value x)
{
	loom_value s = loom_sum(g, x);
	if (s == LOOM_NONE)
		return s;
	loom_shape sc = { 0 };
	loom_value v = add_node(g, LOOM_OP_BROADCAST, N(g, x)->dtype, &sc, 1, &s);
	if (v != LOOM_NONE)
		g->nodes[v].a.bc.scale = 1.0 / (double)loom_shape_numel(&N(g, x)->shape);
	return v;
}

loom_value loom_softmax_cross_entropy(loom_graph *g, loom_value logits, loom_value labels)
{
	const char *op = "softmax_cross_entropy";
	char bl[96], by[96];
	if (!g || !ok_value(g, logits, op, "logits") || !ok_value(g, labels, op, "labels"))
		return LOOM_NONE;
	if (!want_float(g, logits, op, "logits") || !want_ndim(g, logits, 2, op, "logits") ||
	    !want_ndim(g, labels, 1, op, "labels"))
		return LOOM_NONE;
	if (N(g, labels)->dtype != LOOM_I32)
		return loom_graph_fail(g, LOOM_ERR_DTYPE, "%s: labels have dtype %s, expected i32",
				       op, loom_dtype_name(N(g, labels)->dtype));
	if (N(g, labels)->shape.dims[0] != N(g, logits)->shape.dims[0])
		return loom_graph_fail(g, LOOM_ERR_SHAPE, "%s: logits %s and labels %s: batch differs",
				       op, SH(logits, bl), SH(labels, by));
	loom_shape s = { 0 };
	loom_value src[2] = { logits, labels };
	return add_node(g, LOOM_OP_SOFTMAX_CE, N(g, logits)->dtype, &s, 2, src);
}

/* ------------------------------------------------------------------ layers */

static loom_value layer_param(loom_graph *g, const char *layer, const char *what,
			      loom_dtype dt, int ndim, const int64_t *dims, loom_init init,
			      int64_t fan_in, int buffer)
{
	char name[LOOM_NAME_MAX];
	if (!layer || strlen(layer) + strlen(what) + 2 > LOOM_NAME_MAX)
		return loom_graph_fail(g, LOOM_ERR_INVALID, "layer name '%s' missing or too long",
				       layer ? layer : "(null)");
	snprintf(name, sizeof(name), "%s.%s", layer, what);
	if (buffer)
		return loom_buffer(g, name, dt, ndim, dims, init);
	return loom_param(g, name, dt, ndim, dims, init, fan_in);
}

loom_value loom_layer_conv2d(loom_graph *g, const char *name, loom_value x,
			     int out_channels, int kernel, int stride, int pad, int bias)
{
	if (!g || !ok_value(g, x, "conv2d layer", "input") ||
	    !want_ndim(g, x, 4, "conv2d layer", "input"))
		return LOOM_NONE;
	if (out_channels < 1 || kernel < 1)
		return loom_graph_fail(g, LOOM_ERR_INVALID, "conv2d '%s': %d channels, kernel %d",
				       name ? name : "?", out_channels, kernel);
	loom_dtype dt = N(g, x)->dtype;
	int64_t cin = N(g, x)->shape.dims[1];
	int64_t wd[4] = { out_channels, cin, kernel, kernel };
	int64_t fan_in = cin * kernel * kernel;
	loom_value w = layer_param(g, name, "weight", dt, 4, wd, LOOM_INIT_KAIMING_UNIFORM,
				   fan_in, 0);
	loom_value b = LOOM_NONE;
	if (bias) {
		int64_t bd[1] = { out_channels };
		b = layer_param(g, name, "bias", dt, 1, bd, LOOM_INIT_UNIFORM_FAN_IN, fan_in, 0);
	}
	return loom_set_name(g, loom_conv2d(g, x, w, b, stride, pad), name);
}

loom_value loom_layer_batchnorm2d(loom_graph *g, const char *name, loom_value x)
{
	if (!g || !ok_value(g, x, "batchnorm2d layer", "input") ||
	    !want_ndim(g, x, 4, "batchnorm2d layer", "input"))
		return LOOM_NONE;
	loom_dtype dt = N(g, x)->dtype;
	int64_t c[1] = { N(g, x)->shape.dims[1] };
	loom_value gm = layer_param(g, name, "weight", dt, 1, c, LOOM_INIT_ONES, 0, 0);
	loom_value bt = layer_param(g, name, "bias", dt, 1, c, LOOM_INIT_ZEROS, 0, 0);
	loom_value rm = layer_param(g, name, "running_mean", dt, 1, c, LOOM_INIT_ZEROS, 0, 1);
	loom_value rv = layer_param(g, name, "running_var", dt, 1, c, LOOM_INIT_ONES, 0, 1);
	return loom_set_name(g, loom_batchnorm2d(g, x, gm, bt, rm, rv, 0.1, 1e-5), name);
}

loom_value loom_layer_linear(loom_graph *g, const char *name, loom_value x,
			     int out_features, int bias)
{
	if (!g || !ok_value(g, x, "linear layer", "input") ||
	    !want_ndim(g, x, 2, "linear layer", "input"))
		return LOOM_NONE;
	if (out_features < 1)
		return loom_graph_fail(g, LOOM_ERR_INVALID, "linear '%s': %d output features",
				       name ? name : "?", out_features);
	loom_dtype dt = N(g, x)->dtype;
	int64_t in = N(g, x)->shape.dims[1];
	int64_t wd[2] = { out_features, in };
	loom_value w = layer_param(g, name, "weight", dt, 2, wd, LOOM_INIT_KAIMING_UNIFORM, in, 0);
	loom_value b = LOOM_NONE;
	if (bias) {
		int64_t bd[1] = { out_features };
		b = layer_param(g, name, "bias", dt, 1, bd, LOOM_INIT_UNIFORM_FAN_IN, in, 0);
	}
	return loom_set_name(g, loom_linear(g, x, w, b), name);
}
