/*
 * graph/ops/geometry.c — a conv or pool node's window geometry, read from the
 * shapes of the node and its sources (one place for both backends).
 */
#include "graph/ops/geometry.h"

static void conv_fill(const loom_node *x, const loom_node *w, const loom_node *y,
		      const loom_attrs *a, loom_conv_shape *s)
{
	s->n = (int)x->shape.dims[0];
	s->c_in = (int)x->shape.dims[1];
	s->h_in = (int)x->shape.dims[2];
	s->w_in = (int)x->shape.dims[3];
	s->c_out = (int)w->shape.dims[0];
	s->kh = (int)w->shape.dims[2];
	s->kw = (int)w->shape.dims[3];
	s->stride = a->conv.stride;
	s->pad = a->conv.pad;
	s->h_out = (int)y->shape.dims[2];
	s->w_out = (int)y->shape.dims[3];
}

void loom_conv_shape_of(const loom_graph *g, loom_value v, loom_conv_shape *s)
{
	const loom_node *n = &g->nodes[v];
	const loom_node *s0 = &g->nodes[n->src[0]], *s1 = &g->nodes[n->src[1]];
	switch (n->op) {
	case LOOM_OP_CONV2D: /* (x, w[, b]) -> y */
		conv_fill(s0, s1, n, &n->a, s);
		break;
	case LOOM_OP_CONV2D_BWD_DATA: /* (dy, w) -> dx */
		conv_fill(n, s1, s0, &n->a, s);
		break;
	default: /* CONV2D_BWD_FILTER: (dy, x) -> dw */
		conv_fill(s1, n, s0, &n->a, s);
		break;
	}
}

void loom_pool_shape_of(const loom_graph *g, loom_value v, loom_pool_shape *s)
{
	const loom_node *n = &g->nodes[v];
	const loom_node *x = &g->nodes[n->src[0]];
	const loom_node *y = n->op == LOOM_OP_MAXPOOL2D ? n : &g->nodes[n->src[1]];
	s->n = (int)x->shape.dims[0];
	s->c = (int)x->shape.dims[1];
	s->h_in = (int)x->shape.dims[2];
	s->w_in = (int)x->shape.dims[3];
	s->k = n->a.pool.kernel;
	s->stride = n->a.pool.stride;
	s->pad = n->a.pool.pad;
	s->h_out = (int)y->shape.dims[2];
	s->w_out = (int)y->shape.dims[3];
	s->relu = n->a.pool.relu;
}

int loom_window_result(loom_node *n, const loom_node *x, int64_t c, int64_t kh, int64_t kw,
		       int stride, int pad)
{
	const int64_t *xd = x->shape.dims;
	int64_t ho = loom_window_out(xd[2], kh, stride, pad);
	int64_t wo = loom_window_out(xd[3], kw, stride, pad);
	if (ho <= 0 || wo <= 0)
		return 0;
	int64_t d[4] = { xd[0], c, ho, wo };
	n->shape = loom_shape_make(4, d);
	n->dtype = x->dtype;
	return 1;
}
