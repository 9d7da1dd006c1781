/*
 * parallel/zero3.c — ZeRO stage 3 (DeepSpeed's, PyTorch FSDP's full
 * sharding): on top of stage 2's sharded gradients, optimizer state and
 * masters (parallel/zero2.c, zero.c), a rank keeps only its shard of every
 * parameter. The shard is stage 1's: rank r's part of each bucket, laid in
 * bucket order, in the optimizer's own pieces (the f32 master shard under
 * O0/O1, whose values are the parameters'; under O2 the half copy the
 * optimizer packs into a shard store after the buckets).
 *
 * The graph pass (before the memory plan): every bucket whose parameters a
 * forward node reads gets an ALLGATHER node, each of its parameters a view
 * into it at the parameter's place in the bucket, and the forward readers
 * read the views; the same again for the backward readers. The gathered
 * values are activations, so the memory planner places them and frees them
 * after their last reader, and the peak per rank is known before step 1.
 * Each gather is scheduled `depth` gathers ahead of its first reader
 * (prefetch: loom_compile_opts.zero_prefetch, 1 by default), so the
 * all-gather overlaps the layers before; the steps pass turns the gather
 * node into a collective (this rank's shard copied into its place, then
 * the all-gather on the communication stream) and puts a wait for that
 * collective alone right before its first reader.
 *
 * The gradients are stage 2's (reduce-scatter per bucket, this rank's
 * shard kept); the optimizer updates this rank's pieces and writes the
 * new parameters into the shards, and no gather ends the step: the next
 * step's forward gathers. The same elementwise update on the same sums as
 * plain data parallelism, so the parameters stay bit-identical to it.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "parallel/parallel.h"

static size_t align64(size_t x)
{
	return (x + 63) & ~(size_t)63;
}

/* One gather: bucket k's parameters for the forward (bwd 0) or backward
 * readers; first: its first reader's place in the schedule; at: where the
 * gather is issued. */
typedef struct unit {
	int bucket, bwd, first, at;
} unit;

static int by_first(const void *a, const void *b)
{
	const unit *x = a, *y = b;
	if (x->bwd != y->bwd)
		return x->bwd - y->bwd;
	if (x->first != y->first)
		return x->first < y->first ? -1 : 1;
	return x->bucket - y->bucket;
}

typedef struct gpass {
	loom_plan *pl;
	int n_old, nb;
	int *member_of; /* per node of the old graph: the bucket member it is the parameter of */
	int *bucket_of; /* per bucket member */
	int *pos;       /* per node of the old graph: its place in the old schedule */
	unit *u;
	int nu;
	loom_value *view; /* per member and phase: the view its readers read */
	char err[256];
} gpass;

static void gpass_free(gpass *q)
{
	free(q->member_of);
	free(q->bucket_of);
	free(q->pos);
	free(q->u);
	free(q->view);
}

/* Where node u's work happens in the old schedule (a sibling: its maker's). */
static int place_of(const gpass *q, loom_value u)
{
	loom_value m = q->pl->g->nodes[u].made_by;
	return m != LOOM_NONE && m < q->n_old && q->pos[m] < q->pos[u] ? q->pos[m] : q->pos[u];
}

/* The parameters of the buckets, marked sharded; which member each is. */
static loom_status find_params(gpass *q)
{
	loom_plan *pl = q->pl;
	const loom_buckets *bk = &pl->buckets;
	loom_graph *g = pl->g;
	char lb[96];
	for (int v = 0; v < q->n_old; v++)
		q->member_of[v] = -1;
	for (int k = 0; k < bk->n; k++)
		for (int j = bk->b[k].first; j < bk->b[k].first + bk->b[k].n; j++) {
			int s = loom_zero_slot_of_grad(pl, bk->grad[j]);
			q->bucket_of[j] = k;
			if (s < 0)
				continue;
			loom_value v = pl->params[s].param;
			const loom_node *nd = &g->nodes[v];
			if (pl->params[s].master == LOOM_NONE && nd->dtype != LOOM_F32) {
				snprintf(q->err, sizeof(q->err),
					 "zero 3: parameter %s is %s with no f32 master (O3?); the "
					 "sharded parameters are the optimizer's f32 shards: compile "
					 "with O0, O1 or O2", loom_node_label(g, v, lb, sizeof(lb)),
					 loom_dtype_name(nd->dtype));
				return LOOM_ERR_UNSUPPORTED;
			}
			if (nd->dtype != bk->b[k].dtype) {
				snprintf(q->err, sizeof(q->err),
					 "zero 3: parameter %s is %s, its gradient's bucket %s",
					 loom_node_label(g, v, lb, sizeof(lb)), loom_dtype_name(nd->dtype),
					 loom_dtype_name(bk->b[k].dtype));
				return LOOM_ERR_UNSUPPORTED;
			}
			g->nodes[v].flags |= LOOM_NODE_SHARDED;
			q->member_of[v] = j;
		}
	return LOOM_OK;
}

/* The units: every (bucket, phase) a node reads parameters of, with its
 * first reader; in order of first use per phase, each issued `depth`
 * units ahead (the first ones at the phase's first use). */
static loom_status find_units(gpass *q, int depth)
{
	loom_plan *pl = q->pl;
	const loom_graph *g = pl->g;
	int nb = q->nb;
	int *first = malloc(sizeof(int) * (size_t)(2 * nb + 1));
	if (!first)
		return LOOM_ERR_NOMEM;
	for (int i = 0; i < 2 * nb; i++)
		first[i] = INT_MAX;
	for (loom_value u = 0; u < q->n_old; u++) {
		const loom_node *nd = &g->nodes[u];
		for (int i = 0; i < nd->nsrc; i++) {
			int j = q->member_of[nd->src[i]];
			if (j < 0)
				continue;
			int bwd = u >= pl->n_fwd, at = place_of(q, u);
			if (!bwd && at >= pl->n_fwd) {
				free(first);
				snprintf(q->err, sizeof(q->err),
					 "zero 3: forward node %d runs in the backward's schedule", (int)u);
				return LOOM_ERR_INVALID;
			}
			int *f = &first[2 * q->bucket_of[j] + bwd];
			if (at < *f)
				*f = at;
		}
	}
	q->nu = 0;
	for (int i = 0; i < 2 * nb; i++)
		if (first[i] != INT_MAX)
			q->u[q->nu++] = (unit){ .bucket = i / 2, .bwd = i % 2, .first = first[i] };
	free(first);
	qsort(q->u, (size_t)q->nu, sizeof(unit), by_first);
	for (int i = 0; i < q->nu; i++) {
		int a = i;
		/* depth units back, within the same phase */
		for (int d = 0; d < depth && a > 0 && q->u[a - 1].bwd == q->u[i].bwd; d++)
			a--;
		q->u[i].at = q->u[a].first;
	}
	return LOOM_OK;
}

/* The gather nodes and their views (appended), the readers pointed at the
 * views, the gather table. */
static loom_status add_nodes(gpass *q)
{
	loom_plan *pl = q->pl;
	loom_buckets *bk = &pl->buckets;
	loom_graph *g = pl->g;
	unsigned char *reads = calloc((size_t)(2 * bk->ngrad + 1), 1);
	pl->gathers = calloc((size_t)(q->nu ? q->nu : 1), sizeof(*pl->gathers));
	if (!reads || !pl->gathers) {
		free(reads);
		return LOOM_ERR_NOMEM;
	}
	for (loom_value u = 0; u < q->n_old; u++)
		for (int i = 0; i < g->nodes[u].nsrc; i++) {
			int j = q->member_of[g->nodes[u].src[i]];
			if (j >= 0)
				reads[2 * j + (u >= pl->n_fwd)] = 1;
		}
	for (int i = 0; i < q->nu; i++) {
		const unit *un = &q->u[i];
		const loom_bucket *b = &bk->b[un->bucket];
		loom_shape sh = loom_shape_make(1, &b->count);
		loom_value gv = loom_node_add(g, LOOM_OP_ALLGATHER, b->dtype, sh, 0, NULL);
		if (gv == LOOM_NONE) {
			free(reads);
			return LOOM_ERR_NOMEM;
		}
		g->nodes[gv].flags |= un->bwd ? LOOM_NODE_BACKWARD : 0;
		snprintf(g->nodes[gv].name, LOOM_NAME_MAX, "zero3.bucket%d.%s", un->bucket,
			 un->bwd ? "bwd" : "fwd");
		pl->gathers[i] = (loom_gather){ .v = gv, .bucket = un->bucket };
		for (int j = b->first; j < b->first + b->n; j++) {
			if (!reads[2 * j + un->bwd])
				continue;
			int s = loom_zero_slot_of_grad(pl, bk->grad[j]);
			loom_value pv = pl->params[s].param;
			loom_node pn = g->nodes[pv];
			loom_value vv = loom_node_add(g, LOOM_OP_RESHAPE, pn.dtype, pn.shape, 1, &gv);
			if (vv == LOOM_NONE) {
				free(reads);
				return LOOM_ERR_NOMEM;
			}
			loom_node *vn = &g->nodes[vv];
			vn->view_off = bk->offset[j];
			vn->format = pn.format;
			vn->flags |= un->bwd ? LOOM_NODE_BACKWARD : 0;
			snprintf(vn->name, LOOM_NAME_MAX, "%.50s.%s", pn.name, un->bwd ? "bwd" : "fwd");
			q->view[2 * j + un->bwd] = vv;
		}
	}
	pl->n_gathers = q->nu;
	free(reads);
	for (loom_value u = 0; u < q->n_old; u++) {
		loom_node *nd = &g->nodes[u];
		for (int i = 0; i < nd->nsrc; i++) {
			int j = q->member_of[nd->src[i]];
			if (j >= 0)
				nd->src[i] = q->view[2 * j + (u >= pl->n_fwd)];
		}
	}
	return LOOM_OK;
}

/* The new schedule: each gather (then its views) right before the node at
 * its issue place; the forward's length with its gathers. */
static loom_status reorder(gpass *q)
{
	loom_plan *pl = q->pl;
	loom_buckets *bk = &pl->buckets;
	loom_graph *g = pl->g;
	loom_value *order = malloc(sizeof(loom_value) * (size_t)g->n);
	loom_value *view_first = malloc(sizeof(loom_value) * (size_t)(q->nu + 1));
	if (!order || !view_first) {
		free(order);
		free(view_first);
		return LOOM_ERR_NOMEM;
	}
	/* The nodes appended after gather i up to the next: its views. */
	for (int i = 0; i < q->nu; i++)
		view_first[i] = pl->gathers[i].v;
	view_first[q->nu] = g->n;
	int o = 0, fwd = 0;
	for (int p = 0; p < q->n_old; p++) {
		if (p == pl->n_fwd)
			fwd = o;
		for (int i = 0; i < q->nu; i++) {
			if (q->u[i].at != p)
				continue;
			for (loom_value v = view_first[i]; v < view_first[i + 1]; v++)
				order[o++] = v;
		}
		order[o++] = bk->order[p];
	}
	if (q->n_old == pl->n_fwd)
		fwd = o;
	free(view_first);
	if (o != g->n) {
		free(order);
		snprintf(q->err, sizeof(q->err), "zero 3: the schedule lost %d gathers", g->n - o);
		return LOOM_ERR_INVALID;
	}
	free(bk->order);
	bk->order = order;
	pl->n_fwd_sched = fwd;
	return LOOM_OK;
}

/* Whether bucket k's parameters are half with f32 masters (O2): then its
 * gathers read the half shards the optimizer packs after the buckets; else
 * the f32 master shards, which are the parameters' values. */
static int bucket_half(const loom_plan *pl, int k)
{
	const loom_bucket *b = &pl->buckets.b[k];
	for (int j = b->first; j < b->first + b->n; j++) {
		int s = loom_zero_slot_of_grad(pl, pl->buckets.grad[j]);
		if (s >= 0 && pl->params[s].master != LOOM_NONE)
			return 1;
	}
	return 0;
}

static size_t half_shard(const loom_plan *pl, int k)
{
	const loom_bucket *b = &pl->buckets.b[k];
	return align64((size_t)(b->count / pl->world) * loom_dtype_size(b->dtype));
}

size_t loom_zero3_half_at(const loom_plan *pl, int k)
{
	const loom_buckets *bk = &pl->buckets;
	size_t at = 0;
	/* after the buckets as laid out (parallel/zero2.c) */
	for (int j = 0; j < bk->n; j++)
		if (bk->b[j].base + align64(bk->b[j].bytes) > at)
			at = bk->b[j].base + align64(bk->b[j].bytes);
	at = align64(at);
	for (int j = 0; j < k; j++)
		at += bucket_half(pl, j) ? half_shard(pl, j) : 0;
	return at;
}

/* O2: the half shards' store after the buckets (the bucket region grows
 * by it); the gathers of those buckets read there. */
static void half_store(loom_plan *pl)
{
	loom_buckets *bk = &pl->buckets;
	size_t end = loom_zero3_half_at(pl, bk->n);
	for (int i = 0; i < pl->n_gathers; i++) {
		int k = pl->gathers[i].bucket;
		if (!bucket_half(pl, k))
			continue;
		pl->gathers[i].src_bucket = 1;
		pl->gathers[i].src_off = loom_zero3_half_at(pl, k);
	}
	pl->param_shard_bytes = end - loom_zero3_half_at(pl, 0);
	if (pl->param_shard_bytes)
		bk->bytes = end;
}

loom_status loom_zero3_gathers(loom_plan *pl, char *err, size_t errlen)
{
	gpass q = { .pl = pl, .n_old = pl->g->n, .nb = pl->buckets.n };
	int depth = pl->opts.zero_prefetch < 0 ? 0 : pl->opts.zero_prefetch == 0 ? 1 :
										     pl->opts.zero_prefetch;
	int ng = pl->buckets.ngrad;
	loom_status st = LOOM_ERR_NOMEM;
	q.member_of = malloc(sizeof(int) * (size_t)(q.n_old ? q.n_old : 1));
	q.bucket_of = malloc(sizeof(int) * (size_t)(ng ? ng : 1));
	q.pos = malloc(sizeof(int) * (size_t)(q.n_old ? q.n_old : 1));
	q.u = malloc(sizeof(unit) * (size_t)(2 * q.nb + 1));
	q.view = malloc(sizeof(loom_value) * (size_t)(2 * ng + 1));
	if (!q.member_of || !q.bucket_of || !q.pos || !q.u || !q.view)
		goto out;
	for (int i = 0; i < q.n_old; i++)
		q.pos[pl->buckets.order[i]] = i;
	if ((st = find_params(&q)) != LOOM_OK || (st = find_units(&q, depth)) != LOOM_OK ||
	    (st = add_nodes(&q)) != LOOM_OK || (st = reorder(&q)) != LOOM_OK)
		goto out;
	half_store(pl);
out:
	if (st == LOOM_ERR_NOMEM && !q.err[0])
		snprintf(q.err, sizeof(q.err), "zero 3: out of memory planning the gathers");
	if (st != LOOM_OK)
		snprintf(err, errlen, "%s", q.err);
	gpass_free(&q);
	return st;
}

/* ------------------------------------------------------------ steps */

/* Whether step s (a node) reads a value gathered by gather node gv. */
static int reads_gather(const loom_plan *pl, const loom_step *s, loom_value gv)
{
	for (loom_value w = s->v; w != LOOM_NONE;
	     w = w == s->v ? loom_sibling_first(pl, s->v) : loom_sibling_next(pl, w)) {
		const loom_node *nd = &pl->g->nodes[w];
		for (int i = 0; i < nd->nsrc; i++)
			if (pl->mp.root[nd->src[i]] == gv)
				return 1;
	}
	return 0;
}

loom_status loom_zero3_steps(loom_plan *pl)
{
	int ng = pl->n_gathers, nb = pl->buckets.n;
	loom_step *st = malloc(sizeof(*st) * (size_t)(pl->n_steps + ng + 1));
	int *gather_of = malloc(sizeof(int) * (size_t)(pl->g->n ? pl->g->n : 1));
	unsigned char *waited = calloc((size_t)(ng ? ng : 1), 1);
	if (!st || !gather_of || !waited) {
		free(st);
		free(gather_of);
		free(waited);
		return LOOM_ERR_NOMEM;
	}
	for (int v = 0; v < pl->g->n; v++)
		gather_of[v] = -1;
	for (int i = 0; i < ng; i++)
		gather_of[pl->gathers[i].v] = i;
	int n = 0, fwd_end = -1, grad_end = -1;
	for (int i = 0; i < pl->n_steps; i++) {
		loom_step s = pl->steps[i];
		if (i == pl->n_fwd_steps)
			fwd_end = n;
		if (i == pl->n_grad_steps)
			grad_end = n;
		int gi = s.kind == LOOM_STEP_NODE ? gather_of[s.v] : -1;
		if (gi >= 0) {
			/* the gather node: this rank's shard in, then the all-gather */
			st[n++] = (loom_step){ .kind = LOOM_STEP_COLLECTIVE, .stream = LOOM_STREAM_COMM,
					       .phase = s.phase, .v = s.v, .coll = LOOM_COLL_ALLGATHER,
					       .index = nb + gi };
			continue;
		}
		/* before the first reader of a gather: the wait for it alone */
		if (s.kind == LOOM_STEP_NODE && !s.noop)
			for (int k = 0; k < ng; k++)
				if (!waited[k] && reads_gather(pl, &s, pl->gathers[k].v)) {
					waited[k] = 1;
					st[n++] = (loom_step){ .kind = LOOM_STEP_WAIT,
							       .stream = LOOM_STREAM_COMPUTE,
							       .phase = s.phase, .v = LOOM_NONE,
							       .index = nb + k };
				}
		st[n++] = s;
	}
	free(gather_of);
	int unread = 0;
	for (int k = 0; k < ng; k++)
		unread += !waited[k];
	free(waited);
	if (unread) {
		free(st);
		return LOOM_ERR_INVALID;
	}
	free(pl->steps);
	pl->steps = st;
	pl->n_fwd_steps = fwd_end < 0 ? n : fwd_end;
	pl->n_grad_steps = grad_end < 0 ? n : grad_end;
	pl->n_steps = n;
	return LOOM_OK;
}

void loom_zero3_sources(loom_plan *pl, const size_t *master_at, size_t end)
{
	/* this rank's parameters: the half shards, and the f32 shards of the
	 * buckets without masters */
	size_t f32 = 0;
	for (int k = 0; k < pl->buckets.n; k++)
		if (!bucket_half(pl, k))
			f32 += (k + 1 < pl->buckets.n ? master_at[k + 1] : end) - master_at[k];
	pl->param_shard_bytes = loom_zero3_half_at(pl, pl->buckets.n) - loom_zero3_half_at(pl, 0) + f32;
	pl->master_bytes -= f32;
	for (int i = 0; i < pl->n_gathers; i++)
		if (!pl->gathers[i].src_bucket) /* O2's: the half store, placed already */
			pl->gathers[i].src_off = master_at[pl->gathers[i].bucket];
}

size_t loom_zero3_gathered_peak(const loom_plan *pl)
{
	const loom_memplan *mp = &pl->mp;
	int n = mp->nschedule, ng = pl->n_gathers;
	int *pos = malloc(sizeof(int) * (size_t)(n ? n : 1));
	int *end = calloc((size_t)(ng ? ng : 1), sizeof(int));
	int *gi = malloc(sizeof(int) * (size_t)(n ? n : 1));
	size_t peak = 0;
	if (!pos || !end || !gi)
		goto out;
	for (int i = 0; i < n; i++) {
		pos[mp->schedule[i]] = i;
		gi[i] = -1;
	}
	for (int k = 0; k < ng; k++)
		gi[pl->gathers[k].v] = k;
	/* each gathered bucket lives from its gather to its last reader */
	for (loom_value u = 0; u < n; u++) {
		const loom_node *nd = &pl->g->nodes[u];
		for (int i = 0; i < nd->nsrc; i++) {
			int k = gi[mp->root[nd->src[i]]];
			if (k >= 0 && pos[u] > end[k])
				end[k] = pos[u];
		}
	}
	for (int a = 0; a < ng; a++) {
		size_t live = 0;
		int at = pos[pl->gathers[a].v];
		for (int k = 0; k < ng; k++)
			if (pos[pl->gathers[k].v] <= at && at <= end[k])
				live += align64(loom_plan_value_bytes(pl, pl->gathers[k].v));
		if (live > peak)
			peak = live;
	}
out:
	free(pos);
	free(end);
	free(gi);
	return peak;
}
