/*
 * engine/cpu/norm_bf16.c — the row norms (layer norm, RMS norm): the bf16
 * storage around the family's f32 row kernels (blocks of LOOM_CPU_BF16_ROWS
 * widened elements per thread for the forward and the data gradient;
 * for gamma's, the f32 kernel's threads, row ranges and ordered sum of the
 * per-thread slots, so bf16 and f32 give the same sums, each thread's rows
 * widened a block at a time), the f32/f64 dgamma around a norm's rows
 * kernel (at the end of this file, which includes itself once per type),
 * and the ops' entries, one set for both norms (the node's op picks the
 * kernels).
 */
#ifndef LOOM_CPU_TEMPLATE
#include <string.h>

#include "base/half.h"
#include "engine/cpu/cpu_internal.h"
#include "engine/cpu/ops.h"

#define LOOM_CPU_TEMPLATE_FILE "engine/cpu/norm_bf16.c"
#include "engine/cpu/f32_f64.h"

#define ROWS LOOM_CPU_BF16_ROWS

/* The forward and the data gradient: one f32 row kernel (x, gamma, a
 * third array, eps) -> out over blocks of widened rows. The third is
 * beta [c] (NULL: RMS norm's forward) or, per_row, dy [rows, c]; the half
 * bits name each array by its source's position (x 0, gamma 1, the third
 * 2). */
static int norm_rows_bf16(loom_cpu_norm_bwd_data_f32 kernel, int64_t rows, int c, const void *x,
			  const void *gamma, const void *third, int per_row, double eps, void *out,
			  unsigned half)
{
	if (c <= 0 || c > ROWS)
		return 0;
	const int64_t per = ROWS / c, nb = (rows + per - 1) / per;
	const unsigned h3 = half & LOOM_CPU_BF16_SRC(2);
#pragma omp parallel if (rows * c >= LOOM_CPU_PAR_MIN)
	{
		float xb[ROWS] __attribute__((aligned(64))), gb[ROWS] __attribute__((aligned(64)));
		float tb[ROWS] __attribute__((aligned(64))), ob[ROWS] __attribute__((aligned(64)));
		const float *g = loom_cpu_bf16_in(gamma, half & LOOM_CPU_BF16_SRC(1), 0, c, gb);
		const float *t = third && !per_row ? loom_cpu_bf16_in(third, h3, 0, c, tb) : NULL;
#pragma omp for schedule(static)
		for (int64_t k = 0; k < nb; k++) {
			int64_t r0 = k * per, nr = rows - r0 < per ? rows - r0 : per;
			const float *xs = loom_cpu_bf16_in(x, half & LOOM_CPU_BF16_SRC(0), r0 * c,
							   nr * c, xb);
			const float *ts =
				per_row ? loom_cpu_bf16_in(third, h3, r0 * c, nr * c, tb) : t;
			float *os = loom_cpu_bf16_out(out, half & LOOM_CPU_BF16_OUT, r0 * c, ob);
			kernel(nr, c, xs, g, ts, eps, os);
			loom_cpu_bf16_done(out, half & LOOM_CPU_BF16_OUT, r0 * c, nr * c, os);
		}
	}
	return 1;
}

int loom_cpu_norm_fwd_bf16(loom_cpu_norm_fwd_f32 kernel, int64_t rows, int c, const void *x,
			   const void *gamma, const void *beta, double eps, void *y, unsigned half)
{
	return norm_rows_bf16(kernel, rows, c, x, gamma, beta, 0, eps, y, half);
}

int loom_cpu_norm_bwd_data_bf16(loom_cpu_norm_bwd_data_f32 kernel, int64_t rows, int c,
				const void *x, const void *gamma, const void *dy, double eps,
				void *dx, unsigned half)
{
	return norm_rows_bf16(kernel, rows, c, x, gamma, dy, 1, eps, dx, half);
}

int loom_cpu_norm_bwd_gamma_bf16(loom_cpu_norm_gamma_rows_f32 kernel, int64_t rows, int c,
				 const void *x, const void *dy, double eps, void *dgamma,
				 double *ws, unsigned half)
{
	if (c <= 0 || c > ROWS)
		return 0;
	int nt = rows * c >= LOOM_CPU_PAR_MIN ?
			 loom_cpu_slot_threads(rows < 65536 ? (int)rows : 65536) : 1;
	const int64_t per = ROWS / c;
	memset(ws, 0, sizeof(double) * (size_t)nt * c);
#pragma omp parallel num_threads(nt)
	{
		float xb[ROWS] __attribute__((aligned(64))), db[ROWS] __attribute__((aligned(64)));
		int t = omp_get_thread_num(), cnt = omp_get_num_threads();
		int64_t r0 = rows * t / cnt, r1 = rows * (t + 1) / cnt;
		for (int64_t r = r0; r < r1; r += per) {
			int64_t nr = r1 - r < per ? r1 - r : per;
			const float *xs = loom_cpu_bf16_in(x, half & LOOM_CPU_BF16_SRC(0), r * c,
							   nr * c, xb);
			const float *ds = loom_cpu_bf16_in(dy, half & LOOM_CPU_BF16_SRC(1), r * c,
							   nr * c, db);
			kernel(nr, c, xs, ds, eps, ws + (size_t)t * c);
		}
	}
	for (int j = 0; j < c; j++) {
		double s = 0;
		for (int t = 0; t < nt; t++)
			s += ws[(size_t)t * c + j];
		if (half & LOOM_CPU_BF16_OUT)
			((uint16_t *)dgamma)[j] = loom_f32_to_bf16((float)s);
		else
			((float *)dgamma)[j] = (float)s;
	}
	return 1;
}

size_t loom_cpu_norm_bwd_gamma_ws(int c)
{
	return sizeof(double) * (size_t)loom_cpu_slots() * (size_t)c;
}

/* ---------------------------------------------------------- entries */

/* A row norm's kernels: layer norm's and RMS norm's backward take the same
 * arguments, so one set of entries serves both ops, the node's op picking
 * the kernels. */
typedef struct norm_bwd_kernels {
	void (*data_f32)(int64_t rows, int c, const float *x, const float *gamma,
			 const float *dy, double eps, float *dx);
	void (*data_f64)(int64_t rows, int c, const double *x, const double *gamma,
			 const double *dy, double eps, double *dx);
	/* a block of rows' share of dgamma */
	loom_cpu_norm_gamma_rows_f32 gamma_rows_f32;
	void (*gamma_rows_f64)(int64_t rows, int c, const double *x, const double *dy, double eps,
			       double *acc);
} norm_bwd_kernels;

static const norm_bwd_kernels layernorm_bwd = {
	.data_f32 = loom_cpu_layernorm_bwd_data_f32,
	.data_f64 = loom_cpu_layernorm_bwd_data_f64,
	.gamma_rows_f32 = loom_cpu_layernorm_gamma_rows_f32,
	.gamma_rows_f64 = loom_cpu_layernorm_gamma_rows_f64,
};

static const norm_bwd_kernels rmsnorm_bwd = {
	.data_f32 = loom_cpu_rmsnorm_bwd_data_f32,
	.data_f64 = loom_cpu_rmsnorm_bwd_data_f64,
	.gamma_rows_f32 = loom_cpu_rmsnorm_gamma_rows_f32,
	.gamma_rows_f64 = loom_cpu_rmsnorm_gamma_rows_f64,
};

static const norm_bwd_kernels *kernels_of(const loom_node *n)
{
	return n->op == LOOM_OP_RMSNORM_BWD_DATA || n->op == LOOM_OP_RMSNORM_BWD_GAMMA ?
		       &rmsnorm_bwd :
		       &layernorm_bwd;
}

loom_cpu_norm_bwd_data_f32 loom_cpu_norm_bwd_data_kernel(const loom_node *n)
{
	return kernels_of(n)->data_f32;
}

/* The forward: RMS norm has no beta (its node no third source). */
static loom_status run_fwd(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			   const loom_cpu_io *io)
{
	const loom_node *n = loom_cpu_node(plan, v);
	const int64_t rows = loom_shape_rows(&n->shape);
	const int c = (int)loom_shape_last(&n->shape);
	(void)ctx;
	if (n->op == LOOM_OP_RMSNORM)
		LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(n), loom_cpu_rmsnorm_fwd, rows, c,
				  io->src[0], io->src[1], n->a.ln.eps, io->out);
	else
		LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(n), loom_cpu_layernorm_fwd, rows, c,
				  io->src[0], io->src[1], io->src[2], n->a.ln.eps, io->out);
	return LOOM_OK;
}

static int bf16_fwd(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v, const loom_cpu_io *io,
		    unsigned half, loom_status *st)
{
	const loom_node *n = loom_cpu_node(plan, v);
	const int64_t rows = loom_shape_rows(&n->shape);
	const int c = (int)loom_shape_last(&n->shape);
	(void)ctx;
	(void)st;
	if (n->op == LOOM_OP_RMSNORM)
		return loom_cpu_rmsnorm_fwd_bf16(rows, c, io->src[0], io->src[1], n->a.ln.eps,
						 io->out, half);
	return loom_cpu_layernorm_fwd_bf16(rows, c, io->src[0], io->src[1], io->src[2],
					   n->a.ln.eps, io->out, half);
}

static loom_status run_bwd_data(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				const loom_cpu_io *io)
{
	const loom_node *n = loom_cpu_node(plan, v);
	const norm_bwd_kernels *k = kernels_of(n);
	const int64_t rows = loom_shape_rows(&n->shape);
	const int c = (int)loom_shape_last(&n->shape);
	(void)ctx;
	if (loom_cpu_kernel_dtype(n) == LOOM_F64)
		k->data_f64(rows, c, io->src[0], io->src[1], io->src[2], n->a.ln.eps, io->out);
	else
		k->data_f32(rows, c, io->src[0], io->src[1], io->src[2], n->a.ln.eps, io->out);
	return LOOM_OK;
}

static int bf16_bwd_data(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			 const loom_cpu_io *io, unsigned half, loom_status *st)
{
	const loom_node *n = loom_cpu_node(plan, v);
	(void)ctx;
	(void)st;
	return loom_cpu_norm_bwd_data_bf16(kernels_of(n)->data_f32, loom_shape_rows(&n->shape),
					   (int)loom_shape_last(&n->shape), io->src[0], io->src[1],
					   io->src[2], n->a.ln.eps, io->out, half);
}

static loom_status run_bwd_gamma(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				 const loom_cpu_io *io)
{
	const loom_node *n = loom_cpu_node(plan, v), *x = loom_cpu_src(plan, v, 0);
	const norm_bwd_kernels *k = kernels_of(n);
	const int64_t rows = loom_shape_rows(&x->shape);
	const int c = (int)loom_shape_last(&x->shape);
	(void)ctx;
	if (loom_cpu_kernel_dtype(n) == LOOM_F64)
		loom_cpu_norm_bwd_gamma_f64(k->gamma_rows_f64, rows, c, io->src[0], io->src[1],
					    n->a.ln.eps, io->out, io->ws);
	else
		loom_cpu_norm_bwd_gamma_f32(k->gamma_rows_f32, rows, c, io->src[0], io->src[1],
					    n->a.ln.eps, io->out, io->ws);
	return LOOM_OK;
}

static int bf16_bwd_gamma(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			  const loom_cpu_io *io, unsigned half, loom_status *st)
{
	const loom_node *n = loom_cpu_node(plan, v), *x = loom_cpu_src(plan, v, 0);
	(void)ctx;
	(void)st;
	return loom_cpu_norm_bwd_gamma_bf16(kernels_of(n)->gamma_rows_f32,
					    loom_shape_rows(&x->shape),
					    (int)loom_shape_last(&x->shape), io->src[0], io->src[1],
					    n->a.ln.eps, io->out, io->ws, half);
}

/* dgamma's per-thread sums. */
static size_t bwd_gamma_ws(const loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			   size_t elem)
{
	(void)ctx;
	(void)elem;
	return loom_cpu_norm_bwd_gamma_ws((int)loom_shape_last(&loom_cpu_node(plan, v)->shape));
}

const loom_cpu_op loom_cpu_norm = { .run = run_fwd, .bf16 = bf16_fwd };
const loom_cpu_op loom_cpu_norm_bwd_data = { .run = run_bwd_data, .bf16 = bf16_bwd_data };
const loom_cpu_op loom_cpu_norm_bwd_gamma = { .run = run_bwd_gamma, .ws = bwd_gamma_ws,
					      .bf16 = bf16_bwd_gamma };

#else /* LOOM_CPU_TEMPLATE: the f32 and f64 dgamma, T and SFX set */

void LOOM_CPU_FN(loom_cpu_norm_bwd_gamma)(void (*rows_fn)(int64_t rows, int c, const T *x,
							  const T *dy, double eps, double *acc),
					  int64_t rows, int c, const T *x, const T *dy, double eps,
					  T *dgamma, double *ws)
{
	int nt = rows * c >= LOOM_CPU_PAR_MIN ? loom_cpu_slot_threads(rows < 65536 ? (int)rows : 65536) : 1;
	memset(ws, 0, sizeof(double) * (size_t)nt * c);
#pragma omp parallel num_threads(nt)
	{
		int t = omp_get_thread_num(), cnt = omp_get_num_threads();
		int64_t r0 = rows * t / cnt, r1 = rows * (t + 1) / cnt;
		rows_fn(r1 - r0, c, x + r0 * c, dy + r0 * c, eps, ws + (size_t)t * c);
	}
	/* The slots in a fixed order: the same sums for the same thread count. */
	for (int j = 0; j < c; j++) {
		double s = 0;
		for (int t = 0; t < nt; t++)
			s += ws[(size_t)t * c + j];
		dgamma[j] = (T)s;
	}
}

#endif /* LOOM_CPU_TEMPLATE */
