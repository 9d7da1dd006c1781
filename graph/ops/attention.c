/*
 * graph/ops/attention.c — causal multi-head self-attention over a fused
 * QKV input [B, T, 3C] (q, k, v side by side, head h at columns h*hs of
 * each, hs = C / n_head), as GPT-2's c_attn makes it. loom_causal_self_
 * attention builds it as two nodes, the way llm.c's attention_forward keeps
 * its softmax for backward:
 *   ATTN_PROBS  qkv -> P [B, NH, T, T] = softmax(q k^T / sqrt(hs)), masked
 *               to j <= i (P = 0 above the diagonal);
 *   ATTENTION   (P, qkv) -> y [B, T, C], y[b, t, h*hs + d] = sum_j P v.
 * P is the one saved activation (as llm.c's att); backward reads it instead
 * of recomputing the softmax. Each node has its own gradient rule:
 *   ATTENTION   dP = dy v^T (ATTENTION_BWD_PROBS), dv = P^T dy (BWD_QKV);
 *   ATTN_PROBS  dS = P (dP - rowsum(dP P)), dq = dS k / sqrt(hs),
 *               dk = dS^T q / sqrt(hs) (ATTN_PROBS_BWD);
 * and autodiff adds the two [B, T, 3C] shares of qkv.
 */
#include "graph/ops/ops.h"

static loom_value attn_node(loom_graph *g, loom_op op, int nsrc, const loom_value *src,
			    int n_head)
{
	loom_node n;
	loom_op_init(&n, op, nsrc, src);
	n.a.attn.n_head = n_head;
	return loom_op_build(g, &n);
}

loom_value loom_attention_probs(loom_graph *g, loom_value qkv, int n_head)
{
	return attn_node(g, LOOM_OP_ATTN_PROBS, 1, &qkv, n_head);
}

loom_value loom_attention_apply(loom_graph *g, loom_value probs, loom_value qkv, int n_head)
{
	loom_value s[2] = { probs, qkv };
	return attn_node(g, LOOM_OP_ATTENTION, 2, s, n_head);
}

loom_value loom_causal_self_attention(loom_graph *g, loom_value qkv, int n_head)
{
	return loom_attention_apply(g, loom_attention_probs(g, qkv, n_head), qkv, n_head);
}

/* qkv (source i of n) is [B, T, 3C] with C divisible by n_head. */
static int check_qkv(loom_graph *g, const loom_node *n, int i)
{
	char bq[96];
	const char *op = loom_op_defs[n->op]->name;
	const loom_node *q = &g->nodes[n->src[i]];
	int nh = n->a.attn.n_head;
	if (!loom_check_float(g, n, i) || !loom_check_ndim(g, n, i, 3))
		return 0;
	if (nh < 1 || q->shape.dims[2] % (3 * (int64_t)nh) != 0)
		return loom_graph_fail(g, LOOM_ERR_SHAPE,
				       "%s: qkv %s: the last dim must be 3 * C with C divisible "
				       "by the %d heads",
				       op, loom_shape_str(&q->shape, bq, sizeof(bq)), nh), 0;
	return 1;
}

static int shape_attn_probs(loom_graph *g, loom_node *n)
{
	if (!check_qkv(g, n, 0))
		return 0;
	const loom_node *q = &g->nodes[n->src[0]];
	int64_t t = q->shape.dims[1];
	int64_t d[4] = { q->shape.dims[0], n->a.attn.n_head, t, t };
	n->shape = loom_shape_make(4, d);
	n->dtype = q->dtype;
	return 1;
}

static int shape_attention(loom_graph *g, loom_node *n)
{
	char bp[96], bq[96];
	if (!check_qkv(g, n, 1) || !loom_check_float(g, n, 0) || !loom_check_same_dtype(g, n, 0, 1))
		return 0;
	const loom_node *p = &g->nodes[n->src[0]], *q = &g->nodes[n->src[1]];
	int64_t b = q->shape.dims[0], t = q->shape.dims[1];
	if (p->shape.ndim != 4 || p->shape.dims[0] != b || p->shape.dims[1] != n->a.attn.n_head ||
	    p->shape.dims[2] != t || p->shape.dims[3] != t)
		return loom_graph_fail(g, LOOM_ERR_SHAPE,
				       "attention: probs %s must be [%lld, %d, %lld, %lld] for qkv %s",
				       loom_shape_str(&p->shape, bp, sizeof(bp)), (long long)b,
				       n->a.attn.n_head, (long long)t, (long long)t,
				       loom_shape_str(&q->shape, bq, sizeof(bq))), 0;
	int64_t d[3] = { b, t, q->shape.dims[2] / 3 };
	n->shape = loom_shape_make(3, d);
	n->dtype = q->dtype;
	return 1;
}

static loom_value attn_grad_node(loom_graph *g, loom_op op, loom_value like, int nsrc,
				 const loom_value *src, int n_head)
{
	loom_value v = loom_grad_node(g, op, like, nsrc, src);
	if (v != LOOM_NONE)
		g->nodes[v].a.attn.n_head = n_head;
	return v;
}

static void grad_attn_probs(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_node n = g->nodes[v];
	if (!loom_grad_needed(ctx, n.src[0]))
		return;
	loom_value s[3] = { n.src[0], v, dy };
	loom_grad_accum(ctx, n.src[0],
			attn_grad_node(g, LOOM_OP_ATTN_PROBS_BWD, n.src[0], 3, s, n.a.attn.n_head));
}

static void grad_attention(loom_graph *g, loom_value v, loom_value dy, void *ctx)
{
	loom_node n = g->nodes[v];
	int nh = n.a.attn.n_head;
	if (loom_grad_needed(ctx, n.src[0])) {
		loom_value s[2] = { n.src[1], dy };
		loom_grad_accum(ctx, n.src[0],
				attn_grad_node(g, LOOM_OP_ATTENTION_BWD_PROBS, n.src[0], 2, s, nh));
	}
	if (loom_grad_needed(ctx, n.src[1])) {
		loom_value s[2] = { n.src[0], dy };
		loom_grad_accum(ctx, n.src[1],
				attn_grad_node(g, LOOM_OP_ATTENTION_BWD_QKV, n.src[1], 2, s, nh));
	}
}

/* Under O1 as autocast runs attention: half q, k, v into the products
 * (fp32 accumulation), the softmax in fp32 inside the kernel (the scores
 * never rounded to half), the probabilities written in half for the
 * attention product that reads them. */
LOOM_FORWARD_OP(attn_probs, .attrs = LOOM_ATTRS_ATTN, .src_names = { "qkv" },
		.amp = { .cls = LOOM_AMP_ALLOW }, .recompute = 3);

/* Its sources once fused (graph/fuse_attention.c): qkv, the LSE, dy, y. */
LOOM_BACKWARD_OP(attn_probs_bwd, "attn_probs_bwd", LOOM_ATTRS_ATTN, "qkv", "probs", "dprobs", "y");

LOOM_FORWARD_OP(attention, .attrs = LOOM_ATTRS_ATTN, .src_names = { "probs", "qkv" },
		.amp = { .cls = LOOM_AMP_ALLOW });

LOOM_BACKWARD_OP(attention_bwd_probs, "attention_bwd_probs", LOOM_ATTRS_ATTN, "qkv", "dy");

LOOM_BACKWARD_OP(attention_bwd_qkv, "attention_bwd_qkv", LOOM_ATTRS_ATTN, "probs", "dy");
