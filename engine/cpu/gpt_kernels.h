/*
 * engine/cpu/gpt_kernels.h — the CPU kernels of the transformer ops
 * (engine/cpu/gpt_impl.h, instantiated by gpt.c for f32 and f64):
 * embedding gather and scatter-add, layer norm over the last dim, and
 * causal attention over a fused qkv [B, T, 3C]. Products go through the
 * chosen GEMM path (cpu_path.c), one single-threaded GEMM per (batch, head)
 * with OpenMP over them; every kernel overwrites its output.
 */
#ifndef LOOM_ENGINE_CPU_GPT_KERNELS_H
#define LOOM_ENGINE_CPU_GPT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* The attention geometry: qkv [b, t, 3c], c = nh * hs. */
typedef struct loom_attn_shape {
	int b, t, c, nh;
} loom_attn_shape;

#define LOOM_CPU_GPT_KERNELS(T, SFX)                                                    \
	/* y[i, :] = table[ids[i], :] for n ids; returns -1 (and writes nothing)     */ \
	/* when an id is outside [0, v), its index in *bad */                            \
	int loom_cpu_embedding_fwd_##SFX(int64_t n, int v, int c, const int32_t *ids,     \
					 const T *table, T *y, int64_t *bad);             \
	/* dtable = 0, then dtable[ids[i], :] += dy[i, :] (out-of-range ids skipped) */  \
	void loom_cpu_embedding_bwd_##SFX(int64_t n, int v, int c, const int32_t *ids,    \
					  const T *dy, T *dtable);                        \
	/* y = (x - mean) / sqrt(var + eps) * gamma + beta over each row of c */         \
	void loom_cpu_layernorm_fwd_##SFX(int64_t rows, int c, const T *x, const T *gamma, \
					  const T *beta, double eps, T *y);               \
	void loom_cpu_layernorm_bwd_data_##SFX(int64_t rows, int c, const T *x,          \
					       const T *gamma, const T *dy, double eps,   \
					       T *dx);                                    \
	/* dgamma[j] = sum over rows of dy * xhat; ws: c doubles per thread slot */      \
	void loom_cpu_layernorm_bwd_gamma_##SFX(int64_t rows, int c, const T *x,         \
						const T *dy, double eps, T *dgamma,       \
						double *ws);                              \
	/* p[b, h] = causal softmax(q k^T / sqrt(hs)), 0 above the diagonal */           \
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
	/* Row pieces of the kernels above, for gpt_bf16.c's blocks of widened rows: */  \
	/* acc[j] += dy xhat (layer norm's dgamma, in double), */                        \
	void loom_cpu_layernorm_gamma_rows_##SFX(int64_t rows, int c, const T *x,        \
						 const T *dy, double eps, double *acc);  \
	/* *total += logsumexp(row) - row[label] in row order (dense_impl.h), */         \
	void loom_cpu_softmax_ce_rows_##SFX(int n, int classes, const T *logits,          \
					    const int32_t *labels, double *total);        \
	/* dlogits of n rows for g = dloss / (all rows) (dense_impl.h) */                \
	void loom_cpu_softmax_ce_bwd_rows_##SFX(int n, int classes, const T *logits,      \
						const int32_t *labels, double g, T *dlogits);

/* Bytes of workspace of the kernels that take one (elem: 4 or 8). */
size_t loom_cpu_layernorm_bwd_gamma_ws(int c);
size_t loom_cpu_attn_probs_bwd_ws(int t, size_t elem);

LOOM_CPU_GPT_KERNELS(float, f32)
LOOM_CPU_GPT_KERNELS(double, f64)

/*
 * The same kernels on bf16 storage (gpt_bf16.c): each float argument is f32
 * or bf16 as bit i of `half` says (LOOM_CPU_BF16_SRC(i) for the i-th float
 * source, LOOM_CPU_BF16_OUT for the result). They widen a block of rows (a
 * batch for attention) at a time, run the f32 kernel on it and round its
 * result once per element: fp32 inside and the same bits as widening whole
 * tensors, the f32 kernel and a rounding pass (backend.c's emulation), in
 * one pass over memory. Conversions: bf16_rows.c, AVX2 where the CPU has
 * it. They return 0 and touch nothing when they decline (a row wider than
 * their blocks); the caller then takes the emulation.
 */
#define LOOM_CPU_BF16_SRC(i) (1u << (i))
#define LOOM_CPU_BF16_OUT (1u << 7)

/* Floats per widened block of rows (on the stack, per thread and array). */
#define LOOM_CPU_BF16_ROWS 4096

/* bf16 <-> f32 over n elements, serial (bf16_rows.c's copy for the CPU). */
void loom_cpu_bf16_widen(int64_t n, const uint16_t *src, float *dst);
void loom_cpu_bf16_round(int64_t n, const float *src, uint16_t *dst);
/* acc[i] += widened src[i] */
void loom_cpu_bf16_acc(int64_t n, const uint16_t *src, float *acc);

int loom_cpu_layernorm_fwd_bf16(int64_t rows, int c, const void *x, const void *gamma,
				const void *beta, double eps, void *y, unsigned half);
int loom_cpu_layernorm_bwd_data_bf16(int64_t rows, int c, const void *x, const void *gamma,
				     const void *dy, double eps, void *dx, unsigned half);
/* ws: loom_cpu_layernorm_bwd_gamma_ws(c) bytes */
int loom_cpu_layernorm_bwd_gamma_bf16(int64_t rows, int c, const void *x, const void *dy,
				      double eps, void *dgamma, double *ws, unsigned half);

/* The attention kernels, one batch at a time. */
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

/* The loss (f32) from f32 or bf16 logits; ws: `classes` floats. -1 and
 * *bad on a label outside [0, classes), as the f32 kernel. */
int loom_cpu_softmax_ce_fwd_bf16(int n, int classes, const void *logits, const int32_t *labels,
				 float *loss, int *bad, float *ws, unsigned half);
/* dlogits from logits and dloss (sources 0 and 2, as the node's); ws: 2 * classes floats. */
int loom_cpu_softmax_ce_bwd_bf16(int n, int classes, const void *logits, const int32_t *labels,
				 const void *dloss, void *dlogits, float *ws, unsigned half);
/* A bf16 table gathered into bf16 rows: a copy, no conversion. */
int loom_cpu_embedding_fwd_bf16(int64_t n, int v, int c, const int32_t *ids,
				const uint16_t *table, uint16_t *y, int64_t *bad);
/* The scatter-add of bf16 or f32 dy in f32 (ws: v * c floats), rounded
 * once into a bf16 or f32 dtable. */
int loom_cpu_embedding_bwd_bf16(int64_t n, int v, int c, const int32_t *ids, const void *dy,
				void *dtable, float *ws, unsigned half);

#endif /* LOOM_ENGINE_CPU_GPT_KERNELS_H */
