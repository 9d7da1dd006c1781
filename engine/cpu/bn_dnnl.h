/*
 * engine/cpu/bn_dnnl.h — a batch norm node on nChw8c f32 values as
 * oneDNN's batch normalization primitives: the forward in training mode,
 * which returns the batch mean and biased variance, and the backward that
 * takes them (it does not make them again from x). Made once when the plan
 * is made; the statistics live from the forward to the backward in the
 * node's side buffer (backend.c). oneDNN splits the work over its own
 * OpenMP threads (its statistics need the whole batch).
 */
#ifndef LOOM_ENGINE_CPU_BN_DNNL_H
#define LOOM_ENGINE_CPU_BN_DNNL_H

#include <stddef.h>

typedef struct loom_cpu_dnnl_bn loom_cpu_dnnl_bn;

/* The primitives for x [n, c, h, w] (c a multiple of 8), with scale and
 * shift; NULL where oneDNN offers none (or on the portable path). */
loom_cpu_dnnl_bn *loom_cpu_dnnl_bn_new(int n, int c, int h, int w, double eps);
void loom_cpu_dnnl_bn_free(loom_cpu_dnnl_bn *b);

/* y from x; mean and var (c floats each) get the batch statistics. 0 on
 * success, -1 if oneDNN failed. */
int loom_cpu_dnnl_bn_fwd(loom_cpu_dnnl_bn *b, const float *x, const float *gamma,
			 const float *beta, float *y, float *mean, float *var);
/* dx, dgamma and dbeta (c floats each, all required) from x, dy and the
 * forward's statistics. 0 on success, -1 if oneDNN failed. */
int loom_cpu_dnnl_bn_bwd(loom_cpu_dnnl_bn *b, const float *x, const float *gamma,
			 const float *dy, const float *mean, const float *var, float *dx,
			 float *dgamma, float *dbeta);

/* oneDNN's name for the forward's implementation ("bnorm_jit:avx2"). */
const char *loom_cpu_dnnl_bn_impl(const loom_cpu_dnnl_bn *b);

#endif /* LOOM_ENGINE_CPU_BN_DNNL_H */
