/*
 * parallel/pipeline_transport.c — how the pipeline's values cross its cuts
 * and how its stages start: the transport picked at compile (host memory
 * over MPI, the device communicator, or host buffers staged over MPI), the
 * SEND, RECV and MICRO steps the executor hands over (engine/pass.h's
 * loom_transport: sends in flight per activation slot, receives posted
 * early), the start-up check and broadcast, and the run-time entry points
 * (inputs, the run, reads, the checkpoint's fetch).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/options.h"
#include "comm/comm.h"
#include "parallel/parallel.h"
#include "parallel/pipeline.h"
#include "parallel/pipeline_internal.h"
#include "base/elem.h"
#include "graph/ops/ops.h"

/* So that a dead or late rank is named with its stage ("rank 1 (pipeline
 * stage 1) died ..."), whichever step found it: a receive, a send's wait, the
 * loss's all-reduce. */
void loom_pipe_name_stages(loom_pipe *pp, struct loom_pg *pg, int world)
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
	return loom_opt_bool(LOOM_OPT_PIPE_STAGE_HOST);
}

/* How values cross a cut (loom_pipe_xfer): the arena's bytes over the host
 * communicator where they are host memory; over the device communicator
 * where there is one; else through host buffers. */
loom_status loom_pipe_pick_transport(loom_program *p, loom_pipe *pp, char *err, size_t errlen)
{
	const loom_pg_info *in = loom_pg_get_info(p->plan.opts.pg);
	pp->comm = pp->world;
	if (loom_pass_host_memory(p)) {
		pp->xfer = stage_host_hook() ? LOOM_PIPE_XFER_STAGED : LOOM_PIPE_XFER_HOST;
		return LOOM_OK;
	}
	/* Data parallelism within a stage sums device buckets over pp->dp, a
	 * split of the host communicator, which reads host memory only. */
	if (pp->replicas > 1) {
		snprintf(err, errlen, "pipeline: %d replicas per stage on the %s backend: not yet "
			 "(the stage's replicas would sum device memory over the host "
			 "communicator); one replica per stage runs", pp->replicas,
			 loom_pass_backend_name(p));
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
	loom_comm *dev = in->device >= 0 ? loom_pg_comm_if(p->plan.opts.pg, LOOM_COMM_DEVICE) : NULL;
	if (dev && dev->i->send_start && dev->i->recv_start && pp->schedule == LOOM_SCHEDULE_GPIPE) {
		pp->xfer = LOOM_PIPE_XFER_DEVICE;
		pp->comm = dev;
	} else {
		pp->xfer = LOOM_PIPE_XFER_STAGED;
	}
	return LOOM_OK;
}


loom_status loom_pipe_connect(loom_program *p, loom_pipe *pp, char *err, size_t errlen)
{
	const loom_plan *pl = &p->plan;
	loom_status st;
	pp->world = loom_pg_comm(pl->opts.pg, LOOM_COMM_HOST);
	loom_pipe_name_stages(pp, pl->opts.pg, loom_pg_get_info(pl->opts.pg)->world);
	if (!pp->world) {
		snprintf(err, errlen, "pipeline: %s", loom_pg_error(pl->opts.pg));
		return LOOM_ERR_UNSUPPORTED;
	}
	if ((st = loom_pipe_pick_transport(p, pp, err, errlen)) != LOOM_OK)
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
	return LOOM_OK;
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
	loom_status st = loom_pass_sync(p);
	if (st != LOOM_OK || (st = check_plans(p)) != LOOM_OK)
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


/* ------------------------------------------------------------ steps the executor hands over */

static loom_status comm_fail(loom_program *p, loom_status st)
{
	return loom_program_fail(p, st, "%s", loom_pg_error(p->plan.opts.pg));
}


/* Sends in flight (the stage boundaries): each reads the
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
				  loom_pass_stream(p, LOOM_STREAM_COMPUTE), &w);
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
					      loom_pass_stream(p, LOOM_STREAM_COMPUTE),
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
	int t0 = loom_exec_timer(p, LOOM_STREAM_COMPUTE);
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
	loom_exec_add_span(p, LOOM_SPAN_RECV, s->v, s->micro, t0, loom_exec_timer(p, LOOM_STREAM_COMPUTE));
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

/* ------------------------------------------------------------ the executor's hooks */

static void pipe_run_begin(loom_program *p, int first, int last)
{
	recvs_begin(p, first, last);
}

static loom_status pipe_before_step(loom_program *p, int i)
{
	const loom_pipe *pp = p->plan.pipe;
	return pp->recv_next < pp->recv_end ? recvs_post(p, i) : LOOM_OK;
}

static loom_status pipe_step(loom_program *p, const loom_step *s, int i)
{
	switch (s->kind) {
	case LOOM_STEP_SEND:
		return exec_send(p, s);
	case LOOM_STEP_RECV:
		return exec_recv(p, s, i);
	case LOOM_STEP_MICRO:
		return exec_micro(p, s);
	default:
		return loom_program_fail(p, LOOM_ERR_STATE, "pipeline: no %s steps",
					 loom_step_kind_name(s->kind));
	}
}

/* Between nodes: the sends, then the receives posted ahead of their steps. */
static loom_status pipe_progress(loom_program *p)
{
	const loom_pipe *pp = p->plan.pipe;
	loom_status st;
	if (pp->n_sends && (st = sends_progress(p)) != LOOM_OK)
		return st;
	if (pp->recv_wait < pp->recv_next && (st = recvs_progress(p)) != LOOM_OK)
		return st;
	return LOOM_OK;
}

static loom_status pipe_finish(loom_program *p)
{
	return p->plan.pipe->n_sends ? sends_wait(p, -1) : LOOM_OK;
}

static void pipe_drop(loom_program *p)
{
	if (p->plan.pipe->n_sends)
		(void)sends_wait(p, -1);
	recvs_drop(p);
}

/* This rank's place among the stages, for io/ (a checkpoint's writer, a
 * trace's tracks). */
static void pipe_stages(const loom_program *p, loom_stage_info *out)
{
	const loom_pipe *pp = p->plan.pipe;
	*out = (loom_stage_info){ .stages = pp->stages, .stage = pp->stage,
				  .replicas = pp->replicas, .replica = pp->replica,
				  .group_rank = loom_pg_get_info(p->plan.opts.pg)->rank,
				  .n_graph = pp->n_graph };
}

static int pipe_leaf_owner(const loom_program *p, loom_value v)
{
	return loom_pipeline_leaf_owner(&p->plan, v);
}

const loom_transport loom_pipe_transport = {
	.run_begin = pipe_run_begin,
	.before_step = pipe_before_step,
	.step = pipe_step,
	.progress = pipe_progress,
	.finish = pipe_finish,
	.drop = pipe_drop,
	.no_graph = "pipeline stages move micro-batches through the host",
	.stages = pipe_stages,
	.leaf_owner = pipe_leaf_owner,
	.fetch = loom_pipeline_fetch,
};
