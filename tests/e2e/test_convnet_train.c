/*
 * tests/e2e/test_convnet_train.c — end to end: the ConvNet trained on
 * Fashion-MNIST through the public API, as a user would. One epoch of O0
 * must reach 80% test accuracy; one epoch of O1 and of O2 must land within
 * 0.5 points of it. Skipped when the dataset is not installed.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "examples/models.h"
#include "loom.h"
#include "loom_data.h"

#define B 100

static loom_dataset train, test;

static void need_data(void)
{
	char err[256];
	if (access(LOOM_FASHION_MNIST_DIR, R_OK) != 0)
		cr_skip_test("needs the Debian package dataset-fashion-mnist at %s",
			     LOOM_FASHION_MNIST_DIR);
	cr_assert_eq(loom_mnist_load(NULL, "train", &train, err, sizeof(err)), LOOM_OK, "%s", err);
	cr_assert_eq(loom_mnist_load(NULL, "t10k", &test, err, sizeof(err)), LOOM_OK, "%s", err);
}

static void free_data(void)
{
	loom_dataset_free(&train);
	loom_dataset_free(&test);
}

/* The test set's accuracy of p's logits, in full batches of B. */
static double evaluate(loom_program *p, loom_value logits, loom_loader *el, loom_sampler *es,
		       float *img)
{
	float out[B * 10];
	int32_t lab[B];
	int64_t correct = 0;
	int count;

	loom_sampler_set_epoch(es, 0);
	for (int64_t b = 0; b < loom_loader_num_batches(el); b++) {
		cr_assert_eq(loom_loader_get(el, b, img, lab, &count), LOOM_OK);
		cr_assert_eq(count, B, "10000 test images split into full batches of 100");
		loom_set_input(p, "image", img, LOOM_F32, B * 784);
		loom_set_input(p, "label", lab, LOOM_I32, B);
		cr_assert_eq(loom_run(p, LOOM_RUN_EVAL), LOOM_OK, "%s", loom_program_error(p));
		cr_assert_eq(loom_read(p, logits, out, B * 10), LOOM_OK);
		for (int i = 0; i < B; i++) {
			int arg = 0;
			for (int k = 1; k < 10; k++)
				if (out[i * 10 + k] > out[i * 10 + arg])
					arg = k;
			correct += arg == lab[i];
		}
	}
	return (double)correct / test.n;
}

/* Trains `epochs` epochs at level; acc[e] is the test accuracy after epoch e. */
static void train_eval(loom_opt_level level, int epochs, double *acc)
{
	char err[256];
	loom_graph *g;
	loom_program *p;
	loom_sampler *ts, *es;
	loom_loader *tl, *el;
	loom_value logits;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value loss = loom_model_convnet(g, B, &logits);
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim.momentum = 0.9;
	o.amp.level = level;
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	cr_assert_eq(loom_sampler_new(train.n, 0, 1, 1, 0, 0, &ts, err, sizeof(err)), LOOM_OK);
	cr_assert_eq(loom_sampler_new(test.n, 0, 1, 0, 0, 0, &es, err, sizeof(err)), LOOM_OK);
	cr_assert_eq(loom_loader_new(&train, ts, B, 1, LOOM_FASHION_MNIST_MEAN,
				     LOOM_FASHION_MNIST_STD, &tl, err, sizeof(err)), LOOM_OK);
	cr_assert_eq(loom_loader_new(&test, es, B, 0, LOOM_FASHION_MNIST_MEAN,
				     LOOM_FASHION_MNIST_STD, &el, err, sizeof(err)), LOOM_OK);
	float *img = malloc(sizeof(float) * B * 784);
	int32_t lab[B];
	int count;
	for (int e = 0; e < epochs; e++) {
		loom_sampler_set_epoch(ts, e);
		for (int64_t b = 0; b < loom_loader_num_batches(tl); b++) {
			cr_assert_eq(loom_loader_get(tl, b, img, lab, &count), LOOM_OK);
			loom_set_input(p, "image", img, LOOM_F32, B * 784);
			loom_set_input(p, "label", lab, LOOM_I32, B);
			cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
			cr_assert(isfinite(loom_loss(p)), "O%d: loss became %g at step %lld", level,
				  loom_loss(p), (long long)b);
		}
		acc[e] = evaluate(p, logits, el, es, img);
	}
	free(img);
	loom_loader_free(tl);
	loom_loader_free(el);
	loom_sampler_free(ts);
	loom_sampler_free(es);
	loom_program_free(p);
	loom_graph_free(g);
}

TestSuite(convnet_train, .init = need_data, .fini = free_data, .timeout = 1200);

/* One epoch at each level from the same initial weights and batches: O0
 * must reach 80%, O1 and O2 land within half a point of it (measured,
 * 2-core EPYC AVX2: 87.46%, 87.45%, 87.54% after one epoch; 89.34%,
 * 89.49%, 89.44% after two, which this test ran before at 7 epochs in all). */
Test(convnet_train, one_epoch_each_level_o1_o2_within_half_a_point_of_o0)
{
	double a0, a1, a2;
	train_eval(LOOM_O0, 1, &a0);
	train_eval(LOOM_O1, 1, &a1);
	train_eval(LOOM_O2, 1, &a2);
	fprintf(stderr, "1 epoch: O0 %.2f%%, O1 %.2f%%, O2 %.2f%%\n", 100 * a0, 100 * a1, 100 * a2);
	cr_assert_geq(a0, 0.80, "O0 reached only %.2f%%", 100 * a0);
	cr_assert_leq(fabs(a1 - a0), 0.005, "O1 %.2f%% vs O0 %.2f%%", 100 * a1, 100 * a0);
	cr_assert_leq(fabs(a2 - a0), 0.005, "O2 %.2f%% vs O0 %.2f%%", 100 * a2, 100 * a0);
}
