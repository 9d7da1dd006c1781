/*
 * graph/bucket_pass.h — data parallelism's compile pass: parameter
 * gradients grouped into flat buckets (PyTorch DDP's bucket_cap_mb and
 * gradient_as_bucket_view), one all-reduce node per bucket, and the
 * schedule that runs each all-reduce right after its last gradient.
 * Knows nothing of processes or collectives (graph/ never depends on comm/).
 */
#ifndef LOOM_GRAPH_BUCKET_PASS_H
#define LOOM_GRAPH_BUCKET_PASS_H

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
	int64_t count;   /* elements the all-reduce sums: bytes / dtype size */
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

/*
 * Groups grads (the parameter gradients in parameter order, n of them)
 * into buckets in reverse order, as DDP does (the last layer's gradients
 * are made first by backward): a bucket per dtype is open at a time and is
 * closed when the next gradient would take it past its cap (first_cap for
 * the first bucket made, cap for the others; a gradient larger than the
 * cap gets a bucket of its own). Appends one ALLREDUCE node per bucket.
 * LOOM_ERR_UNSUPPORTED when a gradient is a view of another value (it could
 * not be placed in a bucket), LOOM_ERR_NOMEM; the graph's error says which.
 */
loom_status loom_bucket_pass(loom_graph *g, const loom_value *grads, int n, size_t cap,
			     size_t first_cap, loom_buckets *out);

/* The bucket holding gradient v and its offset there; -1 if none. */
int loom_bucket_find(const loom_buckets *b, loom_value v, size_t *offset);

void loom_buckets_free(loom_buckets *b);

#endif /* LOOM_GRAPH_BUCKET_PASS_H */
