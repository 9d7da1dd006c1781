/*
 * engine/program_util.c — the engine's small helpers: a program's errors
 * (its own, a backend's copied in), uploads and downloads that record a
 * failure, values by handle wherever this rank keeps them (whole, or its
 * shards through p->shards), and the plan's product counts (the compile summary, the memory
 * report and the pipeline's cut read them).
 */
#include <stdio.h>
#include <stdlib.h>

#include "engine/program_internal.h"

loom_status loom_program_fail(loom_program *p, loom_status st, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	loom_error_vset(&p->err, st, fmt, ap);
	va_end(ap);
	return st;
}

loom_status loom_program_backend_fail(loom_program *p, loom_status st)
{
	return loom_error_set(&p->err, st, "%s", p->be->error(p->be_ctx));
}

loom_status loom_program_upload(loom_program *p, void *dst, const void *src, size_t bytes)
{
	loom_status st = p->be->upload(p->be_ctx, dst, src, bytes);
	return st != LOOM_OK ? loom_program_backend_fail(p, st) : LOOM_OK;
}

loom_status loom_program_download(loom_program *p, void *dst, const void *src, size_t bytes)
{
	loom_status st = p->be->download(p->be_ctx, dst, src, bytes);
	return st != LOOM_OK ? loom_program_backend_fail(p, st) : LOOM_OK;
}

int loom_value_shard(const loom_program *p, loom_value v, int *k)
{
	const loom_shards *sh = p->shards;
	return sh && sh->shard_of ? sh->shard_of(p, v, k) : -1;
}

loom_status loom_shard_gather(loom_program *p, int s, int k, void *dst)
{
	if (!p->shards || !p->shards->gather)
		return loom_program_fail(p, LOOM_ERR_STATE, "parameter %d: this program keeps no "
					 "shards to gather", s);
	return p->shards->gather(p, s, k, dst);
}

loom_status loom_shard_scatter(loom_program *p, int s, int k, const void *src)
{
	if (!p->shards || !p->shards->scatter)
		return loom_program_fail(p, LOOM_ERR_STATE, "parameter %d: this program keeps no "
					 "shards to scatter into", s);
	return p->shards->scatter(p, s, k, src);
}

loom_status loom_value_read_whole(loom_program *p, loom_value v, void *dst)
{
	int k, s = loom_value_shard(p, v, &k);
	if (s >= 0)
		return loom_shard_gather(p, s, k, dst);
	return loom_program_download(p, dst, loom_value_ptr(p, v), loom_value_bytes(p, v));
}

loom_status loom_value_write_whole(loom_program *p, loom_value v, const void *src)
{
	int k, s = loom_value_shard(p, v, &k);
	if (s >= 0)
		return loom_shard_scatter(p, s, k, src);
	return loom_program_upload(p, loom_value_ptr(p, v), src, loom_value_bytes(p, v));
}

static int master_slot(const loom_program *p, loom_value v)
{
	const loom_shards *sh = p->shards;
	return sh && sh->master_slot ? sh->master_slot(p, v) : -1;
}

loom_status loom_master_read(loom_program *p, loom_value v, float *dst)
{
	int s = master_slot(p, v);
	if (s >= 0)
		return loom_shard_gather(p, s, -1, dst);
	loom_value m = p->plan.g->nodes[v].master;
	return loom_program_download(p, dst, loom_value_ptr(p, m), loom_value_bytes(p, m));
}

loom_status loom_master_write(loom_program *p, loom_value v, const float *src)
{
	int s = master_slot(p, v);
	if (s >= 0)
		return loom_shard_scatter(p, s, -1, src);
	loom_value m = p->plan.g->nodes[v].master;
	return loom_program_upload(p, loom_value_ptr(p, m), src, loom_value_bytes(p, m));
}

/* Multiply-adds x 2 of node v, or 0 for a node that is no product. */
static double node_flops(const loom_graph *g, loom_value v)
{
	const loom_node *n = &g->nodes[v];
	double out = (double)loom_shape_numel(&n->shape);
	const loom_shape *w, *a;
	switch (n->op) {
	case LOOM_OP_CONV2D: /* (x, w[Co, Ci, kh, kw]): each output sums Ci kh kw products */
		w = &g->nodes[n->src[1]].shape;
		return w->ndim == 4 ? 2.0 * out * w->dims[1] * w->dims[2] * w->dims[3] : 0;
	case LOOM_OP_CONV2D_BWD_DATA: /* (dy, w): as many products as the forward */
		w = &g->nodes[n->src[1]].shape;
		return w->ndim == 4 ? 2.0 * (double)loom_shape_numel(&g->nodes[n->src[0]].shape) *
					      w->dims[1] * w->dims[2] * w->dims[3] :
				      0;
	case LOOM_OP_CONV2D_BWD_FILTER: { /* (dy, x) -> dw: each weight sums N Ho Wo products */
		const loom_shape *dy = &g->nodes[n->src[0]].shape;
		return dy->ndim == 4 && dy->dims[1] ? 2.0 * out * (double)loom_shape_numel(dy) / dy->dims[1] : 0;
	}
	case LOOM_OP_LINEAR: /* (x, w[out, in]) */
		w = &g->nodes[n->src[1]].shape;
		return w->ndim == 2 ? 2.0 * out * w->dims[1] : 0;
	case LOOM_OP_MATMUL: /* (a, b): the inner dimension is a's last, or its first if transposed */
		a = &g->nodes[n->src[0]].shape;
		return a->ndim >= 2 ? 2.0 * out * a->dims[n->a.mm.ta ? a->ndim - 2 : a->ndim - 1] : 0;
	default:
		return 0;
	}
}

double loom_node_flops(const loom_graph *g, loom_value v)
{
	return node_flops(g, v);
}

void loom_plan_flops(const loom_plan *pl, double *fwd, double *bwd)
{
	*fwd = *bwd = 0;
	for (int v = 0; v < pl->g->n; v++)
		*(v < pl->n_fwd ? fwd : bwd) += node_flops(pl->g, v);
}
