/*
 * engine/cpu/elementwise.c — CPU elementwise kernels and reductions to a
 * scalar (relu, add, sum, broadcast) for f32 and f64 from elementwise_impl.h.
 */
#include "engine/cpu/cpu_internal.h"
#include "engine/cpu/kernels.h"
#include "base/half.h"
#include "graph/unary.h"

/* Elements per block of loom_cpu_sum: big enough for SIMD, small enough that
 * the per-block error stays tiny. */
#define LOOM_CPU_SUM_BLOCK 4096

#define T float
#define SFX LOOM_CPU_F32
#include "engine/cpu/elementwise_impl.h"

/*
 * GELU in f32 (both forms, forward and backward), graph/unary.h's formulas
 * vectorised: glibc's libmvec (2.35 on) has SIMD variants of erff, expf and
 * tanhf (_ZGVdN8v_erff for AVX2, _ZGVbN4v_erff for SSE2), but math.h
 * declares them as such only under -ffast-math, which would also let GCC
 * drop the NaN and infinity checks the loss scaler relies on. Declared SIMD
 * here, the loops below call them 8 (4) at a time: 1.2 ns per element
 * forward against 24 for the scalar erff on the 2-core EPYC (2026-11-26),
 * the GPT's GELU 30 ms of a 194 ms step before. Results agree with the
 * scalar functions to about an ulp (libmvec's bound: 4).
 */
#if defined(__x86_64__) && defined(__GLIBC__) && \
	(__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
__attribute__((simd("notinbranch"))) float erff(float);
__attribute__((simd("notinbranch"))) float expf(float);
__attribute__((simd("notinbranch"))) float tanhf(float);
__attribute__((simd("notinbranch"))) double exp(double);
#endif

#define GELU_LOOP(bwd, tanh_form)                                                      \
	_Pragma("omp simd") for (int64_t i = lo; i < hi; i++) y[i] =                    \
		loom_unary_gelu_f32(x[i], (bwd) ? dy[i] : 0.0f, bwd, tanh_form)

static void LOOM_CPU_FN(gelu_part)(void *arg, int64_t lo, int64_t hi)
{
	const LOOM_CPU_FN(ew_args) *g = arg;
	const float *x = g->a, *dy = g->b;
	float *y = g->y;
	/* One loop per variant: the flags constant inside each, so that GCC
	 * vectorises the inlined formula with no branch in it. */
	if (g->b && g->tanh_form)
		GELU_LOOP(1, 1);
	else if (g->b)
		GELU_LOOP(1, 0);
	else if (g->tanh_form)
		GELU_LOOP(0, 1);
	else
		GELU_LOOP(0, 0);
}
#undef GELU_LOOP

void LOOM_CPU_FN(loom_cpu_gelu)(int64_t n, const float *x, const float *dy, int tanh_form,
				float *y)
{
	LOOM_CPU_FN(ew_args) g = { .a = x, .b = dy, .y = y, .tanh_form = tanh_form };
	loom_cpu_team_for(n, LOOM_CPU_FN(ew_threads)(n), LOOM_CPU_FN(gelu_part), &g);
}

/*
 * bf16 in, bf16 out (LOOM_CPU_EW_*): the half emulation of backend.c fused
 * into one pass. Each thread's range goes through blocks of
 * LOOM_CPU_BF16_BLOCK elements: widen the bf16 sources into f32 on the
 * stack (half.h's exact widening), run the same f32 loop as the f32 kernel,
 * round with half.h's loom_f32_to_bf16 (nearest even, NaN kept). The team
 * splits n as the f32 kernel's does and every block but a range's last is a
 * whole number of vectors, so each element meets the same code (vector or
 * tail) as on the widen / f32 kernel / round path: the same bits, in one
 * memory pass and one parallel region instead of four.
 */
#define LOOM_CPU_BF16_BLOCK 512

typedef struct LOOM_CPU_FN(bf16_args) {
	const uint16_t *a, *b;
	uint16_t *y;
	int op, flag;
} LOOM_CPU_FN(bf16_args);

static void LOOM_CPU_FN(bf16_part)(void *arg, int64_t lo, int64_t hi)
{
	const LOOM_CPU_FN(bf16_args) *g = arg;
	float xa[LOOM_CPU_BF16_BLOCK] __attribute__((aligned(64)));
	float xb[LOOM_CPU_BF16_BLOCK] __attribute__((aligned(64)));
	float yy[LOOM_CPU_BF16_BLOCK] __attribute__((aligned(64)));
	/* gelu_part's arguments, set once (the struct is large: no per-block
	 * initialisation) */
	LOOM_CPU_FN(ew_args) e;
	e.a = xa;
	e.b = g->b ? xb : NULL;
	e.y = yy;
	e.tanh_form = g->flag;
	for (int64_t b0 = lo; b0 < hi; b0 += LOOM_CPU_BF16_BLOCK) {
		int64_t len = hi - b0 < LOOM_CPU_BF16_BLOCK ? hi - b0 : LOOM_CPU_BF16_BLOCK;
		const uint16_t *a = g->a + b0;
#pragma omp simd
		for (int64_t i = 0; i < len; i++)
			xa[i] = loom_bf16_to_f32(a[i]);
		if (g->b) {
			const uint16_t *bb = g->b + b0;
#pragma omp simd
			for (int64_t i = 0; i < len; i++)
				xb[i] = loom_bf16_to_f32(bb[i]);
		}
		switch (g->op) {
		case LOOM_CPU_EW_ADD:
#pragma omp simd
			for (int64_t i = 0; i < len; i++)
				yy[i] = xa[i] + xb[i];
			if (g->flag) /* add's fused relu, before the rounding */
#pragma omp simd
				for (int64_t i = 0; i < len; i++)
					yy[i] = yy[i] < 0 ? 0 : yy[i];
			break;
		case LOOM_CPU_EW_RELU:
#pragma omp simd
			for (int64_t i = 0; i < len; i++)
				yy[i] = xa[i] < 0 ? 0 : xa[i];
			break;
		case LOOM_CPU_EW_RELU_BWD:
#pragma omp simd
			for (int64_t i = 0; i < len; i++)
				yy[i] = xa[i] > 0 ? xb[i] : 0;
			break;
		default: /* GELU: the f32 kernel's own loops on the block */
			LOOM_CPU_FN(gelu_part)(&e, 0, len);
			break;
		}
		uint16_t *y = g->y + b0;
#pragma omp simd
		for (int64_t i = 0; i < len; i++)
			y[i] = loom_f32_to_bf16(yy[i]);
	}
}

void LOOM_CPU_FN(loom_cpu_ew_bf16)(int op, int flag, int64_t n, const uint16_t *a,
				   const uint16_t *b, uint16_t *y)
{
	LOOM_CPU_FN(bf16_args) g = { .a = a, .b = b, .y = y, .op = op, .flag = flag };
	loom_cpu_team_for(n, LOOM_CPU_FN(ew_threads)(n), LOOM_CPU_FN(bf16_part), &g);
}

/* Max pooling on bf16 (kernels.h's loom_cpu_maxpool2d_bf16): whole planes
 * widened on the stack, pool.c's f32 kernel of this copy (one thread: it
 * runs inside a team job), rounded. Max pooling only compares, so how the
 * planes are grouped changes no bit. */
void LOOM_CPU_FN(loom_cpu_maxpool2d_fwd)(const loom_pool_shape *s, const float *x, float *y);
void LOOM_CPU_FN(loom_cpu_maxpool2d_bwd)(const loom_pool_shape *s, const float *x,
					 const float *dy, float *dx);

/* Floats of stack per call of pool_bf16_part: whole planes only. */
#define LOOM_CPU_POOL_BF16_FLOATS 6144

typedef struct LOOM_CPU_FN(pool_bf16_args) {
	loom_pool_shape s;
	const uint16_t *x, *dy;
	uint16_t *out;
	int64_t in_plane, out_plane, chunk;
} LOOM_CPU_FN(pool_bf16_args);

/* Planes lo..hi, chunk planes at a time: widen, the f32 kernel, round. */
static void LOOM_CPU_FN(pool_bf16_part)(void *arg, int64_t lo, int64_t hi)
{
	const LOOM_CPU_FN(pool_bf16_args) *g = arg;
	float buf[LOOM_CPU_POOL_BF16_FLOATS] __attribute__((aligned(64)));
	for (int64_t p0 = lo; p0 < hi; p0 += g->chunk) {
		int64_t np = hi - p0 < g->chunk ? hi - p0 : g->chunk;
		int64_t nin = np * g->in_plane, nout = np * g->out_plane;
		float *x = buf, *dy = buf + nin, *out = dy + (g->dy ? nout : 0);
		loom_pool_shape s = g->s;
		s.n = 1;
		s.c = (int)np;
		const uint16_t *xs = g->x + p0 * g->in_plane;
#pragma omp simd
		for (int64_t i = 0; i < nin; i++)
			x[i] = loom_bf16_to_f32(xs[i]);
		if (g->dy) {
			const uint16_t *ds = g->dy + p0 * g->out_plane;
#pragma omp simd
			for (int64_t i = 0; i < nout; i++)
				dy[i] = loom_bf16_to_f32(ds[i]);
			LOOM_CPU_FN(loom_cpu_maxpool2d_bwd)(&s, x, dy, out);
			uint16_t *o = g->out + p0 * g->in_plane;
#pragma omp simd
			for (int64_t i = 0; i < nin; i++)
				o[i] = loom_f32_to_bf16(out[i]);
		} else {
			LOOM_CPU_FN(loom_cpu_maxpool2d_fwd)(&s, x, out);
			uint16_t *o = g->out + p0 * g->out_plane;
#pragma omp simd
			for (int64_t i = 0; i < nout; i++)
				o[i] = loom_f32_to_bf16(out[i]);
		}
	}
}

int LOOM_CPU_FN(loom_cpu_maxpool2d_bf16)(const loom_pool_shape *s, const uint16_t *x,
					 const uint16_t *dy, uint16_t *out)
{
	int64_t in_plane = (int64_t)s->h_in * s->w_in, out_plane = (int64_t)s->h_out * s->w_out;
	int64_t per = dy ? 2 * in_plane + out_plane : in_plane + out_plane;
	int64_t planes = (int64_t)s->n * s->c;
	if (per <= 0 || per > LOOM_CPU_POOL_BF16_FLOATS)
		return 0;
	LOOM_CPU_FN(pool_bf16_args) g = { .s = *s, .x = x, .dy = dy, .out = out,
					  .in_plane = in_plane, .out_plane = out_plane,
					  .chunk = LOOM_CPU_POOL_BF16_FLOATS / per };
	int nt = planes * in_plane >= LOOM_CPU_PAR_MIN ? loom_cpu_team_threads() : 1;
	loom_cpu_team_for(planes, nt, LOOM_CPU_FN(pool_bf16_part), &g);
	return 1;
}

/*
 * The exponentials of softmax rows (attention, cross-entropy) in double,
 * 4 (2) at a time through libmvec's exp: the scalar exp was 5-6% of a GPT
 * step. Still exp in double, then one rounding to float, as the scalar
 * loops did; only the order of the sums' additions changes (SIMD lanes).
 */
double LOOM_CPU_FN(loom_cpu_exp_sum)(int64_t n, const float *x, double m)
{
	double s = 0;
#pragma omp simd reduction(+ : s)
	for (int64_t i = 0; i < n; i++)
		s += exp((double)x[i] - m);
	return s;
}

double LOOM_CPU_FN(loom_cpu_exp_inplace)(int64_t n, float *x, double m)
{
	double s = 0;
#pragma omp simd reduction(+ : s)
	for (int64_t i = 0; i < n; i++) {
		double e = exp((double)x[i] - m);
		x[i] = (float)e;
		s += e;
	}
	return s;
}

void LOOM_CPU_FN(loom_cpu_exp_scale)(int64_t n, const float *x, double m, double g, float *y)
{
#pragma omp simd
	for (int64_t i = 0; i < n; i++)
		y[i] = (float)(exp((double)x[i] - m) * g);
}
#undef T
#undef SFX

/* f64 (gradient checks) only in the baseline copy. */
#define LOOM_CPU_TEMPLATE_FILE "engine/cpu/elementwise_impl.h"
#include "engine/cpu/f64_base.h"
