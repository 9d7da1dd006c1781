/*
 * tests/engine/test_inference.c — the forward-only plan
 * (loom_compile_opts.inference): its memory is below the training plan's,
 * it has no gradients or optimizer state, refuses training runs, and its
 * outputs equal the training program's eval outputs bit for bit, on the
 * initial weights and on trained weights carried over by safetensors, for
 * the ConvNet at O0 and O2 and a narrow ResNet-18.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "examples/models.h"
#include "loom.h"
#include "loom_io.h"

#define BATCH 8

typedef struct model {
	int resnet; /* 0: the ConvNet (28x28x1), 1: ResNet-18 width 4 (32x32x3) */
	loom_opt_level level;
} model;

static size_t image_elems(const model *m)
{
	return m->resnet ? (size_t)BATCH * 3 * 32 * 32 : (size_t)BATCH * 28 * 28;
}

static loom_program *build(const model *m, int inference, loom_value *logits)
{
	loom_graph *g;
	loom_program *p;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_graph_set_seed(g, 3);
	loom_value loss = m->resnet ? loom_model_resnet_width(g, 18, BATCH, 32, 10, 4, logits) :
				      loom_model_convnet(g, BATCH, logits);
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.amp.level = m->level;
	o.inference = inference;
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	loom_graph_free(g);
	return p;
}

static void feed(loom_program *p, const model *m, unsigned seed)
{
	size_t n = image_elems(m);
	float *x = malloc(sizeof(float) * n);
	int32_t y[BATCH];
	srand(seed);
	for (size_t i = 0; i < n; i++)
		x[i] = (float)rand() / RAND_MAX * 2 - 1;
	for (int i = 0; i < BATCH; i++)
		y[i] = rand() % 10;
	cr_assert_eq(loom_set_input(p, "image", x, LOOM_F32, n), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "label", y, LOOM_I32, BATCH), LOOM_OK);
	free(x);
}

static void eval(loom_program *p, const model *m, loom_value logits, float *out, double *loss)
{
	feed(p, m, 11);
	cr_assert_eq(loom_run(p, LOOM_RUN_EVAL), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_read(p, logits, out, BATCH * 10), LOOM_OK, "%s", loom_program_error(p));
	*loss = loom_loss(p);
}

static void same_as_training(model m)
{
	loom_value lt, li;
	loom_program *t = build(&m, 0, &lt), *inf = build(&m, 1, &li);
	float zt[BATCH * 10], zi[BATCH * 10];
	double losst, lossi;
	loom_program_info it, ii;

	loom_program_info_get(t, &it);
	loom_program_info_get(inf, &ii);
	cr_expect_lt(ii.arena_bytes, it.arena_bytes, "inference arena %zu, training %zu",
		     ii.arena_bytes, it.arena_bytes);
	cr_expect_eq(ii.grad_bytes, 0u);
	cr_expect_eq(ii.n_param_elems, it.n_param_elems);
	cr_expect_eq(ii.param_bytes, it.param_bytes);
	cr_expect_eq(ii.optim_state_bytes, 0u);
	cr_expect_eq(ii.master_bytes, 0u, "a forward-only plan has no masters (%zu bytes)",
		     ii.master_bytes);
	cr_expect_lt(ii.n_nodes, it.n_nodes);
	cr_expect_lt(ii.activation_bytes, it.activation_bytes);
	cr_log_info("%s O%d: arena %.2f MiB inference, %.2f MiB training",
		    m.resnet ? "resnet" : "convnet", m.level, ii.arena_bytes / 1048576.0,
		    it.arena_bytes / 1048576.0);

	/* The same initial weights. */
	eval(t, &m, lt, zt, &losst);
	eval(inf, &m, li, zi, &lossi);
	cr_expect_eq(memcmp(zt, zi, sizeof(zt)), 0, "initial eval logits differ");
	cr_expect_eq(losst, lossi);

	/* Trained weights (and running statistics), carried by safetensors. */
	for (int s = 0; s < 3; s++) {
		feed(t, &m, 50 + s);
		cr_assert_eq(loom_run(t, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(t));
	}
	char path[] = "/tmp/loom-inf-XXXXXX";
	int fd = mkstemp(path);
	cr_assert(fd >= 0);
	close(fd);
	cr_assert_eq(loom_export_safetensors(t, path, NULL), LOOM_OK, "%s", loom_program_error(t));
	cr_assert_eq(loom_import_safetensors(inf, path, NULL, NULL), LOOM_OK, "%s",
		     loom_program_error(inf));
	unlink(path);
	eval(t, &m, lt, zt, &losst);
	eval(inf, &m, li, zi, &lossi);
	cr_expect_eq(memcmp(zt, zi, sizeof(zt)), 0, "trained eval logits differ");
	cr_expect_eq(losst, lossi);

	/* Only evaluation runs. */
	feed(inf, &m, 1);
	cr_expect_eq(loom_run(inf, LOOM_RUN_TRAIN), LOOM_ERR_STATE);
	cr_expect(strstr(loom_program_error(inf), "forward-only"), "%s",
		  loom_program_error(inf));
	cr_expect_eq(loom_run(inf, LOOM_RUN_GRAD), LOOM_ERR_STATE);
	cr_expect_eq(loom_run(inf, LOOM_RUN_EVAL), LOOM_OK);
	loom_program_free(t);
	loom_program_free(inf);
}

Test(inference, convnet_o0) { same_as_training((model){ 0, LOOM_O0 }); }
Test(inference, convnet_o2) { same_as_training((model){ 0, LOOM_O2 }); }
Test(inference, resnet18_narrow_o0) { same_as_training((model){ 1, LOOM_O0 }); }

Test(inference, checkpoint_of_a_training_program_is_refused)
{
	model m = { 0, LOOM_O0 };
	loom_value lt, li;
	loom_program *t = build(&m, 0, &lt), *inf = build(&m, 1, &li);
	char path[] = "/tmp/loom-inf-ckpt-XXXXXX";
	int fd = mkstemp(path);
	cr_assert(fd >= 0);
	close(fd);
	cr_assert_eq(loom_save(t, path), LOOM_OK);
	cr_expect_eq(loom_load(inf, path), LOOM_ERR_MISMATCH);
	unlink(path);
	loom_program_free(t);
	loom_program_free(inf);
}
