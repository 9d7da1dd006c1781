/*
 * dist/zero.c — ZeRO stage 1 (DeepSpeed's, llm.c's zero.cuh) as a pass over
 * the step list: every bucket (padded by the bucket pass to a multiple of
 * the world size) is split into world equal contiguous shards; rank r
 * reduce-scatters each bucket so that its shard holds the sum, updates the
 * parameter elements of its shards only, with optimizer state kept for
 * those elements only, and writes each updated element into its gradient's
 * place in the bucket; an all-gather per bucket then brings every rank's
 * updated elements to every rank, and a copy step puts them back into the
 * parameters. The same elementwise update on the same sums as plain data
 * parallelism, done once instead of world times.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "dist/dist.h"

static size_t align64(size_t x)
{
	return (x + 63) & ~(size_t)63;
}

/* The slot whose gradient is v, -1 if none. */
static int slot_of_grad(const loom_plan *pl, loom_value v)
{
	for (int s = 0; s < pl->n_params; s++)
		if (pl->params[s].grad == v)
			return s;
	return -1;
}

/* This rank's pieces, bucket by bucket, and the shard-local state layout:
 * per bucket and state buffer, shard elements of the state dtype. */
static loom_status make_pieces(loom_plan *pl)
{
	const loom_buckets *bk = &pl->buckets;
	int cap = bk->ngrad ? bk->ngrad : 1;
	loom_optim_piece *pc = calloc((size_t)cap, sizeof(*pc));
	if (!pc)
		return LOOM_ERR_NOMEM;
	int n = 0;
	size_t state = 0;
	for (int k = 0; k < bk->n; k++) {
		const loom_bucket *b = &bk->b[k];
		size_t dsz = loom_dtype_size(b->dtype);
		int64_t shard = b->count / pl->world, lo = shard * pl->rank, hi = lo + shard;
		size_t ssz = 0, base[2] = { 0, 0 };
		for (int j = b->first; j < b->first + b->n; j++) {
			int s = slot_of_grad(pl, bk->grad[j]);
			if (s < 0)
				continue;
			ssz = loom_dtype_size(pl->params[s].state_dtype);
		}
		for (int i = 0; i < pl->n_state; i++) {
			base[i] = state;
			state += align64((size_t)shard * ssz);
		}
		for (int j = b->first; j < b->first + b->n; j++) {
			int s = slot_of_grad(pl, bk->grad[j]);
			if (s < 0)
				continue;
			int64_t e0 = (int64_t)(bk->offset[j] / dsz), e1 = e0 + pl->params[s].numel;
			int64_t a = e0 > lo ? e0 : lo, z = e1 < hi ? e1 : hi;
			if (a >= z)
				continue;
			pc[n++] = (loom_optim_piece){
				.slot = s,
				.off = a - e0,
				.n = z - a,
				.state_off = { base[0] + (size_t)(a - lo) * ssz,
					       base[1] + (size_t)(a - lo) * ssz },
				.pack = 1,
				.pack_off = b->base + (size_t)a * dsz,
			};
		}
	}
	free(pl->pieces);
	pl->pieces = pc;
	pl->n_pieces = n;
	pl->state_bytes = state;
	return LOOM_OK;
}

/* Reduce-scatters in place of the all-reduces; after the optimizer, an
 * all-gather per bucket, the wait, and a copy per bucket. */
static loom_status rewrite_steps(loom_plan *pl)
{
	int nb = pl->buckets.n;
	loom_step *st = realloc(pl->steps, sizeof(*st) * (size_t)(pl->n_steps + 2 * nb + 1));
	if (!st)
		return LOOM_ERR_NOMEM;
	pl->steps = st;
	for (int i = 0; i < pl->n_steps; i++) {
		if (st[i].kind == LOOM_STEP_COLLECTIVE && st[i].coll == LOOM_COLL_ALLREDUCE)
			st[i].coll = LOOM_COLL_REDUCE_SCATTER;
		if (st[i].kind == LOOM_STEP_OPTIM) {
			st[i].first = 0;
			st[i].last = pl->n_pieces;
		}
	}
	for (int k = 0; k < nb; k++)
		st[pl->n_steps++] = (loom_step){ .kind = LOOM_STEP_COLLECTIVE, .stream = LOOM_STREAM_COMM,
						 .phase = LOOM_PHASE_OPTIMIZER, .v = pl->buckets.b[k].node,
						 .coll = LOOM_COLL_ALLGATHER, .index = k };
	st[pl->n_steps++] = (loom_step){ .kind = LOOM_STEP_WAIT, .stream = LOOM_STREAM_COMPUTE,
					 .phase = LOOM_PHASE_OPTIMIZER, .v = LOOM_NONE, .index = -1 };
	for (int k = 0; k < nb; k++)
		st[pl->n_steps++] = (loom_step){ .kind = LOOM_STEP_COPY, .stream = LOOM_STREAM_COMPUTE,
						 .phase = LOOM_PHASE_OPTIMIZER, .v = LOOM_NONE, .index = k };
	return LOOM_OK;
}

loom_status loom_zero_plan(loom_plan *pl, const loom_backend *be, char *err, size_t errlen)
{
	loom_status st;
	if (pl->zero != 1) {
		snprintf(err, errlen, "zero: stage %d is not one loom has (0 or 1)", pl->zero);
		return LOOM_ERR_INVALID;
	}
	/* Nothing to shard: one rank, or no optimizer. */
	if (pl->world <= 1 || pl->buckets.n == 0 || pl->opts.optim.kind == LOOM_OPTIM_NONE) {
		pl->zero = 0;
		return LOOM_OK;
	}
	if (!(be->caps & LOOM_BE_SHARDED_OPTIM) || !be->grads_finite) {
		snprintf(err, errlen,
			 "zero 1: the %s backend's optimizer cannot update a shard of a parameter; "
			 "compile without zero_stage", be->name);
		return LOOM_ERR_UNSUPPORTED;
	}
	if ((st = make_pieces(pl)) != LOOM_OK || (st = rewrite_steps(pl)) != LOOM_OK) {
		snprintf(err, errlen, "zero 1: out of memory");
		return st;
	}
	return LOOM_OK;
}

/* ------------------------------------------------------------ checkpoints */

/* Bucket k's slot-s member: its element offset in the bucket, -1 if none. */
static int64_t member_at(const loom_plan *pl, int s, int *bucket)
{
	const loom_buckets *bk = &pl->buckets;
	for (int k = 0; k < bk->n; k++)
		for (int j = bk->b[k].first; j < bk->b[k].first + bk->b[k].n; j++)
			if (bk->grad[j] == pl->params[s].grad) {
				*bucket = k;
				return (int64_t)(bk->offset[j] / loom_dtype_size(bk->b[k].dtype));
			}
	return -1;
}

/*
 * Slot s's state buffer k (k < 0: its O2 master), whole: every rank's shard
 * of the slot's bucket (the values of its pieces, in bucket order, zero
 * where this rank has no piece) is gathered, and the slot's elements are
 * taken from the bucket's. Masters are kept whole on every rank, but only
 * the shard's elements are updated there.
 */
static loom_status gather(loom_program *p, int s, int k, void *dst)
{
	const loom_plan *pl = &p->plan;
	const loom_param_slot *sl = &pl->params[s];
	size_t esz = k < 0 ? loom_dtype_size(pl->g->nodes[sl->master].dtype) :
			     loom_dtype_size(sl->state_dtype);
	int b = -1;
	int64_t e0 = member_at(pl, s, &b);
	if (e0 < 0)
		return loom_program_fail(p, LOOM_ERR_STATE, "zero: parameter %d is in no bucket", s);
	int64_t shard = pl->buckets.b[b].count / pl->world;
	loom_comm *host = loom_pg_comm(pl->opts.pg, LOOM_COMM_HOST);
	unsigned char *mine = calloc((size_t)shard ? (size_t)shard : 1, esz);
	size_t n_all = (size_t)shard * (size_t)pl->world;
	unsigned char *all = malloc((n_all ? n_all : 1) * esz);
	loom_status st = LOOM_OK;
	if (!mine || !all) {
		st = loom_program_fail(p, LOOM_ERR_NOMEM, "zero: out of memory gathering state");
		goto out;
	}
	/* This rank's pieces of bucket b, at their shard positions. */
	int64_t lo = shard * pl->rank;
	for (int i = 0; i < pl->n_pieces && st == LOOM_OK; i++) {
		const loom_optim_piece *pc = &pl->pieces[i];
		int pb = -1;
		int64_t pe0 = member_at(pl, pc->slot, &pb);
		if (pb != b)
			continue;
		const unsigned char *src =
			k >= 0 ? p->arena.state + pc->state_off[k] :
				 (const unsigned char *)loom_value_ptr(p, pl->params[pc->slot].master) +
					 (size_t)pc->off * esz;
		st = loom_program_download(p, mine + (size_t)(pe0 + pc->off - lo) * esz, src,
					   (size_t)pc->n * esz);
	}
	if (st != LOOM_OK)
		goto out;
	if (!host || (st = loom_comm_allgather(host, mine, (size_t)shard * esz, all)) != LOOM_OK) {
		st = loom_program_fail(p, host ? st : LOOM_ERR_UNSUPPORTED, "zero: gathering state: %s",
				       loom_pg_error(pl->opts.pg));
		goto out;
	}
	memcpy(dst, all + (size_t)e0 * esz, (size_t)sl->numel * esz);
out:
	free(mine);
	free(all);
	return st;
}

loom_status loom_zero_gather_state(loom_program *p, int s, int k, void *dst)
{
	return gather(p, s, k, dst);
}

loom_status loom_zero_gather_master(loom_program *p, int s, void *dst)
{
	return gather(p, s, -1, dst);
}

loom_status loom_zero_scatter_state(loom_program *p, int s, int k, const void *src)
{
	const loom_plan *pl = &p->plan;
	size_t ssz = loom_dtype_size(pl->params[s].state_dtype);
	const unsigned char *from = src;
	for (int i = 0; i < pl->n_pieces; i++) {
		const loom_optim_piece *pc = &pl->pieces[i];
		if (pc->slot != s)
			continue;
		loom_status st = loom_program_upload(p, p->arena.state + pc->state_off[k],
						     from + (size_t)pc->off * ssz, (size_t)pc->n * ssz);
		if (st != LOOM_OK)
			return st;
	}
	return LOOM_OK;
}
