/*
 * graph/ops/geometry.h — the window geometry of convolution and pooling,
 * defined once next to the ops: the builder's shape rules and both backends
 * (engine/cpu, engine/cuda) read a node's geometry from here.
 */
#ifndef LOOM_GRAPH_OPS_GEOMETRY_H
#define LOOM_GRAPH_OPS_GEOMETRY_H

#include <stdint.h>

#include "graph/graph_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_conv_shape {
	int n, c_in, h_in, w_in;
	int c_out, kh, kw;
	int stride, pad;
	int h_out, w_out; /* loom_window_out(h_in, kh, stride, pad) */
} loom_conv_shape;

typedef struct loom_pool_shape {
	int n, c, h_in, w_in;
	int k, stride, pad;
	int h_out, w_out;
	/* Fused relu before the pool: y = maxpool(relu(x)), which equals
	 * relu(maxpool(x)); the backward routes dy only where the window's max
	 * is > 0, so it also stands for relu's backward (graph/fuse.c). */
	int relu;
} loom_pool_shape;

/* Outputs of a window of size k sliding with stride over in + 2 pad
 * elements; 0 when the window does not fit at all. */
static inline int64_t loom_window_out(int64_t in, int64_t k, int64_t stride, int64_t pad)
{
	if (stride < 1 || in + 2 * pad < k)
		return 0;
	return (in + 2 * pad - k) / stride + 1;
}

/* Node n's result as a window op's over x [N, C, H, W]: [N, c, H_out,
 * W_out] of x's dtype for a kh x kw window; 0, n untouched, when the window
 * does not fit (the op's shape rule says so in its own words). */
int loom_window_result(loom_node *n, const loom_node *x, int64_t c, int64_t kh, int64_t kw,
		       int stride, int pad);

/* The geometry of node v: a CONV2D (x, w[, b]) -> y, or one of its backward
 * nodes CONV2D_BWD_DATA (dy, w) -> dx and CONV2D_BWD_FILTER (dy, x) -> dw. */
void loom_conv_shape_of(const loom_graph *g, loom_value v, loom_conv_shape *s);

/* The geometry of node v: a MAXPOOL2D x -> y or MAXPOOL2D_BWD (x, dy) -> dx. */
void loom_pool_shape_of(const loom_graph *g, loom_value v, loom_pool_shape *s);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_GRAPH_OPS_GEOMETRY_H */
