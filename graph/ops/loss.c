/*
 * graph/ops/loss.c — the softmax cross-entropy loss (mean over the batch,
 * i32 labels) and its backward (logits, labels, dloss) -> dlogits, and the
 * seed of backpropagation: d loss / d loss, holding the loss scale.
 */
#include "graph/ops/ops.h"

loom_value loom_softmax_cross_entropy(loom_graph *g, loom_value logits, loom_value labels)
{
	loom_value src[2] = { logits, labels };
	return loom_op_build_plain(g, LOOM_OP_SOFTMAX_CE, 2, src);
}

static int shape_softmax_ce(loom_graph *g, loom_node *n)
{
	const char *op = loom_op_defs[n->op]->name;
	char bl[96], by[96];
	const loom_node *logits = &g->nodes[n->src[0]], *labels = &g->nodes[n->src[1]];
	if (!loom_check_float(g, n, 0) || !loom_check_ndim(g, n, 0, 2) ||
	    !loom_check_ndim(g, n, 1, 1))
		return 0;
	if (labels->dtype != LOOM_I32)
		return loom_graph_fail(g, LOOM_ERR_DTYPE, "%s: labels have dtype %s, expected i32",
				       op, loom_dtype_name(labels->dtype)), 0;
	if (labels->shape.dims[0] != logits->shape.dims[0])
		return loom_graph_fail(g, LOOM_ERR_SHAPE, "%s: logits %s and labels %s: batch differs",
				       op, loom_shape_str(&logits->shape, bl, sizeof(bl)),
				       loom_shape_str(&labels->shape, by, sizeof(by))), 0;
	n->shape = loom_shape_make(0, NULL);
	n->dtype = logits->dtype;
	return 1;
}

static void grad_softmax_ce(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_node n = g->nodes[v];
	loom_value s[3] = { n.src[0], n.src[1], dy };
	loom_grad_op(g, ctx, n.src[0], LOOM_OP_SOFTMAX_CE_BWD, 3, s, NULL);
}

const loom_op_def loom_op_softmax_ce = {
	.name = "softmax_cross_entropy",
	.kind = LOOM_OPK_FORWARD,
	.src_names = { "logits", "labels" },
	.nondiff = LOOM_SRC(1),
	.shape = shape_softmax_ce,
	.grad = grad_softmax_ce,
	.amp = { .cls = LOOM_AMP_FP32, .keep = LOOM_SRC(1) },
};

/* In place over the logits (llm.c's fused classifier): a large-vocabulary
 * loss holds one [rows, classes] buffer, not the logits and their gradient. */
const loom_op_def loom_op_softmax_ce_bwd = {
	.name = "softmax_ce_bwd",
	.kind = LOOM_OPK_BACKWARD,
	.flags = LOOM_OPF_INPLACE,
	.src_names = { "logits", "labels", "dloss" },
	.amp = { .cls = LOOM_AMP_FOLLOW },
};

const loom_op_def loom_op_grad_seed = {
	.name = "grad_seed",
	.kind = LOOM_OPK_BACKWARD,
	.amp = { .cls = LOOM_AMP_FOLLOW },
};
