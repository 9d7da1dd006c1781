/*
 * graph/ops/conv.c — 2-D convolution (NCHW, square stride and padding) and
 * its two backward ops: the data gradient (dy, w) -> dx and the filter
 * gradient (dy, x) -> dw. The window geometry is graph/ops/geometry.h.
 */
#include "graph/ops/geometry.h"
#include "graph/ops/ops.h"

loom_value loom_conv2d(loom_graph *g, loom_value x, loom_value w, loom_value b,
		       int stride, int pad)
{
	loom_node n;
	loom_value src[3] = { x, w, b };
	loom_op_init(&n, LOOM_OP_CONV2D, b == LOOM_NONE ? 2 : 3, src);
	n.a.conv.stride = stride;
	n.a.conv.pad = pad;
	return loom_op_build(g, &n);
}

static int shape_conv2d(loom_graph *g, loom_node *n)
{
	char bx[96], bw[96];
	int stride = n->a.conv.stride, pad = n->a.conv.pad;
	if (!loom_check_weight_bias(g, n, 4, "channels"))
		return 0;
	const loom_node *x = &g->nodes[n->src[0]], *w = &g->nodes[n->src[1]];
	const int64_t *wd = w->shape.dims;
	if (stride < 1 || pad < 0)
		return loom_graph_fail(g, LOOM_ERR_INVALID, "conv2d: stride %d / pad %d invalid",
				       stride, pad), 0;
	if (!loom_window_result(n, x, wd[0], wd[2], wd[3], stride, pad))
		return loom_graph_fail(g, LOOM_ERR_SHAPE,
				       "conv2d: kernel %s larger than padded input %s (pad %d)",
				       loom_shape_str(&w->shape, bw, sizeof(bw)),
				       loom_shape_str(&x->shape, bx, sizeof(bx)), pad), 0;
	return 1;
}

static void grad_conv2d(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_node n = g->nodes[v];
	loom_value sx[2] = { dy, n.src[1] }, sw[2] = { dy, n.src[0] };
	loom_grad_op(g, ctx, n.src[0], LOOM_OP_CONV2D_BWD_DATA, 2, sx, &n.a);
	loom_grad_op(g, ctx, n.src[1], LOOM_OP_CONV2D_BWD_FILTER, 2, sw, &n.a);
	if (n.nsrc > 2 && loom_grad_needed(ctx, n.src[2]))
		loom_grad_accum(ctx, n.src[2], loom_grad_channel_sum(g, dy, n.src[2]));
}

LOOM_FORWARD_OP(conv2d, .attrs = LOOM_ATTRS_CONV, .src_names = { "input", "weight", "bias" },
		.amp = { .cls = LOOM_AMP_ALLOW, .fp8_src = LOOM_SRC(0) | LOOM_SRC(1) });

LOOM_BACKWARD_OP(conv2d_bwd_data, "conv2d_bwd_data", LOOM_ATTRS_CONV, "dy", "weight");

LOOM_BACKWARD_OP(conv2d_bwd_filter, "conv2d_bwd_filter", LOOM_ATTRS_CONV, "dy", "input");
