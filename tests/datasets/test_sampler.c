/*
 * test_sampler.c — loom_sampler against DistributedSampler's contract: equal
 * length on every rank, complete coverage, the minimal padding or a clean
 * drop, round-robin dealing, and shuffles fixed by (seed, epoch).
 */
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "loom_data.h"

TestSuite(sampler);

static loom_sampler *make(int64_t n, int rank, int world, int shuffle,
			  uint64_t seed, int drop_last)
{
	char err[256];
	loom_sampler *s = NULL;
	loom_status st = loom_sampler_new(n, rank, world, shuffle, seed,
					  drop_last, &s, err, sizeof(err));

	cr_assert_eq(st, LOOM_OK, "%s", err);
	cr_assert_not_null(s);
	return s;
}

static void expect_invalid(int64_t n, int rank, int world, const char *want)
{
	char err[256];
	loom_sampler *s = (loom_sampler *)1;

	cr_assert_eq(loom_sampler_new(n, rank, world, 1, 0, 0, &s, err, sizeof(err)),
		     LOOM_ERR_INVALID);
	cr_assert_null(s);
	cr_assert(strstr(err, want), "message lacks \"%s\": %s", want, err);
}

Test(sampler, rejects_bad_arguments)
{
	expect_invalid(10, 0, 0, "world size 0, expected >= 1");
	expect_invalid(10, 0, -2, "world size -2");
	expect_invalid(10, 4, 4, "rank 4 out of range [0, 4)");
	expect_invalid(10, -1, 4, "rank -1 out of range");
	expect_invalid(-5, 0, 1, "dataset size -5 is negative");
}

Test(sampler, rejects_negative_epoch)
{
	loom_sampler *s = make(10, 0, 1, 1, 0, 0);

	cr_assert_eq(loom_sampler_set_epoch(s, -1), LOOM_ERR_INVALID);
	cr_assert(strstr(loom_sampler_error(s), "epoch -1 is negative"));
	loom_sampler_free(s);
}

/* The lists of a small case worked out by hand from DistributedSampler's
 * code: padding repeats the list's start, ranks take every world-th item. */
Test(sampler, matches_distributed_sampler_by_hand)
{
	/* n 10, world 4, padded: 0..9, 0, 1 */
	const int64_t pad[4][3] = {{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}};
	/* dropped: 0..7 */
	const int64_t drop[4][2] = {{0, 4}, {1, 5}, {2, 6}, {3, 7}};
	int r;

	for (r = 0; r < 4; r++) {
		loom_sampler *a = make(10, r, 4, 0, 0, 0);
		loom_sampler *b = make(10, r, 4, 0, 0, 1);

		cr_assert_eq(loom_sampler_len(a), 3);
		cr_assert_arr_eq(loom_sampler_indices(a), pad[r], sizeof(pad[r]));
		cr_assert_eq(loom_sampler_len(b), 2);
		cr_assert_arr_eq(loom_sampler_indices(b), drop[r], sizeof(drop[r]));
		loom_sampler_free(a);
		loom_sampler_free(b);
	}
}

Test(sampler, pads_past_n_when_world_exceeds_n)
{
	/* n 3, world 8: the list 0 1 2 repeats until it has 8 items. */
	int r;

	for (r = 0; r < 8; r++) {
		loom_sampler *s = make(3, r, 8, 0, 0, 0);

		cr_assert_eq(loom_sampler_len(s), 1);
		cr_assert_eq(loom_sampler_indices(s)[0], r % 3);
		loom_sampler_free(s);
	}
}

/* Checks the union over every rank of one (n, world, drop_last, shuffle). */
static void check_cover(int64_t n, int world, int drop_last, int shuffle,
			uint64_t seed, int64_t epoch)
{
	int64_t *hits = calloc((size_t)n + 1, sizeof(*hits));
	int64_t expect_len = drop_last ? n / world : (n + world - 1) / world;
	int64_t total = 0, i, distinct = 0, extra = 0;
	int r;

	for (r = 0; r < world; r++) {
		loom_sampler *s = make(n, r, world, shuffle, seed, drop_last);
		const int64_t *idx;

		cr_assert_eq(loom_sampler_set_epoch(s, epoch), LOOM_OK);
		idx = loom_sampler_indices(s);
		cr_assert_eq(loom_sampler_len(s), expect_len,
			     "n %lld world %d drop %d rank %d: len %lld",
			     (long long)n, world, drop_last, r,
			     (long long)loom_sampler_len(s));
		for (i = 0; i < expect_len; i++) {
			cr_assert(idx[i] >= 0 && idx[i] < n);
			hits[idx[i]]++;
		}
		total += expect_len;
		loom_sampler_free(s);
	}
	for (i = 0; i < n; i++) {
		distinct += hits[i] > 0;
		if (hits[i] > 1)
			extra += hits[i] - 1;
	}
	if (drop_last) {
		/* Disjoint, and only the unavoidable n mod world are left out. */
		cr_assert_eq(extra, 0, "n %lld world %d: repeats with drop_last",
			     (long long)n, world);
		cr_assert_eq(distinct, n - n % world);
	} else {
		/* Complete, and repeats only to reach a multiple of world. */
		cr_assert_eq(distinct, n, "n %lld world %d: %lld of %lld covered",
			     (long long)n, world, (long long)distinct, (long long)n);
		cr_assert_eq(extra, total - n);
		cr_assert_eq(total - n, (world - n % world) % world);
		if (n % world == 0)
			cr_assert_eq(extra, 0);
	}
	free(hits);
}

Test(sampler, union_over_ranks)
{
	const int64_t sizes[] = {0, 1, 2, 5, 7, 8, 16, 17, 100, 1001};
	size_t k;
	int world, drop, shuffle;

	for (k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++)
		for (world = 1; world <= 8; world++)
			for (drop = 0; drop <= 1; drop++)
				for (shuffle = 0; shuffle <= 1; shuffle++)
					check_cover(sizes[k], world, drop, shuffle,
						    42, 3);
}

Test(sampler, padding_when_n_below_world)
{
	/* n 3, world 8: the list wraps around twice, 5 repeats. */
	check_cover(3, 8, 0, 1, 7, 0);
}

static int same(const loom_sampler *a, const loom_sampler *b)
{
	return loom_sampler_len(a) == loom_sampler_len(b) &&
	       memcmp(loom_sampler_indices(a), loom_sampler_indices(b),
		      (size_t)loom_sampler_len(a) * sizeof(int64_t)) == 0;
}

Test(sampler, deterministic_per_seed_and_epoch)
{
	loom_sampler *a = make(1000, 1, 3, 1, 1234, 0);
	loom_sampler *b = make(1000, 1, 3, 1, 1234, 0);
	loom_sampler *c = make(1000, 1, 3, 1, 1235, 0);
	int64_t *first;
	size_t bytes = (size_t)loom_sampler_len(a) * sizeof(int64_t);

	cr_assert(same(a, b), "same seed and epoch, different order");
	cr_assert_not(same(a, c), "different seeds, same order");

	first = malloc(bytes);
	memcpy(first, loom_sampler_indices(a), bytes);
	cr_assert_eq(loom_sampler_set_epoch(a, 1), LOOM_OK);
	cr_assert_eq(loom_sampler_epoch(a), 1);
	cr_assert_neq(memcmp(first, loom_sampler_indices(a), bytes), 0,
		      "epochs 0 and 1 gave the same order");
	cr_assert_not(same(a, b));
	cr_assert_eq(loom_sampler_set_epoch(b, 1), LOOM_OK);
	cr_assert(same(a, b), "same seed, epoch 1, different order");
	cr_assert_eq(loom_sampler_set_epoch(a, 0), LOOM_OK);
	cr_assert_eq(memcmp(first, loom_sampler_indices(a), bytes), 0,
		     "epoch 0 again is not the epoch 0 order");
	free(first);
	loom_sampler_free(a);
	loom_sampler_free(b);
	loom_sampler_free(c);
}

Test(sampler, shuffle_is_a_real_shuffle)
{
	/* A uniform shuffle of 1000 leaves about one item in place; far
	 * from the identity, and each epoch's order differs from the last. */
	loom_sampler *s = make(1000, 0, 1, 1, 99, 0);
	int64_t e, fixed, i, prev_first = -1, changes = 0;

	for (e = 0; e < 10; e++) {
		const int64_t *idx;

		cr_assert_eq(loom_sampler_set_epoch(s, e), LOOM_OK);
		idx = loom_sampler_indices(s);
		for (fixed = 0, i = 0; i < 1000; i++)
			fixed += idx[i] == i;
		cr_assert_lt(fixed, 10, "epoch %lld: %lld items in place",
			     (long long)e, (long long)fixed);
		changes += idx[0] != prev_first;
		prev_first = idx[0];
	}
	cr_assert_geq(changes, 8);
	loom_sampler_free(s);
}

Test(sampler, no_shuffle_ignores_epoch)
{
	loom_sampler *s = make(20, 2, 3, 0, 5, 1);
	int64_t k;

	cr_assert_eq(loom_sampler_set_epoch(s, 7), LOOM_OK);
	for (k = 0; k < loom_sampler_len(s); k++)
		cr_assert_eq(loom_sampler_indices(s)[k], 2 + 3 * k);
	loom_sampler_free(s);
}

Test(sampler, ranks_share_one_permutation)
{
	/* Rank r's k-th index is item r + k*world of the same shuffle that
	 * world 1 sees: ranks agree without talking to each other. */
	loom_sampler *all = make(97, 0, 1, 1, 2024, 0);
	int r;

	cr_assert_eq(loom_sampler_set_epoch(all, 5), LOOM_OK);
	for (r = 0; r < 4; r++) {
		loom_sampler *s = make(97, r, 4, 1, 2024, 0);
		const int64_t *full = loom_sampler_indices(all);
		int64_t k;

		cr_assert_eq(loom_sampler_set_epoch(s, 5), LOOM_OK);
		for (k = 0; k < loom_sampler_len(s); k++) {
			int64_t j = r + 4 * k;

			cr_assert_eq(loom_sampler_indices(s)[k],
				     full[j < 97 ? j : j - 97]);
		}
		loom_sampler_free(s);
	}
	loom_sampler_free(all);
}

/* The unpadded prefixes of all ranks hold every item exactly once (without
 * drop_last; with it, each rank's whole share), so that an evaluation summed
 * over the ranks never counts a repeated item. */
Test(sampler, unpadded_prefixes_count_every_item_once)
{
	const int64_t sizes[] = {0, 1, 2, 3, 7, 999, 1000, 1001};
	size_t k;
	int world, drop;

	for (k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++)
		for (world = 1; world <= 8; world++)
			for (drop = 0; drop <= 1; drop++) {
				int64_t n = sizes[k], total = 0;
				int *seen = calloc((size_t)n + 1, sizeof(int));

				for (int r = 0; r < world; r++) {
					loom_sampler *s = make(n, r, world, 1, 5, drop);
					int64_t u = loom_sampler_len_unpadded(s);
					const int64_t *idx = loom_sampler_indices(s);

					cr_assert(u <= loom_sampler_len(s));
					cr_assert(u >= loom_sampler_len(s) - 1,
						  "n %lld world %d: more than one repeat",
						  (long long)n, world);
					if (drop)
						cr_assert_eq(u, loom_sampler_len(s));
					for (int64_t i = 0; i < u; i++)
						seen[idx[i]]++;
					total += u;
					loom_sampler_free(s);
				}
				cr_assert_eq(total, drop ? n / world * world : n,
					     "n %lld world %d drop %d: %lld unpadded", (long long)n,
					     world, drop, (long long)total);
				for (int64_t i = 0; i < n && !drop; i++)
					cr_assert_eq(seen[i], 1, "n %lld world %d: item %lld seen %d times",
						     (long long)n, world, (long long)i, seen[i]);
				free(seen);
			}
}
