/*
 * engine/cpu/ops_bn.c — the CPU entries of batch norm (forward in training
 * and eval mode, with the relu graph/fuse.c may fold into it; the data and
 * gamma gradients, each optionally synchronised over the ranks) and of the
 * per-channel sum that makes beta's and a conv bias's gradient.
 */
#include <math.h>

#include "comm/comm.h"
#include "engine/cpu/blocked.h"
#include "engine/cpu/ops.h"
#include "graph/ops/ops.h"

/* x [N, C, H, W] as batch norm's kernels take it. */
static void nchw(const loom_plan *plan, const loom_node *n, int *nb, int *c, int64_t *hw)
{
	const loom_node *x = &plan->g->nodes[n->src[0]];
	*nb = (int)x->shape.dims[0];
	*c = (int)x->shape.dims[1];
	*hw = x->shape.dims[2] * x->shape.dims[3];
}

/* Whether node n's activations are nChw8c (graph/formats.c): f32 kernels
 * (blocked.c); never synchronised, never f64 (ops_format.c). */
static int blocked(const loom_plan *plan, const loom_node *n)
{
	return plan->g->nodes[n->src[0]].format == LOOM_FORMAT_NCHW8C;
}

/*
 * Synchronised batch norm (n->a.bn.sync) keeps its per-channel sums in the
 * node's workspace, in double: [count | sum x | sum x^2 | sum dy | sum dy x],
 * c values each after the count. The first `reduce` of them are summed over
 * the ranks (one blocking all-reduce), then the sums of x become the global
 * mean and biased variance in place.
 */
typedef struct bn_sums {
	double *count, *mean, *var, *sdy, *sdyx;
} bn_sums;

size_t loom_cpu_bn_workspace(const loom_plan *plan, loom_value v, size_t elem)
{
	const loom_node *n = &plan->g->nodes[v];
	(void)elem;
	if (!n->a.bn.sync)
		return 0;
	return sizeof(double) * (1 + 4 * (size_t)plan->g->nodes[n->src[0]].shape.dims[1]);
}

static loom_status bn_sync_sums(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				const loom_cpu_io *io, const void *dy, size_t reduce, bn_sums *s)
{
	const loom_node *n = &plan->g->nodes[v];
	int nb, c;
	int64_t hw;
	nchw(plan, n, &nb, &c, &hw);
	double *w = io->ws;
	*s = (bn_sums){ w, w + 1, w + 1 + c, w + 1 + 2 * c, w + 1 + 3 * c };
	*s->count = (double)nb * hw;
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(n), loom_cpu_bn_local_sums, nb, c, hw, io->src[0],
			  dy, s->mean, s->var, s->sdy, s->sdyx);
	/* No group: world 1 under engine/ddp.c's test hook, the sums are global. */
	loom_status st = plan->comm ? loom_comm_allreduce(plan->comm, w, 1 + reduce * (size_t)c,
							  LOOM_F64) :
				      LOOM_OK;
	if (st != LOOM_OK)
		return loom_errnf(ctx->err, LOOM_ERR_MAX, st,
				  "%s node %d: all-reduce of its statistics: %s",
				  loom_op_defs[n->op]->name, (int)v, loom_pg_error(plan->comm->pg));
	for (int ch = 0; ch < c; ch++) {
		double mean = s->mean[ch] / *s->count;
		/* sum x^2 came from centred sums: the difference keeps the
		 * variance unless the mean is ~1e8 standard deviations away. */
		double var = s->var[ch] / *s->count - mean * mean;
		s->mean[ch] = mean;
		s->var[ch] = var > 0 ? var : 0;
	}
	return LOOM_OK;
}

/*
 * Batch norm with a side buffer (side.c): the forward keeps the batch mean
 * and variance there for the backward, f64 from loom's loops, f32 from
 * oneDNN's primitive (which leaves the running statistics to us). 0 where
 * node v has none or oneDNN failed (loom's loops then run, the buffer
 * marked unwritten).
 */
static int bn_fwd_side(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
		       const loom_cpu_io *io)
{
	const loom_node *n = &plan->g->nodes[v];
	loom_cpu_node_side *e = loom_cpu_side_of(ctx, v);
	int nb, c;
	int64_t hw;
	if (!e || e->owner != v)
		return 0;
	nchw(plan, n, &nb, &c, &hw);
	e->run = 0;
	if (e->kind == LOOM_CPU_SIDE_BN_SAVED) {
		double *mean = loom_cpu_side_ptr(ctx, e);
		loom_cpu_bn8_fwd_train_save(nb, c, hw, io->src[0], io->src[1], io->src[2],
					    io->src[3], io->src[4], n->a.bn.momentum, n->a.bn.eps,
					    io->out, mean, mean + c);
		e->run = ctx->run;
		return 1;
	}
	float *mean = loom_cpu_side_ptr(ctx, e), *var = mean + c;
	float *rm = io->src[3], *rv = io->src[4];
	if (loom_cpu_dnnl_bn_fwd(e->bn, io->src[0], io->src[1], io->src[2], io->out, mean, var))
		return 0;
	const double m = (double)nb * hw, unbias = m > 1 ? m / (m - 1) : 1, mo = n->a.bn.momentum;
	for (int ch = 0; ch < c; ch++) {
		rm[ch] = (float)((1 - mo) * rm[ch] + mo * mean[ch]);
		rv[ch] = (float)((1 - mo) * rv[ch] + mo * var[ch] * unbias);
	}
	e->run = ctx->run;
	return 1;
}

/* The backward on the statistics node v's forward kept in this run; 0
 * where there are none (loom's loops then make them again). dx may be
 * NULL (dgamma alone: loom's loops only). */
static int bn_bwd_side(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v, const void *x,
		       const void *gamma, const void *dy, void *dx, void *dg, void *db)
{
	const loom_node *n = &plan->g->nodes[v];
	loom_cpu_node_side *e = loom_cpu_side_of(ctx, v);
	int nb, c;
	int64_t hw;
	if (!e || e->owner == v || ctx->side[e->owner].run != ctx->run)
		return 0;
	nchw(plan, n, &nb, &c, &hw);
	if (e->kind == LOOM_CPU_SIDE_BN_SAVED) {
		const double *mean = loom_cpu_side_ptr(ctx, e);
		loom_cpu_bn8_bwd_saved(nb, c, hw, x, gamma, dy, n->a.bn.eps, mean, mean + c, dx, dg,
				       db);
		return 1;
	}
	if (!dx)
		return 0;
	float *mean = loom_cpu_side_ptr(ctx, e), *var = mean + c;
	/* dgamma and dbeta no sibling takes: into the buffer's second half */
	return !loom_cpu_dnnl_bn_bwd(ctx->side[e->owner].bn, x, gamma, dy, mean, var, dx,
				     dg ? dg : var + c, db ? db : var + 2 * c);
}

loom_status loom_cpu_op_batchnorm2d(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				    const loom_cpu_io *io)
{
	const loom_node *n = &plan->g->nodes[v];
	loom_dtype dt = loom_cpu_kernel_dtype(n);
	int nb, c;
	int64_t hw;
	nchw(plan, n, &nb, &c, &hw);
	if (blocked(plan, n) && ctx->train && bn_fwd_side(ctx, plan, v, io))
		; /* oneDNN's, or loom's keeping its statistics (side.c) */
	else if (blocked(plan, n) && ctx->train)
		loom_cpu_bn8_fwd_train(nb, c, hw, io->src[0], io->src[1], io->src[2], io->src[3],
				       io->src[4], n->a.bn.momentum, n->a.bn.eps, io->out);
	else if (blocked(plan, n))
		loom_cpu_bn8_fwd_eval(nb, c, hw, io->src[0], io->src[1], io->src[2], io->src[3],
				      io->src[4], n->a.bn.eps, io->out);
	else if (ctx->train && n->a.bn.sync) {
		bn_sums s;
		loom_status st = bn_sync_sums(ctx, plan, v, io, NULL, 2, &s);
		if (st != LOOM_OK)
			return st;
		LOOM_CPU_DISPATCH(dt, loom_cpu_bn_fwd_apply, nb, c, hw, io->src[0], io->src[1],
				  io->src[2], io->src[3], io->src[4], n->a.bn.momentum, n->a.bn.eps,
				  s.mean, s.var, *s.count, io->out);
	} else if (ctx->train) {
		LOOM_CPU_DISPATCH(dt, loom_cpu_bn_fwd_train, nb, c, hw, io->src[0], io->src[1],
				  io->src[2], io->src[3], io->src[4], n->a.bn.momentum, n->a.bn.eps,
				  io->out);
	} else {
		LOOM_CPU_DISPATCH(dt, loom_cpu_bn_fwd_eval, nb, c, hw, io->src[0], io->src[1],
				  io->src[2], io->src[3], io->src[4], n->a.bn.eps, io->out);
	}
	if (n->a.bn.relu) /* fused (graph/fuse.c), before any rounding to half */
		LOOM_CPU_DISPATCH(dt, loom_cpu_relu_fwd, loom_shape_numel(&n->shape), io->out,
				  io->out);
	return LOOM_OK;
}

/*
 * dx's siblings. graph/fuse.c marks dgamma = bn_bwd_gamma(x, dy) and dbeta =
 * channel_sum(dy) as made by dx's node; backend.c runs them right after it.
 * Without sync, dx's kernel writes both from the per-channel sums it makes
 * anyway (loom_cpu_bn_bwd), and their own entries then have nothing to do:
 * two passes over x and dy and one over dy fewer per batch norm, same bits.
 * Only where no half emulation comes between (backend.c widens half values
 * into scratch): x, dy, dx and the siblings all in the kernel's dtype.
 */
static int bn_fuses_sibling(const loom_plan *plan, loom_value v, loom_value w)
{
	const loom_node *n = &plan->g->nodes[v], *s = &plan->g->nodes[w];
	loom_dtype dt = n->dtype;
	if (n->op != LOOM_OP_BN_BWD_DATA || n->a.bn.sync || (dt != LOOM_F32 && dt != LOOM_F64) ||
	    s->made_by != v || s->dtype != dt)
		return 0;
	for (int i = 0; i < n->nsrc; i++)
		if (plan->g->nodes[n->src[i]].dtype != dt)
			return 0;
	if (s->op == LOOM_OP_BN_BWD_GAMMA)
		return s->src[0] == n->src[0] && s->src[1] == n->src[2] &&
		       s->a.bn.eps == n->a.bn.eps && !s->a.bn.sync;
	return s->op == LOOM_OP_CHANNEL_SUM && s->src[0] == n->src[2];
}

/* Made by its batch norm dx node's kernel already? Only if the dx node
 * runs it as a sibling (the memory plan chains it there when the dx node
 * comes first in the schedule). */
static int bn_made_with_dx(const loom_plan *plan, loom_value w)
{
	loom_value u = plan->g->nodes[w].made_by;
	if (u == LOOM_NONE || !bn_fuses_sibling(plan, u, w))
		return 0;
	for (loom_value s = loom_sibling_first(plan, u); s != LOOM_NONE;
	     s = loom_sibling_next(plan, s))
		if (s == w)
			return 1;
	return 0;
}

/* dx, with the dgamma and dbeta of v's siblings that it makes. */
static void bn_bwd_fused(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			 const loom_cpu_io *io)
{
	const loom_node *n = &plan->g->nodes[v];
	void *dg = NULL, *db = NULL;
	int nb, c;
	int64_t hw;
	nchw(plan, n, &nb, &c, &hw);
	for (loom_value w = loom_sibling_first(plan, v); w != LOOM_NONE;
	     w = loom_sibling_next(plan, w)) {
		if (!bn_fuses_sibling(plan, v, w))
			continue;
		if (plan->g->nodes[w].op == LOOM_OP_BN_BWD_GAMMA)
			dg = loom_arena_ptr(ctx->arena, plan, w);
		else
			db = loom_arena_ptr(ctx->arena, plan, w);
	}
	if (blocked(plan, n) &&
	    bn_bwd_side(ctx, plan, v, io->src[0], io->src[1], io->src[2], io->out, dg, db))
		return;
	if (blocked(plan, n))
		loom_cpu_bn8_bwd(nb, c, hw, io->src[0], io->src[1], io->src[2], n->a.bn.eps, io->out,
				 dg, db);
	else
		LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(n), loom_cpu_bn_bwd, nb, c, hw, io->src[0],
				  io->src[1], io->src[2], n->a.bn.eps, io->out, dg, db);
}

/* Both backward entries: dx from (x, gamma, dy), or dgamma from (x, dy). With
 * sync, dx needs the global sums of dy and dy xhat too, dgamma only the
 * global statistics (its own sum stays this rank's: the gradient buckets sum
 * it over the ranks, as every parameter's). */
static loom_status bn_bwd(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			  const loom_cpu_io *io, int want_dx)
{
	const loom_node *n = &plan->g->nodes[v];
	loom_dtype dt = loom_cpu_kernel_dtype(n);
	const void *x = io->src[0], *gamma = want_dx ? io->src[1] : NULL;
	const void *dy = io->src[want_dx ? 2 : 1];
	int nb, c;
	int64_t hw;
	nchw(plan, n, &nb, &c, &hw);
	if (!n->a.bn.sync) {
		if (want_dx)
			bn_bwd_fused(ctx, plan, v, io);
		else if (!bn_made_with_dx(plan, v) && blocked(plan, n) &&
			 bn_bwd_side(ctx, plan, v, x, NULL, dy, NULL, io->out, NULL))
			;
		else if (!bn_made_with_dx(plan, v) && blocked(plan, n))
			loom_cpu_bn8_bwd(nb, c, hw, x, NULL, dy, n->a.bn.eps, NULL, io->out, NULL);
		else if (!bn_made_with_dx(plan, v))
			LOOM_CPU_DISPATCH(dt, loom_cpu_bn_bwd_gamma, nb, c, hw, x, dy, n->a.bn.eps,
					  io->out);
		return LOOM_OK;
	}
	bn_sums s;
	loom_status st = bn_sync_sums(ctx, plan, v, io, dy, want_dx ? 4 : 2, &s);
	if (st != LOOM_OK)
		return st;
	/* sum dy (x - mean) from sum dy x, about the global mean. */
	for (int ch = 0; ch < c; ch++)
		s.sdyx[ch] -= s.mean[ch] * s.sdy[ch];
	if (want_dx) {
		LOOM_CPU_DISPATCH(dt, loom_cpu_bn_bwd_data_apply, nb, c, hw, x, gamma, dy,
				  n->a.bn.eps, s.mean, s.var, s.sdy, s.sdyx, *s.count, io->out);
		return LOOM_OK;
	}
	for (int ch = 0; ch < c; ch++) {
		double dg = s.sdyx[ch] / sqrt(s.var[ch] + n->a.bn.eps);
		if (dt == LOOM_F64)
			((double *)io->out)[ch] = dg;
		else
			((float *)io->out)[ch] = (float)dg;
	}
	return LOOM_OK;
}

loom_status loom_cpu_op_bn_bwd_data(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				    const loom_cpu_io *io)
{
	return bn_bwd(ctx, plan, v, io, 1);
}

loom_status loom_cpu_op_bn_bwd_gamma(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				     const loom_cpu_io *io)
{
	return bn_bwd(ctx, plan, v, io, 0);
}

loom_status loom_cpu_op_channel_sum(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				    const loom_cpu_io *io)
{
	const loom_node *n = &plan->g->nodes[v];
	const loom_node *x = &plan->g->nodes[n->src[0]];
	int64_t hw = 1;
	(void)ctx;
	if (bn_made_with_dx(plan, v))
		return LOOM_OK;
	for (int i = 2; i < x->shape.ndim; i++)
		hw *= x->shape.dims[i];
	if (blocked(plan, n)) {
		loom_cpu_channel_sum8((int)x->shape.dims[0], (int)x->shape.dims[1], hw, io->src[0],
				      io->out);
		return LOOM_OK;
	}
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(n), loom_cpu_channel_sum, (int)x->shape.dims[0],
			  (int)x->shape.dims[1], hw, io->src[0], io->out);
	return LOOM_OK;
}
