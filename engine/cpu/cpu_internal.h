/*
 * engine/cpu/cpu_internal.h — plumbing shared by the CPU kernel files: the name
 * pasting that instantiates each *_impl.h for f32 and f64, and thread helpers.
 * Never included by kernels.h.
 */
#ifndef LOOM_ENGINE_CPU_INTERNAL_H
#define LOOM_ENGINE_CPU_INTERNAL_H

#include <math.h>
#include <stdint.h>

#include <cblas.h>
#include <omp.h>

#include "base/half.h"
#include "engine/cpu/cpu_path.h"
#include "engine/cpu/kernels.h"
#include "engine/cpu/team.h"

/* LOOM_CPU_FN(loom_cpu_relu_fwd) -> loom_cpu_relu_fwd_f32 when SFX is f32. */
#define LOOM_CPU_PASTE_(a, b) a##_##b
#define LOOM_CPU_PASTE(a, b) LOOM_CPU_PASTE_(a, b)
#define LOOM_CPU_FN(name) LOOM_CPU_PASTE(name, SFX)

/*
 * bn.c, conv.c, elementwise.c and pool.c are compiled once per instruction
 * set (BUILD: -march=x86-64 and x86-64-v3), LOOM_CPU_VARIANT naming the
 * copy (base, avx2): their f32 kernels are then named e.g.
 * loom_cpu_relu_fwd_f32_avx2, and dispatch.c's loom_cpu_relu_fwd_f32 calls
 * the copy of the path chosen at start-up. f64 is in the base copy only.
 */
#ifdef LOOM_CPU_VARIANT
#define LOOM_CPU_F32 LOOM_CPU_PASTE(f32, LOOM_CPU_VARIANT)
#else
#define LOOM_CPU_F32 f32
#endif

/* The f64 twins of kernels.h's loom_cpu_exp_* (f32 through libmvec), for
 * the softmax rows of attention.c and softmax_xent.c: plain scalar loops. */
static inline double loom_cpu_exp_sum_f64(int64_t n, const double *x, double m)
{
	double s = 0;
	for (int64_t i = 0; i < n; i++)
		s += exp(x[i] - m);
	return s;
}

static inline double loom_cpu_exp_inplace_f64(int64_t n, double *x, double m)
{
	double s = 0;
	for (int64_t i = 0; i < n; i++) {
		x[i] = exp(x[i] - m);
		s += x[i];
	}
	return s;
}

static inline void loom_cpu_exp_scale_f64(int64_t n, const double *x, double m, double g,
					  double *y)
{
	for (int64_t i = 0; i < n; i++)
		y[i] = exp(x[i] - m) * g;
}

/*
 * The family files' bf16 kernels (kernels.h's *_bf16): elements [off,
 * off + n) of a source as f32, widened into buf when bf16; where the f32
 * kernel writes elements [off, ...) of a result (buf when the result is
 * bf16); and the rounding of that buf into place.
 */
static inline const float *loom_cpu_bf16_in(const void *p, int bf16, int64_t off, int64_t n,
					     float *buf)
{
	if (!bf16)
		return (const float *)p + off;
	loom_cpu_bf16_widen(n, (const uint16_t *)p + off, buf);
	return buf;
}

static inline float *loom_cpu_bf16_out(void *p, int bf16, int64_t off, float *buf)
{
	return bf16 ? buf : (float *)p + off;
}

static inline void loom_cpu_bf16_done(void *p, int bf16, int64_t off, int64_t n, const float *buf)
{
	if (bf16)
		loom_cpu_bf16_round(n, buf, (uint16_t *)p + off);
}

/*
 * The fused row kernels' (ln_residual.c, ln_bwd_accum.c) dtypes: f32 and
 * the two halves. Elements [off, off + n) of p as f32 (p itself when f32,
 * else widened into buf, exactly), and buf's n results rounded into p at
 * off (nothing when f32: the kernel wrote p itself).
 */
static inline int loom_cpu_half_storable(loom_dtype dt)
{
	return dt == LOOM_F32 || dt == LOOM_BF16 || dt == LOOM_F16;
}

static inline const float *loom_cpu_half_in(loom_dtype dt, const void *p, int64_t off, int64_t n,
					    float *buf)
{
	if (dt == LOOM_F16) {
		loom_f16_to_f32_array((const uint16_t *)p + off, buf, n);
		return buf;
	}
	return loom_cpu_bf16_in(p, dt == LOOM_BF16, off, n, buf);
}

static inline void loom_cpu_half_done(loom_dtype dt, void *p, int64_t off, int64_t n, const float *buf)
{
	if (dt == LOOM_F16)
		loom_f32_to_f16_array(buf, (uint16_t *)p + off, n);
	else
		loom_cpu_bf16_done(p, dt == LOOM_BF16, off, n, buf);
}

/* The fused gradient sums (ln_bwd_accum.c, emb_bwd_accum.c): d (f32, n
 * elements) as the unfused node stored it (rounded into tout and widened
 * back where round), plus the addend's elements [off, off + n) (dtype
 * tacc), stored into out at off in tout. out may be the addend itself:
 * each element is read before it is written. ab, hb: n-element scratch. */
static inline void loom_cpu_accum_store(loom_dtype tout, void *out, loom_dtype tacc,
					const void *acc, int64_t off, int64_t n, float *d,
					float *ab, uint16_t *hb, int round)
{
	if (tout != LOOM_F32 && round) {
		loom_cpu_half_done(tout, hb, 0, n, d);
		loom_cpu_half_in(tout, hb, 0, n, d);
	}
	const float *pa = loom_cpu_half_in(tacc, acc, off, n, ab);
	if (tout == LOOM_F32) {
		float *o = (float *)out + off;
#pragma omp simd
		for (int64_t i = 0; i < n; i++)
			o[i] = pa[i] + d[i];
		return;
	}
#pragma omp simd
	for (int64_t i = 0; i < n; i++)
		d[i] = pa[i] + d[i];
	loom_cpu_half_done(tout, out, off, n, d);
}

static inline size_t loom_cpu_align64(size_t x)
{
	return (x + 63) & ~(size_t)63;
}

/* Below this many elements a parallel region costs more than it saves. */
#define LOOM_CPU_PAR_MIN 32768

/*
 * The conv kernels keep one scratch slot per thread so that each image's
 * im2col buffer stays in that core's L2. The slot count must not depend on
 * anything that can change between workspace query and launch, so it is the
 * processor count (capped), not omp_get_max_threads().
 */
#define LOOM_CPU_MAX_SLOTS 64

static inline int loom_cpu_slots(void)
{
	int p = omp_get_num_procs();
	if (p < 1)
		p = 1;
	return p < LOOM_CPU_MAX_SLOTS ? p : LOOM_CPU_MAX_SLOTS;
}

/* Threads for a loop over `work` independent items that needs a slot each. */
static inline int loom_cpu_slot_threads(int work)
{
	int t = loom_cpu_team_threads();
	int s = loom_cpu_slots();
	if (t > s)
		t = s;
	if (t > work)
		t = work;
	return t < 1 ? 1 : t;
}

/*
 * Valid output range [*lo, *hi) along one axis: outputs o with
 * 0 <= o * stride + off < len, clamped to [0, n_out). Lets the hot loops run
 * branch-free inside the image and write zeros (or skip) outside it.
 */
static inline void loom_cpu_valid_range(int off, int stride, int len, int n_out,
					int *lo, int *hi)
{
	int l = off >= 0 ? 0 : (-off + stride - 1) / stride;
	int h = len - 1 - off < 0 ? 0 : (len - 1 - off) / stride + 1;
	if (h > n_out)
		h = n_out;
	if (l > h)
		l = h;
	*lo = l;
	*hi = h;
}

/*
 * Every BLAS call made by these kernels runs single-threaded, and the kernels
 * split the work over OpenMP threads themselves. Debian's OpenBLAS is the
 * pthread build: letting its pool run next to OpenMP's makes each spin while
 * the other works, and on 2 cores a 3-MFLOP linear layer took 7 ms instead of
 * 0.3. Its thread count is set to one for the duration of a kernel and put
 * back after (both calls are cheap), so other BLAS users in the process keep
 * their setting.
 */
static inline int loom_cpu_blas_serial_begin(void)
{
	int prev = openblas_get_num_threads();
	if (prev != 1)
		openblas_set_num_threads(1);
	return prev;
}

static inline void loom_cpu_blas_serial_end(int prev)
{
	if (prev != 1)
		openblas_set_num_threads(prev);
}

/*
 * The *_impl.h kernels are written against the cblas signature (row-major
 * only); their f32 instances call this, which takes the path chosen in
 * cpu_path.c. f64 stays on cblas_dgemm.
 */
static inline void loom_cpu_sgemm_cblas(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta,
					enum CBLAS_TRANSPOSE tb, int m, int n, int k,
					float alpha, const float *a, int lda, const float *b,
					int ldb, float beta, float *c, int ldc)
{
	(void)order;
	loom_cpu_sgemm(ta == CblasTrans ? 'T' : 'N', tb == CblasTrans ? 'T' : 'N', m, n, k,
		       alpha, a, lda, b, ldb, beta, c, ldc);
}

/* A 1x1, stride-1, unpadded conv is a plain GEMM on the input: no im2col. */
static inline int loom_cpu_conv_is_pointwise(const loom_conv_shape *s)
{
	return s->kh == 1 && s->kw == 1 && s->stride == 1 && s->pad == 0;
}

/*
 * Forward as yt[P, c_out] = col^T w^T, then a transpose into NCHW, when the
 * image is small and the GEMM is OpenBLAS's: 0.3.21 (Cooperlake kernels on a
 * Zen 4) runs the 32 x 196 x 400 GEMM at ~50 GFLOP/s and the 196 x 32 x 400
 * one at ~90, one thread. oneDNN is the other way round (~150 GFLOP/s
 * plain, ~85 transposed, one thread of a Xeon family 6 model 207), and
 * for wide outputs (conv1: 16 x 784 x 25) the plain form is faster on both.
 */
static inline int loom_cpu_conv_fwd_transposed(const loom_conv_shape *s)
{
	return s->h_out * s->w_out < 512 && loom_cpu_isa_get() == LOOM_CPU_ISA_PORTABLE;
}

/* Bytes of one thread's conv scratch slot for element size elem (conv.c). */
size_t loom_cpu_conv_slot_bytes(const loom_conv_shape *s, size_t elem);

/* A conv as one GEMM per image: k = c_in kh kw rows of the im2col matrix,
 * p = h_out w_out its columns, one image's input and output elements, a
 * thread's scratch slot for element size elem, and whether the input is
 * the im2col matrix itself (a pointwise conv). */
typedef struct loom_conv_gemm {
	int k, p, direct;
	int64_t in_img, out_img;
	size_t slot;
} loom_conv_gemm;

static inline loom_conv_gemm loom_cpu_conv_gemm(const loom_conv_shape *s, size_t elem)
{
	loom_conv_gemm g = {
		.k = s->c_in * s->kh * s->kw,
		.p = s->h_out * s->w_out,
		.direct = loom_cpu_conv_is_pointwise(s),
		.in_img = (int64_t)s->c_in * s->h_in * s->w_in,
		.out_img = (int64_t)s->c_out * s->h_out * s->w_out,
		.slot = loom_cpu_conv_slot_bytes(s, elem),
	};
	return g;
}

#endif /* LOOM_ENGINE_CPU_INTERNAL_H */
