/*
 * engine/exec.c — the one executor: walks a range of the plan's steps
 * (engine/plan.h) on the program's backend, for every backend. What is not
 * a backend's business lives here once: a node's fused siblings, the
 * per-node overflow diagnosis, the collectives in flight per bucket (started
 * on the communication stream after the compute stream's work so far, moved
 * along between nodes where the host drives them, waited for by the WAIT
 * step), the verdict and norm across ranks that each hold some gradients
 * (through p->shards, which a strategy's pass sets), and the trace's spans, read from the backend's timers once the run has been
 * synchronised.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/options.h"
#include "comm/comm.h"
#include "base/elem.h"
#include "engine/program_internal.h"
#include "engine/trace.h"

/* The events the executor records; a backend has LOOM_BACKEND_EVENTS.
 * EV_COLL_ONE + k % EV_COLL_ONES: recorded on the communication stream
 * right after collective k's start (device wait), so that a WAIT for k
 * alone waits for k and what the stream ran before it, not for the
 * collectives started after it. Two collectives sharing a slot make such
 * a WAIT wait for the later one too: longer, never too short. */
enum { EV_COLL_START = 0, EV_COLL_END = 1, EV_COLL_ONE = 2 };
#define EV_COLL_ONES (LOOM_BACKEND_EVENTS - EV_COLL_ONE)

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
 * is off or the timer failed or the backend has none (a span is never
 * worth failing a step). */
static int timer(loom_program *p, loom_stream stream)
{
	if (!p->ts.trace)
		return -1;
	int slot = p->exec->n_timers;
	const loom_backend_timing *tm = p->be->timing;
	if (!tm || tm->timer_record(p->be_ctx, slot, stream) != LOOM_OK) {
		p->ts.trace->lost++;
		return -1;
	}
	p->exec->n_timers++;
	return slot;
}

/* Index of the new span, -1 if none. */
static int span(loom_program *p, int kind, int id, int aux, int t0, int t1)
{
	loom_exec *x = p->exec;
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

int loom_exec_device_wait(const loom_program *p)
{
	return p->exec->device_wait;
}

int loom_exec_timer(loom_program *p, loom_stream stream)
{
	return timer(p, stream);
}

int loom_exec_add_span(loom_program *p, int kind, int id, int aux, int t0, int t1)
{
	return span(p, kind, id, aux, t0, t1);
}

loom_status loom_exec_trace_flush(loom_program *p)
{
	loom_exec *x = p->exec;
	loom_trace *tr = p->ts.trace;
	const loom_backend_timing *tm = p->be->timing; /* none: timer() made no spans */
	for (int i = 0; tr && tm && i < x->n_spans; i++) {
		const loom_exec_span *s = &x->spans[i];
		double t0, t1;
		if (s->t1 < 0 || tm->timer_read(p->be_ctx, s->t0, &t0) != LOOM_OK ||
		    tm->timer_read(p->be_ctx, s->t1, &t1) != LOOM_OK) {
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

/* Collectives the executor tracks: one per bucket, then the plan's gathers. */
static int n_colls(const loom_plan *pl)
{
	return pl->buckets.n + pl->n_gathers;
}

static loom_status exec_alloc(loom_program *p)
{
	loom_exec *x = p->exec;
	int n = n_colls(&p->plan);
	if (x->pending || n == 0)
		return LOOM_OK;
	x->pending = calloc((size_t)n, sizeof(*x->pending));
	x->pending_span = malloc(sizeof(int) * (size_t)n);
	if (!x->pending || !x->pending_span)
		return loom_program_fail(p, LOOM_ERR_NOMEM, "executor: out of memory for %d buckets", n);
	for (int k = 0; k < n; k++)
		x->pending_span[k] = -1;
	/* On an asynchronous backend whose communicator orders its
	 * collectives on the stream it is given, the collectives are waited
	 * for on the device and by the watchdog; their works (and events)
	 * are made here, once. */
	const loom_plan *pl = &p->plan;
	if (!(p->be->caps & LOOM_BE_ASYNC_STREAMS) || !loom_comm_stream_ordered(pl->comm))
		return LOOM_OK;
	if (!(x->kept = calloc((size_t)n, sizeof(*x->kept))))
		return loom_program_fail(p, LOOM_ERR_NOMEM, "executor: out of memory for %d buckets", n);
	for (int k = 0; k < n; k++) {
		loom_status st = loom_comm_work_make(pl->comm, &x->kept[k]);
		if (st != LOOM_OK)
			return comm_fail(p, st);
	}
	x->device_wait = 1;
	/* Progress marks, where the backend writes them and the communicator
	 * waits on them: how the watchdog sees a replayed step's collectives. */
	const loom_backend_marks *mk = p->be->marks;
	int starts = 0;
	for (int i = 0; i < pl->n_steps; i++)
		starts += pl->steps[i].kind == LOOM_STEP_COLLECTIVE;
	if (starts && mk && loom_comm_has_marks(pl->comm)) {
		if (!(x->mark_work = calloc((size_t)starts, sizeof(*x->mark_work))))
			return loom_program_fail(p, LOOM_ERR_NOMEM,
						 "executor: out of memory for %d collectives", starts);
		x->n_marks = starts;
		for (int m = 0; m < starts; m++) {
			loom_status st = loom_comm_work_make(pl->comm, &x->mark_work[m]);
			if (st != LOOM_OK)
				return comm_fail(p, st);
		}
		loom_status st = mk->mark_words(p->be_ctx, starts, &x->marks);
		if (st != LOOM_OK)
			return be_fail(p, st);
	}
	return LOOM_OK;
}

void loom_exec_free(loom_exec *x)
{
	free(x->kept);
	free(x->mark_work);
	free(x->pending);
	free(x->pending_span);
	free(x->spans);
	memset(x, 0, sizeof(*x));
}

/* The collective ended (seen by the host): its span, if it waits for an end. */
static void seen_complete(loom_program *p, int k)
{
	int i = p->exec->pending_span[k];
	if (i >= 0 && p->exec->spans[i].t1 < 0)
		p->exec->spans[i].t1 = timer(p, LOOM_STREAM_COMPUTE);
	p->exec->pending_span[k] = -1;
}

/* Whether collective k may start now: a group, a known bucket, none of its
 * own still in flight, and (device wait) no failure the watchdog saw. */
static loom_status coll_check(loom_program *p, const loom_step *s, int k)
{
	const loom_plan *pl = &p->plan;
	loom_status st;
	if (!pl->comm || k < 0 || k >= n_colls(pl))
		return loom_program_fail(p, LOOM_ERR_STATE, "%s of bucket %d: no process group",
					 loom_coll_name(s->coll), k);
	if (p->exec->pending[k])
		return loom_program_fail(p, LOOM_ERR_STATE,
					 "%s of bucket %d started before the last one ended",
					 loom_coll_name(s->coll), k);
	/* A collective the watchdog saw fail ends the run at the next one. */
	if (p->exec->device_wait && (st = loom_comm_watch_status(pl->comm)) != LOOM_OK)
		return comm_fail(p, st);
	return LOOM_OK;
}

/* A gather: this rank's shard copied into its place in the gathered value
 * gt->v, which *buf becomes. */
static loom_status coll_gather_in(loom_program *p, const loom_gather *gt, const loom_bucket *b,
				  size_t shard, void **buf)
{
	const loom_plan *pl = &p->plan;
	*buf = loom_arena_ptr(&p->arena, pl, gt->v);
	loom_status st = p->be->copy(p->be_ctx, (unsigned char *)*buf + shard * (size_t)pl->rank *
						 loom_dtype_size(b->dtype),
				     (gt->src_bucket ? p->arena.bucket : p->arena.state) + gt->src_off,
				     shard * loom_dtype_size(b->dtype));
	return st != LOOM_OK ? be_fail(p, st) : LOOM_OK;
}

/* Under capture: the progress mark of this start (its index in *mark),
 * whose work names it to the watchdog after each launch; eager runs keep
 * kept[k] and no mark (-1). */
static loom_status coll_mark(loom_program *p, const loom_step *s, int k, int *mark)
{
	loom_exec *x = p->exec;
	*mark = -1;
	if (!x->capturing)
		return LOOM_OK;
	if (!x->marks || x->n_marked >= x->n_marks || !x->mark_work[x->n_marked])
		return loom_program_fail(p, LOOM_ERR_UNSUPPORTED,
					 "%s of bucket %d under capture: no progress mark "
					 "for the watchdog to read", loom_coll_name(s->coll), k);
	*mark = x->n_marked++;
	x->pending[k] = x->mark_work[*mark];
	return LOOM_OK;
}

/* The communicator's start of s's collective over buf on stream. */
static loom_status coll_launch(loom_program *p, const loom_step *s, const loom_bucket *b,
			       void *buf, size_t shard, void *stream, loom_comm_work **work)
{
	loom_comm *comm = p->plan.comm;
	switch (s->coll) {
	case LOOM_COLL_ALLREDUCE:
		return loom_comm_allreduce_start(comm, buf, (size_t)b->count, b->dtype, stream, work);
	case LOOM_COLL_REDUCE_SCATTER:
		return loom_comm_reduce_scatter_start(comm, buf, shard, b->dtype, stream, work);
	case LOOM_COLL_ALLGATHER:
		return loom_comm_allgather_start(comm, buf, shard, b->dtype, stream, work);
	default:
		return LOOM_ERR_UNSUPPORTED;
	}
}

static loom_status coll_start(loom_program *p, const loom_step *s)
{
	const loom_plan *pl = &p->plan;
	loom_exec *x = p->exec;
	int k = s->index, mark;
	loom_status st;
	if ((st = coll_check(p, s, k)) != LOOM_OK)
		return st;
	if (s->coll != LOOM_COLL_ALLREDUCE && s->coll != LOOM_COLL_REDUCE_SCATTER &&
	    s->coll != LOOM_COLL_ALLGATHER)
		return loom_program_fail(p, LOOM_ERR_UNSUPPORTED, "executor: no %s step on buckets",
					 loom_coll_name(s->coll));
	const loom_gather *gt = k >= pl->buckets.n ? &pl->gathers[k - pl->buckets.n] : NULL;
	const loom_bucket *b = &pl->buckets.b[gt ? gt->bucket : k];
	void *buf = p->arena.bucket + b->base;
	size_t shard = (size_t)b->count / (size_t)pl->world;
	if (gt && (st = coll_gather_in(p, gt, b, shard, &buf)) != LOOM_OK)
		return st;
	/* The communication stream starts after the compute stream's work so
	 * far (the bucket's last gradient, or the optimizer's update). */
	if ((st = p->be->event_record(p->be_ctx, EV_COLL_START, LOOM_STREAM_COMPUTE)) != LOOM_OK ||
	    (st = p->be->event_wait(p->be_ctx, EV_COLL_START, LOOM_STREAM_COMM)) != LOOM_OK)
		return be_fail(p, st);
	int t0 = timer(p, LOOM_STREAM_COMM);
	void *stream = p->be->stream_handle(p->be_ctx, LOOM_STREAM_COMM);
	if (x->kept)
		x->pending[k] = x->kept[k]; /* reused; NULL: the start makes one */
	if ((st = coll_mark(p, s, k, &mark)) != LOOM_OK)
		return st;
	if ((st = coll_launch(p, s, b, buf, shard, stream, &x->pending[k])) != LOOM_OK) {
		x->pending[k] = NULL;
		return comm_fail(p, st);
	}
	x->n_pending++;
	/* Under capture, its progress mark after it, which the watchdog
	 * reads after each launch; then its end on the device, for a WAIT of
	 * it alone (which so waits for the mark too: the capture joins it). */
	if (mark >= 0 &&
	    (st = p->be->marks->mark_record(p->be_ctx, mark, LOOM_STREAM_COMM)) != LOOM_OK)
		return be_fail(p, st);
	if (x->device_wait &&
	    (st = p->be->event_record(p->be_ctx, EV_COLL_ONE + k % EV_COLL_ONES, LOOM_STREAM_COMM)) !=
		    LOOM_OK)
		return be_fail(p, st);
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
	loom_exec *x = p->exec;
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

/*
 * On the device: the compute stream waits for the communication stream
 * (whose later work each collective's end precedes), an event record and
 * an event wait, and the watchdog takes each work to wait for on the host,
 * within the group's timeout, while the step goes on. Nothing here waits.
 * only >= 0: that collective alone (the event recorded after its start),
 * the others stay in flight.
 */
static loom_status coll_wait_device(loom_program *p, int only)
{
	loom_exec *x = p->exec;
	loom_status st, first = LOOM_OK;
	if (only >= 0 && (only >= n_colls(&p->plan) || !x->pending[only]))
		return LOOM_OK; /* not in flight: nothing to wait for */
	int t0 = x->n_pending ? timer(p, LOOM_STREAM_COMPUTE) : -1;
	if (only >= 0)
		st = p->be->event_wait(p->be_ctx, EV_COLL_ONE + only % EV_COLL_ONES,
				       LOOM_STREAM_COMPUTE);
	else if ((st = p->be->event_record(p->be_ctx, EV_COLL_END, LOOM_STREAM_COMM)) == LOOM_OK)
		st = p->be->event_wait(p->be_ctx, EV_COLL_END, LOOM_STREAM_COMPUTE);
	if (st != LOOM_OK)
		return be_fail(p, st);
	for (int k = 0; k < n_colls(&p->plan) && x->n_pending; k++) {
		if (!x->pending[k] || (only >= 0 && k != only))
			continue;
		/* While the step is recorded nothing runs: there is nothing to
		 * watch (and its events are the capture's; its mark is watched
		 * after each launch). */
		st = x->capturing ? LOOM_OK : loom_comm_watch(p->plan.comm, x->pending[k]);
		x->pending[k] = NULL;
		x->pending_span[k] = -1; /* its end is the timer after it */
		x->n_pending--;
		if (st != LOOM_OK && first == LOOM_OK)
			first = comm_fail(p, st);
	}
	if (t0 >= 0)
		span(p, LOOM_SPAN_WAIT, 0, 0, t0, timer(p, LOOM_STREAM_COMPUTE));
	return first;
}

/* Every collective in flight ends (the group's timeout applies); only >= 0:
 * that one. */
static loom_status coll_wait(loom_program *p, int only)
{
	loom_exec *x = p->exec;
	loom_status first = LOOM_OK;
	if (x->device_wait)
		return coll_wait_device(p, only);
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

void loom_exec_drain(loom_program *p)
{
	if (p->exec->n_pending)
		(void)coll_wait(p, -1);
	if (p->exec->device_wait) {
		/* The watchdog lets go of the works before they are freed. */
		(void)loom_comm_watch_drain(p->plan.comm);
		for (int k = 0; k < n_colls(&p->plan); k++)
			loom_comm_work_free(p->plan.comm, p->exec->kept[k]);
		for (int m = 0; p->exec->mark_work && m < p->exec->n_marks; m++)
			loom_comm_work_free(p->plan.comm, p->exec->mark_work[m]);
		p->exec->n_marked = 0;
		p->exec->device_wait = 0;
	}
	if (p->transport)
		p->transport->drop(p);
}

loom_status loom_exec_synchronize(loom_program *p)
{
	loom_status st = coll_wait(p, -1);
	if (st == LOOM_OK && p->transport)
		st = p->transport->finish(p);
	if (st != LOOM_OK)
		return st;
	if ((st = p->be->synchronize(p->be_ctx, &p->plan, &p->ts)) != LOOM_OK)
		return be_fail(p, st);
	/* The device is idle: the watchdog's works have ended, or failed (a
	 * timeout aborted the communicator, which let the device go on). */
	if (p->exec->device_wait && (st = loom_comm_watch_drain(p->plan.comm)) != LOOM_OK)
		return comm_fail(p, st);
	return LOOM_OK;
}

/* ------------------------------------------------------------ steps */

/* The node, then the values it makes besides its own: those the backend's
 * call for the node wrote already, the others by their own entries now. */
static loom_status exec_node(loom_program *p, const loom_step *s, int diagnose)
{
	const loom_plan *pl = &p->plan;
	const loom_backend *be = p->be;
	int (*makes_sibling)(void *, const loom_plan *, loom_value, loom_value) =
		be->planning ? be->planning->makes_sibling : NULL;
	loom_value v = s->v;
	loom_status st;
	int t0 = s->noop ? -1 : timer(p, LOOM_STREAM_COMPUTE);
	for (loom_value w = v; w != LOOM_NONE;
	     w = w == v ? loom_sibling_first(pl, v) : loom_sibling_next(pl, w)) {
		int run = w == v ? !s->noop : !makes_sibling || !makes_sibling(p->be_ctx, pl, v, w);
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
		fold = s->accum == LOOM_ACCUM_FOLD; /* a micro-batch of a MICRO-step plan */
	else if (!(flags & (LOOM_EXEC_ACCUMULATE | LOOM_EXEC_FOLD)))
		return LOOM_OK;
	/* loom_program_accum_ready refused a backend without the group. */
	if (!p->be->accumulate)
		return loom_program_fail(p, LOOM_ERR_UNSUPPORTED,
					 "run: gradient accumulation is not implemented on the %s "
					 "backend", p->be->name);
	int t0 = timer(p, LOOM_STREAM_COMPUTE);
	loom_status st = p->be->accumulate->accum(p->be_ctx, &p->plan, &p->arena, s->index, fold);
	if (st != LOOM_OK)
		return be_fail(p, st);
	span(p, LOOM_SPAN_ACCUM, s->index, fold, t0, timer(p, LOOM_STREAM_COMPUTE));
	return LOOM_OK;
}

/* Whether fp8's per-tensor state lives on the device (loom_backend_fp8):
 * under either recipe where the backend keeps it (under current scaling
 * for the report alone: the casts take their scales from their amaxes). */
static int fp8_on_device(const loom_program *p)
{
	return p->be->fp8 && p->ts.fp8.n > 0;
}

/* Whether the device communicator max-reduces and sums in stream order. */
static int fp8_device_reduces(const loom_program *p)
{
	loom_comm *dev = loom_pg_comm_if(p->plan.opts.pg, LOOM_COMM_DEVICE);
	return p->be->fp8->fp8_reduce_begin && dev && dev->i->allreduce_max_ordered &&
	       dev->i->allreduce_ordered;
}

/*
 * The step end of a device's copy (loom_backend_fp8): the step's amaxes
 * max-reduced and counts summed over the whole group on the device
 * communicator in the compute stream's order (under delayed scaling
 * compile made sure it has a max; under current scaling, whose scales
 * need no other rank's, a communicator without one leaves each rank its
 * own figures), then the update, all queued in the step (a captured step
 * holds it); ts.fp8 is read back only by the host view
 * (loom_exec_fp8_host).
 */
static loom_status fp8_step_end_device(loom_program *p, int n, int world)
{
	const loom_backend_fp8 *f = p->be->fp8;
	void *amax = NULL, *sat = NULL;
	loom_status st;
	if (world > 1 && !p->ts.fp8.delayed && !fp8_device_reduces(p))
		world = 1;
	if (world > 1) {
		loom_comm *dev = loom_pg_comm(p->plan.opts.pg, LOOM_COMM_DEVICE);
		void *stream = p->be->stream_handle(p->be_ctx, LOOM_STREAM_COMPUTE);
		if (!dev || !f->fp8_reduce_begin)
			return loom_program_fail(p, LOOM_ERR_UNSUPPORTED,
						 "fp8 scales across the ranks: no device reduction");
		if ((st = f->fp8_reduce_begin(p->be_ctx, &amax, &sat)) != LOOM_OK)
			return be_fail(p, st);
		if ((st = loom_comm_allreduce_max_ordered(dev, amax, (size_t)n, LOOM_F32, stream)) !=
			    LOOM_OK ||
		    (st = loom_comm_allreduce_ordered(dev, sat, (size_t)n, LOOM_F64, stream)) != LOOM_OK)
			return comm_fail(p, st);
	}
	st = f->fp8_step_end(p->be_ctx, &p->plan, world > 1);
	return st != LOOM_OK ? be_fail(p, st) : LOOM_OK;
}

/*
 * amp.fp8's step end, beside the loss scaler's update in the optimizer:
 * the step's amaxes max-reduced and saturation counts summed over the
 * ranks of the group (in rank order, on the host communicator, as ZeRO's
 * verdict and norm; a pipeline's stages each fill their own tensors), so
 * that every rank casts the next step alike, then each tensor's
 * history and scale (amp/fp8_scaling.h). On the host: the CPU kernels
 * record there.
 */
static loom_status fp8_step_end(loom_program *p)
{
	loom_fp8_state *fs = &p->ts.fp8;
	const loom_pg_info *pi = p->plan.opts.pg ? loom_pg_get_info(p->plan.opts.pg) : NULL;
	/* the whole group: pipeline stages hold different tensors */
	int n = fs->n, world = pi && pi->world > 1 ? pi->world : 1;
	if (n == 0)
		return LOOM_OK;
	if (fp8_on_device(p))
		return fp8_step_end_device(p, n, world);
	if (world > 1) {
		loom_comm *host = loom_pg_comm(p->plan.opts.pg, LOOM_COMM_HOST);
		double *mine = malloc(sizeof(double) * 2 * (size_t)n);
		double *all = malloc(sizeof(double) * 2 * (size_t)n * (size_t)world);
		loom_status st = !mine || !all ? LOOM_ERR_NOMEM : !host ? LOOM_ERR_UNSUPPORTED : LOOM_OK;
		for (int i = 0; st == LOOM_OK && i < n; i++) {
			mine[2 * i] = fs->t[i].amax;
			mine[2 * i + 1] = (double)fs->t[i].saturated;
		}
		if (st == LOOM_OK)
			st = loom_comm_allgather(host, mine, sizeof(double) * 2 * (size_t)n, all);
		for (int i = 0; st == LOOM_OK && i < n; i++) {
			double amax = 0, sat = 0;
			for (int r = 0; r < world; r++) {
				const double *x = all + (size_t)r * 2 * (size_t)n + 2 * (size_t)i;
				amax = x[0] > amax ? x[0] : amax;
				sat += x[1];
			}
			fs->t[i].amax = (float)amax;
			fs->t[i].saturated = (int64_t)sat;
		}
		free(mine);
		free(all);
		if (st != LOOM_OK)
			return loom_program_fail(p, st, "fp8 scales across the ranks: %s",
						 st == LOOM_ERR_NOMEM ? "out of memory" :
						 loom_pg_error(p->plan.opts.pg));
	}
	loom_fp8_step_end(fs);
	return LOOM_OK;
}

/* After a copy of the fp8 state either way: host and device agree, or the
 * backend's error. */
static loom_status fp8_copied(loom_program *p, loom_status st)
{
	if (st != LOOM_OK)
		return be_fail(p, st);
	p->exec->fp8_on_device_newer = 0;
	return LOOM_OK;
}

loom_status loom_exec_fp8_host(loom_program *p)
{
	if (!p->exec->fp8_on_device_newer)
		return LOOM_OK;
	return fp8_copied(p, p->be->fp8->fp8_download(p->be_ctx, &p->ts.fp8));
}

loom_status loom_exec_fp8_device(loom_program *p)
{
	if (!fp8_on_device(p))
		return LOOM_OK;
	return fp8_copied(p, p->be->fp8->fp8_upload(p->be_ctx, &p->ts.fp8));
}

static loom_status exec_optim(loom_program *p, const loom_step *s)
{
	int finite = -1;
	loom_status st;
	/* Ranks that each hold some of the gradients (p->shards, set by the
	 * strategy's pass): the verdict and the norm across them. */
	const loom_shards *sh = p->shards;
	if (sh && p->plan.scaling && (st = sh->verdict(p, s, &finite)) != LOOM_OK)
		return st;
	/* A skipped step (an overflow on any rank) takes no norm; with the
	 * verdict on the device, the norm is taken whatever it says (the
	 * update then ignores it on a skipped step). */
	if (sh && sh->norm && p->plan.opts.optim.clip_grad > 0 && finite != 0 &&
	    (st = sh->norm(p, s)) != LOOM_OK)
		return st;
	st = p->be->optim(p->be_ctx, &p->plan, &p->arena, &p->ts, s->first, s->last, finite);
	return st != LOOM_OK ? be_fail(p, st) : fp8_step_end(p);
}

/* A COPY step: bucket k holds every rank's updated parameters, gathered: each
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

static loom_status exec_step(loom_program *p, const loom_step *s, int i, unsigned flags, int diagnose)
{
	switch (s->kind) {
	case LOOM_STEP_NODE:
		return exec_node(p, s, diagnose);
	case LOOM_STEP_ACCUM:
		return exec_accum(p, s, flags);
	case LOOM_STEP_COLLECTIVE:
		/* Gradient accumulation (no_sync): nothing is sent; the plan's
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
	case LOOM_STEP_RECV:
	case LOOM_STEP_MICRO:
		if (p->transport)
			return p->transport->step(p, s, i);
		/* fall through */
	default:
		return loom_program_fail(p, LOOM_ERR_UNSUPPORTED, "executor: no %s steps yet",
					 loom_step_kind_name(s->kind));
	}
}

/* ------------------------------------------------------------ the step as a graph */

/* Why a step with collectives cannot be captured, or NULL: the host must
 * see each one end after every launch, through a progress mark the device
 * writes after it (which needs a stream-ordered communicator that waits on
 * marks and a backend that writes them). */
static const char *colls_no_graph(const loom_program *p)
{
	const loom_plan *pl = &p->plan;
	if (!loom_opt_bool(LOOM_OPT_CUDA_GRAPH_RANKS))
		return "off (LOOM_CUDA_GRAPH_RANKS=0)";
	if (!pl->comm)
		return "no communicator";
	if (pl->comm->i->no_graph)
		return pl->comm->i->no_graph;
	if (!(p->be->caps & LOOM_BE_ASYNC_STREAMS) || !loom_comm_stream_ordered(pl->comm))
		return "its collectives end on the host (a replayed step gives the host no turn)";
	if (!p->be->marks)
		return "the backend writes no progress marks for the watchdog";
	if (!loom_comm_has_marks(pl->comm))
		return "the communicator cannot wait for a progress mark";
	return NULL;
}

/* Whether p's training steps may run as one graph; else why not, in why.
 * Decided once, at the first run. */
static int graph_allowed(const loom_program *p, char *why, size_t len)
{
	const loom_plan *pl = &p->plan;
	*why = 0;
	if (!p->be->graph)
		return snprintf(why, len, "the %s backend records no graphs", p->be->name), 0;
	if (!pl->opts.cuda_graph)
		return snprintf(why, len, "off (--no-cuda-graph)"), 0;
	if (!loom_opt_bool(LOOM_OPT_CUDA_GRAPH))
		return snprintf(why, len, "off (LOOM_CUDA_GRAPH=0)"), 0;
	if (p->transport)
		return snprintf(why, len, "%s", p->transport->no_graph), 0;
	if (p->ts.trace)
		return snprintf(why, len, "the trace reads a timer around every node"), 0;
	const char *w = (pl->world > 1 || n_colls(pl) > 0) ? colls_no_graph(p) : NULL;
	if (w)
		return snprintf(why, len, "data parallel over %d rank%s: %s", pl->world,
				pl->world == 1 ? "" : "s", w), 0;
	w = p->shards && p->shards->no_graph ? p->shards->no_graph(p) : NULL;
	if (w)
		return snprintf(why, len, "%s", w), 0;
	return 1;
}

/* A run that is one whole training step, as the graph holds it. */
static int graph_step(const loom_program *p, int first, int last, unsigned flags)
{
	return p->exec->graph > 0 && first == 0 && last == p->plan.n_steps &&
	       flags == LOOM_EXEC_TRAIN && !p->ts.trace;
}

static void graph_off(loom_program *p, const char *fmt, const char *what)
{
	p->exec->graph = -1;
	snprintf(p->exec->graph_note, sizeof(p->exec->graph_note), fmt, what);
	loom_log("loom: cuda graph: %s; steps run eagerly", p->exec->graph_note);
}

/* The launch just queued (capture_end's run or a replay): each collective
 * of the captured step to the watchdog, as "its mark reaches this
 * launch's serial", with the group's timeout from now. */
static loom_status watch_marks(loom_program *p)
{
	loom_exec *x = p->exec;
	loom_status first = LOOM_OK;
	if (!x->n_marked)
		return LOOM_OK;
	uint64_t serial = p->be->marks->mark_serial(p->be_ctx);
	for (int m = 0; m < x->n_marked; m++) {
		loom_status st =
			loom_comm_watch_mark(p->plan.comm, x->mark_work[m], &x->marks[m], serial);
		x->mark_handed++;
		if (st != LOOM_OK && first == LOOM_OK)
			first = comm_fail(p, st);
	}
	return first;
}

/* A run on a backend that keeps fp8's state on the device: from now
 * ts.fp8 is older than the device's copy (loom_exec_fp8_host). */
static void fp8_device_runs(loom_program *p)
{
	if (fp8_on_device(p))
		p->exec->fp8_on_device_newer = 1;
}

/* A replayed step: the host's changes pushed (run_begin), one launch, its
 * collectives handed to the watchdog by mark. The watchdog's verdict on
 * earlier collectives still ends the run. */
static loom_status graph_replay(loom_program *p)
{
	const loom_plan *pl = &p->plan;
	const loom_backend *be = p->be;
	loom_status st;
	if (p->exec->device_wait && (st = loom_comm_watch_status(pl->comm)) != LOOM_OK)
		return comm_fail(p, st);
	if ((st = be->run_begin(p->be_ctx, pl, &p->arena, &p->ts,
				LOOM_EXEC_TRAIN | LOOM_EXEC_REPLAY)) != LOOM_OK ||
	    (st = be->graph->replay(p->be_ctx, pl)) != LOOM_OK)
		return be_fail(p, st);
	fp8_device_runs(p);
	loom_status watched = watch_marks(p);
	if ((st = be->run_end(p->be_ctx, pl, &p->arena, &p->ts)) != LOOM_OK)
		return be_fail(p, st);
	p->exec->graph_runs++;
	return watched;
}

static loom_status exec_walk(loom_program *p, int first, int last, unsigned flags, int capture);
static loom_status walk_steps(loom_program *p, int first, int last, unsigned flags);

loom_status loom_exec_run(loom_program *p, int first, int last, unsigned flags)
{
	loom_exec *x = p->exec;
	loom_status st;
	if (x->graph == 0) {
		char why[128];
		x->graph = graph_allowed(p, why, sizeof(why)) ? 1 : -1;
		snprintf(x->graph_note, sizeof(x->graph_note), "%s", why);
		/* Said once, where a backend could have captured. */
		if (x->graph < 0 && p->be->graph && p->plan.opts.cuda_graph)
			loom_log("loom: cuda graph: %s; steps run eagerly", why);
	}
	if (!graph_step(p, first, last, flags))
		return exec_walk(p, first, last, flags, 0);
	if (x->graph_runs >= 2)
		return graph_replay(p);
	if (x->graph_runs == 0) {
		/* The first step eager: lazy allocations and searches happen
		 * outside the capture. */
		if ((st = exec_walk(p, first, last, flags, 0)) == LOOM_OK)
			x->graph_runs++;
		return st;
	}
	x->captured = 0;
	st = exec_walk(p, first, last, flags, 1);
	if (st == LOOM_OK || x->captured) {
		x->graph_runs++;
		return st;
	}
	/* The capture failed: nothing of it ran. Say why once, and run the
	 * step eagerly from now on. */
	graph_off(p, "capture failed: %s", loom_program_error(p));
	loom_error_clear(&p->err);
	return exec_walk(p, first, last, flags, 0);
}

static loom_status exec_walk(loom_program *p, int first, int last, unsigned flags, int capture)
{
	const loom_plan *pl = &p->plan;
	const loom_backend *be = p->be;
	loom_status st;
	if ((st = exec_alloc(p)) != LOOM_OK)
		return st;
	if (p->transport)
		p->transport->run_begin(p, first, last);
	if ((st = be->run_begin(p->be_ctx, pl, &p->arena, &p->ts, flags)) != LOOM_OK)
		return be_fail(p, st);
	fp8_device_runs(p);
	/* Recorded from here to run_end, outside of run_begin's pushes. */
	if (capture) {
		if ((st = be->graph->capture_begin(p->be_ctx, pl)) != LOOM_OK)
			return be_fail(p, st);
		loom_exec *x = p->exec;
		x->n_marked = 0;
		x->capturing = 1;
		st = walk_steps(p, first, last, flags);
		/* The communication stream's tail (a mark no WAIT covered)
		 * joins the compute stream: a capture ends with every stream
		 * it forked joined. */
		if (st == LOOM_OK && x->device_wait &&
		    ((st = be->event_record(p->be_ctx, EV_COLL_END, LOOM_STREAM_COMM)) != LOOM_OK ||
		     (st = be->event_wait(p->be_ctx, EV_COLL_END, LOOM_STREAM_COMPUTE)) != LOOM_OK))
			st = be_fail(p, st);
		x->capturing = 0;
		/* Collectives the step left in flight are the graph's: their
		 * marks are watched after each launch, never their events. */
		for (int k = 0; x->pending && k < n_colls(pl); k++)
			x->pending[k] = NULL, x->pending_span[k] = -1;
		x->n_pending = 0;
		loom_status end = be->run_end(p->be_ctx, pl, &p->arena, &p->ts);
		if (st != LOOM_OK || end != LOOM_OK) {
			(void)be->graph->capture_end(p->be_ctx, pl, 0);
			x->n_marked = 0;
			return st != LOOM_OK ? st : be_fail(p, end);
		}
		if ((st = be->graph->capture_end(p->be_ctx, pl, 1)) != LOOM_OK) {
			x->n_marked = 0;
			return be_fail(p, st);
		}
		/* capture_end ran the step once: its collectives, watched (a
		 * failure here is the communicator's, not the capture's). */
		x->captured = 1;
		return watch_marks(p);
	}
	if ((st = walk_steps(p, first, last, flags)) != LOOM_OK)
		return st;
	if ((st = be->run_end(p->be_ctx, pl, &p->arena, &p->ts)) != LOOM_OK)
		return be_fail(p, st);
	return LOOM_OK;
}

/* Steps [first, last), between run_begin and run_end. */
static loom_status walk_steps(loom_program *p, int first, int last, unsigned flags)
{
	const loom_plan *pl = &p->plan;
	const loom_backend *be = p->be;
	loom_status st;
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
		if (p->transport && (st = p->transport->before_step(p, i)) != LOOM_OK)
			return st;
		if ((st = exec_step(p, s, i, flags, diagnose)) != LOOM_OK)
			return st;
		if (s->kind == LOOM_STEP_NODE && host_progress && p->exec->n_pending &&
		    (st = coll_progress(p)) != LOOM_OK)
			return st;
		if (s->kind == LOOM_STEP_NODE && p->transport &&
		    (st = p->transport->progress(p)) != LOOM_OK)
			return st;
	}
	if (phase >= 0)
		span(p, LOOM_SPAN_PHASE, phase, 0, phase_t0, timer(p, LOOM_STREAM_COMPUTE));
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
