/*
 * engine/cpu/embedding.c — embedding on the CPU: the gather of table rows
 * by id and its backward scatter-add (f32 and f64; bf16 tables and
 * gradients in f32 inside), and the entries of EMBEDDING and
 * EMBEDDING_BWD. The f32/f64 kernels are written once at the end of this
 * file, which includes itself once per type (LOOM_CPU_TEMPLATE set).
 */
#ifndef LOOM_CPU_TEMPLATE
#include <string.h>

#include "engine/cpu/cpu_internal.h"
#include "engine/cpu/ops.h"

/* Rows of table (size bytes an element) by id into y, whatever the
 * element: every id checked first, so a bad one leaves y untouched.
 * 0, or -1 with *bad (may be NULL) the first bad id's index. */
static int gather_rows(int64_t n, int v, int c, const int32_t *ids, const void *table, void *y,
		       size_t size, int64_t *bad)
{
	size_t row = size * (size_t)c;

	for (int64_t i = 0; i < n; i++) {
		if (ids[i] < 0 || ids[i] >= v) {
			if (bad)
				*bad = i;
			return -1;
		}
	}
#pragma omp parallel for if (n * c >= LOOM_CPU_PAR_MIN) schedule(static)
	for (int64_t i = 0; i < n; i++)
		memcpy((char *)y + i * row, (const char *)table + (int64_t)ids[i] * row, row);
	return 0;
}

/* The backward's threads own column ranges, so repeated ids never race;
 * rows are added in order, the same sums whatever the thread count. Every
 * thread for a large gradient, one for a small, never more than columns. */
static int bwd_threads(int64_t n, int c)
{
	int nt = n * c >= LOOM_CPU_PAR_MIN ? omp_get_max_threads() : 1;
	return nt > c ? c : nt;
}

/* The calling thread's columns [*j0, *j1) of c, inside the parallel region. */
static void bwd_columns(int c, int *j0, int *j1)
{
	int t = omp_get_thread_num(), cnt = omp_get_num_threads();
	*j0 = (int)((int64_t)c * t / cnt);
	*j1 = (int)((int64_t)c * (t + 1) / cnt);
}

#define LOOM_CPU_TEMPLATE_FILE "engine/cpu/embedding.c"
#include "engine/cpu/f32_f64.h"

/* ------------------------------------------------------------ bf16 */

int loom_cpu_embedding_fwd_bf16(int64_t n, int v, int c, const int32_t *ids,
				const uint16_t *table, uint16_t *y, int64_t *bad)
{
	return gather_rows(n, v, c, ids, table, y, sizeof(uint16_t), bad);
}

/* The f32 kernel's column ranges and row order: the same sums. */
int loom_cpu_embedding_bwd_bf16(int64_t n, int v, int c, const int32_t *ids, const void *dy,
				void *dtable, float *ws, unsigned half)
{
	const int in16 = half & LOOM_CPU_BF16_SRC(1), out16 = half & LOOM_CPU_BF16_OUT;
	float *acc = out16 ? ws : dtable;
#pragma omp parallel num_threads(bwd_threads(n, c))
	{
		int j0, j1;
		bwd_columns(c, &j0, &j1);
		for (int64_t r = 0; r < v; r++)
			memset(acc + r * c + j0, 0, sizeof(float) * (size_t)(j1 - j0));
		for (int64_t i = 0; i < n; i++) {
			if (ids[i] < 0 || ids[i] >= v)
				continue;
			float *row = acc + (int64_t)ids[i] * c;
			if (in16) {
				loom_cpu_bf16_acc(j1 - j0, (const uint16_t *)dy + i * c + j0, row + j0);
			} else {
				const float *d = (const float *)dy + i * c;
				for (int j = j0; j < j1; j++)
					row[j] += d[j];
			}
		}
		if (out16)
			for (int64_t r = 0; r < v; r++)
				loom_cpu_bf16_round(j1 - j0, acc + r * c + j0,
						    (uint16_t *)dtable + r * c + j0);
	}
	return 1;
}

/* ---------------------------------------------------------- entries */

/* The id at position bad, in the words both backends use (loom_bad_id). */
static loom_status bad_id(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			  const loom_cpu_io *io, int64_t bad)
{
	return loom_bad_id(ctx->err, plan, v, ((const int32_t *)io->src[0])[bad], bad);
}

static loom_status run_fwd(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			   const loom_cpu_io *io)
{
	const loom_node *w = loom_cpu_src(plan, v, 1);
	int64_t n = loom_shape_numel(&loom_cpu_src(plan, v, 0)->shape), bad = -1;
	/* a padded vocabulary's table: ids below the real vocabulary only */
	int vocab = (int)loom_node_user_shape(w).dims[0], c = (int)w->shape.dims[1], r;
	if (loom_cpu_kernel_dtype(loom_cpu_node(plan, v)) == LOOM_F64)
		r = loom_cpu_embedding_fwd_f64(n, vocab, c, io->src[0], io->src[1], io->out, &bad);
	else
		r = loom_cpu_embedding_fwd_f32(n, vocab, c, io->src[0], io->src[1], io->out, &bad);
	return r < 0 ? bad_id(ctx, plan, v, io, bad) : LOOM_OK;
}

/* Only a bf16 table into bf16 rows: a copy. */
static int bf16_fwd(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v, const loom_cpu_io *io,
		    unsigned half, loom_status *st)
{
	const loom_node *w = loom_cpu_src(plan, v, 1);
	int64_t bad = -1;
	if (half != (LOOM_CPU_BF16_SRC(1) | LOOM_CPU_BF16_OUT))
		return 0;
	if (loom_cpu_embedding_fwd_bf16(loom_shape_numel(&loom_cpu_src(plan, v, 0)->shape),
					(int)loom_node_user_shape(w).dims[0], (int)w->shape.dims[1],
					io->src[0], io->src[1], io->out, &bad) < 0)
		*st = bad_id(ctx, plan, v, io, bad);
	return 1;
}

static loom_status run_bwd(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			   const loom_cpu_io *io)
{
	const loom_node *n = loom_cpu_node(plan, v);
	int64_t cnt = loom_shape_numel(&loom_cpu_src(plan, v, 0)->shape);
	(void)ctx;
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(n), loom_cpu_embedding_bwd, cnt,
			  (int)n->shape.dims[0], (int)n->shape.dims[1], io->src[0], io->src[1],
			  io->out);
	return LOOM_OK;
}

/* Its f32 sums in ws: within the emulation's f32 copy of the table. */
static int bf16_bwd(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v, const loom_cpu_io *io,
		    unsigned half, loom_status *st)
{
	const loom_node *n = loom_cpu_node(plan, v);
	(void)ctx;
	(void)st;
	return loom_cpu_embedding_bwd_bf16(loom_shape_numel(&loom_cpu_src(plan, v, 0)->shape),
					   (int)n->shape.dims[0], (int)n->shape.dims[1], io->src[0],
					   io->src[1], io->out, io->ws, half);
}

const loom_cpu_op loom_cpu_embedding = { .run = run_fwd, .bf16 = bf16_fwd };
const loom_cpu_op loom_cpu_embedding_bwd = { .run = run_bwd, .bf16 = bf16_bwd };

#else /* LOOM_CPU_TEMPLATE: the f32 and f64 kernels, T and SFX set */

int LOOM_CPU_FN(loom_cpu_embedding_fwd)(int64_t n, int v, int c, const int32_t *ids,
					const T *table, T *y, int64_t *bad)
{
	return gather_rows(n, v, c, ids, table, y, sizeof(T), bad);
}

void LOOM_CPU_FN(loom_cpu_embedding_bwd)(int64_t n, int v, int c, const int32_t *ids,
					 const T *dy, T *dtable)
{
	memset(dtable, 0, sizeof(T) * (size_t)v * c);
#pragma omp parallel num_threads(bwd_threads(n, c))
	{
		int j0, j1;
		bwd_columns(c, &j0, &j1);
		for (int64_t i = 0; i < n; i++) {
			if (ids[i] < 0 || ids[i] >= v)
				continue;
			T *row = dtable + (int64_t)ids[i] * c;
			const T *d = dy + i * c;
			for (int j = j0; j < j1; j++)
				row[j] += d[j];
		}
	}
}

#endif /* LOOM_CPU_TEMPLATE */
