/*
 * engine/cpu/fp8_qdq.c — FP8_QDQ on the CPU, the exact emulation of FP8
 * training's casts (graph/ops/fp8.c): the tensor's amax, its power-of-two
 * scale (base/fp8.h's loom_fp8_scale), each element scaled, rounded through
 * E4M3 or E5M2 (round to nearest even, saturating: base/fp8.h) and divided
 * back. Reads and writes any float dtype (a cast folded in on either side).
 * Under delayed scaling (amp/fp8_scaling.h) the scale is the node's tensor's
 * from its amax history and the amax is taken in the same pass as the cast;
 * a training run records the amax, the scale and the saturated count into
 * the training state for the step end and the report. A stored node
 * (a.fp8.store) writes the codes and their scale instead, and its readers
 * decode them (loom_cpu_fp8_decode) to the bits it would have written.
 */
#include <math.h>
#include <string.h>

#include "base/fp8.h"
#include "engine/cpu/cpu_internal.h"
#include "engine/cpu/ops.h"
#include "graph/ops/ops.h"

#define QDQ_BLOCK 512

static float fmax_of(loom_dtype fmt)
{
	return fmt == LOOM_FP8_E4M3 ? LOOM_E4M3_MAX : LOOM_E5M2_MAX;
}

/* NaN-blind: a NaN element leaves the scale to the others and stays NaN. */
static float amax_f32(const float *x, int64_t n)
{
	float m = 0;
	for (int64_t i = 0; i < n; i++) {
		float a = fabsf(x[i]);
		m = a > m ? a : m;
	}
	return m;
}

/* c = fp8(x * scale), the codes. The scale is a power of two, so the
 * product is exact: only the fp8 rounding rounds. Returns how many values
 * saturated (|x * scale| above the format's largest: the conversion clamps
 * them), counted as they are cast. */
static int64_t code_block(const float *x, uint8_t *c, int64_t n, float scale, loom_dtype fmt)
{
	float fmax = fmax_of(fmt);
	int64_t sat = 0;
	if (fmt == LOOM_FP8_E4M3)
		for (int64_t i = 0; i < n; i++) {
			float s = x[i] * scale;
			sat += fabsf(s) > fmax;
			c[i] = loom_f32_to_e4m3(s);
		}
	else
		for (int64_t i = 0; i < n; i++) {
			float s = x[i] * scale;
			sat += fabsf(s) > fmax;
			c[i] = loom_f32_to_e5m2(s);
		}
	return sat;
}

/* y = code / scale, exact (a power of two): the rounding's value. */
static void decode_block(const uint8_t *c, float *y, int64_t n, float scale, loom_dtype fmt)
{
	float inv = 1.0f / scale;
	if (fmt == LOOM_FP8_E4M3)
		for (int64_t i = 0; i < n; i++)
			y[i] = loom_e4m3_to_f32(c[i]) * inv;
	else
		for (int64_t i = 0; i < n; i++)
			y[i] = loom_e5m2_to_f32(c[i]) * inv;
}

/* y = fp8(x * scale) / scale, in place allowed; the saturated count. */
static int64_t qdq_block(const float *x, float *y, int64_t n, float scale, loom_dtype fmt)
{
	uint8_t c[QDQ_BLOCK];
	int64_t sat = 0;
	for (int64_t i = 0; i < n; i += QDQ_BLOCK) {
		int64_t k = n - i < QDQ_BLOCK ? n - i : QDQ_BLOCK;
		sat += code_block(x + i, c, k, scale, fmt);
		decode_block(c, y + i, k, scale, fmt);
	}
	return sat;
}

void loom_cpu_fp8_qdq_f32(const float *x, float *y, int64_t n, loom_dtype fmt)
{
	float scale = loom_fp8_scale(amax_f32(x, n), fmax_of(fmt));
	qdq_block(x, y, n, scale, fmt);
}

/* What one cast saw: the tensor's amax, the scale it cast with, the
 * values that saturated. */
typedef struct qdq_stats {
	float amax, scale;
	int64_t saturated;
} qdq_stats;

/* Current scaling's first pass: the amax alone. */
static float amax_any(loom_dtype sdt, const void *x, int64_t n)
{
	size_t ssz = loom_dtype_size(sdt);
	float amax = 0;
	/* the max is exact in any order: the same bits at any thread count */
#pragma omp parallel for if (n >= LOOM_CPU_PAR_MIN) schedule(static) reduction(max : amax)
	for (int64_t i = 0; i < n; i += QDQ_BLOCK) {
		float buf[QDQ_BLOCK];
		int64_t k = n - i < QDQ_BLOCK ? n - i : QDQ_BLOCK;
		loom_cpu_cast(sdt, (const char *)x + i * ssz, LOOM_F32, buf, k);
		float m = amax_f32(buf, k);
		amax = m > amax ? m : amax;
	}
	return amax;
}

/*
 * Any float dtype in and out (f16, bf16, f32), through blocks widened to
 * f32 on the stack. st->scale > 0 (delayed scaling): one pass that casts
 * with it and takes the amax as it goes; else (current scaling) the amax
 * first, then the cast with its scale. f64 (the gradient checks) keeps its
 * own precision, rounded to f32 before the fp8 rounding (two roundings,
 * exact for the test values of an f64 graph). store: y gets the codes and,
 * at loom_fp8_scale_off, the scale (graph/ops/ops.h), not the values.
 */
static void qdq_any(loom_dtype sdt, const void *x, loom_dtype odt, void *y, int64_t n,
		    loom_dtype fmt, int store, qdq_stats *st)
{
	size_t ssz = loom_dtype_size(sdt), osz = loom_dtype_size(odt);
	int delayed = st->scale > 0;
	float amax = delayed ? 0 : amax_any(sdt, x, n);
	float scale = delayed ? st->scale : loom_fp8_scale(amax, fmax_of(fmt));
	int64_t sat = 0;
#pragma omp parallel for if (n >= LOOM_CPU_PAR_MIN) schedule(static) reduction(max : amax) reduction(+ : sat)
	for (int64_t i = 0; i < n; i += QDQ_BLOCK) {
		float buf[QDQ_BLOCK];
		uint8_t code[QDQ_BLOCK];
		int64_t k = n - i < QDQ_BLOCK ? n - i : QDQ_BLOCK;
		loom_cpu_cast(sdt, (const char *)x + i * ssz, LOOM_F32, buf, k);
		if (delayed) {
			float m = amax_f32(buf, k);
			amax = m > amax ? m : amax;
		}
		uint8_t *c = store ? (uint8_t *)y + i : code;
		sat += code_block(buf, c, k, scale, fmt);
		if (!store) {
			decode_block(c, buf, k, scale, fmt);
			loom_cpu_cast(LOOM_F32, buf, odt, (char *)y + i * osz, k);
		}
	}
	if (store)
		memcpy((char *)y + loom_fp8_scale_off(n), &scale, sizeof(scale));
	st->amax = amax;
	st->scale = scale;
	st->saturated = sat;
}

/* A table of the 256 codes' values in odt (f32 or a half), made by the
 * steps of the unstored rounding, then a gather: each element's bits are
 * its code's entry, the same as decoding it alone. */
void loom_cpu_fp8_decode(loom_dtype fmt, const void *stored, int64_t n, loom_dtype odt,
			 void *y)
{
	const uint8_t *c = stored;
	float scale, f[256];
	uint8_t all[256];
	union {
		float f32[256];
		uint16_t half[256];
	} t;
	memcpy(&scale, c + loom_fp8_scale_off(n), sizeof(scale));
	for (int k = 0; k < 256; k++)
		all[k] = (uint8_t)k;
	decode_block(all, f, 256, scale, fmt);
	loom_cpu_cast(LOOM_F32, f, odt, &t, 256);
	if (loom_dtype_size(odt) == 4) {
		float *o = y;
#pragma omp parallel for if (n >= LOOM_CPU_PAR_MIN) schedule(static)
		for (int64_t i = 0; i < n; i++)
			o[i] = t.f32[c[i]];
	} else {
		uint16_t *o = y;
#pragma omp parallel for if (n >= LOOM_CPU_PAR_MIN) schedule(static)
		for (int64_t i = 0; i < n; i++)
			o[i] = t.half[c[i]];
	}
}

static void qdq_f64(const double *x, double *y, int64_t n, loom_dtype fmt)
{
	double amax = 0;
	for (int64_t i = 0; i < n; i++)
		amax = fabs(x[i]) > amax ? fabs(x[i]) : amax;
	double scale = loom_fp8_scale((float)amax, fmax_of(fmt));
	for (int64_t i = 0; i < n; i++) {
		float s = (float)(x[i] * scale);
		float q = fmt == LOOM_FP8_E4M3 ? loom_e4m3_to_f32(loom_f32_to_e4m3(s)) :
						 loom_e5m2_to_f32(loom_f32_to_e5m2(s));
		y[i] = q / scale;
	}
}

static int is_fp8(loom_dtype fmt)
{
	return fmt == LOOM_FP8_E4M3 || fmt == LOOM_FP8_E5M2;
}

/* The node's tensor in the training state's fp8 scales, or NULL (a plan
 * built by hand in a test, without slots). */
static loom_fp8_tensor *tensor_of(loom_cpu_ctx *ctx, const loom_node *n)
{
	loom_fp8_state *fs = ctx->fp8;
	int slot = n->a.fp8.slot;
	return fs && slot >= 0 && slot < fs->n ? &fs->t[slot] : NULL;
}

/* A training run's amax, scale and saturation into the tensor's step in
 * progress (micro-steps: the max and the sum); evaluation runs leave the
 * scales to training. */
static void record(loom_cpu_ctx *ctx, loom_fp8_tensor *t, const qdq_stats *st)
{
	if (!t || !ctx->train)
		return;
	t->amax = st->amax > t->amax ? st->amax : t->amax;
	t->cur_scale = st->scale;
	t->saturated += st->saturated;
}

static loom_status run_qdq(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			   const loom_cpu_io *io)
{
	const loom_node *n = loom_cpu_node(plan, v);
	loom_dtype sdt = loom_cpu_src(plan, v, 0)->dtype, fmt = n->a.fp8.fwd;
	int64_t numel = loom_shape_numel(&n->shape);
	loom_fp8_tensor *t = is_fp8(fmt) ? tensor_of(ctx, n) : NULL;
	/* delayed scaling once the history holds a step; else current */
	qdq_stats st = { .scale = t && loom_fp8_uses_history(ctx->fp8) ? t->scale : 0 };
	if (!is_fp8(fmt)) /* the forward of a gradient's rounding: a copy */
		loom_cpu_cast(sdt, io->src[0], n->dtype, io->out, numel);
	else if (sdt == LOOM_F64 && n->dtype == LOOM_F64)
		qdq_f64(io->src[0], io->out, numel, fmt);
	else if (sdt == LOOM_F64 || n->dtype == LOOM_F64)
		return loom_errnf(ctx->err, LOOM_ERR_MAX, LOOM_ERR_DTYPE,
				  "fp8_qdq #%d: f64 in and out, or neither", (int)v);
	else {
		qdq_any(sdt, io->src[0], n->dtype, io->out, numel, fmt, n->a.fp8.store, &st);
		record(ctx, t, &st);
	}
	return LOOM_OK;
}

const loom_cpu_op loom_cpu_fp8_qdq = { .run = run_qdq, .raw = 1 };
