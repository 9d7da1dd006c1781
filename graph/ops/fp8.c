/*
 * graph/ops/fp8.c — FP8_QDQ, the emulation of FP8 training's casts: x
 * rounded through E4M3 or E5M2 with a power-of-two scale (its own amax's,
 * or its amax history's: amp/fp8_scaling.h) and back, in x's dtype.
 * Inserted by the AMP pass under amp.fp8 (amp/amp_pass.c); users do not
 * build it.
 */
#include <stdio.h>
#include <string.h>

#include "graph/ops/ops.h"

/* "h0.c_fc.e4m3", or for a source without a name its op and node,
 * "layernorm#17.e4m3" (the node --dump-graph lists): plan dumps and
 * loom_amp_report say which rounding each node is. An AMP cast has no name
 * of its own: its source's is the tensor's. */
static void fp8_name(loom_graph *g, loom_value v, loom_value x, const char *what)
{
	char src[LOOM_NAME_MAX];
	while (!g->nodes[x].name[0] && g->nodes[x].op == LOOM_OP_CAST && g->nodes[x].nsrc > 0)
		x = g->nodes[x].src[0];
	memcpy(src, g->nodes[x].name, LOOM_NAME_MAX);
	if (src[0])
		snprintf(g->nodes[v].name, LOOM_NAME_MAX, "%.48s.%s", src, what);
	else
		snprintf(g->nodes[v].name, LOOM_NAME_MAX, "%.32s#%d.%s",
			 loom_op_defs[g->nodes[x].op]->name, (int)x, what);
}

loom_value loom_fp8_qdq_node(loom_graph *g, loom_value x, loom_dtype fwd, loom_dtype bwd)
{
	loom_value v = loom_node_add(g, LOOM_OP_FP8_QDQ, g->nodes[x].dtype, g->nodes[x].shape, 1, &x);
	if (v == LOOM_NONE)
		return v;
	g->nodes[v].a.fp8.fwd = fwd;
	g->nodes[v].a.fp8.bwd = bwd;
	g->nodes[v].a.fp8.slot = -1; /* the compile's end gives it one */
	g->nodes[v].flags |= LOOM_NODE_AMP;
	fp8_name(g, v, x, fwd == LOOM_FP8_E4M3 ? "e4m3" : fwd == LOOM_FP8_E5M2 ? "e5m2" : "e5m2 grad");
	return v;
}

/*
 * Straight through: the rounding's derivative is zero almost everywhere,
 * so FP8 training (as Transformer Engine) passes dy on as if the forward
 * were the identity, rounded through the bwd format if it names one: the
 * E5M2 output gradient a product's backward takes.
 */
static void grad_fp8_qdq(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_node n = g->nodes[v];
	if (!loom_grad_needed(ctx, n.src[0]))
		return;
	if (n.a.fp8.bwd != LOOM_FP8_E4M3 && n.a.fp8.bwd != LOOM_FP8_E5M2) {
		loom_grad_accum(ctx, n.src[0], dy);
		return;
	}
	loom_value d = loom_grad_node(g, LOOM_OP_FP8_QDQ, n.src[0], 1, &dy);
	if (d != LOOM_NONE) {
		g->nodes[d].a.fp8.fwd = n.a.fp8.bwd;
		g->nodes[d].a.fp8.bwd = LOOM_F32;
		g->nodes[d].a.fp8.slot = -1;
		fp8_name(g, d, n.src[0], n.a.fp8.bwd == LOOM_FP8_E4M3 ? "grad.e4m3" : "grad.e5m2");
	}
	loom_grad_accum(ctx, n.src[0], d);
}

/* Inserted by the pass in the dtype it chose, so FOLLOW never casts it. */
const loom_op_def loom_op_fp8_qdq = {
	.name = "fp8_qdq",
	.kind = LOOM_OPK_PASS,
	.attrs = LOOM_ATTRS_FP8,
	.src_names = { "input" },
	.grad = grad_fp8_qdq,
	.amp = { .cls = LOOM_AMP_FOLLOW },
};
