/*
 * parallel/shards.c — what the optimizer step needs from ranks that each
 * hold some of the gradients: ZeRO's shards (stages 1-3) and a pipeline's
 * stages. The overflow verdict over all of them and the global gradient
 * norm under ZeRO with clipping (each on the device through one all-reduce
 * where the backend and the transport can, else on the host), why such
 * a step is not captured as one graph, and ZeRO's sharded values (read,
 * written and reported by the engine through these). The executor reaches
 * these through program->shards (engine/pass.h), which the
 * passes set (passes.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/options.h"
#include "comm/comm.h"
#include "parallel/parallel.h" /* ZeRO's shards */
#include "parallel/shards.h"

static loom_status comm_fail(loom_program *p, loom_status st)
{
	return loom_program_fail(p, st, "%s", loom_pg_error(p->plan.opts.pg));
}

/* One value on the device (a shard's flag or sum of squares) summed over
 * the ranks in the compute stream's order: no host wait, so a captured
 * step holds it. */
static loom_status sum_on_device(loom_program *p, void *value, loom_dtype dt)
{
	loom_status st = loom_comm_allreduce_ordered(p->plan.comm, value, 1, dt,
						     loom_pass_stream(p, LOOM_STREAM_COMPUTE));
	return st != LOOM_OK ? comm_fail(p, st) : LOOM_OK;
}

/* ZeRO: every rank checked its shard; a step is skipped everywhere when
 * any shard overflowed. */
static loom_status shard_verdict(loom_program *p, const loom_step *s, int *finite)
{
	const loom_plan *pl = &p->plan;
	int mine = 1;
	loom_status st;
	/* On the device: the flag summed over the ranks there (an NCCL
	 * all-reduce of one value). */
	if (loom_exec_device_wait(p) && (loom_pass_shard_caps(p) & LOOM_SHARD_FINITE_DEVICE) &&
	    pl->zero && !pl->pipe) {
		void *flag = NULL;
		if ((st = loom_pass_grads_finite_device(p, s->first, s->last, &flag)) != LOOM_OK ||
		    (st = sum_on_device(p, flag, LOOM_I32)) != LOOM_OK)
			return st;
		*finite = LOOM_FINITE_ON_DEVICE;
		return LOOM_OK;
	}
	if ((st = loom_pass_grads_finite(p, s->first, s->last, &mine)) != LOOM_OK)
		return st;
	loom_comm *host = loom_pg_comm(pl->opts.pg, LOOM_COMM_HOST);
	float bad = mine ? 0.0f : 1.0f;
	if (!host || (st = loom_comm_allreduce(host, &bad, 1, LOOM_F32)) != LOOM_OK)
		return comm_fail(p, host ? st : LOOM_ERR_UNSUPPORTED);
	*finite = bad == 0.0f;
	return LOOM_OK;
}

/* Whether ZeRO's gradient norm is summed over the ranks on the device: a
 * backend that leaves a shard's sum of squares there, a communicator that
 * reduces in a stream's order (NCCL), no pipeline; LOOM_ZERO_DEVICE_NORM=0
 * keeps the host's gather. */
static int norm_on_device(const loom_program *p)
{
	const loom_plan *pl = &p->plan;
	return (loom_pass_shard_caps(p) & LOOM_SHARD_SUMSQ_DEVICE) && pl->zero && !pl->pipe &&
	       loom_comm_stream_ordered(pl->comm) && loom_opt_bool(LOOM_OPT_ZERO_DEVICE_NORM);
}

/* ZeRO with clipping: every rank's sum of squares over its shard, added
 * over the ranks, so that every rank clips by the same global norm. On the
 * device: one all-reduce of one f64 in the compute stream's order, which
 * the optimizer then reads there (no host wait, so a captured step holds
 * it). On the host: gathered and added in rank order into ts->grad_norm,
 * which the optimizer reads. */
static loom_status shard_norm(loom_program *p, const loom_step *s)
{
	const loom_plan *pl = &p->plan;
	double mine = 0, *all = NULL, sum = 0;
	loom_status st;
	if (loom_exec_device_wait(p) && norm_on_device(p)) {
		void *sumsq = NULL;
		if ((st = loom_pass_grad_sumsq_device(p, s->first, s->last, &sumsq)) != LOOM_OK)
			return st;
		return sum_on_device(p, sumsq, LOOM_F64);
	}
	if ((st = loom_pass_grad_sumsq(p, s->first, s->last, &mine)) != LOOM_OK)
		return st;
	loom_comm *host = loom_pg_comm(pl->opts.pg, LOOM_COMM_HOST);
	if (!(all = malloc(sizeof(double) * (size_t)pl->world)))
		return loom_program_fail(p, LOOM_ERR_NOMEM, "zero: out of memory");
	if (!host || (st = loom_comm_allgather(host, &mine, sizeof(mine), all)) != LOOM_OK) {
		free(all);
		return comm_fail(p, host ? st : LOOM_ERR_UNSUPPORTED);
	}
	for (int r = 0; r < pl->world; r++)
		sum += all[r];
	free(all);
	p->ts.grad_norm = sqrt(sum);
	return LOOM_OK;
}

/* ZeRO's norm and verdict cross the host unless the backend takes them on
 * the device; a captured graph cannot wait on the host. */
static const char *zero_no_graph(const loom_program *p)
{
	const loom_plan *pl = &p->plan;
	if (pl->opts.optim.clip_grad > 0 && !norm_on_device(p))
		return "ZeRO's gradient norm crosses the host";
	if (pl->scaling && !(loom_pass_shard_caps(p) & LOOM_SHARD_FINITE_DEVICE))
		return "ZeRO's overflow verdict crosses the host";
	return NULL;
}

/* ZeRO-2: the gradients are the bucket region (shards + buckets in
 * flight); ZeRO-3: but the half parameter shards after the buckets, and
 * the parameters are this rank's shards. */
static void zero_info(const loom_program *p, loom_program_info *info)
{
	if (p->plan.zero >= 2)
		info->grad_bytes = p->plan.mp.bucket_bytes;
	if (p->plan.zero == 3) {
		info->grad_bytes = loom_zero3_half_at(&p->plan, 0);
		info->param_bytes = p->plan.param_shard_bytes;
	}
}

const loom_shards loom_zero_shards = {
	.verdict = shard_verdict,
	.norm = shard_norm,
	.no_graph = zero_no_graph,
	.shard_of = loom_zero_shard_of,
	.master_slot = loom_zero_master_slot,
	.gather = loom_zero_gather,
	.scatter = loom_zero_scatter,
	.info = zero_info,
};

/* A pipeline's stages: each holds its layers' gradients whole, so the norm
 * is the backend's; the verdict crosses them. */
const loom_shards loom_stage_shards = {
	.verdict = shard_verdict,
};
