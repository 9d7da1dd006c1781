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

/*
 * The op families that hold their kernels and their entries in one file
 * each (layernorm.c, rmsnorm.c, attention.c, embedding.c, softmax_xent.c):
 * f32 and f64 from one text, and a *_bf16 copy reading and writing bf16
 * (below). Products go through the chosen GEMM path (cpu_path.c), one
 * single-threaded GEMM per (batch, head) with OpenMP over them; every
 * kernel overwrites its output.
 */

/* The attention geometry: qkv [b, t, 3c], c = nh * hs. */
typedef struct loom_attn_shape {
	int b, t, c, nh;
} loom_attn_shape;

#define LOOM_CPU_FAMILY_KERNELS(T, SFX)                                                 \
	/* embedding.c: y[i, :] = table[ids[i], :] for n ids; returns -1 (and       */ \
	/* writes nothing) when an id is outside [0, v), its index in *bad */            \
	int loom_cpu_embedding_fwd_##SFX(int64_t n, int v, int c, const int32_t *ids,     \
					 const T *table, T *y, int64_t *bad);             \
	/* dtable = 0, then dtable[ids[i], :] += dy[i, :] (out-of-range ids skipped) */  \
	void loom_cpu_embedding_bwd_##SFX(int64_t n, int v, int c, const int32_t *ids,    \
					  const T *dy, T *dtable);                        \
	/* layernorm.c: y = (x - mean) / sqrt(var + eps) * gamma + beta per row of c */  \
	void loom_cpu_layernorm_fwd_##SFX(int64_t rows, int c, const T *x, const T *gamma, \
					  const T *beta, double eps, T *y);               \
	void loom_cpu_layernorm_bwd_data_##SFX(int64_t rows, int c, const T *x,          \
					       const T *gamma, const T *dy, double eps,   \
					       T *dx);                                    \
	/* acc[j] += dy xhat over rows (one thread's share of dgamma, in double) */     \
	void loom_cpu_layernorm_gamma_rows_##SFX(int64_t rows, int c, const T *x,        \
						 const T *dy, double eps, double *acc);  \
	/* rmsnorm.c: y = x / sqrt(mean(x^2) + eps) * gamma per row of c; dx;      */ \
	/* its rows' share of dgamma */                                                  \
	void loom_cpu_rmsnorm_fwd_##SFX(int64_t rows, int c, const T *x, const T *gamma,  \
					double eps, T *y);                                \
	void loom_cpu_rmsnorm_bwd_data_##SFX(int64_t rows, int c, const T *x,            \
					     const T *gamma, const T *dy, double eps,     \
					     T *dx);                                      \
	void loom_cpu_rmsnorm_gamma_rows_##SFX(int64_t rows, int c, const T *x,          \
					       const T *dy, double eps, double *acc);    \
	/* norm_bf16.c: a row norm's dgamma[j] = sum over rows of dy * xhat, each   */ \
	/* thread's rows summed by rows_fn (the norm's gamma_rows) into its slot of */ \
	/* ws (loom_cpu_norm_bwd_gamma_ws(c) bytes), the slots added in order       */ \
	void loom_cpu_norm_bwd_gamma_##SFX(void (*rows_fn)(int64_t rows, int c,          \
							   const T *x, const T *dy,      \
							   double eps, double *acc),     \
					   int64_t rows, int c, const T *x, const T *dy,  \
					   double eps, T *dgamma, double *ws);            \
	/* attention.c: p[b, h] = causal softmax(q k^T / sqrt(hs)), 0 above the      */ \
	/* diagonal */                                                                   \
	void loom_cpu_attn_probs_fwd_##SFX(const loom_attn_shape *s, const T *qkv, T *p); \
	/* dqkv: q and k parts from (p, dp), v part 0; ws: t*t T per thread slot */      \
	void loom_cpu_attn_probs_bwd_##SFX(const loom_attn_shape *s, const T *qkv,        \
					   const T *p, const T *dp, T *dqkv, T *ws);      \
	/* y[b, :, h] = p[b, h] v[b, :, h] */                                            \
	void loom_cpu_attention_fwd_##SFX(const loom_attn_shape *s, const T *p,           \
					  const T *qkv, T *y);                            \
	/* dp[b, h] = dy[b, :, h] v[b, :, h]^T */                                        \
	void loom_cpu_attention_bwd_probs_##SFX(const loom_attn_shape *s, const T *qkv,   \
						const T *dy, T *dp);                      \
	/* dqkv: v part p^T dy, q and k parts 0 */                                       \
	void loom_cpu_attention_bwd_qkv_##SFX(const loom_attn_shape *s, const T *p,       \
					      const T *dy, T *dqkv);                      \
	/* softmax_xent.c: loss = mean over rows of logsumexp(logits) -               */ \
	/* logits[label]. Returns -1 and writes nothing if a label is out of range   */ \
	/* (its index in *bad). */                                                       \
	int loom_cpu_softmax_ce_fwd_##SFX(int n, int classes, const T *logits,           \
					  const int32_t *labels, T *loss, int *bad);     \
	/* dlogits = (softmax - onehot) * dloss / n; dlogits may be logits */          \
	void loom_cpu_softmax_ce_bwd_##SFX(int n, int classes, const T *logits,          \
					   const int32_t *labels, const T *dloss,        \
					   T *dlogits);                                  \
	/* the same over rows of pitch ld >= classes (a padded vocabulary's       */ \
	/* logits); the backward writes zero in each row's last ld - classes   */ \
	int loom_cpu_softmax_ce_fwd_ld_##SFX(int n, int classes, int ld, const T *logits, \
					     const int32_t *labels, T *loss, int *bad);  \
	void loom_cpu_softmax_ce_bwd_ld_##SFX(int n, int classes, int ld, const T *logits, \
					      const int32_t *labels, const T *dloss,     \
					      T *dlogits);                               \
	/* *total += logsumexp(row) - row[label] in row order */                        \
	void loom_cpu_softmax_ce_rows_##SFX(int n, int classes, const T *logits,          \
					    const int32_t *labels, double *total);        \
	/* dlogits of n rows for g = dloss / (all rows) */                               \
	void loom_cpu_softmax_ce_bwd_rows_##SFX(int n, int classes, const T *logits,      \
						const int32_t *labels, double g, T *dlogits);

LOOM_CPU_FAMILY_KERNELS(float, f32)
LOOM_CPU_FAMILY_KERNELS(double, f64)

/* Bytes of workspace of the family kernels that take one (elem: 4 or 8). */
size_t loom_cpu_attn_probs_bwd_ws(int t, size_t elem);
/* layer norm's and RMS norm's dgamma (norm_bf16.c) */
size_t loom_cpu_norm_bwd_gamma_ws(int c);

/*
 * The family kernels on bf16 storage: each float argument is f32 or bf16 as
 * bit i of `half` says (LOOM_CPU_BF16_SRC(i) for the i-th float source,
 * LOOM_CPU_BF16_OUT for the result). They widen a block of rows (a batch
 * for attention) at a time, run the f32 kernel on it and round its result
 * once per element: fp32 inside and the same bits as widening whole
 * tensors, the f32 kernel and a rounding pass (backend.c's emulation), in
 * one pass over memory. They return 0 and touch nothing when they decline
 * (a row wider than their blocks); the caller then takes the emulation.
 */
#define LOOM_CPU_BF16_SRC(i) (1u << (i))
#define LOOM_CPU_BF16_OUT (1u << 7)

/* Floats per widened block of rows (on the stack, per thread and array). */
#define LOOM_CPU_BF16_ROWS 4096

/* bf16 <-> f32 over n elements, serial (bf16_rows.c's copy for the CPU,
 * AVX2 where it has it). */
void loom_cpu_bf16_widen(int64_t n, const uint16_t *src, float *dst);
void loom_cpu_bf16_round(int64_t n, const float *src, uint16_t *dst);
/* acc[i] += widened src[i] */
void loom_cpu_bf16_acc(int64_t n, const uint16_t *src, float *acc);

/* layernorm.c, rmsnorm.c: the forward (RMS norm's sources x, gamma) */
int loom_cpu_layernorm_fwd_bf16(int64_t rows, int c, const void *x, const void *gamma,
				const void *beta, double eps, void *y, unsigned half);
int loom_cpu_rmsnorm_fwd_bf16(int64_t rows, int c, const void *x, const void *gamma, double eps,
			      void *y, unsigned half);

/* A row norm's f32 row kernels (layer norm, RMS norm; beta NULL for RMS
 * norm's forward) and their bf16 storage around them (norm_bf16.c); 0: c
 * past LOOM_CPU_BF16_ROWS. The gamma one's ws: loom_cpu_norm_bwd_gamma_ws(c)
 * bytes. */
typedef void (*loom_cpu_norm_fwd_f32)(int64_t rows, int c, const float *x, const float *gamma,
				      const float *beta, double eps, float *y);
int loom_cpu_norm_fwd_bf16(loom_cpu_norm_fwd_f32 kernel, int64_t rows, int c, const void *x,
			   const void *gamma, const void *beta, double eps, void *y, unsigned half);
typedef void (*loom_cpu_norm_bwd_data_f32)(int64_t rows, int c, const float *x,
					   const float *gamma, const float *dy, double eps,
					   float *dx);
typedef void (*loom_cpu_norm_gamma_rows_f32)(int64_t rows, int c, const float *x,
					     const float *dy, double eps, double *acc);
int loom_cpu_norm_bwd_data_bf16(loom_cpu_norm_bwd_data_f32 kernel, int64_t rows, int c,
				const void *x, const void *gamma, const void *dy, double eps,
				void *dx, unsigned half);
int loom_cpu_norm_bwd_gamma_bf16(loom_cpu_norm_gamma_rows_f32 kernel, int64_t rows, int c,
				 const void *x, const void *dy, double eps, void *dgamma,
				 double *ws, unsigned half);

/* attention.c: the attention kernels, one batch at a time. */
typedef enum loom_cpu_attn_kernel {
	LOOM_CPU_ATTN_PROBS_FWD,      /* (qkv) -> p */
	LOOM_CPU_ATTN_PROBS_BWD,      /* (qkv, p, dp) -> dqkv */
	LOOM_CPU_ATTENTION_FWD,       /* (p, qkv) -> y */
	LOOM_CPU_ATTENTION_BWD_PROBS, /* (qkv, dy) -> dp */
	LOOM_CPU_ATTENTION_BWD_QKV,   /* (p, dy) -> dqkv */
} loom_cpu_attn_kernel;
/* Threads over the batches, each with the f32 kernel's ws and one batch of
 * every bf16 array in f32, as many as ws_bytes holds (one: the batches in
 * turn, the kernel's threads over the heads); 0 when not even that fits.
 * loom_cpu_attn_bf16_ws: enough bytes for any mask. */
size_t loom_cpu_attn_bf16_ws(loom_cpu_attn_kernel k, const loom_attn_shape *s);
int loom_cpu_attn_bf16(loom_cpu_attn_kernel k, const loom_attn_shape *s, const void *const *src,
		       void *out, void *ws, size_t ws_bytes, unsigned half);

/* softmax_xent.c: the loss (f32) from f32 or bf16 logits; ws: `classes`
 * floats. -1 and *bad on a label outside [0, classes), as the f32 kernel. */
int loom_cpu_softmax_ce_fwd_bf16(int n, int classes, const void *logits, const int32_t *labels,
				 float *loss, int *bad, float *ws, unsigned half);
/* dlogits from logits and dloss (sources 0 and 2, as the node's); ws: 2 * classes floats. */
int loom_cpu_softmax_ce_bwd_bf16(int n, int classes, const void *logits, const int32_t *labels,
				 const void *dloss, void *dlogits, float *ws, unsigned half);
/* The same over rows of pitch ld >= classes (a padded vocabulary's logits:
 * the loss over each row's first `classes`, zero dlogits in the rest). */
int loom_cpu_softmax_ce_fwd_ld_bf16(int n, int classes, int ld, const void *logits,
				    const int32_t *labels, float *loss, int *bad, float *ws,
				    unsigned half);
int loom_cpu_softmax_ce_bwd_ld_bf16(int n, int classes, int ld, const void *logits,
				    const int32_t *labels, const void *dloss, void *dlogits,
				    float *ws, unsigned half);

/* embedding.c: a bf16 table gathered into bf16 rows: a copy, no conversion. */
int loom_cpu_embedding_fwd_bf16(int64_t n, int v, int c, const int32_t *ids,
				const uint16_t *table, uint16_t *y, int64_t *bad);
/* The scatter-add of bf16 or f32 dy in f32 (ws: v * c floats), rounded
 * once into a bf16 or f32 dtable. */
int loom_cpu_embedding_bwd_bf16(int64_t n, int v, int c, const int32_t *ids, const void *dy,
				void *dtable, float *ws, unsigned half);

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

/* FP8_QDQ's f32 kernel (fp8_qdq.c): y = fp8(x * s) / s over n elements
 * (y may be x), s = loom_fp8_scale(amax of x, the format's largest finite),
 * fmt LOOM_FP8_E4M3 or LOOM_FP8_E5M2. */
void loom_cpu_fp8_qdq_f32(const float *x, float *y, int64_t n, loom_dtype fmt);
/* A stored FP8_QDQ value's n codes of format fmt and their scale
 * (graph/ops/ops.h, loom_fp8_stored) decoded into y in dtype odt (f32,
 * bf16 or f16; the storage pass leaves f64 alone): code -> f32 -> times
 * 1/scale -> odt, the bits the unstored node writes. */
void loom_cpu_fp8_decode(loom_dtype fmt, const void *stored, int64_t n, loom_dtype odt,
			 void *y);

#endif /* LOOM_ENGINE_CPU_KERNELS_H */
