/*
 * examples/classify_args.h — classify's settings: its own flags (rows of
 * base/options.def) and where they go, the ones it shares with training
 * read through train_args (train_classify), apart from classify.c so that
 * tests and the docs generator read them without the engine.
 */
#ifndef LOOM_EXAMPLES_CLASSIFY_ARGS_H
#define LOOM_EXAMPLES_CLASSIFY_ARGS_H

#include <stdint.h>
#include <stdio.h>

#include "examples/flags.h"
#include "examples/train_args.h"
#include "loom.h"

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

extern const classify_args classify_defaults;

/* a (holding its defaults) as a target of the flags' parser. */
flag_target classify_target(classify_args *a);

/*
 * Fills *a from argv (argv[0] is the program's name): classify's own flags
 * and the ones it shares with training (train_classify), one parser. 0 to
 * run, 1 after --help (printed on f), 2 for a bad command line (msg says
 * why, without the program's name).
 */
int classify_parse(int argc, char **argv, classify_args *a, FILE *f, char *msg, size_t msglen);

#endif /* LOOM_EXAMPLES_CLASSIFY_ARGS_H */
