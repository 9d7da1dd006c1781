/*
 * graph/layers.c — the layer helpers of the builder API (loom_layer_*): a
 * layer's parameters, named "<layer>.weight" and so on with PyTorch's
 * initialisers, plus the op that uses them. Plain calls of the public
 * builder; graph/builder.c records the nodes.
 */
#include <stdio.h>
#include <string.h>

#include "graph/graph_internal.h"
#include "graph/ops/ops.h"

static const loom_node *N(const loom_graph *g, loom_value v)
{
	return &g->nodes[v];
}

#define SH(v, buf) loom_shape_str(&N(g, v)->shape, buf, sizeof(buf))

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
	if (!g || !loom_check_value(g, x, "conv2d layer", "input") ||
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
	if (!g || !loom_check_value(g, x, "batchnorm2d layer", "input") ||
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
	if (!g || !loom_check_value(g, x, "linear layer", "input"))
		return LOOM_NONE;
	if (N(g, x)->shape.ndim < 2) {
		want_ndim(g, x, 2, "linear layer", "input");
		return LOOM_NONE;
	}
	if (out_features < 1)
		return loom_graph_fail(g, LOOM_ERR_INVALID, "linear '%s': %d output features",
				       name ? name : "?", out_features);
	loom_dtype dt = N(g, x)->dtype;
	int64_t in = loom_shape_last(&N(g, x)->shape);
	int64_t wd[2] = { out_features, in };
	loom_value w = layer_param(g, name, "weight", dt, 2, wd, LOOM_INIT_KAIMING_UNIFORM, in, 0);
	loom_value b = LOOM_NONE;
	if (bias) {
		int64_t bd[1] = { out_features };
		b = layer_param(g, name, "bias", dt, 1, bd, LOOM_INIT_UNIFORM_FAN_IN, in, 0);
	}
	return loom_set_name(g, loom_linear(g, x, w, b), name);
}

loom_value loom_layer_layernorm(loom_graph *g, const char *name, loom_value x)
{
	if (!g || !loom_check_value(g, x, "layernorm layer", "input"))
		return LOOM_NONE;
	if (N(g, x)->shape.ndim < 1)
		return loom_graph_fail(g, LOOM_ERR_SHAPE, "layernorm '%s': input is a scalar",
				       name ? name : "?");
	loom_dtype dt = N(g, x)->dtype;
	int64_t cd[1] = { loom_shape_last(&N(g, x)->shape) };
	loom_value w = layer_param(g, name, "weight", dt, 1, cd, LOOM_INIT_ONES, 0, 0);
	loom_value b = layer_param(g, name, "bias", dt, 1, cd, LOOM_INIT_ZEROS, 0, 0);
	return loom_set_name(g, loom_layernorm(g, x, w, b, 1e-5), name);
}
