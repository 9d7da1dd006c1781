/*
 * parallel/pipeline_schedule.c — the pipeline's steps: this stage's nodes
 * for M micro-batches laid out as one fixed list, each micro-batch's
 * forward (receive the values an earlier stage made, run, send what a later
 * stage reads) and backward (the same for gradients, backwards), in GPipe's
 * or 1F1B's order, each gradient accumulated after its micro-batch's
 * backward, then the optimizer over this stage's parameters once; where
 * each receive may be posted early; the values kept per micro-batch.
 * Activations of the micro-batches in flight live in slots of the
 * activation region (LOOM_STEP_MICRO, run by pipeline_transport.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "parallel/parallel.h"
#include "parallel/pipeline.h"
#include "parallel/pipeline_internal.h"
#include "base/elem.h"
#include "graph/ops/ops.h"

/* ------------------------------------------------------------ steps */

/* The steps one micro-batch's forward or backward runs on stage s, in
 * plan order: [first, last) of the plain list, its nodes whose stage is
 * s, with the receives before a value's first reader and the sends after
 * its maker. */
typedef struct seq {
	loom_step *st;
	int n, cap;
} seq;

static int seq_push(seq *q, loom_step s)
{
	if (q->n == q->cap) {
		int cap = q->cap ? 2 * q->cap : 64;
		loom_step *n = realloc(q->st, sizeof(*n) * (size_t)cap);
		if (!n)
			return -1;
		q->st = n;
		q->cap = cap;
	}
	q->st[q->n++] = s;
	return 0;
}

static int rank_of(const loom_pipe *pp, int stage)
{
	return pp->replica * pp->stages + stage;
}

/* The values node v's kernel reads: its sources and its siblings'. */
static int reads(const loom_plan *pl, loom_value v, loom_value u)
{
	for (loom_value w = v; w != LOOM_NONE;
	     w = w == v ? loom_sibling_first(pl, v) : loom_sibling_next(pl, w)) {
		const loom_node *n = &pl->g->nodes[w];
		for (int i = 0; i < n->nsrc; i++)
			if (n->src[i] == u)
				return 1;
	}
	return 0;
}

/* Whether stage s has a node that reads u. */
static int stage_reads(const loom_plan *pl, const loom_pipe *pp, int s, loom_value u)
{
	for (loom_value v = 0; v < pl->g->n; v++)
		if (pp->stage_of[v] == s && !loom_made_earlier(pl, v) && reads(pl, v, u))
			return 1;
	return 0;
}

static loom_step xfer(loom_step_kind kind, loom_phase ph, loom_value u, int peer)
{
	return (loom_step){ .kind = kind, .phase = ph, .stream = LOOM_STREAM_COMM, .v = u,
			    .index = -1, .peer = peer };
}

/*
 * One pass (forward: [first, last) of the plain steps, values u <
 * n_fwd; backward: the rest) of stage me, as a template: micro-batch
 * fields are filled when it is laid out. Forward values of another
 * stage that only this stage's backward reads are received at the end
 * of the forward, where they are still live in the plan.
 */
static loom_status make_pass(const loom_plan *pl, const loom_pipe *pp, int fwd, seq *q)
{
	const loom_graph *g = pl->g;
	int me = pp->stage, lo = fwd ? 0 : pl->n_fwd_steps, hi = fwd ? pl->n_fwd_steps : pl->n_grad_steps;
	loom_phase ph = fwd ? LOOM_PHASE_FORWARD : LOOM_PHASE_BACKWARD;
	unsigned char *got = calloc((size_t)g->n, 1);
	if (!got)
		return LOOM_ERR_NOMEM;
	for (int i = lo; i < hi; i++) {
		const loom_step *s = &pl->steps[i];
		/* this stage's accumulation and bucket collectives, in place */
		if ((s->kind == LOOM_STEP_ACCUM || s->kind == LOOM_STEP_COLLECTIVE) &&
		    pp->stage_of[s->v] == me) {
			if (seq_push(q, *s))
				goto nomem;
			continue;
		}
		if (s->kind != LOOM_STEP_NODE || pp->stage_of[s->v] != me)
			continue;
		/* receives: values of other stages this node's kernel reads */
		for (loom_value w = s->v; w != LOOM_NONE;
		     w = w == s->v ? loom_sibling_first(pl, s->v) : loom_sibling_next(pl, w)) {
			const loom_node *n = &g->nodes[w];
			for (int k = 0; k < n->nsrc; k++) {
				loom_value u = n->src[k];
				if (u < 0 || got[u] || pp->stage_of[u] < 0 || pp->stage_of[u] == me)
					continue;
				/* a forward value read in backward came with the forward */
				if (!fwd && u < pl->n_fwd)
					continue;
				got[u] = 1;
				if (seq_push(q, xfer(LOOM_STEP_RECV, ph, u, rank_of(pp, pp->stage_of[u]))))
					goto nomem;
			}
		}
		if (seq_push(q, *s))
			goto nomem;
		/* sends: what it makes that other stages read, in their pass */
		for (loom_value w = s->v; w != LOOM_NONE;
		     w = w == s->v ? loom_sibling_first(pl, s->v) : loom_sibling_next(pl, w))
			for (int t = 0; t < pp->stages; t++)
				if (t != me && stage_reads(pl, pp, t, w) &&
				    seq_push(q, xfer(LOOM_STEP_SEND, ph, w, rank_of(pp, t))))
					goto nomem;
	}
	/* Forward values of earlier stages that only this stage's backward reads. */
	for (loom_value u = 0; fwd && u < pl->n_fwd; u++)
		if (!got[u] && pp->stage_of[u] >= 0 && pp->stage_of[u] != me &&
		    stage_reads(pl, pp, me, u) &&
		    seq_push(q, xfer(LOOM_STEP_RECV, ph, u, rank_of(pp, pp->stage_of[u]))))
			goto nomem;
	free(got);
	return LOOM_OK;
nomem:
	free(got);
	return LOOM_ERR_NOMEM;
}

/* The forward the sending stage makes for a value read by a later stage's
 * backward only must come at the end of the sender's forward too: make_pass
 * sends after the maker, which is earlier; both sides keep plan order per
 * direction and MPI matches by tag, so the order between values is free. */

enum { MICRO_FWD = 0, MICRO_FWD_END, MICRO_BWD };

/* One micro-batch's pass into the list. The buckets' collectives run
 * after the last micro-batch's accumulation only (DDP's no_sync before). */
static loom_status lay(seq *out, const seq *tpl, int micro, int slot, int phase_kind, int accum)
{
	int last = accum != LOOM_ACCUM_ADD;
	loom_phase ph = phase_kind == MICRO_BWD ? LOOM_PHASE_BACKWARD : LOOM_PHASE_FORWARD;
	loom_step m = { .kind = LOOM_STEP_MICRO, .phase = ph, .stream = LOOM_STREAM_COMPUTE,
			.v = LOOM_NONE, .index = phase_kind, .micro = micro, .first = slot };
	if (seq_push(out, m))
		return LOOM_ERR_NOMEM;
	for (int i = 0; i < tpl->n; i++) {
		loom_step s = tpl->st[i];
		s.micro = micro;
		s.first = slot;
		if (s.kind == LOOM_STEP_ACCUM)
			s.accum = accum;
		if (s.kind == LOOM_STEP_COLLECTIVE && !last)
			continue;
		if (seq_push(out, s))
			return LOOM_ERR_NOMEM;
	}
	if (phase_kind == MICRO_FWD) {
		m.index = MICRO_FWD_END;
		if (seq_push(out, m))
			return LOOM_ERR_NOMEM;
	}
	return LOOM_OK;
}

/* The micro-batches this stage holds at once under the schedule. */
int loom_pipe_in_flight(int schedule, int stages, int stage, int m)
{
	if (schedule == LOOM_SCHEDULE_GPIPE)
		return m;
	return stages - stage < m ? stages - stage : m;
}

static loom_status build_schedule(loom_plan *pl, loom_pipe *pp, const seq *F, const seq *B)
{
	seq out = { 0 };
	int M = pp->micro, slots = pp->slots;
	loom_status st = LOOM_OK;
	/* EVAL: every micro-batch's forward. */
	for (int j = 0; j < M && !st; j++)
		st = lay(&out, F, j, j % slots, MICRO_FWD, 0);
	pp->eval_steps = out.n;
	/* TRAIN: the backwards in micro-batch order, each accumulated; the
	 * last folds the sums into the gradients, as one process's TRAIN
	 * after M - 1 ACCUMULATE runs does. */
#define BWD(j) lay(&out, B, (j), (j) % slots, MICRO_BWD, \
		   M == 1 ? LOOM_ACCUM_BY_RUN : (j) == M - 1 ? LOOM_ACCUM_FOLD : LOOM_ACCUM_ADD)
	if (pp->schedule == LOOM_SCHEDULE_GPIPE) {
		for (int j = 0; j < M && !st; j++)
			st = lay(&out, F, j, j % slots, MICRO_FWD, 0);
		for (int j = 0; j < M && !st; j++)
			st = BWD(j);
	} else {
		int w = pp->stages - pp->stage - 1;
		if (w > M)
			w = M;
		for (int j = 0; j < w && !st; j++)
			st = lay(&out, F, j, j % slots, MICRO_FWD, 0);
		for (int i = 0; i < M - w && !st; i++) {
			st = lay(&out, F, w + i, (w + i) % slots, MICRO_FWD, 0);
			if (!st)
				st = BWD(i);
		}
		for (int j = M - w; j < M && !st; j++)
			st = BWD(j);
	}
#undef BWD
	if (!st && pl->buckets.n > 0) {
		loom_step w = { .kind = LOOM_STEP_WAIT, .phase = LOOM_PHASE_OPTIMIZER,
				.stream = LOOM_STREAM_COMPUTE, .v = LOOM_NONE, .index = -1 };
		if (seq_push(&out, w))
			st = LOOM_ERR_NOMEM;
	}
	if (!st && pl->opts.optim.kind != LOOM_OPTIM_NONE) {
		loom_step o = { .kind = LOOM_STEP_OPTIM, .phase = LOOM_PHASE_OPTIMIZER,
				.stream = LOOM_STREAM_COMPUTE, .v = LOOM_NONE, .index = -1,
				.first = 0, .last = pl->n_pieces };
		if (seq_push(&out, o))
			st = LOOM_ERR_NOMEM;
	}
	if (st) {
		free(out.st);
		return st;
	}
	free(pl->steps);
	pl->steps = out.st;
	pl->n_steps = out.n;
	pl->n_fwd_steps = pp->eval_steps;
	pl->n_grad_steps = out.n - (pl->opts.optim.kind != LOOM_OPTIM_NONE) - (pl->buckets.n > 0);
	return LOOM_OK;
}

/* ------------------------------------------------------------ early receives */

/*
 * Whether the receive of u must wait for its own step: u is no activation
 * owner of the slot (a value outside the slots is put back per micro-batch
 * by the MICRO steps; a view shares another value's bytes), or a value of
 * the micro-batch's own plan made before u and dead by u's birth shares
 * u's bytes (the planner reuses addresses by lifetime: a gradient received
 * in backward may lie where a forward value was, which this stage may still
 * read or send until it dies). Values made after u cannot share them: they
 * are born while u lives (until its last reader, which follows its receive).
 */
static int recv_aliased(const loom_plan *pl, loom_value u, const int *made_at)
{
	const loom_memplan *mp = &pl->mp;
	if (mp->root[u] != u || mp->region[u] != LOOM_REGION_ACT)
		return 1;
	size_t lo = mp->offset[u], hi = lo + loom_plan_value_bytes(pl, u);
	for (loom_value w = 0; w < pl->g->n; w++) {
		if (w == u || mp->root[w] != w || mp->region[w] != LOOM_REGION_ACT ||
		    !loom_plan_holds(pl, w) || made_at[w] >= made_at[u])
			continue;
		size_t wlo = mp->offset[w], whi = wlo + loom_plan_value_bytes(pl, w);
		if (wlo < hi && lo < whi)
			return 1;
	}
	return 0;
}

/* Where each value is made in the plan's schedule (a fused sibling where
 * its maker runs), as graph/memplan.c's lifetimes begin. */
static int *birth_positions(const loom_plan *pl)
{
	int n = pl->g->n;
	int *pos = malloc(sizeof(int) * (size_t)(n ? n : 1));
	int *made_at = malloc(sizeof(int) * (size_t)(n ? n : 1));
	if (!pos || !made_at) {
		free(pos);
		free(made_at);
		return NULL;
	}
	for (int i = 0; i < pl->mp.nschedule; i++)
		pos[pl->mp.schedule[i]] = i;
	for (loom_value v = 0; v < n; v++) {
		loom_value m = pl->g->nodes[v].made_by;
		made_at[v] = m != LOOM_NONE && pos[m] < pos[v] ? pos[m] : pos[v];
	}
	free(pos);
	return made_at;
}

/*
 * Each RECV step's post point: the step after the last step of the
 * micro-batch that held its activation slot before it in the same run
 * (the run's first step when none did), or its own step where aliasing
 * (recv_aliased) or the transport (a device communicator runs its sends
 * and receives in the order they were issued, so one posted early would
 * hold up the sends behind it) says so. Staged through a host buffer, a
 * receive writes the slot only at its step, so aliasing does not hold it
 * back (the slot point still bounds the buffers in flight). The executor
 * also waits, at run time, for that micro-batch's sends from the slot to
 * have ended before posting early into the slot. Also lists the receives
 * in step order (pp->recv_at).
 */
static loom_status post_points(loom_plan *pl, loom_pipe *pp)
{
	int S = pp->slots, n_recv = 0;
	for (int i = 0; i < pl->n_steps; i++)
		n_recv += pl->steps[i].kind == LOOM_STEP_RECV;
	int *made_at = birth_positions(pl);
	signed char *aliased = malloc(pl->g->n ? (size_t)pl->g->n : 1);
	int *owner = malloc(sizeof(int) * (size_t)S), *last = malloc(sizeof(int) * (size_t)S);
	int *free_at = malloc(sizeof(int) * (size_t)S);
	pp->recv_at = malloc(sizeof(int) * (size_t)(n_recv + 1));
	pp->recv_work = calloc((size_t)n_recv + 1, sizeof(*pp->recv_work));
	pp->recv_host = calloc((size_t)n_recv + 1, sizeof(*pp->recv_host));
	if (!made_at || !aliased || !owner || !last || !free_at || !pp->recv_at || !pp->recv_work ||
	    !pp->recv_host) {
		free(made_at);
		free(aliased);
		free(owner);
		free(last);
		free(free_at);
		return LOOM_ERR_NOMEM;
	}
	memset(aliased, -1, pl->g->n ? (size_t)pl->g->n : 1);
	pp->n_recv = 0;
	/* EVAL's run, then TRAIN's: a run starts with no receive in flight and
	 * every send of the one before it ended (loom_exec_synchronize). */
	int bounds[3] = { 0, pp->eval_steps, pl->n_steps };
	for (int r = 0; r < 2; r++) {
		for (int k = 0; k < S; k++) {
			owner[k] = -1;
			last[k] = -1;
			free_at[k] = bounds[r];
		}
		for (int i = bounds[r]; i < bounds[r + 1]; i++) {
			loom_step *s = &pl->steps[i];
			if (s->kind == LOOM_STEP_WAIT || s->kind == LOOM_STEP_OPTIM)
				continue; /* no micro-batch's, no slot's */
			int k = s->first;
			if (owner[k] != s->micro) {
				if (last[k] >= 0)
					free_at[k] = last[k] + 1;
				owner[k] = s->micro;
			}
			last[k] = i;
			if (s->kind != LOOM_STEP_RECV)
				continue;
			pp->recv_at[pp->n_recv++] = i;
			if (aliased[s->v] < 0)
				aliased[s->v] = (signed char)recv_aliased(pl, s->v, made_at);
			/* staged, it lands in a host buffer: its bytes in the slot
			 * are written at its step only */
			if (pp->xfer == LOOM_PIPE_XFER_DEVICE ||
			    (aliased[s->v] && pp->xfer != LOOM_PIPE_XFER_STAGED))
				s->post = i;
			else
				s->post = free_at[k];
		}
	}
	free(made_at);
	free(aliased);
	free(owner);
	free(last);
	free(free_at);
	return LOOM_OK;
}

/* This stage's parameters only: the optimizer updates what it owns. */
static loom_status own_pieces(loom_plan *pl, const loom_pipe *pp)
{
	int n = 0;
	for (int i = 0; i < pl->n_pieces; i++)
		if (pp->owner[pl->params[pl->pieces[i].slot].param] == pp->stage)
			pl->pieces[n++] = pl->pieces[i];
	pl->n_pieces = n;
	return LOOM_OK;
}

/* The values outside the activation region that change per micro-batch. */
static loom_status per_micro_values(loom_plan *pl, loom_pipe *pp)
{
	const loom_graph *g = pl->g;
	int n = 0;
	for (int pass = 0; pass < 2; pass++) {
		for (loom_value v = 0; v < pl->n_fwd; v++) {
			const loom_node *nd = &g->nodes[v];
			int input = nd->op == LOOM_OP_INPUT;
			int out = !loom_pipe_is_leaf(g, v) && pl->mp.region[v] == LOOM_REGION_PERSIST &&
				  (pp->stage_of[v] == pp->stage || stage_reads(pl, pp, pp->stage, v));
			if (!input && !out)
				continue;
			if (pass == 1) {
				pp->vals[n] = v;
				pp->is_input[n] = (unsigned char)input;
				pp->bytes[n] = loom_plan_value_bytes(pl, v);
				pp->host[n] = calloc((size_t)pp->micro, pp->bytes[n] ? pp->bytes[n] : 1);
				if (!pp->host[n])
					return LOOM_ERR_NOMEM;
			}
			n++;
		}
		if (pass == 0) {
			pp->n_vals = n;
			n = 0;
			pp->vals = calloc((size_t)pp->n_vals + 1, sizeof(*pp->vals));
			pp->is_input = calloc((size_t)pp->n_vals + 1, 1);
			pp->bytes = calloc((size_t)pp->n_vals + 1, sizeof(*pp->bytes));
			pp->host = calloc((size_t)pp->n_vals + 1, sizeof(*pp->host));
			if (!pp->vals || !pp->is_input || !pp->bytes || !pp->host)
				return LOOM_ERR_NOMEM;
		}
	}
	pp->loss = calloc((size_t)pp->micro, sizeof(double));
	return pp->loss ? LOOM_OK : LOOM_ERR_NOMEM;
}


/* Nodes a later pass added (a bucket's all-reduce): the stage of what they read. */
static loom_status stage_new_nodes(loom_plan *pl, loom_pipe *pp)
{
	int n = pl->g->n;
	if (n == pp->n_graph)
		return LOOM_OK;
	signed char *s = realloc(pp->stage_of, (size_t)n), *o = realloc(pp->owner, (size_t)n);
	if (s)
		pp->stage_of = s;
	if (o)
		pp->owner = o;
	if (!s || !o)
		return LOOM_ERR_NOMEM;
	for (loom_value v = pp->n_graph; v < n; v++) {
		const loom_node *nd = &pl->g->nodes[v];
		int st = loom_pipe_is_leaf(pl->g, v) ? -1 : 0;
		for (int i = 0; st >= 0 && i < nd->nsrc; i++)
			if (nd->src[i] >= 0 && pp->stage_of[nd->src[i]] > st)
				st = pp->stage_of[nd->src[i]];
		pp->stage_of[v] = (signed char)st;
		pp->owner[v] = st < 0 ? 0 : (signed char)st;
	}
	return LOOM_OK;
}

loom_status loom_pipeline_plan(loom_program *p, char *err, size_t errlen)
{
	loom_plan *pl = &p->plan;
	loom_pipe *pp = pl->pipe;
	loom_status st;
	if ((st = stage_new_nodes(pl, pp)) != LOOM_OK || (st = loom_pipe_stage_table(pl, pp)) != LOOM_OK)
		goto nomem;
	pp->slots = loom_pipe_in_flight(pp->schedule, pp->stages, pp->stage, pp->micro);
	seq F = { 0 }, B = { 0 };
	if ((st = make_pass(pl, pp, 1, &F)) || (st = make_pass(pl, pp, 0, &B)) ||
	    (st = own_pieces(pl, pp)) || (st = build_schedule(pl, pp, &F, &B)) ||
	    (st = post_points(pl, pp)) || (st = per_micro_values(pl, pp))) {
		free(F.st);
		free(B.st);
		goto nomem;
	}
	free(F.st);
	free(B.st);
	/* The slots: the stage's plan holds only its own activations. */
	pp->slot_bytes = loom_pipe_align64(pl->mp.act_bytes ? pl->mp.act_bytes : 64);
	pl->mp.act_bytes = pp->slot_bytes * (size_t)pp->slots;
	return LOOM_OK;
nomem:
	snprintf(err, errlen, "pipeline: out of memory");
	return LOOM_ERR_NOMEM;
}

