/*
 * examples/train_args.c — the command line of the training examples: every
 * flag, its group, its default and its range, checked here so that each
 * main() only runs. The programs' defaults live here too, so that the fuzz
 * target drives all three without linking the engine.
 */
#include "examples/train_args.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "loom_data.h"

/* What every program starts from; each overrides what differs. */
#define TRAIN_BASE_DEFAULTS                                                            \
	.epochs = 2, .batch = 100, .lr = 0.01, .momentum = 0.9, .lr_gamma = 0.1,        \
	.optim = LOOM_OPTIM_SGD, .device = LOOM_DEVICE_AUTO, .level = LOOM_O0,          \
	.half = LOOM_F16, .log_interval = 100, .keep_bn_fp32 = -1,        \
	.accumulate = 1, .trace_steps = 5, .init_strict = 1

const train_program train_mnist_ddp = {
	.name = "mnist_ddp",
	.about = "Trains a ConvNet (conv5x5-16 bn relu pool, conv5x5-32 bn relu pool, linear 1568->10)\n"
		 "on Fashion-MNIST with loom.",
	.groups = TRAIN_FLAGS_COMMON | TRAIN_FLAGS_FIT | TRAIN_FLAGS_DATA,
	.defaults = { TRAIN_BASE_DEFAULTS, .data = LOOM_FASHION_MNIST_DIR },
};

const train_program train_cifar_ddp = {
	.name = "cifar_ddp",
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
	.about = "Measures ResNet training speed: one fixed random batch per rank (no loader),\n"
		 "ResNet-50 at 224x224 by default, images/s per rank and in total.",
	.groups = TRAIN_FLAGS_COMMON | TRAIN_FLAGS_RESNET | TRAIN_FLAGS_BENCH,
	.defaults = { TRAIN_BASE_DEFAULTS, .batch = 8, .lr = 0.1, .weight_decay = 1e-4,
		      .depth = 50, .width = 64, .size = 224, .steps = 10, .warmup = 2 },
};

const train_program train_gpt_ddp = {
	.name = "gpt_ddp",
	.about = "Trains a GPT-2-style transformer (pre-norm blocks, GELU MLP, tied embeddings,\n"
		 "learned positions) on text, byte by byte, or on llm.c token files, with loom.",
	.groups = TRAIN_FLAGS_COMMON | TRAIN_FLAGS_FIT | TRAIN_FLAGS_DATA,
	.defaults = { TRAIN_BASE_DEFAULTS, .epochs = 1, .batch = 8, .lr = 1e-3,
		      .weight_decay = 0.1, .optim = LOOM_OPTIM_ADAMW, .log_interval = 10,
		      .data = "/usr/share/games/fortunes", .schedule = TRAIN_LR_COSINE,
		      .max_steps = 300, .clip_grad = 1.0, .decay_matrices_only = 1 },
	.data_help = "a text file or a folder of them, read byte by byte\n"
		     "                       (Debian package fortunes for the default)",
};

static void say(char *msg, size_t msglen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void say(char *msg, size_t msglen, const char *fmt, ...)
{
	va_list ap;

	if (!msg || !msglen)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, msglen, fmt, ap);
	va_end(ap);
}

void train_usage(const train_program *prog, FILE *f)
{
	const train_args *d = &prog->defaults;
	unsigned g = prog->groups;

	fprintf(f, "usage: %s [options]\n%s\n\n", prog->name, prog->about);
	if ((g & TRAIN_FLAGS_DATA) && prog->data_help)
		fprintf(f, "  --data PATH          %s (default %s)\n", prog->data_help, d->data);
	else if (g & TRAIN_FLAGS_DATA)
		fprintf(f, "  --data DIR           %s (default %s)\n",
			g & TRAIN_FLAGS_CIFAR ? "CIFAR-10 binary version: data_batch_1.bin ..\n"
						"                       data_batch_5.bin, test_batch.bin" :
						"MNIST-format directory", d->data);
	if (g & TRAIN_FLAGS_CIFAR)
		fprintf(f,
			"  --synthetic          train on generated images of CIFAR-10's shape instead\n"
			"  --train-images N     use only the first N training images (default all)\n"
			"  --test-images N      use only the first N test images (default all)\n"
			"  --no-augment         no random crop (pad 4) and flip\n");
	if (g & TRAIN_FLAGS_RESNET)
		fprintf(f,
			"  --depth N            ResNet depth, %s (default %d)\n"
			"  --width N            channels of the first stage (default %d, as published;\n"
			"                       smaller for smoke tests)\n",
			g & TRAIN_FLAGS_BENCH ? "18, 34 or 50" : "18 or 34", d->depth, d->width);
	if (g & TRAIN_FLAGS_BENCH)
		fprintf(f,
			"  --size N             image side (default %d; 64 or less: the CIFAR stem)\n"
			"  --steps N            timed training steps (default %d)\n"
			"  --warmup N           untimed steps before them (default %d)\n"
			"  --peak-flops X       FLOP/s for MFU (default: measured with a loom matmul)\n",
			d->size, d->steps, d->warmup);
	if (g & TRAIN_FLAGS_FIT)
		fprintf(f, "  --epochs N           epochs to train (default %d)\n", d->epochs);
	fprintf(f, "  --batch-size N       %s per step and rank (default %d)\n",
		prog->data_help ? "sequences" : "images", d->batch);
	if (g & TRAIN_FLAGS_FIT) {
		fprintf(f,
			"  --optimizer NAME     sgd or adamw (default %s)\n"
			"  --lr X               learning rate (default %g)\n"
			"  --momentum X         SGD momentum (default %g)\n"
			"  --weight-decay X     weight decay (default %g%s)\n"
			"  --clip-grad X        clip the gradients' global norm to X (default %g; 0: off)\n"
			"  --lr-step N          multiply the lr by --lr-gamma every N epochs (default %s%.0d;\n"
			"                       0: constant)\n"
			"  --lr-gamma X         step decay factor (default %g)\n"
			"  --accumulate N       N micro-batches per optimizer step, gradients all-reduced\n"
			"                       once on the last (DDP's no_sync; default 1)\n",
			d->optim == LOOM_OPTIM_ADAMW ? "adamw" : "sgd", d->lr, d->momentum,
			d->weight_decay, d->decay_matrices_only ? ", on matrices only" : "",
			d->clip_grad, d->lr_step ? "" : "off", d->lr_step,
			d->lr_gamma);
	}
	if (g & TRAIN_FLAGS_CIFAR)
		fprintf(f,
			"  --lr-schedule S      step (--lr-step, --lr-gamma) or cosine (default step)\n"
			"  --warmup-epochs K    cosine: raise the lr linearly over K epochs first (default 0)\n");
	fprintf(f,
		"  --opt-level O0..O3   apex mixed-precision level (default O0)\n"
		"  --precision P        fp16, bf16 or fp8, the half type of O1..O3 (default fp16);\n"
		"                       fp8: bf16, with every product (linear, matmul, conv) but\n"
		"                       the first and last (the classifier) on E4M3 inputs and\n"
		"                       E5M2 output gradients at O1 and O2 (per-tensor scales\n"
		"                       from each tensor's amax; emulated on the CPU)\n"
		"  --fp8-all-products   --precision fp8: the first and last products in fp8 too\n"
		"  --fp8-scaling S      --precision fp8: current (each cast from its tensor's own\n"
		"                       amax) or delayed (from an amax history; the default)\n"
		"  --fp8-history N      --fp8-scaling delayed: steps of amax history (default 16)\n"
		"  --amp-report         at each log line: the loss scale and, under fp8, each\n"
		"                       scaled tensor's scale, amax and saturated values\n"
		"  --loss-scale S       'dynamic' (default for O1/O2 fp16) or a fixed number\n"
		"  --keep-batchnorm-fp32 B  true or false: override the level's batch-norm precision (O2, O3)\n"
		"  --device D           auto, cpu or cuda (default auto: cuda if present)\n"
		"  --tf32 B             on (default) or off: fp32 convolutions and products on a\n"
		"                       GPU through TF32 tensor cores, as PyTorch's cuDNN does\n"
		"  --no-cuda-graph      run every training step eagerly on a GPU (default: the\n"
		"                       second step captured as one CUDA graph, later ones replayed)\n"
		"  --deterministic      repeatable bits on a GPU: only cuDNN's deterministic\n"
		"                       convolution algorithms (default: the fastest usable)\n"
		"  --seed N             initialisation%s seed (default 0)\n"
		"  --threads N          CPU kernel threads (default: one per core)\n",
		g & TRAIN_FLAGS_CIFAR ? ", shuffling and augmentation" :
		g & TRAIN_FLAGS_FIT ? " and shuffling" : " and batch");
	if (g & TRAIN_FLAGS_FIT)
		fprintf(f,
			"  --checkpoint PATH    save here after every epoch (atomic write)\n"
			"  --save-every N       also save every N steps (resume continues mid-epoch)\n"
			"  --resume             continue from --checkpoint\n"
			"  --log-interval N     steps between progress lines (default %d)\n"
			"  --max-steps N        stop after N training steps (default %s%.0lld; 0: none)\n",
			d->log_interval, d->max_steps ? "" : "none", (long long)d->max_steps);
	fprintf(f,
		"  --dump-plan FILE     write the compiled plan as Graphviz (dot -Tsvg FILE; sfdp for a\n"
		"                       ResNet-sized plan, which dot takes minutes to lay out)\n"
		"  --memory-report      print where the plan's memory goes, before step 1\n"
		"  --dump-graph         print the compiled plan: each node's dtype (AMP casts included)\n"
		"                       and its place in the arena\n"
		"  --kernel-search M    on: time each conv's and product's candidate kernels on\n"
		"                       its shape when the plan is made and keep the fastest\n"
		"                       (--dump-graph shows them); off (default): a fixed kernel\n"
		"                       per shape, runs repeat bit for bit\n"
		"  --recompute N        make activations again in the backward instead of keeping\n"
		"                       them (less memory, a little more compute; the same\n"
		"                       results): 0 none (default), 1 GELU and SiLU, 2 also\n"
		"                       the norms (llm.c's -r), 3 also attention's T x T\n"
		"                       probabilities where attention is not one fused kernel\n"
		"  --dry-run            compile, print the above, and stop before step 1\n"
		"  --sync-bn            synchronised batch norm: statistics over the global batch\n"
		"                       (all ranks), as torch's SyncBatchNorm\n"
		"  --zero N             ZeRO stage 0 to 3 (data parallel; default 0): with 1,\n"
		"                       each rank keeps the optimizer state (and O2 masters) of\n"
		"                       its shard only; 2 also its shard of the gradients; 3 also\n"
		"                       its shard of the parameters, each bucket's gathered before\n"
		"                       its forward and its backward (--bucket-cap-mb: how much)\n"
		"  --zero-prefetch N    ZeRO-3: gathers issued N ahead of their use (default 1;\n"
		"                       0: each right before its use)\n"
		"  --bucket-cap-mb MB   data parallel: gradient buckets of about MB MiB each (the\n"
		"                       first one at most 1 MiB; default 25, as torch's DDP)\n"
		"  --trace FILE.json    Chrome/Perfetto trace of --trace-steps steps after the first\n"
		"                       (one track per rank; open in ui.perfetto.dev)\n"
		"  --trace-steps N      steps the trace records (default %d)\n"
		"  --init-from FILE     start from these weights (safetensors, PyTorch's state_dict\n"
		"                       names), after initialisation and before step 1\n"
		"  --reinit NAMES       with --init-from: leave these (comma-separated prefixes,\n"
		"                       e.g. fc) as initialised: a classifier of another size\n"
		"  --init-strict B      true (default) or false: a name in one but not the other\n"
		"                       is an error, or is left alone (load_state_dict's strict)\n"
		"  --export FILE        write the weights after training (safetensors, PyTorch's\n"
		"                       names: safetensors.torch.load_file(FILE))\n"
		"  --metrics FILE       one JSON object per line per logged step and per epoch\n"
		"                       (tools/plot_metrics draws them)\n"
		"  --pipeline S         cut the model into S pipeline stages (rank r runs stage\n"
		"                       r %% S; the world / S ranks of a stage are data parallel)\n"
		"  --micro-batches M    micro-batches per batch under --pipeline (default S):\n"
		"                       --batch-size is M micro-batches of batch-size / M\n"
		"  --schedule S         1f1b (default) or gpipe\n"
		"  --pipeline-balance B time (default) or memory: cut the stages to equal\n"
		"                       estimated time, or to the smallest largest planned peak\n"
		"                       per stage (parameters, gradients, optimizer state and\n"
		"                       the activations the schedule keeps in flight there)\n"
		"  --memory-limit MiB   refuse a plan whose planned peak per rank is larger;\n"
		"                       under --pipeline, a time-balanced cut over it is\n"
		"                       replaced by the memory-balanced cut first\n"
		"  --nproc N            start N ranks on this host (data parallel; also under\n"
		"                       mpirun, or with torchrun's RANK/WORLD_SIZE/MASTER_ADDR/PORT)\n"
		"  --max-restarts K     with --nproc: restart all ranks up to K times after a failure\n"
		"  --help               this text\n",
		d->trace_steps);
}

static int parse_double(const char *flag, const char *s, double *out, char *msg, size_t msglen)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v)) {
		say(msg, msglen, "%s expects a number, got '%s'", flag, s);
		return -1;
	}
	*out = v;
	return 0;
}

static int parse_int(const char *flag, const char *s, long lo, long hi, long *out, char *msg,
		     size_t msglen)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi) {
		say(msg, msglen, "%s expects an integer in [%ld, %ld], got '%s'", flag, lo, hi, s);
		return -1;
	}
	*out = v;
	return 0;
}

enum {
	O_DATA = 256, O_EPOCHS, O_BATCH, O_OPTIM, O_LR, O_MOM, O_WD, O_LRSTEP, O_LRGAMMA,
	O_LEVEL, O_PREC, O_SCALE, O_DEVICE, O_TF32, O_SEED, O_CKPT, O_RESUME, O_LOG, O_MAX, O_DUMP,
	O_KEEPBN, O_SAVE_EVERY, O_THREADS, O_DUMP_PLAN, O_MEMREP, O_DRY, O_HELP, O_DEPTH,
	O_WIDTH, O_SIZE, O_SYNTH, O_NTRAIN, O_NTEST, O_NOAUG, O_SCHED, O_WARMUP_EP, O_STEPS,
	O_WARMUP, O_SYNCBN, O_ACCUM, O_TRACE, O_TRACE_STEPS, O_EXPORT, O_INIT_FROM, O_REINIT,
	O_INIT_STRICT, O_METRICS, O_ZERO, O_PIPE, O_MICRO, O_PSCHED, O_MEMLIM, O_CLIP,
	O_PBAL, O_KSEARCH, O_BUCKET, O_NOGRAPH, O_ZPREF, O_DETERM, O_PEAK, O_RECOMP, O_FP8ALL,
	O_FP8SCALE, O_FP8HIST, O_AMPREP,
};

/* Every flag and the group that brings it. */
static const struct {
	unsigned group;
	struct option o;
} table[] = {
	{ TRAIN_FLAGS_DATA, { "data", required_argument, 0, O_DATA } },
	{ TRAIN_FLAGS_FIT, { "epochs", required_argument, 0, O_EPOCHS } },
	{ TRAIN_FLAGS_COMMON, { "batch-size", required_argument, 0, O_BATCH } },
	{ TRAIN_FLAGS_FIT, { "optimizer", required_argument, 0, O_OPTIM } },
	{ TRAIN_FLAGS_FIT, { "lr", required_argument, 0, O_LR } },
	{ TRAIN_FLAGS_FIT, { "momentum", required_argument, 0, O_MOM } },
	{ TRAIN_FLAGS_FIT, { "weight-decay", required_argument, 0, O_WD } },
	{ TRAIN_FLAGS_FIT, { "clip-grad", required_argument, 0, O_CLIP } },
	{ TRAIN_FLAGS_FIT, { "lr-step", required_argument, 0, O_LRSTEP } },
	{ TRAIN_FLAGS_FIT, { "lr-gamma", required_argument, 0, O_LRGAMMA } },
	{ TRAIN_FLAGS_COMMON, { "opt-level", required_argument, 0, O_LEVEL } },
	{ TRAIN_FLAGS_COMMON, { "precision", required_argument, 0, O_PREC } },
	{ TRAIN_FLAGS_COMMON, { "fp8-all-products", no_argument, 0, O_FP8ALL } },
	{ TRAIN_FLAGS_COMMON, { "fp8-scaling", required_argument, 0, O_FP8SCALE } },
	{ TRAIN_FLAGS_COMMON, { "fp8-history", required_argument, 0, O_FP8HIST } },
	{ TRAIN_FLAGS_COMMON, { "amp-report", no_argument, 0, O_AMPREP } },
	{ TRAIN_FLAGS_COMMON, { "loss-scale", required_argument, 0, O_SCALE } },
	{ TRAIN_FLAGS_COMMON, { "device", required_argument, 0, O_DEVICE } },
	{ TRAIN_FLAGS_COMMON, { "tf32", required_argument, 0, O_TF32 } },
	{ TRAIN_FLAGS_COMMON, { "no-cuda-graph", no_argument, 0, O_NOGRAPH } },
	{ TRAIN_FLAGS_COMMON, { "deterministic", no_argument, 0, O_DETERM } },
	{ TRAIN_FLAGS_COMMON, { "seed", required_argument, 0, O_SEED } },
	{ TRAIN_FLAGS_FIT, { "checkpoint", required_argument, 0, O_CKPT } },
	{ TRAIN_FLAGS_FIT, { "resume", no_argument, 0, O_RESUME } },
	{ TRAIN_FLAGS_FIT, { "save-every", required_argument, 0, O_SAVE_EVERY } },
	{ TRAIN_FLAGS_FIT, { "log-interval", required_argument, 0, O_LOG } },
	{ TRAIN_FLAGS_FIT, { "max-steps", required_argument, 0, O_MAX } },
	{ TRAIN_FLAGS_COMMON, { "dump-graph", no_argument, 0, O_DUMP } },
	{ TRAIN_FLAGS_COMMON, { "kernel-search", required_argument, 0, O_KSEARCH } },
	{ TRAIN_FLAGS_COMMON, { "recompute", required_argument, 0, O_RECOMP } },
	{ TRAIN_FLAGS_COMMON, { "dump-plan", required_argument, 0, O_DUMP_PLAN } },
	{ TRAIN_FLAGS_COMMON, { "memory-report", no_argument, 0, O_MEMREP } },
	{ TRAIN_FLAGS_COMMON, { "dry-run", no_argument, 0, O_DRY } },
	{ TRAIN_FLAGS_COMMON, { "threads", required_argument, 0, O_THREADS } },
	{ TRAIN_FLAGS_COMMON, { "keep-batchnorm-fp32", required_argument, 0, O_KEEPBN } },
	{ TRAIN_FLAGS_RESNET, { "depth", required_argument, 0, O_DEPTH } },
	{ TRAIN_FLAGS_RESNET, { "width", required_argument, 0, O_WIDTH } },
	{ TRAIN_FLAGS_BENCH, { "size", required_argument, 0, O_SIZE } },
	{ TRAIN_FLAGS_BENCH, { "steps", required_argument, 0, O_STEPS } },
	{ TRAIN_FLAGS_BENCH, { "warmup", required_argument, 0, O_WARMUP } },
	{ TRAIN_FLAGS_BENCH, { "peak-flops", required_argument, 0, O_PEAK } },
	{ TRAIN_FLAGS_CIFAR, { "synthetic", no_argument, 0, O_SYNTH } },
	{ TRAIN_FLAGS_CIFAR, { "train-images", required_argument, 0, O_NTRAIN } },
	{ TRAIN_FLAGS_CIFAR, { "test-images", required_argument, 0, O_NTEST } },
	{ TRAIN_FLAGS_CIFAR, { "no-augment", no_argument, 0, O_NOAUG } },
	{ TRAIN_FLAGS_CIFAR, { "lr-schedule", required_argument, 0, O_SCHED } },
	{ TRAIN_FLAGS_CIFAR, { "warmup-epochs", required_argument, 0, O_WARMUP_EP } },
	{ TRAIN_FLAGS_COMMON, { "sync-bn", no_argument, 0, O_SYNCBN } },
	{ TRAIN_FLAGS_COMMON, { "zero", required_argument, 0, O_ZERO } },
	{ TRAIN_FLAGS_COMMON, { "bucket-cap-mb", required_argument, 0, O_BUCKET } },
	{ TRAIN_FLAGS_COMMON, { "zero-prefetch", required_argument, 0, O_ZPREF } },
	{ TRAIN_FLAGS_COMMON, { "pipeline", required_argument, 0, O_PIPE } },
	{ TRAIN_FLAGS_COMMON, { "micro-batches", required_argument, 0, O_MICRO } },
	{ TRAIN_FLAGS_COMMON, { "schedule", required_argument, 0, O_PSCHED } },
	{ TRAIN_FLAGS_COMMON, { "pipeline-balance", required_argument, 0, O_PBAL } },
	{ TRAIN_FLAGS_COMMON, { "memory-limit", required_argument, 0, O_MEMLIM } },
	{ TRAIN_FLAGS_FIT, { "accumulate", required_argument, 0, O_ACCUM } },
	{ TRAIN_FLAGS_COMMON, { "trace", required_argument, 0, O_TRACE } },
	{ TRAIN_FLAGS_COMMON, { "trace-steps", required_argument, 0, O_TRACE_STEPS } },
	{ TRAIN_FLAGS_COMMON, { "export", required_argument, 0, O_EXPORT } },
	{ TRAIN_FLAGS_COMMON, { "init-from", required_argument, 0, O_INIT_FROM } },
	{ TRAIN_FLAGS_COMMON, { "reinit", required_argument, 0, O_REINIT } },
	{ TRAIN_FLAGS_COMMON, { "init-strict", required_argument, 0, O_INIT_STRICT } },
	{ TRAIN_FLAGS_COMMON, { "metrics", required_argument, 0, O_METRICS } },
	{ TRAIN_FLAGS_COMMON, { "help", no_argument, 0, O_HELP } },
};

#define N_FLAGS (sizeof(table) / sizeof(table[0]))

/* One flag's value into *a; -1 with msg set when it is out of range. */
static int set_flag(const train_program *prog, int c, const char *arg, train_args *a,
		    char *msg, size_t msglen)
{
	long l;
	switch (c) {
	case O_DATA: a->data = arg; break;
	case O_EPOCHS:
		if (parse_int("--epochs", arg, 1, 100000, &l, msg, msglen)) return -1;
		a->epochs = (int)l;
		break;
	case O_BATCH:
		if (parse_int("--batch-size", arg, 1, 1 << 20, &l, msg, msglen)) return -1;
		a->batch = (int)l;
		break;
	case O_OPTIM:
		if (!strcmp(arg, "sgd")) a->optim = LOOM_OPTIM_SGD;
		else if (!strcmp(arg, "adamw")) a->optim = LOOM_OPTIM_ADAMW;
		else {
			say(msg, msglen, "--optimizer must be sgd or adamw, got '%s'", arg);
			return -1;
		}
		break;
	case O_LR: return parse_double("--lr", arg, &a->lr, msg, msglen);
	case O_MOM: return parse_double("--momentum", arg, &a->momentum, msg, msglen);
	case O_WD: return parse_double("--weight-decay", arg, &a->weight_decay, msg, msglen);
	case O_CLIP:
		if (parse_double("--clip-grad", arg, &a->clip_grad, msg, msglen)) return -1;
		if (a->clip_grad < 0) {
			say(msg, msglen, "--clip-grad must be >= 0 (0: off), got '%s'", arg);
			return -1;
		}
		return 0;
	case O_LRSTEP:
		if (parse_int("--lr-step", arg, 0, 100000, &l, msg, msglen)) return -1;
		a->lr_step = (int)l;
		break;
	case O_LRGAMMA: return parse_double("--lr-gamma", arg, &a->lr_gamma, msg, msglen);
	case O_LEVEL:
		if (strlen(arg) == 2 && (arg[0] == 'O' || arg[0] == 'o') && arg[1] >= '0' &&
		    arg[1] <= '3')
			a->level = (loom_opt_level)(arg[1] - '0');
		else {
			say(msg, msglen, "--opt-level must be O0, O1, O2 or O3, got '%s'", arg);
			return -1;
		}
		break;
	case O_PREC:
		if (!strcmp(arg, "fp16")) a->half = LOOM_F16, a->fp8 = 0;
		else if (!strcmp(arg, "bf16")) a->half = LOOM_BF16, a->fp8 = 0;
		else if (!strcmp(arg, "fp8")) a->half = LOOM_BF16, a->fp8 = 1;
		else {
			say(msg, msglen, "--precision must be fp16, bf16 or fp8, got '%s'", arg);
			return -1;
		}
		break;
	case O_FP8ALL: a->fp8_all_products = 1; break;
	case O_FP8SCALE:
		if (!strcmp(arg, "current")) a->fp8_scaling = LOOM_FP8_SCALING_CURRENT;
		else if (!strcmp(arg, "delayed")) a->fp8_scaling = LOOM_FP8_SCALING_DELAYED;
		else {
			say(msg, msglen, "--fp8-scaling must be current or delayed, got '%s'", arg);
			return -1;
		}
		break;
	case O_FP8HIST:
		if (parse_int("--fp8-history", arg, 1, 1024, &l, msg, msglen)) return -1;
		a->fp8_history = (int)l;
		break;
	case O_AMPREP: a->amp_report = 1; break;
	case O_SCALE:
		if (!strcmp(arg, "dynamic"))
			a->loss_scale = 0;
		else if (parse_double("--loss-scale", arg, &a->loss_scale, msg, msglen) ||
			 a->loss_scale <= 0) {
			say(msg, msglen, "--loss-scale must be 'dynamic' or a positive number, got '%s'",
			    arg);
			return -1;
		}
		break;
	case O_DEVICE:
		if (!strcmp(arg, "auto")) a->device = LOOM_DEVICE_AUTO;
		else if (!strcmp(arg, "cpu")) a->device = LOOM_DEVICE_CPU;
		else if (!strcmp(arg, "cuda")) a->device = LOOM_DEVICE_CUDA;
		else {
			say(msg, msglen, "--device must be auto, cpu or cuda, got '%s'", arg);
			return -1;
		}
		break;
	case O_NOGRAPH:
		a->no_cuda_graph = 1;
		break;
	case O_DETERM:
		a->deterministic = 1;
		break;
	case O_TF32:
		if (!strcmp(arg, "on")) a->no_tf32 = 0;
		else if (!strcmp(arg, "off")) a->no_tf32 = 1;
		else {
			say(msg, msglen, "--tf32 must be on or off, got '%s'", arg);
			return -1;
		}
		break;
	case O_SEED:
		if (parse_int("--seed", arg, 0, 0x7fffffffL, &l, msg, msglen)) return -1;
		a->seed = (uint64_t)l;
		break;
	case O_CKPT: a->checkpoint = arg; break;
	case O_RESUME: a->resume = 1; break;
	case O_SAVE_EVERY:
		if (parse_int("--save-every", arg, 1, 1 << 30, &l, msg, msglen)) return -1;
		a->save_every = (int)l;
		break;
	case O_LOG:
		if (parse_int("--log-interval", arg, 1, 1 << 30, &l, msg, msglen)) return -1;
		a->log_interval = (int)l;
		break;
	case O_MAX:
		/* 0: no limit (gpt_ddp's default is 300) */
		if (parse_int("--max-steps", arg, 0, 0x7fffffffL, &l, msg, msglen)) return -1;
		a->max_steps = l;
		break;
	case O_DUMP: a->dump_graph = 1; break;
	case O_DUMP_PLAN: a->dump_plan = arg; break;
	case O_MEMREP: a->memory_report = 1; break;
	case O_DRY: a->dry_run = 1; break;
	case O_THREADS:
		if (parse_int("--threads", arg, 1, 1024, &l, msg, msglen)) return -1;
		a->threads = (int)l;
		break;
	case O_KEEPBN:
		if (!strcmp(arg, "true")) a->keep_bn_fp32 = 1;
		else if (!strcmp(arg, "false")) a->keep_bn_fp32 = 0;
		else {
			say(msg, msglen, "--keep-batchnorm-fp32 must be true or false, got '%s'", arg);
			return -1;
		}
		break;
	case O_DEPTH:
		if (parse_int("--depth", arg, 0, 1000, &l, msg, msglen)) return -1;
		if (l != 18 && l != 34 && !(l == 50 && (prog->groups & TRAIN_FLAGS_BENCH))) {
			say(msg, msglen, "--depth must be %s, got '%s'",
			    prog->groups & TRAIN_FLAGS_BENCH ? "18, 34 or 50" : "18 or 34", arg);
			return -1;
		}
		a->depth = (int)l;
		break;
	case O_WIDTH:
		if (parse_int("--width", arg, 1, 4096, &l, msg, msglen)) return -1;
		a->width = (int)l;
		break;
	case O_SIZE:
		if (parse_int("--size", arg, 8, 4096, &l, msg, msglen)) return -1;
		a->size = (int)l;
		break;
	case O_STEPS:
		if (parse_int("--steps", arg, 1, 1 << 30, &l, msg, msglen)) return -1;
		a->steps = (int)l;
		break;
	case O_WARMUP:
		if (parse_int("--warmup", arg, 0, 1 << 30, &l, msg, msglen)) return -1;
		a->warmup = (int)l;
		break;
	case O_PEAK:
		if (parse_double("--peak-flops", arg, &a->peak_flops, msg, msglen) ||
		    a->peak_flops < 0) { /* gpt_ddp's own --peak-flops says the same */
			say(msg, msglen, "--peak-flops expects a number >= 0, got '%s'", arg);
			return -1;
		}
		break;
	case O_SYNTH: a->synthetic = 1; break;
	case O_NTRAIN:
		if (parse_int("--train-images", arg, 1, 0x7fffffffL, &l, msg, msglen)) return -1;
		a->train_images = l;
		break;
	case O_NTEST:
		if (parse_int("--test-images", arg, 1, 0x7fffffffL, &l, msg, msglen)) return -1;
		a->test_images = l;
		break;
	case O_NOAUG: a->augment = 0; break;
	case O_SYNCBN: a->sync_bn = 1; break;
	case O_ZERO:
		if (parse_int("--zero", arg, 0, 3, &l, msg, msglen)) return -1;
		a->zero = (int)l;
		break;
	case O_ZPREF:
		if (parse_int("--zero-prefetch", arg, 0, 64, &l, msg, msglen)) return -1;
		a->zero_prefetch = l ? (int)l : -1; /* loom's 0 is the default, 1 */
		break;
	case O_ACCUM:
		if (parse_int("--accumulate", arg, 1, 1 << 16, &l, msg, msglen)) return -1;
		a->accumulate = (int)l;
		break;
	case O_PIPE:
		if (parse_int("--pipeline", arg, 1, 64, &l, msg, msglen)) return -1;
		a->pipeline = (int)l;
		break;
	case O_MICRO:
		if (parse_int("--micro-batches", arg, 1, 1 << 16, &l, msg, msglen)) return -1;
		a->micro_batches = (int)l;
		break;
	case O_BUCKET:
		if (parse_double("--bucket-cap-mb", arg, &a->bucket_cap_mb, msg, msglen)) return -1;
		if (!(a->bucket_cap_mb > 0)) {
			say(msg, msglen, "--bucket-cap-mb %g must be > 0 (MiB)", a->bucket_cap_mb);
			return -1;
		}
		break;
	case O_MEMLIM:
		if (parse_double("--memory-limit", arg, &a->memory_limit, msg, msglen)) return -1;
		if (a->memory_limit < 0) {
			say(msg, msglen, "--memory-limit %g must be >= 0 (MiB)", a->memory_limit);
			return -1;
		}
		break;
	case O_RECOMP:
		if (parse_int("--recompute", arg, 0, 3, &l, msg, msglen)) return -1;
		a->recompute = (int)l;
		break;
	case O_KSEARCH:
		if (!strcmp(arg, "on")) a->kernel_search = LOOM_KERNEL_SEARCH_ON;
		else if (!strcmp(arg, "off")) a->kernel_search = LOOM_KERNEL_SEARCH_OFF;
		else {
			say(msg, msglen, "--kernel-search expects on or off, got '%s'", arg);
			return -1;
		}
		break;
	case O_PSCHED:
		if (!strcmp(arg, "1f1b")) a->pipe_schedule = LOOM_SCHEDULE_1F1B;
		else if (!strcmp(arg, "gpipe")) a->pipe_schedule = LOOM_SCHEDULE_GPIPE;
		else {
			say(msg, msglen, "--schedule expects gpipe or 1f1b, got '%s'", arg);
			return -1;
		}
		break;
	case O_PBAL:
		if (!strcmp(arg, "time")) a->pipe_balance = LOOM_BALANCE_TIME;
		else if (!strcmp(arg, "memory")) a->pipe_balance = LOOM_BALANCE_MEMORY;
		else {
			say(msg, msglen, "--pipeline-balance expects time or memory, got '%s'", arg);
			return -1;
		}
		break;
	case O_TRACE: a->trace = arg; break;
	case O_TRACE_STEPS:
		if (parse_int("--trace-steps", arg, 1, 10000, &l, msg, msglen)) return -1;
		a->trace_steps = (int)l;
		break;
	case O_EXPORT: a->export_path = arg; break;
	case O_INIT_FROM: a->init_from = arg; break;
	case O_REINIT: a->reinit = arg; break;
	case O_INIT_STRICT:
		if (!strcmp(arg, "true")) a->init_strict = 1;
		else if (!strcmp(arg, "false")) a->init_strict = 0;
		else {
			say(msg, msglen, "--init-strict must be true or false, got '%s'", arg);
			return -1;
		}
		break;
	case O_METRICS: a->metrics = arg; break;
	case O_SCHED:
		if (!strcmp(arg, "step")) a->schedule = TRAIN_LR_STEP;
		else if (!strcmp(arg, "cosine")) a->schedule = TRAIN_LR_COSINE;
		else {
			say(msg, msglen, "--lr-schedule must be step or cosine, got '%s'", arg);
			return -1;
		}
		break;
	case O_WARMUP_EP:
		if (parse_double("--warmup-epochs", arg, &a->warmup_epochs, msg, msglen))
			return -1;
		if (a->warmup_epochs < 0 || a->warmup_epochs > 100000) {
			say(msg, msglen, "--warmup-epochs must lie in [0, 100000], got '%s'", arg);
			return -1;
		}
		break;
	default:
		say(msg, msglen, "internal: flag %d has no handler", c);
		return -1;
	}
	return 0;
}

const char *train_flag_name(size_t i)
{
	return i < N_FLAGS ? table[i].o.name : NULL;
}

int train_set_value(const train_program *prog, const char *name, const char *arg, train_args *a,
		    char *msg, size_t msglen)
{
	for (size_t i = 0; i < N_FLAGS; i++)
		if (!strcmp(table[i].o.name, name))
			return set_flag(prog, table[i].o.val, arg, a, msg, msglen);
	say(msg, msglen, "--%s is not a training flag", name);
	return -1;
}

train_parse train_parse_args(const train_program *prog, int argc, char **argv, train_args *a,
			     char *msg, size_t msglen)
{
	struct option opts[N_FLAGS + 1];
	size_t n = 0;
	int c;

	for (size_t i = 0; i < N_FLAGS; i++)
		if (table[i].group & (prog->groups | TRAIN_FLAGS_COMMON))
			opts[n++] = table[i].o;
	opts[n] = (struct option){ 0, 0, 0, 0 };
	*a = prog->defaults;
	say(msg, msglen, "%s", "");
	opterr = 0;
	/* 0, not 1: glibc then starts afresh, so a second call parses too. */
	optind = 0;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		const char *flag = optind > 1 ? argv[optind - 1] : "?";
		if (c == 'h' || c == O_HELP)
			return TRAIN_HELP;
		if (c == '?' || c == ':') {
			say(msg, msglen, "unknown or incomplete option '%s' (see --help)", flag);
			return TRAIN_BAD;
		}
		if (set_flag(prog, c, optarg, a, msg, msglen))
			return TRAIN_BAD;
	}
	if (optind < argc) {
		say(msg, msglen, "unexpected argument '%s' (see --help)", argv[optind]);
		return TRAIN_BAD;
	}
	if ((a->resume || a->save_every) && !a->checkpoint) {
		say(msg, msglen, "--resume and --save-every need --checkpoint PATH");
		return TRAIN_BAD;
	}
	if (a->save_every % a->accumulate) {
		say(msg, msglen, "--save-every %d must be a multiple of --accumulate %d (a checkpoint "
		    "holds no half-accumulated step)", a->save_every, a->accumulate);
		return TRAIN_BAD;
	}
	if (a->pipeline > 1) {
		int m = a->micro_batches ? a->micro_batches : a->pipeline;
		if (a->batch % m) {
			say(msg, msglen, "--batch-size %d is not a multiple of the %d micro-batches of "
			    "--pipeline", a->batch, m);
			return TRAIN_BAD;
		}
		if (a->accumulate > 1 || a->zero || a->sync_bn || a->export_path) {
			say(msg, msglen, "--pipeline: not with %s (it accumulates over "
			    "--micro-batches already)", a->accumulate > 1 ? "--accumulate" :
			    a->zero ? "--zero" : a->sync_bn ? "--sync-bn" : "--export yet");
			return TRAIN_BAD;
		}
	} else if (a->micro_batches || a->pipe_schedule || a->pipe_balance) {
		say(msg, msglen, "--micro-batches, --schedule and --pipeline-balance apply to "
		    "--pipeline N (N > 1)");
		return TRAIN_BAD;
	}
	if (a->fp8_all_products && !a->fp8) {
		say(msg, msglen, "--fp8-all-products applies to --precision fp8");
		return TRAIN_BAD;
	}
	if ((a->fp8_scaling || a->fp8_history) && !a->fp8) {
		say(msg, msglen, "--fp8-scaling and --fp8-history apply to --precision fp8");
		return TRAIN_BAD;
	}
	if (a->fp8_history && a->fp8_scaling == LOOM_FP8_SCALING_CURRENT) {
		say(msg, msglen, "--fp8-history applies to --fp8-scaling delayed");
		return TRAIN_BAD;
	}
	if (a->reinit && !a->init_from) {
		say(msg, msglen, "--reinit applies to --init-from FILE");
		return TRAIN_BAD;
	}
	if (a->schedule != TRAIN_LR_COSINE && a->warmup_epochs > 0) {
		say(msg, msglen, "--warmup-epochs applies to --lr-schedule cosine");
		return TRAIN_BAD;
	}
	if (a->warmup_epochs >= a->epochs && a->warmup_epochs > 0) {
		say(msg, msglen, "--warmup-epochs %g leaves no epoch of the %d to decay over",
		    a->warmup_epochs, a->epochs);
		return TRAIN_BAD;
	}
	return TRAIN_RUN;
}
