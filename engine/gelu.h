/*
 * engine/gelu.h — GELU's exact form written once for both backends (a
 * host/device inline, as amp/scaler.h does for the loss scaler):
 * y = x Phi(x), dx = dy (Phi(x) + x phi(x)), Phi the normal CDF through erf;
 * and GPT-2's tanh form (loom_gelu_tanh), with u = k (x + c x^3):
 * y = x (1 + tanh u) / 2, dx = dy ((1 + tanh u) / 2 + x (1 - tanh^2 u) k (1 + 3 c x^2) / 2).
 * engine/cpu/ops_elementwise.c and engine/cuda/elementwise.cu apply them.
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

#define LOOM_GELU_C 0.044715
#define LOOM_GELU_SQRT_2_PI 0.79788456080286535588 /* sqrt(2 / pi) */

static inline LOOM_GELU_HD float loom_gelu_tanh_f32(float x, float dy, int bwd)
{
	const float kt = (float)LOOM_GELU_SQRT_2_PI, c = (float)LOOM_GELU_C;
	float t = tanhf(kt * (x + c * x * x * x));
	return bwd ? dy * (0.5f * (1 + t) + 0.5f * x * (1 - t * t) * kt * (1 + 3 * c * x * x)) :
		     0.5f * x * (1 + t);
}

static inline LOOM_GELU_HD double loom_gelu_tanh_f64(double x, double dy, int bwd)
{
	const double kt = LOOM_GELU_SQRT_2_PI, c = LOOM_GELU_C;
	double t = tanh(kt * (x + c * x * x * x));
	return bwd ? dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kt * (1 + 3 * c * x * x)) :
		     0.5 * x * (1 + t);
}

#endif /* LOOM_ENGINE_GELU_H */
