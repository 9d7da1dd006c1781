/*
 * engine/cpu/accum.c — gradient accumulation's sums on the host: an ACCUM
 * step (engine/exec.c) adds a segment (a bucket, or one gradient) into its
 * sum, or folds the sum back in and clears it just before the bucket's
 * collective starts.
 */
#include "engine/cpu/ops.h"
#include "base/elem.h"

/* Below this many elements a parallel loop costs more than it saves. */
#define ACCUM_PAR_MIN 32768

/* sum += x, or, folding, x += sum and sum = 0, over n elements of one
 * type (f32 or f64). */
#define ACCUM_LOOP(sum, x, n, fold)              \
	for (int64_t i = 0; i < (n); i++) {      \
		if (fold) {                      \
			(x)[i] += (sum)[i];      \
			(sum)[i] = 0;            \
		} else {                         \
			(sum)[i] += (x)[i];      \
		}                                \
	}

/* sum += g (or, folding, g += sum and sum = 0) over n elements of dtype dt;
 * sums are f64 for f64 gradients, else f32. */
static void accum_f32(float *sum, void *g, loom_dtype dt, int64_t n, int fold)
{
	if (dt == LOOM_F32) {
		float *x = g;
		#pragma omp parallel for if (n > ACCUM_PAR_MIN) schedule(static)
		ACCUM_LOOP(sum, x, n, fold)
		return;
	}
	/* Half: the sum is rounded to the gradient's dtype once, when folded. */
	#pragma omp parallel for if (n > ACCUM_PAR_MIN) schedule(static)
	for (int64_t i = 0; i < n; i++) {
		if (fold) {
			loom_elem_set(dt, g, i, (float)(loom_elem_get(dt, g, i) + sum[i]));
			sum[i] = 0;
		} else {
			sum[i] += (float)loom_elem_get(dt, g, i);
		}
	}
}

static void accum_f64(double *sum, double *x, int64_t n, int fold)
{
	ACCUM_LOOP(sum, x, n, fold)
}

void loom_cpu_accum(const loom_plan *plan, const loom_arena *arena, int s, int fold)
{
	const loom_accum_seg *seg = &plan->accum[s];
	void *g = loom_arena_ptr(arena, plan, seg->v);
	void *sum = arena->accum + seg->off;
	if (seg->dtype == LOOM_F64)
		accum_f64(sum, g, seg->count, fold);
	else
		accum_f32(sum, g, seg->dtype, seg->count, fold);
}
