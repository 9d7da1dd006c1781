/*
 * tests/examples/test_metrics.c — the --metrics log (examples/metrics.c)
 * parsed back line by line with jansson, on its own and from a mnist_ddp
 * run on a small hand-made dataset; and that run's --export / --init-from
 * (--reinit, a bad file named) from the command line; and examples/classify
 * on the export (a forward-only plan) and on the checkpoint, which give the
 * accuracy of the run's own last evaluation.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "examples/metrics.h"
#include "tests/examples/mnist_fixture.h"

#define MNIST_BIN "examples/mnist_ddp"
#define CLASSIFY_BIN "examples/classify"

static const char *in_dir(const char *name)
{
	const char *p = mnist_fixture_in_dir(name);
	cr_assert_not_null(p, "mkdtemp: %s", strerror(errno));
	return p;
}

/* Every line of path as a JSON object; *n gets the count. */
static json_t **read_lines(const char *path, int *n)
{
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f, "%s: %s", path, strerror(errno));
	json_t **v = calloc(256, sizeof(*v));
	char *line = NULL;
	size_t cap = 0;
	*n = 0;
	while (getline(&line, &cap, f) > 0 && *n < 256) {
		json_error_t je;
		v[*n] = json_loads(line, 0, &je);
		cr_assert_not_null(v[*n], "line %d of %s is not JSON: %s (%s)", *n + 1, path,
				   je.text, line);
		cr_assert(json_is_object(v[*n]));
		(*n)++;
	}
	free(line);
	fclose(f);
	return v;
}

static void free_lines(json_t **v, int n)
{
	for (int i = 0; i < n; i++)
		json_decref(v[i]);
	free(v);
}

static const char *type_of(json_t *o)
{
	return json_string_value(json_object_get(o, "type"));
}

Test(metrics, lines_parse_back)
{
	train_metrics *m;
	char err[256];
	const char *path = in_dir("unit.jsonl");
	cr_assert_eq(train_metrics_open(&m, path, err, sizeof(err)), 0, "%s", err);
	for (int s = 1; s <= 3; s++)
		cr_assert_eq(train_metrics_log(m, "step", err, sizeof(err), "{s:i, s:f, s:o}",
					       "step", s, "loss", 1.0 / s, "accuracy",
					       train_metrics_number(s == 2 ? NAN : 0.5)),
			     0, "%s", err);
	cr_assert_eq(train_metrics_log(m, "epoch", err, sizeof(err), "{s:i, s:f}", "epoch", 1,
				       "test_accuracy", 0.875),
		     0);
	cr_expect_eq(train_metrics_log(m, "bad", err, sizeof(err), "[i]", 3), -1);
	cr_expect(strstr(err, "'bad'"), "%s", err);
	/* Flushed: readable before the file is closed. */
	int n;
	json_t **v = read_lines(path, &n);
	cr_assert_eq(n, 4);
	free_lines(v, n);
	cr_assert_eq(train_metrics_close(m), 0);

	v = read_lines(path, &n);
	cr_assert_eq(n, 4);
	double last_wall = 0;
	for (int s = 0; s < 3; s++) {
		cr_expect_str_eq(type_of(v[s]), "step");
		cr_expect_eq(json_integer_value(json_object_get(v[s], "step")), s + 1);
		cr_expect_float_eq(json_real_value(json_object_get(v[s], "loss")), 1.0 / (s + 1),
				   1e-9);
		double w = json_real_value(json_object_get(v[s], "wall_s"));
		cr_expect_geq(w, last_wall);
		last_wall = w;
	}
	cr_expect(json_is_null(json_object_get(v[1], "accuracy")), "NaN is written as null");
	cr_expect_str_eq(type_of(v[3]), "epoch");
	cr_expect_float_eq(json_real_value(json_object_get(v[3], "test_accuracy")), 0.875, 1e-12);
	free_lines(v, n);
	cr_expect_eq(train_metrics_open(&m, "/nonexistent/dir/m.jsonl", err, sizeof(err)), -1);
	cr_expect(strstr(err, "/nonexistent/dir/m.jsonl"), "%s", err);
}

/* Runs bin with args on the fixture; its output into out. */
static int run_bin(const char *bin, const char *args, char *out, size_t len)
{
	return mnist_fixture_run(bin, mnist_fixture_dir(), args, out, len);
}

static int run(const char *args, char *out, size_t len)
{
	return run_bin(MNIST_BIN, args, out, len);
}

/* classify's accuracy line: hits of n. */
static void classify_hits(const char *args, long long *hits, long long *n)
{
	static char out[1 << 16];
	double pct;
	cr_assert_eq(run_bin(CLASSIFY_BIN, args, out, sizeof(out)), 0, "%s", out);
	const char *line = strstr(out, "accuracy ");
	cr_assert_not_null(line, "%s", out);
	cr_assert_eq(sscanf(line, "accuracy %lf%% (%lld of %lld)", &pct, hits, n), 3, "%s", line);
	cr_expect(strstr(out, "confusion matrix"), "%s", out);
}

Test(metrics, mnist_ddp_run_logs_every_step_and_epoch, .timeout = 300)
{
	static char out[1 << 16];
	char args[2048];
	if (access(MNIST_BIN, X_OK) != 0)
		cr_skip_test("needs %s (run through bazel test)", MNIST_BIN);
	in_dir("x");
	cr_assert_eq(mnist_fixture_split(mnist_fixture_dir(), "train", 120), 0);
	cr_assert_eq(mnist_fixture_split(mnist_fixture_dir(), "t10k", 40), 0);
	const char *metrics = in_dir("run.jsonl"), *exp = in_dir("run.safetensors");
	snprintf(args, sizeof(args),
		 "--batch-size 20 --epochs 2 --log-interval 2 --metrics %s --export %s "
		 "--checkpoint %s", metrics, exp, in_dir("run.ckpt"));
	cr_assert_eq(run(args, out, sizeof(out)), 0, "%s", out);
	cr_expect(strstr(out, "exported the weights to"), "%s", out);

	int n;
	json_t **v = read_lines(metrics, &n);
	/* start, then per epoch 6 steps logged every 2 (3 lines) and the epoch. */
	cr_assert_eq(n, 1 + 2 * (3 + 1), "%d lines", n);
	cr_expect_str_eq(type_of(v[0]), "start");
	cr_expect_str_eq(json_string_value(json_object_get(v[0], "opt_level")), "O0");
	int steps = 0, epochs = 0;
	double last_acc = -1;
	for (int i = 1; i < n; i++) {
		if (!strcmp(type_of(v[i]), "step")) {
			steps++;
			cr_expect_eq(json_integer_value(json_object_get(v[i], "step")), 2 * steps);
			double loss = json_real_value(json_object_get(v[i], "loss"));
			cr_expect(loss > 0 && loss < 20, "loss %g", loss);
			cr_expect_float_eq(json_real_value(json_object_get(v[i], "lr")), 0.01, 1e-12);
			cr_expect_eq(json_integer_value(json_object_get(v[i], "ranks")), 1);
			cr_expect_eq(json_integer_value(json_object_get(v[i], "global_batch")), 20);
			cr_expect_gt(json_real_value(json_object_get(v[i], "images_per_s")), 0);
		} else {
			cr_expect_str_eq(type_of(v[i]), "epoch");
			epochs++;
			cr_expect_eq(json_integer_value(json_object_get(v[i], "epoch")), epochs);
			cr_expect_eq(json_integer_value(json_object_get(v[i], "step")), 6 * epochs);
			double acc = json_real_value(json_object_get(v[i], "test_accuracy"));
			cr_expect(acc >= 0 && acc <= 1, "test accuracy %g", acc);
			last_acc = acc;
		}
	}
	cr_expect_eq(steps, 6);
	cr_expect_eq(epochs, 2);
	free_lines(v, n);

	/* Back in: the export starts a second run; --reinit fc leaves the head. */
	snprintf(args, sizeof(args), "--max-steps 1 --epochs 1 --batch-size 20 --init-from %s", exp);
	cr_assert_eq(run(args, out, sizeof(out)), 0, "%s", out);
	cr_expect(strstr(out, "initialised from") && strstr(out, ": 14 tensors"), "%s", out);
	snprintf(args, sizeof(args),
		 "--max-steps 1 --epochs 1 --batch-size 20 --init-from %s --reinit fc", exp);
	cr_assert_eq(run(args, out, sizeof(out)), 0, "%s", out);
	cr_expect(strstr(out, "12 tensors, 2 left as initialised (--reinit fc)"), "%s", out);
	/* A file that is not safetensors: named, exit 1. */
	snprintf(args, sizeof(args), "--max-steps 1 --init-from %s", metrics);
	cr_expect_eq(run(args, out, sizeof(out)), 1, "%s", out);
	cr_expect(strstr(out, "--init-from") && strstr(out, metrics), "%s", out);
	cr_expect_eq(run("--reinit fc", out, sizeof(out)), 2, "%s", out);
	cr_expect(strstr(out, "--reinit applies to --init-from"), "%s", out);

	/* classify on the export: the forward-only plan counts what the run's
	 * last evaluation counted, over the 40 test images (two batches of 16
	 * and one of 8, padded). */
	long long hits, imgs;
	snprintf(args, sizeof(args), "--weights %s --batch-size 16 --top-k 10", exp);
	classify_hits(args, &hits, &imgs);
	cr_expect_eq(imgs, 40);
	cr_expect_eq(hits, (long long)(last_acc * 40 + 0.5), "classify %lld of 40, the run %g",
		     hits, last_acc);
	/* The checkpoint, through the training program it was saved from (its
	 * batch: the graph is part of the checkpoint's fingerprint). */
	snprintf(args, sizeof(args), "--checkpoint %s --batch-size 20", in_dir("run.ckpt"));
	classify_hits(args, &hits, &imgs);
	cr_expect_eq(hits, (long long)(last_acc * 40 + 0.5), "checkpoint: %lld of 40", hits);
	cr_expect_eq(run_bin(CLASSIFY_BIN, "--batch-size 16", out, sizeof(out)), 2, "%s", out);
	cr_expect(strstr(out, "give --weights"), "%s", out);
}
