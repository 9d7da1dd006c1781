/*
 * sampler.c — torch.utils.data.DistributedSampler semantics in C: one shared
 * permutation per (seed, epoch), padded or cut to a multiple of the world
 * size, dealt out round-robin to the ranks. Every rank computes the same
 * permutation itself, so no communication is needed.
 */
#include <stdlib.h>
#include <string.h>

#include "base/splitmix.h"
#include "data_internal.h"
#include "loom_data.h"

struct loom_sampler {
	int64_t n;
	int rank, world;
	int shuffle, drop_last;
	uint64_t seed;
	int64_t epoch;
	int64_t num_samples; /* per rank */
	int64_t *perm;       /* n, scratch for the shared permutation */
	int64_t *indices;    /* num_samples, this rank's share */
	loom_error err; /* the last failure (base/errf.h) */
};


/* A uniform draw from [0, bound): rejecting the low 2^64 mod bound values
 * removes the modulo bias that would favour small indices. */
static uint64_t sampler_below(uint64_t *state, uint64_t bound)
{
	uint64_t threshold = (0 - bound) % bound;
	uint64_t r;

	do
		r = loom_splitmix64(state);
	while (r < threshold);
	return r % bound;
}

/* Fisher-Yates over [0, n), seeded from both seed and epoch through the mixer
 * so that neighbouring epochs give unrelated permutations. */
static void sampler_permute(loom_sampler *s)
{
	uint64_t mix = s->seed;
	uint64_t state;
	int64_t i;

	for (i = 0; i < s->n; i++)
		s->perm[i] = i;
	if (!s->shuffle)
		return;
	state = loom_splitmix64(&mix) ^ (uint64_t)s->epoch;
	(void)loom_splitmix64(&state);
	for (i = s->n - 1; i > 0; i--) {
		int64_t j = (int64_t)sampler_below(&state, (uint64_t)i + 1);
		int64_t t = s->perm[i];

		s->perm[i] = s->perm[j];
		s->perm[j] = t;
	}
}

/* Rank r's k-th index is item r + k * world of the padded list, whose items
 * past n repeat the permutation from its start (perm[j mod n]), exactly as
 * DistributedSampler's `indices += indices * ceil(pad / n)`[:pad]. */
static void sampler_deal(loom_sampler *s)
{
	int64_t k;

	for (k = 0; k < s->num_samples; k++) {
		int64_t j = s->rank + k * s->world;

		s->indices[k] = s->perm[j < s->n ? j : (j - s->n) % s->n];
	}
}

loom_status loom_sampler_new(int64_t n, int rank, int world, int shuffle,
			     uint64_t seed, int drop_last, loom_sampler **out,
			     char *err, size_t errlen)
{
	loom_sampler *s;
	loom_status st;

	st = loom_data_start(out, sizeof(*out), "loom_sampler_new: out is NULL", err, errlen);
	if (st != LOOM_OK)
		return st;
	if (n < 0) {
		loom_data_fail(err, errlen,
			       "sampler: dataset size %lld is negative",
			       (long long)n);
		return LOOM_ERR_INVALID;
	}
	if (world < 1) {
		loom_data_fail(err, errlen,
			       "sampler: world size %d, expected >= 1", world);
		return LOOM_ERR_INVALID;
	}
	if (rank < 0 || rank >= world) {
		loom_data_fail(err, errlen,
			       "sampler: rank %d out of range [0, %d) for world size %d",
			       rank, world, world);
		return LOOM_ERR_INVALID;
	}

	s = calloc(1, sizeof(*s));
	if (!s)
		goto out_nomem;
	s->n = n;
	s->rank = rank;
	s->world = world;
	s->shuffle = shuffle != 0;
	s->drop_last = drop_last != 0;
	s->seed = seed;
	s->num_samples = s->drop_last ? n / world : (n + world - 1) / world;
	/* +1: never ask malloc for 0 bytes, whose NULL would look like failure. */
	s->perm = malloc((size_t)(n + 1) * sizeof(*s->perm));
	s->indices = malloc((size_t)(s->num_samples + 1) * sizeof(*s->indices));
	if (!s->perm || !s->indices)
		goto out_free_s;
	sampler_permute(s);
	sampler_deal(s);
	*out = s;
	return LOOM_OK;

out_free_s:
	loom_sampler_free(s);
out_nomem:
	loom_data_fail(err, errlen,
		       "sampler: cannot allocate indices for %lld items",
		       (long long)n);
	return LOOM_ERR_NOMEM;
}

void loom_sampler_free(loom_sampler *s)
{
	if (!s)
		return;
	free(s->perm);
	free(s->indices);
	free(s);
}

loom_status loom_sampler_set_epoch(loom_sampler *s, int64_t epoch)
{
	if (!s)
		return LOOM_ERR_INVALID;
	if (epoch < 0) {
		loom_error_set(&s->err, LOOM_ERR_INVALID,
			       "sampler: epoch %lld is negative",
			       (long long)epoch);
		return LOOM_ERR_INVALID;
	}
	s->epoch = epoch;
	sampler_permute(s);
	sampler_deal(s);
	loom_error_clear(&s->err);
	return LOOM_OK;
}

int64_t loom_sampler_epoch(const loom_sampler *s)
{
	return s ? s->epoch : 0;
}

int64_t loom_sampler_len(const loom_sampler *s)
{
	return s ? s->num_samples : 0;
}

int64_t loom_sampler_size(const loom_sampler *s)
{
	return s ? s->n : 0;
}

/* Rank r's k-th index is item r + k * world of the padded list (as in
 * sampler_deal): it is r's own while that position is below n. */
int64_t loom_sampler_len_unpadded(const loom_sampler *s)
{
	int64_t own;

	if (!s || s->rank >= s->n)
		return 0;
	own = (s->n - s->rank + s->world - 1) / s->world;
	return own < s->num_samples ? own : s->num_samples;
}

const int64_t *loom_sampler_indices(const loom_sampler *s)
{
	return s ? s->indices : NULL;
}

const char *loom_sampler_error(const loom_sampler *s)
{
	return s ? s->err.msg : "sampler is NULL";
}
