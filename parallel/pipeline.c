/*
 * parallel/pipeline.c — pipeline parallelism as a pass over the step list.
 * Every rank builds and plans the whole graph; the pass gives every node a
 * stage (forward nodes in build order, balancing estimated time or each
 * stage's planned peak memory, or at the user's loom_stage_boundary marks;
 * a backward node follows the forward node whose gradient rule made it),
 * keeps this rank's nodes, and lays out M
 * micro-batches as one fixed list: each micro-batch's forward (receive the
 * values an earlier stage made, run, send what a later stage reads) and
 * backward (the same for gradients, backwards), in GPipe's or 1F1B's order,
 * each gradient accumulated after its micro-batch's backward, then the
 * optimizer over this stage's parameters once. Activations of the
 * micro-batches in flight live in slots of the activation region that the
 * executor switches between (engine/exec.c, LOOM_STEP_MICRO).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "parallel/parallel.h"
#include "parallel/pipeline.h"
#include "engine/elem.h"
#include "graph/ops/ops.h"

static size_t align64(size_t x)
{
	return (x + 63) & ~(size_t)63;
}

loom_status loom_pipeline_check(const loom_compile_opts *o, int world, char *err, size_t errlen)
{
	int s = o->pipeline_stages;
	if (s < 0 || s > 64) {
		snprintf(err, errlen, "pipeline: %d stages (1 to 64)", s);
		return LOOM_ERR_INVALID;
	}
	if (s > 1 && world % s != 0) {
		snprintf(err, errlen,
			 "pipeline: %d stages do not divide the world of %d ranks (each stage "
			 "needs the same number of replicas)", s, world);
		return LOOM_ERR_INVALID;
	}
	if (o->micro_batches < 0 || (unsigned)o->schedule >= LOOM_SCHEDULE_COUNT) {
		snprintf(err, errlen, "pipeline: %d micro-batches, schedule %d", o->micro_batches,
			 o->schedule);
		return LOOM_ERR_INVALID;
	}
	if ((unsigned)o->pipeline_balance >= LOOM_BALANCE_COUNT) {
		snprintf(err, errlen, "pipeline: pipeline_balance %d is no loom_pipeline_balance "
			 "(LOOM_BALANCE_TIME or LOOM_BALANCE_MEMORY)", o->pipeline_balance);
		return LOOM_ERR_INVALID;
	}
	if (s > 1 && (o->zero_stage || o->sync_bn || o->inference)) {
		snprintf(err, errlen, "pipeline: not with %s yet",
			 o->zero_stage ? "zero_stage" : o->sync_bn ? "sync_bn" : "inference");
		return LOOM_ERR_UNSUPPORTED;
	}
	return LOOM_OK;
}

/* ------------------------------------------------------------ stages */

/* Estimated cost of one forward node: its products at 1e10 FLOP/s and the
 * bytes it writes and reads at 1e10 B/s (a CPU's order of magnitude; only
 * the ratios between stages matter for the cut). */
static double node_seconds(const loom_graph *g, loom_value v)
{
	const loom_node *n = &g->nodes[v];
	double bytes = (double)loom_shape_numel(&n->shape) * loom_dtype_size(n->dtype);
	for (int i = 0; i < n->nsrc; i++)
		if (n->src[i] >= 0) {
			const loom_node *s = &g->nodes[n->src[i]];
			bytes += (double)loom_shape_numel(&s->shape) * loom_dtype_size(s->dtype);
		}
	return loom_node_flops(g, v) * 1e-10 + bytes * 1e-10;
}

static int is_leaf(const loom_graph *g, loom_value v)
{
	return loom_op_is_leaf(g->nodes[v].op);
}

/* Forward nodes: at the marks, else balanced by cost (the memory balance
 * starts from this cut: cut_memory). */
static loom_status cut_forward(loom_plan *pl, loom_pipe *pp, char *err, size_t errlen)
{
	const loom_graph *g = pl->g;
	int S = pp->stages, marks = 0, work = 0;
	double total = 0;
	for (loom_value v = 0; v < pl->n_fwd; v++) {
		if (is_leaf(g, v)) {
			if (g->nodes[v].flags & LOOM_NODE_STAGE_CUT) {
				char lb[96];
				snprintf(err, errlen, "pipeline: the stage boundary at %s: a leaf is no "
					 "stage's output", loom_node_label(g, v, lb, sizeof(lb)));
				return LOOM_ERR_INVALID;
			}
			continue;
		}
		work++;
		marks += (g->nodes[v].flags & LOOM_NODE_STAGE_CUT) != 0;
		total += node_seconds(g, v);
	}
	if (marks && marks != S - 1) {
		snprintf(err, errlen, "pipeline: %d values marked as stage boundaries; %d stages need "
			 "%d (or none, for a balanced cut)", marks, S, S - 1);
		return LOOM_ERR_INVALID;
	}
	if (work < S) {
		snprintf(err, errlen, "pipeline: %d nodes cannot make %d stages", work, S);
		return LOOM_ERR_INVALID;
	}
	int stage = 0, left = work;
	double acc = 0;
	for (loom_value v = 0; v < pl->n_fwd; v++) {
		if (is_leaf(g, v)) {
			pp->stage_of[v] = -1;
			continue;
		}
		pp->stage_of[v] = (signed char)stage;
		acc += node_seconds(g, v);
		left--;
		if (stage == S - 1)
			continue;
		if (marks ? (g->nodes[v].flags & LOOM_NODE_STAGE_CUT) != 0 :
			    acc >= total * (stage + 1) / S || left == S - 1 - stage)
			stage++;
	}
	if (stage != S - 1) {
		snprintf(err, errlen, "pipeline: a stage boundary after the last node");
		return LOOM_ERR_INVALID;
	}
	pp->balance = marks ? -1 : pl->opts.pipeline_balance;
	return LOOM_OK;
}

/* Backward nodes: the stage of the forward node whose rule made them. */
static void cut_backward(loom_plan *pl, loom_pipe *pp)
{
	const loom_graph *g = pl->g;
	for (loom_value v = pl->n_fwd; v < g->n; v++) {
		const loom_node *n = &g->nodes[v];
		int s = 0;
		if (is_leaf(g, v))
			s = -1;
		else if (n->bwd_of != LOOM_NONE && pp->stage_of[n->bwd_of] >= 0)
			s = pp->stage_of[n->bwd_of];
		else
			for (int i = 0; i < n->nsrc; i++)
				if (n->src[i] >= 0 && pp->stage_of[n->src[i]] > s)
					s = pp->stage_of[n->src[i]];
		pp->stage_of[v] = (signed char)s;
	}
	/* A value a fused kernel makes besides its own is its maker's. */
	for (loom_value v = 0; v < g->n; v++)
		if (g->nodes[v].made_by != LOOM_NONE)
			pp->stage_of[v] = pp->stage_of[g->nodes[v].made_by];
}

/* Every value crossing a cut goes forward in the forward pass and
 * backward in the backward pass; a parameter is read by one stage. */
static loom_status check_cut(loom_plan *pl, loom_pipe *pp, char *err, size_t errlen)
{
	const loom_graph *g = pl->g;
	char la[96], lb[96];
	for (loom_value v = 0; v < g->n; v++) {
		const loom_node *n = &g->nodes[v];
		int s = pp->stage_of[v];
		if (s < 0)
			continue;
		for (int i = 0; i < n->nsrc; i++) {
			loom_value u = n->src[i];
			if (u < 0)
				continue;
			int t = pp->stage_of[u];
			if (t < 0 && g->nodes[u].op == LOOM_OP_PARAM && v < pl->n_fwd) {
				/* the parameter's reader: one stage only */
				if (pp->owner[u] >= 0 && pp->owner[u] != s) {
					snprintf(err, errlen, "pipeline: %s is read by stages %d and %d "
						 "(weights shared across stages are not supported)",
						 loom_node_label(g, u, la, sizeof(la)), pp->owner[u], s);
					return LOOM_ERR_UNSUPPORTED;
				}
				pp->owner[u] = (signed char)s;
			}
			if (t < 0 || t == s)
				continue;
			if ((u < pl->n_fwd && t > s) || (u >= pl->n_fwd && t < s)) {
				snprintf(err, errlen, "pipeline: %s (stage %d) reads %s of stage %d, "
					 "against the pipeline's direction",
					 loom_node_label(g, v, la, sizeof(la)), s,
					 loom_node_label(g, u, lb, sizeof(lb)), t);
				return LOOM_ERR_UNSUPPORTED;
			}
		}
	}
	/* Leaves that are not parameters (inputs, buffers): the first stage
	 * that reads them owns them (a buffer is written by its reader). */
	for (loom_value v = 0; v < g->n; v++) {
		const loom_node *n = &g->nodes[v];
		for (int i = 0; i < n->nsrc; i++) {
			loom_value u = n->src[i];
			if (u >= 0 && pp->stage_of[u] < 0 && pp->owner[u] < 0 && pp->stage_of[v] >= 0)
				pp->owner[u] = pp->stage_of[v];
		}
	}
	for (int i = 0; i < pl->n_params; i++) {
		const loom_param_slot *sl = &pl->params[i];
		pp->owner[sl->param] = pp->stage_of[sl->grad] >= 0 ? pp->stage_of[sl->grad] : 0;
		if (sl->master != LOOM_NONE)
			pp->owner[sl->master] = pp->owner[sl->param];
	}
	for (loom_value v = 0; v < g->n; v++)
		if (pp->stage_of[v] < 0 && pp->owner[v] < 0)
			pp->owner[v] = 0;
	return LOOM_OK;
}

/* ------------------------------------------------------------ memory */

/*
 * The values stage s touches: those its nodes make (fused siblings
 * included) or read, and the leaves it owns (its parameters, their O2
 * masters, the inputs and buffers it reads first). The memory planner
 * gives only these storage. Nodes added after the assignment (a bucket's
 * all-reduce) are this rank's stage's: held when `later` says so.
 */
static void stage_mask(const loom_plan *pl, const loom_pipe *pp, int s, int later,
		       unsigned char *held)
{
	const loom_graph *g = pl->g;
	memset(held, 0, (size_t)g->n);
	for (loom_value v = 0; v < g->n; v++) {
		const loom_node *nd = &g->nodes[v];
		if (v >= pp->n_graph) {
			held[v] = (unsigned char)later;
			continue;
		}
		if (pp->stage_of[v] < 0) {
			held[v] |= pp->owner[v] == s;
			continue;
		}
		if (pp->stage_of[v] != s)
			continue;
		held[v] = 1;
		for (int i = 0; i < nd->nsrc; i++)
			if (nd->src[i] >= 0 && nd->src[i] < pp->n_graph)
				held[nd->src[i]] = 1;
	}
}

loom_status loom_pipeline_held(const loom_plan *pl, unsigned char **held)
{
	*held = NULL;
	if (!pl->pipe)
		return LOOM_OK;
	if (!(*held = malloc(pl->g->n ? (size_t)pl->g->n : 1)))
		return LOOM_ERR_NOMEM;
	stage_mask(pl, pl->pipe, pl->pipe->stage, 1, *held);
	return LOOM_OK;
}

/* Optimizer state and O2 masters of this stage's slots only, laid out as
 * make_slots lays out all of them (a slot of another stage has none: its
 * state_off is 0 and nothing reads it). */
static void own_state(loom_plan *pl, const loom_pipe *pp)
{
	size_t off = 0, masters = 0;
	for (int i = 0; i < pl->n_params; i++) {
		loom_param_slot *sl = &pl->params[i];
		int mine = pp->owner[sl->param] == pp->stage;
		size_t sz = align64((size_t)sl->numel * loom_dtype_size(sl->state_dtype));
		for (int k = 0; k < pl->n_state; k++) {
			sl->state_off[k] = mine ? off : 0;
			off += mine ? sz : 0;
		}
		if (mine && sl->master != LOOM_NONE)
			masters += loom_plan_value_bytes(pl, sl->master);
	}
	pl->state_bytes = off;
	pl->master_bytes = masters;
}

/* ------------------------------------------------------------ memory balance */

static int in_flight(int schedule, int stages, int stage, int m);

/* What stage s's rank will plan, from the stage's own memory plan: its
 * persistent values, one micro-batch's activations, the slots the
 * schedule keeps, its slots' optimizer state and (M > 1) accumulation
 * sums, laid out as own_state and loom_accum_plan lay them out. */
typedef struct stage_mem {
	size_t persist, act, state, accum;
	int slots;
} stage_mem;

/* The rank's planned peak less the workspace (engine/program.c's
 * planned_peak: the backend's workspace is the largest node's of the
 * whole graph, the same on every stage, known after the backend plans). */
static size_t stage_peak(const stage_mem *m)
{
	return m->persist + align64(m->act ? m->act : 64) * (size_t)m->slots + m->state + m->accum;
}

static loom_status plan_stage(const loom_plan *pl, const loom_pipe *pp, int s, unsigned char *held,
			      stage_mem *out)
{
	loom_memplan mp;
	stage_mask(pl, pp, s, 0, held);
	loom_status st = loom_memplan_build_held(pl->g, pl->mp.schedule, NULL, held, &mp);
	if (st != LOOM_OK)
		return st;
	*out = (stage_mem){ mp.persist_bytes, mp.act_bytes, 0, 0,
			    in_flight(pp->schedule, pp->stages, s, pp->micro) };
	for (int i = 0; i < pl->n_params; i++) {
		const loom_param_slot *sl = &pl->params[i];
		if (pp->owner[sl->param] == s)
			out->state += (size_t)pl->n_state *
				      align64((size_t)sl->numel * loom_dtype_size(sl->state_dtype));
		if (pp->micro > 1 && (!mp.held || mp.held[sl->grad]))
			out->accum += align64((size_t)sl->numel *
					      (pl->g->nodes[sl->grad].dtype == LOOM_F64 ? 8 : 4));
	}
	loom_memplan_free(&mp);
	return LOOM_OK;
}

/*
 * The search for the memory-balanced cut. A cut is S - 1 places in the
 * list of forward nodes that do work (build order, as the time cut); a
 * stage's peak is what its own memory plan says (plan_stage), not an
 * estimate: a stage's activations keep the whole graph's lifetimes, a
 * value received from an earlier stage or kept for backward is planned as
 * the rank will plan it, and the planner's reuse is what decides, none of
 * which a sum of value sizes knows. One plan of one stage costs about as
 * much as the planner's pass over the graph, so a search of a few hundred
 * plans stays a fraction of the compile.
 */
typedef struct cutter {
	loom_plan *pl;
	loom_pipe *pp;
	loom_value *work; /* the forward nodes that do work, in build order */
	int n;
	unsigned char *held;
	loom_status st;   /* out of memory in a plan */
} cutter;

/*
 * Stage k's peak when it holds work[i, j). The nodes before i are
 * labelled k - 1 and those after j k + 1: stage k's plan depends only on
 * which nodes are its own and which stage reads a leaf first, which a
 * relabelling that keeps the stages' order keeps. A cut that sends a
 * value against the pipeline's direction (check_cut) is no candidate:
 * SIZE_MAX.
 */
static size_t eval_stage(cutter *c, int k, int i, int j)
{
	loom_pipe *pp = c->pp;
	char err[256];
	stage_mem m;
	for (int w = 0; w < c->n; w++)
		pp->stage_of[c->work[w]] = (signed char)(w < i ? k - 1 : w < j ? k : k + 1);
	cut_backward(c->pl, pp);
	memset(pp->owner, -1, (size_t)pp->n_graph);
	if (check_cut(c->pl, pp, err, sizeof(err)) != LOOM_OK)
		return SIZE_MAX;
	loom_status st = plan_stage(c->pl, pp, k, c->held, &m);
	if (st != LOOM_OK) {
		c->st = st;
		return SIZE_MAX;
	}
	return stage_peak(&m);
}

/*
 * Whether every stage fits in `bound`: each stage in turn takes as many
 * nodes as keep its peak within it, leaving one per later stage. Greedy
 * is enough for contiguous ranges whose cost grows with the range: taking
 * less never helps a later stage. Where a stage ends is a binary search,
 * which assumes that a stage taking one more node plans no less; the
 * planner's best fit can break that by a little, which may cost the
 * optimum, never a valid cut. b (S + 1 places) gets the cut, *worst its
 * largest peak.
 */
static int fits(cutter *c, size_t bound, int *b, size_t *worst)
{
	int S = c->pp->stages, i = 0;
	*worst = 0;
	b[0] = 0;
	for (int k = 0; k < S - 1; k++) {
		int lo = i + 1, hi = c->n - (S - 1 - k);
		size_t got = eval_stage(c, k, i, lo);
		if (got > bound)
			return 0;
		while (lo < hi) {
			int mid = lo + (hi - lo + 1) / 2;
			size_t p = eval_stage(c, k, i, mid);
			if (p <= bound) {
				lo = mid;
				got = p;
			} else {
				hi = mid - 1;
			}
		}
		b[k + 1] = i = lo;
		if (got > *worst)
			*worst = got;
	}
	size_t last = eval_stage(c, S - 1, i, c->n);
	b[S] = c->n;
	if (last > bound)
		return 0;
	if (last > *worst)
		*worst = last;
	return 1;
}

/*
 * The memory-balanced cut: the smallest bound every stage fits in, by
 * bisection between 0 and the time-balanced cut's largest peak (to 1/4096
 * of it), then that cut. The time cut (stage_of on entry) is kept when
 * nothing found is smaller, so the memory cut is never worse than it.
 */
static loom_status cut_memory(loom_plan *pl, loom_pipe *pp, char *err, size_t errlen)
{
	const loom_graph *g = pl->g;
	int S = pp->stages;
	cutter c = { .pl = pl, .pp = pp };
	c.work = malloc(sizeof(loom_value) * (size_t)(pl->n_fwd ? pl->n_fwd : 1));
	c.held = malloc((size_t)(g->n ? g->n : 1));
	int *best = calloc((size_t)S + 1, sizeof(int)), *b = calloc((size_t)S + 1, sizeof(int));
	loom_status st = LOOM_ERR_NOMEM;
	if (!c.work || !c.held || !best || !b)
		goto out_free;
	/* the time cut's places */
	for (loom_value v = 0; v < pl->n_fwd; v++) {
		if (is_leaf(g, v))
			continue;
		int s = pp->stage_of[v];
		if (c.n > 0 && s != pp->stage_of[c.work[c.n - 1]])
			best[s] = c.n;
		c.work[c.n++] = v;
	}
	best[S] = c.n;
	size_t top = 0;
	pp->time_stage = 0;
	for (int k = 0; k < S; k++) {
		size_t p = eval_stage(&c, k, best[k], best[k + 1]);
		if (k == 0 || p > top) {
			top = p;
			pp->time_stage = k;
		}
	}
	if (c.st != LOOM_OK)
		goto out_nomem;
	pp->time_peak = top;
	size_t lo = 0, hi = top == SIZE_MAX ? SIZE_MAX - 1 : top, tol = hi / 4096 + 64, worst;
	while (lo + tol < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (fits(&c, mid, b, &worst)) {
			memcpy(best, b, sizeof(int) * ((size_t)S + 1));
			hi = worst;
		} else {
			lo = mid + 1;
		}
		if (c.st != LOOM_OK)
			goto out_nomem;
	}
	for (int k = 0; k < S; k++)
		for (int w = best[k]; w < best[k + 1]; w++)
			pp->stage_of[c.work[w]] = (signed char)k;
	st = LOOM_OK;
	goto out_free;
out_nomem:
	st = c.st;
out_free:
	if (st != LOOM_OK)
		snprintf(err, errlen, "pipeline: the memory-balanced cut: out of memory");
	free(c.work);
	free(c.held);
	free(best);
	free(b);
	return st;
}

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
static int in_flight(int schedule, int stages, int stage, int m)
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
			int out = !is_leaf(g, v) && pl->mp.region[v] == LOOM_REGION_PERSIST &&
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

/* Per stage: nodes, parameters, estimated time, and what the memory
 * planner gives the stage's own plan (the values it touches only, placed
 * in the whole graph's order): its activations of one micro-batch, its
 * persistent bytes (parameters, gradients, masters, inputs, outputs) and
 * its rank's planned peak less the workspace. */
static loom_status stage_table(loom_plan *pl, loom_pipe *pp)
{
	const loom_graph *g = pl->g;
	for (loom_value v = 0; v < g->n; v++) {
		int s = pp->stage_of[v];
		if (s < 0) {
			if (g->nodes[v].op == LOOM_OP_PARAM && !(g->nodes[v].flags & LOOM_NODE_AMP))
				pp->n_param_elems[pp->owner[v]] += loom_shape_numel(&g->nodes[v].shape);
			continue;
		}
		if (!loom_made_earlier(pl, v))
			pp->n_nodes[s]++;
		pp->gflop[s] += loom_node_flops(g, v) * 1e-9;
		if (v < pl->n_fwd)
			pp->est_s[s] += 3 * node_seconds(g, v); /* backward ~ 2x forward */
	}
	unsigned char *held = malloc(g->n ? (size_t)g->n : 1);
	if (!held)
		return LOOM_ERR_NOMEM;
	for (int s = 0; s < pp->stages; s++) {
		stage_mem m;
		loom_status st = plan_stage(pl, pp, s, held, &m);
		if (st != LOOM_OK) {
			free(held);
			return st;
		}
		pp->in_flight[s] = m.slots;
		pp->act_bytes[s] = m.act;
		pp->persist_bytes[s] = m.persist;
		pp->peak_bytes[s] = stage_peak(&m);
	}
	free(held);
	return LOOM_OK;
}

static double mib(size_t bytes)
{
	return bytes / 1048576.0;
}

/* The cut the table shows; under the memory balance, what the time
 * balance would have planned (the workspace ws added, as to every peak). */
static void cut_text(const loom_pipe *pp, size_t ws, char *buf, size_t len)
{
	if (pp->balance < 0)
		snprintf(buf, len, "cut at the loom_stage_boundary marks");
	else if (pp->balance == LOOM_BALANCE_TIME)
		snprintf(buf, len, "cut balancing time");
	else
		snprintf(buf, len, "cut balancing memory%s (the time-balanced cut's largest: stage %d, "
			 "planned peak %.2f MiB)", pp->rebalanced ? " under the memory limit" : "",
			 pp->time_stage, mib(pp->time_peak + ws));
}

static void print_table(const loom_program *p, const loom_pipe *pp)
{
	static const char *const sched[] = { "1f1b", "gpipe" };
	static const char *const xfer[] = { "host memory over MPI", "the device communicator",
					    "host buffers over MPI (staged)" };
	size_t ws = p->plan.ws_bytes;
	char cut[160];
	cut_text(pp, ws, cut, sizeof(cut));
	loom_log("loom: pipeline of %d stages x %d replicas, %d micro-batches, %s, %s, values "
		 "through %s:\n", pp->stages, pp->replicas, pp->micro, sched[pp->schedule], cut,
		 xfer[pp->xfer]);
	for (int s = 0; s < pp->stages; s++)
		loom_log("loom:   stage %d: %d nodes, %lld parameters, persistent %.2f MiB, "
			 "activations %.2f MiB per micro-batch x %d in flight, planned peak %.2f MiB, "
			 "%.3f GFLOP, est. %.3f ms per micro-batch\n",
			 s, pp->n_nodes[s], (long long)pp->n_param_elems[s],
			 mib(pp->persist_bytes[s]), mib(pp->act_bytes[s]), pp->in_flight[s],
			 mib(pp->peak_bytes[s] + ws), pp->gflop[s], pp->est_s[s] * 1e3);
}

loom_status loom_pipeline_limit(loom_program *p, char *err, size_t errlen)
{
	const loom_plan *pl = &p->plan;
	loom_pipe *pp = pl->pipe;
	double limit = pl->opts.memory_limit_mb;
	size_t ws = pl->ws_bytes;
	int worst = 0;
	for (int s = 1; s < pp->stages; s++)
		if (pp->peak_bytes[s] > pp->peak_bytes[worst])
			worst = s;
	double peak = mib(pp->peak_bytes[worst] + ws);
	if (limit > 0 && peak > limit) {
		pp->refused = 1;
		if (pp->rebalanced)
			snprintf(err, errlen, "pipeline: neither cut fits the memory limit of %.2f MiB: "
				 "the time-balanced cut's stage %d plans %.2f MiB, the memory-balanced "
				 "cut's stage %d %.2f MiB", limit, pp->time_stage,
				 mib(pp->time_peak + ws), worst, peak);
		else if (pp->balance == LOOM_BALANCE_MEMORY)
			snprintf(err, errlen, "pipeline: stage %d's planned peak of %.2f MiB (the "
				 "memory-balanced cut; the time-balanced cut's stage %d plans %.2f MiB) "
				 "exceeds the memory limit of %.2f MiB", worst, peak, pp->time_stage,
				 mib(pp->time_peak + ws), limit);
		else
			snprintf(err, errlen, "pipeline: stage %d's planned peak of %.2f MiB (the %s) "
				 "exceeds the memory limit of %.2f MiB", worst, peak,
				 pp->balance < 0 ? "cut at the loom_stage_boundary marks" :
				 "time-balanced cut", limit);
		return LOOM_ERR_NOMEM;
	}
	if (loom_pg_get_info(pl->opts.pg)->rank != 0)
		return LOOM_OK;
	if (pp->rebalanced)
		loom_log("loom: pipeline: the memory-balanced cut, since the time-balanced cut's stage "
			 "%d plans %.2f MiB, over the memory limit of %.2f MiB\n", pp->time_stage,
			 mib(pp->time_peak + ws), limit);
	print_table(p, pp);
	return LOOM_OK;
}

int loom_pipeline_may_rebalance(const loom_plan *pl)
{
	const loom_pipe *pp = pl->pipe;
	return pp && pp->refused && pp->balance == LOOM_BALANCE_TIME;
}

/* So that a dead or late rank is named with its stage ("rank 1 (pipeline
 * stage 1) died ..."), whichever step found it: a receive, a send's wait, the
 * loss's all-reduce. */
static void name_stages(loom_pipe *pp, struct loom_pg *pg, int world)
{
	char note[LOOM_PG_NOTE_BYTES];
	pp->pg = pg;
	for (int r = 0; r < world; r++) {
		if (pp->replicas > 1)
			snprintf(note, sizeof(note), "pipeline stage %d, replica %d", r % pp->stages,
				 r / pp->stages);
		else
			snprintf(note, sizeof(note), "pipeline stage %d", r % pp->stages);
		loom_pg_set_rank_note(pg, r, note);
	}
}

/* LOOM_PIPE_STAGE_HOST=1: the staged transport on a host backend too, so
 * that the path a GPU without a device communicator takes is tested
 * without one (tests/ddp/test_pipe.sh). Read at compile. */
static int stage_host_hook(void)
{
	const char *e = getenv("LOOM_PIPE_STAGE_HOST");
	return e && strcmp(e, "1") == 0;
}

/* How values cross a cut (loom_pipe_xfer): the arena's bytes over the host
 * communicator where they are host memory; over the device communicator
 * where there is one; else through host buffers. */
static loom_status pick_transport(loom_program *p, loom_pipe *pp, char *err, size_t errlen)
{
	const loom_pg_info *in = loom_pg_get_info(p->plan.opts.pg);
	pp->comm = pp->world;
	if (p->be->caps & LOOM_BE_HOST_MEMORY) {
		pp->xfer = stage_host_hook() ? LOOM_PIPE_XFER_STAGED : LOOM_PIPE_XFER_HOST;
		return LOOM_OK;
	}
	/* Data parallelism within a stage sums device buckets over pp->dp, a
	 * split of the host communicator, which reads host memory only. */
	if (pp->replicas > 1) {
		snprintf(err, errlen, "pipeline: %d replicas per stage on the %s backend: not yet "
			 "(the stage's replicas would sum device memory over the host "
			 "communicator); one replica per stage runs", pp->replicas, p->be->name);
		return LOOM_ERR_UNSUPPORTED;
	}
	/* A group has a device communicator where it has a device (asking
	 * one without sets the group's error). NCCL runs a communicator's
	 * sends and receives one after the other in the order they were
	 * issued: under 1F1B stage 0 issues the send of micro-batch j + 1's
	 * forward before the receive of j's gradient, which stage 1 sends
	 * before it receives j + 1's forward, so both sends wait for each
	 * other once a message outgrows NCCL's buffers. GPipe issues them in
	 * the same order on both sides of every cut; 1F1B goes through host
	 * buffers over MPI, whose sends and receives progress on their own. */
	loom_comm *dev = in->device >= 0 ? loom_pg_comm(p->plan.opts.pg, LOOM_COMM_DEVICE) : NULL;
	if (dev && dev->i->send_start && dev->i->recv_start && pp->schedule == LOOM_SCHEDULE_GPIPE) {
		pp->xfer = LOOM_PIPE_XFER_DEVICE;
		pp->comm = dev;
	} else {
		pp->xfer = LOOM_PIPE_XFER_STAGED;
	}
	return LOOM_OK;
}

loom_status loom_pipeline_assign(loom_program *p, char *err, size_t errlen)
{
	loom_plan *pl = &p->plan;
	const loom_pg_info *in = loom_pg_get_info(pl->opts.pg);
	loom_status st;
	loom_pipe *pp = calloc(1, sizeof(*pp));
	if (!pp)
		goto nomem;
	pl->pipe = pp;
	pp->stages = pl->opts.pipeline_stages;
	pp->stage = in->rank % pp->stages;
	pp->replicas = in->world / pp->stages;
	pp->replica = in->rank / pp->stages;
	pp->micro = pl->opts.micro_batches > 0 ? pl->opts.micro_batches : pp->stages;
	pp->schedule = pl->opts.schedule;
	pp->world = loom_pg_comm(pl->opts.pg, LOOM_COMM_HOST);
	name_stages(pp, pl->opts.pg, in->world);
	if (!pp->world) {
		snprintf(err, errlen, "pipeline: %s", loom_pg_error(pl->opts.pg));
		return LOOM_ERR_UNSUPPORTED;
	}
	if ((st = pick_transport(p, pp, err, errlen)) != LOOM_OK)
		return st;
	/* A stage's replicas sum their gradients among themselves; a
	 * replica's stages pass its values to each other. */
	pp->rep = pp->world;
	if (pp->replicas > 1 &&
	    ((st = loom_comm_split(pp->world, pp->stage, pp->replica, &pp->dp)) != LOOM_OK ||
	     (st = loom_comm_split(pp->world, pp->replica, pp->stage, &pp->rep)) != LOOM_OK)) {
		snprintf(err, errlen, "pipeline: sub-communicators: %s", loom_pg_error(pl->opts.pg));
		return st;
	}
	int n = pp->n_graph = pl->g->n, S = pp->stages;
	pp->stage_of = malloc((size_t)n);
	pp->owner = malloc((size_t)n);
	pp->est_s = calloc((size_t)S, sizeof(double));
	pp->gflop = calloc((size_t)S, sizeof(double));
	pp->n_nodes = calloc((size_t)S, sizeof(int));
	pp->in_flight = calloc((size_t)S, sizeof(int));
	pp->n_param_elems = calloc((size_t)S, sizeof(int64_t));
	pp->act_bytes = calloc((size_t)S, sizeof(size_t));
	pp->persist_bytes = calloc((size_t)S, sizeof(size_t));
	pp->peak_bytes = calloc((size_t)S, sizeof(size_t));
	if (!pp->stage_of || !pp->owner || !pp->est_s || !pp->gflop || !pp->n_nodes ||
	    !pp->in_flight || !pp->n_param_elems || !pp->act_bytes || !pp->persist_bytes ||
	    !pp->peak_bytes)
		goto nomem;
	if ((st = cut_forward(pl, pp, err, errlen)) != LOOM_OK)
		return st;
	if (pp->balance == LOOM_BALANCE_MEMORY && (st = cut_memory(pl, pp, err, errlen)) != LOOM_OK)
		return st;
	memset(pp->owner, -1, (size_t)n);
	cut_backward(pl, pp);
	if ((st = check_cut(pl, pp, err, errlen)) != LOOM_OK)
		return st;
	own_state(pl, pp);
	return LOOM_OK;
nomem:
	snprintf(err, errlen, "pipeline: out of memory");
	return LOOM_ERR_NOMEM;
}

int loom_pipeline_owns(const loom_plan *pl, int slot)
{
	return !pl->pipe || pl->pipe->owner[pl->params[slot].param] == pl->pipe->stage;
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
		int st = is_leaf(pl->g, v) ? -1 : 0;
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
	if ((st = stage_new_nodes(pl, pp)) != LOOM_OK || (st = stage_table(pl, pp)) != LOOM_OK)
		goto nomem;
	pp->slots = in_flight(pp->schedule, pp->stages, pp->stage, pp->micro);
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
	pp->slot_bytes = align64(pl->mp.act_bytes ? pl->mp.act_bytes : 64);
	pl->mp.act_bytes = pp->slot_bytes * (size_t)pp->slots;
	return LOOM_OK;
nomem:
	snprintf(err, errlen, "pipeline: out of memory");
	return LOOM_ERR_NOMEM;
}

/* ------------------------------------------------------------ start-up */

static void describe(void *user, size_t i, char *buf, size_t len)
{
	const loom_plan *pl = user;
	char sh[96];
	if (i < (size_t)pl->pipe->n_graph) {
		loom_value v = (loom_value)i;
		const loom_node *n = &pl->g->nodes[v];
		int s = pl->pipe->stage_of[v] >= 0 ? pl->pipe->stage_of[v] : pl->pipe->owner[v];
		snprintf(buf, len, "stage %d's node %d %s has %s %s", s, (int)v,
			 loom_op_defs[n->op]->name, loom_dtype_name(n->dtype),
			 loom_shape_str(&n->shape, sh, sizeof(sh)));
		return;
	}
	snprintf(buf, len, "item %zu", i);
}

static loom_status check_plans(loom_program *p)
{
	const loom_plan *pl = &p->plan;
	const loom_pipe *pp = pl->pipe;
	/* the graph every rank built, in node order (each stage's buckets
	 * are its own) */
	size_t n = (size_t)pp->n_graph;
	uint64_t *items = malloc(sizeof(uint64_t) * (n ? n : 1));
	if (!items)
		return loom_program_fail(p, LOOM_ERR_NOMEM, "fingerprint: out of memory");
	for (size_t i = 0; i < n; i++) {
		loom_value v = (loom_value)i;
		int64_t s = pp->stage_of[v];
		items[i] = loom_comm_hash(&s, sizeof(s), loom_ddp_node_hash(pl, v));
	}
	/* Whether the values go over the device communicator: a rank using it
	 * and a rank using MPI would wait for each other forever (the host and
	 * the staged transports both use MPI and may differ). */
	int64_t head[] = {
		pl->opts.amp.level, pl->opts.amp.half, pl->opts.optim.kind, pl->n_params,
		pl->opts.no_fusion, pp->stages, pp->micro, pp->schedule,
		pp->xfer == LOOM_PIPE_XFER_DEVICE, pl->opts.no_tf32,
	};
	return loom_ddp_check_items(p, pp->world, head, sizeof(head), items, n, describe,
				    "pipeline start-up: ");
}

/* The leaves this stage holds (its parameters, masters and buffers, made
 * by init_values from the same graph on every rank): from the stage's
 * first replica to the others, as data parallelism's start-up does. */
static loom_status broadcast_leaves(loom_program *p)
{
	const loom_plan *pl = &p->plan;
	const loom_pipe *pp = pl->pipe;
	for (loom_value v = 0; pp->dp && v < pl->n_fwd; v++) {
		loom_op op = pl->g->nodes[v].op;
		if ((op != LOOM_OP_PARAM && op != LOOM_OP_BUFFER) || !loom_plan_holds(pl, v))
			continue;
		loom_status st = loom_comm_broadcast(pp->dp, loom_value_ptr(p, v),
						     loom_value_bytes(p, v), 0);
		if (st != LOOM_OK)
			return loom_program_fail(p, st, "pipeline: broadcast of %s: %s",
						 pl->g->nodes[v].name, loom_pg_error(pl->opts.pg));
	}
	return LOOM_OK;
}

loom_status loom_pipeline_start(loom_program *p)
{
	loom_status st = p->be->synchronize(p->be_ctx, &p->plan, &p->ts);
	if (st != LOOM_OK)
		return loom_program_backend_fail(p, st);
	if ((st = check_plans(p)) != LOOM_OK)
		return st;
	return broadcast_leaves(p);
}

int loom_pipeline_leaf_owner(const loom_plan *pl, loom_value v)
{
	return pl->pipe->owner[v];
}

loom_status loom_pipeline_fetch(loom_program *p, int stage, const void *addr, void *dst,
				size_t bytes)
{
	const loom_pipe *pp = p->plan.pipe;
	loom_status st = LOOM_OK;
	/* replica 0 of the stage: rank = stage */
	if (pp->replica == 0 && pp->stage == stage)
		st = loom_program_download(p, dst, addr, bytes);
	if (st == LOOM_OK && (st = loom_comm_broadcast(pp->world, dst, bytes, stage)) != LOOM_OK)
		loom_program_fail(p, st, "pipeline: gathering the checkpoint from stage %d: %s", stage,
				  loom_pg_error(p->plan.opts.pg));
	return st;
}

/* ------------------------------------------------------------ runs */

loom_status loom_pipeline_set_input(loom_program *p, loom_value v, const void *data, size_t count)
{
	loom_pipe *pp = p->plan.pipe;
	for (int i = 0; i < pp->n_vals; i++) {
		if (pp->vals[i] != v)
			continue;
		size_t numel = pp->bytes[i] / loom_dtype_size(p->plan.g->nodes[v].dtype);
		if (count != numel * (size_t)pp->micro)
			return loom_program_fail(p, LOOM_ERR_SHAPE,
						 "set_input '%s': %zu elements given; a pipeline of %d "
						 "micro-batches takes %zu (%d x %zu)",
						 p->plan.g->nodes[v].name, count, pp->micro,
						 numel * (size_t)pp->micro, pp->micro, numel);
		memcpy(pp->host[i], data, pp->bytes[i] * (size_t)pp->micro);
		return LOOM_OK;
	}
	return loom_program_fail(p, LOOM_ERR_NOT_FOUND, "set_input: input %d is no pipeline input",
				 (int)v);
}

/* The loss: the mean over the micro-batches on the last stage, the same
 * on every rank. */
static loom_status agree_loss(loom_program *p)
{
	loom_pipe *pp = p->plan.pipe;
	double sum = 0;
	if (pp->stage == pp->stages - 1)
		for (int j = 0; j < pp->micro; j++)
			sum += pp->loss[j];
	sum /= pp->micro;
	loom_status st = loom_comm_allreduce(pp->world, &sum, 1, LOOM_F64);
	if (st != LOOM_OK)
		return loom_program_fail(p, st, "pipeline: the loss: %s", loom_pg_error(p->plan.opts.pg));
	p->ts.last_loss = sum / pp->replicas;
	return LOOM_OK;
}

loom_status loom_pipeline_run(loom_program *p, loom_run_mode mode)
{
	loom_plan *pl = &p->plan;
	loom_pipe *pp = pl->pipe;
	loom_status st;
	switch (mode) {
	case LOOM_RUN_EVAL:
		st = loom_exec_run(p, 0, pp->eval_steps, 0);
		break;
	case LOOM_RUN_TRAIN:
		if (pp->micro > 1 && (st = loom_program_accum_ready(p)) != LOOM_OK)
			return st;
		p->ts.micro = pp->micro - 1;
		st = loom_exec_run(p, pp->eval_steps, pl->n_steps, LOOM_EXEC_TRAIN);
		p->ts.micro = 0;
		break;
	default:
		return loom_program_fail(p, LOOM_ERR_UNSUPPORTED,
					 "run: a pipeline program runs TRAIN and EVAL only, not mode %d",
					 (int)mode);
	}
	if (st == LOOM_OK)
		st = loom_exec_synchronize(p);
	if (st == LOOM_OK)
		st = agree_loss(p);
	return st;
}

loom_status loom_pipeline_read(loom_program *p, loom_value v, double *dst, size_t count)
{
	const loom_plan *pl = &p->plan;
	loom_pipe *pp = pl->pipe;
	const loom_node *nd = &pl->g->nodes[v];
	size_t numel = (size_t)loom_shape_numel(&nd->shape), esz = loom_dtype_size(nd->dtype);
	loom_status st;
	if (pp->stage_of[v] < 0) {
		/* a parameter or buffer: its owner's copy */
		if (count != numel)
			return loom_program_fail(p, LOOM_ERR_SHAPE, "read: %zu elements asked, value %d "
						 "has %zu", count, (int)v, numel);
		unsigned char *tmp = malloc(numel * esz + 1);
		if (!tmp)
			return loom_program_fail(p, LOOM_ERR_NOMEM, "read: out of memory");
		/* replica 0's copy: rank = its stage */
		st = loom_pipeline_fetch(p, pp->owner[v], loom_value_ptr(p, v), tmp, numel * esz);
		for (size_t i = 0; st == LOOM_OK && i < numel; i++)
			dst[i] = loom_elem_get(nd->dtype, tmp, i);
		free(tmp);
		return st;
	}
	if (count != numel * (size_t)pp->micro)
		return loom_program_fail(p, LOOM_ERR_SHAPE, "read: %zu elements asked; value %d holds "
					 "%zu per micro-batch, %zu for the %d of a pipeline batch",
					 count, (int)v, numel, numel * (size_t)pp->micro, pp->micro);
	int i = 0;
	while (i < pp->n_vals && pp->vals[i] != v)
		i++;
	size_t all = numel * esz * (size_t)pp->micro;
	unsigned char *tmp = malloc(all + 1);
	if (!tmp)
		return loom_program_fail(p, LOOM_ERR_NOMEM, "read: out of memory");
	if (i < pp->n_vals)
		memcpy(tmp, pp->host[i], all);
	st = loom_comm_broadcast(pp->rep, tmp, all, pp->stage_of[v]);
	if (st != LOOM_OK)
		loom_program_fail(p, st, "read: %s", loom_pg_error(pl->opts.pg));
	else if (i == pp->n_vals && pp->stage_of[v] == pp->stage)
		st = loom_program_fail(p, LOOM_ERR_STATE, "read: value %d is not kept after a step",
				       (int)v);
	for (size_t k = 0; st == LOOM_OK && k < numel * (size_t)pp->micro; k++)
		dst[k] = loom_elem_get(nd->dtype, tmp, k);
	free(tmp);
	return st;
}

void loom_pipeline_free(loom_pipe *pp)
{
	if (!pp)
		return;
	if (pp->pg)
		for (int r = 0; r < loom_pg_get_info(pp->pg)->world; r++)
			loom_pg_set_rank_note(pp->pg, r, NULL);
	for (int i = 0; i < pp->n_vals; i++)
		free(pp->host[i]);
	free(pp->host);
	free(pp->vals);
	free(pp->is_input);
	free(pp->bytes);
	free(pp->loss);
	free(pp->sends);
	free(pp->send_slot);
	free(pp->send_micro);
	free(pp->send_copy);
	for (int k = 0; pp->recv_host && k < pp->n_recv; k++)
		free(pp->recv_host[k]);
	free(pp->recv_host);
	free(pp->recv_work);
	free(pp->recv_at);
	free(pp->stage_of);
	free(pp->owner);
	free(pp->est_s);
	free(pp->gflop);
	free(pp->n_nodes);
	free(pp->in_flight);
	free(pp->n_param_elems);
	free(pp->act_bytes);
	free(pp->persist_bytes);
	free(pp->peak_bytes);
	loom_comm_free(pp->dp);
	if (pp->rep != pp->world)
		loom_comm_free(pp->rep);
	free(pp);
}
