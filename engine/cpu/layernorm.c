/*
 * engine/cpu/layernorm.c — layer norm over the last dim on the CPU: the
 * kernels (f32 and f64, statistics in double; bf16 storage through blocks
 * of widened rows, norm_bf16.c, which holds the entries of both row norms).
 * The f32/f64 kernels are written once at the end of this file, which
 * includes itself once per type (LOOM_CPU_TEMPLATE set), as dense.c
 * instantiates dense_impl.h.
 */
#ifndef LOOM_CPU_TEMPLATE
#include <math.h>

#include "base/half.h"
#include "engine/cpu/cpu_internal.h"

#define LOOM_CPU_TEMPLATE_FILE "engine/cpu/layernorm.c"
#include "engine/cpu/f32_f64.h"

/* ------------------------------------------------------------ bf16 */

int loom_cpu_layernorm_fwd_bf16(int64_t rows, int c, const void *x, const void *gamma,
				const void *beta, double eps, void *y, unsigned half)
{
	return loom_cpu_norm_fwd_bf16(loom_cpu_layernorm_fwd_f32, rows, c, x, gamma, beta, eps, y,
				      half);
}

#else /* LOOM_CPU_TEMPLATE: the f32 and f64 kernels, T and SFX set */

/* Mean and 1 / sqrt(biased variance + eps) of one row, in double. */
static void LOOM_CPU_FN(ln_stats)(int c, const T *x, double eps, double *mean, double *rstd)
{
	double s = 0, ss = 0;
	for (int j = 0; j < c; j++)
		s += x[j];
	double m = s / c;
	for (int j = 0; j < c; j++)
		ss += (x[j] - m) * (x[j] - m);
	*mean = m;
	*rstd = 1.0 / sqrt(ss / c + eps);
}

void LOOM_CPU_FN(loom_cpu_layernorm_fwd)(int64_t rows, int c, const T *x, const T *gamma,
					 const T *beta, double eps, T *y)
{
#pragma omp parallel for if (rows * c >= LOOM_CPU_PAR_MIN) schedule(static)
	for (int64_t r = 0; r < rows; r++) {
		const T *xr = x + r * c;
		T *yr = y + r * c;
		double m, rs;
		LOOM_CPU_FN(ln_stats)(c, xr, eps, &m, &rs);
		for (int j = 0; j < c; j++)
			yr[j] = (T)((xr[j] - m) * rs * gamma[j] + beta[j]);
	}
}

/* dx = rstd (g dy - mean(g dy) - xhat mean(g dy xhat)). */
void LOOM_CPU_FN(loom_cpu_layernorm_bwd_data)(int64_t rows, int c, const T *x, const T *gamma,
					      const T *dy, double eps, T *dx)
{
#pragma omp parallel for if (rows * c >= LOOM_CPU_PAR_MIN) schedule(static)
	for (int64_t r = 0; r < rows; r++) {
		const T *xr = x + r * c, *dr = dy + r * c;
		T *out = dx + r * c;
		double m, rs, a = 0, b = 0;
		LOOM_CPU_FN(ln_stats)(c, xr, eps, &m, &rs);
		for (int j = 0; j < c; j++) {
			double g = (double)gamma[j] * dr[j];
			a += g;
			b += g * (xr[j] - m) * rs;
		}
		a /= c;
		b /= c;
		for (int j = 0; j < c; j++) {
			double xh = (xr[j] - m) * rs;
			out[j] = (T)(rs * ((double)gamma[j] * dr[j] - a - xh * b));
		}
	}
}

/* acc[j] += dy * xhat over rows: one thread's share of dgamma
 * (loom_cpu_norm_bwd_gamma, norm_bf16.c), per block of widened rows on bf16. */
void LOOM_CPU_FN(loom_cpu_layernorm_gamma_rows)(int64_t rows, int c, const T *x, const T *dy,
						double eps, double *acc)
{
	for (int64_t r = 0; r < rows; r++) {
		const T *xr = x + r * c, *dr = dy + r * c;
		double m, rs;
		LOOM_CPU_FN(ln_stats)(c, xr, eps, &m, &rs);
		for (int j = 0; j < c; j++)
			acc[j] += dr[j] * (xr[j] - m) * rs;
	}
}

#endif /* LOOM_CPU_TEMPLATE */
