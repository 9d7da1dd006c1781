/*
 * graph/fuse_attention.c — the planner pass that turns each causal
 * attention (graph/ops/attention.c's ATTN_PROBS -> ATTENTION pair and, in
 * training, its three backward nodes and the sum of the two dqkv shares)
 * into one fused flash attention forward and backward, for a backend that
 * says it runs them (LOOM_BE_FUSES_ATTENTION, asked per attention: the
 * CUDA backend's cuDNN SDPA). The T x T probabilities and their gradient
 * leave the memory plan; what the backward keeps instead is the softmax's
 * log-sum-exp, [B, NH, T] f32, in the ATTN_PROBS node's own slot.
 *
 * After the pass:
 *   ATTN_PROBS (qkv) -> LSE, fused; it makes y (the ATTENTION node, made_by)
 *   ATTENTION  (qkv) -> y, fused: written by its ATTN_PROBS node
 *   the sum    becomes ATTN_PROBS_BWD (qkv, LSE, dy, y) -> dqkv, fused
 *   ATTENTION_BWD_PROBS, ATTENTION_BWD_QKV, ATTN_PROBS_BWD: views of qkv
 *   nobody reads.
 */
#include <string.h>

#include "graph/graph_internal.h"
#include "graph/ops/ops.h"

static int is_half(loom_dtype dt)
{
	return dt == LOOM_F16 || dt == LOOM_BF16;
}

static int kept(const loom_graph *g, loom_value v)
{
	return (g->nodes[v].flags & (LOOM_NODE_OUTPUT | LOOM_NODE_GRAD)) != 0;
}

/* The attention around probs: its ATTENTION node, and in training the
 * backward nodes and the sum of the two dqkv shares (LOOM_NONE in a
 * forward-only graph). 0 when the graph is not that pattern. */
typedef struct attn_nodes {
	loom_value probs, attn, bwd_probs, bwd_v, bwd_qk, sum, dy;
} attn_nodes;

static int find_backward(const loom_graph *g, attn_nodes *a, loom_value qkv)
{
	const loom_node *bv = &g->nodes[a->bwd_v], *bq = &g->nodes[a->bwd_qk];
	if (bq->src[0] != qkv || bq->nsrc != 3)
		return 0;
	a->bwd_probs = bq->src[2];
	const loom_node *bp = &g->nodes[a->bwd_probs];
	if (bp->op != LOOM_OP_ATTENTION_BWD_PROBS || bp->src[0] != qkv)
		return 0;
	a->dy = bp->src[1];
	if (bv->src[1] != a->dy)
		return 0;
	loom_value r[2];
	if (loom_graph_readers(g, a->bwd_probs, r, 1) != 1 || r[0] != a->bwd_qk)
		return 0;
	/* The two shares of dqkv meet in one sum, and only there. */
	if (loom_graph_readers(g, a->bwd_qk, r, 1) != 1)
		return 0;
	a->sum = r[0];
	const loom_node *s = &g->nodes[a->sum];
	if (s->op != LOOM_OP_ADD || s->nsrc != 2 || s->a.ew.relu ||
	    !((s->src[0] == a->bwd_v && s->src[1] == a->bwd_qk) ||
	      (s->src[0] == a->bwd_qk && s->src[1] == a->bwd_v)))
		return 0;
	if (loom_graph_readers(g, a->bwd_v, r, 1) != 1 || r[0] != a->sum)
		return 0;
	loom_dtype dt = g->nodes[qkv].dtype;
	return g->nodes[a->dy].dtype == dt && s->dtype == dt && !kept(g, a->bwd_probs) &&
	       !kept(g, a->bwd_v) && !kept(g, a->bwd_qk);
}

static int find_pattern(const loom_graph *g, loom_value p, attn_nodes *a)
{
	const loom_node *pn = &g->nodes[p];
	loom_value r[4];
	int nr = loom_graph_readers(g, p, r, 3);
	memset(a, 0xff, sizeof(*a)); /* LOOM_NONE everywhere */
	a->probs = p;
	if (pn->op != LOOM_OP_ATTN_PROBS || pn->a.attn.fused || nr < 1 || kept(g, p))
		return 0;
	loom_value qkv = pn->src[0];
	for (int i = 0; i < nr; i++) {
		const loom_node *u = &g->nodes[r[i]];
		if (u->op == LOOM_OP_ATTENTION && u->src[0] == p && u->src[1] == qkv &&
		    a->attn == LOOM_NONE)
			a->attn = r[i];
		else if (u->op == LOOM_OP_ATTENTION_BWD_QKV && u->src[0] == p && a->bwd_v == LOOM_NONE)
			a->bwd_v = r[i];
		else if (u->op == LOOM_OP_ATTN_PROBS_BWD && u->src[1] == p && a->bwd_qk == LOOM_NONE)
			a->bwd_qk = r[i];
		else
			return 0;
	}
	if (a->attn == LOOM_NONE || !is_half(g->nodes[qkv].dtype) ||
	    g->nodes[a->attn].dtype != g->nodes[qkv].dtype)
		return 0;
	if (a->bwd_v == LOOM_NONE && a->bwd_qk == LOOM_NONE)
		return 1; /* forward only */
	if (a->bwd_v == LOOM_NONE || a->bwd_qk == LOOM_NONE)
		return 0;
	return find_backward(g, a, qkv);
}

/* Node v becomes a view of src that nobody reads: no kernel, no storage. */
static void make_dead_view(loom_graph *g, loom_value v, loom_value src)
{
	loom_node *n = &g->nodes[v];
	loom_fuse_make_view(g, v, src);
	n->shape = g->nodes[src].shape;
	n->dtype = g->nodes[src].dtype;
	memset(&n->a, 0, sizeof(n->a));
}

static void rewrite(loom_graph *g, const attn_nodes *a)
{
	loom_node *p = &g->nodes[a->probs];
	loom_value qkv = p->src[0];
	int nh = p->a.attn.n_head;
	int64_t d[3] = { g->nodes[qkv].shape.dims[0], nh, g->nodes[qkv].shape.dims[1] };
	p->shape = loom_shape_make(3, d);
	p->dtype = LOOM_F32;
	p->a.attn.fused = 1;
	/* y is made with the LSE, so it cannot read it (the memory plan
	 * refuses a value read where it is made): it keeps qkv alone. */
	loom_node *y = &g->nodes[a->attn];
	y->a.attn.fused = 1;
	y->made_by = a->probs;
	y->nsrc = 1;
	y->src[0] = qkv;
	y->src[1] = LOOM_NONE;
	if (a->sum == LOOM_NONE)
		return;
	loom_node *s = &g->nodes[a->sum];
	s->op = LOOM_OP_ATTN_PROBS_BWD;
	s->nsrc = 4;
	s->src[0] = qkv;
	s->src[1] = a->probs;
	s->src[2] = a->dy;
	s->src[3] = a->attn;
	memset(&s->a, 0, sizeof(s->a));
	s->a.attn.n_head = nh;
	s->a.attn.fused = 1;
	make_dead_view(g, a->bwd_probs, qkv);
	make_dead_view(g, a->bwd_v, qkv);
	make_dead_view(g, a->bwd_qk, qkv);
}

int loom_fuse_attention(loom_graph *g, loom_attn_fusable_fn fusable)
{
	int fused = 0;
	if (!fusable)
		return 0;
	for (loom_value v = 0; v < g->n; v++) {
		attn_nodes a;
		if (g->nodes[v].op != LOOM_OP_ATTN_PROBS || !find_pattern(g, v, &a))
			continue;
		if (!fusable(g, v, a.sum != LOOM_NONE))
			continue;
		rewrite(g, &a);
		fused++;
	}
	return fused;
}
