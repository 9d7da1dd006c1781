/*
 * examples/mnist_ddp.c — trains the classic data-parallel ConvNet (two
 * conv 5x5 + batch norm + relu + max-pool blocks and a linear classifier)
 * on Fashion-MNIST (or any MNIST-format directory), with apex-style mixed
 * precision, checkpoints and resume. One process for now; the data sampler
 * is already rank-aware for the data-parallel runs to come.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "examples/models.h"
#include "loom.h"
#include "loom_data.h"

typedef struct args {
	int epochs;
	int batch;
	double lr, momentum, weight_decay;
	int lr_step;       /* epochs between decays, 0: constant */
	double lr_gamma;
	loom_optim_kind optim;
	const char *data;
	uint64_t seed;
	const char *checkpoint;
	int resume;
	loom_device device;
	loom_opt_level level;
	loom_dtype half;
	double loss_scale; /* 0: the level's default (dynamic) */
	int keep_bn_fp32;  /* -1: the level's default */
	int save_every;    /* steps between mid-epoch checkpoints, 0: epoch ends only */
	int log_interval;
	int64_t max_steps; /* 0: no limit (for smoke runs) */
	int dump_graph;
	int threads;
} args;

static void usage(FILE *f)
{
	fprintf(f,
		"usage: mnist_ddp [options]\n"
		"Trains a ConvNet (conv5x5-16 bn relu pool, conv5x5-32 bn relu pool, linear 1568->10)\n"
		"on Fashion-MNIST with loom.\n\n"
		"  --data DIR           MNIST-format directory (default %s)\n"
		"  --epochs N           epochs to train (default 2)\n"
		"  --batch-size N       images per step (default 100)\n"
		"  --optimizer NAME     sgd or adamw (default sgd)\n"
		"  --lr X               learning rate (default 0.01)\n"
		"  --momentum X         SGD momentum (default 0.9)\n"
		"  --weight-decay X     weight decay (default 0)\n"
		"  --lr-step N          multiply the lr by --lr-gamma every N epochs (default off)\n"
		"  --lr-gamma X         step decay factor (default 0.1)\n"
		"  --opt-level O0..O3   apex mixed-precision level (default O0)\n"
		"  --precision P        fp16 or bf16, the half type of O1..O3 (default fp16)\n"
		"  --loss-scale S       'dynamic' (default for O1/O2 fp16) or a fixed number\n"
		"  --keep-batchnorm-fp32 B  true or false: override the level's batch-norm precision (O2, O3)\n"
		"  --device D           auto, cpu or cuda (default auto: cuda if present)\n"
		"  --seed N             initialisation and shuffling seed (default 0)\n"
		"  --threads N          CPU threads (default: one per core)\n"
		"  --checkpoint PATH    save here after every epoch (atomic write)\n"
		"  --save-every N       also save every N steps (resume continues mid-epoch)\n"
		"  --resume             continue from --checkpoint\n"
		"  --log-interval N     steps between progress lines (default 100)\n"
		"  --max-steps N        stop after N training steps (smoke tests)\n"
		"  --dump-graph         print the compiled plan: each node's dtype (AMP casts included)\n"
		"                       and its place in the arena\n"
		"  --help               this text\n",
		LOOM_FASHION_MNIST_DIR);
}

static int parse_double(const char *flag, const char *s, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v)) {
		fprintf(stderr, "mnist_ddp: %s expects a number, got '%s'\n", flag, s);
		return -1;
	}
	*out = v;
	return 0;
}

static int parse_int(const char *flag, const char *s, long lo, long hi, long *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi) {
		fprintf(stderr, "mnist_ddp: %s expects an integer in [%ld, %ld], got '%s'\n", flag,
			lo, hi, s);
		return -1;
	}
	*out = v;
	return 0;
}

/* Returns 0 to run, 1 to exit successfully (--help), -1 on a bad flag. */
static int parse_args(int argc, char **argv, args *a)
{
	enum { O_DATA = 256, O_EPOCHS, O_BATCH, O_OPTIM, O_LR, O_MOM, O_WD, O_LRSTEP, O_LRGAMMA,
	       O_LEVEL, O_PREC, O_SCALE, O_DEVICE, O_SEED, O_CKPT, O_RESUME, O_LOG, O_MAX,
	       O_DUMP, O_KEEPBN, O_SAVE_EVERY, O_THREADS, O_HELP };
	static const struct option opts[] = {
		{ "data", required_argument, 0, O_DATA },
		{ "epochs", required_argument, 0, O_EPOCHS },
		{ "batch-size", required_argument, 0, O_BATCH },
		{ "optimizer", required_argument, 0, O_OPTIM },
		{ "lr", required_argument, 0, O_LR },
		{ "momentum", required_argument, 0, O_MOM },
		{ "weight-decay", required_argument, 0, O_WD },
		{ "lr-step", required_argument, 0, O_LRSTEP },
		{ "lr-gamma", required_argument, 0, O_LRGAMMA },
		{ "opt-level", required_argument, 0, O_LEVEL },
		{ "precision", required_argument, 0, O_PREC },
		{ "loss-scale", required_argument, 0, O_SCALE },
		{ "device", required_argument, 0, O_DEVICE },
		{ "seed", required_argument, 0, O_SEED },
		{ "checkpoint", required_argument, 0, O_CKPT },
		{ "resume", no_argument, 0, O_RESUME },
		{ "save-every", required_argument, 0, O_SAVE_EVERY },
		{ "log-interval", required_argument, 0, O_LOG },
		{ "max-steps", required_argument, 0, O_MAX },
		{ "dump-graph", no_argument, 0, O_DUMP },
		{ "keep-batchnorm-fp32", required_argument, 0, O_KEEPBN },
		{ "threads", required_argument, 0, O_THREADS },
		{ "help", no_argument, 0, O_HELP },
		{ 0, 0, 0, 0 },
	};
	*a = (args){ .epochs = 2, .batch = 100, .lr = 0.01, .momentum = 0.9, .lr_gamma = 0.1,
		     .optim = LOOM_OPTIM_SGD, .data = LOOM_FASHION_MNIST_DIR,
		     .device = LOOM_DEVICE_AUTO, .level = LOOM_O0, .half = LOOM_F16,
		     .log_interval = 100, .keep_bn_fp32 = -1 };
	long l;
	int c;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		const char *flag = optind > 1 ? argv[optind - 1] : "?";
		switch (c) {
		case O_DATA: a->data = optarg; break;
		case O_EPOCHS:
			if (parse_int("--epochs", optarg, 1, 100000, &l)) return -1;
			a->epochs = (int)l;
			break;
		case O_BATCH:
			if (parse_int("--batch-size", optarg, 1, 1 << 20, &l)) return -1;
			a->batch = (int)l;
			break;
		case O_OPTIM:
			if (!strcmp(optarg, "sgd")) a->optim = LOOM_OPTIM_SGD;
			else if (!strcmp(optarg, "adamw")) a->optim = LOOM_OPTIM_ADAMW;
			else {
				fprintf(stderr, "mnist_ddp: --optimizer must be sgd or adamw, got '%s'\n", optarg);
				return -1;
			}
			break;
		case O_LR: if (parse_double("--lr", optarg, &a->lr)) return -1; break;
		case O_MOM: if (parse_double("--momentum", optarg, &a->momentum)) return -1; break;
		case O_WD: if (parse_double("--weight-decay", optarg, &a->weight_decay)) return -1; break;
		case O_LRSTEP:
			if (parse_int("--lr-step", optarg, 0, 100000, &l)) return -1;
			a->lr_step = (int)l;
			break;
		case O_LRGAMMA: if (parse_double("--lr-gamma", optarg, &a->lr_gamma)) return -1; break;
		case O_LEVEL:
			if (strlen(optarg) == 2 && (optarg[0] == 'O' || optarg[0] == 'o') &&
			    optarg[1] >= '0' && optarg[1] <= '3')
				a->level = (loom_opt_level)(optarg[1] - '0');
			else {
				fprintf(stderr, "mnist_ddp: --opt-level must be O0, O1, O2 or O3, got '%s'\n", optarg);
				return -1;
			}
			break;
		case O_PREC:
			if (!strcmp(optarg, "fp16")) a->half = LOOM_F16;
			else if (!strcmp(optarg, "bf16")) a->half = LOOM_BF16;
			else {
				fprintf(stderr, "mnist_ddp: --precision must be fp16 or bf16, got '%s'\n", optarg);
				return -1;
			}
			break;
		case O_SCALE:
			if (!strcmp(optarg, "dynamic"))
				a->loss_scale = 0;
			else if (parse_double("--loss-scale", optarg, &a->loss_scale) || a->loss_scale <= 0) {
				fprintf(stderr, "mnist_ddp: --loss-scale must be 'dynamic' or a positive number\n");
				return -1;
			}
			break;
		case O_DEVICE:
			if (!strcmp(optarg, "auto")) a->device = LOOM_DEVICE_AUTO;
			else if (!strcmp(optarg, "cpu")) a->device = LOOM_DEVICE_CPU;
			else if (!strcmp(optarg, "cuda")) a->device = LOOM_DEVICE_CUDA;
			else {
				fprintf(stderr, "mnist_ddp: --device must be auto, cpu or cuda, got '%s'\n", optarg);
				return -1;
			}
			break;
		case O_SEED:
			if (parse_int("--seed", optarg, 0, 0x7fffffffL, &l)) return -1;
			a->seed = (uint64_t)l;
			break;
		case O_CKPT: a->checkpoint = optarg; break;
		case O_RESUME: a->resume = 1; break;
		case O_SAVE_EVERY:
			if (parse_int("--save-every", optarg, 1, 1 << 30, &l)) return -1;
			a->save_every = (int)l;
			break;
		case O_LOG:
			if (parse_int("--log-interval", optarg, 1, 1 << 30, &l)) return -1;
			a->log_interval = (int)l;
			break;
		case O_MAX:
			if (parse_int("--max-steps", optarg, 1, 0x7fffffffL, &l)) return -1;
			a->max_steps = l;
			break;
		case O_DUMP: a->dump_graph = 1; break;
		case O_THREADS:
			if (parse_int("--threads", optarg, 1, 1024, &l)) return -1;
			a->threads = (int)l;
			break;
		case O_KEEPBN:
			if (!strcmp(optarg, "true")) a->keep_bn_fp32 = 1;
			else if (!strcmp(optarg, "false")) a->keep_bn_fp32 = 0;
			else {
				fprintf(stderr, "mnist_ddp: --keep-batchnorm-fp32 must be true or false, got '%s'\n", optarg);
				return -1;
			}
			break;
		case 'h':
		case O_HELP: usage(stdout); return 1;
		default:
			fprintf(stderr, "mnist_ddp: unknown or incomplete option '%s' (see --help)\n", flag);
			return -1;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "mnist_ddp: unexpected argument '%s' (see --help)\n", argv[optind]);
		return -1;
	}
	if ((a->resume || a->save_every) && !a->checkpoint) {
		fprintf(stderr, "mnist_ddp: --resume and --save-every need --checkpoint PATH\n");
		return -1;
	}
	return 0;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Test-set accuracy and mean loss, in eval mode (running statistics). */
static loom_status evaluate(loom_program *p, loom_loader *test, loom_value logits, int b,
			    float *img, int32_t *lab, float *out, double *acc, double *loss)
{
	int64_t correct = 0, seen = 0;
	double lsum = 0;
	for (int64_t i = 0; i < loom_loader_num_batches(test); i++) {
		int count;
		loom_status st = loom_loader_get(test, i, img, lab, &count);
		if (st != LOOM_OK)
			return st;
		/* A final partial batch is padded; padded rows are not counted. */
		for (int r = count; r < b; r++) {
			memset(img + (size_t)r * 784, 0, 784 * sizeof(float));
			lab[r] = 0;
		}
		if ((st = loom_set_input(p, "image", img, LOOM_F32, (size_t)b * 784)) ||
		    (st = loom_set_input(p, "label", lab, LOOM_I32, b)) ||
		    (st = loom_run(p, LOOM_RUN_EVAL)) ||
		    (st = loom_read(p, logits, out, (size_t)b * 10)))
			return st;
		for (int r = 0; r < count; r++) {
			const float *z = out + r * 10;
			int arg = 0;
			double mx = z[0], s = 0;
			for (int k = 1; k < 10; k++)
				if (z[k] > z[arg])
					arg = k;
			mx = z[arg];
			for (int k = 0; k < 10; k++)
				s += exp(z[k] - mx);
			lsum += mx + log(s) - z[lab[r]];
			correct += arg == lab[r];
		}
		seen += count;
	}
	*acc = seen ? (double)correct / seen : 0;
	*loss = seen ? lsum / seen : 0;
	return LOOM_OK;
}

int main(int argc, char **argv)
{
	args a;
	int r = parse_args(argc, argv, &a);
	if (r)
		return r > 0 ? 0 : 2;

	char err[512];
	loom_dataset train = { 0 }, test = { 0 };
	loom_sampler *train_s = NULL, *test_s = NULL;
	loom_loader *train_l = NULL, *test_l = NULL;
	loom_graph *g = NULL;
	loom_program *p = NULL;
	float *img = NULL, *out = NULL;
	int32_t *lab = NULL;
	int rc = 1;

	if (loom_mnist_load(a.data, "train", &train, err, sizeof(err)) ||
	    loom_mnist_load(a.data, "t10k", &test, err, sizeof(err))) {
		fprintf(stderr, "mnist_ddp: %s\n", err);
		goto out;
	}
	if (train.h != 28 || train.w != 28 || test.h != 28 || test.w != 28) {
		fprintf(stderr, "mnist_ddp: %s: images are %dx%d, the ConvNet expects 28x28\n", a.data,
			train.h, train.w);
		goto out;
	}
	if (loom_sampler_new(train.n, 0, 1, 1, a.seed, 0, &train_s, err, sizeof(err)) ||
	    loom_sampler_new(test.n, 0, 1, 0, 0, 0, &test_s, err, sizeof(err)) ||
	    loom_loader_new(&train, train_s, a.batch, 1, LOOM_FASHION_MNIST_MEAN,
			    LOOM_FASHION_MNIST_STD, &train_l, err, sizeof(err)) ||
	    loom_loader_new(&test, test_s, a.batch, 0, LOOM_FASHION_MNIST_MEAN,
			    LOOM_FASHION_MNIST_STD, &test_l, err, sizeof(err))) {
		fprintf(stderr, "mnist_ddp: %s\n", err);
		goto out;
	}
	loom_sampler_set_epoch(test_s, 0);

	loom_value logits;
	if (loom_graph_new(&g) != LOOM_OK) {
		fprintf(stderr, "mnist_ddp: out of memory\n");
		goto out;
	}
	loom_graph_set_seed(g, a.seed);
	loom_value loss = loom_model_convnet(g, a.batch, &logits);

	if (a.threads)
		loom_cpu_set_threads(a.threads);
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = a.device;
	o.optim.kind = a.optim;
	o.optim.lr = a.lr;
	o.optim.momentum = a.optim == LOOM_OPTIM_SGD ? a.momentum : 0;
	o.optim.weight_decay = a.weight_decay;
	o.amp.level = a.level;
	o.amp.half = a.half;
	o.amp.static_scale = a.loss_scale;
	o.amp.keep_batchnorm_fp32 = a.keep_bn_fp32;
	if (loom_compile(g, loss, &o, &p) != LOOM_OK) {
		fprintf(stderr, "mnist_ddp: %s\n", loom_last_error());
		goto out;
	}
	if (a.dump_graph)
		loom_program_dump(p, stdout);
	loom_program_info info;
	loom_program_info_get(p, &info);
	printf("loom mnist_ddp: %s, %s, opt level O%d%s, %s lr %g, batch %d, %d epochs\n",
	       info.backend, a.data, a.level,
	       a.level == LOOM_O0 ? "" : a.half == LOOM_BF16 ? " (bf16)" : " (fp16)",
	       a.optim == LOOM_OPTIM_SGD ? "sgd" : "adamw", a.lr, a.batch, a.epochs);
	if (!strncmp(info.backend, "cpu", 3)) {
		char cpu[128];
		printf("%s\n", loom_cpu_describe(cpu, sizeof(cpu)));
	}
	printf("model: %lld parameters; memory planned before step 1: %.2f MiB arena "
	       "(params %.2f, master %.2f, grads %.2f, optimizer %.2f, activations %.2f MiB)\n",
	       (long long)info.n_param_elems, info.arena_bytes / 1048576.0,
	       info.param_bytes / 1048576.0, info.master_bytes / 1048576.0,
	       info.grad_bytes / 1048576.0, info.optim_state_bytes / 1048576.0,
	       info.activation_bytes / 1048576.0);

	int64_t per_epoch = loom_loader_num_batches(train_l);
	int64_t step = 0;
	if (a.resume) {
		if (access(a.checkpoint, F_OK) != 0) {
			printf("resume: %s does not exist yet, starting fresh\n", a.checkpoint);
		} else if (loom_load(p, a.checkpoint) != LOOM_OK) {
			fprintf(stderr, "mnist_ddp: %s\n", loom_program_error(p));
			goto out;
		} else {
			/* Every training run either stepped or was skipped (AMP
			 * overflow): together they count the batches consumed. */
			loom_program_info_get(p, &info);
			step = loom_step_count(p) + info.skipped_steps;
			printf("resumed %s at step %lld (epoch %lld, batch %lld), loss scale %g\n",
			       a.checkpoint, (long long)step, (long long)(step / per_epoch + 1),
			       (long long)(step % per_epoch), info.loss_scale);
		}
	}

	img = malloc(sizeof(float) * (size_t)a.batch * 784);
	out = malloc(sizeof(float) * (size_t)a.batch * 10);
	lab = malloc(sizeof(int32_t) * (size_t)a.batch);
	if (!img || !out || !lab) {
		fprintf(stderr, "mnist_ddp: out of memory\n");
		goto out;
	}

	int64_t batches_done = step;
	for (int epoch = (int)(batches_done / per_epoch); epoch < a.epochs; epoch++) {
		double lr = a.lr;
		if (a.lr_step > 0)
			lr = a.lr * pow(a.lr_gamma, epoch / a.lr_step);
		loom_set_lr(p, lr);
		loom_sampler_set_epoch(train_s, epoch);
		double t0 = now(), tlog = t0, lsum = 0;
		int64_t correct = 0, seen = 0, since = 0;
		int stop = 0;
		for (int64_t b = batches_done % per_epoch; b < per_epoch; b++) {
			int count;
			loom_status st;
			if ((st = loom_loader_get(train_l, b, img, lab, &count)) != LOOM_OK) {
				fprintf(stderr, "mnist_ddp: %s\n", loom_loader_error(train_l));
				goto out;
			}
			if ((st = loom_set_input(p, "image", img, LOOM_F32, (size_t)a.batch * 784)) ||
			    (st = loom_set_input(p, "label", lab, LOOM_I32, a.batch)) ||
			    (st = loom_run(p, LOOM_RUN_TRAIN)) ||
			    (st = loom_read(p, logits, out, (size_t)a.batch * 10))) {
				fprintf(stderr, "mnist_ddp: step %lld: %s\n", (long long)batches_done,
					loom_program_error(p));
				goto out;
			}
			for (int i = 0; i < count; i++) {
				int arg = 0;
				for (int k = 1; k < 10; k++)
					if (out[i * 10 + k] > out[i * 10 + arg])
						arg = k;
				correct += arg == lab[i];
			}
			seen += count;
			lsum += loom_loss(p);
			since++;
			batches_done++;
			if (batches_done % a.log_interval == 0) {
				double t = now();
				loom_program_info_get(p, &info);
				printf("epoch %d step %5lld/%lld  loss %.4f  train acc %5.2f%%  %7.0f img/s  "
				       "lr %g  loss scale %g  skipped %lld\n",
				       epoch + 1, (long long)(b + 1), (long long)per_epoch, lsum / since,
				       100.0 * correct / seen, since * a.batch / (t - tlog), lr,
				       info.loss_scale, (long long)info.skipped_steps);
				if (info.amp_report && info.amp_report[0])
					printf("amp: first non-finite value from %s\n", info.amp_report);
				fflush(stdout);
				tlog = t;
				lsum = 0;
				since = 0;
			}
			if (a.save_every && batches_done % a.save_every == 0 && b + 1 < per_epoch) {
				if (loom_save(p, a.checkpoint) != LOOM_OK) {
					fprintf(stderr, "mnist_ddp: %s\n", loom_program_error(p));
					goto out;
				}
				printf("saved %s (step %lld)\n", a.checkpoint, (long long)batches_done);
			}
			if (a.max_steps && batches_done >= a.max_steps) {
				stop = 1;
				break;
			}
		}
		double train_s_el = now() - t0;
		double acc, tloss;
		if (evaluate(p, test_l, logits, a.batch, img, lab, out, &acc, &tloss) != LOOM_OK) {
			fprintf(stderr, "mnist_ddp: evaluation: %s\n", loom_program_error(p));
			goto out;
		}
		loom_program_info_get(p, &info);
		printf("epoch %d done: test loss %.4f, test accuracy %.2f%%, train %.1f s "
		       "(%.0f img/s), loss scale %g, skipped steps %lld\n",
		       epoch + 1, tloss, 100 * acc, train_s_el,
		       seen * 1.0 / (train_s_el > 0 ? train_s_el : 1), info.loss_scale,
		       (long long)info.skipped_steps);
		if (a.checkpoint) {
			if (loom_save(p, a.checkpoint) != LOOM_OK) {
				fprintf(stderr, "mnist_ddp: %s\n", loom_program_error(p));
				goto out;
			}
			printf("saved %s (step %lld)\n", a.checkpoint, (long long)loom_step_count(p));
		}
		fflush(stdout);
		if (stop)
			break;
	}
	rc = 0;
out:
	free(img);
	free(out);
	free(lab);
	loom_program_free(p);
	loom_graph_free(g);
	loom_loader_free(train_l);
	loom_loader_free(test_l);
	loom_sampler_free(train_s);
	loom_sampler_free(test_s);
	loom_dataset_free(&train);
	loom_dataset_free(&test);
	return rc;
}
