/*
 * comm/fingerprint.c — the start-up check that every rank compiled the same
 * plan: each rank's serialized fingerprint is gathered everywhere, checked
 * strictly, compared with rank 0's, and the first difference is described by
 * the two ranks concerned. Every rank reaches the same verdict from the same
 * bytes, so all fail together and none waits for another.
 *
 * Record: "LMFPRT01" u64 head_len, u64 n_items, head bytes, n_items u64.
 */
#include "comm/comm_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FP_MAGIC "LMFPRT01"
#define FP_HEADER 24
#define FP_MAX_BYTES ((uint64_t)64 << 20)
#define FP_DESC 256

typedef struct fp_view {
	const uint8_t *head;
	uint64_t head_len;
	const uint8_t *items; /* n_items u64, unaligned */
	uint64_t n_items;
} fp_view;

loom_status loom_fingerprint_serialize(const loom_fingerprint *fp, uint8_t **out, size_t *len)
{
	uint64_t hl = fp->head_len, n = fp->n_items;
	size_t total = FP_HEADER + fp->head_len + 8 * fp->n_items;
	uint8_t *p = malloc(total);

	*out = p;
	*len = total;
	if (!p)
		return LOOM_ERR_NOMEM;
	memcpy(p, FP_MAGIC, 8);
	memcpy(p + 8, &hl, 8);
	memcpy(p + 16, &n, 8);
	if (hl)
		memcpy(p + FP_HEADER, fp->head, hl);
	if (n)
		memcpy(p + FP_HEADER + hl, fp->items, 8 * n);
	return LOOM_OK;
}

/* Strict parse: what is wrong with rec, or NULL. */
static const char *parse(const uint8_t *rec, uint64_t len, fp_view *v)
{
	if (len < FP_HEADER)
		return "shorter than its 24-byte header";
	if (memcmp(rec, FP_MAGIC, 8))
		return "wrong magic";
	memcpy(&v->head_len, rec + 8, 8);
	memcpy(&v->n_items, rec + 16, 8);
	if (v->head_len > len - FP_HEADER || v->n_items > (len - FP_HEADER - v->head_len) / 8 ||
	    FP_HEADER + v->head_len + 8 * v->n_items != len)
		return "its lengths do not add up to its size";
	v->head = rec + FP_HEADER;
	v->items = v->head + v->head_len;
	return NULL;
}

static uint64_t item(const fp_view *v, uint64_t i)
{
	uint64_t x;

	memcpy(&x, v->items + 8 * i, 8);
	return x;
}

/* Where r differs from rank 0: -1 none, else *where says what. */
enum { SAME, HEAD, ITEM, COUNT };

static int compare(const fp_view *a, const fp_view *b, uint64_t *at)
{
	uint64_t i, n = a->n_items < b->n_items ? a->n_items : b->n_items;

	if (a->head_len != b->head_len || memcmp(a->head, b->head, a->head_len)) {
		uint64_t m = a->head_len < b->head_len ? a->head_len : b->head_len;

		for (i = 0; i < m && a->head[i] == b->head[i]; i++)
			;
		*at = i;
		return HEAD;
	}
	for (i = 0; i < n; i++)
		if (item(a, i) != item(b, i)) {
			*at = i;
			return ITEM;
		}
	if (a->n_items != b->n_items) {
		*at = n;
		return COUNT;
	}
	return SAME;
}

/* "node 14 conv2d has shape [100,..]" vs "node 14 conv2d has shape [50,..]":
 * when both agree up to and past " has ", quote only where rank 0 differs. */
static void say_item(char *buf, size_t len, int r, const char *mine, const char *zero)
{
	const char *has = strstr(mine, " has ");
	size_t same = 0;

	while (mine[same] && mine[same] == zero[same])
		same++;
	while (same > 0 && mine[same - 1] != ' ')
		same--;
	if (has && (size_t)(has - mine) + 5 <= same)
		snprintf(buf, len, "rank %d: %s, rank 0 has %s", r, mine, zero + same);
	else
		snprintf(buf, len, "rank %d: %s; rank 0: %s", r, mine, zero);
}

loom_status loom_comm_check_fingerprint_bytes(loom_comm *c, const uint8_t *rec, size_t len,
					      const loom_fingerprint *fp)
{
	const char *noun = fp && fp->item_noun ? fp->item_noun : "item";
	int world = c->pg->info.world, me = c->pg->info.rank, r, bad = -1, kind = SAME, differ = 0;
	uint64_t my_len = len, max_len = 0, at = 0, *lens;
	uint8_t *all = NULL, *padded = NULL;
	fp_view *v = NULL;
	char *desc = NULL, mine[FP_DESC];
	loom_status st;

	lens = calloc((size_t)world, sizeof(*lens));
	v = calloc((size_t)world, sizeof(*v));
	if (!lens || !v) {
		st = loom_pg_fail(c->pg, LOOM_ERR_NOMEM, "out of memory");
		goto out_free;
	}
	st = loom_comm_allgather(c, &my_len, sizeof(my_len), lens);
	if (st)
		goto out_free;
	for (r = 0; r < world; r++) {
		if (lens[r] > FP_MAX_BYTES) {
			st = loom_pg_fail(c->pg, LOOM_ERR_FORMAT,
					  "fingerprint check: rank %d sent a malformed fingerprint "
					  "(claims %llu bytes)",
					  r, (unsigned long long)lens[r]);
			goto out_free;
		}
		if (lens[r] > max_len)
			max_len = lens[r];
	}
	/* Records padded to the longest one: one fixed-size all-gather. */
	padded = calloc(1, max_len ? max_len : 1);
	all = malloc((size_t)(max_len ? max_len : 1) * (size_t)world);
	if (!padded || !all) {
		st = loom_pg_fail(c->pg, LOOM_ERR_NOMEM, "out of memory");
		goto out_free;
	}
	memcpy(padded, rec, len);
	st = loom_comm_allgather(c, padded, max_len, all);
	if (st)
		goto out_free;
	for (r = 0; r < world; r++) {
		const char *why = parse(all + (size_t)r * max_len, lens[r], &v[r]);

		if (why) {
			st = loom_pg_fail(c->pg, LOOM_ERR_FORMAT,
					  "fingerprint check: rank %d sent a malformed fingerprint "
					  "(%llu bytes: %s)",
					  r, (unsigned long long)lens[r], why);
			goto out_free;
		}
	}
	for (r = 1; r < world; r++) {
		uint64_t a;
		int k = compare(&v[r], &v[0], &a);

		if (k == SAME)
			continue;
		differ++;
		if (bad < 0)
			bad = r, kind = k, at = a;
	}
	if (bad < 0)
		goto out_free;

	if (kind == ITEM) {
		/* The two ranks concerned describe item `at`; all take part. */
		desc = calloc((size_t)world, FP_DESC);
		if (!desc) {
			st = loom_pg_fail(c->pg, LOOM_ERR_NOMEM, "out of memory");
			goto out_free;
		}
		memset(mine, 0, sizeof(mine));
		if (fp && fp->describe && at < fp->n_items)
			fp->describe(fp->user, (size_t)at, mine, sizeof(mine) - 1);
		if (!mine[0])
			snprintf(mine, sizeof(mine), "%s %llu has hash %016llx", noun,
				 (unsigned long long)at, (unsigned long long)item(&v[me], at));
		st = loom_comm_allgather(c, mine, FP_DESC, desc);
		if (st)
			goto out_free;
		desc[(size_t)bad * FP_DESC + FP_DESC - 1] = desc[FP_DESC - 1] = 0;
		say_item(mine, sizeof(mine), bad, desc + (size_t)bad * FP_DESC, desc);
		st = loom_pg_fail(c->pg, LOOM_ERR_MISMATCH,
				  "fingerprint mismatch: %s%s (the ranks compiled different plans)",
				  mine, differ > 1 ? " (and more ranks differ)" : "");
	} else if (kind == HEAD) {
		st = loom_pg_fail(c->pg, LOOM_ERR_MISMATCH,
				  "fingerprint mismatch: rank %d's header (%llu bytes) differs from "
				  "rank 0's (%llu bytes) at byte %llu: different options",
				  bad, (unsigned long long)v[bad].head_len,
				  (unsigned long long)v[0].head_len, (unsigned long long)at);
	} else {
		st = loom_pg_fail(c->pg, LOOM_ERR_MISMATCH,
				  "fingerprint mismatch: rank %d has %llu %ss, rank 0 has %llu", bad,
				  (unsigned long long)v[bad].n_items, noun,
				  (unsigned long long)v[0].n_items);
	}
out_free:
	free(desc);
	free(all);
	free(padded);
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
