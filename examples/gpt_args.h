/*
 * examples/gpt_args.h — gpt_ddp's own settings (the model's shape, its
 * data, validation and sampling, the reference runs' switches): the
 * struct, its defaults and where each of its flags (rows of
 * base/options.def) goes, apart from gpt_ddp.c so that tests and the docs
 * generator read them without the engine.
 */
#ifndef LOOM_EXAMPLES_GPT_ARGS_H
#define LOOM_EXAMPLES_GPT_ARGS_H

#include <stddef.h>

#include "examples/flags.h"
#include "loom.h"

/* The settings a Hugging Face config.json also gives (--init-from), by the
 * flag that sets each; --preset sets them too, where no flag does. */
enum { GPT_SET_LAYERS, GPT_SET_HEADS, GPT_SET_EMBD, GPT_SET_CONTEXT, GPT_SET_VOCAB, GPT_SET_GELU,
       GPT_SET_COUNT };

/* The model's shape and the flags only this program takes. */
typedef struct gpt_cfg {
	int layers, heads, embd, context;
	int vocab;              /* from the data (256 for bytes); --vocab overrides */
	const char *tokens;     /* llm.c token shards (file, folder, glob), else NULL */
	const char *val_tokens; /* their held-out shards, else the last tenth */
	int sample;             /* characters generated at the end */
	double temperature;     /* 0: greedy */
	int top_k;
	int val_interval, val_batches;
	int warmup_steps;
	const char *init_file;  /* parameters in loom order, f64, from bench/torch_gpt.py */
	loom_dtype dtype;       /* of the parameters: f32, or f64 (reference runs) */
	int sequential;         /* batch k = windows k*B .. (no shuffling), as the references */
	const char *loss_file;  /* every step's loss, %.17g, for the reference comparisons */
	int gelu_tanh;          /* GPT-2's (and llm.c's) tanh GELU instead of the exact one */
	int constant_lr;        /* no warm-up, no decay (llm.c's trainer) */
	const char *llmc_out;   /* write the initial model as an llm.c checkpoint, then stop */
	int export_hf;          /* --export-format hf: Conv1D layout and a config.json */
	const char *logits_out; /* write the first window's logits, then stop */
	double ln_eps;          /* the layer norms' epsilon (1e-5; config.json's) */
	int preset;             /* --preset: 0 none, 1 gpt2, 2 gpt2-medium, 3 gpt2-large */
	int hf_config;          /* the shape, GELU and epsilon came from --init-from's config.json */
	/* What gave each GPT_SET_ setting: its flag (gpt_set_flags), "--preset
	 * gpt2", or NULL (the default): a config.json must agree with it. */
	const char *set_by[GPT_SET_COUNT];
} gpt_cfg;

extern const gpt_cfg gpt_cfg_defaults;

/* The row of each GPT_SET_ setting's flag. */
extern const int gpt_set_rows[GPT_SET_COUNT];

/* c (holding its defaults) as a target of the flags' parser; given
 * (FLAG_ROW_COUNT bytes, may be NULL) marks the rows the command line set. */
flag_target gpt_target(gpt_cfg *c, unsigned char *given);

#endif /* LOOM_EXAMPLES_GPT_ARGS_H */
