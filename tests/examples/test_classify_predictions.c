/*
 * tests/examples/test_classify_predictions.c — classify --predictions: a
 * mnist_ddp run on a small hand-made dataset exports its weights, classify
 * writes every test image's row as CSV and as JSON Lines; both are read
 * back: one row per image in the split's order, the fixture's labels, the
 * prediction the argmax of the logits, as many hits as classify's own
 * accuracy line, the two formats equal. A path that cannot be written is
 * refused before anything is loaded.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/examples/mnist_fixture.h"

#define MNIST_BIN "examples/mnist_ddp"
#define CLASSIFY_BIN "examples/classify"
#define CLASSES 10
#define TEST_N 40

static const char *in_dir(const char *name)
{
	const char *p = mnist_fixture_in_dir(name);
	cr_assert_not_null(p, "mkdtemp: %s", strerror(errno));
	return p;
}

static int run(const char *bin, const char *args, char *out, size_t len)
{
	return mnist_fixture_run(bin, mnist_fixture_dir(), args, out, len);
}

typedef struct row {
	long long index;
	int label, pred;
	double z[CLASSES];
} row;

static int read_csv(const char *path, row *r, int max)
{
	FILE *f = fopen(path, "r");
	char line[4096];
	int n = 0;
	cr_assert_not_null(f, "%s: %s", path, strerror(errno));
	cr_assert_not_null(fgets(line, sizeof(line), f));
	cr_expect_str_eq(line, "index,label,prediction,logit0,logit1,logit2,logit3,logit4,logit5,"
			       "logit6,logit7,logit8,logit9\n");
	while (fgets(line, sizeof(line), f) && n < max) {
		char *p = line;
		r[n].index = strtoll(p, &p, 10);
		cr_assert_eq(*p++, ',', "%s", line);
		r[n].label = (int)strtol(p, &p, 10);
		cr_assert_eq(*p++, ',', "%s", line);
		r[n].pred = (int)strtol(p, &p, 10);
		for (int c = 0; c < CLASSES; c++) {
			cr_assert_eq(*p++, ',', "%s", line);
			r[n].z[c] = strtod(p, &p);
		}
		cr_assert_eq(*p, '\n', "%s", line);
		n++;
	}
	fclose(f);
	return n;
}

static int read_jsonl(const char *path, row *r, int max)
{
	FILE *f = fopen(path, "r");
	char line[4096];
	int n = 0;
	cr_assert_not_null(f, "%s: %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f) && n < max) {
		json_error_t je;
		json_t *o = json_loads(line, 0, &je);
		cr_assert_not_null(o, "not JSON: %s (%s)", je.text, line);
		r[n].index = json_integer_value(json_object_get(o, "index"));
		r[n].label = (int)json_integer_value(json_object_get(o, "label"));
		r[n].pred = (int)json_integer_value(json_object_get(o, "prediction"));
		json_t *z = json_object_get(o, "logits");
		cr_assert_eq(json_array_size(z), CLASSES, "%s", line);
		for (int c = 0; c < CLASSES; c++)
			r[n].z[c] = json_number_value(json_array_get(z, c));
		json_decref(o);
		n++;
	}
	fclose(f);
	return n;
}

Test(classify, predictions_csv_and_jsonl, .timeout = 300)
{
	static char out[1 << 16];
	char args[4096];
	row csv[TEST_N + 1], js[TEST_N + 1];
	if (access(MNIST_BIN, X_OK) != 0 || access(CLASSIFY_BIN, X_OK) != 0)
		cr_skip_test("needs %s and %s (run through bazel test)", MNIST_BIN, CLASSIFY_BIN);
	in_dir("x");
	cr_assert_eq(mnist_fixture_split(mnist_fixture_dir(), "train", 100), 0);
	cr_assert_eq(mnist_fixture_split(mnist_fixture_dir(), "t10k", TEST_N), 0);
	snprintf(args, sizeof(args), "--batch-size 20 --epochs 1 --export %s",
		 in_dir("w.safetensors"));
	cr_assert_eq(run(MNIST_BIN, args, out, sizeof(out)), 0, "%s", out);

	snprintf(args, sizeof(args), "--weights %s --batch-size 16 --predictions %s",
		 in_dir("w.safetensors"), in_dir("p.csv"));
	cr_assert_eq(run(CLASSIFY_BIN, args, out, sizeof(out)), 0, "%s", out);
	long long hits = -1, n = -1;
	double pct;
	const char *acc = strstr(out, "accuracy ");
	cr_assert_not_null(acc, "%s", out);
	cr_assert_eq(sscanf(acc, "accuracy %lf%% (%lld of %lld)", &pct, &hits, &n), 3);
	cr_expect(strstr(out, "predictions: 40 rows in "), "%s", out);
	snprintf(args, sizeof(args), "--weights %s --batch-size 16 --predictions %s",
		 in_dir("w.safetensors"), in_dir("p.jsonl"));
	cr_assert_eq(run(CLASSIFY_BIN, args, out, sizeof(out)), 0, "%s", out);

	cr_assert_eq(read_csv(in_dir("p.csv"), csv, TEST_N + 1), TEST_N);
	cr_assert_eq(read_jsonl(in_dir("p.jsonl"), js, TEST_N + 1), TEST_N);
	long long right = 0;
	for (int i = 0; i < TEST_N; i++) {
		int best = 0;
		cr_expect_eq(csv[i].index, i);
		cr_expect_eq(csv[i].label, i % 10, "row %d", i);
		for (int c = 1; c < CLASSES; c++)
			best = csv[i].z[c] > csv[i].z[best] ? c : best;
		cr_expect_eq(csv[i].pred, best, "row %d: prediction %d, argmax %d", i, csv[i].pred,
			     best);
		right += csv[i].pred == csv[i].label;
		cr_expect_eq(js[i].index, csv[i].index);
		cr_expect_eq(js[i].label, csv[i].label);
		cr_expect_eq(js[i].pred, csv[i].pred);
		for (int c = 0; c < CLASSES; c++)
			cr_expect_eq(js[i].z[c], csv[i].z[c], "row %d logit %d", i, c);
	}
	cr_expect_eq(right, hits, "rows right %lld, classify's line %lld", right, hits);
	cr_expect_eq(n, TEST_N);

	/* `bazel run` semantics: started in another directory (its runfiles)
	 * with the user's in BUILD_WORKING_DIRECTORY, classify reads the
	 * relative --data and --weights and writes the relative --predictions
	 * where the user is. */
	char exe[4096], cmd[16384];
	cr_assert_not_null(realpath(CLASSIFY_BIN, exe), "%s: %s", CLASSIFY_BIN, strerror(errno));
	cr_assert_eq(mkdir(in_dir("runfiles"), 0700), 0, "%s", strerror(errno));
	snprintf(cmd, sizeof(cmd), "cd %s && BUILD_WORKING_DIRECTORY=%s %s --data . --weights "
		 "w.safetensors --predictions r.csv --device cpu --threads 1 >/dev/null 2>&1",
		 in_dir("runfiles"), mnist_fixture_dir(), exe);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
	cr_expect_eq(access(in_dir("r.csv"), R_OK), 0, "r.csv is not in the user's directory");
	cr_expect_neq(access(in_dir("runfiles/r.csv"), F_OK), 0, "r.csv landed in runfiles/");
}

Test(classify, predictions_path_checked_first)
{
	static char out[1 << 16];
	char args[4096];
	if (access(CLASSIFY_BIN, X_OK) != 0)
		cr_skip_test("needs %s (run through bazel test)", CLASSIFY_BIN);
	in_dir("x");
	/* No data and no weights exist here: the path is refused before either is read. */
	snprintf(args, sizeof(args), "--weights %s --predictions %s", in_dir("none.safetensors"),
		 in_dir("no/such/dir/p.csv"));
	cr_expect_eq(run(CLASSIFY_BIN, args, out, sizeof(out)), 2, "%s", out);
	cr_expect(strstr(out, "classify: --predictions ") && strstr(out, "no/such/dir/p.csv: No such "
									   "file or directory"),
		  "%s", out);
	cr_expect(!strstr(out, "loom classify:"), "nothing was loaded: %s", out);
	snprintf(args, sizeof(args), "--weights %s --predictions %s", in_dir("none.safetensors"), mnist_fixture_dir());
	cr_expect_eq(run(CLASSIFY_BIN, args, out, sizeof(out)), 2, "%s", out);
	cr_expect(strstr(out, "Is a directory"), "%s", out);
}
