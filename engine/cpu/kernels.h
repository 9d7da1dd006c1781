/*
 * engine/cpu/kernels.h — the CPU reference kernels, one per op, in f32 and f64.
 *
 * Plain C over raw NCHW buffers, BLAS for matrix products. The executor calls
 * these with pointers into the arena; workspace sizes are asked for at compile
 * time so that a step never allocates. Every kernel overwrites its output
 * (never accumulates into it) unless its comment says otherwise.
 */
#ifndef LOOM_ENGINE_CPU_KERNELS_H
#define LOOM_ENGINE_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "graph/ops/geometry.h" /* loom_conv_shape, loom_pool_shape */


/* Bytes of scratch each conv kernel needs for element size elem (4 or 8). */
size_t loom_cpu_conv2d_workspace(const loom_conv_shape *s, size_t elem);

/* The X-macro below declares each kernel twice: suffix _f32 with T = float,
 * suffix _f64 with T = double. */
#define LOOM_CPU_KERNELS(T, SFX)                                                    \
	/* y[n, c_out, ho, wo] = conv(x, w) + b (b may be NULL) */                      \
	void loom_cpu_conv2d_fwd_##SFX(const loom_conv_shape *s, const T *x,            \
				       const T *w, const T *b, T *y, void *ws);         \
	/* dx = conv_transpose(dy, w) */                                                \
	void loom_cpu_conv2d_bwd_data_##SFX(const loom_conv_shape *s, const T *dy,      \
					    const T *w, T *dx, void *ws);               \
	/* dw = correlation of x and dy, summed over the batch */                      \
	void loom_cpu_conv2d_bwd_filter_##SFX(const loom_conv_shape *s, const T *dy,    \
					      const T *x, T *dw, void *ws);             \
	/* out[c] = sum over n and the hw spatial positions of x[n, c, hw] */          \
	void loom_cpu_channel_sum_##SFX(int n, int c, int64_t hw, const T *x, T *out);  \
	/* Training batch norm: biased variance for normalising; running stats      */ \
	/* updated in place with momentum and the unbiased variance (PyTorch).      */ \
	void loom_cpu_bn_fwd_train_##SFX(int n, int c, int64_t hw, const T *x,          \
					 const T *gamma, const T *beta, T *running_mean, \
					 T *running_var, double momentum, double eps,   \
					 T *y);                                         \
	void loom_cpu_bn_fwd_eval_##SFX(int n, int c, int64_t hw, const T *x,           \
					const T *gamma, const T *beta,                  \
					const T *running_mean, const T *running_var,    \
					double eps, T *y);                              \
	/* dx of training batch norm; batch mean/var recomputed from x */              \
	void loom_cpu_bn_bwd_data_##SFX(int n, int c, int64_t hw, const T *x,           \
					const T *gamma, const T *dy, double eps, T *dx);\
	/* dx, and where not NULL dgamma and dbeta, from one set of per-channel     */ \
	/* sums: equal bit for bit to bn_bwd_data, bn_bwd_gamma and channel_sum */      \
	void loom_cpu_bn_bwd_##SFX(int n, int c, int64_t hw, const T *x,                \
				   const T *gamma, const T *dy, double eps, T *dx,      \
				   T *dgamma, T *dbeta);                                \
	/* dgamma[c] = sum dy * xhat; dbeta is loom_cpu_channel_sum of dy */           \
	void loom_cpu_bn_bwd_gamma_##SFX(int n, int c, int64_t hw, const T *x,          \
					 const T *dy, double eps, T *dgamma);           \
	/* Synchronised batch norm, this rank's part: per channel the sums of x and  */ \
	/* x^2 (from centred sums) and, with dy (else NULL, sdy and sdyx unused),   */ \
	/* of dy and dy * x, in double */                                             \
	void loom_cpu_bn_local_sums_##SFX(int n, int c, int64_t hw, const T *x,         \
					  const T *dy, double *sx, double *sxx,         \
					  double *sdy, double *sdyx);                   \
	/* Training forward from given per-channel mean and biased variance over    */ \
	/* count values (the running variance is unbiased with count) */              \
	void loom_cpu_bn_fwd_apply_##SFX(int n, int c, int64_t hw, const T *x,          \
					 const T *gamma, const T *beta, T *running_mean, \
					 T *running_var, double momentum, double eps,   \
					 const double *mean, const double *var,         \
					 double count, T *y);                           \
	/* dx from given per-channel mean, biased variance, sum dy and              */ \
	/* sum dy * (x - mean) over count values */                                   \
	void loom_cpu_bn_bwd_data_apply_##SFX(int n, int c, int64_t hw, const T *x,     \
					      const T *gamma, const T *dy, double eps,  \
					      const double *mean, const double *var,    \
					      const double *sdy, const double *sdyx,    \
					      double count, T *dx);                     \
	/* Max pooling; padding never wins; ties go to the first element (PyTorch) */  \
	void loom_cpu_maxpool2d_fwd_##SFX(const loom_pool_shape *s, const T *x, T *y);  \
	void loom_cpu_maxpool2d_bwd_##SFX(const loom_pool_shape *s, const T *x,         \
					  const T *dy, T *dx);                          \
	/* C[M,N] = alpha * op(A) op(B) + beta * C, row-major, op = transpose if t */   \
	void loom_cpu_gemm_##SFX(int ta, int tb, int m, int n, int k, double alpha,     \
				 const T *a, const T *b, double beta, T *c);            \
	/* y[N,out] = x[N,in] w[out,in]^T + b (b may be NULL) */                        \
	void loom_cpu_linear_fwd_##SFX(int n, int in, int out, const T *x, const T *w,  \
				       const T *b, T *y);                               \
	/* loss = mean over rows of logsumexp(logits) - logits[label]. Returns -1   */ \
	/* and writes nothing if a label is out of range (its index in *bad).       */ \
	int loom_cpu_softmax_ce_fwd_##SFX(int n, int classes, const T *logits,          \
					  const int32_t *labels, T *loss, int *bad);    \
	/* dlogits = (softmax - onehot) * dloss / n; dlogits may be logits */         \
	void loom_cpu_softmax_ce_bwd_##SFX(int n, int classes, const T *logits,         \
					   const int32_t *labels, const T *dloss,       \
					   T *dlogits);                                 \
	void loom_cpu_relu_fwd_##SFX(int64_t n, const T *x, T *y);                     \
	/* dx = dy where x > 0, else 0 */                                              \
	void loom_cpu_relu_bwd_##SFX(int64_t n, const T *x, const T *dy, T *dx);        \
	void loom_cpu_add_##SFX(int64_t n, const T *a, const T *b, T *y);              \
	/* *y = sum of x (pairwise or blocked, so that f32 sums of 1e6 stay exact   */ \
	/* to a few ulps) */                                                           \
	void loom_cpu_sum_##SFX(int64_t n, const T *x, T *y);                          \
	/* y[i] = *x * scale for all n elements */                                     \
	void loom_cpu_broadcast_scalar_##SFX(int64_t n, const T *x, double scale, T *y); \
	/* y[nc] = mean of the hw values of plane nc (global average pooling) */       \
	void loom_cpu_global_avgpool_fwd_##SFX(int64_t nc, int64_t hw, const T *x, T *y); \
	/* dx[nc, i] = dy[nc] / hw */                                                   \
	void loom_cpu_global_avgpool_bwd_##SFX(int64_t nc, int64_t hw, const T *dy, T *dx);

LOOM_CPU_KERNELS(float, f32)
LOOM_CPU_KERNELS(double, f64)

/* GELU (graph/unary.h) in f32: y = gelu(x) when dy is NULL, else
 * dx = dy gelu'(x); tanh_form: GPT-2's form. Vectorised through libmvec
 * (elementwise.c); f64 stays on the scalar row loop (ops_elementwise.c). */
void loom_cpu_gelu_f32(int64_t n, const float *x, const float *dy, int tanh_form, float *y);

/* bf16 in, bf16 out, f32 inside (elementwise.c), bit for bit the widen /
 * f32 kernel / round path of backend.c. op: LOOM_CPU_EW_ADD (y = a + b,
 * then relu if flag), _RELU (y = relu a), _RELU_BWD (y = a > 0 ? b : 0),
 * _GELU (y = gelu a if b is NULL, else b gelu'(a); flag: the tanh form). */
enum { LOOM_CPU_EW_ADD, LOOM_CPU_EW_RELU, LOOM_CPU_EW_RELU_BWD, LOOM_CPU_EW_GELU };
void loom_cpu_ew_bf16(int op, int flag, int64_t n, const uint16_t *a, const uint16_t *b,
		      uint16_t *y);

/* Max pooling (and its fused relu) on bf16, f32 inside: out = y when dy is
 * NULL, else dx; whole planes widened on the stack, the f32 kernel, rounded:
 * the same bits as widen / f32 kernel / round. Returns 0 (nothing done)
 * when one plane's f32 copies do not fit its stack buffer. */
int loom_cpu_maxpool2d_bf16(const loom_pool_shape *s, const uint16_t *x, const uint16_t *dy,
			    uint16_t *out);

/* Softmax rows' exponentials in double through libmvec (elementwise.c):
 * exp_sum returns the sum over i < n of exp(x[i] - m); exp_inplace writes
 * x[i] = exp(x[i] - m) rounded to float and returns the sum of the unrounded
 * values; exp_scale writes y[i] = exp(x[i] - m) * g rounded (y may be x). */
double loom_cpu_exp_sum_f32(int64_t n, const float *x, double m);
double loom_cpu_exp_inplace_f32(int64_t n, float *x, double m);
void loom_cpu_exp_scale_f32(int64_t n, const float *x, double m, double g, float *y);

/*
 * Native bf16 products (conv_bf16.c): bf16 sources as uint16 bit patterns,
 * fp32 accumulation, fp32 results; the conv kernels take the workspace of
 * loom_cpu_conv2d_workspace(s, 4). Only where loom_cpu_bf16_native() says
 * the CPU multiplies bf16 itself (avx512_bf16); elsewhere they return -1
 * and write nothing, and callers keep the exact widen-to-f32 emulation.
 */
int loom_cpu_bf16_native(void);
int loom_cpu_conv2d_fwd_bf16(const loom_conv_shape *s, const uint16_t *x, const uint16_t *w,
			     const float *b, float *y, void *ws);
int loom_cpu_conv2d_bwd_data_bf16(const loom_conv_shape *s, const uint16_t *dy,
				  const uint16_t *w, float *dx, void *ws);
int loom_cpu_conv2d_bwd_filter_bf16(const loom_conv_shape *s, const uint16_t *dy,
				    const uint16_t *x, float *dw, void *ws);
/* C[M,N] = alpha op(A) op(B) + beta C as loom_cpu_gemm_f32, A and B bf16 */
int loom_cpu_gemm_bf16f32(int ta, int tb, int m, int n, int k, double alpha,
			  const uint16_t *a, const uint16_t *b, double beta, float *c);

#endif /* LOOM_ENGINE_CPU_KERNELS_H */
