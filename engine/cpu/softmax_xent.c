/*
 * engine/cpu/softmax_xent.c — softmax cross-entropy on the CPU: the mean
 * loss over rows of logits against integer labels and its gradient (f32
 * and f64, log-sum-exp in double; bf16 logits and dlogits row by row in
 * f32), and the entries of SOFTMAX_CE and SOFTMAX_CE_BWD. The f32/f64
 * kernels are written once at the end of this file, which includes itself
 * once per type (LOOM_CPU_TEMPLATE set).
 */
#ifndef LOOM_CPU_TEMPLATE
#include <math.h>
#include <string.h>

#include "base/half.h"
#include "engine/cpu/cpu_internal.h"
#include "engine/cpu/ops.h"

#define LOOM_CPU_TEMPLATE_FILE "engine/cpu/softmax_xent.c"
#include "engine/cpu/f32_f64.h"

/* ------------------------------------------------------------ bf16 */

int loom_cpu_softmax_ce_fwd_bf16(int n, int classes, const void *logits, const int32_t *labels,
				 float *loss, int *bad, float *ws, unsigned half)
{
	return loom_cpu_softmax_ce_fwd_ld_bf16(n, classes, classes, logits, labels, loss, bad, ws,
					       half);
}

int loom_cpu_softmax_ce_fwd_ld_bf16(int n, int classes, int ld, const void *logits,
				    const int32_t *labels, float *loss, int *bad, float *ws,
				    unsigned half)
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
		const float *row = loom_cpu_bf16_in(logits, half & LOOM_CPU_BF16_SRC(0),
						    (int64_t)i * ld, classes, ws);
		loom_cpu_softmax_ce_rows_f32(1, classes, row, labels + i, &total);
	}
	*loss = (float)(n > 0 ? total / n : 0);
	return 0;
}

int loom_cpu_softmax_ce_bwd_bf16(int n, int classes, const void *logits, const int32_t *labels,
				 const void *dloss, void *dlogits, float *ws, unsigned half)
{
	return loom_cpu_softmax_ce_bwd_ld_bf16(n, classes, classes, logits, labels, dloss, dlogits,
					       ws, half);
}

int loom_cpu_softmax_ce_bwd_ld_bf16(int n, int classes, int ld, const void *logits,
				    const int32_t *labels, const void *dloss, void *dlogits,
				    float *ws, unsigned half)
{
	const int in16 = half & LOOM_CPU_BF16_SRC(0), out16 = half & LOOM_CPU_BF16_OUT;
	float dl = half & LOOM_CPU_BF16_SRC(2) ? loom_bf16_to_f32(*(const uint16_t *)dloss) :
						 *(const float *)dloss;
	const double g = n > 0 ? (double)dl / n : 0;
	float *obuf = ws + (in16 ? classes : 0);
	const size_t esz = out16 ? 2 : 4;
	for (int i = 0; i < n; i++) {
		int64_t off = (int64_t)i * ld;
		const float *row = loom_cpu_bf16_in(logits, in16, off, classes, ws);
		float *o = loom_cpu_bf16_out(dlogits, out16, off, obuf);
		loom_cpu_softmax_ce_bwd_rows_f32(1, classes, row, labels + i, g, o);
		loom_cpu_bf16_done(dlogits, out16, off, classes, o);
		/* a padded vocabulary's columns: zero gradient */
		if (ld > classes)
			memset((char *)dlogits + (size_t)(off + classes) * esz, 0,
			       (size_t)(ld - classes) * esz);
	}
	return 1;
}

/* ---------------------------------------------------------- entries */

static loom_status run_fwd(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			   const loom_cpu_io *io)
{
	const loom_node *n = loom_cpu_node(plan, v), *x = loom_cpu_src(plan, v, 0);
	int bad = -1, r, classes = (int)loom_node_classes(x);
	if (loom_cpu_kernel_dtype(n) == LOOM_F64)
		r = loom_cpu_softmax_ce_fwd_ld_f64((int)x->shape.dims[0], classes,
						   (int)x->shape.dims[1], io->src[0], io->src[1],
						   io->out, &bad);
	else
		r = loom_cpu_softmax_ce_fwd_ld_f32((int)x->shape.dims[0], classes,
						   (int)x->shape.dims[1], io->src[0], io->src[1],
						   io->out, &bad);
	if (r < 0)
		return loom_bad_label(ctx->err, plan, v,
				      bad >= 0 ? ((const int32_t *)io->src[1])[bad] : -1, bad);
	return LOOM_OK;
}

/* Its ws (a row or two, only for its bf16 arrays) within the emulation's
 * copies of them, which backend.c sized. An f32 loss only. */
static int bf16_fwd(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v, const loom_cpu_io *io,
		    unsigned half, loom_status *st)
{
	const loom_node *x = loom_cpu_src(plan, v, 0);
	int bad = -1;
	if (half & LOOM_CPU_BF16_OUT)
		return 0;
	if (loom_cpu_softmax_ce_fwd_ld_bf16((int)x->shape.dims[0], (int)loom_node_classes(x),
					    (int)x->shape.dims[1], io->src[0], io->src[1], io->out,
					    &bad, io->ws, half) < 0)
		*st = loom_bad_label(ctx->err, plan, v, ((const int32_t *)io->src[1])[bad], bad);
	return 1;
}

static loom_status run_bwd(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			   const loom_cpu_io *io)
{
	const loom_node *n = loom_cpu_node(plan, v), *x = loom_cpu_src(plan, v, 0);
	(void)ctx;
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(n), loom_cpu_softmax_ce_bwd_ld, (int)x->shape.dims[0],
			  (int)loom_node_classes(x), (int)x->shape.dims[1], io->src[0], io->src[1],
			  io->src[2], io->out);
	return LOOM_OK;
}

static int bf16_bwd(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v, const loom_cpu_io *io,
		    unsigned half, loom_status *st)
{
	const loom_node *x = loom_cpu_src(plan, v, 0);
	(void)ctx;
	(void)st;
	return loom_cpu_softmax_ce_bwd_ld_bf16((int)x->shape.dims[0], (int)loom_node_classes(x),
					       (int)x->shape.dims[1], io->src[0], io->src[1],
					       io->src[2], io->out, io->ws, half);
}

const loom_cpu_op loom_cpu_softmax_ce = { .run = run_fwd, .bf16 = bf16_fwd };
const loom_cpu_op loom_cpu_softmax_ce_bwd = { .run = run_bwd, .bf16 = bf16_bwd };

#else /* LOOM_CPU_TEMPLATE: the f32 and f64 kernels, T and SFX set */

/* log(sum(exp(row))) with the max taken out so that exp never overflows. */
static double LOOM_CPU_FN(ce_logsumexp)(int classes, const T *row)
{
	double mx = row[0], s = 0;
	for (int j = 1; j < classes; j++)
		mx = row[j] > mx ? row[j] : mx;
	s = LOOM_CPU_FN(loom_cpu_exp_sum)(classes, row, mx);
	return mx + log(s);
}

/* *total += logsumexp(row) - row[label] over n rows in order (labels
 * checked by the caller); the bf16 kernel calls it per widened row too. */
void LOOM_CPU_FN(loom_cpu_softmax_ce_rows)(int n, int classes, const T *logits,
					   const int32_t *labels, double *total)
{
	for (int i = 0; i < n; i++) {
		const T *row = logits + (int64_t)i * classes;
		*total += LOOM_CPU_FN(ce_logsumexp)(classes, row) - row[labels[i]];
	}
}

int LOOM_CPU_FN(loom_cpu_softmax_ce_fwd)(int n, int classes, const T *logits,
					 const int32_t *labels, T *loss, int *bad)
{
	return LOOM_CPU_FN(loom_cpu_softmax_ce_fwd_ld)(n, classes, classes, logits, labels, loss,
						       bad);
}

int LOOM_CPU_FN(loom_cpu_softmax_ce_fwd_ld)(int n, int classes, int ld, const T *logits,
					    const int32_t *labels, T *loss, int *bad)
{
	/* Validate everything first so that a bad label writes nothing. */
	for (int i = 0; i < n; i++) {
		if (labels[i] < 0 || labels[i] >= classes) {
			if (bad)
				*bad = i;
			return -1;
		}
	}
	double total = 0;
	/* row by row (each row's first `classes` of ld), in order */
	for (int i = 0; i < n; i++)
		LOOM_CPU_FN(loom_cpu_softmax_ce_rows)(1, classes, logits + (int64_t)i * ld,
						      labels + i, &total);
	*loss = (T)(n > 0 ? total / n : 0);
	return 0;
}

/* dlogits of n rows for the gradient scale g = dloss / (all rows). */
void LOOM_CPU_FN(loom_cpu_softmax_ce_bwd_rows)(int n, int classes, const T *logits,
					       const int32_t *labels, double g, T *dlogits)
{
	for (int i = 0; i < n; i++) {
		const T *row = logits + (int64_t)i * classes;
		T *out = dlogits + (int64_t)i * classes;
		/* dlogits may be logits (LOOM_OPF_INPLACE): the label's logit is
		 * read before its place is written. */
		int lab = labels[i];
		T at_label = lab >= 0 && lab < classes ? row[lab] : 0;
		double lse = LOOM_CPU_FN(ce_logsumexp)(classes, row);
		LOOM_CPU_FN(loom_cpu_exp_scale)(classes, row, lse, g, out);
		/* The forward rejected bad labels; a bad one here only loses its
		 * one-hot term instead of writing out of bounds. */
		if (lab >= 0 && lab < classes)
			out[lab] = (T)((exp(at_label - lse) - 1) * g);
	}
}

void LOOM_CPU_FN(loom_cpu_softmax_ce_bwd)(int n, int classes, const T *logits,
					  const int32_t *labels, const T *dloss, T *dlogits)
{
	LOOM_CPU_FN(loom_cpu_softmax_ce_bwd_ld)(n, classes, classes, logits, labels, dloss, dlogits);
}

void LOOM_CPU_FN(loom_cpu_softmax_ce_bwd_ld)(int n, int classes, int ld, const T *logits,
					     const int32_t *labels, const T *dloss, T *dlogits)
{
	const double g = n > 0 ? (double)*dloss / n : 0;
	if (ld == classes) {
		LOOM_CPU_FN(loom_cpu_softmax_ce_bwd_rows)(n, classes, logits, labels, g, dlogits);
		return;
	}
	for (int i = 0; i < n; i++) {
		T *out = dlogits + (int64_t)i * ld;
		LOOM_CPU_FN(loom_cpu_softmax_ce_bwd_rows)(1, classes, logits + (int64_t)i * ld,
							  labels + i, g, out);
		for (int j = classes; j < ld; j++) /* a padded vocabulary's columns */
			out[j] = 0;
	}
}

#endif /* LOOM_CPU_TEMPLATE */
