/*
 * engine/cpu/attention.c — causal self-attention on the CPU in two halves
 * over a fused qkv [B, T, 3C]: the probabilities P = causal softmax(q k^T /
 * sqrt(hs)) and y = P v per head, each with its backward (f32 and f64
 * through the chosen GEMM path, softmax sums in double; bf16 arrays a
 * batch at a time in f32), and the entries of ATTN_PROBS, ATTENTION and
 * their three backward ops. The f32/f64 kernels are written once at the
 * end of this file, which includes itself once per type (LOOM_CPU_TEMPLATE
 * set).
 */
#ifndef LOOM_CPU_TEMPLATE
#include <math.h>
#include <string.h>

#include <cblas.h>

#include "engine/cpu/cpu_internal.h"
#include "engine/cpu/ops.h"

/* Multiply-adds below which the heads (or, for bf16, the batches) are not
 * worth splitting over threads. */
#define LOOM_CPU_GEMM_PAR_MIN (1 << 21)

/* Where one (batch, head)'s block of an array starts: at + b per_b +
 * h per_h, rows ld apart. */
typedef struct attn_arr {
	int64_t per_b, per_h, at;
	int ld;
} attn_arr;

/* P-like [B, nh, T, T]: one T x T block per head. */
static inline attn_arr attn_probs_arr(const loom_attn_shape *s)
{
	return (attn_arr){ (int64_t)s->nh * s->t * s->t, (int64_t)s->t * s->t, 0, s->t };
}

/* Head h's hs columns of [B, T, width] from column col (y: width C; the
 * q, k and v of qkv: width 3C, col 0, C or 2C). */
static inline attn_arr attn_cols_arr(const loom_attn_shape *s, int width, int col)
{
	return (attn_arr){ (int64_t)s->t * width, s->c / s->nh, col, width };
}

#define LOOM_CPU_TEMPLATE_FILE "engine/cpu/attention.c"
#include "engine/cpu/f32_f64.h"

size_t loom_cpu_attn_probs_bwd_ws(int t, size_t elem)
{
	return elem * (size_t)loom_cpu_slots() * (size_t)t * (size_t)t;
}

/* ------------------------------------------------------------ bf16 */

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

/* The f32 kernel's own ws for thread slots (attn_probs_bwd's dS). */
static size_t attn_kernel_ws(loom_cpu_attn_kernel k, const loom_attn_shape *s, int slots)
{
	return k == LOOM_CPU_ATTN_PROBS_BWD ? loom_cpu_align64(4 * (size_t)slots * s->t * s->t) : 0;
}

/* One batch of each bf16 array in f32. */
static size_t attn_slices(loom_cpu_attn_kernel k, const loom_attn_shape *s, unsigned half)
{
	size_t ws = 0;
	for (int i = 0; i < attn_io[k].nsrc; i++)
		if (half & LOOM_CPU_BF16_SRC(i))
			ws += loom_cpu_align64(4 * (size_t)attn_batch_elems(attn_io[k].src[i], s));
	if (half & LOOM_CPU_BF16_OUT)
		ws += loom_cpu_align64(4 * (size_t)attn_batch_elems(attn_io[k].out, s));
	return ws;
}

/* Threads over the batches worth their regions. */
static int batch_threads(const loom_attn_shape *s)
{
	double flops = (double)s->b * s->nh * s->t * s->t * (s->c / s->nh);
	return flops >= LOOM_CPU_GEMM_PAR_MIN ? loom_cpu_slot_threads(s->b) : 1;
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
	size_t one = attn_layout(k, s, ~0u, 1), many = attn_layout(k, s, ~0u, batch_threads(s));
	return one > many ? one : many;
}

/* Batch b through the f32 kernel: its bf16 arrays widened into the slices
 * at `at`, its result rounded from there; kws the kernel's ws. */
static void attn_batch(loom_cpu_attn_kernel k, const loom_attn_shape *one, int b,
		       const void *const *src, void *out, unsigned char *at, void *kws,
		       unsigned half)
{
	const void *in[3];
	for (int i = 0; i < attn_io[k].nsrc; i++) {
		int64_t per = attn_batch_elems(attn_io[k].src[i], one);
		in[i] = loom_cpu_bf16_in(src[i], half & LOOM_CPU_BF16_SRC(i), b * per, per, (float *)at);
		if (half & LOOM_CPU_BF16_SRC(i))
			at += loom_cpu_align64(4 * (size_t)per);
	}
	int64_t oper = attn_batch_elems(attn_io[k].out, one);
	float *o = loom_cpu_bf16_out(out, half & LOOM_CPU_BF16_OUT, b * oper, (float *)at);
	attn_run_f32(k, one, in, o, kws);
	loom_cpu_bf16_done(out, half & LOOM_CPU_BF16_OUT, b * oper, oper, o);
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
	int nt = batch_threads(s);
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

/* ---------------------------------------------------------- entries */

/* The geometry of an attention node from its qkv source (index qi). */
static loom_attn_shape attn_shape(const loom_plan *plan, loom_value v, int qi)
{
	const loom_node *q = loom_cpu_src(plan, v, qi);
	loom_attn_shape s = { (int)q->shape.dims[0], (int)q->shape.dims[1],
			      (int)(q->shape.dims[2] / 3), loom_cpu_node(plan, v)->a.attn.n_head };
	return s;
}

/* (P, dy) -> dqkv: the geometry from the output, dqkv [B, T, 3C]. */
static loom_attn_shape out_shape(const loom_plan *plan, loom_value v)
{
	const loom_node *n = loom_cpu_node(plan, v);
	loom_attn_shape s = { (int)n->shape.dims[0], (int)n->shape.dims[1],
			      (int)(n->shape.dims[2] / 3), n->a.attn.n_head };
	return s;
}

/* The per-thread dS of the probabilities' backward. */
static size_t ws_probs_bwd(const loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			   size_t elem)
{
	(void)ctx;
	return loom_cpu_attn_probs_bwd_ws((int)loom_cpu_node(plan, v)->shape.dims[1], elem);
}

/* Within the ws backend.c sized for the emulation: the kernel's, then
 * whole f32 copies of the bf16 arrays. */
static int run_bf16(loom_cpu_attn_kernel k, const loom_attn_shape *s, const loom_plan *plan,
		    loom_value v, const loom_cpu_io *io, unsigned half)
{
	const loom_node *n = loom_cpu_node(plan, v);
	size_t avail = k == LOOM_CPU_ATTN_PROBS_BWD ? ws_probs_bwd(NULL, plan, v, 4) : 0;
	for (int i = 0; i < n->nsrc; i++)
		if (half & LOOM_CPU_BF16_SRC(i))
			avail += loom_cpu_align64(4 * (size_t)loom_shape_numel(&loom_cpu_src(plan, v, i)->shape));
	if (half & LOOM_CPU_BF16_OUT)
		avail += loom_cpu_align64(4 * (size_t)loom_shape_numel(&n->shape));
	return loom_cpu_attn_bf16(k, s, (const void *const *)io->src, io->out, io->ws, avail, half);
}

/* f32 or f64: the kernel on the node's arrays. */
static void run_f(loom_cpu_attn_kernel k, const loom_attn_shape *s, const loom_plan *plan,
		  loom_value v, const loom_cpu_io *io)
{
	const loom_node *n = loom_cpu_node(plan, v);
	const void *in[3] = { NULL };
	for (int i = 0; i < n->nsrc && i < 3; i++)
		in[i] = io->src[i];
	if (loom_cpu_kernel_dtype(n) == LOOM_F64)
		attn_run_f64(k, s, in, io->out, io->ws);
	else
		attn_run_f32(k, s, in, io->out, io->ws);
}

/* An op's two entries: run_<name> and bf16_<name>, kernel on shape. */
#define ENTRIES(name, kernel, shape)                                                      \
	static loom_status run_##name(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v, \
				      const loom_cpu_io *io)                              \
	{                                                                                 \
		loom_attn_shape s = shape;                                                \
		(void)ctx;                                                                \
		run_f(kernel, &s, plan, v, io);                                           \
		return LOOM_OK;                                                           \
	}                                                                                 \
	static int bf16_##name(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,    \
			       const loom_cpu_io *io, unsigned half, loom_status *st)     \
	{                                                                                 \
		loom_attn_shape s = shape;                                                \
		(void)ctx;                                                                \
		(void)st;                                                                 \
		return run_bf16(kernel, &s, plan, v, io, half);                           \
	}
ENTRIES(probs, LOOM_CPU_ATTN_PROBS_FWD, attn_shape(plan, v, 0))
ENTRIES(probs_bwd, LOOM_CPU_ATTN_PROBS_BWD, attn_shape(plan, v, 0))
ENTRIES(attention, LOOM_CPU_ATTENTION_FWD, attn_shape(plan, v, 1))
ENTRIES(bwd_probs, LOOM_CPU_ATTENTION_BWD_PROBS, attn_shape(plan, v, 0))
ENTRIES(bwd_qkv, LOOM_CPU_ATTENTION_BWD_QKV, out_shape(plan, v))
#undef ENTRIES

const loom_cpu_op loom_cpu_attn_probs = { .run = run_probs, .bf16 = bf16_probs };
const loom_cpu_op loom_cpu_attn_probs_bwd = { .run = run_probs_bwd, .ws = ws_probs_bwd,
					      .bf16 = bf16_probs_bwd };
const loom_cpu_op loom_cpu_attention = { .run = run_attention, .bf16 = bf16_attention };
const loom_cpu_op loom_cpu_attention_bwd_probs = { .run = run_bwd_probs, .bf16 = bf16_bwd_probs };
const loom_cpu_op loom_cpu_attention_bwd_qkv = { .run = run_bwd_qkv, .bf16 = bf16_bwd_qkv };

#else /* LOOM_CPU_TEMPLATE: the f32 and f64 kernels, T, SFX and CBLAS_GEMM set */

/* Threads for a loop over the b * nh heads, each with a single-threaded
 * GEMM (the caller holds BLAS serial). */
static int LOOM_CPU_FN(attn_threads)(const loom_attn_shape *s)
{
	int64_t work = (int64_t)s->b * s->nh;
	double flops = (double)work * s->t * s->t * (s->c / s->nh);
	return flops >= LOOM_CPU_GEMM_PAR_MIN ? loom_cpu_slot_threads((int)work) : 1;
}

void LOOM_CPU_FN(loom_cpu_attn_probs_fwd)(const loom_attn_shape *s, const T *qkv, T *p)
{
	const int t = s->t, c3 = 3 * s->c, hs = s->c / s->nh;
	const double scale = 1.0 / sqrt((double)hs);
	int blas_prev = loom_cpu_blas_serial_begin();
#pragma omp parallel for num_threads(LOOM_CPU_FN(attn_threads)(s)) schedule(static)
	for (int bh = 0; bh < s->b * s->nh; bh++) {
		int b = bh / s->nh, h = bh % s->nh;
		const T *q = qkv + (int64_t)b * t * c3 + h * hs, *k = q + s->c;
		T *pb = p + (int64_t)bh * t * t;
		CBLAS_GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, t, t, hs, (T)scale, q, c3, k, c3,
			   (T)0, pb, t);
		for (int i = 0; i < t; i++) {
			T *row = pb + (int64_t)i * t;
			double mx = row[0], sum;
			for (int j = 1; j <= i; j++)
				mx = row[j] > mx ? row[j] : mx;
			sum = LOOM_CPU_FN(loom_cpu_exp_inplace)(i + 1, row, mx);
			/* Divide in double and round once (the exp was rounded to T
			 * already; for f64 graphs both are exact to the ulp). */
			for (int j = 0; j <= i; j++)
				row[j] = (T)(row[j] / sum);
			for (int j = i + 1; j < t; j++)
				row[j] = 0;
		}
	}
	loom_cpu_blas_serial_end(blas_prev);
}

void LOOM_CPU_FN(loom_cpu_attn_probs_bwd)(const loom_attn_shape *s, const T *qkv, const T *p,
					  const T *dp, T *dqkv, T *ws)
{
	const int t = s->t, c3 = 3 * s->c, hs = s->c / s->nh;
	const double scale = 1.0 / sqrt((double)hs);
	const int nt = LOOM_CPU_FN(attn_threads)(s);
	int blas_prev = loom_cpu_blas_serial_begin();
	/* The v part takes no gradient from the probabilities. */
	for (int64_t r = 0; r < (int64_t)s->b * t; r++)
		memset(dqkv + r * c3 + 2 * s->c, 0, sizeof(T) * s->c);
#pragma omp parallel num_threads(nt)
	{
		T *ds = ws + (size_t)omp_get_thread_num() * t * t;
#pragma omp for schedule(static)
		for (int bh = 0; bh < s->b * s->nh; bh++) {
			int b = bh / s->nh, h = bh % s->nh;
			int64_t off = (int64_t)b * t * c3 + h * hs;
			const T *q = qkv + off, *k = q + s->c;
			const T *pb = p + (int64_t)bh * t * t, *db = dp + (int64_t)bh * t * t;
			for (int i = 0; i < t; i++) {
				const T *pr = pb + (int64_t)i * t, *dr = db + (int64_t)i * t;
				T *out = ds + (int64_t)i * t;
				double dot = 0;
				for (int j = 0; j <= i; j++)
					dot += (double)pr[j] * dr[j];
				for (int j = 0; j <= i; j++)
					out[j] = (T)(pr[j] * (dr[j] - dot));
				for (int j = i + 1; j < t; j++)
					out[j] = 0;
			}
			/* dq = dS k scale, dk = dS^T q scale. */
			CBLAS_GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, t, hs, t, (T)scale, ds, t,
				   k, c3, (T)0, dqkv + off, c3);
			CBLAS_GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, t, hs, t, (T)scale, ds, t,
				   q, c3, (T)0, dqkv + off + s->c, c3);
		}
	}
	loom_cpu_blas_serial_end(blas_prev);
}

/* c = op(a) op(b) for every (batch, head): m x n x k GEMMs on each
 * operand's block, the heads over threads with BLAS serial inside. */
static void LOOM_CPU_FN(head_gemms)(const loom_attn_shape *s, enum CBLAS_TRANSPOSE ta,
				    enum CBLAS_TRANSPOSE tb, int m, int n, int k, const T *a,
				    attn_arr la, const T *b, attn_arr lb, T *c, attn_arr lc)
{
	int blas_prev = loom_cpu_blas_serial_begin();
#pragma omp parallel for num_threads(LOOM_CPU_FN(attn_threads)(s)) schedule(static)
	for (int bh = 0; bh < s->b * s->nh; bh++) {
		int64_t bi = bh / s->nh, h = bh % s->nh;
		CBLAS_GEMM(CblasRowMajor, ta, tb, m, n, k, (T)1,
			   a + la.at + bi * la.per_b + h * la.per_h, la.ld,
			   b + lb.at + bi * lb.per_b + h * lb.per_h, lb.ld, (T)0,
			   c + lc.at + bi * lc.per_b + h * lc.per_h, lc.ld);
	}
	loom_cpu_blas_serial_end(blas_prev);
}

/* y = P v per head. */
void LOOM_CPU_FN(loom_cpu_attention_fwd)(const loom_attn_shape *s, const T *p, const T *qkv,
					 T *y)
{
	const int hs = s->c / s->nh;
	LOOM_CPU_FN(head_gemms)(s, CblasNoTrans, CblasNoTrans, s->t, hs, s->t, p,
				attn_probs_arr(s), qkv, attn_cols_arr(s, 3 * s->c, 2 * s->c), y,
				attn_cols_arr(s, s->c, 0));
}

/* dP = dy v^T per head. */
void LOOM_CPU_FN(loom_cpu_attention_bwd_probs)(const loom_attn_shape *s, const T *qkv,
					       const T *dy, T *dp)
{
	const int hs = s->c / s->nh;
	LOOM_CPU_FN(head_gemms)(s, CblasNoTrans, CblasTrans, s->t, s->t, hs, dy,
				attn_cols_arr(s, s->c, 0), qkv,
				attn_cols_arr(s, 3 * s->c, 2 * s->c), dp, attn_probs_arr(s));
}

/* dv = P^T dy per head; the q and k parts take no gradient through v. */
void LOOM_CPU_FN(loom_cpu_attention_bwd_qkv)(const loom_attn_shape *s, const T *p, const T *dy,
					     T *dqkv)
{
	const int c3 = 3 * s->c, hs = s->c / s->nh;
	for (int64_t r = 0; r < (int64_t)s->b * s->t; r++)
		memset(dqkv + r * c3, 0, sizeof(T) * 2 * s->c);
	LOOM_CPU_FN(head_gemms)(s, CblasTrans, CblasNoTrans, s->t, hs, s->t, p, attn_probs_arr(s),
				dy, attn_cols_arr(s, s->c, 0), dqkv, attn_cols_arr(s, c3, 2 * s->c));
}

/* Kernel k on the sources in (attn_io's order) into o; kws the
 * probabilities' backward's ws. */
static void LOOM_CPU_FN(attn_run)(loom_cpu_attn_kernel k, const loom_attn_shape *s,
				  const void *const *in, void *o, void *kws)
{
	switch (k) {
	case LOOM_CPU_ATTN_PROBS_FWD:
		LOOM_CPU_FN(loom_cpu_attn_probs_fwd)(s, in[0], o);
		break;
	case LOOM_CPU_ATTN_PROBS_BWD:
		LOOM_CPU_FN(loom_cpu_attn_probs_bwd)(s, in[0], in[1], in[2], o, kws);
		break;
	case LOOM_CPU_ATTENTION_FWD:
		LOOM_CPU_FN(loom_cpu_attention_fwd)(s, in[0], in[1], o);
		break;
	case LOOM_CPU_ATTENTION_BWD_PROBS:
		LOOM_CPU_FN(loom_cpu_attention_bwd_probs)(s, in[0], in[1], o);
		break;
	case LOOM_CPU_ATTENTION_BWD_QKV:
		LOOM_CPU_FN(loom_cpu_attention_bwd_qkv)(s, in[0], in[1], o);
		break;
	}
}

#endif /* LOOM_CPU_TEMPLATE */
