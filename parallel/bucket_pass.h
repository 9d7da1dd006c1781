/*
 * parallel/bucket_pass.h — data parallelism's compile pass: parameter
 * gradients grouped into flat buckets (PyTorch DDP's bucket_cap_mb and
 * gradient_as_bucket_view), one all-reduce node per bucket, and the
 * schedule that runs each all-reduce right after its last gradient.
 * Knows nothing of processes or collectives.
 */
#ifndef LOOM_PARALLEL_BUCKET_PASS_H
#define LOOM_PARALLEL_BUCKET_PASS_H

#include <stddef.h>

#include "graph/buckets.h"

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

/* As loom_bucket_pass, each bucket's element count padded up to a multiple
 * of shards, so that it splits into equal contiguous shards (ZeRO's
 * reduce-scatter and all-gather). */
loom_status loom_bucket_pass_sharded(loom_graph *g, const loom_value *grads, int n, size_t cap,
				     size_t first_cap, int shards, loom_buckets *out);

#endif /* LOOM_PARALLEL_BUCKET_PASS_H */
