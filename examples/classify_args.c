/*
 * examples/classify_args.c — classify's command line: where its own flags
 * go, the shared ones through train_args as every training program reads
 * them, and the checks no single flag makes.
 */
#include "examples/classify_args.h"

#include <string.h>

/* The shared flags' defaults are train_classify's. */
const classify_args classify_defaults = { .model = "convnet", .top_k = 5 };

/* --model's choice by its canonical name (the flag matches any case). */
static int set_model(void *base, const flag_parsed *v, char *msg, size_t msglen)
{
	static const char *const names[] = { "convnet", "resnet18", "resnet34" };
	classify_args *a = base;

	(void)msg, (void)msglen;
	a->model = names[v->choice];
	return 0;
}

#define CLS FLAG_PROG_CLASSIFY
#define AT(field) FLAG_AT(classify_args, field)

static const flag_place classify_places[] = {
	{ FLAG_WEIGHTS, CLS, AT(weights) },
	{ FLAG_MODEL, CLS, .set = set_model },
	{ FLAG_SPLIT, CLS, AT(split) },
	{ FLAG_LIMIT, CLS, AT(limit) },
	{ FLAG_CLASSIFY_TOP_K, CLS, AT(top_k) },
	{ FLAG_PREDICTIONS, CLS, AT(predictions) },
};

flag_target classify_target(classify_args *a)
{
	return (flag_target){ classify_places, sizeof(classify_places) / sizeof(classify_places[0]),
			      a, NULL };
}

/* The shared flags' values, read as training reads them, into a. */
static void take_shared(classify_args *a, const train_args *t)
{
	a->data = t->data;
	a->checkpoint = t->checkpoint;
	a->width = t->width;
	a->batch = t->batch;
	a->threads = t->threads;
	a->strict = t->init_strict;
	a->level = t->level;
	a->half = t->half;
	a->fp8 = t->fp8;
	a->optim = t->optim;
	a->device = t->device;
}

int classify_parse(int argc, char **argv, classify_args *a, FILE *f, char *msg, size_t msglen)
{
	train_args shared = train_classify.defaults;
	flag_target t[2];

	*a = classify_defaults;
	t[0] = classify_target(a);
	t[1] = train_target(&shared);
	switch (flags_parse(FLAG_PROG_CLASSIFY, t, 2, argc, argv, msg, msglen)) {
	case FLAGS_RUN: break;
	case FLAGS_HELP:
		fprintf(f, "usage: %s [options]\n%s\n\n", train_classify.name, train_classify.about);
		flags_usage(FLAG_PROG_CLASSIFY, t, 2, f);
		return 1;
	default: return 2;
	}
	take_shared(a, &shared);
	if (!!a->weights == !!a->checkpoint) {
		flags_say(msg, msglen, "give --weights FILE.safetensors or --checkpoint FILE (one)");
		return 2;
	}
	return 0;
}
