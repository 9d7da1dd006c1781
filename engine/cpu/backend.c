/*
 * engine/cpu/backend.c — the CPU backend: host memory for the arena and a
 * dispatch from each node to its kernel in kernels.h. f32 and f64 run
 * natively; f16 and bf16 are storage formats emulated exactly: half sources
 * are widened into f32 scratch, the f32 kernel runs, and a half result is
 * rounded to nearest even on the way out — the numerics of a GPU that reads
 * half, accumulates in fp32 and writes half.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amp/half.h"
#include "engine/elem.h"
#include "engine/cpu/bf16_node.h"
#include "engine/cpu/kernels.h"
#include "engine/cpu/optim.h"
#include "engine/program_internal.h"

static int is_half(loom_dtype dt)
{
	return dt == LOOM_F16 || dt == LOOM_BF16;
}

static size_t align64(size_t x)
{
	return (x + 63) & ~(size_t)63;
}

static const loom_node *src_node(const loom_program *p, const loom_node *n, int i)
{
	return &p->g->nodes[n->src[i]];
}

/* The dtype the kernel runs in: f64 for f64 nodes, f32 for everything else. */
static loom_dtype kernel_dtype(const loom_node *n)
{
	return n->dtype == LOOM_F64 ? LOOM_F64 : LOOM_F32;
}

static int emulated(const loom_program *p, const loom_node *n)
{
	if (is_half(n->dtype))
		return 1;
	for (int i = 0; i < n->nsrc; i++)
		if (is_half(src_node(p, n, i)->dtype))
			return 1;
	return 0;
}

static void conv_shape(const loom_node *x, const loom_node *w, const loom_node *y,
		       const loom_attrs *a, loom_conv_shape *s)
{
	s->n = (int)x->shape.dims[0];
	s->c_in = (int)x->shape.dims[1];
	s->h_in = (int)x->shape.dims[2];
	s->w_in = (int)x->shape.dims[3];
	s->c_out = (int)w->shape.dims[0];
	s->kh = (int)w->shape.dims[2];
	s->kw = (int)w->shape.dims[3];
	s->stride = a->conv.stride;
	s->pad = a->conv.pad;
	s->h_out = (int)y->shape.dims[2];
	s->w_out = (int)y->shape.dims[3];
}

/* The (x, w, y) triple of a conv node or one of its backward nodes. */
static void conv_shape_of(const loom_program *p, const loom_node *n, loom_conv_shape *s)
{
	switch (n->op) {
	case LOOM_OP_CONV2D:
		conv_shape(src_node(p, n, 0), src_node(p, n, 1), n, &n->a, s);
		break;
	case LOOM_OP_CONV2D_BWD_DATA: /* (dy, w) -> dx */
		conv_shape(n, src_node(p, n, 1), src_node(p, n, 0), &n->a, s);
		break;
	default: /* CONV2D_BWD_FILTER: (dy, x) -> dw */
		conv_shape(src_node(p, n, 1), n, src_node(p, n, 0), &n->a, s);
		break;
	}
}

static size_t cpu_workspace(loom_program *p, loom_value v)
{
	const loom_node *n = &p->g->nodes[v];
	size_t ws = 0;
	if (n->op == LOOM_OP_CONV2D || n->op == LOOM_OP_CONV2D_BWD_DATA ||
	    n->op == LOOM_OP_CONV2D_BWD_FILTER) {
		loom_conv_shape s;
		conv_shape_of(p, n, &s);
		ws = align64(loom_cpu_conv2d_workspace(&s, loom_dtype_size(kernel_dtype(n))));
	}
	if (n->op != LOOM_OP_CAST && emulated(p, n)) {
		for (int i = 0; i < n->nsrc; i++)
			if (is_half(src_node(p, n, i)->dtype))
				ws += align64(4 * loom_shape_numel(&src_node(p, n, i)->shape));
		ws += align64(4 * loom_shape_numel(&n->shape));
	}
	return ws;
}

static loom_status cpu_prepare(loom_program *p)
{
	size_t total = p->mp.persist_bytes + p->mp.act_bytes + p->ws_bytes + p->state_bytes;
	unsigned char *base = aligned_alloc(64, align64(total ? total : 64));
	if (!base)
		return loom_program_fail(p, LOOM_ERR_NOMEM, "cannot allocate the %.1f MiB arena",
					 total / 1048576.0);
	memset(base, 0, total);
	p->be_ctx = base;
	p->persist = base;
	p->act = base + p->mp.persist_bytes;
	p->ws = p->act + p->mp.act_bytes;
	p->state = p->ws + p->ws_bytes;
	snprintf(p->backend_name, sizeof(p->backend_name), "cpu");
	return LOOM_OK;
}

static void cpu_release(loom_program *p)
{
	free(p->be_ctx);
	p->be_ctx = NULL;
}

static loom_status cpu_copy(loom_program *p, void *dst, const void *src, size_t bytes)
{
	(void)p;
	memcpy(dst, src, bytes);
	return LOOM_OK;
}

/* ------------------------------------------------------------ dispatch */

typedef struct args {
	void *src[LOOM_MAX_SRC];
	void *out;
	void *ws;
} args;

#define DISPATCH(dt, fn, ...)                                   \
	do {                                                    \
		if ((dt) == LOOM_F64)                           \
			fn##_f64(__VA_ARGS__);                  \
		else                                            \
			fn##_f32(__VA_ARGS__);                  \
	} while (0)

/* Runs node v's kernel on buffers that all hold kernel_dtype(n) (or i32). */
static loom_status run_kernel(loom_program *p, loom_value v, const args *a, int train)
{
	const loom_node *n = &p->g->nodes[v];
	loom_dtype dt = kernel_dtype(n);
	int64_t numel = loom_shape_numel(&n->shape);
	const loom_node *x = n->nsrc ? src_node(p, n, 0) : NULL;
	loom_conv_shape cs;
	char lb[96];

	switch (n->op) {
	case LOOM_OP_INPUT:
	case LOOM_OP_PARAM:
	case LOOM_OP_BUFFER:
		return LOOM_OK;
	case LOOM_OP_CONV2D:
		conv_shape_of(p, n, &cs);
		if (dt == LOOM_F64)
			loom_cpu_conv2d_fwd_f64(&cs, a->src[0], a->src[1],
						n->nsrc > 2 ? a->src[2] : NULL, a->out, a->ws);
		else
			loom_cpu_conv2d_fwd_f32(&cs, a->src[0], a->src[1],
						n->nsrc > 2 ? a->src[2] : NULL, a->out, a->ws);
		return LOOM_OK;
	case LOOM_OP_CONV2D_BWD_DATA:
		conv_shape_of(p, n, &cs);
		DISPATCH(dt, loom_cpu_conv2d_bwd_data, &cs, a->src[0], a->src[1], a->out, a->ws);
		return LOOM_OK;
	case LOOM_OP_CONV2D_BWD_FILTER:
		conv_shape_of(p, n, &cs);
		DISPATCH(dt, loom_cpu_conv2d_bwd_filter, &cs, a->src[0], a->src[1], a->out, a->ws);
		return LOOM_OK;
	case LOOM_OP_CHANNEL_SUM: {
		int64_t hw = 1;
		for (int i = 2; i < x->shape.ndim; i++)
			hw *= x->shape.dims[i];
		DISPATCH(dt, loom_cpu_channel_sum, (int)x->shape.dims[0], (int)x->shape.dims[1], hw,
			 a->src[0], a->out);
		return LOOM_OK;
	}
	case LOOM_OP_BATCHNORM2D: {
		int nb = (int)x->shape.dims[0], c = (int)x->shape.dims[1];
		int64_t hw = x->shape.dims[2] * x->shape.dims[3];
		if (train)
			DISPATCH(dt, loom_cpu_bn_fwd_train, nb, c, hw, a->src[0], a->src[1], a->src[2],
				 a->src[3], a->src[4], n->a.bn.momentum, n->a.bn.eps, a->out);
		else
			DISPATCH(dt, loom_cpu_bn_fwd_eval, nb, c, hw, a->src[0], a->src[1], a->src[2],
				 a->src[3], a->src[4], n->a.bn.eps, a->out);
		return LOOM_OK;
	}
	case LOOM_OP_BN_BWD_DATA: {
		int nb = (int)x->shape.dims[0], c = (int)x->shape.dims[1];
		int64_t hw = x->shape.dims[2] * x->shape.dims[3];
		DISPATCH(dt, loom_cpu_bn_bwd_data, nb, c, hw, a->src[0], a->src[1], a->src[2],
			 n->a.bn.eps, a->out);
		return LOOM_OK;
	}
	case LOOM_OP_BN_BWD_GAMMA: {
		int nb = (int)x->shape.dims[0], c = (int)x->shape.dims[1];
		int64_t hw = x->shape.dims[2] * x->shape.dims[3];
		DISPATCH(dt, loom_cpu_bn_bwd_gamma, nb, c, hw, a->src[0], a->src[1], n->a.bn.eps,
			 a->out);
		return LOOM_OK;
	}
	case LOOM_OP_RELU:
		DISPATCH(dt, loom_cpu_relu_fwd, numel, a->src[0], a->out);
		return LOOM_OK;
	case LOOM_OP_RELU_BWD:
		DISPATCH(dt, loom_cpu_relu_bwd, numel, a->src[0], a->src[1], a->out);
		return LOOM_OK;
	case LOOM_OP_MAXPOOL2D:
	case LOOM_OP_MAXPOOL2D_BWD: {
		const loom_node *y = n->op == LOOM_OP_MAXPOOL2D ? n : src_node(p, n, 1);
		loom_pool_shape ps = {
			.n = (int)x->shape.dims[0], .c = (int)x->shape.dims[1],
			.h_in = (int)x->shape.dims[2], .w_in = (int)x->shape.dims[3],
			.k = n->a.pool.kernel, .stride = n->a.pool.stride, .pad = n->a.pool.pad,
			.h_out = (int)y->shape.dims[2], .w_out = (int)y->shape.dims[3],
			.relu = n->a.pool.relu,
		};
		if (n->op == LOOM_OP_MAXPOOL2D)
			DISPATCH(dt, loom_cpu_maxpool2d_fwd, &ps, a->src[0], a->out);
		else
			DISPATCH(dt, loom_cpu_maxpool2d_bwd, &ps, a->src[0], a->src[1], a->out);
		return LOOM_OK;
	}
	case LOOM_OP_LINEAR: {
		const loom_node *w = src_node(p, n, 1);
		if (dt == LOOM_F64)
			loom_cpu_linear_fwd_f64((int)x->shape.dims[0], (int)x->shape.dims[1],
						(int)w->shape.dims[0], a->src[0], a->src[1],
						n->nsrc > 2 ? a->src[2] : NULL, a->out);
		else
			loom_cpu_linear_fwd_f32((int)x->shape.dims[0], (int)x->shape.dims[1],
						(int)w->shape.dims[0], a->src[0], a->src[1],
						n->nsrc > 2 ? a->src[2] : NULL, a->out);
		if (n->a.mm.relu) /* fused (graph/fuse.c), before any rounding to half */
			DISPATCH(dt, loom_cpu_relu_fwd, numel, a->out, a->out);
		return LOOM_OK;
	}
	case LOOM_OP_MATMUL: {
		int ta = n->a.mm.ta, tb = n->a.mm.tb;
		int k = (int)(ta ? x->shape.dims[0] : x->shape.dims[1]);
		DISPATCH(dt, loom_cpu_gemm, ta, tb, (int)n->shape.dims[0], (int)n->shape.dims[1], k,
			 1.0, a->src[0], a->src[1], 0.0, a->out);
		return LOOM_OK;
	}
	case LOOM_OP_ADD:
		DISPATCH(dt, loom_cpu_add, numel, a->src[0], a->src[1], a->out);
		return LOOM_OK;
	case LOOM_OP_RESHAPE:
		/* A view: the memory planner gave it its source's storage. */
		return LOOM_OK;
	case LOOM_OP_SUM:
		DISPATCH(dt, loom_cpu_sum, loom_shape_numel(&x->shape), a->src[0], a->out);
		return LOOM_OK;
	case LOOM_OP_BROADCAST:
		DISPATCH(dt, loom_cpu_broadcast_scalar, numel, a->src[0], n->a.bc.scale, a->out);
		return LOOM_OK;
	case LOOM_OP_SOFTMAX_CE: {
		int bad = -1, r;
		if (dt == LOOM_F64)
			r = loom_cpu_softmax_ce_fwd_f64((int)x->shape.dims[0], (int)x->shape.dims[1],
							a->src[0], a->src[1], a->out, &bad);
		else
			r = loom_cpu_softmax_ce_fwd_f32((int)x->shape.dims[0], (int)x->shape.dims[1],
							a->src[0], a->src[1], a->out, &bad);
		if (r < 0)
			return loom_program_fail(p, LOOM_ERR_INVALID,
						 "%s: label %d of row %d is outside [0, %lld)",
						 loom_node_label(p->g, v, lb, sizeof(lb)),
						 bad >= 0 ? ((int32_t *)a->src[1])[bad] : -1, bad,
						 (long long)x->shape.dims[1]);
		return LOOM_OK;
	}
	case LOOM_OP_SOFTMAX_CE_BWD:
		DISPATCH(dt, loom_cpu_softmax_ce_bwd, (int)x->shape.dims[0], (int)x->shape.dims[1],
			 a->src[0], a->src[1], a->src[2], a->out);
		return LOOM_OK;
	case LOOM_OP_GLOBAL_AVGPOOL:
		DISPATCH(dt, loom_cpu_global_avgpool_fwd, numel,
			 x->shape.dims[2] * x->shape.dims[3], a->src[0], a->out);
		return LOOM_OK;
	case LOOM_OP_GLOBAL_AVGPOOL_BWD:
		DISPATCH(dt, loom_cpu_global_avgpool_bwd, loom_shape_numel(&x->shape),
			 n->shape.dims[2] * n->shape.dims[3], a->src[0], a->out);
		return LOOM_OK;
	case LOOM_OP_GRAD_SEED:
		if (dt == LOOM_F64)
			*(double *)a->out = p->scaler.scale;
		else
			*(float *)a->out = p->scaler.scale;
		return LOOM_OK;
	default:
		return loom_program_fail(p, LOOM_ERR_UNSUPPORTED, "cpu: no kernel for %s",
					 loom_node_label(p->g, v, lb, sizeof(lb)));
	}
}

/* A CAST between any two float dtypes, through f32 (f64 directly). */
static void run_cast(loom_dtype from, const void *src, loom_dtype to, void *dst, int64_t n)
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

static loom_status run_node(loom_program *p, loom_value v, int train)
{
	const loom_node *n = &p->g->nodes[v];
	if (n->op == LOOM_OP_INPUT || n->op == LOOM_OP_PARAM || n->op == LOOM_OP_BUFFER ||
	    n->op == LOOM_OP_RESHAPE)
		return LOOM_OK; /* leaves are set by the caller; a reshape is a view */
	args a = { .out = loom_value_ptr(p, v), .ws = p->ws };
	for (int i = 0; i < n->nsrc; i++)
		a.src[i] = loom_value_ptr(p, n->src[i]);
	if (n->op == LOOM_OP_CAST) {
		run_cast(src_node(p, n, 0)->dtype, a.src[0], n->dtype, a.out,
			 loom_shape_numel(&n->shape));
		return LOOM_OK;
	}
	if (!emulated(p, n))
		return run_kernel(p, v, &a, train);
	/* bf16 products on CPUs that multiply bf16 natively (bf16_node.c). */
	if (loom_cpu_bf16_node(p, v, a.src, a.out, p->ws))
		return LOOM_OK;

	/* Half storage: widen the half sources into f32 scratch after the
	 * kernel's own workspace, run in f32, round the result. */
	unsigned char *scratch = p->ws;
	if (n->op == LOOM_OP_CONV2D || n->op == LOOM_OP_CONV2D_BWD_DATA ||
	    n->op == LOOM_OP_CONV2D_BWD_FILTER) {
		loom_conv_shape s;
		conv_shape_of(p, n, &s);
		scratch += align64(loom_cpu_conv2d_workspace(&s, 4));
	}
	for (int i = 0; i < n->nsrc; i++) {
		const loom_node *sn = src_node(p, n, i);
		if (!is_half(sn->dtype))
			continue;
		int64_t cnt = loom_shape_numel(&sn->shape);
		run_cast(sn->dtype, a.src[i], LOOM_F32, scratch, cnt);
		a.src[i] = scratch;
		scratch += align64(4 * cnt);
	}
	void *out = a.out;
	if (is_half(n->dtype))
		a.out = scratch;
	loom_status st = run_kernel(p, v, &a, train);
	if (st != LOOM_OK)
		return st;
	if (is_half(n->dtype))
		run_cast(LOOM_F32, a.out, n->dtype, out, loom_shape_numel(&n->shape));
	/* Batch norm updates its running statistics in place: write half
	 * statistics back from their widened copies. */
	if (n->op == LOOM_OP_BATCHNORM2D && train)
		for (int i = 3; i < 5; i++)
			if (is_half(src_node(p, n, i)->dtype))
				run_cast(LOOM_F32, a.src[i], src_node(p, n, i)->dtype,
					 loom_value_ptr(p, n->src[i]),
					 loom_shape_numel(&src_node(p, n, i)->shape));
	return LOOM_OK;
}

static int all_finite(const loom_program *p, loom_value v)
{
	const loom_node *n = &p->g->nodes[v];
	int64_t cnt = loom_shape_numel(&n->shape);
	const void *d = loom_value_ptr(p, v);
	if (n->dtype == LOOM_I32)
		return 1;
	for (int64_t i = 0; i < cnt; i++)
		if (!isfinite(loom_elem_get(n->dtype, d, i)))
			return 0;
	return 1;
}

static loom_status cpu_run_nodes(loom_program *p, int first, int last, int train)
{
	for (int v = first; v < last; v++) {
		if (loom_made_earlier(p, v))
			continue; /* ran with its maker */
		/* The node, then the values it makes besides its own (on the
		 * CPU each by its own kernel, right after it). */
		for (loom_value w = v; w != LOOM_NONE;
		     w = w == v ? loom_sibling_first(p, v) : loom_sibling_next(p, w)) {
			loom_status st = run_node(p, w, train);
			if (st != LOOM_OK)
				return st;
			if (p->diagnose && p->first_nonfinite == LOOM_NONE && !all_finite(p, w))
				p->first_nonfinite = w;
		}
	}
	return LOOM_OK;
}

static loom_status cpu_optim_step(loom_program *p)
{
	return loom_optim_step_host(p);
}

const loom_backend loom_cpu_backend = {
	/* .name = */ "cpu",
	/* .prepare = */ cpu_prepare,
	/* .release = */ cpu_release,
	/* .run_nodes = */ cpu_run_nodes,
	/* .optim_step = */ cpu_optim_step,
	/* .upload = */ cpu_copy,
	/* .download = */ cpu_copy,
	/* .workspace = */ cpu_workspace,
	/* .fuses_relu_pool = */ 1,
	/* .fuses_siblings = */ 1,
	/* .fuses_linear_relu = */ 1,
};
