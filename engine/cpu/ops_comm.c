/*
 * engine/cpu/ops_comm.c — the CPU's entry for a gradient bucket's
 * all-reduce: MPI_Iallreduce through the host collectives (comm/), started
 * when backward has made the bucket's last gradient, moved along between
 * later nodes, and waited for before the optimizer reads the bucket.
 */
#include "comm/comm.h"
#include "engine/cpu/ops.h"

loom_status loom_cpu_op_allreduce(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				  const loom_cpu_io *io)
{
	int k = plan->g->nodes[v].a.ar.bucket;
	if (!plan->comm || k < 0 || k >= plan->buckets.n)
		return loom_errf(ctx->err, LOOM_ERR_STATE, "all-reduce node %d: no process group",
				 (int)v);
	if (ctx->pending[k])
		return loom_errf(ctx->err, LOOM_ERR_STATE,
				 "all-reduce of bucket %d started again before it ended", k);
	const loom_bucket *b = &plan->buckets.b[k];
	loom_status st = loom_comm_allreduce_start(plan->comm, io->out, (size_t)b->count, b->dtype,
						   NULL, &ctx->pending[k]);
	if (st != LOOM_OK) {
		ctx->pending[k] = NULL;
		return loom_errf(ctx->err, st, "%s", loom_pg_error(plan->comm->pg));
	}
	ctx->n_pending++;
	return LOOM_OK;
}

loom_status loom_cpu_comm_progress(loom_cpu_ctx *ctx, const loom_plan *plan)
{
	for (int k = 0; k < plan->buckets.n; k++) {
		int done = 0;
		if (!ctx->pending[k])
			continue;
		loom_status st = loom_comm_test(plan->comm, ctx->pending[k], &done);
		if (st != LOOM_OK)
			return loom_errf(ctx->err, st, "%s", loom_pg_error(plan->comm->pg));
	}
	return LOOM_OK;
}

loom_status loom_cpu_comm_wait_all(loom_cpu_ctx *ctx, const loom_plan *plan)
{
	loom_status first = LOOM_OK;
	for (int k = 0; k < plan->buckets.n && ctx->n_pending; k++) {
		if (!ctx->pending[k])
			continue;
		/* wait frees the work whatever it returns */
		loom_status st = loom_comm_wait(plan->comm, ctx->pending[k]);
		ctx->pending[k] = NULL;
		ctx->n_pending--;
		if (st != LOOM_OK && first == LOOM_OK)
			first = loom_errf(ctx->err, st, "%s", loom_pg_error(plan->comm->pg));
	}
	return first;
}
