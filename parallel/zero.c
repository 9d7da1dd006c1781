/*
 * parallel/zero.c — ZeRO stage 1 (DeepSpeed's, llm.c's zero.cuh) as a pass over
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
#include "parallel/parallel.h"

static size_t align64(size_t x)
{
	return (x + 63) & ~(size_t)63;
}

int loom_zero_slot_of_grad(const loom_plan *pl, loom_value v)
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
	/* ZeRO-3: every piece's parameter lives in its shard only, the f32
	 * master shard (O0/O1: the parameter's values) and, under O2, the
	 * half copy the optimizer packs into the store after the buckets. */
	int z3 = pl->zero == 3;
	loom_optim_piece *pc = calloc((size_t)cap, sizeof(*pc));
	size_t *master_at = calloc((size_t)(bk->n ? bk->n : 1), sizeof(size_t));
	if (!pc || !master_at) {
		free(pc);
		free(master_at);
		return LOOM_ERR_NOMEM;
	}
	int n = 0;
	size_t state = 0, masters = 0;
	for (int k = 0; k < bk->n; k++) {
		const loom_bucket *b = &bk->b[k];
		size_t dsz = loom_dtype_size(b->dtype);
		int64_t shard = b->count / pl->world, lo = shard * pl->rank, hi = lo + shard;
		size_t ssz = 0, base[2] = { 0, 0 }, mbase = masters;
		int has_master = 0;
		for (int j = b->first; j < b->first + b->n; j++) {
			int s = loom_zero_slot_of_grad(pl, bk->grad[j]);
			if (s < 0)
				continue;
			ssz = loom_dtype_size(pl->params[s].state_dtype);
			has_master |= pl->params[s].master != LOOM_NONE || z3;
		}
		for (int i = 0; i < pl->n_state; i++) {
			base[i] = state;
			state += align64((size_t)shard * ssz);
		}
		/* O2: the bucket's shard of fp32 masters (laid after all the
		 * state below). */
		master_at[k] = mbase;
		if (has_master)
			masters += align64((size_t)shard * sizeof(float));
		for (int j = b->first; j < b->first + b->n; j++) {
			int s = loom_zero_slot_of_grad(pl, bk->grad[j]);
			if (s < 0)
				continue;
			int64_t e0 = (int64_t)(bk->offset[j] / dsz), e1 = e0 + pl->params[s].numel;
			int64_t a = e0 > lo ? e0 : lo, z = e1 < hi ? e1 : hi;
			if (a >= z)
				continue;
			int half = pl->params[s].master != LOOM_NONE;
			pc[n++] = (loom_optim_piece){
				.slot = s,
				.off = a - e0,
				.n = z - a,
				.state_off = { base[0] + (size_t)(a - lo) * ssz,
					       base[1] + (size_t)(a - lo) * ssz },
				.pack = !z3 || half,
				.pack_off = (z3 ? loom_zero3_half_at(pl, k) + (size_t)(a - lo) * dsz :
						  b->base + (size_t)a * dsz),
				.shard_master = half || z3,
				.master_off = mbase + (size_t)(a - lo) * sizeof(float),
			};
		}
	}
	for (int i = 0; i < n; i++)
		pc[i].master_off += state;
	for (int k = 0; k < bk->n; k++)
		master_at[k] += state;
	free(pl->pieces);
	pl->pieces = pc;
	pl->n_pieces = n;
	pl->state_bytes = state;
	pl->master_shard_bytes = pl->master_bytes = masters;
	if (z3)
		loom_zero3_sources(pl, master_at, state + masters);
	free(master_at);
	return LOOM_OK;
}

void loom_zero_mark_masters(loom_plan *pl)
{
	if (pl->zero < 1 || pl->world <= 1 || pl->opts.optim.kind == LOOM_OPTIM_NONE)
		return;
	for (int s = 0; s < pl->n_params; s++)
		if (pl->params[s].master != LOOM_NONE)
			pl->g->nodes[pl->params[s].master].flags |= LOOM_NODE_SHARDED;
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

loom_status loom_zero_plan(loom_plan *pl, unsigned shard_caps, const char *backend, char *err,
			   size_t errlen)
{
	loom_status st;
	if (pl->zero < 1 || pl->zero > 3) {
		snprintf(err, errlen, "zero: stage %d is not one loom has (0, 1, 2 or 3)", pl->zero);
		return LOOM_ERR_INVALID;
	}
	/* Nothing to shard: one rank, or no optimizer. */
	if (pl->world <= 1 || pl->buckets.n == 0 || pl->opts.optim.kind == LOOM_OPTIM_NONE) {
		pl->zero = 0;
		return LOOM_OK;
	}
	if (!(shard_caps & LOOM_SHARD_OPTIM)) {
		snprintf(err, errlen,
			 "zero %d: the %s backend's optimizer cannot update a shard of a parameter; "
			 "compile without zero_stage", pl->zero, backend);
		return LOOM_ERR_UNSUPPORTED;
	}
	if (pl->opts.optim.clip_grad > 0 &&
	    !(shard_caps & (LOOM_SHARD_SUMSQ | LOOM_SHARD_SUMSQ_DEVICE))) {
		snprintf(err, errlen,
			 "zero %d: the %s backend cannot take a shard's gradient norm, which "
			 "clip_grad needs; compile without zero_stage or clip_grad", pl->zero,
			 backend);
		return LOOM_ERR_UNSUPPORTED;
	}
	/* ZeRO-3's parameters are gathered by the steps of its own pass, which
	 * must have run (parallel/pass_list.c: 'zero3 gathers'). */
	if (pl->zero == 3 && pl->n_gathers == 0) {
		snprintf(err, errlen, "zero 3: no parameter gathers were planned (the compile "
			 "pass 'zero3 gathers' did not run)");
		return LOOM_ERR_STATE;
	}
	if ((st = make_pieces(pl)) != LOOM_OK ||
	    (st = pl->zero >= 2 ? loom_zero2_steps(pl) : rewrite_steps(pl)) != LOOM_OK ||
	    (pl->zero == 3 && (st = loom_zero3_steps(pl)) != LOOM_OK)) {
		snprintf(err, errlen, st == LOOM_ERR_NOMEM ? "zero %d: out of memory" :
			 "zero %d: a gather no step reads (a bug in parallel/zero3.c)", pl->zero);
		return st;
	}
	if (pl->zero == 3)
		pl->gathered_peak = loom_zero3_gathered_peak(pl);
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

/* Where piece pc's buffer k lies (k -1: its f32 master shard; -2: ZeRO-3's
 * packed half parameter shard): element pc->off's. */
static unsigned char *piece_buf(loom_program *p, const loom_optim_piece *pc, int k)
{
	if (k == -2)
		return p->arena.bucket + pc->pack_off;
	return p->arena.state + (k >= 0 ? pc->state_off[k] : pc->master_off);
}

/* The element size of slot s's buffer k (as piece_buf). */
static size_t buf_esz(const loom_plan *pl, int s, int k)
{
	const loom_param_slot *sl = &pl->params[s];
	if (k == -2)
		return loom_dtype_size(pl->g->nodes[sl->param].dtype);
	if (k == -1)
		return sl->master != LOOM_NONE ? loom_dtype_size(pl->g->nodes[sl->master].dtype) :
						 sizeof(float);
	return loom_dtype_size(sl->state_dtype);
}

/*
 * Slot s's state buffer k (k < 0: its O2 master), whole: every rank's shard
 * of the slot's bucket (the values of its pieces, in bucket order, zero
 * where this rank has no piece) is gathered, and the slot's elements are
 * taken from the bucket's.
 */
loom_status loom_zero_gather(loom_program *p, int s, int k, void *dst)
{
	const loom_plan *pl = &p->plan;
	const loom_param_slot *sl = &pl->params[s];
	size_t esz = buf_esz(pl, s, k);
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
		st = loom_program_download(p, mine + (size_t)(pe0 + pc->off - lo) * esz,
					   piece_buf(p, pc, k), (size_t)pc->n * esz);
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

loom_status loom_zero_scatter(loom_program *p, int s, int k, const void *src)
{
	const loom_plan *pl = &p->plan;
	size_t esz = buf_esz(pl, s, k);
	const unsigned char *from = src;
	for (int i = 0; i < pl->n_pieces; i++) {
		const loom_optim_piece *pc = &pl->pieces[i];
		if (pc->slot != s || (k == -1 && !pc->shard_master) || (k == -2 && !pc->pack))
			continue;
		loom_status st = loom_program_upload(p, piece_buf(p, pc, k),
						     from + (size_t)pc->off * esz, (size_t)pc->n * esz);
		if (st != LOOM_OK)
			return st;
	}
	return LOOM_OK;
}

int loom_zero_master_slot(const loom_program *p, loom_value v)
{
	const loom_plan *pl = &p->plan;
	if (!pl->master_shard_bytes || v == LOOM_NONE)
		return -1;
	for (int s = 0; s < pl->n_params; s++)
		if (pl->params[s].param == v || pl->params[s].master == v)
			return pl->params[s].master != LOOM_NONE ? s : -1;
	return -1;
}

/* Rank 0's initial value of v (drawn as loom_init_value draws it) to every
 * rank, each keeping its pieces of slot s's buffer k. */
static loom_status start_one(loom_program *p, loom_comm *host, loom_value v, int s, int k)
{
	const loom_plan *pl = &p->plan;
	size_t bytes = (size_t)pl->params[s].numel * loom_dtype_size(pl->g->nodes[v].dtype);
	loom_status st;
	void *m = malloc(bytes ? bytes : 1);
	if (!m)
		return loom_program_fail(p, LOOM_ERR_NOMEM, "zero: out of memory for '%s'",
					 pl->g->nodes[v].name);
	loom_init_value(pl->g, v, m);
	if (!host || (st = loom_comm_broadcast(host, m, bytes, 0)) != LOOM_OK)
		st = loom_program_fail(p, host ? st : LOOM_ERR_UNSUPPORTED,
				       "zero: broadcast of rank 0's '%s': %s", pl->g->nodes[v].name,
				       loom_pg_error(pl->opts.pg));
	else
		st = loom_zero_scatter(p, s, k, m);
	free(m);
	return st;
}

/* Rank 0's initial masters (drawn as loom_init_value draws them, in f32)
 * to every rank, each keeping its pieces: what the broadcast of whole
 * masters does for plain data parallelism. ZeRO-3: the parameters too
 * (O0/O1 into the f32 shards, O2 into the half ones). */
loom_status loom_zero_start(loom_program *p)
{
	const loom_plan *pl = &p->plan;
	loom_comm *host = loom_pg_comm(pl->opts.pg, LOOM_COMM_HOST);
	loom_status st = LOOM_OK;
	for (int s = 0; s < pl->n_params && st == LOOM_OK; s++) {
		const loom_param_slot *sl = &pl->params[s];
		if (sl->master != LOOM_NONE && pl->master_shard_bytes)
			st = start_one(p, host, sl->master, s, -1);
		if (st == LOOM_OK && pl->zero == 3)
			st = start_one(p, host, sl->param, s, sl->master != LOOM_NONE ? -2 : -1);
	}
	return st;
}

int loom_zero_shard_of(const loom_program *p, loom_value v, int *k)
{
	const loom_plan *pl = &p->plan;
	if (!pl->zero || v < 0 || v >= pl->g->n || !(pl->g->nodes[v].flags & LOOM_NODE_SHARDED))
		return -1;
	for (int s = 0; s < pl->n_params; s++) {
		const loom_param_slot *sl = &pl->params[s];
		if (sl->master == v && pl->master_shard_bytes) {
			*k = -1;
			return s;
		}
		if (sl->param == v && pl->zero == 3) {
			*k = sl->master != LOOM_NONE ? -2 : -1;
			return s;
		}
	}
	return -1;
}

loom_status loom_zero_value_read(loom_program *p, loom_value v, void *dst)
{
	int k, s = loom_zero_shard_of(p, v, &k);
	if (s < 0)
		return loom_program_fail(p, LOOM_ERR_STATE, "zero: '%s' is not sharded",
					 p->plan.g->nodes[v].name);
	return loom_zero_gather(p, s, k, dst);
}
