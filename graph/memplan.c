/*
 * graph/memplan.c — places every value of a compiled graph in one arena
 * before step 1. Persistent values (inputs, parameters, buffers, gradients,
 * outputs) get their own region; every other value lives from the node that
 * writes it to its last reader, and a best-fit allocator reuses the space of
 * dead values, in execution order. Reshapes alias their source.
 */
#include <stdlib.h>
#include <string.h>

#include "graph/memplan.h"
#include "graph/ops/ops.h"

#define ALIGN 64

static size_t align_up(size_t x)
{
	return (x + ALIGN - 1) & ~(size_t)(ALIGN - 1);
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

static int is_persistent(const loom_node *n)
{
	return loom_op_is_leaf(n->op) || (n->flags & (LOOM_NODE_OUTPUT | LOOM_NODE_GRAD));
}

loom_status loom_memplan_build(const loom_graph *g, loom_memplan *mp)
{
	int n = g->n;
	memset(mp, 0, sizeof(*mp));
	mp->offset = calloc(n ? n : 1, sizeof(size_t));
	mp->region = calloc(n ? n : 1, 1);
	mp->root = malloc(sizeof(loom_value) * (n ? n : 1));
	mp->sibling = malloc(sizeof(loom_value) * (n ? n : 1));
	mp->sibling_next = malloc(sizeof(loom_value) * (n ? n : 1));
	int *last = malloc(sizeof(int) * (n ? n : 1));
	allocator a = { 0 };
	if (!mp->offset || !mp->region || !mp->root || !mp->sibling || !mp->sibling_next || !last)
		goto out_nomem;

	/* Siblings, chained per maker in node order. */
	for (int v = 0; v < n; v++)
		mp->sibling[v] = mp->sibling_next[v] = LOOM_NONE;
	for (int v = n - 1; v >= 0; v--) {
		loom_value u = g->nodes[v].made_by;
		if (u != LOOM_NONE && u < v) {
			mp->sibling_next[v] = mp->sibling[u];
			mp->sibling[u] = v;
		}
	}

	/* Roots: a reshape shares its source's storage. */
	for (int v = 0; v < n; v++) {
		const loom_node *nd = &g->nodes[v];
		mp->root[v] = loom_op_is_view(nd->op) ? mp->root[nd->src[0]] : v;
		last[v] = v;
	}
	for (int v = 0; v < n; v++) {
		const loom_node *nd = &g->nodes[v];
		for (int i = 0; i < nd->nsrc; i++) {
			loom_value r = mp->root[nd->src[i]];
			if (last[r] < v)
				last[r] = v;
		}
		/* A persistent alias keeps its root persistent. */
		if (is_persistent(nd))
			mp->region[mp->root[v]] = LOOM_REGION_PERSIST;
		if (last[mp->root[v]] < last[v])
			last[mp->root[v]] = last[v];
	}

	/* Persistent region: in node order, never reused. */
	size_t persist = 0;
	for (int v = 0; v < n; v++) {
		if (mp->root[v] != v || mp->region[v] != LOOM_REGION_PERSIST)
			continue;
		mp->offset[v] = persist;
		persist += align_up(loom_shape_numel(&g->nodes[v].shape) *
				    loom_dtype_size(g->nodes[v].dtype));
	}

	/* Activation region: allocate at definition, free after the last read.
	 * The output is placed before this node's dead inputs are released, so
	 * a node never writes over what it reads. */
	int **dies = calloc(n ? n : 1, sizeof(int *));
	int *ndies = calloc(n ? n : 1, sizeof(int));
	if (!dies || !ndies) {
		free(dies);
		free(ndies);
		goto out_nomem;
	}
	for (int v = 0; v < n; v++)
		if (mp->root[v] == v && mp->region[v] != LOOM_REGION_PERSIST)
			ndies[last[v]]++;
	for (int v = 0; v < n; v++) {
		dies[v] = ndies[v] ? malloc(sizeof(int) * ndies[v]) : NULL;
		ndies[v] = 0;
	}
	for (int v = 0; v < n; v++)
		if (mp->root[v] == v && mp->region[v] != LOOM_REGION_PERSIST)
			dies[last[v]][ndies[last[v]]++] = v;

	/* A value another node makes (made_by, graph/fuse.c) is placed when
	 * that node is, before the frees after it. */
	loom_value *sibling = mp->sibling, *next = mp->sibling_next;

	size_t naive = 0;
	int fail = 0;
	for (int v = 0; v < n && !fail; v++) {
		if (g->nodes[v].made_by != LOOM_NONE && g->nodes[v].made_by < v)
			goto release; /* placed with its maker */
		for (loom_value w = v; w != LOOM_NONE; w = w == v ? sibling[v] : next[w]) {
			if (mp->root[w] != w || mp->region[w] == LOOM_REGION_PERSIST)
				continue;
			size_t sz = align_up(loom_shape_numel(&g->nodes[w].shape) *
					     loom_dtype_size(g->nodes[w].dtype));
			mp->region[w] = LOOM_REGION_ACT;
			mp->offset[w] = alloc_take(&a, sz);
			naive += sz;
		}
release:
		for (int i = 0; i < ndies[v]; i++) {
			loom_value d = dies[v][i];
			size_t sz = align_up(loom_shape_numel(&g->nodes[d].shape) *
					     loom_dtype_size(g->nodes[d].dtype));
			if (alloc_give(&a, mp->offset[d], sz))
				fail = 1;
		}
	}
	for (int v = 0; v < n; v++)
		free(dies[v]);
	free(dies);
	free(ndies);
	if (fail)
		goto out_nomem;

	/* Aliases take their root's place. */
	for (int v = 0; v < n; v++) {
		mp->region[v] = mp->region[mp->root[v]];
		mp->offset[v] = mp->offset[mp->root[v]];
	}
	mp->persist_bytes = persist;
	mp->act_bytes = a.top;
	mp->act_naive_bytes = naive;
	free(a.free);
	free(last);
	return LOOM_OK;

out_nomem:
	free(a.free);
	free(last);
	loom_memplan_free(mp);
	return LOOM_ERR_NOMEM;
}

void loom_memplan_free(loom_memplan *mp)
{
	free(mp->offset);
	free(mp->region);
	free(mp->root);
	free(mp->sibling);
	free(mp->sibling_next);
	memset(mp, 0, sizeof(*mp));
}
