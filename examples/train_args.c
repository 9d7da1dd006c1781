/*
 * examples/train_args.c — the command line of the training examples: where
 * each flag (a row of base/options.def, read by examples/flags.c) goes in
 * train_args and which programs take it, and the checks no single flag can
 * make, so that each main() only runs. The programs' defaults live here
 * too, so that the fuzz target drives them without linking the engine.
 */
#include "examples/train_args.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "loom_data.h"

/* What every program starts from; each overrides what differs. */
#define TRAIN_BASE_DEFAULTS                                                            \
	.epochs = 2, .batch = 100, .lr = 0.01, .momentum = 0.9, .lr_gamma = 0.1,        \
	.optim = LOOM_OPTIM_SGD, .device = LOOM_DEVICE_AUTO, .level = LOOM_O0,          \
	.half = LOOM_F16, .log_interval = 100, .keep_bn_fp32 = -1,        \
	.accumulate = 1, .trace_steps = 5, .init_strict = 1

const train_program train_mnist_ddp = {
	.name = "mnist_ddp",
	.bit = FLAG_PROG_MNIST_DDP,
	.about = "Trains a ConvNet (conv5x5-16 bn relu pool, conv5x5-32 bn relu pool, linear 1568->10)\n"
		 "on Fashion-MNIST with loom.",
	.groups = TRAIN_FLAGS_COMMON | TRAIN_FLAGS_FIT | TRAIN_FLAGS_DATA,
	.defaults = { TRAIN_BASE_DEFAULTS, .data = LOOM_FASHION_MNIST_DIR },
};

const train_program train_cifar_ddp = {
	.name = "cifar_ddp",
	.bit = FLAG_PROG_CIFAR_DDP,
	.about = "Trains a ResNet-18 or -34 (CIFAR stem: 3x3 conv, no max-pool) on CIFAR-10 with loom,\n"
		 "SGD with momentum and weight decay, random crop and flip, data parallel.",
	.groups = TRAIN_FLAGS_COMMON | TRAIN_FLAGS_FIT | TRAIN_FLAGS_DATA | TRAIN_FLAGS_RESNET |
		  TRAIN_FLAGS_CIFAR,
	.defaults = { TRAIN_BASE_DEFAULTS, .epochs = 30, .batch = 128, .lr = 0.1,
		      .weight_decay = 5e-4, .lr_step = 10, .log_interval = 20,
		      .data = "cifar-10-batches-bin", .depth = 18, .width = 64, .size = 32,
		      .augment = 1 },
};

const train_program train_resnet50_synthetic = {
	.name = "resnet50_synthetic",
	.bit = FLAG_PROG_RESNET50_SYNTHETIC,
	.about = "Measures ResNet training speed: one fixed random batch per rank (no loader),\n"
		 "ResNet-50 at 224x224 by default, images/s per rank and in total.",
	.groups = TRAIN_FLAGS_COMMON | TRAIN_FLAGS_RESNET | TRAIN_FLAGS_BENCH,
	.defaults = { TRAIN_BASE_DEFAULTS, .batch = 8, .lr = 0.1, .weight_decay = 1e-4,
		      .depth = 50, .width = 64, .size = 224, .steps = 10, .warmup = 2 },
};

const train_program train_gpt_ddp = {
	.name = "gpt_ddp",
	.bit = FLAG_PROG_GPT_DDP,
	.about = "Trains a GPT-2-style transformer (pre-norm blocks, GELU MLP, tied embeddings,\n"
		 "learned positions) on text, byte by byte, or on llm.c token files, with loom.",
	.groups = TRAIN_FLAGS_COMMON | TRAIN_FLAGS_FIT | TRAIN_FLAGS_DATA,
	.defaults = { TRAIN_BASE_DEFAULTS, .epochs = 1, .batch = 8, .lr = 1e-3,
		      .weight_decay = 0.1, .optim = LOOM_OPTIM_ADAMW, .log_interval = 10,
		      .data = "/usr/share/games/fortunes", .schedule = TRAIN_LR_COSINE,
		      .max_steps = 300, .clip_grad = 1.0, .decay_matrices_only = 1 },
};

const train_program train_classify = {
	.name = "classify",
	.about = "Runs a trained model on a test split: accuracy, top-k, confusion matrix, images/s.",
	.bit = FLAG_PROG_CLASSIFY,
	.defaults = { TRAIN_BASE_DEFAULTS, .width = 64 },
};

/* --precision: the half type, and fp8 on top of bf16. */
static int set_precision(void *base, const flag_parsed *v, char *msg, size_t msglen)
{
	train_args *a = base;

	(void)msg, (void)msglen;
	a->half = v->choice == 0 ? LOOM_F16 : LOOM_BF16;
	a->fp8 = v->choice == 2;
	return 0;
}

/* --loss-scale: 'dynamic' (0) or a fixed positive scale. */
static int set_loss_scale(void *base, const flag_parsed *v, char *msg, size_t msglen)
{
	train_args *a = base;
	char *end;

	if (!strcasecmp(v->s, "dynamic")) {
		a->loss_scale = 0;
		return 0;
	}
	errno = 0;
	double x = strtod(v->s, &end);
	if (errno || end == v->s || *end || !isfinite(x) || x <= 0) {
		flags_say(msg, msglen, "--loss-scale must be 'dynamic' or a positive number, got '%s'",
		    v->s);
		return -1;
	}
	a->loss_scale = x;
	return 0;
}

/* --zero-prefetch 0 is loom's -1 (loom's 0 is the default, 1). */
static int set_zero_prefetch(void *base, const flag_parsed *v, char *msg, size_t msglen)
{
	train_args *a = base;

	(void)msg, (void)msglen;
	a->zero_prefetch = v->i ? (int)v->i : -1;
	return 0;
}

/* Which training programs take a row: TRAIN_FLAGS_* as program bits. */
#define P_MNIST FLAG_PROG_MNIST_DDP
#define P_CIFAR FLAG_PROG_CIFAR_DDP
#define P_R50 FLAG_PROG_RESNET50_SYNTHETIC
#define P_GPT FLAG_PROG_GPT_DDP
#define P_ALL (P_MNIST | P_CIFAR | P_R50 | P_GPT) /* TRAIN_FLAGS_COMMON */
#define P_FIT (P_MNIST | P_CIFAR | P_GPT)         /* TRAIN_FLAGS_FIT, _DATA */
#define P_RESNET (P_CIFAR | P_R50)
#define P_CLS FLAG_PROG_CLASSIFY /* the flags classify shares */
#define AT(field) FLAG_AT(train_args, field)
#define VALUES(...) .values = (const int[]){ __VA_ARGS__ }

/* Where each training flag goes in train_args, and which programs take it. */
static const flag_place train_places[] = {
	{ FLAG_DATA, P_FIT | P_CLS, AT(data) },
	{ FLAG_SYNTHETIC, P_CIFAR, AT(synthetic) },
	{ FLAG_TRAIN_IMAGES, P_CIFAR, AT(train_images) },
	{ FLAG_TEST_IMAGES, P_CIFAR, AT(test_images) },
	{ FLAG_NO_AUGMENT, P_CIFAR, AT(augment), VALUES(0) },
	{ FLAG_DEPTH, P_RESNET, AT(depth), VALUES(18, 34, 50) },
	{ FLAG_WIDTH, P_RESNET | P_CLS, AT(width) },
	{ FLAG_SIZE, P_R50, AT(size) },
	{ FLAG_EPOCHS, P_FIT, AT(epochs) },
	{ FLAG_BATCH_SIZE, P_ALL | P_CLS, AT(batch) },
	{ FLAG_STEPS, P_R50, AT(steps) },
	{ FLAG_WARMUP, P_R50, AT(warmup) },
	{ FLAG_OPTIMIZER, P_FIT | P_CLS, AT(optim), VALUES(LOOM_OPTIM_SGD, LOOM_OPTIM_ADAMW) },
	{ FLAG_LR, P_FIT, AT(lr) },
	{ FLAG_MOMENTUM, P_FIT, AT(momentum) },
	{ FLAG_WEIGHT_DECAY, P_FIT, AT(weight_decay) },
	{ FLAG_CLIP_GRAD, P_FIT, AT(clip_grad) },
	{ FLAG_LR_SCHEDULE, P_CIFAR, AT(schedule), VALUES(TRAIN_LR_STEP, TRAIN_LR_COSINE) },
	{ FLAG_LR_STEP, P_FIT, AT(lr_step) },
	{ FLAG_LR_GAMMA, P_FIT, AT(lr_gamma) },
	{ FLAG_WARMUP_EPOCHS, P_CIFAR, AT(warmup_epochs) },
	{ FLAG_ACCUMULATE, P_FIT, AT(accumulate) },
	{ FLAG_OPT_LEVEL, P_ALL | P_CLS, AT(level), VALUES(LOOM_O0, LOOM_O1, LOOM_O2, LOOM_O3) },
	{ FLAG_PRECISION, P_ALL | P_CLS, .set = set_precision },
	{ FLAG_FP8_ALL_PRODUCTS, P_ALL, AT(fp8_all_products) },
	{ FLAG_FP8_SCALING, P_ALL, AT(fp8_scaling),
	  VALUES(LOOM_FP8_SCALING_CURRENT, LOOM_FP8_SCALING_DELAYED) },
	{ FLAG_FP8_HISTORY, P_ALL, AT(fp8_history) },
	{ FLAG_AMP_REPORT, P_ALL, AT(amp_report) },
	{ FLAG_LOSS_SCALE, P_ALL, .set = set_loss_scale },
	{ FLAG_KEEP_BATCHNORM_FP32, P_ALL, AT(keep_bn_fp32), VALUES(1, 0) },
	{ FLAG_BN_HALF, P_ALL, AT(bn_half) },
	{ FLAG_DEVICE, P_ALL | P_CLS, AT(device),
	  VALUES(LOOM_DEVICE_AUTO, LOOM_DEVICE_CPU, LOOM_DEVICE_CUDA) },
	{ FLAG_TF32, P_ALL, AT(no_tf32), VALUES(0, 1) },
	{ FLAG_NO_CUDA_GRAPH, P_ALL, AT(no_cuda_graph) },
	{ FLAG_DETERMINISTIC, P_ALL, AT(deterministic) },
	{ FLAG_KERNEL_SEARCH, P_ALL, AT(kernel_search),
	  VALUES(LOOM_KERNEL_SEARCH_OFF, LOOM_KERNEL_SEARCH_ON) },
	{ FLAG_RECOMPUTE, P_ALL, AT(recompute) },
	{ FLAG_SEED, P_ALL, AT(seed) },
	{ FLAG_THREADS, P_ALL | P_CLS, AT(threads) },
	{ FLAG_CHECKPOINT, P_FIT | P_CLS, AT(checkpoint) },
	{ FLAG_SAVE_EVERY, P_FIT, AT(save_every) },
	{ FLAG_RESUME, P_FIT, AT(resume) },
	{ FLAG_LOG_INTERVAL, P_FIT, AT(log_interval) },
	{ FLAG_MAX_STEPS, P_FIT, AT(max_steps) },
	{ FLAG_PEAK_FLOPS, P_R50 | P_GPT, AT(peak_flops) },
	{ FLAG_DUMP_GRAPH, P_ALL, AT(dump_graph) },
	{ FLAG_DUMP_PLAN, P_ALL, AT(dump_plan) },
	{ FLAG_MEMORY_REPORT, P_ALL, AT(memory_report) },
	{ FLAG_DRY_RUN, P_ALL, AT(dry_run) },
	{ FLAG_SYNC_BN, P_ALL, AT(sync_bn) },
	{ FLAG_ZERO, P_ALL, AT(zero) },
	{ FLAG_ZERO_PREFETCH, P_ALL, .set = set_zero_prefetch },
	{ FLAG_BUCKET_CAP_MB, P_ALL, AT(bucket_cap_mb) },
	{ FLAG_PIPELINE, P_ALL, AT(pipeline) },
	{ FLAG_MICRO_BATCHES, P_ALL, AT(micro_batches) },
	{ FLAG_SCHEDULE, P_ALL, AT(pipe_schedule), VALUES(LOOM_SCHEDULE_1F1B, LOOM_SCHEDULE_GPIPE) },
	{ FLAG_PIPELINE_BALANCE, P_ALL, AT(pipe_balance),
	  VALUES(LOOM_BALANCE_TIME, LOOM_BALANCE_MEMORY) },
	{ FLAG_MEMORY_LIMIT, P_ALL, AT(memory_limit) },
	{ FLAG_TRACE, P_ALL, AT(trace) },
	{ FLAG_TRACE_STEPS, P_ALL, AT(trace_steps) },
	{ FLAG_INIT_FROM, P_ALL, AT(init_from) },
	{ FLAG_REINIT, P_ALL, AT(reinit) },
	{ FLAG_INIT_STRICT, P_ALL | P_CLS, AT(init_strict), VALUES(1, 0) },
	{ FLAG_EXPORT, P_ALL, AT(export_path) },
	{ FLAG_METRICS, P_ALL, AT(metrics) },
	/* comm/launch.c takes these two out of argv before the parser runs */
	{ FLAG_NPROC, P_ALL },
	{ FLAG_MAX_RESTARTS, P_ALL },
	{ FLAG_HELP, P_ALL | P_CLS },
};

#define N_PLACES (sizeof(train_places) / sizeof(train_places[0]))

flag_target train_target(train_args *a)
{
	return (flag_target){ train_places, N_PLACES, a, NULL };
}

/* train_args and, when the program has one, its own struct (gpt_ddp). */
static size_t targets(const flag_target *own, train_args *a, flag_target *t)
{
	t[0] = train_target(a);
	if (own)
		t[1] = *own;
	return own ? 2 : 1;
}

void train_usage(const train_program *prog, const flag_target *own, FILE *f)
{
	train_args d = prog->defaults;
	flag_target t[2];
	size_t nt = targets(own, &d, t);

	fprintf(f, "usage: %s [options]\n%s\n\n", prog->name, prog->about);
	flags_usage(prog->bit, t, nt, f);
}

const char *train_flag_name(size_t i)
{
	return i < N_PLACES ? flag_rows[train_places[i].row].flag + 2 : NULL;
}

int train_set_value(const train_program *prog, const char *name, const char *arg, train_args *a,
		    char *msg, size_t msglen)
{
	flag_target t[1];
	size_t nt = targets(NULL, a, t);

	/* any flag train_args holds, whichever program takes it (as before) */
	(void)prog;
	if (flags_row(~0u, t, nt, name) < 0) {
		flags_say(msg, msglen, "--%s is not a training flag", name);
		return -1;
	}
	return flags_set(~0u, t, nt, name, arg, msg, msglen);
}

/* What no single flag can check: flags that need or exclude others. */
static int check_together(const train_program *prog, const train_args *a, char *msg,
			  size_t msglen)
{
	if (a->depth == 50 && !(prog->bit & P_R50)) {
		flags_say(msg, msglen, "--depth must be 18 or 34, got '50'");
		return -1;
	}
	if ((a->resume || a->save_every) && !a->checkpoint) {
		flags_say(msg, msglen, "--resume and --save-every need --checkpoint PATH");
		return -1;
	}
	if (a->save_every % a->accumulate) {
		flags_say(msg, msglen, "--save-every %d must be a multiple of --accumulate %d (a checkpoint "
		    "holds no half-accumulated step)", a->save_every, a->accumulate);
		return -1;
	}
	if (a->pipeline > 1) {
		int m = a->micro_batches ? a->micro_batches : a->pipeline;
		if (a->batch % m) {
			flags_say(msg, msglen, "--batch-size %d is not a multiple of the %d micro-batches of "
			    "--pipeline", a->batch, m);
			return -1;
		}
		if (a->accumulate > 1 || a->zero || a->sync_bn || a->export_path) {
			flags_say(msg, msglen, "--pipeline: not with %s (it accumulates over "
			    "--micro-batches already)", a->accumulate > 1 ? "--accumulate" :
			    a->zero ? "--zero" : a->sync_bn ? "--sync-bn" : "--export yet");
			return -1;
		}
	} else if (a->micro_batches || a->pipe_schedule || a->pipe_balance) {
		flags_say(msg, msglen, "--micro-batches, --schedule and --pipeline-balance apply to "
		    "--pipeline N (N > 1)");
		return -1;
	}
	if (a->fp8_all_products && !a->fp8) {
		flags_say(msg, msglen, "--fp8-all-products applies to --precision fp8");
		return -1;
	}
	if ((a->fp8_scaling || a->fp8_history) && !a->fp8) {
		flags_say(msg, msglen, "--fp8-scaling and --fp8-history apply to --precision fp8");
		return TRAIN_BAD;
	}
	if (a->fp8_history && a->fp8_scaling == LOOM_FP8_SCALING_CURRENT) {
		flags_say(msg, msglen, "--fp8-history applies to --fp8-scaling delayed");
		return TRAIN_BAD;
	}
	if (a->reinit && !a->init_from) {
		flags_say(msg, msglen, "--reinit applies to --init-from FILE");
		return -1;
	}
	if (a->schedule != TRAIN_LR_COSINE && a->warmup_epochs > 0) {
		flags_say(msg, msglen, "--warmup-epochs applies to --lr-schedule cosine");
		return -1;
	}
	if (a->warmup_epochs >= a->epochs && a->warmup_epochs > 0) {
		flags_say(msg, msglen, "--warmup-epochs %g leaves no epoch of the %d to decay over",
		    a->warmup_epochs, a->epochs);
		return -1;
	}
	return 0;
}

train_parse train_parse_with(const train_program *prog, const flag_target *own, int argc,
			     char **argv, train_args *a, char *msg, size_t msglen)
{
	flag_target t[2];
	size_t nt = targets(own, a, t);

	*a = prog->defaults;
	switch (flags_parse(prog->bit, t, nt, argc, argv, msg, msglen)) {
	case FLAGS_RUN: break;
	case FLAGS_HELP: return TRAIN_HELP;
	default: return TRAIN_BAD;
	}
	return check_together(prog, a, msg, msglen) ? TRAIN_BAD : TRAIN_RUN;
}

train_parse train_parse_args(const train_program *prog, int argc, char **argv, train_args *a,
			     char *msg, size_t msglen)
{
	return train_parse_with(prog, NULL, argc, argv, a, msg, msglen);
}
