/*
 * engine/exec.c — the one executor: walks a range of the plan's steps
 * (engine/plan.h) on the program's backend, for every backend. What is not
 * a backend's business lives here once: a node's fused siblings, the
 * per-node overflow diagnosis, the collectives in flight per bucket (started
 * on the communication stream after the compute stream's work so far, moved
 * along between nodes where the host drives them, waited for by the WAIT
 * step), ZeRO's shard-wide overflow verdict and gradient norm, and the
 * trace's spans, read from the backend's timers once the run has been
 * synchronised.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "parallel/pipeline.h"
#include "engine/elem.h"
#include "engine/program_internal.h"
#include "engine/trace.h"

/* The events the executor records; a backend has LOOM_BACKEND_EVENTS. */
enum { EV_COLL_START = 0 };

static loom_status be_fail(loom_program *p, loom_status st)
{
	return loom_program_backend_fail(p, st);
}

static loom_status comm_fail(loom_program *p, loom_status st)
{
	return loom_program_fail(p, st, "%s", loom_pg_error(p->plan.opts.pg));
}

/* ------------------------------------------------------------ trace */

/* A timer slot marking the work queued so far on stream; -1 when the trace
 * is off or the timer failed (a span is never worth failing a step). */
static int timer(loom_program *p, loom_stream stream)
{
	if (!p->ts.trace)
		return -1;
	int slot = p->exec.n_timers;
	if (p->be->timer_record(p->be_ctx, slot, stream) != LOOM_OK) {
		p->ts.trace->lost++;
		return -1;
	}
	p->exec.n_timers++;
	return slot;
}

/* Index of the new span, -1 if none. */
static int span(loom_program *p, int kind, int id, int aux, int t0, int t1)
{
	loom_exec *x = &p->exec;
	if (!p->ts.trace || t0 < 0)
		return -1;
	if (x->n_spans == x->cap_spans) {
		int cap = x->cap_spans ? 2 * x->cap_spans : 256;
		loom_exec_span *s = realloc(x->spans, sizeof(*s) * (size_t)cap);
		if (!s) {
			p->ts.trace->lost++;
			return -1;
		}
		x->spans = s;
		x->cap_spans = cap;
	}
	x->spans[x->n_spans] = (loom_exec_span){ kind, id, aux, t0, t1 };
	return x->n_spans++;
}

loom_status loom_exec_trace_flush(loom_program *p)
{
	loom_exec *x = &p->exec;
	loom_trace *tr = p->ts.trace;
	for (int i = 0; tr && i < x->n_spans; i++) {
		const loom_exec_span *s = &x->spans[i];
		double t0, t1;
		if (s->t1 < 0 || p->be->timer_read(p->be_ctx, s->t0, &t0) != LOOM_OK ||
		    p->be->timer_read(p->be_ctx, s->t1, &t1) != LOOM_OK) {
			tr->lost++;
			continue;
		}
		loom_trace_add(tr, s->kind, s->id, s->aux, t0, t1);
	}
	x->n_spans = 0;
	x->n_timers = 0;
	return LOOM_OK;
}

/* ------------------------------------------------------------ collectives */

/* Collectives the executor tracks: one per bucket, then ZeRO-3's gathers. */
static int n_colls(const loom_plan *pl)
{
	return pl->buckets.n + pl->n_gathers;
}

static loom_status exec_alloc(loom_program *p)
{
	loom_exec *x = &p->exec;
	int n = n_colls(&p->plan);
	if (x->pending || n == 0)
		return LOOM_OK;
	x->pending = calloc((size_t)n, sizeof(*x->pending));
	x->pending_span = malloc(sizeof(int) * (size_t)n);
	if (!x->pending || !x->pending_span)
		return loom_program_fail(p, LOOM_ERR_NOMEM, "executor: out of memory for %d buckets", n);
	for (int k = 0; k < n; k++)
		x->pending_span[k] = -1;
	return LOOM_OK;
}

void loom_exec_free(loom_exec *x)
{
	free(x->pending);
	free(x->pending_span);
	free(x->spans);
	memset(x, 0, sizeof(*x));
}

/* The collective ended (seen by the host): its span, if it waits for an end. */
static void seen_complete(loom_program *p, int k)
{
	int i = p->exec.pending_span[k];
	if (i >= 0 && p->exec.spans[i].t1 < 0)
		p->exec.spans[i].t1 = timer(p, LOOM_STREAM_COMPUTE);
	p->exec.pending_span[k] = -1;
}

static loom_status coll_start(loom_program *p, const loom_step *s)
{
	const loom_plan *pl = &p->plan;
	loom_exec *x = &p->exec;
	int k = s->index;
	loom_status st;
	if (!pl->comm || k < 0 || k >= n_colls(pl))
		return loom_program_fail(p, LOOM_ERR_STATE, "%s of bucket %d: no process group",
					 loom_coll_name(s->coll), k);
	if (x->pending[k])
		return loom_program_fail(p, LOOM_ERR_STATE,
					 "%s of bucket %d started before the last one ended",
					 loom_coll_name(s->coll), k);
	const loom_gather *gt = k >= pl->buckets.n ? &pl->gathers[k - pl->buckets.n] : NULL;
	const loom_bucket *b = &pl->buckets.b[gt ? gt->bucket : k];
	void *buf = p->arena.bucket + b->base;
	size_t shard = (size_t)b->count / (size_t)pl->world;
	/* ZeRO-3: this rank's shard into its place in the gathered value. */
	if (gt) {
		buf = loom_arena_ptr(&p->arena, pl, gt->v);
		st = p->be->copy(p->be_ctx, (unsigned char *)buf + shard * (size_t)pl->rank *
					    loom_dtype_size(b->dtype),
				 (gt->src_bucket ? p->arena.bucket : p->arena.state) + gt->src_off,
				 shard * loom_dtype_size(b->dtype));
		if (st != LOOM_OK)
			return be_fail(p, st);
	}
	/* The communication stream starts after the compute stream's work so
	 * far (the bucket's last gradient, or the optimizer's update). */
	if ((st = p->be->event_record(p->be_ctx, EV_COLL_START, LOOM_STREAM_COMPUTE)) != LOOM_OK ||
	    (st = p->be->event_wait(p->be_ctx, EV_COLL_START, LOOM_STREAM_COMM)) != LOOM_OK)
		return be_fail(p, st);
	int t0 = timer(p, LOOM_STREAM_COMM);
	void *stream = p->be->stream_handle(p->be_ctx, LOOM_STREAM_COMM);
	switch (s->coll) {
	case LOOM_COLL_ALLREDUCE:
		st = loom_comm_allreduce_start(pl->comm, buf, (size_t)b->count, b->dtype, stream,
					       &x->pending[k]);
		break;
	case LOOM_COLL_REDUCE_SCATTER:
		st = loom_comm_reduce_scatter_start(pl->comm, buf, shard, b->dtype, stream,
						    &x->pending[k]);
		break;
	case LOOM_COLL_ALLGATHER:
		st = loom_comm_allgather_start(pl->comm, buf, shard, b->dtype, stream, &x->pending[k]);
		break;
	default:
		return loom_program_fail(p, LOOM_ERR_UNSUPPORTED, "executor: no %s step on buckets",
					 loom_coll_name(s->coll));
	}
	if (st != LOOM_OK) {
		x->pending[k] = NULL;
		return comm_fail(p, st);
	}
	x->n_pending++;
	/* Its end: an event after it on an asynchronous stream; else the
	 * moment the host first sees it complete. */
	int t1 = (p->be->caps & LOOM_BE_ASYNC_STREAMS) ? timer(p, LOOM_STREAM_COMM) : -1;
	x->pending_span[k] = span(p, LOOM_SPAN_ALLREDUCE, gt ? gt->bucket : k, s->coll, t0, t1);
	return LOOM_OK;
}

/* MPI moves a non-blocking collective only inside its calls: a turn for
 * the outstanding ones between nodes. */
static loom_status coll_progress(loom_program *p)
{
	loom_exec *x = &p->exec;
	for (int k = 0; k < n_colls(&p->plan); k++) {
		int done = 0;
		if (!x->pending[k])
			continue;
		loom_status st = loom_comm_test(p->plan.comm, x->pending[k], &done);
		if (st != LOOM_OK)
			return comm_fail(p, st);
		if (done)
			seen_complete(p, k);
	}
	return LOOM_OK;
}

/* Every collective in flight ends (the group's timeout applies); only >= 0:
 * that one. */
static loom_status coll_wait(loom_program *p, int only)
{
	loom_exec *x = &p->exec;
	loom_status first = LOOM_OK;
	int t0 = x->n_pending ? timer(p, LOOM_STREAM_COMPUTE) : -1;
	for (int k = 0; k < n_colls(&p->plan) && x->n_pending; k++) {
		if (!x->pending[k] || (only >= 0 && k != only))
			continue;
		/* wait frees the work whatever it returns */
		loom_status st = loom_comm_wait(p->plan.comm, x->pending[k]);
		x->pending[k] = NULL;
		x->n_pending--;
		if (st != LOOM_OK && first == LOOM_OK)
			first = comm_fail(p, st);
		else if (st == LOOM_OK)
			seen_complete(p, k);
	}
	if (t0 >= 0)
		span(p, LOOM_SPAN_WAIT, 0, 0, t0, timer(p, LOOM_STREAM_COMPUTE));
	return first;
}

static loom_status sends_wait(loom_program *p, int slot);
static void recvs_drop(loom_program *p);

void loom_exec_drain(loom_program *p)
{
	if (p->exec.n_pending)
		(void)coll_wait(p, -1);
	if (p->plan.pipe && p->plan.pipe->n_sends)
		(void)sends_wait(p, -1);
	if (p->plan.pipe)
		recvs_drop(p);
}

loom_status loom_exec_synchronize(loom_program *p)
{
	loom_status st = coll_wait(p, -1);
	if (st == LOOM_OK && p->plan.pipe && p->plan.pipe->n_sends)
		st = sends_wait(p, -1);
	if (st != LOOM_OK)
		return st;
	if ((st = p->be->synchronize(p->be_ctx, &p->plan, &p->ts)) != LOOM_OK)
		return be_fail(p, st);
	return LOOM_OK;
}

/* ------------------------------------------------------------ steps */

/* The node, then the values it makes besides its own: those the backend's
 * call for the node wrote already, the others by their own entries now. */
static loom_status exec_node(loom_program *p, const loom_step *s, int diagnose)
{
	const loom_plan *pl = &p->plan;
	const loom_backend *be = p->be;
	loom_value v = s->v;
	loom_status st;
	int t0 = s->noop ? -1 : timer(p, LOOM_STREAM_COMPUTE);
	for (loom_value w = v; w != LOOM_NONE;
	     w = w == v ? loom_sibling_first(pl, v) : loom_sibling_next(pl, w)) {
		int run = w == v ? !s->noop : !be->makes_sibling || !be->makes_sibling(p->be_ctx, pl, v, w);
		if (run && (st = be->run_node(p->be_ctx, pl, &p->arena, w)) != LOOM_OK)
			return be_fail(p, st);
		if (diagnose && (st = be->check_finite(p->be_ctx, pl, &p->arena, &p->ts, w)) != LOOM_OK)
			return be_fail(p, st);
	}
	if (t0 >= 0)
		span(p, LOOM_SPAN_NODE, v, 0, t0, timer(p, LOOM_STREAM_COMPUTE));
	return LOOM_OK;
}

static loom_status exec_accum(loom_program *p, const loom_step *s, unsigned flags)
{
	int fold = (flags & LOOM_EXEC_FOLD) != 0;
	if (s->accum == LOOM_ACCUM_ADD || s->accum == LOOM_ACCUM_FOLD)
		fold = s->accum == LOOM_ACCUM_FOLD; /* a pipeline's micro-batch */
	else if (!(flags & (LOOM_EXEC_ACCUMULATE | LOOM_EXEC_FOLD)))
		return LOOM_OK;
	int t0 = timer(p, LOOM_STREAM_COMPUTE);
	loom_status st = p->be->accum(p->be_ctx, &p->plan, &p->arena, s->index, fold);
	if (st != LOOM_OK)
		return be_fail(p, st);
	span(p, LOOM_SPAN_ACCUM, s->index, fold, t0, timer(p, LOOM_STREAM_COMPUTE));
	return LOOM_OK;
}

/* ZeRO: every rank checked its shard; a step is skipped everywhere when
 * any shard overflowed. */
static loom_status shard_verdict(loom_program *p, const loom_step *s, int *finite)
{
	const loom_plan *pl = &p->plan;
	int mine = 1;
	loom_status st;
	if (!p->be->grads_finite)
		return loom_program_fail(p, LOOM_ERR_UNSUPPORTED,
					 "zero: the %s backend cannot check a shard", p->be->name);
	if ((st = p->be->grads_finite(p->be_ctx, pl, &p->arena, s->first, s->last, &mine)) != LOOM_OK)
		return be_fail(p, st);
	loom_comm *host = loom_pg_comm(pl->opts.pg, LOOM_COMM_HOST);
	float bad = mine ? 0.0f : 1.0f;
	if (!host || (st = loom_comm_allreduce(host, &bad, 1, LOOM_F32)) != LOOM_OK)
		return comm_fail(p, host ? st : LOOM_ERR_UNSUPPORTED);
	*finite = bad == 0.0f;
	return LOOM_OK;
}

/* ZeRO with clipping: every rank's sum of squares over its shard, gathered
 * and added in rank order, so that every rank clips by the same global
 * norm (ts->grad_norm, which the optimizer then reads). */
static loom_status shard_norm(loom_program *p, const loom_step *s)
{
	const loom_plan *pl = &p->plan;
	double mine = 0, *all = NULL, sum = 0;
	loom_status st;
	if (!p->be->grad_sumsq)
		return loom_program_fail(p, LOOM_ERR_UNSUPPORTED,
					 "zero: the %s backend cannot take a shard's gradient norm",
					 p->be->name);
	if ((st = p->be->grad_sumsq(p->be_ctx, pl, &p->arena, &p->ts, s->first, s->last, &mine)) !=
	    LOOM_OK)
		return be_fail(p, st);
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

static loom_status exec_optim(loom_program *p, const loom_step *s)
{
	int finite = -1;
	loom_status st;
	/* ZeRO's shards and a pipeline's stages each hold some gradients. */
	if ((p->plan.zero || p->plan.pipe) && p->plan.scaling &&
	    (st = shard_verdict(p, s, &finite)) != LOOM_OK)
		return st;
	/* A skipped step (an overflow on any shard) takes no norm. */
	if (p->plan.zero && p->plan.opts.optim.clip_grad > 0 && finite != 0 && (st = shard_norm(p, s)) != LOOM_OK)
		return st;
	st = p->be->optim(p->be_ctx, &p->plan, &p->arena, &p->ts, s->first, s->last, finite);
	return st != LOOM_OK ? be_fail(p, st) : LOOM_OK;
}

/* ZeRO: bucket k holds every rank's updated parameters, gathered: each
 * into its parameter. */
static loom_status exec_copy(loom_program *p, const loom_step *s)
{
	const loom_plan *pl = &p->plan;
	const loom_bucket *b = &pl->buckets.b[s->index];
	int t0 = timer(p, LOOM_STREAM_COMPUTE);
	for (int j = b->first; j < b->first + b->n; j++) {
		loom_value grad = pl->buckets.grad[j], param = LOOM_NONE;
		for (int q = 0; q < pl->n_params && param == LOOM_NONE; q++)
			if (pl->params[q].grad == grad)
				param = pl->params[q].param;
		if (param == LOOM_NONE)
			continue;
		loom_status st = p->be->copy(p->be_ctx, loom_arena_ptr(&p->arena, pl, param),
					     p->arena.bucket + b->base + pl->buckets.offset[j],
					     loom_plan_value_bytes(pl, param));
		if (st != LOOM_OK)
			return be_fail(p, st);
	}
	span(p, LOOM_SPAN_COPY, s->index, 0, t0, timer(p, LOOM_STREAM_COMPUTE));
	return LOOM_OK;
}

/* ------------------------------------------------------------ pipeline */

/* Sends in flight (parallel/pipeline.c's stage boundaries): each reads the
 * activation slot it was sent from (or a copy), so a slot is reused only
 * once its sends ended. slot < 0: every send. */
static loom_status sends_wait(loom_program *p, int slot)
{
	loom_pipe *pp = p->plan.pipe;
	loom_status first = LOOM_OK;
	int k = 0;
	for (int i = 0; i < pp->n_sends; i++) {
		if (slot >= 0 && pp->send_slot[i] != slot) {
			pp->sends[k] = pp->sends[i];
			pp->send_slot[k] = pp->send_slot[i];
			pp->send_micro[k] = pp->send_micro[i];
			pp->send_copy[k++] = pp->send_copy[i];
			continue;
		}
		loom_status st = loom_comm_wait(pp->comm, pp->sends[i]);
		free(pp->send_copy[i]);
		if (st != LOOM_OK && first == LOOM_OK)
			first = comm_fail(p, st);
	}
	pp->n_sends = k;
	return first;
}

/* MPI moves a send only inside its calls: a turn between nodes. */
static loom_status sends_progress(loom_program *p)
{
	loom_pipe *pp = p->plan.pipe;
	for (int i = 0; i < pp->n_sends; i++) {
		int done = 0;
		loom_status st = loom_comm_test(pp->comm, pp->sends[i], &done);
		if (st != LOOM_OK)
			return comm_fail(p, st);
	}
	return LOOM_OK;
}

/* Whether the sends in flight from activation slot `slot` of micro-batches
 * other than `micro` (the slot's earlier holders) have ended: tested, never
 * waited for, so that posting a receive early never blocks the stage. */
static loom_status slot_sends_done(loom_program *p, int slot, int micro, int *done)
{
	loom_pipe *pp = p->plan.pipe;
	*done = 1;
	for (int i = 0; i < pp->n_sends && *done; i++) {
		if (pp->send_slot[i] != slot || pp->send_micro[i] == micro)
			continue;
		loom_status st = loom_comm_test(pp->comm, pp->sends[i], done);
		if (st != LOOM_OK)
			return comm_fail(p, st);
	}
	return LOOM_OK;
}

static loom_status sends_grow(loom_program *p)
{
	loom_pipe *pp = p->plan.pipe;
	if (pp->n_sends < pp->cap_sends)
		return LOOM_OK;
	int cap = pp->cap_sends ? 2 * pp->cap_sends : 16;
	loom_comm_work **w = realloc(pp->sends, sizeof(*w) * (size_t)cap);
	if (w)
		pp->sends = w;
	int *sl = w ? realloc(pp->send_slot, sizeof(int) * (size_t)cap) : NULL;
	if (sl)
		pp->send_slot = sl;
	int *mi = sl ? realloc(pp->send_micro, sizeof(int) * (size_t)cap) : NULL;
	if (mi)
		pp->send_micro = mi;
	void **cp = mi ? realloc(pp->send_copy, sizeof(void *) * (size_t)cap) : NULL;
	if (!cp)
		return loom_program_fail(p, LOOM_ERR_NOMEM, "send: out of memory");
	pp->send_copy = cp;
	pp->cap_sends = cap;
	return LOOM_OK;
}

static loom_status exec_send(loom_program *p, const loom_step *s)
{
	const loom_plan *pl = &p->plan;
	loom_pipe *pp = pl->pipe;
	size_t bytes = loom_plan_value_bytes(pl, s->v);
	void *buf = loom_arena_ptr(&p->arena, pl, s->v), *copy = NULL;
	int outside = pl->mp.region[pl->mp.root[s->v]] != LOOM_REGION_ACT;
	loom_status st;
	if ((st = sends_grow(p)) != LOOM_OK)
		return st;
	/* A value outside the slots (a marked output) is overwritten by the
	 * next micro-batch: the send reads a copy; so does every staged send
	 * (device memory over the host communicator). A device communicator
	 * sends from the device in stream order. */
	if (pp->xfer == LOOM_PIPE_XFER_STAGED || (outside && pp->xfer == LOOM_PIPE_XFER_HOST)) {
		if (!(copy = malloc(bytes ? bytes : 1)))
			return loom_program_fail(p, LOOM_ERR_NOMEM, "send: out of memory");
		if ((st = loom_program_download(p, copy, buf, bytes)) != LOOM_OK) {
			free(copy);
			return st;
		}
		buf = copy;
	}
	loom_comm_work *w = NULL;
	st = loom_comm_send_start(pp->comm, buf, bytes, s->peer, s->v,
				  p->be->stream_handle(p->be_ctx, LOOM_STREAM_COMPUTE), &w);
	if (st != LOOM_OK) {
		free(copy);
		return comm_fail(p, st);
	}
	/* NCCL reads the device bytes on its own stream, which the compute
	 * stream does not wait for: a value outside the slots is waited for
	 * here, before the next micro-batch can write it. */
	if (outside && pp->xfer == LOOM_PIPE_XFER_DEVICE)
		return (st = loom_comm_wait(pp->comm, w)) != LOOM_OK ? comm_fail(p, st) : LOOM_OK;
	pp->sends[pp->n_sends] = w;
	pp->send_slot[pp->n_sends] = s->first;
	pp->send_micro[pp->n_sends] = s->micro;
	pp->send_copy[pp->n_sends++] = copy;
	return LOOM_OK;
}

/* The one wording of a failed receive: the stage, the micro-batch, the
 * value and the stage it comes from, then the group's own message (which
 * names a dead or late rank with its stage). */
static loom_status recv_fail(loom_program *p, const loom_step *s, loom_status st)
{
	const loom_plan *pl = &p->plan;
	const loom_pipe *pp = pl->pipe;
	char lb[96];
	return loom_program_fail(p, st, "stage %d, micro-batch %d: receiving %s from stage %d: %s",
				 pp->stage, s->micro, loom_node_label(pl->g, s->v, lb, sizeof(lb)),
				 s->peer % pp->stages, loom_pg_error(pl->opts.pg));
}

/* Where the received value goes: its place in its micro-batch's slot,
 * whichever slot the arena points at now (a receive may be posted while
 * another micro-batch runs), or its own place outside the slots. */
static void *recv_dst(const loom_program *p, const loom_step *s)
{
	const loom_plan *pl = &p->plan;
	const loom_pipe *pp = pl->pipe;
	if (pl->mp.region[s->v] == LOOM_REGION_ACT)
		return pp->act_base + (size_t)s->first * pp->slot_bytes + pl->mp.offset[s->v];
	return loom_arena_ptr(&p->arena, pl, s->v);
}

/* Posts receive k (pp->recv_at): into the arena, or (staged) into a host
 * buffer that its step uploads. */
static loom_status recv_post(loom_program *p, int k)
{
	const loom_plan *pl = &p->plan;
	loom_pipe *pp = pl->pipe;
	const loom_step *s = &pl->steps[pp->recv_at[k]];
	size_t bytes = loom_plan_value_bytes(pl, s->v);
	void *dst = recv_dst(p, s);
	if (pp->xfer == LOOM_PIPE_XFER_STAGED) {
		if (!(pp->recv_host[k] = malloc(bytes ? bytes : 1)))
			return recv_fail(p, s, LOOM_ERR_NOMEM);
		dst = pp->recv_host[k];
	}
	loom_status st = loom_comm_recv_start(pp->comm, dst, bytes, s->peer, s->v,
					      p->be->stream_handle(p->be_ctx, LOOM_STREAM_COMPUTE),
					      &pp->recv_work[k]);
	if (st != LOOM_OK) {
		pp->recv_work[k] = NULL;
		free(pp->recv_host[k]);
		pp->recv_host[k] = NULL;
		return recv_fail(p, s, st);
	}
	pp->recv_next = k + 1;
	return LOOM_OK;
}

/*
 * Before step i: posts, in step order, the run's receives whose post
 * point (loom_step.post) is at or before i, each early one into the slot
 * only once the sends from its slot of the micro-batch before it ended;
 * the first that
 * cannot go holds the later ones back (a value's receives in successive
 * micro-batches share a tag and must match its sends in order). A receive
 * whose own step this is goes now whatever: its MICRO step waited for the
 * slot's sends.
 */
static loom_status recvs_post(loom_program *p, int i)
{
	const loom_plan *pl = &p->plan;
	loom_pipe *pp = pl->pipe;
	loom_status st;
	while (pp->recv_next < pp->recv_end) {
		int k = pp->recv_next, at = pp->recv_at[k];
		const loom_step *s = &pl->steps[at];
		if (s->post > i)
			break;
		if (at > i) {
			/* staged, it lands in a host buffer, not in the slot */
			int done = 1;
			if (pp->xfer != LOOM_PIPE_XFER_STAGED &&
			    (st = slot_sends_done(p, s->first, s->micro, &done)) != LOOM_OK)
				return st;
			if (!done)
				break;
			pp->n_early++;
		}
		if ((st = recv_post(p, k)) != LOOM_OK)
			return st;
	}
	return LOOM_OK;
}

/* A turn for the receives posted ahead of their steps, between nodes. */
static loom_status recvs_progress(loom_program *p)
{
	const loom_plan *pl = &p->plan;
	loom_pipe *pp = pl->pipe;
	for (int k = pp->recv_wait; k < pp->recv_next; k++) {
		int done = 0;
		loom_status st = loom_comm_test(pp->comm, pp->recv_work[k], &done);
		if (st != LOOM_OK)
			return recv_fail(p, &pl->steps[pp->recv_at[k]], st);
	}
	return LOOM_OK;
}

/* Receives a failed run left posted: waited for (the group's timeout
 * applies, counted from each one's post) and their data dropped. */
static void recvs_drop(loom_program *p)
{
	loom_pipe *pp = p->plan.pipe;
	for (int k = pp->recv_wait; k < pp->recv_next; k++) {
		if (pp->recv_work[k])
			(void)loom_comm_wait(pp->comm, pp->recv_work[k]);
		pp->recv_work[k] = NULL;
		free(pp->recv_host[k]);
		pp->recv_host[k] = NULL;
	}
	pp->recv_wait = pp->recv_next = pp->recv_end = 0;
}

/* A run of steps [first, last): its receives are recv_at's from the first
 * at or after `first` to the last before `last`. */
static void recvs_begin(loom_program *p, int first, int last)
{
	loom_pipe *pp = p->plan.pipe;
	recvs_drop(p);
	int k = 0;
	while (k < pp->n_recv && pp->recv_at[k] < first)
		k++;
	pp->recv_wait = pp->recv_next = k;
	while (k < pp->n_recv && pp->recv_at[k] < last)
		k++;
	pp->recv_end = k;
}

/* The receive, posted at or before this step, ends here (the group's
 * timeout applies, counted from this step) while the sends in flight move
 * on; staged, its host buffer goes up into the slot. */
static loom_status exec_recv(loom_program *p, const loom_step *s, int i)
{
	const loom_plan *pl = &p->plan;
	loom_pipe *pp = pl->pipe;
	int k = pp->recv_wait;
	loom_status st;
	if (k >= pp->recv_next || pp->recv_at[k] != i)
		return loom_program_fail(p, LOOM_ERR_STATE,
					 "stage %d, step %d: a receive that was never posted", pp->stage, i);
	int t0 = timer(p, LOOM_STREAM_COMPUTE);
	/* the timeout counts from here, not from an early post */
	loom_comm_restart(pp->comm, pp->recv_work[k]);
	st = loom_comm_wait(pp->comm, pp->recv_work[k]);
	pp->recv_work[k] = NULL;
	pp->recv_wait = k + 1;
	if (st == LOOM_OK && pp->xfer == LOOM_PIPE_XFER_STAGED)
		st = loom_program_upload(p, recv_dst(p, s), pp->recv_host[k],
					 loom_plan_value_bytes(pl, s->v));
	free(pp->recv_host[k]);
	pp->recv_host[k] = NULL;
	if (st != LOOM_OK)
		return recv_fail(p, s, st);
	span(p, LOOM_SPAN_RECV, s->v, s->micro, t0, timer(p, LOOM_STREAM_COMPUTE));
	return LOOM_OK;
}

/* Micro-batch s->micro begins its forward (index 0) or backward (2) in
 * activation slot s->first, with its inputs (and, for the backward, the
 * outputs its forward made) put back; or its forward ended (1): the
 * outputs are kept for its backward and the reader. */
static loom_status exec_micro(loom_program *p, const loom_step *s)
{
	const loom_plan *pl = &p->plan;
	loom_pipe *pp = pl->pipe;
	loom_status st;
	int end = s->index == 1, bwd = s->index == 2;
	if (!end) {
		if ((st = sends_wait(p, s->first)) != LOOM_OK)
			return st;
		p->arena.act = pp->act_base + (size_t)s->first * pp->slot_bytes;
	}
	for (int i = 0; i < pp->n_vals; i++) {
		loom_value v = pp->vals[i];
		unsigned char *host = pp->host[i] + (size_t)s->micro * pp->bytes[i];
		if (!loom_plan_holds(pl, v))
			continue; /* an input only other stages read */
		if (end && !pp->is_input[i]) {
			if ((st = loom_program_download(p, host, loom_value_ptr(p, v), pp->bytes[i])) != LOOM_OK)
				return st;
			if (v == pl->loss)
				pp->loss[s->micro] = loom_elem_get(pl->g->nodes[v].dtype, host, 0);
		} else if (!end && (pp->is_input[i] || bwd)) {
			if ((st = loom_program_upload(p, loom_value_ptr(p, v), host, pp->bytes[i])) != LOOM_OK)
				return st;
		}
	}
	return LOOM_OK;
}

static loom_status exec_step(loom_program *p, const loom_step *s, int i, unsigned flags, int diagnose)
{
	switch (s->kind) {
	case LOOM_STEP_NODE:
		return exec_node(p, s, diagnose);
	case LOOM_STEP_ACCUM:
		return exec_accum(p, s, flags);
	case LOOM_STEP_COLLECTIVE:
		/* Gradient accumulation (DDP's no_sync): nothing is sent; ZeRO-3's
		 * gathers still bring the parameters. */
		return (flags & LOOM_EXEC_ACCUMULATE) && s->index < p->plan.buckets.n ? LOOM_OK :
										       coll_start(p, s);
	case LOOM_STEP_WAIT:
		return coll_wait(p, s->index);
	case LOOM_STEP_OPTIM:
		return exec_optim(p, s);
	case LOOM_STEP_COPY:
		return exec_copy(p, s);
	case LOOM_STEP_SEND:
		return exec_send(p, s);
	case LOOM_STEP_RECV:
		return exec_recv(p, s, i);
	case LOOM_STEP_MICRO:
		return exec_micro(p, s);
	default:
		return loom_program_fail(p, LOOM_ERR_UNSUPPORTED, "executor: no %s steps yet",
					 loom_step_kind_name(s->kind));
	}
}

loom_status loom_exec_run(loom_program *p, int first, int last, unsigned flags)
{
	const loom_plan *pl = &p->plan;
	const loom_backend *be = p->be;
	loom_status st;
	if ((st = exec_alloc(p)) != LOOM_OK)
		return st;
	if (pl->pipe)
		recvs_begin(p, first, last);
	if ((st = be->run_begin(p->be_ctx, pl, &p->arena, &p->ts, flags)) != LOOM_OK)
		return be_fail(p, st);
	int diagnose = (flags & LOOM_EXEC_DIAGNOSE) && p->ts.first_nonfinite == LOOM_NONE;
	int host_progress = !(be->caps & LOOM_BE_ASYNC_STREAMS);
	int phase = -1, phase_t0 = -1;
	for (int i = first; i < last; i++) {
		const loom_step *s = &pl->steps[i];
		if ((int)s->phase != phase) {
			int t = timer(p, LOOM_STREAM_COMPUTE);
			if (phase >= 0)
				span(p, LOOM_SPAN_PHASE, phase, 0, phase_t0, t);
			phase = s->phase;
			phase_t0 = t;
		}
		if (pl->pipe && pl->pipe->recv_next < pl->pipe->recv_end &&
		    (st = recvs_post(p, i)) != LOOM_OK)
			return st;
		if ((st = exec_step(p, s, i, flags, diagnose)) != LOOM_OK)
			return st;
		if (s->kind == LOOM_STEP_NODE && host_progress && p->exec.n_pending &&
		    (st = coll_progress(p)) != LOOM_OK)
			return st;
		if (s->kind == LOOM_STEP_NODE && pl->pipe && pl->pipe->n_sends &&
		    (st = sends_progress(p)) != LOOM_OK)
			return st;
		if (s->kind == LOOM_STEP_NODE && pl->pipe && pl->pipe->recv_wait < pl->pipe->recv_next &&
		    (st = recvs_progress(p)) != LOOM_OK)
			return st;
	}
	if (phase >= 0)
		span(p, LOOM_SPAN_PHASE, phase, 0, phase_t0, timer(p, LOOM_STREAM_COMPUTE));
	if ((st = be->run_end(p->be_ctx, pl, &p->arena, &p->ts)) != LOOM_OK)
		return be_fail(p, st);
	return LOOM_OK;
}

loom_status loom_exec_check_support(loom_program *p)
{
	const loom_plan *pl = &p->plan;
	for (int i = 0; i < pl->n_steps; i++) {
		const loom_step *s = &pl->steps[i];
		if (s->kind != LOOM_STEP_NODE)
			continue;
		for (loom_value w = s->v; w != LOOM_NONE;
		     w = w == s->v ? loom_sibling_first(pl, s->v) : loom_sibling_next(pl, w)) {
			if (p->be->supports_node(p->be_ctx, pl, w))
				continue;
			const loom_node *n = &pl->g->nodes[w];
			char lb[96], sh[96], srcs[384] = "";
			size_t len = 0;
			for (int j = 0; j < n->nsrc && len < sizeof(srcs); j++) {
				const loom_node *sn = &pl->g->nodes[n->src[j]];
				len += (size_t)snprintf(srcs + len, sizeof(srcs) - len, "%s%s %s",
							j ? ", " : "", loom_dtype_name(sn->dtype),
							loom_shape_str(&sn->shape, sh, sizeof(sh)));
			}
			loom_shape_str(&n->shape, sh, sizeof(sh));
			return loom_program_fail(p, LOOM_ERR_UNSUPPORTED,
						 "%s: does not run node %d %s: %s %s from (%s)",
						 p->be->describe(p->be_ctx), (int)w,
						 loom_node_label(pl->g, w, lb, sizeof(lb)),
						 loom_dtype_name(n->dtype), sh, srcs);
		}
	}
	return LOOM_OK;
}
