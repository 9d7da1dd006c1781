/*
 * tests/fuzz/fuzz_fingerprint.c — libFuzzer target for the start-up plan
 * check's record parser, comparison and sentence (comm/wire.c): every rank
 * parses every other rank's gathered record, compares it with rank 0's and,
 * when an item differs, words the two ranks' descriptions.
 *
 * Input: bytes 0-1 (little-endian, modulo what is left + 1) the length of
 * record A (rank 0's), then A, then record B (rank 1's). With bit 0 of byte
 * 0 set the harness first rewrites both records' header (magic and the two
 * lengths, from their own bytes) so that they parse, letting mutations
 * reach the comparison. The descriptions handed to the sentence are A's and
 * B's head bytes as text.
 */
#include "fuzz_common.h"

#include <stdint.h>
#include <string.h>

#include "comm/comm_internal.h"

#define DESC 256

/* Makes rec (n bytes) a well-formed record: the head length from its own
 * byte 8, the rest whole items; a trailing partial item is left to fail. */
static void seal(uint8_t *rec, size_t n)
{
	uint64_t hl, items;

	if (n < LOOM_FP_HEADER)
		return;
	hl = rec[8] % (n - LOOM_FP_HEADER + 1);
	items = (n - LOOM_FP_HEADER - hl) / 8;
	memcpy(rec, "LMFPRT01", 8);
	memcpy(rec + 8, &hl, 8);
	memcpy(rec + 16, &items, 8);
}

/* A record that parsed is exactly what serialize makes of its view. */
static void roundtrip(const uint8_t *rec, size_t n, const loom_fp_view *v)
{
	uint64_t *items = malloc(v->n_items ? v->n_items * 8 : 1);
	loom_fingerprint fp = { 0 };
	uint8_t *out = NULL;
	size_t len = 0;

	FUZZ_CHECK(items != NULL);
	for (uint64_t i = 0; i < v->n_items; i++)
		items[i] = loom_fingerprint_item(v, i);
	fp.head = v->head;
	fp.head_len = v->head_len;
	fp.items = items;
	fp.n_items = v->n_items;
	FUZZ_CHECK(loom_fingerprint_serialize(&fp, &out, &len) == LOOM_OK);
	FUZZ_CHECK(len == n && memcmp(out, rec, n) == 0);
	free(out);
	free(items);
}

/* The verdict's promises: *at says where the two part, and nothing before
 * it differs. */
static void check_compare(const loom_fp_view *a, const loom_fp_view *b)
{
	uint64_t at = ~0ull, back = ~0ull, i;
	int k = loom_fingerprint_compare(a, b, &at);
	uint64_t mh = a->head_len < b->head_len ? a->head_len : b->head_len;
	uint64_t mn = a->n_items < b->n_items ? a->n_items : b->n_items;

	switch (k) {
	case LOOM_FP_SAME:
		FUZZ_CHECK(a->head_len == b->head_len && a->n_items == b->n_items);
		FUZZ_CHECK(!memcmp(a->head, b->head, a->head_len));
		for (i = 0; i < a->n_items; i++)
			FUZZ_CHECK(loom_fingerprint_item(a, i) == loom_fingerprint_item(b, i));
		break;
	case LOOM_FP_HEAD:
		FUZZ_CHECK(at <= mh && !memcmp(a->head, b->head, at));
		FUZZ_CHECK(at < mh ? a->head[at] != b->head[at] : a->head_len != b->head_len);
		break;
	case LOOM_FP_ITEM:
		FUZZ_CHECK(at < mn && loom_fingerprint_item(a, at) != loom_fingerprint_item(b, at));
		for (i = 0; i < at; i++)
			FUZZ_CHECK(loom_fingerprint_item(a, i) == loom_fingerprint_item(b, i));
		break;
	case LOOM_FP_COUNT:
		FUZZ_CHECK(at == mn && a->n_items != b->n_items);
		break;
	default:
		FUZZ_CHECK(!"a known verdict");
	}
	/* Symmetric in kind and place, and a record equals itself. */
	FUZZ_CHECK(loom_fingerprint_compare(b, a, &back) == k);
	FUZZ_CHECK(k == LOOM_FP_SAME || back == at);
	FUZZ_CHECK(loom_fingerprint_compare(a, a, &back) == LOOM_FP_SAME);
}

/* The sentence from two descriptions (gathered FP_DESC bytes each, the
 * last forced to 0 as fingerprint.c does). */
static void sentence(const loom_fp_view *a, const loom_fp_view *b)
{
	char mine[DESC], zero[DESC], buf[DESC];
	size_t na = a->head_len < DESC ? a->head_len : DESC;
	size_t nb = b->head_len < DESC ? b->head_len : DESC;

	memset(mine, 0, sizeof(mine));
	memset(zero, 0, sizeof(zero));
	memcpy(mine, b->head, nb);
	memcpy(zero, a->head, na);
	mine[DESC - 1] = zero[DESC - 1] = 0;
	loom_fingerprint_say_item(buf, sizeof(buf), 1, mine, zero);
	FUZZ_CHECK(memchr(buf, 0, sizeof(buf)) && !strncmp(buf, "rank 1: ", 8));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *a, *b;
	size_t la, lb;
	loom_fp_view va, vb;
	const char *wa, *wb;
	int sealing;

	if (size < 3)
		return 0;
	sealing = data[0] & 1;
	la = ((size_t)data[0] | (size_t)data[1] << 8) % (size - 2 + 1);
	data += 2;
	size -= 2;
	lb = size - la;
	/* Private copies of exactly their size, as the all-gather delivers
	 * them: ASan sees a read past either end. */
	a = malloc(la ? la : 1);
	b = malloc(lb ? lb : 1);
	FUZZ_CHECK(a && b);
	memcpy(a, data, la);
	memcpy(b, data + la, lb);
	if (sealing) {
		seal(a, la);
		seal(b, lb);
	}
	wa = loom_fingerprint_parse(a, la, &va);
	wb = loom_fingerprint_parse(b, lb, &vb);
	if (!wa)
		roundtrip(a, la, &va);
	if (!wb)
		roundtrip(b, lb, &vb);
	if (!wa && !wb) {
		check_compare(&vb, &va);
		sentence(&va, &vb);
	}
	free(a);
	free(b);
	return 0;
}
