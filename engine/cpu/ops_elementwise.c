/*
 * engine/cpu/ops_elementwise.c — the CPU entries of the elementwise ops
 * (relu, add with the relu graph/fuse.c may fold into it, sum, scalar
 * broadcast, the loss-scale seed of backward) and of the dtype cast that the
 * AMP pass inserts.
 */
#include <math.h>

#include "amp/half.h"
#include "engine/cpu/ops.h"
#include "engine/elem.h"

static int64_t numel_of(const loom_plan *plan, loom_value v)
{
	return loom_shape_numel(&plan->g->nodes[v].shape);
}

loom_status loom_cpu_op_relu(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			     const loom_cpu_io *io)
{
	(void)ctx;
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(&plan->g->nodes[v]), loom_cpu_relu_fwd,
			  numel_of(plan, v), io->src[0], io->out);
	return LOOM_OK;
}

loom_status loom_cpu_op_relu_bwd(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				 const loom_cpu_io *io)
{
	(void)ctx;
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(&plan->g->nodes[v]), loom_cpu_relu_bwd,
			  numel_of(plan, v), io->src[0], io->src[1], io->out);
	return LOOM_OK;
}

/* gelu runs in the entry itself: erf (or tanh) dominates, and there is no
 * library kernel or ISA-specific loop to choose between. The exact form:
 * dx = dy * (Phi(x) + x phi(x)); the tanh one (GPT-2's), with
 * u = k (x + c x^3): y = x (1 + tanh u) / 2,
 * dx = dy ((1 + tanh u) / 2 + x (1 - tanh^2 u) k (1 + 3 c x^2) / 2). */
#define GELU_PAR_MIN 32768
#define GELU_C 0.044715

static void gelu_f32(int64_t n, const float *x, const float *dy, float *y, int tanh_form)
{
	const float k = (float)(0.5 * M_2_SQRTPI * M_SQRT1_2); /* 1 / sqrt(2 pi) */
	const float kt = (float)(M_2_SQRTPI * M_SQRT1_2);      /* sqrt(2 / pi) */
#pragma omp parallel for if (n >= GELU_PAR_MIN) schedule(static)
	for (int64_t i = 0; i < n; i++) {
		float v = x[i];
		if (tanh_form) {
			float t = tanhf(kt * (v + (float)GELU_C * v * v * v));
			y[i] = dy ? dy[i] * (0.5f * (1 + t) + 0.5f * v * (1 - t * t) * kt *
						       (1 + 3 * (float)GELU_C * v * v)) :
				    0.5f * v * (1 + t);
			continue;
		}
		float cdf = 0.5f * (1.0f + erff(v * (float)M_SQRT1_2));
		y[i] = dy ? dy[i] * (cdf + v * k * expf(-0.5f * v * v)) : v * cdf;
	}
}

static void gelu_f64(int64_t n, const double *x, const double *dy, double *y, int tanh_form)
{
	const double k = 0.5 * M_2_SQRTPI * M_SQRT1_2, kt = M_2_SQRTPI * M_SQRT1_2;
#pragma omp parallel for if (n >= GELU_PAR_MIN) schedule(static)
	for (int64_t i = 0; i < n; i++) {
		double v = x[i];
		if (tanh_form) {
			double t = tanh(kt * (v + GELU_C * v * v * v));
			y[i] = dy ? dy[i] * (0.5 * (1 + t) + 0.5 * v * (1 - t * t) * kt *
						       (1 + 3 * GELU_C * v * v)) :
				    0.5 * v * (1 + t);
			continue;
		}
		double cdf = 0.5 * (1.0 + erf(v * M_SQRT1_2));
		y[i] = dy ? dy[i] * (cdf + v * k * exp(-0.5 * v * v)) : v * cdf;
	}
}

static void gelu(const loom_plan *plan, loom_value v, const loom_cpu_io *io, int bwd)
{
	int64_t n = numel_of(plan, v);
	int t = plan->g->nodes[v].a.ew.tanh;
	if (loom_cpu_kernel_dtype(&plan->g->nodes[v]) == LOOM_F64)
		gelu_f64(n, io->src[0], bwd ? io->src[1] : NULL, io->out, t);
	else
		gelu_f32(n, io->src[0], bwd ? io->src[1] : NULL, io->out, t);
}

loom_status loom_cpu_op_gelu(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			     const loom_cpu_io *io)
{
	(void)ctx;
	gelu(plan, v, io, 0);
	return LOOM_OK;
}

loom_status loom_cpu_op_gelu_bwd(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				 const loom_cpu_io *io)
{
	(void)ctx;
	gelu(plan, v, io, 1);
	return LOOM_OK;
}

loom_status loom_cpu_op_add(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			    const loom_cpu_io *io)
{
	const loom_node *n = &plan->g->nodes[v];
	loom_dtype dt = loom_cpu_kernel_dtype(n);
	(void)ctx;
	LOOM_CPU_DISPATCH(dt, loom_cpu_add, numel_of(plan, v), io->src[0], io->src[1], io->out);
	if (n->a.ew.relu) /* fused (graph/fuse.c), before any rounding to half */
		LOOM_CPU_DISPATCH(dt, loom_cpu_relu_fwd, numel_of(plan, v), io->out, io->out);
	return LOOM_OK;
}

loom_status loom_cpu_op_sum(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			    const loom_cpu_io *io)
{
	(void)ctx;
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(&plan->g->nodes[v]), loom_cpu_sum,
			  numel_of(plan, plan->g->nodes[v].src[0]), io->src[0], io->out);
	return LOOM_OK;
}

loom_status loom_cpu_op_broadcast(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				  const loom_cpu_io *io)
{
	const loom_node *n = &plan->g->nodes[v];
	(void)ctx;
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(n), loom_cpu_broadcast_scalar, numel_of(plan, v),
			  io->src[0], n->a.bc.scale, io->out);
	return LOOM_OK;
}

/* d loss / d loss, times the run's loss scale. */
loom_status loom_cpu_op_grad_seed(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				  const loom_cpu_io *io)
{
	if (loom_cpu_kernel_dtype(&plan->g->nodes[v]) == LOOM_F64)
		*(double *)io->out = ctx->seed_scale;
	else
		*(float *)io->out = ctx->seed_scale;
	return LOOM_OK;
}

void loom_cpu_cast(loom_dtype from, const void *src, loom_dtype to, void *dst, int64_t n)
{
	if (from == LOOM_F32 && to == LOOM_F16) {
		loom_f32_to_f16_array(src, dst, n);
	} else if (from == LOOM_F32 && to == LOOM_BF16) {
		loom_f32_to_bf16_array(src, dst, n);
	} else if (from == LOOM_F16 && to == LOOM_F32) {
		loom_f16_to_f32_array(src, dst, n);
	} else if (from == LOOM_BF16 && to == LOOM_F32) {
		loom_bf16_to_f32_array(src, dst, n);
	} else {
		#pragma omp parallel for if (n > 65536)
		for (int64_t i = 0; i < n; i++)
			loom_elem_set(to, dst, i, loom_elem_get(from, src, i));
	}
}

/* Between any two float dtypes, through f32 (f64 directly); the sources
 * arrive in their own dtype (backend.c does not widen them). */
loom_status loom_cpu_op_cast(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			     const loom_cpu_io *io)
{
	const loom_node *n = &plan->g->nodes[v];
	(void)ctx;
	loom_cpu_cast(plan->g->nodes[n->src[0]].dtype, io->src[0], n->dtype, io->out,
		      loom_shape_numel(&n->shape));
	return LOOM_OK;
}
