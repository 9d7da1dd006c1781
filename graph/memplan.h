/*
 * graph/memplan.h — memory planning: where each value of a compiled graph
 * lives in the arena, decided once at compile time.
 */
#ifndef LOOM_GRAPH_MEMPLAN_H
#define LOOM_GRAPH_MEMPLAN_H

#include <stddef.h>

#include "graph/graph_internal.h"

enum { LOOM_REGION_ACT = 0, LOOM_REGION_PERSIST = 1 };

typedef struct loom_memplan {
	size_t *offset;        /* per value: byte offset inside its region */
	unsigned char *region; /* per value: LOOM_REGION_* */
	loom_value *root;      /* per value: the value owning its storage */
	size_t persist_bytes;  /* inputs, parameters, buffers, grads, outputs */
	size_t act_bytes;      /* activations, with reuse */
	size_t act_naive_bytes; /* activations, one buffer each */
	/* The values node u makes besides its own (made_by == u, graph/fuse.c),
	 * in node order: the first is sibling[u], the one after w is
	 * sibling_next[w]; LOOM_NONE ends. */
	loom_value *sibling, *sibling_next;
} loom_memplan;

/* Plans g in node order (the execution order). */
loom_status loom_memplan_build(const loom_graph *g, loom_memplan *mp);
void loom_memplan_free(loom_memplan *mp);

#endif /* LOOM_GRAPH_MEMPLAN_H */
