/*
 * engine/io_view.c — engine/io_view.h's accessors: what io/ reads of a
 * program without its struct, a pipeline's stages through the transport
 * its pass installed, and the group's host collectives.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amp/fp8_scaling.h"
#include "comm/comm.h"
#include "engine/io_view.h"
#include "engine/program_internal.h"

int loom_io_usable(const loom_program *p)
{
	return loom_program_usable(p);
}

const loom_plan *loom_io_plan(const loom_program *p)
{
	return p ? &p->plan : NULL;
}

loom_train_state *loom_io_state(loom_program *p)
{
	return p ? &p->ts : NULL;
}

const loom_arena *loom_io_arena(const loom_program *p)
{
	return p ? &p->arena : NULL;
}

void *loom_io_value_ptr(const loom_program *p, loom_value v)
{
	return loom_value_ptr(p, v);
}

size_t loom_io_value_bytes(const loom_program *p, loom_value v)
{
	return loom_value_bytes(p, v);
}

void loom_io_clear_error(loom_program *p)
{
	loom_error_clear(&p->err);
}

const char *loom_io_backend(const loom_program *p)
{
	return p->be->describe(p->be_ctx);
}

int loom_io_stages(const loom_program *p, loom_stage_info *out)
{
	const loom_transport *t = p->transport;
	*out = (loom_stage_info){ .stages = 1, .replicas = p->plan.world, .replica = p->plan.rank,
				  .group_rank = p->plan.rank, .n_graph = p->plan.g->n };
	if (!p->plan.pipe || !t || !t->stages)
		return 0;
	t->stages(p, out);
	return 1;
}

int loom_io_leaf_owner(const loom_program *p, loom_value v)
{
	const loom_transport *t = p->transport;
	return t && t->leaf_owner ? t->leaf_owner(p, v) : 0;
}

loom_status loom_io_stage_fetch(loom_program *p, int stage, const void *addr, void *dst,
				size_t bytes)
{
	const loom_transport *t = p->transport;
	if (!t || !t->fetch)
		return loom_program_fail(p, LOOM_ERR_STATE, "stage %d: this program has no stages "
					 "to fetch from", stage);
	return t->fetch(p, stage, addr, dst, bytes);
}

int loom_io_has_host(const loom_program *p)
{
	return p->plan.opts.pg && loom_pg_comm(p->plan.opts.pg, LOOM_COMM_HOST);
}

static loom_status host_failed(loom_program *p, loom_status st, const char *what)
{
	if (!p->plan.opts.pg)
		return loom_program_fail(p, st, "%s: the program has no process group", what);
	return loom_program_fail(p, st, "%s: %s", what, loom_pg_error(p->plan.opts.pg));
}

loom_status loom_io_host_broadcast(loom_program *p, void *buf, size_t bytes, int root,
				   const char *what)
{
	loom_comm *c = p->plan.opts.pg ? loom_pg_comm(p->plan.opts.pg, LOOM_COMM_HOST) : NULL;
	loom_status st = c ? loom_comm_broadcast(c, buf, bytes, root) : LOOM_ERR_UNSUPPORTED;
	return st != LOOM_OK ? host_failed(p, st, what) : LOOM_OK;
}

loom_status loom_io_host_allgather(loom_program *p, const void *mine, size_t bytes, void *all,
				   const char *what)
{
	loom_comm *c = p->plan.opts.pg ? loom_pg_comm(p->plan.opts.pg, LOOM_COMM_HOST) : NULL;
	loom_status st = c ? loom_comm_allgather(c, mine, bytes, all) : LOOM_ERR_UNSUPPORTED;
	return st != LOOM_OK ? host_failed(p, st, what) : LOOM_OK;
}

size_t loom_io_fp8_floats(const loom_program *p)
{
	return p->ts.fp8.n ? loom_fp8_state_floats(&p->ts.fp8) : 0;
}

loom_status loom_io_fp8_pack(loom_program *p, float *out)
{
	loom_status st = loom_exec_fp8_host(p); /* a device's copy first */
	if (st == LOOM_OK)
		loom_fp8_state_pack(&p->ts.fp8, out);
	return st;
}

loom_status loom_io_fp8_unpack(loom_program *p, const float *in, int check_only, char *err,
			       size_t errlen)
{
	if (!check_only) {
		if (loom_fp8_state_unpack(&p->ts.fp8, in, err, errlen))
			return LOOM_ERR_FORMAT;
		/* and onto the device where the state lives there */
		loom_status st = loom_exec_fp8_device(p);
		if (st != LOOM_OK)
			snprintf(err, errlen, "%s", loom_program_error(p));
		return st;
	}
	/* A probe with copies of the tensors and the history, so a refused
	 * record leaves the state as it was. */
	loom_fp8_state probe = p->ts.fp8;
	loom_fp8_tensor *t = malloc(sizeof(*t) * (size_t)probe.n);
	float *h = malloc(sizeof(float) * ((size_t)probe.n * probe.history_len + 1));
	loom_status st = LOOM_ERR_NOMEM;
	if (t && h) {
		memcpy(t, probe.t, sizeof(*t) * (size_t)probe.n);
		probe.t = t;
		probe.history = h;
		st = loom_fp8_state_unpack(&probe, in, err, errlen) ? LOOM_ERR_FORMAT : LOOM_OK;
	}
	free(t);
	free(h);
	return st;
}
