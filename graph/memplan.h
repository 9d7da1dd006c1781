/*
 * graph/memplan.h — the plan of a compiled graph, decided once at compile
 * time: the order its nodes run in (the schedule) and where each value
 * lives (a region of the arena and an offset inside it).
 */
#ifndef LOOM_GRAPH_MEMPLAN_H
#define LOOM_GRAPH_MEMPLAN_H

#include <stddef.h>

#include "graph/buckets.h"
#include "graph/graph_internal.h"

/*
 * Regions of the arena. A value lives in exactly one; each region is laid
 * out on its own (offsets start at 0 in each) and the backend places the
 * regions one after the other. More come with data parallelism (gradient
 * buckets, communication buffers): add an id here and a row in
 * loom_memplan_build's region table.
 */
typedef enum loom_region_id {
	LOOM_REGION_ACT = 0,       /* activations: live from writer to last reader, reused */
	LOOM_REGION_PERSIST = 1,   /* leaves, gradients, outputs: live across steps */
	LOOM_REGION_WORKSPACE = 2, /* per-node scratch; sized by the backend, holds no value */
	LOOM_REGION_BUCKET = 3,    /* gradient buckets (graph/buckets.h): live across steps */
	LOOM_REGION_COUNT
} loom_region_id;

typedef struct loom_region {
	const char *name;
	size_t bytes; /* the region's size (WORKSPACE: 0 here, the backend's to fill) */
	int reuse;    /* values whose lifetimes do not overlap share bytes */
} loom_region;

typedef struct loom_memplan {
	/* The execution order: schedule[i] is the node run i-th (nschedule ==
	 * g->n). A value made by another node (made_by, graph/fuse.c) is made
	 * when that node runs; its own slot runs nothing. */
	loom_value *schedule;
	int nschedule;
	loom_region regions[LOOM_REGION_COUNT];

	size_t *offset;        /* per value: byte offset inside its region */
	unsigned char *region; /* per value: its loom_region_id */
	loom_value *root;      /* per value: the value owning its storage (views alias) */
	/* per value: the activation owner whose bytes it took over, written in
	 * place (LOOM_OPF_INPLACE, over src[0]'s owner; LOOM_OPF_INPLACE_DY,
	 * over src[1]'s: that owner dies where this value is made);
	 * LOOM_NONE for the others */
	loom_value *inplace;
	/* per value: whether it has storage in this plan (1) or belongs to
	 * another rank's part of the graph (0: a pipeline stage that never
	 * touches it; its offset means nothing). NULL: every value has. */
	unsigned char *held;
	size_t persist_bytes;  /* regions[LOOM_REGION_PERSIST].bytes */
	size_t act_bytes;      /* regions[LOOM_REGION_ACT].bytes: activations, with reuse */
	size_t act_naive_bytes; /* activations, one buffer each */
	size_t bucket_bytes;   /* regions[LOOM_REGION_BUCKET].bytes: 0 without buckets */
	/* The values node u makes besides its own (made_by == u, graph/fuse.c),
	 * in node order: the first is sibling[u], the one after w is
	 * sibling_next[w]; LOOM_NONE ends. */
	loom_value *sibling, *sibling_next;
} loom_memplan;

/* Plans g in node order. */
loom_status loom_memplan_build(const loom_graph *g, loom_memplan *mp);

/* Plans g in the given order (g->n node ids, each once; a pass's reordering):
 * every source must be made before its reader runs. LOOM_ERR_INVALID if
 * the order breaks that, LOOM_ERR_NOMEM on allocation failure; mp is then
 * left empty. */
loom_status loom_memplan_build_ordered(const loom_graph *g, const loom_value *order,
				       loom_memplan *mp);

/* As loom_memplan_build_ordered, with the gradients of data-parallel
 * training in the bucket region at their buckets' places (each bucket's
 * ALLREDUCE node owns the bucket; its gradients lie inside it). buckets
 * NULL: none. */
loom_status loom_memplan_build_buckets(const loom_graph *g, const loom_value *order,
				       const loom_buckets *buckets, loom_memplan *mp);

/* As loom_memplan_build_buckets, placing only the values `held` marks
 * (one byte per node, nonzero: held; an alias held holds its owner): the
 * others get no bytes in any region (mp->held says which). The schedule
 * and the lifetimes are still the whole graph's, so a held value lives as
 * long as it would in the whole plan. held NULL: every value. */
loom_status loom_memplan_build_held(const loom_graph *g, const loom_value *order,
				    const loom_buckets *buckets, const unsigned char *held,
				    loom_memplan *mp);

void loom_memplan_free(loom_memplan *mp);

#endif /* LOOM_GRAPH_MEMPLAN_H */
