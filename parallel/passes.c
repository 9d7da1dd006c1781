/*
 * parallel/passes.c — the strategies' compile passes (parallel/passes.h):
 * each says when a compile wants it, what it does to the plan, and the
 * start-up it needs once the arena holds the initial values.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/options.h"
#include "parallel/parallel.h"
#include "parallel/passes.h"
#include "parallel/pipeline.h"
#include "parallel/shards.h"
#include "base/elem.h"

static int staged(const loom_program *p)
{
	return p->plan.opts.pipeline_stages > 1;
}

/* ------------------------------------------------------------ pipeline cut */

/* The world is stages x replicas; every node's stage, each leaf's owner,
 * the sub-communicators; this rank's values (c->held). */
static loom_status pipeline_cut_run(loom_program *p, loom_pass_ctx *c)
{
	const loom_compile_opts *o = &p->plan.opts;
	char msg[256];
	loom_status st;
	if (o->optim.clip_grad > 0)
		return loom_program_fail(p, LOOM_ERR_UNSUPPORTED,
					 "optimizer: clip_grad is not supported with pipeline stages "
					 "yet (each stage holds its own gradients; the norm needs their sum)");
	if ((st = loom_pipeline_check(o, p->plan.world, msg, sizeof(msg))) != LOOM_OK)
		return loom_program_fail(p, st, "%s", msg);
	p->plan.world /= o->pipeline_stages;
	if ((st = loom_pipeline_assign(p, msg, sizeof(msg))) != LOOM_OK)
		return loom_program_fail(p, st, "%s", msg);
	p->plan.pipe->rebalanced = c->rebalanced;
	if ((st = loom_pipeline_held(&p->plan, &c->held)) != LOOM_OK)
		return loom_program_fail(p, st, "memory planning: out of memory");
	return LOOM_OK;
}

/* Over the memory limit on a time-balanced cut: the memory-balanced cut. */
static int pipeline_retry(const loom_program *p, loom_compile_opts *o)
{
	if (!loom_pipeline_may_rebalance(&p->plan))
		return 0;
	o->pipeline_balance = LOOM_BALANCE_MEMORY;
	return 1;
}

static void pipeline_release(loom_program *p)
{
	loom_pipeline_free(p->plan.pipe);
	p->plan.pipe = NULL;
	p->transport = NULL;
	p->shards = NULL;
}

const loom_pass loom_pass_pipeline_cut = {
	.name = "pipeline cut",
	.wanted = staged,
	.run = pipeline_cut_run,
	.retry = pipeline_retry,
	.release = pipeline_release,
};

/* ------------------------------------------------------------ data parallel */

/* Test and bench hook, LOOM_DDP_WORLD1_BUCKETS=1: a group of one rank
 * (env:// at WORLD_SIZE=1) still gets the gradient buckets and their
 * all-reduces (the identity over one rank), so that one GPU runs NCCL's
 * bucket all-reduces, waited on the device and captured in the step's
 * graph, as several ranks would. Plain data parallelism only. */
static int world1_buckets(const loom_program *p)
{
	return loom_opt_bool(LOOM_OPT_DDP_WORLD1_BUCKETS) && p->plan.world <= 1 &&
	       p->plan.opts.pg && !p->plan.opts.inference && p->plan.opts.zero_stage == 0 && !p->plan.pipe;
}

static int data_parallel_wanted(const loom_program *p)
{
	return p->plan.world > 1 || (p->plan.opts.sync_bn && loom_ddp_test_sync_one_rank) ||
	       world1_buckets(p);
}

/* Gradient buckets and their all-reduces, and the memory plan that lays
 * the buckets out; at world 1, sync_bn's marks only (a test hook), or the
 * buckets too (LOOM_DDP_WORLD1_BUCKETS=1). */
static loom_status data_parallel_run(loom_program *p, loom_pass_ctx *c)
{
	(void)c;
	char msg[256];
	loom_status st;
	if (p->plan.world <= 1 && !world1_buckets(p)) {
		loom_ddp_mark_sync_bn(p->plan.g);
		return LOOM_OK;
	}
	if ((st = loom_ddp_plan(p, msg, sizeof(msg))) != LOOM_OK)
		return loom_program_fail(p, st, "%s", msg);
	return LOOM_OK;
}

/* Every rank's plan against rank 0's, then rank 0's values (a pipeline's
 * replicas: its own start-up). */
static loom_status data_parallel_start(loom_program *p)
{
	loom_status st;
	if (p->plan.world <= 1 || p->plan.pipe)
		return LOOM_OK;
	if ((st = loom_ddp_start(p)) != LOOM_OK || (st = loom_exec_synchronize(p)) != LOOM_OK)
		return st;
	return LOOM_OK;
}

/* Each rank updated its buffers from its own batches: an evaluation reads
 * rank 0's (DDP's broadcast_buffers), the model rank 0 saves. */
static loom_status data_parallel_eval_sync(loom_program *p)
{
	return p->plan.world > 1 ? loom_ddp_broadcast_buffers(p) : LOOM_OK;
}

/* The host-staged communicator, where the plan made one. */
static void data_parallel_release(loom_program *p)
{
	loom_ddp_staged_free(p);
}

const loom_pass loom_pass_data_parallel = {
	.name = "data parallel",
	.wanted = data_parallel_wanted,
	.run = data_parallel_run,
	.start = data_parallel_start,
	.release = data_parallel_release,
	.eval_sync = data_parallel_eval_sync,
};

/* ------------------------------------------------------------ zero3 gathers */

static int zero3_wanted(const loom_program *p)
{
	return p->plan.zero == 3 && p->plan.world > 1 && p->plan.buckets.n > 0 &&
	       p->plan.opts.optim.kind != LOOM_OPTIM_NONE;
}

/* The parameters sharded, a gather per bucket and phase with views its
 * readers read, scheduled ahead of them; the memory plan again, now
 * placing the gathered buckets as activations. */
static loom_status zero3_run(loom_program *p, loom_pass_ctx *c)
{
	char msg[256];
	loom_status st = loom_zero3_gathers(&p->plan, msg, sizeof(msg));
	if (st != LOOM_OK)
		return loom_program_fail(p, st, "%s", msg);
	loom_memplan_free(&p->plan.mp);
	st = loom_memplan_build_held(p->plan.g, p->plan.buckets.order, &p->plan.buckets, c->held,
				     &p->plan.mp);
	return st != LOOM_OK ? loom_program_fail(p, st, "zero 3: memory planning with the gathers "
						 "failed (%s)", loom_status_string(st)) : LOOM_OK;
}

/* loom_read of a parameter: gathered from the shards (collective: every
 * rank reads it); of anything else, as without ZeRO-3. */
static loom_status zero3_read(loom_program *p, loom_value v, double *dst, size_t count)
{
	const loom_node *nd = &p->plan.g->nodes[v];
	int k;
	char sb[96];
	if (loom_zero_shard_of(p, v, &k) < 0 && p->plan.mp.region[v] != LOOM_REGION_PERSIST &&
	    p->plan.mp.region[v] != LOOM_REGION_BUCKET)
		return loom_program_fail(p, LOOM_ERR_STATE, "read: value %d is not kept after a step "
					 "(mark it with loom_mark_output)", (int)v);
	loom_shape us = loom_node_user_shape(nd); /* a padded table's rows: the tail */
	if ((int64_t)count != loom_shape_numel(&us))
		return loom_program_fail(p, LOOM_ERR_SHAPE, "read: %zu elements asked, value %d is %s",
					 count, (int)v, loom_shape_str(&us, sb, sizeof(sb)));
	size_t bytes = loom_value_bytes(p, v);
	void *tmp = malloc(bytes ? bytes : 1);
	if (!tmp)
		return loom_program_fail(p, LOOM_ERR_NOMEM, "read: out of memory");
	loom_status st = loom_zero_shard_of(p, v, &k) >= 0 ?
				 loom_zero_value_read(p, v, tmp) :
				 loom_program_download(p, tmp, loom_value_ptr(p, v), bytes);
	for (size_t i = 0; st == LOOM_OK && i < count; i++)
		dst[i] = loom_elem_get(nd->dtype, tmp, loom_node_stored_index(nd, i));
	free(tmp);
	return st;
}

static void zero3_note(const loom_program *p, char *buf, size_t len)
{
	snprintf(buf, len, " (ZeRO-3: %d gathers, prefetch %d, at most %.2f MiB gathered at once)",
		 p->plan.n_gathers, p->plan.opts.zero_prefetch < 0 ? 0 : p->plan.opts.zero_prefetch ?
		 p->plan.opts.zero_prefetch : 1, p->plan.gathered_peak / 1048576.0);
}

const loom_pass loom_pass_zero3_gathers = {
	.name = "zero3 gathers",
	.wanted = zero3_wanted,
	.run = zero3_run,
	.read = zero3_read,
	.note = zero3_note,
};

/* ------------------------------------------------------------ zero */

static int zero_wanted(const loom_program *p)
{
	return p->plan.zero != 0;
}

static loom_status zero_run(loom_program *p, loom_pass_ctx *c)
{
	(void)c;
	char msg[256];
	loom_status st = loom_zero_plan(&p->plan, loom_pass_shard_caps(p), loom_pass_backend_name(p),
					msg, sizeof(msg));
	if (st != LOOM_OK)
		return loom_program_fail(p, st, "%s", msg);
	p->shards = &loom_zero_shards; /* the verdict and norm across the shards */
	return LOOM_OK;
}

const loom_pass loom_pass_zero = { .name = "zero", .wanted = zero_wanted, .run = zero_run };

/* ------------------------------------------------------------ pipeline */

/* The step list rewritten into the schedule of micro-batches. */
static loom_status pipeline_run(loom_program *p, loom_pass_ctx *c)
{
	(void)c;
	char msg[256];
	loom_status st = loom_pipeline_plan(p, msg, sizeof(msg));
	return st != LOOM_OK ? loom_program_fail(p, st, "%s", msg) : LOOM_OK;
}

/* The stages' check and each stage's values from its first replica. */
static loom_status pipeline_start(loom_program *p)
{
	p->plan.pipe->act_base = p->arena.act;
	return loom_pipeline_start(p);
}

/* A TRAIN (the whole batch, one update) or an EVAL over the micro-batches. */
static loom_status pipeline_execute(loom_program *p, loom_run_mode mode)
{
	loom_status st = loom_pipeline_run(p, mode);
	/* the activation region as compiled, for whatever reads it next */
	p->arena.act = p->plan.pipe->act_base;
	return st;
}

static void pipeline_note(const loom_program *p, char *buf, size_t len)
{
	const loom_pipe *pp = p->plan.pipe;
	snprintf(buf, len, " (stage %d, %d activation slots of %.2f MiB)", pp->stage, pp->slots,
		 pp->slot_bytes / 1048576.0);
}

const loom_pass loom_pass_pipeline = {
	.name = "pipeline",
	.wanted = staged,
	.run = pipeline_run,
	.start = pipeline_start,
	.execute = pipeline_execute,
	.set_input = loom_pipeline_set_input,
	.read = loom_pipeline_read,
	.note = pipeline_note,
};

/* ------------------------------------------------------------ pipeline limit */

/* Every stage's planned peak against the limit, on every rank, once the
 * backend knows its workspace; the accumulation sums of several
 * micro-batches (allocated at the first step) count in this rank's peak. */
static loom_status pipeline_limit_run(loom_program *p, loom_pass_ctx *c)
{
	(void)c;
	char msg[400];
	p->peak_extra = p->plan.pipe->micro > 1 ? p->plan.accum_bytes : 0;
	loom_status st = loom_pipeline_limit(p, msg, sizeof(msg));
	if (st != LOOM_OK) {
		loom_program_fail(p, st, "%s", msg);
		return loom_pass_backend_failed(p, st);
	}
	return LOOM_OK;
}

const loom_pass loom_pass_pipeline_limit = {
	.name = "pipeline limit",
	.wanted = staged,
	.run = pipeline_limit_run,
};
