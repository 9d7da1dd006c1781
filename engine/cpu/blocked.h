/*
 * engine/cpu/blocked.h — the CPU kernels of values in oneDNN's blocked
 * format nChw8c ([N][C/8][H][W][8], C a multiple of 8; graph/formats.c
 * chooses it): batch norm, the per-channel sum, max pooling, and the
 * reorders between memory formats. f32 only (half values are widened
 * first, elementwise, so their format does not change).
 */
#ifndef LOOM_ENGINE_CPU_BLOCKED_H
#define LOOM_ENGINE_CPU_BLOCKED_H

#include <stddef.h>
#include <stdint.h>

#include "graph/graph_internal.h"
#include "graph/ops/geometry.h"

/* x [n, c, hw] in format `from` into dst in format `to`; esz: bytes per
 * element (2, 4 or 8). Exact: a permutation of the elements. */
void loom_cpu_reorder(loom_format from, loom_format to, size_t esz, int n, int c, int64_t hw,
		      const void *src, void *dst);

/* Batch norm over nChw8c, the same arithmetic as bn_impl.h's (batch mean
 * and biased variance in two passes, the running statistics with the
 * unbiased variance). */
void loom_cpu_bn8_fwd_train(int n, int c, int64_t hw, const float *x, const float *gamma,
			    const float *beta, float *running_mean, float *running_var,
			    double momentum, double eps, float *y);
void loom_cpu_bn8_fwd_eval(int n, int c, int64_t hw, const float *x, const float *gamma,
			   const float *beta, const float *running_mean,
			   const float *running_var, double eps, float *y);
/* dx (may be NULL), and dgamma and dbeta where not NULL. */
void loom_cpu_bn8_bwd(int n, int c, int64_t hw, const float *x, const float *gamma,
		      const float *dy, double eps, float *dx, float *dgamma, float *dbeta);
/* The same pair with the batch statistics kept from forward to backward:
 * the forward also writes each channel's mean and biased variance (c
 * doubles each), the backward reads them instead of making them again from
 * x (two passes over x fewer); the same bits as the pair above. */
void loom_cpu_bn8_fwd_train_save(int n, int c, int64_t hw, const float *x, const float *gamma,
				 const float *beta, float *running_mean, float *running_var,
				 double momentum, double eps, float *y, double *mean, double *var);
void loom_cpu_bn8_bwd_saved(int n, int c, int64_t hw, const float *x, const float *gamma,
			    const float *dy, double eps, const double *mean, const double *var,
			    float *dx, float *dgamma, float *dbeta);
/* out[c] = the sum of channel c over the batch and the plane. */
void loom_cpu_channel_sum8(int n, int c, int64_t hw, const float *x, float *out);

/* Max pooling over nChw8c: the windows, ties, NaN and fused relu of
 * pool_impl.h, per channel. */
void loom_cpu_maxpool8_fwd(const loom_pool_shape *s, const float *x, float *y);
void loom_cpu_maxpool8_bwd(const loom_pool_shape *s, const float *x, const float *dy,
			   float *dx);

#endif /* LOOM_ENGINE_CPU_BLOCKED_H */
