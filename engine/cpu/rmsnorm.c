/*
 * engine/cpu/rmsnorm.c — RMS norm over the last dim on the CPU: the kernels
 * (f32 and f64, the mean square in double; bf16 storage through blocks of
 * widened rows, as layernorm.c; the entries in norm_bf16.c). The f32/f64
 * kernels are written once at the end of this file, which includes itself
 * once per type (LOOM_CPU_TEMPLATE set).
 */
#ifndef LOOM_CPU_TEMPLATE
#include <math.h>

#include "base/half.h"
#include "engine/cpu/cpu_internal.h"

#define LOOM_CPU_TEMPLATE_FILE "engine/cpu/rmsnorm.c"
#include "engine/cpu/f32_f64.h"

/* ------------------------------------------------------------ bf16 */

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

/* acc[j] += dy * xhat over rows: one thread's share of dgamma
 * (loom_cpu_norm_bwd_gamma, norm_bf16.c), per block of widened rows on bf16. */
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

#endif /* LOOM_CPU_TEMPLATE */
