/*
 * graph/ops/unary.c — the op table rows and builders of the unary
 * elementwise ops, made from graph/unary.h's rows: a forward op with the
 * input's shape and dtype (AMP class FOLLOW) whose gradient is its _BWD
 * node (x, dy) -> dx, the variant (attrs.ew.tanh) carried over.
 */
#include "graph/ops/ops.h"

static loom_value unary(loom_graph *g, loom_op op, loom_value x, int attr)
{
	loom_node n;
	loom_op_init(&n, op, 1, &x);
	n.a.ew.tanh = attr;
	return loom_op_build(g, &n);
}

/* The _BWD op of a forward unary op. */
static loom_op bwd_of(loom_op op)
{
#define BWD_OF(NAME, low) \
	if (op == LOOM_OP_##NAME) \
		return LOOM_OP_##NAME##_BWD;
	LOOM_UNARY_OPS(BWD_OF)
#undef BWD_OF
	return LOOM_OP_COUNT;
}

static void grad_unary(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_value x = g->nodes[v].src[0];
	int attr = g->nodes[v].a.ew.tanh;
	if (!loom_grad_needed(ctx, x))
		return;
	loom_value s[2] = { x, dy };
	loom_value dx = loom_grad_node(g, bwd_of(g->nodes[v].op), x, 2, s);
	if (dx != LOOM_NONE)
		g->nodes[dx].a.ew.tanh = attr;
	loom_grad_accum(ctx, x, dx);
}

#define UNARY_ROWS(NAME, low)                                            \
	loom_value loom_##low(loom_graph *g, loom_value x)               \
	{                                                                 \
		return unary(g, LOOM_OP_##NAME, x, 0);                    \
	}                                                                 \
	const loom_op_def loom_op_##low = {                              \
		.name = #low,                                            \
		.kind = LOOM_OPK_FORWARD,                                 \
		.attrs = LOOM_ATTRS_EW,                                   \
		.src_names = { "input" },                                 \
		.shape = loom_shape_like_input,                           \
		.grad = grad_unary,                                       \
		.amp = { .cls = LOOM_AMP_FOLLOW },                        \
		.recompute = 1,                                           \
	};                                                                \
	const loom_op_def loom_op_##low##_bwd = {                        \
		.name = #low "_bwd",                                     \
		.kind = LOOM_OPK_BACKWARD,                                \
		.attrs = LOOM_ATTRS_EW,                                   \
		.src_names = { "input", "dy" },                           \
		.flags = LOOM_OPF_INPLACE_DY,                             \
		.amp = { .cls = LOOM_AMP_FOLLOW },                        \
	};
LOOM_UNARY_OPS(UNARY_ROWS)
#undef UNARY_ROWS

/* GELU's variant: GPT-2's tanh approximation. */
loom_value loom_gelu_tanh(loom_graph *g, loom_value x)
{
	return unary(g, LOOM_OP_GELU, x, 1);
}
