/*
 * tests/ddp/eval_worker.c — one rank of the evaluation test (test_eval.sh):
 * test accuracy and loss summed over ranks, each rank evaluating its shard
 * of the test set as examples/mnist_ddp does, must equal one process
 * evaluating the whole set with the same weights, however the shards are
 * padded. Every rank prints the global figure it computed.
 *
 *   eval_worker train PATH [N]          the ranks train the ConvNet a little
 *                                       on synthetic images, rank 0 saves
 *                                       PATH; with N, then every rank
 *                                       evaluates (its buffers are its own
 *                                       until then)
 *   eval_worker eval PATH N [padding]   loads PATH on every rank, evaluates
 *                                       N synthetic images (batch 64);
 *                                       "padding" also counts the sampler's
 *                                       repeats (the test's own check that
 *                                       it would notice)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "loom.h"
#include "loom_data.h"
#include "tests/ddp/worker_util.h"

#define BATCH 64
#define DATA_SEED 11 /* the same images to train on and to evaluate */

static int rank, world;

/* Synthetic images and labels are unrelated; every other image gets its
 * label stamped in (a bright row at the label's height), so that a little
 * training learns half the set and the correct count lies far from both 0
 * and n: an error in it cannot hide. */
static loom_status load_data(int64_t n, loom_dataset *ds, char *err, size_t errlen)
{
	loom_status st = loom_synthetic_load(n, 1, 28, 28, 10, DATA_SEED, ds, err, errlen);
	for (int64_t i = 0; st == LOOM_OK && i < n; i += 2)
		memset(ds->images + i * 784 + (2 + 2 * ds->labels[i]) * 28, 255, 28);
	return st;
}

static loom_status build(loom_pg *pg, worker_model *m, loom_value *logits)
{
	loom_compile_opts o;
	worker_opts(&o, pg, LOOM_O0, 0.05, 0.9);
	return worker_convnet(m, BATCH, 3, &o, logits);
}

/*
 * The example's evaluation: this rank's shard through the sampler (no
 * shuffle, padded to the same length on every rank) and the loader (a
 * final partial batch, zero-filled past its count), eval mode, top-1 and
 * cross-entropy in double for the rows the rank owns, then the three sums
 * all-reduced.
 */
static int evaluate(loom_pg *pg, loom_program *p, loom_value logits, int64_t n,
		    int count_padding)
{
	loom_dataset ds = { 0 };
	loom_sampler *s = NULL;
	loom_loader *l = NULL;
	char err[256];
	float *img = malloc(sizeof(float) * BATCH * 784), *out = malloc(sizeof(float) * BATCH * 10);
	int32_t *lab = malloc(sizeof(int32_t) * BATCH);
	loom_status st;
	if ((st = load_data(n, &ds, err, sizeof(err))) ||
	    (st = loom_sampler_new(ds.n, rank, world, 0, 0, 0, &s, err, sizeof(err))) ||
	    (st = loom_loader_new(&ds, s, BATCH, 0, LOOM_FASHION_MNIST_MEAN, LOOM_FASHION_MNIST_STD,
				  &l, err, sizeof(err))))
		return worker_fail("data", st, err);
	int64_t own = count_padding ? loom_sampler_len(s) : loom_sampler_len_unpadded(s);
	double sums[3] = { 0, 0, 0 }; /* correct, seen, loss */
	for (int64_t i = 0; i < loom_loader_num_batches(l); i++) {
		int count;
		if ((st = loom_loader_get(l, i, img, lab, &count)))
			return worker_fail("data", st, loom_loader_error(l));
		for (int r = count; r < BATCH; r++) {
			memset(img + (size_t)r * 784, 0, 784 * sizeof(float));
			lab[r] = 0;
		}
		if ((st = loom_set_input(p, "image", img, LOOM_F32, (size_t)BATCH * 784)) ||
		    (st = loom_set_input(p, "label", lab, LOOM_I32, BATCH)) ||
		    (st = loom_run(p, LOOM_RUN_EVAL)) ||
		    (st = loom_read(p, logits, out, (size_t)BATCH * 10)))
			return worker_fail("eval", st, loom_program_error(p));
		for (int r = 0; r < count && i * BATCH + r < own; r++) {
			const float *z = out + r * 10;
			int arg = 0;
			double lse = 0;
			for (int k = 1; k < 10; k++)
				if (z[k] > z[arg])
					arg = k;
			for (int k = 0; k < 10; k++)
				lse += exp((double)z[k] - z[arg]);
			sums[0] += arg == lab[r];
			sums[1] += 1;
			sums[2] += z[arg] + log(lse) - z[lab[r]];
		}
	}
	if (world > 1 && (st = loom_comm_allreduce(loom_pg_comm(pg, LOOM_COMM_HOST), sums, 3,
						   LOOM_F64)))
		return worker_fail("all-reduce", st, loom_pg_error(pg));
	printf("rank %d: OK eval world %d images %lld batch %d correct %.0f seen %.0f loss %.17g\n",
	       rank, world, (long long)n, BATCH, sums[0], sums[1], sums[2] / sums[1]);
	free(img);
	free(out);
	free(lab);
	loom_loader_free(l);
	loom_sampler_free(s);
	loom_dataset_free(&ds);
	return 0;
}

static int eval(loom_pg *pg, const char *path, int64_t n, int count_padding)
{
	worker_model m = { 0 };
	loom_value logits;
	loom_status st = build(pg, &m, &logits);
	loom_program *p = m.p;
	if (st)
		return worker_free(worker_fail("compile", st, loom_last_error()), &m, NULL);
	if ((st = loom_load(p, path)))
		return worker_free(worker_fail("load", st, loom_program_error(p)), &m, NULL);
	return worker_free(evaluate(pg, p, logits, n, count_padding), &m, NULL);
}

/* Three epochs on 1000 synthetic images, the ones evaluated later, each
 * rank on its shard (batch 64 per rank); rank 0 saves. */
static int train(loom_pg *pg, const char *path, int64_t eval_n)
{
	worker_model m;
	loom_value logits;
	loom_dataset ds = { 0 };
	loom_sampler *s = NULL;
	loom_loader *l = NULL;
	char err[256];
	float *img = malloc(sizeof(float) * BATCH * 784);
	int32_t *lab = malloc(sizeof(int32_t) * BATCH);
	loom_status st = build(pg, &m, &logits);
	loom_program *p = m.p;
	if (st)
		return worker_fail("compile", st, loom_last_error());
	if ((st = load_data(1000, &ds, err, sizeof(err))) ||
	    (st = loom_sampler_new(ds.n, rank, world, 1, 0, 0, &s, err, sizeof(err))) ||
	    (st = loom_loader_new(&ds, s, BATCH, 1, LOOM_FASHION_MNIST_MEAN, LOOM_FASHION_MNIST_STD,
				  &l, err, sizeof(err))))
		return worker_fail("data", st, err);
	for (int e = 0; e < 3; e++) {
		loom_sampler_set_epoch(s, e);
		for (int64_t b = 0; b < loom_loader_num_batches(l); b++) {
			int count;
			if ((st = loom_loader_get(l, b, img, lab, &count)) ||
			    (st = loom_set_input(p, "image", img, LOOM_F32, (size_t)BATCH * 784)) ||
			    (st = loom_set_input(p, "label", lab, LOOM_I32, BATCH)) ||
			    (st = loom_run(p, LOOM_RUN_TRAIN)))
				return worker_fail("step", st, loom_program_error(p));
		}
	}
	if (rank == 0 && (st = loom_save(p, path)))
		return worker_fail("save", st, loom_program_error(p));
	printf("rank %d: OK trained %lld steps, loss %.4f\n", rank, (long long)loom_step_count(p),
	       loom_loss(p));
	if (eval_n > 0 && evaluate(pg, p, logits, eval_n, 0))
		return 1;
	free(img);
	free(lab);
	loom_loader_free(l);
	loom_sampler_free(s);
	loom_dataset_free(&ds);
	loom_program_free(p);
	loom_graph_free(m.g);
	return 0;
}

int main(int argc, char **argv)
{
	loom_pg *pg = NULL;
	int rc;
	if (argc < 3 || (strcmp(argv[1], "train") && (strcmp(argv[1], "eval") || argc < 4))) {
		fprintf(stderr, "usage: eval_worker train PATH [N] | eval PATH N [padding]\n");
		return 2;
	}
	if (worker_init(&pg, &rank, &world))
		return 1;
	if (!strcmp(argv[1], "train"))
		rc = train(pg, argv[2], argc > 3 ? atoll(argv[3]) : 0);
	else
		rc = eval(pg, argv[2], atoll(argv[3]), argc > 4 && !strcmp(argv[4], "padding"));
	fflush(stdout);
	loom_pg_free(pg);
	return rc;
}
