/*
 * engine/accum.c — the layout of gradient accumulation's sums
 * (LOOM_RUN_ACCUMULATE): one segment per gradient bucket under data
 * parallelism, so that a bucket's sum is folded in just before its
 * all-reduce starts and overlap with backward is kept; else one per
 * parameter gradient. Decided at compile time; the backend allocates the
 * sums at the first accumulating run only, so programs that never
 * accumulate pay nothing.
 */
#include <stdlib.h>

#include "engine/program_internal.h"

static size_t align64(size_t x)
{
	return (x + 63) & ~(size_t)63;
}

/* Sums are f32 (half and f32 gradients) or f64 (f64 gradients). */
static size_t sum_bytes(loom_dtype dt, int64_t count)
{
	return align64((size_t)count * (dt == LOOM_F64 ? 8 : 4));
}

loom_status loom_accum_plan(loom_plan *pl)
{
	int n = pl->buckets.n > 0 ? pl->buckets.n : pl->n_params;
	pl->accum = calloc(n ? n : 1, sizeof(*pl->accum));
	if (!pl->accum)
		return LOOM_ERR_NOMEM;
	size_t off = 0;
	for (int i = 0; i < n; i++) {
		loom_accum_seg *s = &pl->accum[i];
		if (pl->buckets.n > 0) {
			const loom_bucket *b = &pl->buckets.b[i];
			*s = (loom_accum_seg){ b->node, b->count, b->dtype, off };
		} else {
			const loom_param_slot *sl = &pl->params[i];
			*s = (loom_accum_seg){ sl->grad, sl->numel, pl->g->nodes[sl->grad].dtype, off };
			/* another pipeline stage's gradient: its stage sums it */
			if (!loom_plan_holds(pl, sl->grad)) {
				s->off = 0;
				continue;
			}
		}
		off += sum_bytes(s->dtype, s->count);
	}
	pl->n_accum = n;
	pl->accum_bytes = off;
	return LOOM_OK;
}
