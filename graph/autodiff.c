/*
 * graph/autodiff.c — reverse-mode differentiation of a static graph. Walks
 * the nodes backwards from the loss, asks each op's gradient rule for the
 * backward nodes, and sums gradients of values used more than once. Only
 * values that depend on a parameter get gradients (an input image does not).
 */
#include <stdlib.h>

#include "graph/graph_internal.h"
#include "graph/ops/ops.h"

typedef struct grad_ctx {
	loom_graph *g;
	loom_value *grads;   /* per value: its accumulated gradient */
	unsigned char *need; /* per value: depends on a parameter */
} grad_ctx;

int loom_grad_needed(void *vctx, loom_value src)
{
	grad_ctx *ctx = vctx;
	return src >= 0 && ctx->need[src];
}

void loom_grad_accum(void *vctx, loom_value src, loom_value grad)
{
	grad_ctx *ctx = vctx;
	loom_graph *g = ctx->g;
	if (grad == LOOM_NONE || g->err.st != LOOM_OK)
		return;
	if (ctx->grads[src] == LOOM_NONE) {
		ctx->grads[src] = grad;
		return;
	}
	loom_value s[2] = { ctx->grads[src], grad };
	loom_value sum = loom_node_add(g, LOOM_OP_ADD, g->nodes[grad].dtype,
				       g->nodes[grad].shape, 2, s);
	if (sum != LOOM_NONE)
		g->nodes[sum].flags |= LOOM_NODE_BACKWARD;
	ctx->grads[src] = sum;
}

loom_status loom_autodiff(loom_graph *g, loom_value loss)
{
	char lb[96], sb[96];
	if (loss < 0 || loss >= g->n)
		return loom_graph_fail(g, LOOM_ERR_INVALID, "autodiff: the loss is not a value (%d)",
				       (int)loss),
		       g->err.st;
	if (g->nodes[loss].shape.ndim != 0)
		return loom_graph_fail(g, LOOM_ERR_SHAPE, "autodiff: the loss %s must be a scalar, got %s",
				       loom_node_label(g, loss, lb, sizeof(lb)),
				       loom_shape_str(&g->nodes[loss].shape, sb, sizeof(sb))),
		       g->err.st;
	int n_fwd = g->n;
	grad_ctx ctx = { g, NULL, NULL };
	/* Gradients append nodes; size the tables for the worst case lazily by
	 * indexing only forward values (backward nodes never need a gradient). */
	ctx.grads = malloc(sizeof(loom_value) * n_fwd);
	ctx.need = calloc(n_fwd, 1);
	if (!ctx.grads || !ctx.need) {
		free(ctx.grads);
		free(ctx.need);
		return loom_graph_fail(g, LOOM_ERR_NOMEM, "autodiff: out of memory"), g->err.st;
	}
	for (int v = 0; v < n_fwd; v++) {
		ctx.grads[v] = LOOM_NONE;
		loom_node *n = &g->nodes[v];
		const loom_op_def *def = loom_op_defs[n->op];
		ctx.need[v] = (def->flags & LOOM_OPF_TRAINABLE) != 0;
		/* Sources the op does not differentiate (labels, running
		 * statistics) do not make it depend on a parameter. */
		for (int i = 0; i < n->nsrc; i++)
			if (n->src[i] >= 0 && ctx.need[n->src[i]] && !(def->nondiff & LOOM_SRC(i)))
				ctx.need[v] = 1;
	}
	loom_shape scalar = { 0 };
	loom_value seed = loom_node_add(g, LOOM_OP_GRAD_SEED, g->nodes[loss].dtype, scalar, 0, NULL);
	if (seed != LOOM_NONE) {
		g->nodes[seed].flags |= LOOM_NODE_BACKWARD;
		g->nodes[seed].bwd_of = loss;
	}
	ctx.grads[loss] = seed;
	for (int v = loss; v >= 0 && g->err.st == LOOM_OK; v--) {
		if (ctx.grads[v] == LOOM_NONE || !ctx.need[v])
			continue;
		const loom_op_def *def = loom_op_defs[g->nodes[v].op];
		int first = g->n;
		if (def->grad)
			def->grad(g, v, ctx.grads[v], &ctx);
		for (int u = first; u < g->n; u++)
			g->nodes[u].bwd_of = v;
	}
	/* Parameters the loss does not reach get a zero gradient so that the
	 * optimizer still sees one (weight decay and momentum go on). */
	for (int v = 0; v < n_fwd && g->err.st == LOOM_OK; v++) {
		if (!(loom_op_defs[g->nodes[v].op]->flags & LOOM_OPF_TRAINABLE))
			continue;
		loom_value gr = ctx.grads[v];
		if (gr == LOOM_NONE) {
			gr = loom_node_add(g, LOOM_OP_BROADCAST, g->nodes[v].dtype,
					   g->nodes[v].shape, 1, &seed);
			if (gr == LOOM_NONE)
				break;
			g->nodes[gr].a.bc.scale = 0.0;
			g->nodes[gr].flags |= LOOM_NODE_BACKWARD;
			g->nodes[gr].bwd_of = v;
		}
		g->nodes[v].grad = gr;
		g->nodes[gr].flags |= LOOM_NODE_GRAD;
	}
	free(ctx.grads);
	free(ctx.need);
	return g->err.st;
}
