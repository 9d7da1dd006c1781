/*
 * engine/cpu/ops_comm.c — the CPU's entry for a gradient bucket's
 * all-reduce: MPI_Iallreduce through the host collectives (comm/), started
 * when backward has made the bucket's last gradient, moved along between
 * later nodes, and waited for before the optimizer reads the bucket. Also
 * gradient accumulation's sums, kept per bucket so that an accumulating
 * run starts no all-reduce and the step after folds each sum in just
 * before its bucket's all-reduce starts.
 */
#include "comm/comm.h"
#include "engine/cpu/ops.h"
#include "engine/elem.h"
#include "engine/trace.h"

/* Below this many elements a parallel loop costs more than it saves. */
#define ACCUM_PAR_MIN 32768

/* sum += g (or, folding, g += sum and sum = 0) over n elements of dtype dt;
 * sums are f64 for f64 gradients, else f32. */
static void accum_f32(float *sum, void *g, loom_dtype dt, int64_t n, int fold)
{
	if (dt == LOOM_F32) {
		float *x = g;
		#pragma omp parallel for if (n > ACCUM_PAR_MIN) schedule(static)
		for (int64_t i = 0; i < n; i++) {
			if (fold) {
				x[i] += sum[i];
				sum[i] = 0;
			} else {
				sum[i] += x[i];
			}
		}
		return;
	}
	/* Half: the sum is rounded to the gradient's dtype once, when folded. */
	#pragma omp parallel for if (n > ACCUM_PAR_MIN) schedule(static)
	for (int64_t i = 0; i < n; i++) {
		if (fold) {
			loom_elem_set(dt, g, i, (float)(loom_elem_get(dt, g, i) + sum[i]));
			sum[i] = 0;
		} else {
			sum[i] += (float)loom_elem_get(dt, g, i);
		}
	}
}

static void accum_f64(double *sum, double *x, int64_t n, int fold)
{
	for (int64_t i = 0; i < n; i++) {
		if (fold) {
			x[i] += sum[i];
			sum[i] = 0;
		} else {
			sum[i] += x[i];
		}
	}
}

void loom_cpu_accum(loom_cpu_ctx *ctx, const loom_plan *plan, int s, int fold)
{
	const loom_accum_seg *seg = &plan->accum[s];
	double t0 = ctx->trace ? loom_trace_now() : 0;
	void *g = loom_arena_ptr(&ctx->arena, plan, seg->v);
	void *sum = ctx->arena.accum + seg->off;
	if (seg->dtype == LOOM_F64)
		accum_f64(sum, g, seg->count, fold);
	else
		accum_f32(sum, g, seg->dtype, seg->count, fold);
	if (ctx->trace)
		loom_trace_add(ctx->trace, LOOM_SPAN_ACCUM, s, fold, t0, loom_trace_now());
}

loom_status loom_cpu_op_allreduce(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				  const loom_cpu_io *io)
{
	int k = plan->g->nodes[v].a.ar.bucket;
	if (!plan->comm || k < 0 || k >= plan->buckets.n)
		return loom_errf(ctx->err, LOOM_ERR_STATE, "all-reduce node %d: no process group",
				 (int)v);
	/* Gradient accumulation (DDP's no_sync): this micro-step's bucket
	 * joins its sum and nothing is sent. */
	if (ctx->flags & LOOM_EXEC_ACCUMULATE) {
		loom_cpu_accum(ctx, plan, k, 0);
		return LOOM_OK;
	}
	if (ctx->pending[k])
		return loom_errf(ctx->err, LOOM_ERR_STATE,
				 "all-reduce of bucket %d started again before it ended", k);
	if (ctx->flags & LOOM_EXEC_FOLD)
		loom_cpu_accum(ctx, plan, k, 1);
	const loom_bucket *b = &plan->buckets.b[k];
	if (ctx->trace) {
		ctx->ar_t0[k] = loom_trace_now();
		ctx->ar_seen[k] = 0;
	}
	loom_status st = loom_comm_allreduce_start(plan->comm, io->out, (size_t)b->count, b->dtype,
						   NULL, &ctx->pending[k]);
	if (st != LOOM_OK) {
		ctx->pending[k] = NULL;
		return loom_errf(ctx->err, st, "%s", loom_pg_error(plan->comm->pg));
	}
	ctx->n_pending++;
	return LOOM_OK;
}

/* The trace's span of bucket k's all-reduce, once: from its start to now,
 * the first time the executor saw it complete. */
static void seen_complete(loom_cpu_ctx *ctx, int k)
{
	if (!ctx->trace || ctx->ar_seen[k])
		return;
	ctx->ar_seen[k] = 1;
	loom_trace_add(ctx->trace, LOOM_SPAN_ALLREDUCE, k, 0, ctx->ar_t0[k], loom_trace_now());
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
		if (done)
			seen_complete(ctx, k);
	}
	return LOOM_OK;
}

loom_status loom_cpu_comm_wait_all(loom_cpu_ctx *ctx, const loom_plan *plan)
{
	loom_status first = LOOM_OK;
	double t0 = ctx->trace && ctx->n_pending ? loom_trace_now() : 0;
	for (int k = 0; k < plan->buckets.n && ctx->n_pending; k++) {
		if (!ctx->pending[k])
			continue;
		/* wait frees the work whatever it returns */
		loom_status st = loom_comm_wait(plan->comm, ctx->pending[k]);
		ctx->pending[k] = NULL;
		ctx->n_pending--;
		if (st != LOOM_OK && first == LOOM_OK)
			first = loom_errf(ctx->err, st, "%s", loom_pg_error(plan->comm->pg));
		else if (st == LOOM_OK)
			seen_complete(ctx, k);
	}
	if (t0 != 0)
		loom_trace_add(ctx->trace, LOOM_SPAN_WAIT, 0, 0, t0, loom_trace_now());
	return first;
}
