/*
 * graph/memplan.c — plans a compiled graph before step 1, in phases that
 * run top to bottom (the shape of ggml-alloc.c):
 *   schedule     the order the nodes run in (node order unless a pass
 *                reorders them), checked: every source is made first;
 *   siblings     the values a node makes besides its own (graph/fuse.c);
 *   liveness     which value owns whose storage (views alias their source),
 *                which owners are persistent, and the step each is last read;
 *   held         which owners this plan gives storage (a pipeline stage
 *                places only the values its nodes make or read);
 *   buckets      data parallelism's gradients, at their buckets' places;
 *   persistent   leaves, gradients and outputs, laid out once, never reused;
 *   activations  every other owner lives from the step that writes it to
 *                its last reader; a best-fit allocator reuses dead space;
 *                an in-place op's value takes over its dying source's bytes
 *                (src[0], or a unary backward's dy: LOOM_OPF_INPLACE_DY,
 *                LOOM_INPLACE_DY=0 never; the addend a LOOM_NODE_ACCUM
 *                node adds into) (kept when that plans no larger than
 *                without); a persistent LOOM_NODE_ACCUM sum lends its
 *                dying addend its own bytes instead.
 */
#include <stdlib.h>
#include <string.h>

#include "base/options.h"
#include "graph/memplan.h"
#include "graph/ops/ops.h"

/* Every value starts on a 64-byte boundary: what vector loads and
 * cuBLASLt's fastest paths want. */
#define ALIGN 64

static size_t align_up(size_t x)
{
	return (x + ALIGN - 1) & ~(size_t)(ALIGN - 1);
}

/* A stored fp8 value (graph/ops/ops.h): one byte an element and its scale. */
static size_t value_bytes(const loom_graph *g, loom_value v)
{
	int64_t numel = loom_shape_numel(&g->nodes[v].shape);
	if (loom_fp8_stored(&g->nodes[v]))
		return align_up(loom_fp8_stored_bytes(numel));
	return align_up(numel * loom_dtype_size(g->nodes[v].dtype));
}

/* A free block of the activation region. The list is kept sorted by offset
 * so that neighbours can be merged when a value dies. */
typedef struct block {
	size_t off, size;
} block;

typedef struct allocator {
	block *free;
	int nfree, cap;
	size_t top; /* high-water mark: the region's size */
} allocator;

static int alloc_insert(allocator *a, int at, block b)
{
	if (a->nfree == a->cap) {
		int cap = a->cap ? 2 * a->cap : 32;
		block *f = realloc(a->free, cap * sizeof(*f));
		if (!f)
			return -1;
		a->free = f;
		a->cap = cap;
	}
	memmove(&a->free[at + 1], &a->free[at], (a->nfree - at) * sizeof(block));
	a->free[at] = b;
	a->nfree++;
	return 0;
}

static void alloc_remove(allocator *a, int at)
{
	memmove(&a->free[at], &a->free[at + 1], (a->nfree - at - 1) * sizeof(block));
	a->nfree--;
}

/* Best fit: the smallest free block that holds size; else grow the top,
 * starting inside a free block that already touches it. */
static size_t alloc_take(allocator *a, size_t size)
{
	int best = -1;
	for (int i = 0; i < a->nfree; i++)
		if (a->free[i].size >= size && (best < 0 || a->free[i].size < a->free[best].size))
			best = i;
	if (best >= 0) {
		size_t off = a->free[best].off;
		a->free[best].off += size;
		a->free[best].size -= size;
		if (a->free[best].size == 0)
			alloc_remove(a, best);
		return off;
	}
	if (a->nfree > 0) {
		block *last = &a->free[a->nfree - 1];
		if (last->off + last->size == a->top) {
			size_t off = last->off;
			a->top = off + size;
			alloc_remove(a, a->nfree - 1);
			return off;
		}
	}
	size_t off = a->top;
	a->top += size;
	return off;
}

static int alloc_give(allocator *a, size_t off, size_t size)
{
	int at = 0;
	while (at < a->nfree && a->free[at].off < off)
		at++;
	if (alloc_insert(a, at, (block){ off, size }))
		return -1;
	/* merge with the next, then with the previous block */
	if (at + 1 < a->nfree && a->free[at].off + a->free[at].size == a->free[at + 1].off) {
		a->free[at].size += a->free[at + 1].size;
		alloc_remove(a, at + 1);
	}
	if (at > 0 && a->free[at - 1].off + a->free[at - 1].size == a->free[at].off) {
		a->free[at - 1].size += a->free[at].size;
		alloc_remove(a, at);
	}
	return 0;
}

/* Values that outlive a step: what the user feeds or reads, what the
 * optimizer updates, and what it reads after the step (gradients). */
static int is_persistent(const loom_node *n)
{
	return loom_op_is_leaf(n->op) || (n->flags & (LOOM_NODE_OUTPUT | LOOM_NODE_GRAD));
}

/* The working state of one planning run; the plan itself is mp. */
typedef struct planner {
	const loom_graph *g;
	loom_memplan *mp;
	int n;
	int *pos;     /* per node: its position in the schedule */
	int *made_at; /* per node: the position its value is written at (a
		       * sibling's is its maker's) */
	int *last;    /* per storage owner: the last position that reads it,
		       * itself or through an alias */
	/* The owners whose last read is at position i, as one array sliced by
	 * position (CSR): dead[dead_at[i] .. dead_at[i + 1]). */
	int *dead_at;
	loom_value *dead;
	/* Per owner: its bytes taken over by an in-place successor (apart
	 * from mp->inplace, which keeps each successor's source: a chain
	 * of them, a sum added into an addend that was itself a sum, is one
	 * storage for the offline placement). */
	unsigned char *taken;
	/* Per activation owner: the persistent LOOM_NODE_ACCUM sum that lends
	 * it its bytes (lend_addends), else LOOM_NONE. */
	loom_value *lent_to;
	int inplace_on; /* place_activations may write in place (LOOM_OPF_INPLACE) */
	int inplace_dy; /* ... and over a dy (LOOM_OPF_INPLACE_DY; LOOM_INPLACE_DY) */
} planner;

/* ---------------------------------------------------------------- schedule */

/* Positions, and where each value is written: a value made by another node
 * (made_by, graph/fuse.c) is written when that node runs, if it runs first. */
static loom_status schedule_init(planner *pl, const loom_value *order)
{
	const loom_graph *g = pl->g;
	loom_memplan *mp = pl->mp;
	for (int v = 0; v < pl->n; v++)
		pl->pos[v] = -1;
	for (int i = 0; i < pl->n; i++) {
		loom_value v = order ? order[i] : i;
		if (v < 0 || v >= pl->n || pl->pos[v] >= 0)
			return LOOM_ERR_INVALID; /* not a node, or twice */
		mp->schedule[i] = v;
		pl->pos[v] = i;
	}
	mp->nschedule = pl->n;
	for (int v = 0; v < pl->n; v++) {
		loom_value u = g->nodes[v].made_by;
		pl->made_at[v] = u != LOOM_NONE && pl->pos[u] < pl->pos[v] ? pl->pos[u] : pl->pos[v];
	}
	/* A sibling may read its maker (the one kernel makes both:
	 * graph/fuse.c's layer norm made by its residual add) and any leaf,
	 * which is there before the step starts (persistent). */
	for (int v = 0; v < pl->n; v++)
		for (int i = 0; i < g->nodes[v].nsrc; i++) {
			loom_value s = g->nodes[v].src[i];
			if (pl->made_at[s] >= pl->made_at[v] && s != g->nodes[v].made_by &&
			    !loom_op_is_leaf(g->nodes[s].op))
				return LOOM_ERR_INVALID; /* read before it is made */
		}
	return LOOM_OK;
}

/* Siblings, chained per maker in schedule order. */
static void chain_siblings(planner *pl)
{
	loom_memplan *mp = pl->mp;
	for (int v = 0; v < pl->n; v++)
		mp->sibling[v] = mp->sibling_next[v] = LOOM_NONE;
	for (int i = pl->n - 1; i >= 0; i--) {
		loom_value v = mp->schedule[i];
		loom_value u = pl->g->nodes[v].made_by;
		if (u != LOOM_NONE && pl->made_at[v] < pl->pos[v]) {
			mp->sibling_next[v] = mp->sibling[u];
			mp->sibling[u] = v;
		}
	}
}

/* ---------------------------------------------------------------- liveness */

static void liveness(planner *pl)
{
	const loom_graph *g = pl->g;
	loom_memplan *mp = pl->mp;
	/* A view's source is an earlier node: node order resolves roots. */
	for (int v = 0; v < pl->n; v++) {
		const loom_node *nd = &g->nodes[v];
		mp->root[v] = loom_op_is_view(nd->op) ? mp->root[nd->src[0]] : v;
		pl->last[v] = pl->pos[v];
	}
	/* An owner lives to its own step, its aliases' steps and every read of
	 * any of them; a persistent alias keeps its owner persistent. */
	for (int v = 0; v < pl->n; v++) {
		const loom_node *nd = &g->nodes[v];
		loom_value r = mp->root[v];
		for (int i = 0; i < nd->nsrc; i++) {
			loom_value s = mp->root[nd->src[i]];
			if (pl->last[s] < pl->pos[v])
				pl->last[s] = pl->pos[v];
		}
		if (pl->last[r] < pl->pos[v])
			pl->last[r] = pl->pos[v];
		if (is_persistent(nd))
			mp->region[r] = LOOM_REGION_PERSIST;
	}
}

static int is_held(const loom_memplan *mp, loom_value v)
{
	return !mp->held || mp->held[mp->root[v]];
}

static int is_act_owner(const planner *pl, loom_value v)
{
	return pl->mp->root[v] == v && pl->mp->region[v] == LOOM_REGION_ACT && is_held(pl->mp, v);
}

/* ------------------------------------------------------------------- held */

/* An owner is held when it or any of its aliases is: a stage that reads a
 * view needs the bytes behind it. Then every alias follows its owner. */
static loom_status mark_held(planner *pl, const unsigned char *held)
{
	loom_memplan *mp = pl->mp;
	if (!held)
		return LOOM_OK;
	mp->held = calloc((size_t)(pl->n > 0 ? pl->n : 1), 1);
	if (!mp->held)
		return LOOM_ERR_NOMEM;
	for (int v = 0; v < pl->n; v++)
		if (held[v])
			mp->held[mp->root[v]] = 1;
	for (int v = 0; v < pl->n; v++)
		mp->held[v] = mp->held[mp->root[v]];
	return LOOM_OK;
}

/* ----------------------------------------------------------------- buckets */

/* Each bucket's ALLREDUCE node owns its bucket; its gradients are views
 * into it at their offsets (nothing is copied before the all-reduce). */
static loom_status place_buckets(planner *pl, const loom_buckets *bk)
{
	loom_memplan *mp = pl->mp;
	for (int k = 0; k < bk->n; k++) {
		const loom_bucket *b = &bk->b[k];
		if (b->node < 0 || b->node >= pl->n)
			return LOOM_ERR_INVALID;
		mp->region[b->node] = LOOM_REGION_BUCKET;
		mp->offset[b->node] = b->base;
		for (int i = b->first; i < b->first + b->n; i++) {
			loom_value v = bk->grad[i];
			if (v < 0 || v >= pl->n || mp->root[v] != v)
				return LOOM_ERR_INVALID; /* a view cannot move into a bucket */
			mp->region[v] = LOOM_REGION_BUCKET;
			mp->offset[v] = b->base + bk->offset[i];
		}
	}
	return LOOM_OK;
}

/* The activation owners that die at each position, for the allocator. */
static loom_status death_lists(planner *pl)
{
	int n = pl->n;
	pl->dead_at = calloc((size_t)n + 1, sizeof(int));
	pl->dead = malloc(sizeof(loom_value) * (n ? n : 1));
	if (!pl->dead_at || !pl->dead)
		return LOOM_ERR_NOMEM;
	for (int v = 0; v < n; v++)
		if (is_act_owner(pl, v))
			pl->dead_at[pl->last[v] + 1]++;
	for (int i = 0; i < n; i++)
		pl->dead_at[i + 1] += pl->dead_at[i];
	/* Fill in node order, so each position lists its dead by node id (the
	 * order they are released in, which decides the offsets). */
	int *fill = calloc(n ? n : 1, sizeof(int));
	if (!fill)
		return LOOM_ERR_NOMEM;
	for (int v = 0; v < n; v++)
		if (is_act_owner(pl, v)) {
			int at = pl->last[v];
			pl->dead[pl->dead_at[at] + fill[at]++] = v;
		}
	free(fill);
	return LOOM_OK;
}

/* -------------------------------------------------------------- placement */

/*
 * A persistent sum made by adding into its last source (a tied table's
 * gradient, graph/fuse.c's loom_fuse_emb_bwd_accum) cannot take over
 * that source's activation bytes; instead the source, where it dies at
 * the sum and has its dtype and size, is placed in the sum's own bytes
 * (the product writes the gradient, the sum adds into it: llm.c's dW +=).
 * The source then leaves the activation region.
 */
static void lend_addends(planner *pl)
{
	const loom_graph *g = pl->g;
	loom_memplan *mp = pl->mp;
	for (loom_value v = 0; v < pl->n; v++) {
		const loom_node *nd = &g->nodes[v];
		pl->lent_to[v] = LOOM_NONE;
		if (!(nd->flags & LOOM_NODE_ACCUM) || nd->nsrc < 1 || mp->root[v] != v ||
		    mp->region[v] == LOOM_REGION_ACT || (nd->flags & LOOM_NODE_SHARDED) ||
		    nd->made_by != LOOM_NONE || !is_held(mp, v))
			continue;
		loom_value a = mp->root[nd->src[nd->nsrc - 1]];
		int other = 0;
		for (int k = 0; k < nd->nsrc - 1; k++)
			other |= mp->root[nd->src[k]] == a;
		if (other || !is_act_owner(pl, a) || pl->last[a] != pl->pos[v] ||
		    g->nodes[a].dtype != nd->dtype || value_bytes(g, a) != value_bytes(g, v))
			continue;
		pl->lent_to[a] = v;
		mp->region[a] = mp->region[v];
	}
}

/* The lent sources' places: their sums' (after the persistent and bucket
 * placements). */
static void place_lent(planner *pl)
{
	for (loom_value a = 0; a < pl->n; a++) {
		loom_value v = pl->lent_to[a];
		if (v == LOOM_NONE)
			continue;
		pl->mp->offset[a] = pl->mp->offset[v];
		pl->mp->inplace[v] = a;
	}
}

/* Persistent region: in schedule order, one after the other, never reused.
 * A sharded value (LOOM_NODE_SHARDED) has no place here: its owner keeps it. */
static size_t place_persistent(planner *pl)
{
	loom_memplan *mp = pl->mp;
	size_t top = 0;
	for (int i = 0; i < pl->n; i++) {
		loom_value v = mp->schedule[i];
		if (mp->root[v] != v || mp->region[v] != LOOM_REGION_PERSIST ||
		    pl->lent_to[v] != LOOM_NONE ||
		    (pl->g->nodes[v].flags & LOOM_NODE_SHARDED) || !is_held(mp, v))
			continue;
		mp->offset[v] = top;
		top += value_bytes(pl->g, v);
	}
	return top;
}

/* Whether owner s (read by v's node for the last time at i) may give v
 * its bytes: an activation, not yet taken over, of v's dtype and size. */
static int can_take(const planner *pl, loom_value v, loom_value s, int i)
{
	const loom_graph *g = pl->g;
	return is_act_owner(pl, s) && pl->last[s] == i && !pl->taken[s] &&
	       g->nodes[s].dtype == g->nodes[v].dtype && value_bytes(g, s) == value_bytes(g, v);
}

/*
 * The source whose bytes node v (at position i) may write its own value
 * over: the last source's owner of a node flagged LOOM_NODE_ACCUM (the
 * addend it adds into, where no other source shares its bytes), its
 * src[0]'s for an op flagged LOOM_OPF_INPLACE, else its src[1]'s for one
 * flagged LOOM_OPF_INPLACE_DY (a unary backward over its dy, where
 * pl->inplace_dy), when can_take says so. LOOM_NONE otherwise.
 */
static loom_value inplace_source(const planner *pl, loom_value v, int i)
{
	const loom_graph *g = pl->g;
	const loom_node *nd = &g->nodes[v];
	const unsigned fl = loom_op_defs[nd->op]->flags;
	if (!pl->inplace_on || nd->made_by != LOOM_NONE)
		return LOOM_NONE;
	if ((nd->flags & LOOM_NODE_ACCUM) && nd->nsrc >= 1) {
		/* A sum made by adding into its last source (graph/fuse.c). */
		loom_value s = pl->mp->root[nd->src[nd->nsrc - 1]];
		int other = 0;
		for (int k = 0; k < nd->nsrc - 1; k++)
			other |= pl->mp->root[nd->src[k]] == s;
		return !other && can_take(pl, v, s, i) ? s : LOOM_NONE;
	}
	if ((fl & LOOM_OPF_INPLACE) && nd->nsrc >= 1 && can_take(pl, v, pl->mp->root[nd->src[0]], i))
		return pl->mp->root[nd->src[0]];
	if ((fl & LOOM_OPF_INPLACE_DY) && pl->inplace_dy && nd->nsrc >= 2) {
		loom_value s = pl->mp->root[nd->src[1]];
		/* Never over the other source's bytes too (x and dy one value). */
		if (s != pl->mp->root[nd->src[0]] && can_take(pl, v, s, i))
			return s;
	}
	return LOOM_NONE;
}

/*
 * Activation region: each step places what it writes (its own value and
 * its siblings'), then releases the owners read for the last time. Placing
 * before releasing means a node never writes over what it reads, so
 * kernels need not care whether their output aliases an input; except an
 * op flagged LOOM_OPF_INPLACE, whose value takes its dying source's bytes
 * (the source is then not released: its bytes live on as the value's).
 * pl->taken[s] marks a source taken over; mp->inplace[w] names w's.
 */
static loom_status place_activations(planner *pl, allocator *a)
{
	loom_memplan *mp = pl->mp;
	a->nfree = 0;
	a->top = 0;
	mp->act_naive_bytes = 0;
	for (int v = 0; v < pl->n; v++) {
		mp->inplace[v] = LOOM_NONE;
		pl->taken[v] = 0;
	}
	for (int i = 0; i < pl->n; i++) {
		loom_value v = mp->schedule[i];
		if (pl->made_at[v] == i) {
			for (loom_value w = v; w != LOOM_NONE;
			     w = w == v ? mp->sibling[v] : mp->sibling_next[w]) {
				if (!is_act_owner(pl, w))
					continue;
				size_t sz = value_bytes(pl->g, w);
				loom_value s = w == v ? inplace_source(pl, v, i) : LOOM_NONE;
				mp->region[w] = LOOM_REGION_ACT;
				mp->act_naive_bytes += sz;
				if (s != LOOM_NONE) {
					mp->offset[w] = mp->offset[s];
					mp->inplace[w] = s;
					pl->taken[s] = 1;
				} else {
					mp->offset[w] = alloc_take(a, sz);
				}
			}
		}
		for (int k = pl->dead_at[i]; k < pl->dead_at[i + 1]; k++) {
			loom_value d = pl->dead[k];
			if (pl->taken[d])
				continue; /* its bytes are its in-place successor's now */
			if (alloc_give(a, mp->offset[d], value_bytes(pl->g, d)))
				return LOOM_ERR_NOMEM;
		}
	}
	return LOOM_OK;
}

/* One storage of the activation region for the offline placement: an
 * owner and the owners written in place over it after it (one chain of
 * LOOM_OPF_INPLACE successors, all of one size), alive from the first's
 * write to the last's last read, both positions included. */
typedef struct group {
	int start, end;
	size_t size, off;
} group;

/* Largest first; then earliest; then the group's number. */
typedef struct group_key {
	size_t size;
	int start, id;
} group_key;

static int by_size(const void *a, const void *b)
{
	const group_key *x = a, *y = b;
	if (x->size != y->size)
		return x->size > y->size ? -1 : 1;
	if (x->start != y->start)
		return x->start < y->start ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

/* Groups in schedule order: a successor joins its source's group. gid[v]
 * is v's group, -1 where v is no activation owner. Returns how many. */
static int make_groups(const planner *pl, int *gid, group *gr)
{
	const loom_memplan *mp = pl->mp;
	const int n = pl->n;
	int ng = 0;

	for (int i = 0; i < n; i++) {
		loom_value v = mp->schedule[i];
		gid[v] = -1;
	}
	for (int i = 0; i < n; i++) {
		loom_value v = mp->schedule[i];
		if (pl->made_at[v] != i)
			continue;
		for (loom_value w = v; w != LOOM_NONE; w = w == v ? mp->sibling[v] : mp->sibling_next[w]) {
			if (!is_act_owner(pl, w))
				continue;
			loom_value s = mp->inplace[w];
			int end = pl->last[w] > i ? pl->last[w] : i;
			if (s != LOOM_NONE && s != w && gid[s] >= 0) {
				gid[w] = gid[s];
				if (end > gr[gid[w]].end)
					gr[gid[w]].end = end;
				continue;
			}
			gid[w] = ng;
			gr[ng++] = (group){ .start = i, .end = end, .size = value_bytes(pl->g, w) };
		}
	}
	return ng;
}

/* The lowest offset where x overlaps no placed group alive with it; near
 * holds the np groups placed so far, by offset. */
static size_t lowest_fit(const group *gr, const int *near, int np, const group *x)
{
	size_t off = 0;
	for (int j = 0; j < np; j++) {
		const group *y = &gr[near[j]];
		if (!(y->start <= x->end && x->start <= y->end))
			continue; /* never alive with x */
		if (y->off >= off + x->size)
			break; /* the gap before y holds x */
		if (y->off + y->size > off)
			off = y->off + y->size;
	}
	return off;
}

/* Places the ng groups largest first, each at its lowest fit; the region's
 * size in *top. */
static loom_status place_groups(group *gr, int ng, size_t *top)
{
	group_key *key = malloc(sizeof(group_key) * (size_t)(ng ? ng : 1));
	int *near = malloc(sizeof(int) * (size_t)(ng ? ng : 1)); /* the placed, by offset */
	int np = 0;
	if (!key || !near) {
		free(key);
		free(near);
		return LOOM_ERR_NOMEM;
	}
	for (int k = 0; k < ng; k++)
		key[k] = (group_key){ gr[k].size, gr[k].start, k };
	qsort(key, (size_t)ng, sizeof(group_key), by_size);
	*top = 0;
	for (int k = 0; k < ng; k++) {
		group *x = &gr[key[k].id];
		size_t off = lowest_fit(gr, near, np, x);
		int at = np; /* where x goes in the offset order */
		x->off = off;
		while (at > 0 && gr[near[at - 1]].off > off)
			at--;
		memmove(&near[at + 1], &near[at], sizeof(int) * (size_t)(np - at));
		near[at] = key[k].id;
		np++;
		if (off + x->size > *top)
			*top = off + x->size;
	}
	free(key);
	free(near);
	return LOOM_OK;
}

/*
 * Offline placement of what place_activations just placed (the same
 * lifetimes and in-place chains): largest first, each at the lowest offset
 * that no storage alive at the same time holds ("greedy by size",
 * Pisarchyk and Lee, 2020). Best fit, on line, cannot see that a value
 * made late (an activation made again in the backward, graph/recompute.c)
 * needs a hole the forward's values have since split: GPT-2 124M O2 with
 * recompute 1 placed 898 MiB over a live peak of 800. Kept when smaller
 * (LOOM_MEMPLAN_BY_SIZE=0: never; =1: always, for tests).
 */
static loom_status place_by_size(planner *pl, allocator *a)
{
	loom_memplan *mp = pl->mp;
	const char *e = loom_opt_env(LOOM_OPT_MEMPLAN_BY_SIZE);
	const int mode = e && !strcmp(e, "0") ? 0 : e && !strcmp(e, "1") ? 2 : 1;
	const int n = pl->n;
	loom_status st = LOOM_OK;
	size_t top = 0;
	if (mode == 0 || n == 0)
		return LOOM_OK;
	int *gid = malloc(sizeof(int) * (size_t)n);
	group *gr = calloc((size_t)n, sizeof(*gr));
	if (!gid || !gr) {
		st = LOOM_ERR_NOMEM;
		goto out;
	}
	st = place_groups(gr, make_groups(pl, gid, gr), &top);
	if (st == LOOM_OK && (mode == 2 || top < a->top)) {
		for (int i = 0; i < n; i++) {
			loom_value v = mp->schedule[i];
			if (gid[v] >= 0)
				mp->offset[v] = gr[gid[v]].off;
		}
		a->top = top;
	}
out:
	free(gid);
	free(gr);
	return st;
}

/*
 * Places the activations with in-place writes and, when any was taken,
 * also without; keeps the smaller region (in place on a tie); then the
 * offline placement of that one, where smaller. Writing in
 * place never adds live bytes, but the merged value is placed where its
 * source was, early, and best fit can then leave a hole later: a GPT whose
 * peak is elsewhere than its loss can plan smaller without. At a large
 * vocabulary the loss is the peak and in place wins by a [B*T, V] buffer.
 */
static loom_status place_activations_best(planner *pl, allocator *a)
{
	loom_status st;
	int any = 0;
	pl->inplace_on = 1;
	if ((st = place_activations(pl, a)) != LOOM_OK)
		return st;
	for (int v = 0; v < pl->n && !any; v++)
		any = pl->mp->inplace[v] != LOOM_NONE;
	if (!any)
		return place_by_size(pl, a);
	size_t with = a->top;
	pl->inplace_on = 0;
	if ((st = place_activations(pl, a)) != LOOM_OK)
		return st;
	if (a->top < with)
		return place_by_size(pl, a);
	pl->inplace_on = 1;
	if ((st = place_activations(pl, a)) != LOOM_OK)
		return st;
	return place_by_size(pl, a);
}

/* Aliases take their owner's place, a view view_off bytes into its
 * source's (node order: the source's place is final). */
static void resolve_aliases(const loom_graph *g, loom_memplan *mp, int n)
{
	for (int v = 0; v < n; v++) {
		const loom_node *nd = &g->nodes[v];
		mp->region[v] = mp->region[mp->root[v]];
		mp->offset[v] = mp->root[v] == v ? mp->offset[v] :
				loom_op_is_view(nd->op) ? mp->offset[nd->src[0]] + nd->view_off :
							  mp->offset[mp->root[v]];
	}
}

/* ------------------------------------------------------------------- build */

static loom_status plan_alloc(loom_memplan *mp, planner *pl, int n)
{
	size_t m = n ? (size_t)n : 1;
	mp->schedule = malloc(sizeof(loom_value) * m);
	mp->offset = calloc(m, sizeof(size_t));
	mp->region = calloc(m, 1);
	mp->root = malloc(sizeof(loom_value) * m);
	mp->inplace = malloc(sizeof(loom_value) * m);
	mp->sibling = malloc(sizeof(loom_value) * m);
	mp->sibling_next = malloc(sizeof(loom_value) * m);
	pl->pos = malloc(sizeof(int) * m);
	pl->made_at = malloc(sizeof(int) * m);
	pl->last = malloc(sizeof(int) * m);
	pl->taken = calloc(m, 1);
	pl->lent_to = malloc(sizeof(loom_value) * m);
	if (!pl->lent_to || !mp->schedule || !mp->offset || !mp->region || !mp->root || !mp->inplace ||
	    !mp->sibling || !mp->sibling_next || !pl->pos || !pl->made_at || !pl->last ||
	    !pl->taken)
		return LOOM_ERR_NOMEM;
	for (int v = 0; v < n; v++)
		mp->inplace[v] = LOOM_NONE;
	return LOOM_OK;
}

static void planner_free(planner *pl)
{
	free(pl->pos);
	free(pl->made_at);
	free(pl->last);
	free(pl->taken);
	free(pl->lent_to);
	free(pl->dead_at);
	free(pl->dead);
}

loom_status loom_memplan_build_held(const loom_graph *g, const loom_value *order,
				    const loom_buckets *buckets, const unsigned char *held,
				    loom_memplan *mp)
{
	planner pl = { .g = g, .mp = mp, .n = g->n };
	const char *dy_env = loom_opt_env(LOOM_OPT_INPLACE_DY);
	pl.inplace_dy = !(dy_env && !strcmp(dy_env, "0"));
	allocator a = { 0 };
	loom_status st;
	memset(mp, 0, sizeof(*mp));
	if ((st = plan_alloc(mp, &pl, g->n)) != LOOM_OK)
		goto out_free;
	if ((st = schedule_init(&pl, order)) != LOOM_OK)
		goto out_free;
	chain_siblings(&pl);
	liveness(&pl);
	if ((st = mark_held(&pl, held)) != LOOM_OK)
		goto out_free;
	if (buckets && (st = place_buckets(&pl, buckets)) != LOOM_OK)
		goto out_free;
	lend_addends(&pl);
	if ((st = death_lists(&pl)) != LOOM_OK)
		goto out_free;
	mp->persist_bytes = place_persistent(&pl);
	if ((st = place_activations_best(&pl, &a)) != LOOM_OK)
		goto out_free;
	place_lent(&pl);
	resolve_aliases(g, mp, g->n);
	mp->act_bytes = a.top;
	mp->regions[LOOM_REGION_ACT] = (loom_region){ "activations", mp->act_bytes, 1 };
	mp->regions[LOOM_REGION_PERSIST] = (loom_region){ "persistent", mp->persist_bytes, 0 };
	mp->regions[LOOM_REGION_WORKSPACE] = (loom_region){ "workspace", 0, 1 };
	mp->regions[LOOM_REGION_BUCKET] = (loom_region){ "buckets", buckets ? buckets->bytes : 0, 0 };
	mp->bucket_bytes = buckets ? buckets->bytes : 0;
	free(a.free);
	planner_free(&pl);
	return LOOM_OK;

out_free:
	free(a.free);
	planner_free(&pl);
	loom_memplan_free(mp);
	return st;
}

loom_status loom_memplan_build_buckets(const loom_graph *g, const loom_value *order,
				       const loom_buckets *buckets, loom_memplan *mp)
{
	return loom_memplan_build_held(g, order, buckets, NULL, mp);
}

loom_status loom_memplan_build_ordered(const loom_graph *g, const loom_value *order,
				       loom_memplan *mp)
{
	return loom_memplan_build_buckets(g, order, NULL, mp);
}

loom_status loom_memplan_build(const loom_graph *g, loom_memplan *mp)
{
	return loom_memplan_build_ordered(g, NULL, mp);
}

void loom_memplan_free(loom_memplan *mp)
{
	free(mp->schedule);
	free(mp->offset);
	free(mp->region);
	free(mp->root);
	free(mp->inplace);
	free(mp->sibling);
	free(mp->sibling_next);
	free(mp->held);
	memset(mp, 0, sizeof(*mp));
}
