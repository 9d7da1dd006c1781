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
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/options.h"
#include "examples/models.h"
#include "examples/outputs.h"
#include "examples/train_args.h"
#include "loom.h"
#include "loom_data.h"
#include "loom_io.h"

#define CLASSES 10

typedef struct classify_args {
	const char *model;      /* convnet, resnet18, resnet34 */
	const char *data;       /* MNIST-format or CIFAR-10 binary directory */
	const char *split;      /* t10k/train (MNIST), test/train (CIFAR) */
	const char *weights;    /* safetensors */
	const char *checkpoint; /* loom_save's file */
	const char *predictions; /* per-image rows, or NULL */
	int width, batch, top_k, threads, strict;
	int64_t limit;          /* first N images, 0: all */
	loom_opt_level level;
	loom_dtype half;
	int fp8;                /* --precision fp8 (train_args.h) */
	loom_optim_kind optim;  /* --checkpoint: the optimizer it was trained with */
	loom_device device;
} classify_args;

static void usage(FILE *f)
{
	fprintf(f,
		"usage: classify [options]\n"
		"Runs a trained model on a test split: accuracy, top-k, confusion matrix, images/s.\n\n"
		"  --weights FILE       safetensors weights (PyTorch's state_dict names), run on a\n"
		"                       forward-only plan\n"
		"  --checkpoint FILE    or a loom checkpoint (loom_save), run on the training program\n"
		"                       it came from: give its --opt-level, --precision, --optimizer\n"
		"  --model M            convnet (default), resnet18 or resnet34 (CIFAR stem)\n"
		"  --width N            the ResNet's first-stage channels (default 64)\n"
		"  --data DIR           MNIST-format (convnet; default %s) or CIFAR-10 binary\n"
		"                       directory (resnet)\n"
		"  --split S            t10k or train (MNIST), test or train (CIFAR); default the test split\n"
		"  --limit N            only the first N images\n"
		"  --batch-size N       images per run (default 100)\n"
		"  --top-k K            also count a hit when the label is among the K best (default 5)\n"
		"  --predictions FILE   every image's index, label, prediction and logits: CSV when\n"
		"                       FILE ends in .csv, else JSON Lines (one object per image)\n"
		"  --opt-level O0..O3   precision of the plan (default O0)\n"
		"  --precision P        fp16, bf16 or fp8 (default fp16)\n"
		"  --optimizer O        sgd or adamw: --checkpoint's (default sgd)\n"
		"  --init-strict B      true (default) or false: names must match both ways\n"
		"  --device D           auto, cpu or cuda (default auto)\n"
		"  --threads N          CPU threads\n"
		"  --help               this text\n",
		LOOM_FASHION_MNIST_DIR);
}

static int parse_long(const char *flag, const char *s, long lo, long hi, long *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi) {
		fprintf(stderr, "classify: %s expects an integer in [%ld, %ld], got '%s'\n", flag, lo,
			hi, s);
		return -1;
	}
	*out = v;
	return 0;
}

/* 0 to run, 1 after --help, 2 for a bad flag (said on stderr). */
static int parse(int argc, char **argv, classify_args *a)
{
	static const struct option opts[] = {
		{ "weights", required_argument, 0, 'w' }, { "checkpoint", required_argument, 0, 'c' },
		{ "model", required_argument, 0, 'm' },	  { "width", required_argument, 0, 'W' },
		{ "data", required_argument, 0, 'd' },	  { "split", required_argument, 0, 's' },
		{ "limit", required_argument, 0, 'n' },	  { "batch-size", required_argument, 0, 'b' },
		{ "top-k", required_argument, 0, 'k' },	  { "opt-level", required_argument, 0, 'O' },
		{ "precision", required_argument, 0, 'p' }, { "optimizer", required_argument, 0, 'o' },
		{ "init-strict", required_argument, 0, 'S' }, { "device", required_argument, 0, 'D' },
		{ "threads", required_argument, 0, 't' }, { "help", no_argument, 0, 'h' },
		{ "predictions", required_argument, 0, 'P' },
		{ 0, 0, 0, 0 },
	};
	*a = (classify_args){ .model = "convnet", .width = 64, .batch = 100, .top_k = 5,
			      .strict = 1, .half = LOOM_F16, .optim = LOOM_OPTIM_SGD };
	long l;
	int c;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'w': a->weights = optarg; break;
		case 'c': a->checkpoint = optarg; break;
		case 'P': a->predictions = optarg; break;
		case 'm': a->model = optarg; break;
		case 'd': a->data = optarg; break;
		case 's': a->split = optarg; break;
		case 'W': if (parse_long("--width", optarg, 1, 4096, &l)) return 2; a->width = (int)l; break;
		case 'n': if (parse_long("--limit", optarg, 1, 1L << 40, &l)) return 2; a->limit = l; break;
		case 'b': if (parse_long("--batch-size", optarg, 1, 1 << 16, &l)) return 2; a->batch = (int)l; break;
		case 'k': if (parse_long("--top-k", optarg, 1, CLASSES, &l)) return 2; a->top_k = (int)l; break;
		case 't': case 'O': case 'p': case 'o': case 'S': case 'D': {
			/* the flags classify shares with training: one parser of each */
			const char *name = c == 't' ? "threads" : c == 'O' ? "opt-level" :
					   c == 'p' ? "precision" : c == 'o' ? "optimizer" :
					   c == 'S' ? "init-strict" : "device";
			char msg[256];
			train_args t = train_mnist_ddp.defaults;
			if (train_set_value(&train_mnist_ddp, name, optarg, &t, msg, sizeof(msg))) {
				fprintf(stderr, "classify: %s\n", msg);
				return 2;
			}
			switch (c) {
			case 't': a->threads = t.threads; break;
			case 'O': a->level = t.level; break;
			case 'p': a->half = t.half; a->fp8 = t.fp8; break;
			case 'o': a->optim = t.optim; break;
			case 'S': a->strict = t.init_strict; break;
			default: a->device = t.device; break;
			}
			break;
		}
		case 'h': usage(stdout); return 1;
		default:
			fprintf(stderr, "classify: unknown or incomplete option '%s' (see --help)\n",
				argv[optind - 1]);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "classify: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	if (!!a->weights == !!a->checkpoint) {
		fprintf(stderr, "classify: give --weights FILE.safetensors or --checkpoint FILE (one)\n");
		return 2;
	}
	if (strcmp(a->model, "convnet") && strcmp(a->model, "resnet18") && strcmp(a->model, "resnet34")) {
		fprintf(stderr, "classify: --model must be convnet, resnet18 or resnet34, got '%s'\n",
			a->model);
		return 2;
	}
	return 0;
}

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

int main(int argc, char **argv)
{
	classify_args a;
	char wd[512];
	/* Relative paths are the user's under `bazel run` too. */
	if (train_enter_user_dir(wd, sizeof(wd))) {
		fprintf(stderr, "classify: %s\n", wd);
		return 2;
	}
	int rc = parse(argc, argv, &a);
	if (rc)
		return rc == 1 ? 0 : 2;
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
	float *img = NULL, *out = NULL;
	int32_t *lab = NULL;
	char err[512];
	rc = 1;
	if (load_data(&a, &ds))
		goto out;
	static const float cmean[3] = LOOM_CIFAR10_MEAN, cstd[3] = LOOM_CIFAR10_STD;
	if (loom_sampler_new(ds.n, 0, 1, 0, 0, 0, &s, err, sizeof(err)) ||
	    loom_loader_new(&ds, s, a.batch, 0, LOOM_FASHION_MNIST_MEAN, LOOM_FASHION_MNIST_STD, &l,
			    err, sizeof(err))) {
		fprintf(stderr, "classify: %s\n", err);
		goto out;
	}
	if (!is_convnet(&a) && loom_loader_set_normalize(l, cmean, cstd)) {
		fprintf(stderr, "classify: %s\n", loom_loader_error(l));
		goto out;
	}
	loom_value logits;
	if (!(p = build(&a, &logits)))
		goto out;
	loom_program_info info;
	char cpu[128];
	loom_program_info_get(p, &info);
	printf("loom classify: %s, %s on %s/%s (%lld images), %s, opt level O%d\n", info.backend,
	       a.model, a.data ? a.data : LOOM_FASHION_MNIST_DIR,
	       a.split ? a.split : is_convnet(&a) ? "t10k" : "test", (long long)ds.n,
	       a.weights ? a.weights : a.checkpoint, a.level);
	printf("%s\n", loom_cpu_describe(cpu, sizeof(cpu)));
	printf("%s plan: %.2f MiB arena (params %.2f, grads %.2f, optimizer %.2f, activations %.2f MiB)\n",
	       a.weights ? "forward-only" : "training", info.arena_bytes / 1048576.0,
	       info.param_bytes / 1048576.0, info.grad_bytes / 1048576.0,
	       info.optim_state_bytes / 1048576.0, info.activation_bytes / 1048576.0);

	size_t elems = loom_loader_image_elems(l);
	img = malloc(sizeof(float) * elems * a.batch);
	out = malloc(sizeof(float) * CLASSES * a.batch);
	lab = malloc(sizeof(int32_t) * a.batch);
	if (!img || !out || !lab) {
		fprintf(stderr, "classify: out of memory\n");
		goto out;
	}
	static int64_t conf[CLASSES][CLASSES];
	int64_t n = 0, topk = 0, batches = loom_loader_num_batches(l);
	double loss_sum = 0, t0 = now_s();
	/* The loader converts straight into the program's input buffers
	 * (loom_input_buffer), unless LOOM_INPUT_BUFFER=0: its own and
	 * loom_set_input's copy, as examples/train.c. */
	int direct = loom_opt_bool(LOOM_OPT_INPUT_BUFFER);
	for (int64_t b = 0; b < batches; b++) {
		int count;
		float *bi = img;
		int32_t *bl = lab;
		void *pi, *pl;
		if (direct) {
			if (loom_input_buffer(p, "image", LOOM_F32, elems * a.batch, &pi) ||
			    loom_input_buffer(p, "label", LOOM_I32, a.batch, &pl)) {
				fprintf(stderr, "classify: %s\n", loom_program_error(p));
				goto out;
			}
			bi = pi;
			bl = pl;
		}
		if (loom_loader_get(l, b, bi, bl, &count) != LOOM_OK) {
			fprintf(stderr, "classify: %s\n", loom_loader_error(l));
			goto out;
		}
		/* The plan has one batch size: pad the last batch, count its rows. */
		memset(bi + (size_t)count * elems, 0, sizeof(float) * elems * (a.batch - count));
		memset(bl + count, 0, sizeof(int32_t) * (a.batch - count));
		if ((direct ? loom_input_commit(p, "image") || loom_input_commit(p, "label") :
			      loom_set_input(p, "image", bi, LOOM_F32, elems * a.batch) ||
				      loom_set_input(p, "label", bl, LOOM_I32, a.batch)) ||
		    loom_run(p, LOOM_RUN_EVAL) ||
		    loom_read(p, logits, out, (size_t)CLASSES * a.batch)) {
			fprintf(stderr, "classify: batch %lld: %s\n", (long long)b,
				loom_program_error(p));
			goto out;
		}
		for (int r = 0; r < count; r++) {
			const float *z = out + (size_t)r * CLASSES;
			int pred = 0;
			double se = 0;
			for (int c = 1; c < CLASSES; c++)
				pred = z[c] > z[pred] ? c : pred;
			for (int c = 0; c < CLASSES; c++)
				se += exp(z[c] - z[pred]);
			loss_sum += z[pred] + log(se) - z[bl[r]]; /* cross-entropy of the row */
			conf[bl[r]][pred]++;
			topk += rank_of(z, bl[r]) < a.top_k;
			if (pf) /* the sampler keeps the split's order */
				predictions_row(pf, a.predictions, n, bl[r], pred, z);
			n++;
		}
	}
	report(&a, conf, n, topk, now_s() - t0, loss_sum);
	if (pf) {
		int bad = ferror(pf);
		bad |= fclose(pf) != 0;
		pf = NULL;
		if (bad) {
			fprintf(stderr, "classify: --predictions %s: %s\n", a.predictions,
				strerror(errno));
			unlink(a.predictions);
			goto out;
		}
		printf("predictions: %lld rows in %s (%s)\n", (long long)n, a.predictions,
		       predictions_csv(a.predictions) ? "CSV" : "JSON Lines");
	}
	rc = 0;
out:
	if (pf) { /* a failed run leaves no half file behind */
		fclose(pf);
		unlink(a.predictions);
	}
	free(img);
	free(out);
	free(lab);
	loom_program_free(p);
	loom_loader_free(l);
	loom_sampler_free(s);
	loom_dataset_free(&ds);
	return rc;
}
