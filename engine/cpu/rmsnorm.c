/*
 * engine/cpu/rmsnorm.c — RMS norm over the last dim on the CPU: the kernels
 * (f32 and f64, the mean square in double; bf16 storage through blocks of
 * widened rows, as layernorm.c) and the entries of RMSNORM and its two
 * backward ops. The f32/f64 kernels are written once at the end of this
 * file, which includes itself once per type (LOOM_CPU_TEMPLATE set).
 */
#ifndef LOOM_CPU_TEMPLATE
#include <math.h>
#include <string.h>

#include "base/half.h"
#include "engine/cpu/cpu_internal.h"
#include "engine/cpu/ops.h"

#define LOOM_CPU_TEMPLATE_FILE "engine/cpu/rmsnorm.c"
#include "engine/cpu/f32_f64.h"

size_t loom_cpu_rmsnorm_bwd_gamma_ws(int c)
{
	return sizeof(double) * (size_t)loom_cpu_slots() * (size_t)c;
}

/* ------------------------------------------------------------ bf16 */

#define ROWS LOOM_CPU_BF16_ROWS

/* The f32 kernel in the shared forward's shape (no beta). */
static void fwd_rows_f32(int64_t rows, int c, const float *x, const float *gamma,
			 const float *beta, double eps, float *y)
{
	(void)beta;
	loom_cpu_rmsnorm_fwd_f32(rows, c, x, gamma, eps, y);
}

int loom_cpu_rmsnorm_fwd_bf16(int64_t rows, int c, const void *x, const void *gamma, double eps,
			      void *y, unsigned half)
{
	return loom_cpu_norm_fwd_bf16(fwd_rows_f32, rows, c, x, gamma, NULL, eps, y, half);
}

int loom_cpu_rmsnorm_bwd_data_bf16(int64_t rows, int c, const void *x, const void *gamma,
				   const void *dy, double eps, void *dx, unsigned half)
{
	return loom_cpu_norm_bwd_data_bf16(loom_cpu_rmsnorm_bwd_data_f32, rows, c, x, gamma, dy, eps,
					   dx, half);
}

/* The f32 kernel's threads, row ranges and ordered sum of the slots. */
int loom_cpu_rmsnorm_bwd_gamma_bf16(int64_t rows, int c, const void *x, const void *dy,
				    double eps, void *dgamma, double *ws, unsigned half)
{
	return loom_cpu_norm_bwd_gamma_bf16(loom_cpu_rmsnorm_gamma_rows_f32, rows, c, x, dy, eps,
					    dgamma, ws, half);
}

/* ---------------------------------------------------------- entries */

static loom_status run_fwd(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			   const loom_cpu_io *io)
{
	const loom_node *n = loom_cpu_node(plan, v);
	(void)ctx;
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(n), loom_cpu_rmsnorm_fwd, loom_shape_rows(&n->shape),
			  (int)loom_shape_last(&n->shape), io->src[0], io->src[1], n->a.ln.eps,
			  io->out);
	return LOOM_OK;
}

static int bf16_fwd(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v, const loom_cpu_io *io,
		    unsigned half, loom_status *st)
{
	const loom_node *n = loom_cpu_node(plan, v);
	(void)ctx;
	(void)st;
	return loom_cpu_rmsnorm_fwd_bf16(loom_shape_rows(&n->shape), (int)loom_shape_last(&n->shape),
					 io->src[0], io->src[1], n->a.ln.eps, io->out, half);
}

const loom_cpu_op loom_cpu_rmsnorm = { .run = run_fwd, .bf16 = bf16_fwd };
/* The backward ops' entries serve layer norm and RMS norm (norm_bf16.c). */
const loom_cpu_op loom_cpu_rmsnorm_bwd_data = { .run = loom_cpu_op_norm_bwd_data,
						.bf16 = loom_cpu_op_norm_bwd_data_bf16 };
const loom_cpu_op loom_cpu_rmsnorm_bwd_gamma = { .run = loom_cpu_op_norm_bwd_gamma,
						 .ws = loom_cpu_op_norm_bwd_gamma_ws,
						 .bf16 = loom_cpu_op_norm_bwd_gamma_bf16 };

#else /* LOOM_CPU_TEMPLATE: the f32 and f64 kernels, T and SFX set */

/* 1 / sqrt(mean(x^2) + eps) of one row, in double. */
static double LOOM_CPU_FN(rms_rstd)(int c, const T *x, double eps)
{
	double ss = 0;
	for (int j = 0; j < c; j++)
		ss += (double)x[j] * x[j];
	return 1.0 / sqrt(ss / c + eps);
}

void LOOM_CPU_FN(loom_cpu_rmsnorm_fwd)(int64_t rows, int c, const T *x, const T *gamma,
				       double eps, T *y)
{
#pragma omp parallel for if (rows * c >= LOOM_CPU_PAR_MIN) schedule(static)
	for (int64_t r = 0; r < rows; r++) {
		const T *xr = x + r * c;
		T *yr = y + r * c;
		double rs = LOOM_CPU_FN(rms_rstd)(c, xr, eps);
		for (int j = 0; j < c; j++)
			yr[j] = (T)(xr[j] * rs * gamma[j]);
	}
}

/* dx = rstd (g dy - xhat mean(g dy xhat)), xhat = x rstd. */
void LOOM_CPU_FN(loom_cpu_rmsnorm_bwd_data)(int64_t rows, int c, const T *x, const T *gamma,
					    const T *dy, double eps, T *dx)
{
#pragma omp parallel for if (rows * c >= LOOM_CPU_PAR_MIN) schedule(static)
	for (int64_t r = 0; r < rows; r++) {
		const T *xr = x + r * c, *dr = dy + r * c;
		T *out = dx + r * c;
		double rs = LOOM_CPU_FN(rms_rstd)(c, xr, eps), b = 0;
		for (int j = 0; j < c; j++)
			b += (double)gamma[j] * dr[j] * xr[j] * rs;
		b /= c;
		for (int j = 0; j < c; j++)
			out[j] = (T)(rs * ((double)gamma[j] * dr[j] - xr[j] * rs * b));
	}
}

/* acc[j] += dy * xhat over rows (one thread's share; the bf16 kernel calls
 * it per block of widened rows). */
void LOOM_CPU_FN(loom_cpu_rmsnorm_gamma_rows)(int64_t rows, int c, const T *x, const T *dy,
					      double eps, double *acc)
{
	for (int64_t r = 0; r < rows; r++) {
		const T *xr = x + r * c, *dr = dy + r * c;
		double rs = LOOM_CPU_FN(rms_rstd)(c, xr, eps);
		for (int j = 0; j < c; j++)
			acc[j] += dr[j] * (xr[j] * rs);
	}
}

void LOOM_CPU_FN(loom_cpu_rmsnorm_bwd_gamma)(int64_t rows, int c, const T *x, const T *dy,
					     double eps, T *dgamma, double *ws)
{
	int nt = rows * c >= LOOM_CPU_PAR_MIN ? loom_cpu_slot_threads(rows < 65536 ? (int)rows : 65536) : 1;
	memset(ws, 0, sizeof(double) * (size_t)nt * c);
#pragma omp parallel num_threads(nt)
	{
		int t = omp_get_thread_num(), cnt = omp_get_num_threads();
		int64_t r0 = rows * t / cnt, r1 = rows * (t + 1) / cnt;
		LOOM_CPU_FN(loom_cpu_rmsnorm_gamma_rows)(r1 - r0, c, x + r0 * c, dy + r0 * c, eps,
							 ws + (size_t)t * c);
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
