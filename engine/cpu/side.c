/*
 * engine/cpu/side.c — side buffers: what a forward node leaves for its
 * backward beyond its value (oneDNN max pooling's workspace, the argmax of
 * each window; batch norm's batch mean and variance), so that the backward
 * does not make it again from x. Planned once with the plan's kernels:
 * each forward node that gets one owns a fixed place after the scratch in
 * the plan's workspace region (its size known before step 1, in
 * plan->ws_bytes), each backward node names the forward it reads. A
 * backward whose forward did not write the buffer in the same run (an eval
 * forward, a library failure) runs loom's loops, which need none.
 * Pipeline stages keep several micro-batches in flight between a forward
 * and its backward: they get no side buffers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/options.h"
#include "engine/cpu/ops.h"

static size_t align64(size_t x)
{
	return (x + 63) & ~(size_t)63;
}

/* LOOM_CPU_DNNL_POOL: 0 loom's loops, else oneDNN's pooling (default). */
static int pool_on(void)
{
	return loom_opt_bool(LOOM_OPT_CPU_DNNL_POOL);
}

/* LOOM_CPU_DNNL_BN: 0 loom's loops as they were (the backward makes the
 * statistics again), 1 oneDNN's primitives, saved loom's loops with the
 * statistics kept (the default). */
static loom_cpu_side_kind bn_mode(void)
{
	const char *e = loom_opt_env(LOOM_OPT_CPU_DNNL_BN);
	if (e && !strcmp(e, "0"))
		return LOOM_CPU_SIDE_NONE;
	if (e && !strcmp(e, "1"))
		return LOOM_CPU_SIDE_BN_DNNL;
	return LOOM_CPU_SIDE_BN_SAVED;
}

void loom_cpu_side_release(loom_cpu_ctx *c)
{
	for (int v = 0; c->side && v < c->n_side; v++) {
		loom_cpu_dnnl_pool_free(c->side[v].pool);
		loom_cpu_dnnl_bn_free(c->side[v].bn);
	}
	free(c->side);
	c->side = NULL;
	c->n_side = 0;
}

static int blocked_f32(const loom_plan *plan, loom_value x)
{
	const loom_node *n = &plan->g->nodes[x];
	return n->format == LOOM_FORMAT_NCHW8C && n->dtype != LOOM_F64;
}

/* The forward's buffer and primitives for node u; 0 bytes if none. */
static void plan_forward(const loom_plan *plan, loom_value u, int pool, loom_cpu_side_kind bn,
			 loom_cpu_node_side *e)
{
	const loom_node *n = &plan->g->nodes[u];
	if (n->op == LOOM_OP_MAXPOOL2D && pool && n->format == LOOM_FORMAT_NCHW8C &&
	    n->dtype != LOOM_F64) {
		loom_pool_shape ps;
		loom_pool_shape_of(plan->g, u, &ps);
		e->pool = loom_cpu_dnnl_pool_new(&ps);
		if (e->pool) {
			e->kind = LOOM_CPU_SIDE_POOL_DNNL;
			e->bytes = loom_cpu_dnnl_pool_side(e->pool);
		}
	} else if (n->op == LOOM_OP_BATCHNORM2D && bn && !n->a.bn.sync && !plan->opts.sync_bn &&
		   blocked_f32(plan, n->src[0])) {
		const loom_shape *xs = &plan->g->nodes[n->src[0]].shape;
		if (bn == LOOM_CPU_SIDE_BN_DNNL) {
			e->bn = loom_cpu_dnnl_bn_new((int)xs->dims[0], (int)xs->dims[1],
						     (int)xs->dims[2], (int)xs->dims[3], n->a.bn.eps);
			if (!e->bn)
				return;
		}
		e->kind = bn;
		/* f64 mean and variance, or f32 mean, variance and the
		 * dgamma and dbeta oneDNN writes where no sibling takes them */
		e->bytes = 2 * sizeof(double) * (size_t)xs->dims[1];
	}
}

/* The forward node whose buffer backward node v reads; LOOM_NONE if none. */
static loom_value forward_of(const loom_plan *plan, const loom_cpu_node_side *side, loom_value v)
{
	const loom_node *n = &plan->g->nodes[v];
	loom_cpu_side_kind want;
	if (n->op == LOOM_OP_MAXPOOL2D_BWD && n->format == LOOM_FORMAT_NCHW8C)
		want = LOOM_CPU_SIDE_POOL_DNNL;
	else if ((n->op == LOOM_OP_BN_BWD_DATA || n->op == LOOM_OP_BN_BWD_GAMMA) && !n->a.bn.sync)
		want = LOOM_CPU_SIDE_BN_DNNL;
	else
		return LOOM_NONE;
	for (loom_value u = 0; u < v; u++) {
		const loom_node *f = &plan->g->nodes[u];
		if (side[u].owner != u || f->src[0] != n->src[0])
			continue;
		if (want == LOOM_CPU_SIDE_POOL_DNNL && side[u].kind == want) {
			loom_pool_shape a, b;
			loom_pool_shape_of(plan->g, u, &a);
			loom_pool_shape_of(plan->g, v, &b);
			if (!memcmp(&a, &b, sizeof(a)))
				return u;
		} else if (want != LOOM_CPU_SIDE_POOL_DNNL && f->op == LOOM_OP_BATCHNORM2D &&
			   (side[u].kind == LOOM_CPU_SIDE_BN_DNNL ||
			    side[u].kind == LOOM_CPU_SIDE_BN_SAVED) &&
			   f->a.bn.eps == n->a.bn.eps) {
			return u;
		}
	}
	return LOOM_NONE;
}

loom_status loom_cpu_side_plan(loom_cpu_ctx *c, const loom_plan *plan, size_t *bytes)
{
	int n = plan->g->n;
	loom_cpu_side_release(c);
	*bytes = 0;
	if (plan->pipe)
		return LOOM_OK;
	c->side = calloc((size_t)(n ? n : 1), sizeof(*c->side));
	if (!c->side)
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_NOMEM,
				  "out of memory for %d nodes' side buffers",
				  n);
	c->n_side = n;
	for (int v = 0; v < n; v++)
		c->side[v].owner = LOOM_NONE;
	int pool = pool_on();
	loom_cpu_side_kind bn = bn_mode();
	for (loom_value u = 0; u < n; u++) {
		loom_cpu_node_side *e = &c->side[u];
		plan_forward(plan, u, pool, bn, e);
		if (!e->kind)
			continue;
		e->owner = u;
		e->off = *bytes;
		*bytes += align64(e->bytes);
	}
	for (loom_value v = 0; v < n; v++) {
		loom_value u = c->side[v].kind ? LOOM_NONE : forward_of(plan, c->side, v);
		if (u == LOOM_NONE)
			continue;
		c->side[v].kind = c->side[u].kind;
		c->side[v].owner = u;
	}
	return LOOM_OK;
}

void loom_cpu_side_note(loom_cpu_ctx *c, loom_value v, char *buf, size_t len)
{
	loom_cpu_node_side *e = loom_cpu_side_of(c, v);
	buf[0] = 0;
	if (!e)
		return;
	const loom_cpu_node_side *o = &c->side[e->owner];
	const char *what = e->kind == LOOM_CPU_SIDE_POOL_DNNL ? "oneDNN max pooling" :
			   e->kind == LOOM_CPU_SIDE_BN_DNNL  ? "oneDNN batch norm" :
							       "batch norm, statistics kept";
	const char *impl = o->pool ? loom_cpu_dnnl_pool_impl(o->pool) :
			   o->bn   ? loom_cpu_dnnl_bn_impl(o->bn) :
				     "loom";
	if (e->owner == v)
		snprintf(buf, len, "%s (%s), side buffer %zu bytes", what, impl, e->bytes);
	else
		snprintf(buf, len, "%s (%s), reads node %d's side buffer", what, impl,
			 (int)e->owner);
}
