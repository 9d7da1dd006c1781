/*
 * engine/gelu.h — GELU's exact form written once for both backends (a
 * host/device inline, as amp/scaler.h does for the loss scaler):
 * y = x Phi(x), dx = dy (Phi(x) + x phi(x)), Phi the normal CDF through erf.
 * engine/cpu/ops_elementwise.c and engine/cuda/elementwise.cu apply it.
 */
#ifndef LOOM_ENGINE_GELU_H
#define LOOM_ENGINE_GELU_H

#include <math.h>

#ifdef __CUDACC__
#define LOOM_GELU_HD __host__ __device__
#else
#define LOOM_GELU_HD
#endif

#define LOOM_GELU_SQRT1_2 0.70710678118654752440    /* 1 / sqrt(2) */
#define LOOM_GELU_INV_SQRT_2PI 0.39894228040143267794 /* 1 / sqrt(2 pi) */

/* dy == NULL-style switch: bwd 0 gives y, 1 gives dx for dy. */
static inline LOOM_GELU_HD float loom_gelu_f32(float x, float dy, int bwd)
{
	float cdf = 0.5f * (1.0f + erff(x * (float)LOOM_GELU_SQRT1_2));
	return bwd ? dy * (cdf + x * (float)LOOM_GELU_INV_SQRT_2PI * expf(-0.5f * x * x)) : x * cdf;
}

static inline LOOM_GELU_HD double loom_gelu_f64(double x, double dy, int bwd)
{
	double cdf = 0.5 * (1.0 + erf(x * LOOM_GELU_SQRT1_2));
	return bwd ? dy * (cdf + x * LOOM_GELU_INV_SQRT_2PI * exp(-0.5 * x * x)) : x * cdf;
}

#endif /* LOOM_ENGINE_GELU_H */
