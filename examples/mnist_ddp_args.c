/*
 * examples/mnist_ddp_args.c — the command line of examples/mnist_ddp.c: every
 * flag, its default and its range, checked here so that main() only runs.
 */
#include "examples/mnist_ddp_args.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "loom_data.h"

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

void mnist_ddp_usage(FILE *f)
{
	fprintf(f,
		"usage: mnist_ddp [options]\n"
		"Trains a ConvNet (conv5x5-16 bn relu pool, conv5x5-32 bn relu pool, linear 1568->10)\n"
		"on Fashion-MNIST with loom.\n\n"
		"  --data DIR           MNIST-format directory (default %s)\n"
		"  --epochs N           epochs to train (default 2)\n"
		"  --batch-size N       images per step and rank (default 100)\n"
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
		"  --threads N          CPU kernel threads (default: one per core)\n"
		"  --checkpoint PATH    save here after every epoch (atomic write)\n"
		"  --save-every N       also save every N steps (resume continues mid-epoch)\n"
		"  --resume             continue from --checkpoint\n"
		"  --log-interval N     steps between progress lines (default 100)\n"
		"  --max-steps N        stop after N training steps (smoke tests)\n"
		"  --dump-plan FILE     write the compiled plan as Graphviz (dot -Tsvg FILE)\n"
		"  --memory-report      print where the plan's memory goes, before step 1\n"
		"  --dump-graph         print the compiled plan: each node's dtype (AMP casts included)\n"
		"                       and its place in the arena\n"
		"  --nproc N            start N ranks on this host (data parallel; also under\n"
		"                       mpirun, or with torchrun's RANK/WORLD_SIZE/MASTER_ADDR/PORT)\n"
		"  --max-restarts K     with --nproc: restart all ranks up to K times after a failure\n"
		"  --help               this text\n",
		LOOM_FASHION_MNIST_DIR);
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

mnist_ddp_parse mnist_ddp_parse_args(int argc, char **argv, mnist_ddp_args *a, char *msg,
				     size_t msglen)
{
	enum { O_DATA = 256, O_EPOCHS, O_BATCH, O_OPTIM, O_LR, O_MOM, O_WD, O_LRSTEP, O_LRGAMMA,
	       O_LEVEL, O_PREC, O_SCALE, O_DEVICE, O_SEED, O_CKPT, O_RESUME, O_LOG, O_MAX,
	       O_DUMP, O_KEEPBN, O_SAVE_EVERY, O_THREADS, O_DUMP_PLAN, O_MEMREP, O_HELP };
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
		{ "dump-plan", required_argument, 0, O_DUMP_PLAN },
		{ "memory-report", no_argument, 0, O_MEMREP },
		{ "threads", required_argument, 0, O_THREADS },
		{ "keep-batchnorm-fp32", required_argument, 0, O_KEEPBN },
		{ "help", no_argument, 0, O_HELP },
		{ 0, 0, 0, 0 },
	};
	*a = (mnist_ddp_args){ .epochs = 2, .batch = 100, .lr = 0.01, .momentum = 0.9,
			       .lr_gamma = 0.1, .optim = LOOM_OPTIM_SGD,
			       .data = LOOM_FASHION_MNIST_DIR, .device = LOOM_DEVICE_AUTO,
			       .level = LOOM_O0, .half = LOOM_F16, .log_interval = 100,
			       .keep_bn_fp32 = -1 };
	long l;
	int c;
	say(msg, msglen, "%s", "");
	opterr = 0;
	/* 0, not 1: glibc then starts afresh, so a second call parses too. */
	optind = 0;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		const char *flag = optind > 1 ? argv[optind - 1] : "?";
		switch (c) {
		case O_DATA: a->data = optarg; break;
		case O_EPOCHS:
			if (parse_int("--epochs", optarg, 1, 100000, &l, msg, msglen)) return MNIST_DDP_BAD;
			a->epochs = (int)l;
			break;
		case O_BATCH:
			if (parse_int("--batch-size", optarg, 1, 1 << 20, &l, msg, msglen)) return MNIST_DDP_BAD;
			a->batch = (int)l;
			break;
		case O_OPTIM:
			if (!strcmp(optarg, "sgd")) a->optim = LOOM_OPTIM_SGD;
			else if (!strcmp(optarg, "adamw")) a->optim = LOOM_OPTIM_ADAMW;
			else {
				say(msg, msglen, "--optimizer must be sgd or adamw, got '%s'", optarg);
				return MNIST_DDP_BAD;
			}
			break;
		case O_LR: if (parse_double("--lr", optarg, &a->lr, msg, msglen)) return MNIST_DDP_BAD; break;
		case O_MOM: if (parse_double("--momentum", optarg, &a->momentum, msg, msglen)) return MNIST_DDP_BAD; break;
		case O_WD: if (parse_double("--weight-decay", optarg, &a->weight_decay, msg, msglen)) return MNIST_DDP_BAD; break;
		case O_LRSTEP:
			if (parse_int("--lr-step", optarg, 0, 100000, &l, msg, msglen)) return MNIST_DDP_BAD;
			a->lr_step = (int)l;
			break;
		case O_LRGAMMA: if (parse_double("--lr-gamma", optarg, &a->lr_gamma, msg, msglen)) return MNIST_DDP_BAD; break;
		case O_LEVEL:
			if (strlen(optarg) == 2 && (optarg[0] == 'O' || optarg[0] == 'o') &&
			    optarg[1] >= '0' && optarg[1] <= '3')
				a->level = (loom_opt_level)(optarg[1] - '0');
			else {
				say(msg, msglen, "--opt-level must be O0, O1, O2 or O3, got '%s'", optarg);
				return MNIST_DDP_BAD;
			}
			break;
		case O_PREC:
			if (!strcmp(optarg, "fp16")) a->half = LOOM_F16;
			else if (!strcmp(optarg, "bf16")) a->half = LOOM_BF16;
			else {
				say(msg, msglen, "--precision must be fp16 or bf16, got '%s'", optarg);
				return MNIST_DDP_BAD;
			}
			break;
		case O_SCALE:
			if (!strcmp(optarg, "dynamic"))
				a->loss_scale = 0;
			else if (parse_double("--loss-scale", optarg, &a->loss_scale, msg, msglen) ||
				 a->loss_scale <= 0) {
				say(msg, msglen, "--loss-scale must be 'dynamic' or a positive number, got '%s'",
				    optarg);
				return MNIST_DDP_BAD;
			}
			break;
		case O_DEVICE:
			if (!strcmp(optarg, "auto")) a->device = LOOM_DEVICE_AUTO;
			else if (!strcmp(optarg, "cpu")) a->device = LOOM_DEVICE_CPU;
			else if (!strcmp(optarg, "cuda")) a->device = LOOM_DEVICE_CUDA;
			else {
				say(msg, msglen, "--device must be auto, cpu or cuda, got '%s'", optarg);
				return MNIST_DDP_BAD;
			}
			break;
		case O_SEED:
			if (parse_int("--seed", optarg, 0, 0x7fffffffL, &l, msg, msglen)) return MNIST_DDP_BAD;
			a->seed = (uint64_t)l;
			break;
		case O_CKPT: a->checkpoint = optarg; break;
		case O_RESUME: a->resume = 1; break;
		case O_SAVE_EVERY:
			if (parse_int("--save-every", optarg, 1, 1 << 30, &l, msg, msglen)) return MNIST_DDP_BAD;
			a->save_every = (int)l;
			break;
		case O_LOG:
			if (parse_int("--log-interval", optarg, 1, 1 << 30, &l, msg, msglen)) return MNIST_DDP_BAD;
			a->log_interval = (int)l;
			break;
		case O_MAX:
			if (parse_int("--max-steps", optarg, 1, 0x7fffffffL, &l, msg, msglen)) return MNIST_DDP_BAD;
			a->max_steps = l;
			break;
		case O_DUMP: a->dump_graph = 1; break;
		case O_DUMP_PLAN: a->dump_plan = optarg; break;
		case O_MEMREP: a->memory_report = 1; break;
		case O_THREADS:
			if (parse_int("--threads", optarg, 1, 1024, &l, msg, msglen)) return MNIST_DDP_BAD;
			a->threads = (int)l;
			break;
		case O_KEEPBN:
			if (!strcmp(optarg, "true")) a->keep_bn_fp32 = 1;
			else if (!strcmp(optarg, "false")) a->keep_bn_fp32 = 0;
			else {
				say(msg, msglen, "--keep-batchnorm-fp32 must be true or false, got '%s'", optarg);
				return MNIST_DDP_BAD;
			}
			break;
		case 'h':
		case O_HELP: return MNIST_DDP_HELP;
		default:
			say(msg, msglen, "unknown or incomplete option '%s' (see --help)", flag);
			return MNIST_DDP_BAD;
		}
	}
	if (optind < argc) {
		say(msg, msglen, "unexpected argument '%s' (see --help)", argv[optind]);
		return MNIST_DDP_BAD;
	}
	if ((a->resume || a->save_every) && !a->checkpoint) {
		say(msg, msglen, "--resume and --save-every need --checkpoint PATH");
		return MNIST_DDP_BAD;
	}
	return MNIST_DDP_RUN;
}
