/*
 * graph/buckets.h — the layout of data parallelism's gradient buckets, as
 * the memory planner places them: which gradient lies where in which flat
 * bucket, each bucket's ALLREDUCE node, and the schedule with the buckets'
 * collectives in it. parallel/bucket_pass.c decides it.
 */
#ifndef LOOM_GRAPH_BUCKETS_H
#define LOOM_GRAPH_BUCKETS_H

#include <stddef.h>

#include "graph/graph_internal.h"

/* Where a value starts inside a bucket: the memory planner's alignment, so
 * a gradient in a bucket sits as it would anywhere else in the arena. */
#define LOOM_BUCKET_ALIGN 64

/* One bucket: members [first, first + n) of loom_buckets.grad, in the
 * order they lie in it. */
typedef struct loom_bucket {
	loom_dtype dtype;
	size_t bytes;    /* with each member padded to LOOM_BUCKET_ALIGN */
	int64_t count;   /* elements the collective sums: bytes / dtype size (a
			  * multiple of the world size when sharded) */
	size_t base;     /* offset of the bucket inside the bucket region */
	int first, n;
	loom_value node; /* its LOOM_OP_ALLREDUCE node */
} loom_bucket;

typedef struct loom_buckets {
	loom_bucket *b;
	int n;
	loom_value *grad; /* every gradient, bucket by bucket */
	size_t *offset;   /* per entry of grad: its offset inside its bucket */
	int ngrad;
	size_t bytes;     /* the bucket region's size */
	/* The schedule: node order with each all-reduce moved right after the
	 * last of its gradients is made (g->n entries, for the memory planner). */
	loom_value *order;
} loom_buckets;

/* The bucket holding gradient v and its offset there; -1 if none. */
int loom_bucket_find(const loom_buckets *b, loom_value v, size_t *offset);

void loom_buckets_free(loom_buckets *b);

#endif /* LOOM_GRAPH_BUCKETS_H */
