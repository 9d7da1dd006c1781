/*
 * engine/cpu/fp8_qdq.c — FP8_QDQ on the CPU, the exact emulation of FP8
 * training's casts (graph/ops/fp8.c): the tensor's amax, its power-of-two
 * scale (base/fp8.h's loom_fp8_scale), each element scaled, rounded through
 * E4M3 or E5M2 (round to nearest even, saturating: base/fp8.h) and divided
 * back. Reads and writes any float dtype (a cast folded in on either side).
 */
#include <math.h>
#include <string.h>

#include "base/fp8.h"
#include "engine/cpu/cpu_internal.h"
#include "engine/cpu/ops.h"

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

/* y = fp8(x * scale) / scale, in place allowed. The scale is a power of
 * two, so both products are exact: only the fp8 rounding rounds. */
static void qdq_block(const float *x, float *y, int64_t n, float scale, loom_dtype fmt)
{
	float inv = 1.0f / scale;
	if (fmt == LOOM_FP8_E4M3)
		for (int64_t i = 0; i < n; i++)
			y[i] = loom_e4m3_to_f32(loom_f32_to_e4m3(x[i] * scale)) * inv;
	else
		for (int64_t i = 0; i < n; i++)
			y[i] = loom_e5m2_to_f32(loom_f32_to_e5m2(x[i] * scale)) * inv;
}

void loom_cpu_fp8_qdq_f32(const float *x, float *y, int64_t n, loom_dtype fmt)
{
	float scale = loom_fp8_scale(amax_f32(x, n), fmax_of(fmt));
	qdq_block(x, y, n, scale, fmt);
}

/*
 * Any float dtype in and out (f16, bf16, f32), through blocks widened to
 * f32 on the stack: two passes, the amax then the rounding. f64 (the
 * gradient checks) keeps its own precision, rounded to f32 before the fp8
 * rounding (two roundings, exact for the test values of an f64 graph).
 */
static void qdq_any(loom_dtype sdt, const void *x, loom_dtype odt, void *y, int64_t n,
		    loom_dtype fmt)
{
	size_t ssz = loom_dtype_size(sdt), osz = loom_dtype_size(odt);
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
	float scale = loom_fp8_scale(amax, fmax_of(fmt));
#pragma omp parallel for if (n >= LOOM_CPU_PAR_MIN) schedule(static)
	for (int64_t i = 0; i < n; i += QDQ_BLOCK) {
		float buf[QDQ_BLOCK];
		int64_t k = n - i < QDQ_BLOCK ? n - i : QDQ_BLOCK;
		loom_cpu_cast(sdt, (const char *)x + i * ssz, LOOM_F32, buf, k);
		qdq_block(buf, buf, k, scale, fmt);
		loom_cpu_cast(LOOM_F32, buf, odt, (char *)y + i * osz, k);
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

static loom_status run_qdq(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			   const loom_cpu_io *io)
{
	const loom_node *n = loom_cpu_node(plan, v);
	loom_dtype sdt = loom_cpu_src(plan, v, 0)->dtype, fmt = n->a.fp8.fwd;
	int64_t numel = loom_shape_numel(&n->shape);
	(void)ctx;
	if (!is_fp8(fmt)) /* the forward of a gradient's rounding: a copy */
		loom_cpu_cast(sdt, io->src[0], n->dtype, io->out, numel);
	else if (sdt == LOOM_F64 && n->dtype == LOOM_F64)
		qdq_f64(io->src[0], io->out, numel, fmt);
	else if (sdt == LOOM_F64 || n->dtype == LOOM_F64)
		return loom_errnf(ctx->err, LOOM_ERR_MAX, LOOM_ERR_DTYPE,
				  "fp8_qdq #%d: f64 in and out, or neither", (int)v);
	else
		qdq_any(sdt, io->src[0], n->dtype, io->out, numel, fmt);
	return LOOM_OK;
}

const loom_cpu_op loom_cpu_fp8_qdq = { .run = run_qdq, .raw = 1 };
