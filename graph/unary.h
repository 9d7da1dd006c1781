/*
 * graph/unary.h — the unary elementwise ops, written once for the graph and
 * both backends. Each row of LOOM_UNARY_OPS(X) is X(NAME, low): the ops
 * LOOM_OP_<NAME> (x -> y) and LOOM_OP_<NAME>_BWD ((x, dy) -> dx), the
 * builder loom_<name> (include/loom.h), and the scalar function
 * loom_unary_<low>_f32 and _f64(x, dy, bwd, attr) below, in float and double (a
 * host/device inline, as amp/scaler.h does for the loss scaler): y for bwd
 * 0, dx for dy for bwd 1; attr is the node's attrs.ew.tanh (a variant).
 * From the rows: graph/graph_internal.h makes the op ids, graph/ops/unary.c
 * the op table rows (shape: the input's; AMP class FOLLOW; gradient: the
 * _BWD node) and builders, engine/cpu/ops_elementwise.c and
 * engine/cuda/elementwise.cu one elementwise entry each that runs any row,
 * tests/graph/test_gradcheck.c a finite-difference check per row and
 * tests/engine/cuda/test_cuda_ops.c a CUDA-vs-CPU case per row.
 *
 * Adding a unary op: its row and its function here, and its builder's
 * declaration in include/loom.h (engine/README.md counts the files).
 */
#ifndef LOOM_GRAPH_UNARY_H
#define LOOM_GRAPH_UNARY_H

#include <math.h>

#ifdef __CUDACC__
#define LOOM_UNARY_HD __host__ __device__
#else
#define LOOM_UNARY_HD
#endif

#define LOOM_UNARY_OPS(X) X(GELU, gelu) X(SILU, silu)

/*
 * GELU: the exact form, y = x Phi(x), dx = dy (Phi(x) + x phi(x)), Phi the
 * normal CDF through erf; attr 1: GPT-2's tanh form (loom_gelu_tanh), with
 * u = k (x + c x^3): y = x (1 + tanh u) / 2,
 * dx = dy ((1 + tanh u) / 2 + x (1 - tanh^2 u) k (1 + 3 c x^2) / 2).
 */
#define LOOM_GELU_SQRT1_2 0.70710678118654752440      /* 1 / sqrt(2) */
#define LOOM_GELU_INV_SQRT_2PI 0.39894228040143267794 /* 1 / sqrt(2 pi) */
#define LOOM_GELU_C 0.044715
#define LOOM_GELU_SQRT_2_PI 0.79788456080286535588 /* sqrt(2 / pi) */

static inline LOOM_UNARY_HD float loom_unary_gelu_f32(float x, float dy, int bwd, int tanh_form)
{
	if (tanh_form) {
		const float kt = (float)LOOM_GELU_SQRT_2_PI, c = (float)LOOM_GELU_C;
		float t = tanhf(kt * (x + c * x * x * x));
		return bwd ? dy * (0.5f * (1 + t) + 0.5f * x * (1 - t * t) * kt * (1 + 3 * c * x * x)) :
			     0.5f * x * (1 + t);
	}
	float cdf = 0.5f * (1.0f + erff(x * (float)LOOM_GELU_SQRT1_2));
	return bwd ? dy * (cdf + x * (float)LOOM_GELU_INV_SQRT_2PI * expf(-0.5f * x * x)) : x * cdf;
}

static inline LOOM_UNARY_HD double loom_unary_gelu_f64(double x, double dy, int bwd, int tanh_form)
{
	if (tanh_form) {
		const double kt = LOOM_GELU_SQRT_2_PI, c = LOOM_GELU_C;
		double t = tanh(kt * (x + c * x * x * x));
		return bwd ? dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kt * (1 + 3 * c * x * x)) :
			     0.5 * x * (1 + t);
	}
	double cdf = 0.5 * (1.0 + erf(x * LOOM_GELU_SQRT1_2));
	return bwd ? dy * (cdf + x * LOOM_GELU_INV_SQRT_2PI * exp(-0.5 * x * x)) : x * cdf;
}

/* SiLU (swish): y = x s, s = 1 / (1 + e^-x); dx = dy (s + x s (1 - s)). */
static inline LOOM_UNARY_HD float loom_unary_silu_f32(float x, float dy, int bwd, int attr)
{
	float s = 1.0f / (1.0f + expf(-x));
	(void)attr;
	return bwd ? dy * (s + x * s * (1.0f - s)) : x * s;
}

static inline LOOM_UNARY_HD double loom_unary_silu_f64(double x, double dy, int bwd, int attr)
{
	double s = 1.0 / (1.0 + exp(-x));
	(void)attr;
	return bwd ? dy * (s + x * s * (1.0 - s)) : x * s;
}

#endif /* LOOM_GRAPH_UNARY_H */
