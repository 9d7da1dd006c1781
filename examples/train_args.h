/*
 * examples/train_args.h — the command line the training examples share
 * (mnist_ddp, cifar_ddp, resnet50_synthetic, gpt_ddp): the rows of
 * base/options.def through examples/flags.h, each program taking the ones
 * its bit is on with its own defaults. It
 * returns a status and a message instead of printing or exiting, so that a
 * test or a fuzzer (tests/fuzz/fuzz_args.c) can call it as often as it likes.
 */
#ifndef LOOM_EXAMPLES_TRAIN_ARGS_H
#define LOOM_EXAMPLES_TRAIN_ARGS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "examples/flags.h"
#include "loom.h"

typedef enum train_lr_schedule {
	TRAIN_LR_STEP = 0, /* lr * gamma^(epoch / lr_step); constant when lr_step is 0 */
	TRAIN_LR_COSINE,   /* linear warm-up, then cosine decay to 0 over the run */
} train_lr_schedule;

typedef struct train_args {
	int epochs;
	int batch;         /* per rank, as in DDP */
	double lr, momentum, weight_decay;
	double clip_grad;        /* loom_optim_opts.clip_grad, 0: off */
	int decay_matrices_only; /* a program's default (gpt_ddp), no flag */
	train_lr_schedule schedule;
	int lr_step;       /* epochs between decays, 0: constant */
	double lr_gamma;
	double warmup_epochs; /* cosine: epochs of linear warm-up */
	loom_optim_kind optim;
	const char *data;  /* points into argv or at a constant */
	uint64_t seed;
	const char *checkpoint;
	int resume;
	loom_device device;
	int no_tf32;           /* --tf32 off: exact fp32 products on a GPU */
	int no_cuda_graph;     /* --no-cuda-graph: every training step eager on a GPU */
	int deterministic;     /* --deterministic: only cuDNN's deterministic algorithms */
	loom_opt_level level;
	loom_dtype half;
	int fp8;               /* --precision fp8: half bf16, products in fp8 (O1, O2) */
	int fp8_all_products;  /* --fp8-all-products: first and last products too */
	int fp8_scaling;       /* --fp8-scaling current|delayed (loom_fp8_scaling), 0: default */
	int fp8_history;       /* --fp8-history N: delayed scaling's amax history, 0: 16 */
	int amp_report;        /* --amp-report: loom_amp_report at every log line */
	double loss_scale; /* 0: the level's default (dynamic) */
	int keep_bn_fp32;  /* -1: the level's default */
	int bn_half;       /* --bn-half: O1's batch norm in the half type (amp.bn_half) */
	int save_every;    /* steps between mid-epoch checkpoints, 0: epoch ends only */
	int log_interval;
	int64_t max_steps; /* 0: no limit (for smoke runs) */
	int dump_graph;
	const char *dump_plan; /* Graphviz file of the compiled plan, NULL: none */
	int memory_report;
	int dry_run;           /* compile, report, stop before step 1 */
	int threads;           /* CPU kernel threads, 0: one per core */

	/* TRAIN_FLAGS_RESNET */
	int depth;             /* 18, 34 (CIFAR) or 50 */
	int width;             /* channels of the first stage, 64 as published */
	int size;              /* image side (resnet50_synthetic) */
	/* TRAIN_FLAGS_CIFAR */
	int synthetic;         /* generated images instead of --data */
	int64_t train_images;  /* use only the first N (0: all) */
	int64_t test_images;
	int augment;           /* random crop (pad 4) and flip */
	/* TRAIN_FLAGS_BENCH */
	int steps, warmup;     /* timed steps and untimed ones before them */
	double peak_flops;     /* FLOP/s for MFU, 0: measured (examples/peak.h) */

	/* data parallel and the picture */
	int sync_bn;           /* batch-norm statistics over the global batch */
	int zero;              /* ZeRO stage (loom_compile_opts.zero_stage) */
	double bucket_cap_mb;  /* loom_compile_opts.bucket_cap_mb, 0: the default */
	int zero_prefetch;     /* loom_compile_opts.zero_prefetch (-1: none, 0: the default) */
	int accumulate;        /* micro-batches per optimizer step (DDP's no_sync), 1: none */
	int pipeline;          /* pipeline stages (loom_compile_opts.pipeline_stages), 1: none */
	int micro_batches;     /* a pipeline batch's micro-batches, 0: the stages */
	int pipe_schedule;     /* loom_schedule */
	int pipe_balance;      /* loom_pipeline_balance: how the stages are cut */
	double memory_limit;   /* MiB per rank the plan may take (0: no limit) */
	int kernel_search;     /* loom_kernel_search: conv/product kernels measured or fixed */
	int recompute;         /* loom_compile_opts.recompute: 0-3 */
	const char *trace;     /* Chrome trace file, NULL: none */
	int trace_steps;       /* steps the trace records, after the run's first */

	/* weights in and out (safetensors, PyTorch's names), the metrics log */
	const char *export_path; /* --export: the weights after training, NULL: none */
	const char *init_from;   /* --init-from: weights to start from, NULL: none */
	const char *reinit;      /* --reinit: comma-separated names left as initialised */
	int init_strict;         /* --init-strict: names must match both ways (default 1) */
	const char *metrics;     /* --metrics: JSON Lines log, NULL: none */
} train_args;

/* Flag groups; every program has TRAIN_FLAGS_COMMON. */
enum {
	TRAIN_FLAGS_COMMON = 1 << 0,   /* device, precision, threads, plan, memory, --nproc */
	TRAIN_FLAGS_FIT = 1 << 1,      /* epochs, optimizer, lr schedule, checkpoints, logs */
	TRAIN_FLAGS_DATA = 1 << 2,     /* --data DIR */
	TRAIN_FLAGS_RESNET = 1 << 3,   /* --depth, --width */
	TRAIN_FLAGS_CIFAR = 1 << 4,    /* --synthetic, image limits, augmentation, cosine */
	TRAIN_FLAGS_BENCH = 1 << 5,    /* --steps, --warmup, --size */
};

/* A program's command line: its name, what it trains (the first lines of
 * --help), its bit in the flags' place tables (FLAG_PROG_*), the flag
 * groups it takes (what train.c asks of it) and its defaults. */
typedef struct train_program {
	const char *name;
	const char *about;
	unsigned bit;
	unsigned groups;
	train_args defaults;
} train_program;

extern const train_program train_mnist_ddp, train_cifar_ddp, train_resnet50_synthetic,
	train_gpt_ddp;

/* The flags classify shares with training (--opt-level, --device, ...),
 * into a train_args, with classify's defaults; its own are classify_args.h's. */
extern const train_program train_classify;

/* a as a target of the flags' parser (examples/flags.h). */
flag_target train_target(train_args *a);

typedef enum train_parse {
	TRAIN_RUN = 0,   /* *a holds the run's settings */
	TRAIN_HELP = 1,  /* --help: print train_usage and exit 0 */
	TRAIN_BAD = -1,  /* msg says which flag and why */
} train_parse;

/*
 * Fills *a from argv (argv[0] is the program name; getopt_long may permute
 * the rest) for program prog: a flag of a group prog does not take is
 * unknown. msg (msglen bytes, may be NULL) receives a message without the
 * program's name. Touches no file; safe to call repeatedly.
 */
train_parse train_parse_args(const train_program *prog, int argc, char **argv, train_args *a,
			     char *msg, size_t msglen);

/* The same, and the program's own flags into own (gpt_ddp's model), which
 * holds their defaults; own may be NULL. */
train_parse train_parse_with(const train_program *prog, const flag_target *own, int argc,
			     char **argv, train_args *a, char *msg, size_t msglen);

/*
 * One flag's value (name without dashes, e.g. "opt-level") into *a, with the
 * same checks and messages as train_parse_args: 0, or -1 with msg set. Any
 * flag train_args holds, whichever program takes it (the settings test
 * sets each alone).
 */
int train_set_value(const train_program *prog, const char *name, const char *arg, train_args *a,
		    char *msg, size_t msglen);

/* The name (without dashes) of the i-th flag train_args holds, every
 * program's; NULL past the last. */
const char *train_flag_name(size_t i);

/* The --help text of prog, with own's flags (may be NULL) and defaults. */
void train_usage(const train_program *prog, const flag_target *own, FILE *f);

#endif /* LOOM_EXAMPLES_TRAIN_ARGS_H */
