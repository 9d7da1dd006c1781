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
					      const T *dy, T *dqkv);

/* Bytes of workspace of the kernels that take one (elem: 4 or 8). */
size_t loom_cpu_layernorm_bwd_gamma_ws(int c);
size_t loom_cpu_attn_probs_bwd_ws(int t, size_t elem);

LOOM_CPU_GPT_KERNELS(float, f32)
LOOM_CPU_GPT_KERNELS(double, f64)

#endif /* LOOM_ENGINE_CPU_GPT_KERNELS_H */
