/*
 * parallel/pipeline_cut.c — the pipeline's cut: which stage runs each node.
 * Forward nodes in build order, balancing estimated time or each stage's
 * planned peak memory, or at the user's loom_stage_boundary marks; a
 * backward node follows the forward node whose gradient rule made it; each
 * stage owns its parameters' optimizer state. Also the per-stage table
 * (nodes, parameters, memory, time) and the memory limit's verdict.
 * The schedule is pipeline_schedule.c, the transport pipeline_transport.c.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "parallel/parallel.h"
#include "parallel/pipeline.h"
#include "parallel/pipeline_internal.h"
#include "parallel/shards.h"
#include "base/elem.h"
#include "graph/ops/ops.h"

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


/* Forward nodes: at the marks, else balanced by cost (the memory balance
 * starts from this cut: cut_memory). */
static loom_status cut_forward(loom_plan *pl, loom_pipe *pp, char *err, size_t errlen)
{
	const loom_graph *g = pl->g;
	int S = pp->stages, marks = 0, work = 0;
	double total = 0;
	for (loom_value v = 0; v < pl->n_fwd; v++) {
		if (loom_pipe_is_leaf(g, v)) {
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
		if (loom_pipe_is_leaf(g, v)) {
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
		if (loom_pipe_is_leaf(g, v))
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
		size_t sz = loom_pipe_align64((size_t)sl->numel * loom_dtype_size(sl->state_dtype));
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
	return m->persist + loom_pipe_align64(m->act ? m->act : 64) * (size_t)m->slots + m->state + m->accum;
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
			    loom_pipe_in_flight(pp->schedule, pp->stages, s, pp->micro) };
	for (int i = 0; i < pl->n_params; i++) {
		const loom_param_slot *sl = &pl->params[i];
		if (pp->owner[sl->param] == s)
			out->state += (size_t)pl->n_state *
				      loom_pipe_align64((size_t)sl->numel * loom_dtype_size(sl->state_dtype));
		if (pp->micro > 1 && (!mp.held || mp.held[sl->grad]))
			out->accum += loom_pipe_align64((size_t)sl->numel *
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
		if (loom_pipe_is_leaf(g, v))
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


/* Per stage: nodes, parameters, estimated time, and what the memory
 * planner gives the stage's own plan (the values it touches only, placed
 * in the whole graph's order): its activations of one micro-batch, its
 * persistent bytes (parameters, gradients, masters, inputs, outputs) and
 * its rank's planned peak less the workspace. */
loom_status loom_pipe_stage_table(loom_plan *pl, loom_pipe *pp)
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


/* The per-node and per-stage tables of a graph of n nodes; 0 without memory. */
static int cut_tables(loom_pipe *pp, int n)
{
	size_t S = (size_t)pp->stages;
	pp->n_graph = n;
	pp->stage_of = malloc((size_t)n);
	pp->owner = malloc((size_t)n);
	pp->est_s = calloc(S, sizeof(double));
	pp->gflop = calloc(S, sizeof(double));
	pp->n_nodes = calloc(S, sizeof(int));
	pp->in_flight = calloc(S, sizeof(int));
	pp->n_param_elems = calloc(S, sizeof(int64_t));
	pp->act_bytes = calloc(S, sizeof(size_t));
	pp->persist_bytes = calloc(S, sizeof(size_t));
	pp->peak_bytes = calloc(S, sizeof(size_t));
	return pp->stage_of && pp->owner && pp->est_s && pp->gflop && pp->n_nodes &&
	       pp->in_flight && pp->n_param_elems && pp->act_bytes && pp->persist_bytes &&
	       pp->peak_bytes;
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
	p->transport = &loom_pipe_transport;
	p->shards = &loom_stage_shards; /* each stage holds its layers' gradients */
	pp->stages = pl->opts.pipeline_stages;
	pp->stage = in->rank % pp->stages;
	pp->replicas = in->world / pp->stages;
	pp->replica = in->rank / pp->stages;
	pp->micro = pl->opts.micro_batches > 0 ? pl->opts.micro_batches : pp->stages;
	pp->schedule = pl->opts.schedule;
	if ((st = loom_pipe_connect(p, pp, err, errlen)) != LOOM_OK)
		return st;
	if (!cut_tables(pp, pl->g->n))
		goto nomem;
	if ((st = cut_forward(pl, pp, err, errlen)) != LOOM_OK)
		return st;
	if (pp->balance == LOOM_BALANCE_MEMORY && (st = cut_memory(pl, pp, err, errlen)) != LOOM_OK)
		return st;
	memset(pp->owner, -1, (size_t)pl->g->n);
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

