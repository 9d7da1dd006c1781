/*
 * parallel/ddp.c — data parallelism as a compile pass (a process group of
 * world > 1 in the options): the gradient buckets (sharded ones under
 * ZeRO) and the memory plan that holds them, synchronised batch norm
 * (sync_bn); then, once the arena holds the initial values, the start-up
 * check that every rank compiled the same plan and the broadcast of rank
 * 0's parameters and buffers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/options.h"
#include "comm/comm.h"
#include "parallel/bucket_pass.h"
#include "parallel/parallel.h"
#include "parallel/pipeline.h"
#include "engine/pass.h"
#include "graph/ops/ops.h"

int loom_ddp_world(const loom_compile_opts *o)
{
	if (!o->pg)
		return 1;
	const loom_pg_info *in = loom_pg_get_info(o->pg);
	return in && in->world > 1 ? in->world : 1;
}

static int is_bn(loom_op op)
{
	return op == LOOM_OP_BATCHNORM2D || op == LOOM_OP_BN_BWD_DATA || op == LOOM_OP_BN_BWD_GAMMA;
}

int loom_ddp_test_sync_one_rank;

/* sync_bn: every batch norm, forward and backward, sums its statistics over
 * the ranks (engine/cpu/ops_bn.c, engine/cuda/bn.cu). */
void loom_ddp_mark_sync_bn(loom_graph *g)
{
	for (int v = 0; v < g->n; v++)
		if (is_bn(g->nodes[v].op))
			g->nodes[v].a.bn.sync = 1;
}

/* The CUDA entries sum in the compute stream's order, which a device
 * backend (NCCL) has and a host one does not. */
static loom_status mark_sync_bn(loom_program *p, char *err, size_t errlen)
{
	if (!loom_pass_host_memory(p) && !p->plan.comm->i->allreduce_ordered) {
		snprintf(err, errlen,
			 "sync_bn: the %s backend's collectives (%s) cannot all-reduce in "
			 "stream order, which its synchronised batch norm needs; compile "
			 "without sync_bn or with a group that has NCCL",
			 loom_pass_backend_name(p), p->plan.comm->i->name);
		return LOOM_ERR_UNSUPPORTED;
	}
	loom_ddp_mark_sync_bn(p->plan.g);
	return LOOM_OK;
}

/* The plan's collectives: a pipeline stage's replicas', the host's for
 * host memory, NCCL for a device; a device without it (ranks that share a
 * GPU) or LOOM_DDP_STAGE_HOST=1 (on a host backend too, so that tests/ddp
 * runs the path over real MPI): the host's through host buffers
 * (parallel/ddp_staged.c). NULL: none (the caller says so). */
static loom_status pick_comm(loom_program *p, char *err, size_t errlen)
{
	loom_pg *pg = p->plan.opts.pg;
	int stage = loom_opt_bool(LOOM_OPT_DDP_STAGE_HOST);
	if (p->plan.pipe) {
		p->plan.comm = p->plan.pipe->dp;
		return LOOM_OK;
	}
	if (!stage && loom_pass_host_memory(p)) {
		p->plan.comm = loom_pg_comm(pg, LOOM_COMM_HOST);
		return LOOM_OK;
	}
	if (!stage && (p->plan.comm = loom_pg_comm_if(pg, LOOM_COMM_DEVICE)))
		return LOOM_OK;
	loom_comm *host = loom_pg_comm(pg, LOOM_COMM_HOST);
	return host ? loom_ddp_staged_new(p, host, err, errlen) : LOOM_OK;
}

loom_status loom_ddp_plan(loom_program *p, char *err, size_t errlen)
{
	const loom_compile_opts *o = &p->plan.opts;
	const loom_pg_info *in = loom_pg_get_info(o->pg);
	loom_graph *g = p->plan.g;
	loom_status st;

	p->plan.world = in->world;
	p->plan.rank = in->rank;
	p->plan.zero = o->zero_stage;
	/* Pipeline stages: data parallelism among this stage's replicas, over
	 * this stage's parameters (parallel/pipeline_cut.c). */
	if (p->plan.pipe) {
		p->plan.world = p->plan.pipe->replicas;
		p->plan.rank = p->plan.pipe->replica;
	}
	if ((st = pick_comm(p, err, errlen)) != LOOM_OK)
		return st;
	if (!p->plan.comm) {
		snprintf(err, errlen, "data parallel: no collectives for the %s backend: %s",
			 loom_pass_backend_name(p), loom_pg_error(o->pg));
		return LOOM_ERR_UNSUPPORTED;
	}
	if (o->sync_bn && (st = mark_sync_bn(p, err, errlen)) != LOOM_OK)
		return st;
	double cap_mb = o->bucket_cap_mb > 0 ? o->bucket_cap_mb : 25.0;
	double first_mb = o->first_bucket_mb > 0 ? o->first_bucket_mb : 1.0;
	loom_value *grads = malloc(sizeof(loom_value) * (p->plan.n_params ? p->plan.n_params : 1));
	if (!grads) {
		snprintf(err, errlen, "data parallel: out of memory");
		return LOOM_ERR_NOMEM;
	}
	int ng = 0;
	for (int i = 0; i < p->plan.n_params; i++)
		if (loom_pipeline_owns(&p->plan, i))
			grads[ng++] = p->plan.params[i].grad;
	/* ZeRO: each bucket splits into world equal shards. */
	st = loom_bucket_pass_sharded(g, grads, ng, (size_t)(cap_mb * 1048576.0),
				      (size_t)(first_mb * 1048576.0), p->plan.zero ? p->plan.world : 1,
				      &p->plan.buckets);
	free(grads);
	if (st != LOOM_OK) {
		snprintf(err, errlen, "data parallel: %s", g->err.st ? g->err.msg : "out of memory");
		return st;
	}
	loom_zero_mark_masters(&p->plan);
	/* ZeRO-2: the buckets share the region once reduced (parallel/zero2.c). */
	if (p->plan.zero >= 2 && !p->plan.pipe &&
	    (st = loom_zero2_layout(&p->plan.buckets, g, p->plan.world, p->plan.rank)) != LOOM_OK) {
		snprintf(err, errlen, st == LOOM_ERR_INVALID ?
			 "zero %d: the bucket layout covers a bucket in use (a bug in parallel/zero2.c)" :
			 "zero %d: out of memory laying out the buckets", p->plan.zero);
		return st;
	}
	if ((st = loom_ddp_staged_buffers(p, err, errlen)) != LOOM_OK)
		return st;
	/* Pipeline stages: the values this rank's stage touches only. */
	unsigned char *held = NULL;
	if ((st = loom_pipeline_held(&p->plan, &held)) == LOOM_OK)
		st = loom_memplan_build_held(g, p->plan.buckets.order, &p->plan.buckets, held,
					     &p->plan.mp);
	free(held);
	if (st != LOOM_OK)
		snprintf(err, errlen, "data parallel: memory planning with buckets failed (%s)",
			 loom_status_string(st));
	return st;
}

/* ------------------------------------------------------------ fingerprint */

/* Items: every node in schedule order, then every bucket. */
static uint64_t node_hash(const loom_plan *pl, loom_value v)
{
	const loom_node *n = &pl->g->nodes[v];
	int64_t f[10 + LOOM_MAX_DIMS + LOOM_MAX_SRC];
	int k = 0;
	memset(f, 0, sizeof(f));
	f[k++] = v;
	f[k++] = n->op;
	f[k++] = n->dtype;
	f[k++] = n->nsrc;
	f[k++] = n->flags;
	f[k++] = n->made_by;
	f[k++] = n->op == LOOM_OP_ALLREDUCE ? n->a.ar.bucket : 0;
	f[k++] = is_bn(n->op) ? n->a.bn.sync : 0;
	/* amp.fp8's recipe: ranks that scale differently cast differently */
	f[k++] = n->op == LOOM_OP_FP8_QDQ ? ((int64_t)n->a.fp8.history << 8) + n->a.fp8.margin : 0;
	f[k++] = n->shape.ndim;
	for (int i = 0; i < n->shape.ndim; i++)
		f[k++] = n->shape.dims[i];
	for (int i = 0; i < n->nsrc; i++)
		f[k++] = n->src[i];
	return loom_comm_hash(f, sizeof(f), 0);
}

uint64_t loom_ddp_node_hash(const loom_plan *pl, loom_value v)
{
	return node_hash(pl, v);
}

/* ZeRO-2's bucket places are each rank's own (its shard's), not compared. */
static uint64_t bucket_hash(const loom_buckets *b, int k, int zero)
{
	const loom_bucket *bk = &b->b[k];
	uint64_t h = loom_comm_hash(&bk->dtype, sizeof(bk->dtype), 0);
	h = loom_comm_hash(&bk->bytes, sizeof(bk->bytes), h);
	if (zero < 2)
		h = loom_comm_hash(&bk->base, sizeof(bk->base), h);
	h = loom_comm_hash(&b->grad[bk->first], sizeof(loom_value) * bk->n, h);
	return loom_comm_hash(&b->offset[bk->first], sizeof(size_t) * bk->n, h);
}

static void describe(void *user, size_t i, char *buf, size_t len)
{
	const loom_plan *pl = user;
	char sh[96];
	if (i < (size_t)pl->mp.nschedule) {
		loom_value v = pl->mp.schedule[i];
		const loom_node *n = &pl->g->nodes[v];
		/* A batch norm says whether it is synchronised: the one
		 * difference sync_bn on some ranks only makes. */
		char fp8[64] = "";
		if (n->op == LOOM_OP_FP8_QDQ && n->a.fp8.history)
			snprintf(fp8, sizeof(fp8), " with fp8 delayed scaling (history %d, margin %d)",
				 n->a.fp8.history, n->a.fp8.margin);
		else if (n->op == LOOM_OP_FP8_QDQ)
			snprintf(fp8, sizeof(fp8), " with fp8 current scaling");
		snprintf(buf, len, "node %d %s has %s %s%s%s", (int)v, loom_op_defs[n->op]->name,
			 loom_dtype_name(n->dtype), loom_shape_str(&n->shape, sh, sizeof(sh)),
			 !is_bn(n->op) ? "" : n->a.bn.sync ? " with sync_bn=1" : " with sync_bn=0", fp8);
		return;
	}
	int k = (int)(i - pl->mp.nschedule);
	const loom_bucket *b = &pl->buckets.b[k];
	snprintf(buf, len, "bucket %d has %d %s gradients in %zu bytes", k, b->n,
		 loom_dtype_name(b->dtype), b->bytes);
}

loom_status loom_ddp_check_items(loom_program *p, loom_comm *host, const int64_t *head,
				 size_t head_len, uint64_t *items, size_t n,
				 void (*describe)(void *, size_t, char *, size_t), const char *what)
{
	loom_fingerprint fp = {
		.item_noun = "node",
		.head = head,
		.head_len = head_len,
		.items = items,
		.n_items = n,
		.describe = describe,
		.user = (void *)&p->plan,
	};
	loom_status st = loom_comm_check_fingerprint(host, &fp);
	free(items);
	if (st != LOOM_OK)
		return loom_program_fail(p, st, "%s%s", what, loom_pg_error(p->plan.opts.pg));
	return LOOM_OK;
}

static loom_status check_plans(loom_program *p, loom_comm *host)
{
	const loom_plan *pl = &p->plan;
	size_t n = (size_t)pl->mp.nschedule + (size_t)pl->buckets.n;
	uint64_t *items = malloc(sizeof(uint64_t) * (n ? n : 1));
	if (!items)
		return loom_program_fail(p, LOOM_ERR_NOMEM, "fingerprint: out of memory");
	for (int i = 0; i < pl->mp.nschedule; i++)
		items[i] = node_hash(pl, pl->mp.schedule[i]);
	for (int k = 0; k < pl->buckets.n; k++)
		items[pl->mp.nschedule + k] = bucket_hash(&pl->buckets, k, pl->zero);
	/* The options every rank must share; the world is the group's. */
	int64_t clip;
	memcpy(&clip, &pl->opts.optim.clip_grad, sizeof(clip));
	int64_t head[] = {
		pl->opts.amp.level, pl->opts.amp.half, pl->opts.optim.kind, pl->n_params,
		pl->buckets.n, loom_pass_host_memory(p), pl->opts.no_fusion,
		pl->zero, clip, pl->opts.optim.decay_matrices_only, pl->opts.no_tf32,
	};
	return loom_ddp_check_items(p, host, head, sizeof(head), items, n, describe, "");
}

/* Rank 0's parameters, masters and buffers to every rank (buffers only:
 * rank 0's buffers). ZeRO's sharded masters are loom_zero_start's. */
static int broadcast_this(const loom_plan *pl, loom_value v, int buffers_only)
{
	const loom_node *n = &pl->g->nodes[v];
	if (n->flags & LOOM_NODE_SHARDED)
		return 0;
	return n->op == LOOM_OP_BUFFER || (!buffers_only && n->op == LOOM_OP_PARAM);
}

static loom_status broadcast_values(loom_program *p, int buffers_only)
{
	const loom_plan *pl = &p->plan;
	int n = 0;
	for (int v = 0; v < pl->g->n; v++)
		n += broadcast_this(pl, v, buffers_only);
	void **bufs = malloc(sizeof(void *) * (n ? n : 1));
	size_t *bytes = malloc(sizeof(size_t) * (n ? n : 1));
	if (!bufs || !bytes) {
		free(bufs);
		free(bytes);
		return loom_program_fail(p, LOOM_ERR_NOMEM, "broadcast: out of memory");
	}
	int k = 0;
	for (int v = 0; v < pl->g->n; v++)
		if (broadcast_this(pl, v, buffers_only)) {
			bufs[k] = loom_value_ptr(p, v);
			bytes[k++] = loom_value_bytes(p, v);
		}
	loom_status st = loom_comm_broadcast_many(pl->comm, bufs, bytes, (size_t)k, 0);
	free(bufs);
	free(bytes);
	if (st != LOOM_OK)
		return loom_program_fail(p, st, "broadcast of rank 0's %s: %s",
					 buffers_only ? "buffers" : "parameters",
					 loom_pg_error(pl->opts.pg));
	return LOOM_OK;
}

loom_status loom_ddp_start(loom_program *p)
{
	loom_comm *host = loom_pg_comm(p->plan.opts.pg, LOOM_COMM_HOST);
	if (!host)
		return loom_program_fail(p, LOOM_ERR_UNSUPPORTED, "data parallel: %s",
					 loom_pg_error(p->plan.opts.pg));
	/* The initial values went up asynchronously on the compute stream
	 * (init_values); the broadcast runs on the collective's own stream.
	 * Every rank waits for its upload first, so that the root does not
	 * send before its copy lands and a receiver's late upload does not
	 * overwrite what it received. */
	loom_status st = loom_pass_sync(p);
	if (st == LOOM_OK)
		st = check_plans(p, host);
	if (st == LOOM_OK)
		st = broadcast_values(p, 0);
	if (st == LOOM_OK)
		st = loom_zero_start(p);
	/* Device memory: the broadcast is queued on the device's stream. */
	if (st == LOOM_OK)
		st = loom_exec_synchronize(p);
	return st;
}

loom_status loom_ddp_broadcast_buffers(loom_program *p)
{
	return broadcast_values(p, 1);
}
