/*
 * engine/pass_api.c — p's backend as a pass sees it (engine/pass.h): its
 * name, where its memory is, its synchronize and streams, and its sharded
 * group's checks and sums, each refused with a message naming the backend
 * where the backend lacks it. A strategy calls these and never the
 * backend's table, which stays the engine's (engine/backend.h).
 */
#include "engine/backend.h"
#include "engine/pass.h"

const char *loom_pass_backend_name(const loom_program *p)
{
	return p->be->name;
}

int loom_pass_host_memory(const loom_program *p)
{
	return (p->be->caps & LOOM_BE_HOST_MEMORY) != 0;
}

/* A backend call's status, its message recorded on p where it failed. */
static loom_status backend_done(loom_program *p, loom_status st)
{
	return st != LOOM_OK ? loom_program_backend_fail(p, st) : LOOM_OK;
}

loom_status loom_pass_sync(loom_program *p)
{
	return backend_done(p, p->be->synchronize(p->be_ctx, &p->plan, &p->ts));
}

void *loom_pass_stream(loom_program *p, loom_stream which)
{
	return p->be->stream_handle(p->be_ctx, which);
}

unsigned loom_pass_shard_caps(const loom_program *p)
{
	const loom_backend_sharded *sd = p->be->sharded;
	if (!sd)
		return 0;
	return LOOM_SHARD_OPTIM | (sd->grads_finite_device ? LOOM_SHARD_FINITE_DEVICE : 0) |
	       (sd->grad_sumsq ? LOOM_SHARD_SUMSQ : 0) |
	       (sd->grad_sumsq_device ? LOOM_SHARD_SUMSQ_DEVICE : 0);
}

/* The backend's sharded group, or NULL and p's message that it cannot do
 * `what` (the entry `need` of the caps it lacks). */
static const loom_backend_sharded *sharded(loom_program *p, unsigned need, const char *what)
{
	if (loom_pass_shard_caps(p) & need)
		return p->be->sharded;
	loom_program_fail(p, LOOM_ERR_UNSUPPORTED, "the %s backend cannot %s", p->be->name, what);
	return NULL;
}

loom_status loom_pass_grads_finite(loom_program *p, int first, int last, int *finite)
{
	const loom_backend_sharded *sd = sharded(p, LOOM_SHARD_OPTIM, "check a shard");
	if (!sd)
		return LOOM_ERR_UNSUPPORTED;
	return backend_done(p, sd->grads_finite(p->be_ctx, &p->plan, &p->arena, first, last,
						finite));
}

loom_status loom_pass_grads_finite_device(loom_program *p, int first, int last, void **flag)
{
	const loom_backend_sharded *sd =
		sharded(p, LOOM_SHARD_FINITE_DEVICE, "check a shard on the device");
	if (!sd)
		return LOOM_ERR_UNSUPPORTED;
	return backend_done(p, sd->grads_finite_device(p->be_ctx, &p->plan, &p->arena, first,
						       last, flag));
}

loom_status loom_pass_grad_sumsq(loom_program *p, int first, int last, double *sumsq)
{
	const loom_backend_sharded *sd =
		sharded(p, LOOM_SHARD_SUMSQ, "take a shard's gradient norm");
	if (!sd)
		return LOOM_ERR_UNSUPPORTED;
	return backend_done(p, sd->grad_sumsq(p->be_ctx, &p->plan, &p->arena, &p->ts, first,
					      last, sumsq));
}

loom_status loom_pass_grad_sumsq_device(loom_program *p, int first, int last, void **sumsq)
{
	const loom_backend_sharded *sd =
		sharded(p, LOOM_SHARD_SUMSQ_DEVICE, "take a shard's gradient norm on the device");
	if (!sd)
		return LOOM_ERR_UNSUPPORTED;
	return backend_done(p, sd->grad_sumsq_device(p->be_ctx, &p->plan, &p->arena, &p->ts,
						      first, last, sumsq));
}
