/*
 * tests/engine/test_input_buffer.c — loom_input_buffer / loom_input_commit on
 * the CPU backend (the program's own buffer, uploaded at commit): the
 * ConvNet trained from a loader that converts straight into the buffers
 * (through a prefetcher given them) takes the same steps, bit for bit, as
 * the loader's own buffers fed by loom_set_input; and every misuse is a
 * clear error naming the input. The staged-slot side (no host copy, no
 * write under a queued step) is tests/engine/test_async.c's suite slots.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "engine/program_internal.h"
#include "examples/models.h"
#include "loom.h"
#include "loom_data.h"

enum { B = 8, N = 40, STEPS = 4 };

static loom_program *compile_convnet(loom_graph **g)
{
	cr_assert_eq(loom_graph_new(g), LOOM_OK);
	loom_value loss = loom_model_convnet(*g, B, NULL);
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim.momentum = 0.9;
	loom_program *p;
	cr_assert_eq(loom_compile(*g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	return p;
}

typedef struct rig {
	loom_dataset ds;
	loom_sampler *s;
	loom_loader *l;
} rig;

static void rig_init(rig *r)
{
	char err[256];
	cr_assert_eq(loom_synthetic_load(N, 1, 28, 28, 10, 7, &r->ds, err, sizeof(err)), LOOM_OK,
		     "%s", err);
	cr_assert_eq(loom_sampler_new(N, 0, 1, 1, 3, 0, &r->s, err, sizeof(err)), LOOM_OK, "%s",
		     err);
	cr_assert_eq(loom_loader_new(&r->ds, r->s, B, 1, LOOM_FASHION_MNIST_MEAN,
				     LOOM_FASHION_MNIST_STD, &r->l, err, sizeof(err)),
		     LOOM_OK, "%s", err);
	loom_sampler_set_epoch(r->s, 1);
}

static void rig_fini(rig *r)
{
	loom_loader_free(r->l);
	loom_sampler_free(r->s);
	loom_dataset_free(&r->ds);
}

/* Every parameter of p, as f64, appended to out (n values so far). */
static size_t params_of(loom_program *p, double *out)
{
	size_t n = 0;
	for (int s = 0; s < p->plan.n_params; s++) {
		size_t k = (size_t)p->plan.params[s].numel;
		cr_assert_eq(loom_read_f64(p, p->plan.params[s].param, out + n, k), LOOM_OK);
		n += k;
	}
	return n;
}

Test(input_buffer, the_convnet_from_the_loader_matches_set_input_bit_for_bit)
{
	rig r;
	rig_init(&r);
	loom_graph *ga, *gb;
	loom_program *a = compile_convnet(&ga), *b = compile_convnet(&gb);
	char err[256];
	/* a: the loader's own buffers (a prefetcher's), loom_set_input. */
	loom_prefetch *pa, *pb;
	cr_assert_eq(loom_prefetch_new(r.l, &pa, err, sizeof(err)), LOOM_OK, "%s", err);
	cr_assert_eq(loom_prefetch_start(pa), LOOM_OK);
	double la[STEPS], lb[STEPS];
	for (int s = 0; s < STEPS; s++) {
		const float *img;
		const int32_t *lab;
		int count;
		cr_assert_eq(loom_prefetch_next(pa, &img, &lab, &count), LOOM_OK);
		cr_assert_eq(count, B);
		cr_assert_eq(loom_set_input(a, "image", img, LOOM_F32, (size_t)B * 784), LOOM_OK);
		cr_assert_eq(loom_set_input(a, "label", lab, LOOM_I32, B), LOOM_OK);
		cr_assert_eq(loom_run(a, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(a));
		la[s] = loom_loss(a);
	}
	loom_prefetch_free(pa);
	/* b: the prefetcher converts straight into b's input buffers, the
	 * next batch's while the step before runs. */
	cr_assert_eq(loom_prefetch_new_given(r.l, &pb, err, sizeof(err)), LOOM_OK, "%s", err);
	cr_assert_eq(loom_prefetch_start(pb), LOOM_OK);
	void *img, *lab;
	cr_assert_eq(loom_input_buffer(b, "image", LOOM_F32, (size_t)B * 784, &img), LOOM_OK);
	cr_assert_eq(loom_input_buffer(b, "label", LOOM_I32, B, &lab), LOOM_OK);
	cr_assert_eq(loom_prefetch_give(pb, img, lab), LOOM_OK, "%s", loom_prefetch_error(pb));
	for (int s = 0; s < STEPS; s++) {
		const float *gi;
		const int32_t *gl;
		int count;
		cr_assert_eq(loom_prefetch_next(pb, &gi, &gl, &count), LOOM_OK, "%s",
			     loom_prefetch_error(pb));
		cr_assert_eq(count, B);
		cr_assert_eq(loom_input_commit(b, "image"), LOOM_OK, "%s", loom_program_error(b));
		cr_assert_eq(loom_input_commit(b, "label"), LOOM_OK, "%s", loom_program_error(b));
		if (s + 1 < STEPS) {
			cr_assert_eq(loom_input_buffer(b, "image", LOOM_F32, (size_t)B * 784, &img),
				     LOOM_OK);
			cr_assert_eq(loom_input_buffer(b, "label", LOOM_I32, B, &lab), LOOM_OK);
			cr_assert_eq(loom_prefetch_give(pb, img, lab), LOOM_OK, "%s",
				     loom_prefetch_error(pb));
		}
		cr_assert_eq(loom_run(b, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(b));
		lb[s] = loom_loss(b);
	}
	loom_prefetch_free(pb);
	for (int s = 0; s < STEPS; s++)
		cr_assert(memcmp(&la[s], &lb[s], sizeof(double)) == 0,
			  "step %d: loss %.17g through the buffer, %.17g through set_input", s, lb[s],
			  la[s]);
	cr_assert(la[0] > 0 && isfinite(la[STEPS - 1]));
	loom_program_info ia, ib;
	loom_program_info_get(a, &ia);
	size_t np = (size_t)ia.n_param_elems;
	double *wa = malloc(np * sizeof(double)), *wb = malloc(np * sizeof(double));
	cr_assert(wa && wb);
	cr_assert_eq(params_of(a, wa), np);
	cr_assert_eq(params_of(b, wb), np);
	for (size_t e = 0; e < np; e++)
		cr_assert(memcmp(&wa[e], &wb[e], sizeof(double)) == 0, "parameter element %zu: %.17g, "
			  "set_input's %.17g", e, wb[e], wa[e]);
	/* On the CPU the commit is the copy set_input made: as many bytes. */
	loom_program_info_get(b, &ib);
	cr_assert_eq(ib.input_upload_bytes, ia.input_upload_bytes);
	cr_assert_eq(ia.input_upload_bytes, (uint64_t)STEPS * B * (784 * 4 + 4));
	free(wa);
	free(wb);
	loom_program_free(a);
	loom_program_free(b);
	loom_graph_free(ga);
	loom_graph_free(gb);
	rig_fini(&r);
}

static void expect_error(loom_program *p, loom_status got, loom_status want, const char *says)
{
	cr_assert_eq(got, want, "status %s, expected %s (%s)", loom_status_string(got),
		     loom_status_string(want), loom_program_error(p));
	cr_assert(strstr(loom_program_error(p), says), "message '%s' lacks '%s'",
		  loom_program_error(p), says);
}

Test(input_buffer, misuses_are_errors_that_name_the_input)
{
	loom_graph *g;
	loom_program *p = compile_convnet(&g);
	void *ptr = (void *)1;
	expect_error(p, loom_input_buffer(p, "imagee", LOOM_F32, B * 784, &ptr), LOOM_ERR_NOT_FOUND,
		     "no input called 'imagee'");
	cr_assert_null(ptr);
	expect_error(p, loom_input_buffer(p, "image", LOOM_F16, B * 784, &ptr), LOOM_ERR_DTYPE,
		     "input_buffer 'image': asked for f16, the input is f32");
	expect_error(p, loom_input_buffer(p, "label", LOOM_I32, B + 1, &ptr), LOOM_ERR_SHAPE,
		     "input_buffer 'label': 9 elements asked");
	expect_error(p, loom_input_buffer(p, "label", LOOM_I32, B, NULL), LOOM_ERR_INVALID,
		     "'label': ptr is NULL");
	expect_error(p, loom_input_buffer(p, NULL, LOOM_I32, B, &ptr), LOOM_ERR_INVALID,
		     "name is NULL");
	expect_error(p, loom_input_commit(p, "label"), LOOM_ERR_STATE,
		     "input_commit 'label': no buffer handed out");
	expect_error(p, loom_input_commit(p, "nope"), LOOM_ERR_NOT_FOUND, "no input called 'nope'");
	cr_assert_eq(loom_input_buffer(p, "label", LOOM_I32, B, &ptr), LOOM_OK);
	cr_assert_not_null(ptr);
	expect_error(p, loom_input_buffer(p, "label", LOOM_I32, B, &ptr), LOOM_ERR_STATE,
		     "input_buffer 'label': a buffer is handed out already");
	int32_t lab[B] = { 0 };
	expect_error(p, loom_set_input(p, "label", lab, LOOM_I32, B), LOOM_ERR_STATE,
		     "set_input 'label': its buffer is handed out");
	/* Another input is not affected. */
	void *img;
	cr_assert_eq(loom_input_buffer(p, "image", LOOM_F32, B * 784, &img), LOOM_OK);
	memset(img, 0, sizeof(float) * B * 784);
	cr_assert_eq(loom_input_commit(p, "image"), LOOM_OK);
	/* Release: back unused, asked again; a second release does nothing. */
	cr_assert_eq(loom_input_release(p, "label"), LOOM_OK);
	cr_assert_eq(loom_input_release(p, "label"), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "label", lab, LOOM_I32, B), LOOM_OK);
	cr_assert_eq(loom_input_buffer(p, "label", LOOM_I32, B, &ptr), LOOM_OK);
	memcpy(ptr, lab, sizeof(lab));
	cr_assert_eq(loom_input_commit(p, "label"), LOOM_OK);
	expect_error(p, loom_input_commit(p, "label"), LOOM_ERR_STATE, "no buffer handed out");
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	/* A program that did not compile answers LOOM_ERR_INVALID. */
	cr_assert_eq(loom_input_buffer(NULL, "label", LOOM_I32, B, &ptr), LOOM_ERR_INVALID);
	cr_assert_eq(loom_input_commit(NULL, "label"), LOOM_ERR_INVALID);
	loom_program_free(p);
	loom_graph_free(g);
}
