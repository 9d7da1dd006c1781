/*
 * examples/resnet50_synthetic.c — pure training speed, as the classic
 * data-parallel benchmark measures it: ResNet-50 at 224x224 fed one fixed
 * random batch per rank (a mock loader: nothing is read or decoded), timed
 * over --steps after --warmup, images/s per rank and in total. bench/
 * scaling.sh runs it at 1 and N ranks for the scaling table.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/splitmix.h"
#include "examples/models.h"
#include "examples/peak.h"
#include "examples/train.h"
#include "loom.h"

/* The fixed batch, and when the timed steps began and ended. */
typedef struct bench_task {
	const float *img;
	const int32_t *lab;
	size_t ni;
	double t0, t_end;
} bench_task;

static int bench_step(train_run *t, void *ctx, int64_t epoch, int64_t b, int run, int update,
		      train_tally *ty)
{
	bench_task *k = ctx;
	(void)epoch;
	(void)update;
	if (!run)
		return 0;
	if (b == t->a.warmup)
		k->t0 = train_now();
	if (train_step(t, k->img, k->ni, k->lab, t->a.batch, 1)) {
		fprintf(stderr, "resnet50_synthetic: step %lld: %s\n", (long long)b + 1,
			loom_program_error(t->p));
		return -1;
	}
	k->t_end = train_now();
	ty->loss += loom_loss(t->p);
	return 0;
}

static void bench_progress(train_run *t, void *ctx, const train_progress *pr)
{
	(void)ctx;
	printf("step %3lld/%lld%s  loss %.4f  %.2f s  %.1f img/s on rank 0\n", (long long)pr->done,
	       (long long)pr->last, pr->done <= t->a.warmup ? " (warm-up)" : "",
	       pr->tally->loss / pr->tally->steps, pr->secs, t->a.batch / pr->secs);
}

/* MFU of the mean rank: the plan's products (loom_program_info's FLOPs of a
 * step, forward and backward) at its pace, against the peak (--peak-flops,
 * or a loom matmul at the run's precision, measured now that the timed
 * steps are over: on rank 0 only, the one that prints). */
static void print_mfu(const train_run *t, double img_per_s)
{
	const train_args *a = &t->a;
	loom_program_info info;
	char how[64];
	if (t->rank != 0 || a->pipeline > 1) /* a stage's plan is part of the model's */
		return;
	loom_program_info_get(t->p, &info);
	loom_device dev = !strcmp(info.backend, "cuda") ? LOOM_DEVICE_CUDA : LOOM_DEVICE_CPU;
	double per_img = (info.flops_fwd + info.flops_bwd) / a->batch;
	double peak = a->peak_flops > 0 ? a->peak_flops :
					  train_peak_flops(dev, a->level, a->half, !a->no_tf32);
	printf("MFU %.1f%% (%.2f GFLOP per image from the plan, %.1f GFLOP/s achieved; peak "
	       "%.1f GFLOP/s, %s)\n",
	       train_mfu(img_per_s * per_img, peak), per_img * 1e-9, img_per_s * per_img * 1e-9,
	       peak * 1e-9, train_peak_how(how, sizeof(how), a->peak_flops, dev, a->level, a->half));
}

int main(int argc, char **argv)
{
	train_run t;
	int rc = train_start(&t, &train_resnet50_synthetic, argc, argv);
	if (rc >= 0)
		return rc;
	const train_args *a = &t.a;
	int classes = a->size <= 64 ? 10 : 1000;
	size_t ni = (size_t)a->batch * 3 * a->size * a->size;
	float *img = malloc(sizeof(float) * ni);
	int32_t *lab = malloc(sizeof(int32_t) * (size_t)a->batch);
	double *rates = calloc((size_t)t.gworld, sizeof(double));
	loom_graph *g = NULL;
	char what[128];
	rc = 1;

	if (!img || !lab || !rates || loom_graph_new(&g) != LOOM_OK) {
		fprintf(stderr, "resnet50_synthetic: out of memory\n");
		goto out;
	}
	/* splitmix64: the same batch for the same (seed, rank) on every machine. */
	uint64_t s = a->seed * 7919 + (uint64_t)t.rank;
	for (size_t i = 0; i < ni; i++)
		img[i] = (float)((loom_splitmix64(&s) >> 40) / (double)(1 << 24) * 2 - 1);
	for (int i = 0; i < a->batch; i++)
		lab[i] = (int32_t)(loom_splitmix64(&s) % (uint64_t)classes);

	loom_value logits;
	loom_graph_set_seed(g, a->seed);
	loom_value loss = loom_model_resnet_width(g, a->depth, train_graph_batch(&t), a->size, classes, a->width,
						  &logits);
	snprintf(what, sizeof(what), "ResNet-%d%s at %dx%d, one fixed random batch per rank",
		 a->depth, a->width == 64 ? "" : " (narrow)", a->size, a->size);
	switch (train_compile(&t, g, loss, logits, classes, what)) {
	case 0: break;
	case 1: rc = 0; goto out; /* --dry-run */
	default: goto out;
	}

	/* One epoch of --warmup + --steps steps on the common driver, a
	 * progress line (and --metrics row) per step. */
	bench_task k = { .img = img, .lab = lab, .ni = ni };
	train_task task = {
		.ctx = &k,
		.per_epoch = a->warmup + a->steps,
		.samples_per_step = (int64_t)a->batch * t.world,
		.unit = "img",
		.step = bench_step,
		.progress = bench_progress,
	};
	t.a.epochs = 1;
	t.a.log_interval = 1;
	if (train_drive(&t, &task))
		goto out;
	double dt = k.t_end - k.t0, mine = a->steps * (double)a->batch / dt;
	/* Every rank's speed, for rank 0 to print; the slowest sets the pace. */
	if (t.gworld > 1 && loom_comm_allgather(t.host, &mine, sizeof(mine), rates) != LOOM_OK) {
		fprintf(stderr, "resnet50_synthetic: %s\n", loom_pg_error(t.pg));
		goto out;
	} else if (t.gworld == 1) {
		rates[0] = mine;
	}
	/* --pipeline: a replica's stages go at one pace; its first stage's counts. */
	int every = a->pipeline > 1 ? a->pipeline : 1;
	for (int r = 0; r < t.world; r++)
		rates[r] = rates[r * every];
	double sum = 0, slowest = rates[0];
	for (int r = 0; r < t.world; r++) {
		printf("rank %d: %.2f img/s (batch %d, %d steps)\n", r, rates[r], a->batch, a->steps);
		sum += rates[r];
		slowest = rates[r] < slowest ? rates[r] : slowest;
	}
	printf("total: %.2f img/s over %d rank%s (global batch %d; the slowest rank's pace: %.2f)\n",
	       sum, t.world, t.world > 1 ? "s" : "", a->batch * t.world, slowest * t.world);
	print_mfu(&t, sum / t.world);
	rc = 0;
out:
	train_end(&t);
	loom_graph_free(g);
	free(img);
	free(lab);
	free(rates);
	return rc;
}
