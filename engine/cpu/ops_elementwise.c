/*
 * engine/cpu/ops_elementwise.c — the CPU entries of the elementwise ops
 * (relu, the unary ops of graph/unary.h through one entry, add with the
 * relu graph/fuse.c may fold into it, sum, scalar
 * broadcast, the loss-scale seed of backward) and of the dtype cast that the
 * AMP pass inserts.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "base/options.h"
#include "engine/cpu/ops.h"
#include "base/elem.h"
#include "graph/ops/ops.h"

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

/* The unary ops (graph/unary.h) run in the entry itself: their functions
 * (erf, tanh) dominate, and there is no library kernel or ISA-specific
 * loop to choose between. One loop per row and dtype, the row chosen once. */
#define UNARY_PAR_MIN 32768

#define UNARY_CASE(NAME, low)                                                          \
	case LOOM_OP_##NAME:                                                            \
	case LOOM_OP_##NAME##_BWD:                                                      \
		if (f64) {                                                              \
			const double *x = io->src[0], *dy = bwd ? io->src[1] : NULL;    \
			double *y = io->out;                                            \
			_Pragma("omp parallel for if (n >= UNARY_PAR_MIN) schedule(static)") \
			for (int64_t i = 0; i < n; i++)                                 \
				y[i] = loom_unary_##low##_f64(x[i], bwd ? dy[i] : 0.0, bwd, attr); \
		} else {                                                                \
			const float *x = io->src[0], *dy = bwd ? io->src[1] : NULL;     \
			float *y = io->out;                                             \
			_Pragma("omp parallel for if (n >= UNARY_PAR_MIN) schedule(static)") \
			for (int64_t i = 0; i < n; i++)                                 \
				y[i] = loom_unary_##low##_f32(x[i], bwd ? dy[i] : 0.0f, bwd, attr); \
		}                                                                       \
		return LOOM_OK;

loom_status loom_cpu_op_unary(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			      const loom_cpu_io *io)
{
	const loom_node *nd = &plan->g->nodes[v];
	int64_t n = numel_of(plan, v);
	int bwd = nd->nsrc > 1, attr = nd->a.ew.tanh;
	int f64 = loom_cpu_kernel_dtype(nd) == LOOM_F64;
	(void)ctx;
	if ((nd->op == LOOM_OP_GELU || nd->op == LOOM_OP_GELU_BWD) && !f64) {
		loom_cpu_gelu_f32(n, io->src[0], bwd ? io->src[1] : NULL, attr, io->out);
		return LOOM_OK;
	}
	switch (nd->op) {
		LOOM_UNARY_OPS(UNARY_CASE)
	default:
		return loom_errnf(ctx->err, LOOM_ERR_MAX, LOOM_ERR_UNSUPPORTED,
				  "cpu: %s is not a unary op",
				  loom_op_defs[nd->op]->name);
	}
}
#undef UNARY_CASE

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

static int bf16_native_on(void)
{
	static int on = -1;
	return loom_opt_bool_once(LOOM_OPT_CPU_BF16_NATIVE_EW, &on);
}

int loom_cpu_ew_bf16_native(const loom_plan *plan, loom_value v, const loom_cpu_io *io)
{
	const loom_node *n = &plan->g->nodes[v];
	int op, flag = 0;
	switch (n->op) {
	case LOOM_OP_MAXPOOL2D:
	case LOOM_OP_MAXPOOL2D_BWD: {
		loom_pool_shape ps;
		/* per NCHW plane: a blocked pool takes the widened path */
		if (n->dtype != LOOM_BF16 || !bf16_native_on() || n->format != LOOM_FORMAT_NCHW)
			return 0;
		for (int i = 0; i < n->nsrc; i++)
			if (plan->g->nodes[n->src[i]].dtype != LOOM_BF16)
				return 0;
		loom_pool_shape_of(plan->g, v, &ps);
		return loom_cpu_maxpool2d_bf16(&ps, io->src[0], n->nsrc > 1 ? io->src[1] : NULL,
					       io->out);
	}
	case LOOM_OP_ADD:
		op = LOOM_CPU_EW_ADD;
		flag = n->a.ew.relu;
		break;
	case LOOM_OP_RELU:
		op = LOOM_CPU_EW_RELU;
		break;
	case LOOM_OP_RELU_BWD:
		op = LOOM_CPU_EW_RELU_BWD;
		break;
	case LOOM_OP_GELU:
	case LOOM_OP_GELU_BWD:
		op = LOOM_CPU_EW_GELU;
		flag = n->a.ew.tanh;
		break;
	default:
		return 0;
	}
	if (n->dtype != LOOM_BF16 || !bf16_native_on())
		return 0;
	for (int i = 0; i < n->nsrc; i++)
		if (plan->g->nodes[n->src[i]].dtype != LOOM_BF16 ||
		    loom_shape_numel(&plan->g->nodes[n->src[i]].shape) != numel_of(plan, v))
			return 0;
	loom_cpu_ew_bf16(op, flag, numel_of(plan, v), io->src[0], n->nsrc > 1 ? io->src[1] : NULL,
			 io->out);
	return 1;
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
