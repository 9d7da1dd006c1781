/*
 * engine/cpu/gpt_bf16.c — layer norm, attention, softmax cross-entropy and
 * embedding reading and writing bf16 (gpt_kernels.h's *_bf16): a block of
 * rows (a batch for attention) is widened into f32, the f32 kernel runs on
 * it, its result is rounded once per element. fp32 inside and the same bits
 * as backend.c's emulation (whole tensors widened into scratch, the f32
 * kernel, a rounding pass), without the scratch's passes over memory. The
 * conversions are bf16_rows.c's, the copy for the CPU's instruction set.
 */
#include <string.h>

#include "base/half.h"
#include "engine/cpu/cpu_internal.h"
#include "engine/cpu/gpt_kernels.h"

#define ROWS LOOM_CPU_BF16_ROWS

/* Multiply-adds of attention below which its batches are not worth
 * splitting over threads (gpt.c's LOOM_CPU_GEMM_PAR_MIN). */
#define LOOM_CPU_ATTN_PAR_MIN (1 << 21)

#define BF16_ROWS_DECL(V)                                                              \
	void loom_cpu_bf16_widen_f32_##V(int64_t n, const uint16_t *src, float *dst);   \
	void loom_cpu_bf16_round_f32_##V(int64_t n, const float *src, uint16_t *dst);   \
	void loom_cpu_bf16_acc_f32_##V(int64_t n, const uint16_t *src, float *acc);
BF16_ROWS_DECL(base)
BF16_ROWS_DECL(avx2)
#undef BF16_ROWS_DECL

static int use_avx2(void)
{
	return loom_cpu_isa_get() >= LOOM_CPU_ISA_AVX2;
}

void loom_cpu_bf16_widen(int64_t n, const uint16_t *src, float *dst)
{
	(use_avx2() ? loom_cpu_bf16_widen_f32_avx2 : loom_cpu_bf16_widen_f32_base)(n, src, dst);
}

void loom_cpu_bf16_round(int64_t n, const float *src, uint16_t *dst)
{
	(use_avx2() ? loom_cpu_bf16_round_f32_avx2 : loom_cpu_bf16_round_f32_base)(n, src, dst);
}

void loom_cpu_bf16_acc(int64_t n, const uint16_t *src, float *acc)
{
	(use_avx2() ? loom_cpu_bf16_acc_f32_avx2 : loom_cpu_bf16_acc_f32_base)(n, src, acc);
}

/* Elements [off, off + n) of a source as f32: widened into buf when bf16. */
static const float *in_f32(const void *p, int bf16, int64_t off, int64_t n, float *buf)
{
	if (!bf16)
		return (const float *)p + off;
	loom_cpu_bf16_widen(n, (const uint16_t *)p + off, buf);
	return buf;
}

/* Where the f32 kernel writes elements [off, ...) of a result: buf when
 * the result is bf16 (out_done rounds it into place). */
static float *out_f32(void *p, int bf16, int64_t off, float *buf)
{
	return bf16 ? buf : (float *)p + off;
}

static void out_done(void *p, int bf16, int64_t off, int64_t n, const float *buf)
{
	if (bf16)
		loom_cpu_bf16_round(n, buf, (uint16_t *)p + off);
}

/* ------------------------------------------------------------ layer norm */

int loom_cpu_layernorm_fwd_bf16(int64_t rows, int c, const void *x, const void *gamma,
				const void *beta, double eps, void *y, unsigned half)
{
	if (c <= 0 || c > ROWS)
		return 0;
	const int64_t per = ROWS / c, nb = (rows + per - 1) / per;
#pragma omp parallel if (rows * c >= LOOM_CPU_PAR_MIN)
	{
		float xb[ROWS] __attribute__((aligned(64))), yb[ROWS] __attribute__((aligned(64)));
		float gb[ROWS] __attribute__((aligned(64))), bb[ROWS] __attribute__((aligned(64)));
		const float *g = in_f32(gamma, half & LOOM_CPU_BF16_SRC(1), 0, c, gb);
		const float *b = in_f32(beta, half & LOOM_CPU_BF16_SRC(2), 0, c, bb);
#pragma omp for schedule(static)
		for (int64_t k = 0; k < nb; k++) {
			int64_t r0 = k * per, nr = rows - r0 < per ? rows - r0 : per;
			const float *xs = in_f32(x, half & LOOM_CPU_BF16_SRC(0), r0 * c, nr * c, xb);
			float *ys = out_f32(y, half & LOOM_CPU_BF16_OUT, r0 * c, yb);
			loom_cpu_layernorm_fwd_f32(nr, c, xs, g, b, eps, ys);
			out_done(y, half & LOOM_CPU_BF16_OUT, r0 * c, nr * c, ys);
		}
	}
	return 1;
}

int loom_cpu_layernorm_bwd_data_bf16(int64_t rows, int c, const void *x, const void *gamma,
				     const void *dy, double eps, void *dx, unsigned half)
{
	if (c <= 0 || c > ROWS)
		return 0;
	const int64_t per = ROWS / c, nb = (rows + per - 1) / per;
#pragma omp parallel if (rows * c >= LOOM_CPU_PAR_MIN)
	{
		float xb[ROWS] __attribute__((aligned(64))), gb[ROWS] __attribute__((aligned(64)));
		float db[ROWS] __attribute__((aligned(64))), ob[ROWS] __attribute__((aligned(64)));
		const float *g = in_f32(gamma, half & LOOM_CPU_BF16_SRC(1), 0, c, gb);
#pragma omp for schedule(static)
		for (int64_t k = 0; k < nb; k++) {
			int64_t r0 = k * per, nr = rows - r0 < per ? rows - r0 : per;
			const float *xs = in_f32(x, half & LOOM_CPU_BF16_SRC(0), r0 * c, nr * c, xb);
			const float *ds = in_f32(dy, half & LOOM_CPU_BF16_SRC(2), r0 * c, nr * c, db);
			float *os = out_f32(dx, half & LOOM_CPU_BF16_OUT, r0 * c, ob);
			loom_cpu_layernorm_bwd_data_f32(nr, c, xs, g, ds, eps, os);
			out_done(dx, half & LOOM_CPU_BF16_OUT, r0 * c, nr * c, os);
		}
	}
	return 1;
}

/* The f32 kernel's threads, row ranges and ordered sum of the slots, with
 * each thread's rows widened a block at a time. */
int loom_cpu_layernorm_bwd_gamma_bf16(int64_t rows, int c, const void *x, const void *dy,
				      double eps, void *dgamma, double *ws, unsigned half)
{
	if (c <= 0 || c > ROWS)
		return 0;
	int nt = rows * c >= LOOM_CPU_PAR_MIN ?
			 loom_cpu_slot_threads(rows < 65536 ? (int)rows : 65536) : 1;
	const int64_t per = ROWS / c;
	memset(ws, 0, sizeof(double) * (size_t)nt * c);
#pragma omp parallel num_threads(nt)
	{
		float xb[ROWS] __attribute__((aligned(64))), db[ROWS] __attribute__((aligned(64)));
		int t = omp_get_thread_num(), cnt = omp_get_num_threads();
		int64_t r0 = rows * t / cnt, r1 = rows * (t + 1) / cnt;
		for (int64_t r = r0; r < r1; r += per) {
			int64_t nr = r1 - r < per ? r1 - r : per;
			const float *xs = in_f32(x, half & LOOM_CPU_BF16_SRC(0), r * c, nr * c, xb);
			const float *ds = in_f32(dy, half & LOOM_CPU_BF16_SRC(1), r * c, nr * c, db);
			loom_cpu_layernorm_gamma_rows_f32(nr, c, xs, ds, eps, ws + (size_t)t * c);
		}
	}
	for (int j = 0; j < c; j++) {
		double s = 0;
		for (int t = 0; t < nt; t++)
			s += ws[(size_t)t * c + j];
		if (half & LOOM_CPU_BF16_OUT)
			((uint16_t *)dgamma)[j] = loom_f32_to_bf16((float)s);
		else
			((float *)dgamma)[j] = (float)s;
	}
	return 1;
}

/* ------------------------------------------------------------- attention */

enum { ATT_QKV, ATT_P, ATT_Y };

/* Each kernel's sources and result, as one batch's kinds of array. */
static const struct {
	int nsrc, src[3], out;
} attn_io[] = {
	[LOOM_CPU_ATTN_PROBS_FWD] = { 1, { ATT_QKV }, ATT_P },
	[LOOM_CPU_ATTN_PROBS_BWD] = { 3, { ATT_QKV, ATT_P, ATT_P }, ATT_QKV },
	[LOOM_CPU_ATTENTION_FWD] = { 2, { ATT_P, ATT_QKV }, ATT_Y },
	[LOOM_CPU_ATTENTION_BWD_PROBS] = { 2, { ATT_QKV, ATT_Y }, ATT_P },
	[LOOM_CPU_ATTENTION_BWD_QKV] = { 2, { ATT_P, ATT_Y }, ATT_QKV },
};

static int64_t attn_batch_elems(int kind, const loom_attn_shape *s)
{
	if (kind == ATT_QKV)
		return (int64_t)s->t * 3 * s->c;
	if (kind == ATT_P)
		return (int64_t)s->nh * s->t * s->t;
	return (int64_t)s->t * s->c;
}

static size_t align64(size_t x)
{
	return (x + 63) & ~(size_t)63;
}

/* The f32 kernel's own ws for thread slots (attn_probs_bwd's dS). */
static size_t attn_kernel_ws(loom_cpu_attn_kernel k, const loom_attn_shape *s, int slots)
{
	return k == LOOM_CPU_ATTN_PROBS_BWD ? align64(4 * (size_t)slots * s->t * s->t) : 0;
}

/* One batch of each bf16 array in f32. */
static size_t attn_slices(loom_cpu_attn_kernel k, const loom_attn_shape *s, unsigned half)
{
	size_t ws = 0;
	for (int i = 0; i < attn_io[k].nsrc; i++)
		if (half & LOOM_CPU_BF16_SRC(i))
			ws += align64(4 * (size_t)attn_batch_elems(attn_io[k].src[i], s));
	if (half & LOOM_CPU_BF16_OUT)
		ws += align64(4 * (size_t)attn_batch_elems(attn_io[k].out, s));
	return ws;
}

/* Threads over the batches worth their regions. */
static int attn_threads(const loom_attn_shape *s)
{
	double flops = (double)s->b * s->nh * s->t * s->t * (s->c / s->nh);
	return flops >= LOOM_CPU_ATTN_PAR_MIN ? loom_cpu_slot_threads(s->b) : 1;
}

/* Bytes of ws for nt threads over the batches (see loom_cpu_attn_bf16). */
static size_t attn_layout(loom_cpu_attn_kernel k, const loom_attn_shape *s, unsigned half, int nt)
{
	if (nt <= 1)
		return attn_kernel_ws(k, s, loom_cpu_slots()) + attn_slices(k, s, half);
	return (size_t)nt * (attn_kernel_ws(k, s, 1) + attn_slices(k, s, half));
}

size_t loom_cpu_attn_bf16_ws(loom_cpu_attn_kernel k, const loom_attn_shape *s)
{
	size_t one = attn_layout(k, s, ~0u, 1), many = attn_layout(k, s, ~0u, attn_threads(s));
	return one > many ? one : many;
}

/* Batch b through the f32 kernel: its bf16 arrays widened into the slices
 * at `at`, its result rounded from there; kws the kernel's ws. */
static void attn_batch(loom_cpu_attn_kernel k, const loom_attn_shape *one, int b,
		       const void *const *src, void *out, unsigned char *at, void *kws,
		       unsigned half)
{
	const float *in[3];
	for (int i = 0; i < attn_io[k].nsrc; i++) {
		int64_t per = attn_batch_elems(attn_io[k].src[i], one);
		in[i] = in_f32(src[i], half & LOOM_CPU_BF16_SRC(i), b * per, per, (float *)at);
		if (half & LOOM_CPU_BF16_SRC(i))
			at += align64(4 * (size_t)per);
	}
	int64_t oper = attn_batch_elems(attn_io[k].out, one);
	float *o = out_f32(out, half & LOOM_CPU_BF16_OUT, b * oper, (float *)at);
	switch (k) {
	case LOOM_CPU_ATTN_PROBS_FWD:
		loom_cpu_attn_probs_fwd_f32(one, in[0], o);
		break;
	case LOOM_CPU_ATTN_PROBS_BWD:
		loom_cpu_attn_probs_bwd_f32(one, in[0], in[1], in[2], o, kws);
		break;
	case LOOM_CPU_ATTENTION_FWD:
		loom_cpu_attention_fwd_f32(one, in[0], in[1], o);
		break;
	case LOOM_CPU_ATTENTION_BWD_PROBS:
		loom_cpu_attention_bwd_probs_f32(one, in[0], in[1], o);
		break;
	case LOOM_CPU_ATTENTION_BWD_QKV:
		loom_cpu_attention_bwd_qkv_f32(one, in[0], in[1], o);
		break;
	}
	out_done(out, half & LOOM_CPU_BF16_OUT, b * oper, oper, o);
}

/*
 * Threads over the batches, one parallel region, each thread with its own
 * kernel ws and slices (nt of them: within the emulation's slots' ws and
 * whole copies, nt <= slots and nt <= b) and the f32 kernel on one batch
 * serial inside it (OpenMP nests no active region). With one thread (one
 * batch, or little work) the batches go in turn and the kernel takes the
 * threads over its heads. A batch's copies stay in cache between the
 * widening, the kernel and the rounding.
 */
int loom_cpu_attn_bf16(loom_cpu_attn_kernel k, const loom_attn_shape *s, const void *const *src,
		       void *out, void *ws, size_t ws_bytes, unsigned half)
{
	int nt = attn_threads(s);
	while (nt > 1 && attn_layout(k, s, half, nt) > ws_bytes)
		nt--;
	if (nt <= 1 && attn_layout(k, s, half, 1) > ws_bytes)
		return 0;
	loom_attn_shape one = *s;
	one.b = 1;
	if (nt <= 1) {
		unsigned char *at = (unsigned char *)ws + attn_kernel_ws(k, s, loom_cpu_slots());
		for (int b = 0; b < s->b; b++)
			attn_batch(k, &one, b, src, out, at, ws, half);
		return 1;
	}
	const size_t per_thread = attn_kernel_ws(k, s, 1) + attn_slices(k, s, half);
	int blas_prev = loom_cpu_blas_serial_begin();
#pragma omp parallel num_threads(nt)
	{
		unsigned char *mine = (unsigned char *)ws + per_thread * (size_t)omp_get_thread_num();
#pragma omp for schedule(static)
		for (int b = 0; b < s->b; b++)
			attn_batch(k, &one, b, src, out, mine + attn_kernel_ws(k, s, 1), mine, half);
	}
	loom_cpu_blas_serial_end(blas_prev);
	return 1;
}

/* ------------------------------------------------ softmax cross-entropy */

int loom_cpu_softmax_ce_fwd_bf16(int n, int classes, const void *logits, const int32_t *labels,
				 float *loss, int *bad, float *ws, unsigned half)
{
	for (int i = 0; i < n; i++) {
		if (labels[i] < 0 || labels[i] >= classes) {
			if (bad)
				*bad = i;
			return -1;
		}
	}
	/* Row by row, as the f32 kernel adds them. */
	double total = 0;
	for (int i = 0; i < n; i++) {
		const float *row = in_f32(logits, half & LOOM_CPU_BF16_SRC(0), (int64_t)i * classes,
					  classes, ws);
		loom_cpu_softmax_ce_rows_f32(1, classes, row, labels + i, &total);
	}
	*loss = (float)(n > 0 ? total / n : 0);
	return 0;
}

int loom_cpu_softmax_ce_bwd_bf16(int n, int classes, const void *logits, const int32_t *labels,
				 const void *dloss, void *dlogits, float *ws, unsigned half)
{
	const int in16 = half & LOOM_CPU_BF16_SRC(0), out16 = half & LOOM_CPU_BF16_OUT;
	float dl = half & LOOM_CPU_BF16_SRC(2) ? loom_bf16_to_f32(*(const uint16_t *)dloss) :
						 *(const float *)dloss;
	const double g = n > 0 ? (double)dl / n : 0;
	float *obuf = ws + (in16 ? classes : 0);
	for (int i = 0; i < n; i++) {
		int64_t off = (int64_t)i * classes;
		const float *row = in_f32(logits, in16, off, classes, ws);
		float *o = out_f32(dlogits, out16, off, obuf);
		loom_cpu_softmax_ce_bwd_rows_f32(1, classes, row, labels + i, g, o);
		out_done(dlogits, out16, off, classes, o);
	}
	return 1;
}

/* ------------------------------------------------------------- embedding */

int loom_cpu_embedding_fwd_bf16(int64_t n, int v, int c, const int32_t *ids,
				const uint16_t *table, uint16_t *y, int64_t *bad)
{
	for (int64_t i = 0; i < n; i++) {
		if (ids[i] < 0 || ids[i] >= v) {
			if (bad)
				*bad = i;
			return -1;
		}
	}
#pragma omp parallel for if (n * c >= LOOM_CPU_PAR_MIN) schedule(static)
	for (int64_t i = 0; i < n; i++)
		memcpy(y + i * c, table + (int64_t)ids[i] * c, sizeof(uint16_t) * c);
	return 0;
}

/* The f32 kernel's column ranges and row order: the same sums. */
int loom_cpu_embedding_bwd_bf16(int64_t n, int v, int c, const int32_t *ids, const void *dy,
				void *dtable, float *ws, unsigned half)
{
	const int in16 = half & LOOM_CPU_BF16_SRC(1), out16 = half & LOOM_CPU_BF16_OUT;
	float *acc = out16 ? ws : dtable;
	int nt = n * c >= LOOM_CPU_PAR_MIN ? omp_get_max_threads() : 1;
	if (nt > c)
		nt = c;
#pragma omp parallel num_threads(nt)
	{
		int t = omp_get_thread_num(), cnt = omp_get_num_threads();
		int j0 = (int)((int64_t)c * t / cnt), j1 = (int)((int64_t)c * (t + 1) / cnt);
		for (int64_t r = 0; r < v; r++)
			memset(acc + r * c + j0, 0, sizeof(float) * (size_t)(j1 - j0));
		for (int64_t i = 0; i < n; i++) {
			if (ids[i] < 0 || ids[i] >= v)
				continue;
			float *row = acc + (int64_t)ids[i] * c;
			if (in16) {
				loom_cpu_bf16_acc(j1 - j0, (const uint16_t *)dy + i * c + j0, row + j0);
			} else {
				const float *d = (const float *)dy + i * c;
				for (int j = j0; j < j1; j++)
					row[j] += d[j];
			}
		}
		if (out16)
			for (int64_t r = 0; r < v; r++)
				loom_cpu_bf16_round(j1 - j0, acc + r * c + j0,
						    (uint16_t *)dtable + r * c + j0);
	}
	return 1;
}
