/*
 * test_prefetch.c — loom_prefetch hands out exactly the batches loom_loader_get
 * gives, in order, across epochs, restarts and stops, with the worker racing
 * a slow and a fast consumer.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <criterion/criterion.h>

#include "loom_data.h"

TestSuite(prefetch);

struct rig {
	loom_dataset ds;
	loom_sampler *s;
	loom_loader *l;
	loom_prefetch *p;
	float *want_img;
	int32_t *want_lab;
};

static void rig_init(struct rig *r, int64_t n, int batch, int drop_last)
{
	size_t elems = 8 * 8, k;
	char err[256];
	int64_t i;

	memset(r, 0, sizeof(*r));
	r->ds = (loom_dataset){.n = n, .c = 1, .h = 8, .w = 8, .classes = 10};
	r->ds.images = malloc((size_t)n * elems);
	r->ds.labels = malloc((size_t)n * sizeof(int32_t));
	for (i = 0; i < n; i++) {
		for (k = 0; k < elems; k++)
			r->ds.images[i * elems + k] = (uint8_t)(i * 13 + (int64_t)k);
		r->ds.labels[i] = (int32_t)(i % 10);
	}
	cr_assert_eq(loom_sampler_new(n, 1, 2, 1, 11, 0, &r->s, err, sizeof(err)),
		     LOOM_OK, "%s", err);
	cr_assert_eq(loom_loader_new(&r->ds, r->s, batch, drop_last, 0.2f, 0.4f,
				     &r->l, err, sizeof(err)), LOOM_OK, "%s", err);
	cr_assert_eq(loom_prefetch_new(r->l, &r->p, err, sizeof(err)), LOOM_OK,
		     "%s", err);
	r->want_img = malloc((size_t)batch * elems * sizeof(float));
	r->want_lab = malloc((size_t)batch * sizeof(int32_t));
}

static void rig_fini(struct rig *r)
{
	loom_prefetch_free(r->p);
	loom_loader_free(r->l);
	loom_sampler_free(r->s);
	free(r->ds.images);
	free(r->ds.labels);
	free(r->want_img);
	free(r->want_lab);
}

/* Takes up to `limit` batches (-1: the whole epoch) and compares each with
 * the loader's own. Returns how many were taken. */
static int64_t consume(struct rig *r, int64_t limit, int slow)
{
	int64_t b;

	for (b = 0; limit < 0 || b < limit; b++) {
		const float *img;
		const int32_t *lab;
		int count, want;

		cr_assert_eq(loom_prefetch_next(r->p, &img, &lab, &count), LOOM_OK,
			     "%s", loom_prefetch_error(r->p));
		if (count == 0) {
			cr_assert_null(img);
			cr_assert_eq(b, loom_loader_num_batches(r->l));
			return b;
		}
		cr_assert_eq(loom_loader_get(r->l, b, r->want_img, r->want_lab,
					     &want), LOOM_OK);
		cr_assert_eq(count, want, "batch %lld", (long long)b);
		cr_assert_arr_eq(img, r->want_img,
				 (size_t)count * 64 * sizeof(float),
				 "batch %lld images differ", (long long)b);
		cr_assert_arr_eq(lab, r->want_lab, (size_t)count * sizeof(int32_t));
		if (slow) {
			struct timespec ts = {0, 200000};

			nanosleep(&ts, NULL);
		}
	}
	return b;
}

static void expect_end(struct rig *r)
{
	const float *img = (const float *)1;
	const int32_t *lab = (const int32_t *)1;
	int count = -1;

	cr_assert_eq(loom_prefetch_next(r->p, &img, &lab, &count), LOOM_OK);
	cr_assert_eq(count, 0);
	cr_assert_null(img);
	cr_assert_null(lab);
}

Test(prefetch, matches_loader_over_epochs)
{
	struct rig r;
	int64_t e;

	rig_init(&r, 203, 16, 0); /* 102 per rank: 6 full batches and 6 */
	cr_assert_eq(loom_loader_num_batches(r.l), 7);
	for (e = 0; e < 6; e++) {
		cr_assert_eq(loom_sampler_set_epoch(r.s, e), LOOM_OK);
		cr_assert_eq(loom_prefetch_start(r.p), LOOM_OK);
		cr_assert_eq(consume(&r, -1, e % 2), 7);
		/* Past the end it keeps saying so. */
		expect_end(&r);
	}
	rig_fini(&r);
}

Test(prefetch, restart_and_stop_mid_epoch)
{
	struct rig r;
	int64_t e;

	rig_init(&r, 500, 4, 1);
	for (e = 0; e < 20; e++) {
		cr_assert_eq(loom_prefetch_start(r.p), LOOM_OK);
		cr_assert_eq(consume(&r, e % 5, 0), e % 5);
		if (e % 2) {
			/* Stopped, the sampler may move on mid-epoch. */
			cr_assert_eq(loom_prefetch_stop(r.p), LOOM_OK);
			cr_assert_eq(loom_sampler_set_epoch(r.s, e), LOOM_OK);
		}
	}
	cr_assert_eq(loom_prefetch_start(r.p), LOOM_OK);
	cr_assert_eq(consume(&r, -1, 0), 62); /* 250 per rank / 4, dropped */
	rig_fini(&r);
}

Test(prefetch, next_needs_an_epoch)
{
	struct rig r;
	const float *img;
	const int32_t *lab;
	int count;

	rig_init(&r, 10, 4, 0);
	cr_assert_eq(loom_prefetch_next(r.p, &img, &lab, &count), LOOM_ERR_STATE);
	cr_assert(strstr(loom_prefetch_error(r.p), "call loom_prefetch_start first"));
	cr_assert_eq(loom_prefetch_start(r.p), LOOM_OK);
	cr_assert_eq(loom_prefetch_stop(r.p), LOOM_OK);
	cr_assert_eq(loom_prefetch_next(r.p, &img, &lab, &count), LOOM_ERR_STATE);
	cr_assert_eq(loom_prefetch_next(r.p, NULL, &lab, &count), LOOM_ERR_INVALID);
	cr_assert(strstr(loom_prefetch_error(r.p), "images pointer is NULL"));
	rig_fini(&r);
}

Test(prefetch, free_while_running)
{
	/* Freed with an epoch half served: the worker must stop cleanly. */
	struct rig r;

	rig_init(&r, 1000, 8, 0);
	cr_assert_eq(loom_prefetch_start(r.p), LOOM_OK);
	cr_assert_eq(consume(&r, 3, 0), 3);
	rig_fini(&r);
}

/* Caller-given buffers: each batch lands in the buffers given for it (the
 * pointers next hands back), equal to the loader's own, over an epoch
 * with a slow consumer; the misuses are refused with a message. */
Test(prefetch, fills_the_buffers_the_caller_gives)
{
	struct rig r;
	char err[256];
	rig_init(&r, 37, 4, 0);
	loom_prefetch_free(r.p);
	cr_assert_eq(loom_prefetch_new_given(r.l, &r.p, err, sizeof(err)), LOOM_OK, "%s", err);
	size_t elems = loom_loader_image_elems(r.l);
	float *img[3];
	int32_t *lab[3];
	for (int i = 0; i < 3; i++) {
		img[i] = malloc(4 * elems * sizeof(float));
		lab[i] = malloc(4 * sizeof(int32_t));
	}
	/* No epoch yet. */
	cr_assert_eq(loom_prefetch_give(r.p, img[0], lab[0]), LOOM_ERR_STATE);
	loom_sampler_set_epoch(r.s, 2);
	cr_assert_eq(loom_prefetch_start(r.p), LOOM_OK);
	const float *gi;
	const int32_t *gl;
	int count, want;
	/* Nothing given: next would wait forever. */
	cr_assert_eq(loom_prefetch_next(r.p, &gi, &gl, &count), LOOM_ERR_STATE);
	cr_assert(strstr(loom_prefetch_error(r.p), "no buffer given for batch 0"), "%s",
		  loom_prefetch_error(r.p));
	cr_assert_eq(loom_prefetch_give(r.p, NULL, lab[0]), LOOM_ERR_INVALID);
	cr_assert_eq(loom_prefetch_give(r.p, img[0], lab[0]), LOOM_OK);
	int64_t nb = loom_loader_num_batches(r.l);
	for (int64_t b = 0; b < nb; b++) {
		cr_assert_eq(loom_prefetch_next(r.p, &gi, &gl, &count), LOOM_OK, "%s",
			     loom_prefetch_error(r.p));
		cr_assert_eq(gi, img[b % 3], "batch %lld not in its given buffer", (long long)b);
		cr_assert_eq(gl, lab[b % 3]);
		cr_assert_eq(loom_loader_get(r.l, b, r.want_img, r.want_lab, &want), LOOM_OK);
		cr_assert_eq(count, want);
		cr_assert_eq(memcmp(gi, r.want_img, (size_t)count * elems * sizeof(float)), 0);
		cr_assert_eq(memcmp(gl, r.want_lab, (size_t)count * sizeof(int32_t)), 0);
		if (b + 1 < nb) {
			cr_assert_eq(loom_prefetch_give(r.p, img[(b + 1) % 3], lab[(b + 1) % 3]),
				     LOOM_OK, "%s", loom_prefetch_error(r.p));
			/* A third in use: its slot is the held batch's. */
			if (b + 2 < nb)
				cr_assert_eq(loom_prefetch_give(r.p, img[0], lab[0]),
					     LOOM_ERR_STATE);
		}
		if (b % 3 == 1) { /* slow consumer: the worker waits for no one */
			struct timespec ts = { 0, 2000000 };
			nanosleep(&ts, NULL);
		}
	}
	cr_assert_eq(loom_prefetch_next(r.p, &gi, &gl, &count), LOOM_OK);
	cr_assert_eq(count, 0);
	cr_assert_eq(loom_prefetch_give(r.p, img[0], lab[0]), LOOM_ERR_STATE, "past the last batch");
	/* A restart forgets what was given. */
	cr_assert_eq(loom_prefetch_start(r.p), LOOM_OK);
	cr_assert_eq(loom_prefetch_next(r.p, &gi, &gl, &count), LOOM_ERR_STATE);
	rig_fini(&r);
	for (int i = 0; i < 3; i++) {
		free(img[i]);
		free(lab[i]);
	}
	/* A prefetcher with buffers of its own takes none. */
	rig_init(&r, 9, 4, 0);
	cr_assert_eq(loom_prefetch_start(r.p), LOOM_OK);
	float f[64 * 4];
	int32_t l4[4];
	cr_assert_eq(loom_prefetch_give(r.p, f, l4), LOOM_ERR_STATE);
	rig_fini(&r);
}
