/*
 * graph/recompute.c — activation recomputation (llm.c's -r, Megatron's
 * selective recompute): a forward value that the backward reads is made
 * again just before its first backward reader, from sources that are alive
 * there anyway, and every backward reader reads the copy. The forward value
 * then dies at its last forward reader, so the memory plan no longer holds
 * it across the step's middle, where the peak is.
 *
 * Only ops that are pure and cheap beside what they save are made again:
 * the transformers' activation functions (level 1: GELU in both forms,
 * SiLU), the norms (level 2 adds layer norm and RMS norm) and the
 * attention probabilities (level 3 adds softmax(q k^T), [B, NH, T, T]:
 * Megatron's selective recompute; not where the backend runs attention as
 * one fused kernel that keeps no T x T matrix), and the casts and views between
 * one of them and its backward reader (O1 runs layer norm in fp32 and
 * casts its output for the next product). Not relu: a CNN's relus are
 * fused into the batch norm, add, pool or product before them (graph/
 * fuse.c), and a copy in the backward only adds a buffer (the ConvNet's
 * plan grew from 18.5 to 22.1 MiB with them). A value is made again only
 * where none of its sources has to be kept longer for it (each is a leaf,
 * read by the backward at or after the copy's place anyway, or made again
 * itself), so the live bytes never grow, and no user reads it.
 *
 * The copies are ordinary nodes of the backward (LOOM_NODE_BACKWARD, bwd_of
 * the value they copy, named "<name>.recompute"): the same kernel on the
 * same inputs, so a step computes the same bits as without them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/ops/ops.h"

/* Whether node v's op may be made again at this level (a negative level:
 * that level, without the attention probabilities): the op table's row says
 * from which level (loom_op_def.recompute). Attention's probabilities are
 * not made again where the backend keeps none (one fused kernel). */
static int recomputable_op(const loom_node *n, int level)
{
	const int keep_probs = level < 0;
	const int from = loom_op_defs[n->op]->recompute;
	if (keep_probs)
		level = -level;
	if (!from || level < from)
		return 0;
	if (n->op == LOOM_OP_ATTN_PROBS)
		return !keep_probs && !n->a.attn.fused;
	return 1;
}

int loom_recompute_has_ops(const loom_graph *g, int n_fwd, int level)
{
	for (loom_value v = 0; v < n_fwd && v < g->n; v++)
		if (recomputable_op(&g->nodes[v], level))
			return 1;
	return 0;
}

typedef struct rc_state {
	const loom_graph *g;
	int n_fwd, level;
	int *last_read; /* each value's last reader (old numbering), -1: none */
	int *first_bwd; /* each value's first backward reader, -1: none */
	int *at;        /* where v's copy goes (before that node), -1: no copy */
	int n_copies;
} rc_state;

/* Whether v is a view whose storage is, at its root, a leaf's (a parameter
 * seen reshaped): alive for the whole step, never worth a copy. */
static int leaf_rooted(const loom_graph *g, loom_value v)
{
	for (int d = 0; d < 8 && v != LOOM_NONE; d++) {
		const loom_node *n = &g->nodes[v];
		if (loom_op_is_leaf(n->op))
			return 1;
		if (!loom_op_is_view(n->op) || n->nsrc < 1)
			return 0;
		v = n->src[0];
	}
	return 0;
}

/* A forward value no user reads and no sibling makes, whose op may be made
 * again, or a cast or view of such a value (depth: how far down the chain
 * may go; a layer norm's output, cast for the next product and seen as
 * rows, is three deep). */
static int reaches(const rc_state *s, loom_value v, int depth)
{
	const loom_node *n = &s->g->nodes[v];
	if (v >= s->n_fwd || (n->flags & (LOOM_NODE_OUTPUT | LOOM_NODE_GRAD)) ||
	    n->made_by != LOOM_NONE || loom_op_is_leaf(n->op))
		return 0;
	if (recomputable_op(n, s->level))
		return 1;
	return (n->op == LOOM_OP_CAST || loom_op_is_view(n->op)) && n->nsrc >= 1 &&
	       depth < 3 && n->src[0] != LOOM_NONE && reaches(s, n->src[0], depth + 1);
}

/* A source that needs no copy before `at`: a leaf or a view of one, or a
 * value the plan keeps to `at` or later anyway. */
static int free_at(const rc_state *s, loom_value x, int at)
{
	return loom_op_is_leaf(s->g->nodes[x].op) || leaf_rooted(s->g, x) || s->last_read[x] >= at;
}

/* Could v be made again before node `at` without keeping any source longer
 * than the plan keeps it now? */
static int can(const rc_state *s, loom_value v, int at, int depth)
{
	const loom_node *n = &s->g->nodes[v];
	for (int i = 0; i < n->nsrc; i++) {
		loom_value x = n->src[i];
		if (x == LOOM_NONE || s->at[x] >= 0 || free_at(s, x, at))
			continue;
		if (depth >= 3 || !reaches(s, x, 0) || !can(s, x, at, depth + 1))
			return 0;
	}
	return 1;
}

/* Marks v's copy before `at` (earlier if it has one later), and its sources'
 * copies where they need one. */
static void make(rc_state *s, loom_value v, int at)
{
	const loom_node *n = &s->g->nodes[v];
	if (s->at[v] < 0)
		s->n_copies++;
	if (s->at[v] < 0 || at < s->at[v])
		s->at[v] = at;
	for (int i = 0; i < n->nsrc; i++) {
		loom_value x = n->src[i];
		if (x == LOOM_NONE)
			continue;
		/* a source with a copy: the copy goes first */
		if (s->at[x] >= 0 || !free_at(s, x, at))
			make(s, x, s->at[v]);
	}
}

static loom_value remap(const loom_value *map, loom_value v)
{
	return v == LOOM_NONE ? LOOM_NONE : map[v];
}

/* Rebuilds g's node array with each copy before its place, sources in
 * graph order, renumbering every reference; backward readers read the
 * copies. */
static loom_status insert_copies(loom_graph *g, rc_state *s, int *n_fwd, loom_value *loss)
{
	int n_old = g->n, n_new = g->n + s->n_copies;
	loom_node *nodes = calloc((size_t)n_new, sizeof(*nodes));
	loom_value *map = malloc(sizeof(*map) * (size_t)n_old);
	loom_value *copy = malloc(sizeof(*copy) * (size_t)n_old);
	if (!nodes || !map || !copy) {
		free(nodes);
		free(map);
		free(copy);
		return LOOM_ERR_NOMEM;
	}
	int k = 0, fwd = 0;
	for (int v = 0; v < n_old; v++)
		copy[v] = LOOM_NONE;
	/* where each copy lands, in old numbering's order of places */
	for (int v = 0; v < n_old; v++) {
		for (int x = 0; x < *n_fwd; x++) {
			if (s->at[x] != v)
				continue;
			loom_node *nd = &nodes[k];
			*nd = g->nodes[x];
			nd->flags = (nd->flags & ~(uint32_t)(LOOM_NODE_OUTPUT | LOOM_NODE_STAGE_CUT)) |
				    LOOM_NODE_BACKWARD;
			nd->grad = nd->master = nd->made_by = LOOM_NONE;
			nd->bwd_of = x; /* old numbering: remapped below */
			if (g->nodes[x].name[0])
				snprintf(nd->name, sizeof(nd->name), "%.50s.recompute", g->nodes[x].name);
			else
				snprintf(nd->name, sizeof(nd->name), "%.30s#%d.recompute",
					 loom_op_defs[g->nodes[x].op]->name, x);
			copy[x] = k++;
		}
		nodes[k] = g->nodes[v];
		map[v] = k++;
		if (v < *n_fwd)
			fwd++;
	}
	/* Sources: a copy reads its sources' copies where they have one; a
	 * backward node reads copies; forward nodes the originals. */
	for (int v = 0; v < n_old; v++) {
		loom_node *nd = &nodes[map[v]];
		for (int i = 0; i < nd->nsrc; i++) {
			loom_value x = nd->src[i];
			nd->src[i] = v >= *n_fwd && x != LOOM_NONE && copy[x] != LOOM_NONE ?
					     copy[x] :
					     remap(map, x);
		}
		nd->grad = remap(map, nd->grad);
		nd->master = remap(map, nd->master);
		nd->made_by = remap(map, nd->made_by);
		nd->bwd_of = remap(map, nd->bwd_of);
	}
	for (int x = 0; x < *n_fwd; x++) {
		if (copy[x] == LOOM_NONE)
			continue;
		loom_node *nd = &nodes[copy[x]];
		for (int i = 0; i < nd->nsrc; i++) {
			loom_value y = nd->src[i];
			nd->src[i] = y != LOOM_NONE && copy[y] != LOOM_NONE ? copy[y] : remap(map, y);
		}
		nd->bwd_of = map[x];
	}
	*loss = remap(map, *loss);
	*n_fwd = fwd;
	free(g->nodes);
	free(map);
	free(copy);
	g->nodes = nodes;
	g->n = g->cap = n_new;
	return LOOM_OK;
}

loom_status loom_recompute_pass(loom_graph *g, int level, int keep_probs, int *n_fwd,
				loom_value *loss, int *n_copies)
{
	rc_state s = { .g = g, .n_fwd = *n_fwd, .level = keep_probs && level >= 3 ? -level : level };
	loom_status st = LOOM_OK;
	*n_copies = 0;
	if (level <= 0 || g->n == 0 || *n_fwd >= g->n)
		return LOOM_OK;
	s.last_read = malloc(sizeof(int) * (size_t)g->n);
	s.first_bwd = malloc(sizeof(int) * (size_t)g->n);
	s.at = malloc(sizeof(int) * (size_t)g->n);
	if (!s.last_read || !s.first_bwd || !s.at) {
		st = LOOM_ERR_NOMEM;
		goto out;
	}
	for (int v = 0; v < g->n; v++)
		s.last_read[v] = s.first_bwd[v] = s.at[v] = -1;
	for (int u = 0; u < g->n; u++) {
		const loom_node *n = &g->nodes[u];
		/* a value a sibling makes is made at its maker's place */
		int place = n->made_by != LOOM_NONE && n->made_by < u ? n->made_by : u;
		for (int i = 0; i < n->nsrc; i++) {
			loom_value x = n->src[i];
			if (x == LOOM_NONE)
				continue;
			if (place > s.last_read[x])
				s.last_read[x] = place;
			if (u >= *n_fwd && (s.first_bwd[x] < 0 || place < s.first_bwd[x]))
				s.first_bwd[x] = place;
		}
	}
	for (loom_value v = 0; v < *n_fwd; v++) {
		int at = s.first_bwd[v];
		if (at < 0 || s.at[v] >= 0 || !reaches(&s, v, 0) || !can(&s, v, at, 0))
			continue;
		make(&s, v, at);
	}
	if (s.n_copies > 0)
		st = insert_copies(g, &s, n_fwd, loss);
	if (st == LOOM_OK)
		*n_copies = s.n_copies;
out:
	if (st == LOOM_ERR_NOMEM)
		loom_graph_fail(g, st, "recompute pass: out of memory");
	free(s.last_read);
	free(s.first_bwd);
	free(s.at);
	return st;
}
