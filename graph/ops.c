/*
 * graph/ops.c — the op table: each op's name and gradient rule. A gradient
 * rule appends backward nodes for one forward node and hands each source its
 * share through loom_grad_accum. Shape rules live with the builder calls.
 */
#include "graph/graph_internal.h"

/* Defined in autodiff.c: does src need a gradient at all? */
int loom_grad_needed(void *ctx, loom_value src);

static loom_value bwd(loom_graph *g, loom_op op, loom_value like, int nsrc,
		      const loom_value *src)
{
	const loom_node *l = &g->nodes[like];
	loom_value v = loom_node_add(g, op, l->dtype, l->shape, nsrc, src);
	if (v != LOOM_NONE)
		g->nodes[v].flags |= LOOM_NODE_BACKWARD;
	return v;
}

static loom_value channel_sum(loom_graph *g, loom_value dy, loom_value like)
{
	loom_value v = bwd(g, LOOM_OP_CHANNEL_SUM, like, 1, &dy);
	return v;
}

static void grad_conv2d(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_node n = g->nodes[v];
	if (loom_grad_needed(ctx, n.src[0])) {
		loom_value s[2] = { dy, n.src[1] };
		loom_value dx = bwd(g, LOOM_OP_CONV2D_BWD_DATA, n.src[0], 2, s);
		if (dx != LOOM_NONE)
			g->nodes[dx].a = n.a;
		loom_grad_accum(ctx, n.src[0], dx);
	}
	if (loom_grad_needed(ctx, n.src[1])) {
		loom_value s[2] = { dy, n.src[0] };
		loom_value dw = bwd(g, LOOM_OP_CONV2D_BWD_FILTER, n.src[1], 2, s);
		if (dw != LOOM_NONE)
			g->nodes[dw].a = n.a;
		loom_grad_accum(ctx, n.src[1], dw);
	}
	if (n.nsrc > 2 && loom_grad_needed(ctx, n.src[2]))
		loom_grad_accum(ctx, n.src[2], channel_sum(g, dy, n.src[2]));
}

static void grad_batchnorm2d(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_node n = g->nodes[v];
	if (loom_grad_needed(ctx, n.src[0])) {
		loom_value s[3] = { n.src[0], n.src[1], dy };
		loom_value dx = bwd(g, LOOM_OP_BN_BWD_DATA, n.src[0], 3, s);
		if (dx != LOOM_NONE)
			g->nodes[dx].a = n.a;
		loom_grad_accum(ctx, n.src[0], dx);
	}
	if (loom_grad_needed(ctx, n.src[1])) {
		loom_value s[2] = { n.src[0], dy };
		loom_value dg = bwd(g, LOOM_OP_BN_BWD_GAMMA, n.src[1], 2, s);
		if (dg != LOOM_NONE)
			g->nodes[dg].a = n.a;
		loom_grad_accum(ctx, n.src[1], dg);
	}
	if (loom_grad_needed(ctx, n.src[2]))
		loom_grad_accum(ctx, n.src[2], channel_sum(g, dy, n.src[2]));
}

static void grad_relu(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_value x = g->nodes[v].src[0];
	if (!loom_grad_needed(ctx, x))
		return;
	loom_value s[2] = { x, dy };
	loom_grad_accum(ctx, x, bwd(g, LOOM_OP_RELU_BWD, x, 2, s));
}

static void grad_maxpool2d(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_node n = g->nodes[v];
	if (!loom_grad_needed(ctx, n.src[0]))
		return;
	loom_value s[2] = { n.src[0], dy };
	loom_value dx = bwd(g, LOOM_OP_MAXPOOL2D_BWD, n.src[0], 2, s);
	if (dx != LOOM_NONE)
		g->nodes[dx].a = n.a;
	loom_grad_accum(ctx, n.src[0], dx);
}

static loom_value matmul(loom_graph *g, loom_value a, int ta, loom_value b, int tb,
			 loom_value like)
{
	loom_value s[2] = { a, b };
	loom_value v = bwd(g, LOOM_OP_MATMUL, like, 2, s);
	if (v != LOOM_NONE) {
		g->nodes[v].a.mm.ta = ta;
		g->nodes[v].a.mm.tb = tb;
	}
	return v;
}

/* y = x w^T + b: dx = dy w, dw = dy^T x, db = column sums of dy. */
static void grad_linear(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_node n = g->nodes[v];
	if (loom_grad_needed(ctx, n.src[0]))
		loom_grad_accum(ctx, n.src[0], matmul(g, dy, 0, n.src[1], 0, n.src[0]));
	if (loom_grad_needed(ctx, n.src[1]))
		loom_grad_accum(ctx, n.src[1], matmul(g, dy, 1, n.src[0], 0, n.src[1]));
	if (n.nsrc > 2 && loom_grad_needed(ctx, n.src[2]))
		loom_grad_accum(ctx, n.src[2], channel_sum(g, dy, n.src[2]));
}

/* c = op(a) op(b); only the untransposed form is built by users. */
static void grad_matmul(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_node n = g->nodes[v];
	if (n.a.mm.ta || n.a.mm.tb) {
		loom_graph_fail(g, LOOM_ERR_UNSUPPORTED,
				"autodiff: gradient of a transposed matmul (#%d)", (int)v);
		return;
	}
	if (loom_grad_needed(ctx, n.src[0]))
		loom_grad_accum(ctx, n.src[0], matmul(g, dy, 0, n.src[1], 1, n.src[0]));
	if (loom_grad_needed(ctx, n.src[1]))
		loom_grad_accum(ctx, n.src[1], matmul(g, n.src[0], 1, dy, 0, n.src[1]));
}

static void grad_add(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_node n = g->nodes[v];
	for (int i = 0; i < 2; i++)
		if (loom_grad_needed(ctx, n.src[i]))
			loom_grad_accum(ctx, n.src[i], dy);
}

static void grad_reshape(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_value x = g->nodes[v].src[0];
	if (loom_grad_needed(ctx, x))
		loom_grad_accum(ctx, x, bwd(g, LOOM_OP_RESHAPE, x, 1, &dy));
}

static loom_value broadcast(loom_graph *g, loom_value x, loom_value like, double scale)
{
	loom_value v = bwd(g, LOOM_OP_BROADCAST, like, 1, &x);
	if (v != LOOM_NONE)
		g->nodes[v].a.bc.scale = scale;
	return v;
}

static void grad_sum(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_value x = g->nodes[v].src[0];
	if (loom_grad_needed(ctx, x))
		loom_grad_accum(ctx, x, broadcast(g, dy, x, 1.0));
}

static void grad_broadcast(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_node n = g->nodes[v];
	if (!loom_grad_needed(ctx, n.src[0]))
		return;
	loom_value d = dy;
	if (n.shape.ndim > 0) {
		d = bwd(g, LOOM_OP_SUM, n.src[0], 1, &dy);
	}
	loom_grad_accum(ctx, n.src[0], broadcast(g, d, n.src[0], n.a.bc.scale));
}

static void grad_softmax_ce(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_node n = g->nodes[v];
	if (!loom_grad_needed(ctx, n.src[0]))
		return;
	loom_value s[3] = { n.src[0], n.src[1], dy };
	loom_grad_accum(ctx, n.src[0], bwd(g, LOOM_OP_SOFTMAX_CE_BWD, n.src[0], 3, s));
}

static void grad_cast(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_value x = g->nodes[v].src[0];
	if (loom_grad_needed(ctx, x))
		loom_grad_accum(ctx, x, bwd(g, LOOM_OP_CAST, x, 1, &dy));
}

static void grad_global_avgpool(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_value x = g->nodes[v].src[0];
	if (loom_grad_needed(ctx, x))
		loom_grad_accum(ctx, x, bwd(g, LOOM_OP_GLOBAL_AVGPOOL_BWD, x, 1, &dy));
}

const loom_op_def loom_op_defs[LOOM_OP_COUNT] = {
	[LOOM_OP_INPUT] = { "input", NULL },
	[LOOM_OP_PARAM] = { "param", NULL },
	[LOOM_OP_BUFFER] = { "buffer", NULL },
	[LOOM_OP_CONV2D] = { "conv2d", grad_conv2d },
	[LOOM_OP_CONV2D_BWD_DATA] = { "conv2d_bwd_data", NULL },
	[LOOM_OP_CONV2D_BWD_FILTER] = { "conv2d_bwd_filter", NULL },
	[LOOM_OP_CHANNEL_SUM] = { "channel_sum", NULL },
	[LOOM_OP_BATCHNORM2D] = { "batchnorm2d", grad_batchnorm2d },
	[LOOM_OP_BN_BWD_DATA] = { "bn_bwd_data", NULL },
	[LOOM_OP_BN_BWD_GAMMA] = { "bn_bwd_gamma", NULL },
	[LOOM_OP_RELU] = { "relu", grad_relu },
	[LOOM_OP_RELU_BWD] = { "relu_bwd", NULL },
	[LOOM_OP_MAXPOOL2D] = { "maxpool2d", grad_maxpool2d },
	[LOOM_OP_MAXPOOL2D_BWD] = { "maxpool2d_bwd", NULL },
	[LOOM_OP_LINEAR] = { "linear", grad_linear },
	[LOOM_OP_MATMUL] = { "matmul", grad_matmul },
	[LOOM_OP_ADD] = { "add", grad_add },
	[LOOM_OP_RESHAPE] = { "reshape", grad_reshape },
	[LOOM_OP_SUM] = { "sum", grad_sum },
	[LOOM_OP_BROADCAST] = { "broadcast", grad_broadcast },
	[LOOM_OP_SOFTMAX_CE] = { "softmax_cross_entropy", grad_softmax_ce },
	[LOOM_OP_SOFTMAX_CE_BWD] = { "softmax_ce_bwd", NULL },
	[LOOM_OP_GRAD_SEED] = { "grad_seed", NULL },
	[LOOM_OP_CAST] = { "cast", grad_cast },
	[LOOM_OP_GLOBAL_AVGPOOL] = { "global_avgpool", grad_global_avgpool },
	[LOOM_OP_GLOBAL_AVGPOOL_BWD] = { "global_avgpool_bwd", NULL },
};
