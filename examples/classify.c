/*
 * examples/classify.c — inference with loom: a model's weights from a
 * safetensors file (PyTorch's names: a file mnist_ddp --export wrote, or one
 * PyTorch saved) run on a test split through a forward-only plan
 * (loom_compile_opts.inference), or a loom checkpoint through the training
 * program it was saved from (in eval mode: the same outputs bit for bit).
 * Prints accuracy, top-k accuracy, the confusion matrix and images/s;
 * --predictions FILE writes every image's index, label, prediction and
 * logits (CSV for a .csv name, else JSON Lines), so that another engine's
 * outputs can be compared image by image.
 *
 *   classify --weights convnet.safetensors                 (Fashion-MNIST t10k)
 *   classify --model resnet18 --data cifar-10-batches-bin --weights r.safetensors
 *   classify --checkpoint c.ckpt --opt-level O2            (as trained)
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/options.h"
#include "examples/classify_args.h"
#include "examples/models.h"
#include "examples/outputs.h"
#include "examples/train_args.h"
#include "loom.h"
#include "loom_data.h"
#include "loom_io.h"

#define CLASSES 10

static int is_convnet(const classify_args *a)
{
	return strcmp(a->model, "convnet") == 0;
}

static int load_data(const classify_args *a, loom_dataset *ds)
{
	char err[768];
	loom_status st;
	if (is_convnet(a))
		st = loom_mnist_load(a->data ? a->data : LOOM_FASHION_MNIST_DIR,
				     a->split ? a->split : "t10k", ds, err, sizeof(err));
	else if (!a->data) {
		fprintf(stderr, "classify: --model %s needs --data, a CIFAR-10 binary directory\n",
			a->model);
		return -1;
	} else
		st = loom_cifar10_load(a->data, a->split ? a->split : "test", ds, err, sizeof(err));
	if (st != LOOM_OK) {
		fprintf(stderr, "classify: %s\n", err);
		return -1;
	}
	int want_c = is_convnet(a) ? 1 : 3, want_hw = is_convnet(a) ? 28 : 32;
	if (ds->c != want_c || ds->h != want_hw || ds->w != want_hw) {
		fprintf(stderr, "classify: the images are %dx%dx%d, --model %s takes %dx%dx%d\n",
			ds->c, ds->h, ds->w, a->model, want_c, want_hw, want_hw);
		return -1;
	}
	if (a->limit && a->limit < ds->n)
		ds->n = a->limit;
	if (ds->n == 0) {
		fprintf(stderr, "classify: no images to classify\n");
		return -1;
	}
	return 0;
}

/* Compiles the model: forward-only for --weights, the training program for
 * --checkpoint; then reads the weights. */
static loom_program *build(const classify_args *a, loom_value *logits)
{
	loom_graph *g = NULL;
	loom_program *p = NULL;
	loom_compile_opts o;
	if (loom_graph_new(&g) != LOOM_OK) {
		fprintf(stderr, "classify: out of memory\n");
		return NULL;
	}
	loom_value loss = is_convnet(a) ?
				  loom_model_convnet(g, a->batch, logits) :
				  loom_model_resnet_width(g, a->model[6] == '3' ? 34 : 18, a->batch,
							  32, CLASSES, a->width, logits);
	loom_compile_opts_default(&o);
	o.device = a->device;
	o.amp.level = a->level;
	o.amp.half = a->half;
	o.amp.fp8 = a->fp8;
	o.optim.kind = a->optim;
	o.inference = a->weights != NULL;
	loom_status st = loom_compile(g, loss, &o, &p);
	loom_graph_free(g);
	if (st != LOOM_OK) {
		fprintf(stderr, "classify: %s\n", loom_last_error());
		loom_program_free(p);
		return NULL;
	}
	if (a->checkpoint) {
		if (loom_load(p, a->checkpoint) != LOOM_OK) {
			fprintf(stderr, "classify: %s (give the --opt-level, --precision and "
				"--optimizer it was trained with)\n", loom_program_error(p));
			loom_program_free(p);
			return NULL;
		}
		return p;
	}
	loom_weights_opts wo;
	loom_weights_report r;
	if (is_convnet(a))
		loom_convnet_weights_opts(&wo);
	else
		loom_weights_opts_default(&wo);
	wo.strict = a->strict;
	if (loom_import_safetensors(p, a->weights, &wo, &r) != LOOM_OK) {
		fprintf(stderr, "classify: %s\n", loom_program_error(p));
		loom_program_free(p);
		return NULL;
	}
	if (r.missing || r.unexpected)
		printf("weights: %d tensors loaded, %d missing (first %s), %d unexpected (first %s)\n",
		       r.loaded, r.missing, r.first_missing, r.unexpected, r.first_unexpected);
	return p;
}

/* How many of the k best scores are above the label's: the label is in the
 * top k when fewer than k are. */
static int rank_of(const float *z, int label)
{
	int above = 0;
	for (int c = 0; c < CLASSES; c++)
		above += z[c] > z[label] || (z[c] == z[label] && c < label);
	return above;
}

static void report(const classify_args *a, const int64_t conf[CLASSES][CLASSES], int64_t n,
		   int64_t topk, double secs, double loss_sum)
{
	int64_t hits = 0;
	for (int c = 0; c < CLASSES; c++)
		hits += conf[c][c];
	printf("accuracy %.2f%% (%lld of %lld), top-%d %.2f%%, mean loss %.4f\n", 100.0 * hits / n,
	       (long long)hits, (long long)n, a->top_k, 100.0 * topk / n, loss_sum / n);
	printf("%.1f images/s (%lld images in %.2f s, batch %d, loading included)\n", n / secs,
	       (long long)n, secs, a->batch);
	printf("confusion matrix (rows: label, columns: prediction)\n      ");
	for (int c = 0; c < CLASSES; c++)
		printf("%6d", c);
	printf("  recall\n");
	for (int r = 0; r < CLASSES; r++) {
		int64_t row = 0;
		printf("%6d", r);
		for (int c = 0; c < CLASSES; c++) {
			printf("%6lld", (long long)conf[r][c]);
			row += conf[r][c];
		}
		printf("  %5.1f%%\n", row ? 100.0 * conf[r][r] / row : 0.0);
	}
}

/* --predictions: CSV for a name ending in .csv, JSON Lines otherwise. */
static int predictions_csv(const char *path)
{
	size_t n = strlen(path);
	return n >= 4 && !strcmp(path + n - 4, ".csv");
}

static void predictions_head(FILE *f, const char *path)
{
	if (!predictions_csv(path))
		return;
	fprintf(f, "index,label,prediction");
	for (int c = 0; c < CLASSES; c++)
		fprintf(f, ",logit%d", c);
	fputc('\n', f);
}

/* One image's row; %.9g gives every f32 logit back exactly. */
static void predictions_row(FILE *f, const char *path, int64_t index, int label, int pred,
			    const float *z)
{
	int csv = predictions_csv(path);
	fprintf(f, csv ? "%lld,%d,%d" : "{\"index\": %lld, \"label\": %d, \"prediction\": %d, \"logits\": [",
		(long long)index, label, pred);
	for (int c = 0; c < CLASSES; c++) {
		if (isfinite(z[c]))
			fprintf(f, csv ? ",%.9g" : c ? ", %.9g" : "%.9g", z[c]);
		else /* JSON has no NaN or inf: null, as --metrics writes it */
			fprintf(f, csv ? ",%s" : c ? ", %s" : "%s",
				csv ? (isnan(z[c]) ? "nan" : z[c] > 0 ? "inf" : "-inf") : "null");
	}
	fputs(csv ? "\n" : "]}\n", f);
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

/* The loader over the split, normalised as the model was trained: 0, or
 * -1 after saying why. */
static int open_loader(const classify_args *a, loom_dataset *ds, loom_sampler **s,
		       loom_loader **l)
{
	static const float cmean[3] = LOOM_CIFAR10_MEAN, cstd[3] = LOOM_CIFAR10_STD;
	char err[512];

	if (load_data(a, ds))
		return -1;
	if (loom_sampler_new(ds->n, 0, 1, 0, 0, 0, s, err, sizeof(err)) ||
	    loom_loader_new(ds, *s, a->batch, 0, LOOM_FASHION_MNIST_MEAN, LOOM_FASHION_MNIST_STD, l,
			    err, sizeof(err))) {
		fprintf(stderr, "classify: %s\n", err);
		return -1;
	}
	if (!is_convnet(a) && loom_loader_set_normalize(*l, cmean, cstd)) {
		fprintf(stderr, "classify: %s\n", loom_loader_error(*l));
		return -1;
	}
	return 0;
}

/* The first lines: what runs on what, and the plan's memory. */
static void print_header(const classify_args *a, loom_program *p, const loom_dataset *ds)
{
	loom_program_info info;
	char cpu[128];

	loom_program_info_get(p, &info);
	printf("loom classify: %s, %s on %s/%s (%lld images), %s, opt level O%d\n", info.backend,
	       a->model, a->data ? a->data : LOOM_FASHION_MNIST_DIR,
	       a->split ? a->split : is_convnet(a) ? "t10k" : "test", (long long)ds->n,
	       a->weights ? a->weights : a->checkpoint, a->level);
	printf("%s\n", loom_cpu_describe(cpu, sizeof(cpu)));
	printf("%s plan: %.2f MiB arena (params %.2f, grads %.2f, optimizer %.2f, activations %.2f MiB)\n",
	       a->weights ? "forward-only" : "training", info.arena_bytes / 1048576.0,
	       info.param_bytes / 1048576.0, info.grad_bytes / 1048576.0,
	       info.optim_state_bytes / 1048576.0, info.activation_bytes / 1048576.0);
}

/* What the run counts, image by image. */
typedef struct tally {
	int64_t conf[CLASSES][CLASSES];
	int64_t n, topk;
	double loss_sum;
} tally;

/* One batch's count rows of logits (out) against their labels. */
static void count_rows(const classify_args *a, const float *out, const int32_t *bl, int count,
		       tally *ty, FILE *pf)
{
	for (int r = 0; r < count; r++) {
		const float *z = out + (size_t)r * CLASSES;
		int pred = 0;
		double se = 0;
		for (int c = 1; c < CLASSES; c++)
			pred = z[c] > z[pred] ? c : pred;
		for (int c = 0; c < CLASSES; c++)
			se += exp(z[c] - z[pred]);
		ty->loss_sum += z[pred] + log(se) - z[bl[r]]; /* cross-entropy of the row */
		ty->conf[bl[r]][pred]++;
		ty->topk += rank_of(z, bl[r]) < a->top_k;
		if (pf) /* the sampler keeps the split's order */
			predictions_row(pf, a->predictions, ty->n, bl[r], pred, z);
		ty->n++;
	}
}

/* The buffers one batch goes through, and whether they are the program's
 * own input buffers (direct). */
typedef struct batch_io {
	float *img, *out;
	int32_t *lab;
	size_t elems;
	int direct;
} batch_io;

/* Batch b through the program into the tally: 0, or -1 after saying why. */
static int run_batch(const classify_args *a, loom_program *p, loom_loader *l, loom_value logits,
		     int64_t b, const batch_io *io, tally *ty, FILE *pf)
{
	size_t elems = io->elems;
	float *bi = io->img;
	int32_t *bl = io->lab;
	void *pi, *pl;
	int count;

	if (io->direct) {
		if (loom_input_buffer(p, "image", LOOM_F32, elems * a->batch, &pi) ||
		    loom_input_buffer(p, "label", LOOM_I32, a->batch, &pl)) {
			fprintf(stderr, "classify: %s\n", loom_program_error(p));
			return -1;
		}
		bi = pi;
		bl = pl;
	}
	if (loom_loader_get(l, b, bi, bl, &count) != LOOM_OK) {
		fprintf(stderr, "classify: %s\n", loom_loader_error(l));
		return -1;
	}
	/* The plan has one batch size: pad the last batch, count its rows. */
	memset(bi + (size_t)count * elems, 0, sizeof(float) * elems * (a->batch - count));
	memset(bl + count, 0, sizeof(int32_t) * (a->batch - count));
	if ((io->direct ? loom_input_commit(p, "image") || loom_input_commit(p, "label") :
			  loom_set_input(p, "image", bi, LOOM_F32, elems * a->batch) ||
				  loom_set_input(p, "label", bl, LOOM_I32, a->batch)) ||
	    loom_run(p, LOOM_RUN_EVAL) ||
	    loom_read(p, logits, io->out, (size_t)CLASSES * a->batch)) {
		fprintf(stderr, "classify: batch %lld: %s\n", (long long)b, loom_program_error(p));
		return -1;
	}
	count_rows(a, io->out, bl, count, ty, pf);
	return 0;
}

/* --predictions closed and said: 0, or -1 (the file removed) after saying why. */
static int close_predictions(const classify_args *a, FILE *pf, int64_t n)
{
	int bad = ferror(pf);

	bad |= fclose(pf) != 0;
	if (bad) {
		fprintf(stderr, "classify: --predictions %s: %s\n", a->predictions, strerror(errno));
		unlink(a->predictions);
		return -1;
	}
	printf("predictions: %lld rows in %s (%s)\n", (long long)n, a->predictions,
	       predictions_csv(a->predictions) ? "CSV" : "JSON Lines");
	return 0;
}

int main(int argc, char **argv)
{
	classify_args a;
	char wd[512], msg[512];
	/* Relative paths are the user's under `bazel run` too. */
	if (train_enter_user_dir(wd, sizeof(wd))) {
		fprintf(stderr, "classify: %s\n", wd);
		return 2;
	}
	int rc = classify_parse(argc, argv, &a, stdout, msg, sizeof(msg));
	if (rc) {
		if (rc == 2)
			fprintf(stderr, "classify: %s\n", msg);
		return rc == 1 ? 0 : 2;
	}
	if (a.threads)
		loom_cpu_set_threads(a.threads);
	/* The output path is checked before anything is loaded or compiled. */
	FILE *pf = NULL;
	if (a.predictions && !(pf = fopen(a.predictions, "w"))) {
		fprintf(stderr, "classify: --predictions %s: %s\n", a.predictions, strerror(errno));
		return 2;
	}
	if (pf)
		predictions_head(pf, a.predictions);

	loom_dataset ds = { 0 };
	loom_sampler *s = NULL;
	loom_loader *l = NULL;
	loom_program *p = NULL;
	batch_io io = { 0 };
	rc = 1;
	if (open_loader(&a, &ds, &s, &l))
		goto out;
	loom_value logits;
	if (!(p = build(&a, &logits)))
		goto out;
	print_header(&a, p, &ds);

	io.elems = loom_loader_image_elems(l);
	io.img = malloc(sizeof(float) * io.elems * a.batch);
	io.out = malloc(sizeof(float) * CLASSES * a.batch);
	io.lab = malloc(sizeof(int32_t) * a.batch);
	if (!io.img || !io.out || !io.lab) {
		fprintf(stderr, "classify: out of memory\n");
		goto out;
	}
	static tally ty;
	int64_t batches = loom_loader_num_batches(l);
	double t0 = now_s();
	/* The loader converts straight into the program's input buffers
	 * (loom_input_buffer), unless LOOM_INPUT_BUFFER=0: its own and
	 * loom_set_input's copy, as examples/train.c. */
	io.direct = loom_opt_bool(LOOM_OPT_INPUT_BUFFER);
	for (int64_t b = 0; b < batches; b++)
		if (run_batch(&a, p, l, logits, b, &io, &ty, pf))
			goto out;
	report(&a, ty.conf, ty.n, ty.topk, now_s() - t0, ty.loss_sum);
	if (pf) {
		FILE *f = pf;
		pf = NULL;
		if (close_predictions(&a, f, ty.n))
			goto out;
	}
	rc = 0;
out:
	if (pf) { /* a failed run leaves no half file behind */
		fclose(pf);
		unlink(a.predictions);
	}
	free(io.img);
	free(io.out);
	free(io.lab);
	loom_program_free(p);
	loom_loader_free(l);
	loom_sampler_free(s);
	loom_dataset_free(&ds);
	return rc;
}
