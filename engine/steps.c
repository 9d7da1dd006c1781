/*
 * engine/steps.c — the plan as an explicit list of steps, made once at
 * compile time from the memory plan's schedule: one step per node that
 * runs at its place (fused siblings run with their maker), a bucket's
 * ALLREDUCE node turned into its accumulation step and its collective on
 * the communication stream, per-gradient accumulation steps after backward
 * when there are no buckets, then the wait for the collectives and the
 * optimizer over its pieces. A strategy pass (parallel/zero.c) rewrites the
 * list; the executor (engine/exec.c) walks it.
 */
#include <stdlib.h>

#include "engine/program_internal.h"
#include "graph/ops/ops.h"

static const char *const step_names[LOOM_STEP_KIND_COUNT] = {
	[LOOM_STEP_NODE] = "node",       [LOOM_STEP_ACCUM] = "accum",
	[LOOM_STEP_COLLECTIVE] = "collective", [LOOM_STEP_WAIT] = "wait",
	[LOOM_STEP_OPTIM] = "optim",     [LOOM_STEP_COPY] = "copy",
	[LOOM_STEP_SEND] = "send",       [LOOM_STEP_RECV] = "recv",
	[LOOM_STEP_MICRO] = "micro",
};

static const char *const coll_names[LOOM_COLL_COUNT] = {
	[LOOM_COLL_ALLREDUCE] = "allreduce",
	[LOOM_COLL_REDUCE_SCATTER] = "reduce-scatter",
	[LOOM_COLL_ALLGATHER] = "all-gather",
	[LOOM_COLL_BROADCAST] = "broadcast",
};

const char *loom_step_kind_name(loom_step_kind k)
{
	return (unsigned)k < LOOM_STEP_KIND_COUNT ? step_names[k] : "?";
}

const char *loom_coll_name(loom_coll_op op)
{
	return (unsigned)op < LOOM_COLL_COUNT ? coll_names[op] : "?";
}

loom_status loom_pieces_plain(loom_plan *pl)
{
	pl->pieces = calloc(pl->n_params ? pl->n_params : 1, sizeof(*pl->pieces));
	if (!pl->pieces)
		return LOOM_ERR_NOMEM;
	for (int s = 0; s < pl->n_params; s++) {
		const loom_param_slot *sl = &pl->params[s];
		pl->pieces[s] = (loom_optim_piece){
			.slot = s,
			.off = 0,
			.n = sl->numel,
			.state_off = { sl->state_off[0], sl->state_off[1] },
		};
	}
	pl->n_pieces = pl->n_params;
	return LOOM_OK;
}

static loom_step *push(loom_plan *pl, loom_step_kind kind, loom_phase phase, loom_stream stream)
{
	loom_step *s = &pl->steps[pl->n_steps++];
	*s = (loom_step){ .kind = kind, .phase = phase, .stream = stream, .v = LOOM_NONE,
			  .index = -1 };
	return s;
}

loom_status loom_steps_build(loom_plan *pl)
{
	const loom_memplan *mp = &pl->mp;
	int has_optim = pl->opts.optim.kind != LOOM_OPTIM_NONE;
	/* At most: every node, a second step per bucket, the accumulation
	 * segments, the wait and the optimizer. */
	int cap = mp->nschedule + pl->buckets.n + pl->n_accum + 2;
	pl->steps = calloc((size_t)cap, sizeof(*pl->steps));
	if (!pl->steps)
		return LOOM_ERR_NOMEM;
	pl->n_steps = 0;
	pl->n_fwd_steps = -1;
	/* the forward's positions in the schedule (ZeRO-3 inserted gathers) */
	int nf = pl->n_fwd_sched ? pl->n_fwd_sched : pl->n_fwd;
	for (int i = 0; i < mp->nschedule; i++) {
		loom_value v = mp->schedule[i];
		const loom_node *n = &pl->g->nodes[v];
		if (i == nf)
			pl->n_fwd_steps = pl->n_steps;
		if (loom_made_earlier(pl, v))
			continue; /* runs with its maker */
		loom_phase ph = i < nf ? LOOM_PHASE_FORWARD : LOOM_PHASE_BACKWARD;
		if (n->op == LOOM_OP_ALLREDUCE) {
			/* The bucket's sum is folded in (or added to) right
			 * before its collective, which starts as soon as
			 * backward made the bucket's last gradient. */
			loom_step *s = push(pl, LOOM_STEP_ACCUM, ph, LOOM_STREAM_COMPUTE);
			s->v = v;
			s->index = n->a.ar.bucket;
			s = push(pl, LOOM_STEP_COLLECTIVE, ph, LOOM_STREAM_COMM);
			s->v = v;
			s->index = n->a.ar.bucket;
			s->coll = LOOM_COLL_ALLREDUCE;
			continue;
		}
		loom_step *s = push(pl, LOOM_STEP_NODE, ph, LOOM_STREAM_COMPUTE);
		s->v = v;
		s->noop = loom_op_is_leaf(n->op) || n->op == LOOM_OP_RESHAPE;
	}
	if (pl->n_fwd_steps < 0)
		pl->n_fwd_steps = pl->n_steps;
	/* Without buckets: every gradient's accumulation once backward has
	 * made them all. */
	if (pl->buckets.n == 0 && mp->nschedule > nf)
		for (int k = 0; k < pl->n_accum; k++) {
			loom_step *s = push(pl, LOOM_STEP_ACCUM, LOOM_PHASE_BACKWARD, LOOM_STREAM_COMPUTE);
			s->v = pl->accum[k].v;
			s->index = k;
		}
	pl->n_grad_steps = pl->n_steps;
	if (has_optim) {
		if (pl->buckets.n > 0)
			push(pl, LOOM_STEP_WAIT, LOOM_PHASE_OPTIMIZER, LOOM_STREAM_COMPUTE);
		loom_step *s = push(pl, LOOM_STEP_OPTIM, LOOM_PHASE_OPTIMIZER, LOOM_STREAM_COMPUTE);
		s->first = 0;
		s->last = pl->n_pieces;
	}
	return LOOM_OK;
}
