/*
 * comm/fingerprint.c — the start-up check that every rank compiled the same
 * plan: each rank's serialized fingerprint is gathered everywhere, checked
 * strictly, compared with rank 0's, and the first difference is described by
 * the two ranks concerned. Every rank reaches the same verdict from the same
 * bytes, so all fail together and none waits for another.
 *
 * The record, its strict parser and the comparison are in comm/wire.c.
 */
#include "comm/comm_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FP_MAX_BYTES ((uint64_t)64 << 20)
#define FP_DESC 256

/* The first rank whose record differs from rank 0's: bad is -1 when none. */
typedef struct fp_diff {
	int bad;     /* the rank */
	int kind;    /* LOOM_FP_* */
	uint64_t at; /* the byte of the header or the item that differs */
	int differ;  /* how many ranks differ */
} fp_diff;

static const char *fp_noun(const loom_fingerprint *fp)
{
	return fp && fp->item_noun ? fp->item_noun : "item";
}

/* Every rank's record length, refused over FP_MAX_BYTES; the longest in
 * *max_len. */
static loom_status gather_lengths(loom_comm *c, size_t len, uint64_t *lens, uint64_t *max_len)
{
	uint64_t my_len = len;
	loom_status st;
	int r;

	st = loom_comm_allgather(c, &my_len, sizeof(my_len), lens);
	if (st)
		return st;
	*max_len = 0;
	for (r = 0; r < c->pg->info.world; r++) {
		if (lens[r] > FP_MAX_BYTES)
			return loom_pg_fail(c->pg, LOOM_ERR_FORMAT,
					    "fingerprint check: rank %d sent a malformed fingerprint "
					    "(claims %llu bytes)",
					    r, (unsigned long long)lens[r]);
		if (lens[r] > *max_len)
			*max_len = lens[r];
	}
	return LOOM_OK;
}

/* Every rank's record into *all, each parsed strictly into v[r] (which
 * points into *all). Records padded to the longest one: one fixed-size
 * all-gather. */
static loom_status gather_records(loom_comm *c, const uint8_t *rec, size_t len,
				  const uint64_t *lens, uint64_t max_len, loom_fp_view *v,
				  uint8_t **all)
{
	int world = c->pg->info.world, r;
	uint8_t *padded = calloc(1, max_len ? max_len : 1);
	loom_status st;

	*all = malloc((size_t)(max_len ? max_len : 1) * (size_t)world);
	if (!padded || !*all) {
		free(padded);
		return loom_pg_fail(c->pg, LOOM_ERR_NOMEM, "out of memory");
	}
	memcpy(padded, rec, len);
	st = loom_comm_allgather(c, padded, max_len, *all);
	free(padded);
	if (st)
		return st;
	for (r = 0; r < world; r++) {
		const char *why = loom_fingerprint_parse(*all + (size_t)r * max_len, lens[r], &v[r]);

		if (why)
			return loom_pg_fail(c->pg, LOOM_ERR_FORMAT,
					    "fingerprint check: rank %d sent a malformed fingerprint "
					    "(%llu bytes: %s)",
					    r, (unsigned long long)lens[r], why);
	}
	return LOOM_OK;
}

static fp_diff first_difference(const loom_fp_view *v, int world)
{
	fp_diff d = { .bad = -1, .kind = LOOM_FP_SAME };
	int r;

	for (r = 1; r < world; r++) {
		uint64_t a;
		int k = loom_fingerprint_compare(&v[r], &v[0], &a);

		if (k == LOOM_FP_SAME)
			continue;
		d.differ++;
		if (d.bad < 0)
			d.bad = r, d.kind = k, d.at = a;
	}
	return d;
}

/* The two ranks concerned describe item `at`; all take part. */
static loom_status say_item(loom_comm *c, const loom_fingerprint *fp, const loom_fp_view *v,
			    const fp_diff *d)
{
	int world = c->pg->info.world, me = c->pg->info.rank;
	char *desc = calloc((size_t)world, FP_DESC), mine[FP_DESC];
	loom_status st;

	if (!desc)
		return loom_pg_fail(c->pg, LOOM_ERR_NOMEM, "out of memory");
	memset(mine, 0, sizeof(mine));
	if (fp && fp->describe && d->at < fp->n_items)
		fp->describe(fp->user, (size_t)d->at, mine, sizeof(mine) - 1);
	if (!mine[0])
		snprintf(mine, sizeof(mine), "%s %llu has hash %016llx", fp_noun(fp),
			 (unsigned long long)d->at,
			 (unsigned long long)loom_fingerprint_item(&v[me], d->at));
	st = loom_comm_allgather(c, mine, FP_DESC, desc);
	if (!st) {
		desc[(size_t)d->bad * FP_DESC + FP_DESC - 1] = desc[FP_DESC - 1] = 0;
		loom_fingerprint_say_item(mine, sizeof(mine), d->bad,
					  desc + (size_t)d->bad * FP_DESC, desc);
		st = loom_pg_fail(c->pg, LOOM_ERR_MISMATCH,
				  "fingerprint mismatch: %s%s (the ranks compiled different plans)",
				  mine, d->differ > 1 ? " (and more ranks differ)" : "");
	}
	free(desc);
	return st;
}

static loom_status say_difference(loom_comm *c, const loom_fingerprint *fp,
				  const loom_fp_view *v, const fp_diff *d)
{
	if (d->kind == LOOM_FP_ITEM)
		return say_item(c, fp, v, d);
	if (d->kind == LOOM_FP_HEAD)
		return loom_pg_fail(c->pg, LOOM_ERR_MISMATCH,
				    "fingerprint mismatch: rank %d's header (%llu bytes) differs "
				    "from rank 0's (%llu bytes) at byte %llu: different options",
				    d->bad, (unsigned long long)v[d->bad].head_len,
				    (unsigned long long)v[0].head_len, (unsigned long long)d->at);
	return loom_pg_fail(c->pg, LOOM_ERR_MISMATCH,
			    "fingerprint mismatch: rank %d has %llu %ss, rank 0 has %llu", d->bad,
			    (unsigned long long)v[d->bad].n_items, fp_noun(fp),
			    (unsigned long long)v[0].n_items);
}

loom_status loom_comm_check_fingerprint_bytes(loom_comm *c, const uint8_t *rec, size_t len,
					      const loom_fingerprint *fp)
{
	int world = c->pg->info.world;
	uint64_t max_len = 0, *lens = calloc((size_t)world, sizeof(*lens));
	loom_fp_view *v = calloc((size_t)world, sizeof(*v));
	uint8_t *all = NULL;
	fp_diff d;
	loom_status st;

	if (!lens || !v) {
		st = loom_pg_fail(c->pg, LOOM_ERR_NOMEM, "out of memory");
		goto out_free;
	}
	st = gather_lengths(c, len, lens, &max_len);
	if (!st)
		st = gather_records(c, rec, len, lens, max_len, v, &all);
	if (st)
		goto out_free;
	d = first_difference(v, world);
	if (d.bad >= 0)
		st = say_difference(c, fp, v, &d);
out_free:
	free(all);
	free(v);
	free(lens);
	return st;
}

loom_status loom_comm_check_fingerprint(loom_comm *c, const loom_fingerprint *fp)
{
	uint8_t *rec;
	size_t len;
	loom_status st;

	if (!c || !fp || (fp->head_len && !fp->head) || (fp->n_items && !fp->items))
		return c ? loom_pg_fail(c->pg, LOOM_ERR_INVALID, "fingerprint: bad arguments")
			 : LOOM_ERR_INVALID;
	st = loom_fingerprint_serialize(fp, &rec, &len);
	if (st)
		return loom_pg_fail(c->pg, st, "out of memory");
	st = loom_comm_check_fingerprint_bytes(c, rec, len, fp);
	free(rec);
	return st;
}

loom_status loom_comm_check_settings(loom_comm *c, const loom_comm_setting *s, size_t n)
{
	const size_t len = LOOM_COMM_SETTING_LEN;
	uint64_t mine = n, *counts = NULL;
	uint8_t *buf = NULL, *all = NULL;
	loom_status st;
	size_t which;
	int world, r;

	if (!c || (n && !s))
		return c ? loom_pg_fail(c->pg, LOOM_ERR_INVALID, "settings check: bad arguments")
			 : LOOM_ERR_INVALID;
	world = c->pg->info.world;
	counts = malloc(sizeof(uint64_t) * (size_t)world);
	buf = calloc(n ? n : 1, len);
	all = malloc((size_t)world * (n ? n : 1) * len);
	if (!counts || !buf || !all) {
		st = loom_pg_fail(c->pg, LOOM_ERR_NOMEM, "settings check: out of memory");
		goto out_free;
	}
	st = loom_comm_allgather(c, &mine, sizeof(mine), counts);
	if (st)
		goto out_free;
	for (r = 1; r < world; r++)
		if (counts[r] != counts[0]) {
			st = loom_pg_fail(c->pg, LOOM_ERR_MISMATCH,
					  "settings check: rank %d has %llu settings to compare, rank "
					  "0 has %llu (different builds of the program?)",
					  r, (unsigned long long)counts[r],
					  (unsigned long long)counts[0]);
			goto out_free;
		}
	for (size_t i = 0; i < n; i++)
		memcpy(buf + i * len, s[i].value, len - 1);
	st = loom_comm_allgather(c, buf, n * len, all);
	if (st || !loom_settings_differ(all, world, n, &r, &which))
		goto out_free;
	st = loom_pg_fail(c->pg, LOOM_ERR_MISMATCH,
			  "rank %d has %s %.*s, rank 0 has %.*s: every rank must run with the "
			  "same %s",
			  r, s[which].name, (int)(len - 1),
			  (const char *)all + ((size_t)r * n + which) * len, (int)(len - 1),
			  (const char *)all + which * len, s[which].name);
out_free:
	free(counts);
	free(buf);
	free(all);
	return st;
}
