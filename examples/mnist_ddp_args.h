/*
 * examples/mnist_ddp_args.h — the command line of examples/mnist_ddp.c, as a
 * parser that returns a status and a message instead of printing or exiting,
 * so that a test or a fuzzer can call it as often as it likes.
 */
#ifndef LOOM_EXAMPLES_MNIST_DDP_ARGS_H
#define LOOM_EXAMPLES_MNIST_DDP_ARGS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "loom.h"

typedef struct mnist_ddp_args {
	int epochs;
	int batch;
	double lr, momentum, weight_decay;
	int lr_step;       /* epochs between decays, 0: constant */
	double lr_gamma;
	loom_optim_kind optim;
	const char *data;  /* points into argv or at a constant */
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
	const char *dump_plan; /* Graphviz file of the compiled plan, NULL: none */
	int memory_report;
	int threads;           /* CPU kernel threads, 0: one per core */
} mnist_ddp_args;

typedef enum mnist_ddp_parse {
	MNIST_DDP_RUN = 0,   /* *a holds the run's settings */
	MNIST_DDP_HELP = 1,  /* --help: print mnist_ddp_usage and exit 0 */
	MNIST_DDP_BAD = -1,  /* msg says which flag and why */
} mnist_ddp_parse;

/*
 * Fills *a from argv (argv[0] is the program name; getopt_long may permute
 * the rest). msg (msglen bytes, may be NULL) receives a message without the
 * program's name. Touches no file; safe to call repeatedly.
 */
mnist_ddp_parse mnist_ddp_parse_args(int argc, char **argv, mnist_ddp_args *a, char *msg,
				     size_t msglen);

/* The --help text. */
void mnist_ddp_usage(FILE *f);

#endif /* LOOM_EXAMPLES_MNIST_DDP_ARGS_H */
