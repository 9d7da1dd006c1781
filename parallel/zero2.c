/*
 * parallel/zero2.c — ZeRO stage 2 (DeepSpeed's): on top of stage 1's
 * sharded optimizer state and masters (parallel/zero.c), a rank keeps only
 * its shard of the reduced gradients. The gradients are still made into
 * their buckets (views at their offsets, nothing copied), but the bucket
 * region is no longer one bucket after the other for the whole step: each
 * bucket holds all of its bytes only from the first of its gradients made
 * to the end of its reduce-scatter, and this rank's shard of it from then
 * to the end of the step. So a later bucket may lie over an earlier one's
 * other ranks' shards once that one's reduce-scatter has ended, and the
 * region holds the shards plus the buckets in flight, not every gradient.
 *
 * The steps: a wait where a bucket is released (bucket_times) ends its
 * reduce-scatter (one in flight while backward goes on up to the next
 * bucket's first gradient); after the optimizer (which reads and writes the shards in place, as
 * under stage 1), the buckets are all-gathered one at a time, the last
 * made first, each followed by its wait and the copy into the parameters:
 * a bucket's bytes cover only the shards of the buckets made after it
 * (which are gathered and copied before) and free space.
 *
 * The layout is rank's own (its shard's place); the bucket pass, the
 * pieces and the collectives are stage 1's, so the update is the same
 * element by element, bit-identical to plain data parallelism.
 */
#include <stdlib.h>
#include <string.h>

#include "parallel/parallel.h"

#define ALIGN 64

static size_t align_up(size_t x)
{
	return (x + ALIGN - 1) & ~(size_t)(ALIGN - 1);
}

/*
 * Per bucket: where in the schedule its first gradient is made (start),
 * where its ALLREDUCE node stands (at), and where its bytes other than the
 * shard are free again (release: the first place after it where another
 * bucket's first gradient is made or another bucket is reduced, whose
 * steps begin with a wait; the schedule's end for the last one). So one
 * reduce-scatter is in flight while backward goes on up to the next
 * bucket's first gradient.
 */
static loom_status bucket_times(const loom_buckets *bk, const loom_graph *g, const loom_value *order,
				int *start, int *at, int *release)
{
	int *pos = malloc(sizeof(int) * (size_t)(g->n ? g->n : 1));
	if (!pos)
		return LOOM_ERR_NOMEM;
	for (int i = 0; i < g->n; i++)
		pos[order ? order[i] : i] = i;
	for (int k = 0; k < bk->n; k++) {
		const loom_bucket *b = &bk->b[k];
		at[k] = pos[b->node];
		start[k] = at[k];
		for (int j = b->first; j < b->first + b->n; j++) {
			loom_value v = bk->grad[j];
			loom_value u = g->nodes[v].made_by != LOOM_NONE ? g->nodes[v].made_by : v;
			if (pos[u] < start[k])
				start[k] = pos[u];
		}
	}
	for (int k = 0; k < bk->n; k++) {
		release[k] = g->n;
		for (int j = 0; j < bk->n; j++) {
			if (start[j] > at[k] && start[j] < release[k])
				release[k] = start[j];
			if (at[j] > at[k] && at[j] < release[k])
				release[k] = at[j];
		}
	}
	free(pos);
	return LOOM_OK;
}

typedef struct range {
	size_t lo, hi;
} range;

static size_t shard_lo(const loom_bucket *b, int world, int rank)
{
	return (size_t)(b->count / world) * (size_t)rank * loom_dtype_size(b->dtype);
}

static size_t shard_len(const loom_bucket *b, int world)
{
	return (size_t)(b->count / world) * loom_dtype_size(b->dtype);
}

/* Buckets in the order their first gradients are made (ties: by index). */
static int *by_start(const int *start, int n)
{
	int *o = malloc(sizeof(int) * (size_t)(n ? n : 1));
	if (!o)
		return NULL;
	for (int i = 0; i < n; i++)
		o[i] = i;
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && (start[o[j - 1]] > start[o[j]] ||
					  (start[o[j - 1]] == start[o[j]] && o[j - 1] > o[j]));
		     j--) {
			int t = o[j];
			o[j] = o[j - 1];
			o[j - 1] = t;
		}
	return o;
}

/* A bucket's bytes as placed: a multiple of ALIGN, so that a mirrored
 * place stays aligned. */
static size_t span_of(const loom_bucket *b)
{
	return align_up(b->bytes);
}

/*
 * Places the buckets in order ord (by start) in an address space where
 * this rank's shard of bucket c lies at shard_at(c) from the bucket's
 * start; base[] gets the places, the result is the space's size. The real
 * layout is this one (mirror 0: the shard at rank * shard) or its mirror
 * image (mirror 1: a place p is top - p - span, so the shard lies at
 * span - (rank + 1) * shard from the mirrored start): the last rank's
 * shard ends its bucket, and mirrored it starts it, as rank 0's does, so
 * a bucket's free part lies toward the space's top, where the next bucket
 * can grow over it.
 */
static size_t place(const loom_buckets *bk, const int *ord, const int *start, const int *rel,
		    int world, int rank, int mirror, range *busy, size_t *base)
{
	size_t top = 0;
	for (int i = 0; i < bk->n; i++) {
		const loom_bucket *b = &bk->b[ord[i]];
		/* What the bucket must not cover: the whole of every earlier
		 * bucket not yet released when its first gradient is made (a
		 * release at that very place waits before it), and every
		 * earlier bucket's shard (kept to the step's end). */
		int nb = 0;
		for (int q = 0; q < i; q++) {
			int e = ord[q];
			const loom_bucket *c = &bk->b[e];
			size_t lo = mirror ? span_of(c) - shard_lo(c, world, rank) - shard_len(c, world) :
					     shard_lo(c, world, rank);
			if (start[ord[i]] < rel[e])
				busy[nb++] = (range){ base[e], base[e] + span_of(c) };
			else
				busy[nb++] = (range){ base[e] + lo, base[e] + lo + shard_len(c, world) };
		}
		/* The lowest place that fits: 0 or right after a busy range. */
		size_t best = (size_t)-1;
		for (int c = -1; c < nb; c++) {
			size_t o = c < 0 ? 0 : align_up(busy[c].hi);
			int ok = o < best;
			for (int q = 0; q < nb && ok; q++)
				ok = o + span_of(b) <= busy[q].lo || o >= busy[q].hi ||
				     busy[q].lo == busy[q].hi;
			if (ok)
				best = o;
		}
		base[ord[i]] = best;
		if (best + span_of(b) > top)
			top = best + span_of(b);
	}
	return top;
}

/* The layout as placed, checked in real places: no bucket covers one
 * still whole when it starts, nor an earlier one's shard. 0: sound. */
static int unsound(const loom_buckets *bk, const int *start, const int *rel, int world, int rank)
{
	for (int i = 0; i < bk->n; i++)
		for (int j = 0; j < bk->n; j++) {
			const loom_bucket *a = &bk->b[i], *b = &bk->b[j];
			if (i == j || start[j] < start[i] || (start[j] == start[i] && j < i))
				continue;
			size_t lo = a->base, hi = a->base + a->bytes;
			if (start[j] >= rel[i]) {
				lo = a->base + shard_lo(a, world, rank);
				hi = lo + shard_len(a, world);
			}
			if (lo < hi && b->base < hi && lo < b->base + b->bytes)
				return 1;
		}
	return 0;
}

loom_status loom_zero2_layout(loom_buckets *bk, const loom_graph *g, int world, int rank)
{
	int n = bk->n;
	if (n == 0 || world <= 1)
		return LOOM_OK;
	int *start = malloc(sizeof(int) * (size_t)n), *at = malloc(sizeof(int) * (size_t)n);
	int *rel = malloc(sizeof(int) * (size_t)n), *ord = NULL;
	range *busy = malloc(sizeof(range) * (size_t)n);
	size_t *base = malloc(sizeof(size_t) * (size_t)n), *mbase = malloc(sizeof(size_t) * (size_t)n);
	loom_status st = LOOM_ERR_NOMEM;
	if (!start || !at || !rel || !busy || !base || !mbase)
		goto out;
	if ((st = bucket_times(bk, g, bk->order, start, at, rel)) != LOOM_OK)
		goto out;
	st = LOOM_ERR_NOMEM;
	if (!(ord = by_start(start, n)))
		goto out;
	/* Both ways; the smaller wins (the straight one on a tie). */
	size_t top = place(bk, ord, start, rel, world, rank, 0, busy, base);
	size_t mtop = place(bk, ord, start, rel, world, rank, 1, busy, mbase);
	for (int k = 0; k < n; k++)
		bk->b[k].base = mtop < top ? mtop - mbase[k] - span_of(&bk->b[k]) : base[k];
	bk->bytes = mtop < top ? mtop : top;
	st = unsound(bk, start, rel, world, rank) ? LOOM_ERR_INVALID : LOOM_OK;
out:
	free(start);
	free(at);
	free(rel);
	free(ord);
	free(busy);
	free(base);
	free(mbase);
	return st;
}

size_t loom_zero2_shard_bytes(const loom_plan *pl)
{
	size_t s = 0;
	for (int k = 0; k < pl->buckets.n; k++)
		s += shard_len(&pl->buckets.b[k], pl->world);
	return s;
}

/* The waits at the place at_pos of the schedule where buckets are
 * released, into st: ZeRO-3 waits for each released bucket's
 * reduce-scatter alone, so that the parameter gathers in flight go on;
 * else one wait for everything started. Returns the steps written. */
static int release_waits(const loom_plan *pl, const int *rel, int at_pos, loom_phase phase,
			 loom_step *st)
{
	int n = 0;
	for (int k = 0; k < pl->buckets.n && pl->zero == 3; k++)
		if (rel[k] == at_pos)
			st[n++] = (loom_step){ .kind = LOOM_STEP_WAIT, .stream = LOOM_STREAM_COMPUTE,
					       .phase = phase, .v = LOOM_NONE, .index = k };
	if (pl->zero != 3)
		st[n++] = (loom_step){ .kind = LOOM_STEP_WAIT, .stream = LOOM_STREAM_COMPUTE,
				       .phase = phase, .v = LOOM_NONE, .index = -1 };
	return n;
}

/* The plan's steps into st with a wait where a bucket is released (before
 * the first step there), reduce-scatters for the all-reduces and the
 * optimizer over every piece; *n the steps written, *grad_end and
 * *fwd_end where the GRAD and FORWARD runs now end. LOOM_ERR_INVALID if a
 * release has no step to wait at (its bytes would be reused under a
 * reduce-scatter in flight). */
static loom_status rewrite_steps(const loom_plan *pl, const int *rel, loom_step *st, int *n,
				 int *grad_end, int *fwd_end)
{
	int gn = pl->g->n;
	unsigned char *wait_at = calloc((size_t)gn + 1, 1);
	int *pos = malloc(sizeof(int) * (size_t)(gn ? gn : 1));
	loom_status rc = LOOM_ERR_NOMEM;
	if (!wait_at || !pos)
		goto out;
	for (int k = 0; k < pl->buckets.n; k++)
		wait_at[rel[k]] = 1;
	for (int i = 0; i < gn; i++)
		pos[pl->mp.schedule[i]] = i;
	*n = 0;
	*grad_end = pl->n_grad_steps;
	*fwd_end = pl->n_fwd_steps;
	for (int i = 0; i < pl->n_steps; i++) {
		loom_step s = pl->steps[i];
		if (i == pl->n_grad_steps)
			*grad_end = *n;
		if (i == pl->n_fwd_steps)
			*fwd_end = *n;
		int at_pos = s.v != LOOM_NONE && (s.kind == LOOM_STEP_NODE || s.kind == LOOM_STEP_ACCUM) ?
				     pos[s.v] : -1;
		if (at_pos >= 0 && at_pos < gn && wait_at[at_pos]) {
			wait_at[at_pos] = 0;
			*n += release_waits(pl, rel, at_pos, s.phase, st + *n);
		}
		if (s.kind == LOOM_STEP_COLLECTIVE && s.coll == LOOM_COLL_ALLREDUCE)
			s.coll = LOOM_COLL_REDUCE_SCATTER;
		if (s.kind == LOOM_STEP_OPTIM) {
			s.first = 0;
			s.last = pl->n_pieces;
		}
		st[(*n)++] = s;
	}
	rc = LOOM_OK;
	for (int i = 0; i < gn; i++)
		if (wait_at[i])
			rc = LOOM_ERR_INVALID;
	if (pl->n_grad_steps >= pl->n_steps)
		*grad_end = *n;
	if (pl->n_fwd_steps >= pl->n_steps)
		*fwd_end = *n;
out:
	free(wait_at);
	free(pos);
	return rc;
}

/* After the optimizer, per bucket, the last made first: its all-gather,
 * the wait and the copy into the parameters (ZeRO-3: none; the next
 * forward gathers each bucket). Returns the steps written. */
static int append_gathers(const loom_plan *pl, const int *ord, loom_step *st)
{
	int n = 0;
	for (int q = pl->zero == 3 ? -1 : pl->buckets.n - 1; q >= 0; q--) {
		int k = ord[q];
		st[n++] = (loom_step){ .kind = LOOM_STEP_COLLECTIVE, .stream = LOOM_STREAM_COMM,
				       .phase = LOOM_PHASE_OPTIMIZER, .v = pl->buckets.b[k].node,
				       .coll = LOOM_COLL_ALLGATHER, .index = k };
		st[n++] = (loom_step){ .kind = LOOM_STEP_WAIT, .stream = LOOM_STREAM_COMPUTE,
				       .phase = LOOM_PHASE_OPTIMIZER, .v = LOOM_NONE, .index = -1 };
		st[n++] = (loom_step){ .kind = LOOM_STEP_COPY, .stream = LOOM_STREAM_COMPUTE,
				       .phase = LOOM_PHASE_OPTIMIZER, .v = LOOM_NONE, .index = k };
	}
	return n;
}

/* Stage 1's reduce-scatters, a wait at each bucket's release; the
 * optimizer over the pieces; then per bucket, the last made first, its
 * all-gather, the wait and the copy into the parameters. */
loom_status loom_zero2_steps(loom_plan *pl)
{
	int nb = pl->buckets.n;
	int *start = malloc(sizeof(int) * (size_t)(nb ? nb : 1));
	int *at = malloc(sizeof(int) * (size_t)(nb ? nb : 1));
	int *rel = malloc(sizeof(int) * (size_t)(nb ? nb : 1));
	int *ord = NULL;
	loom_step *st = malloc(sizeof(*st) * (size_t)(pl->n_steps + 6 * nb + 1));
	loom_status rc = LOOM_ERR_NOMEM;
	int n, grad_end, fwd_end;
	if (!start || !at || !rel || !st)
		goto out;
	if ((rc = bucket_times(&pl->buckets, pl->g, pl->mp.schedule, start, at, rel)) != LOOM_OK)
		goto out;
	rc = LOOM_ERR_NOMEM;
	if (!(ord = by_start(start, nb)))
		goto out;
	if ((rc = rewrite_steps(pl, rel, st, &n, &grad_end, &fwd_end)) != LOOM_OK)
		goto out;
	n += append_gathers(pl, ord, st + n);
	free(pl->steps);
	pl->steps = st;
	st = NULL;
	pl->n_steps = n;
	pl->n_grad_steps = grad_end;
	pl->n_fwd_steps = fwd_end;
out:
	free(start);
	free(at);
	free(rel);
	free(ord);
	free(st);
	return rc;
}
