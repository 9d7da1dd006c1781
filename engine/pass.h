/*
 * engine/pass.h — a compile pass: one stage of loom_compile's pipeline.
 *
 * loom_compile makes a program (the cloned graph, the options, the world
 * size) and walks loom_compile_passes (parallel/pass_list.c) in order: each
 * pass that is wanted sees the plan and the options and adds to it or
 * rewrites it (casts, gradients, fusions, slots, buckets, the memory plan,
 * steps, shards, stages, the backend's plans). Once every pass has run and
 * the arena holds the initial values, the passes that ran and have a start
 * member run it in the same order: the collective start-up a strategy needs
 * before step 1 (the plan check, the broadcast of rank 0's values, the
 * pipeline's peers). A strategy is a pass (parallel/passes.c), not a
 * branch in loom_compile.
 */
#ifndef LOOM_ENGINE_PASS_H
#define LOOM_ENGINE_PASS_H

#include <stddef.h>

#include "engine/program_internal.h"

/* What the compile hands every pass beside the program. */
typedef struct loom_pass_ctx {
	loom_value loss;  /* the loss in p's graph (the AMP pass may move it) */
	int rebalanced;   /* pipeline stages cut by memory (loom_compile's retry) */
	/* The values this rank's part of the plan gives storage (one byte per
	 * node, malloc'd; NULL: all): a pipeline stage's, set by the cut, read
	 * by the memory plan, freed by loom_compile. */
	unsigned char *held;
} loom_pass_ctx;

typedef struct loom_pass {
	const char *name;
	/* Whether this compile needs the pass (NULL: always). */
	int (*wanted)(const loom_program *p);
	/* Adds to or rewrites p's plan; a failure's message in p->err. */
	loom_status (*run)(loom_program *p, loom_pass_ctx *c);
	/* Start-up once the arena holds the initial values (NULL: none);
	 * collective for a strategy. A failure's message in p->err. */
	loom_status (*start)(loom_program *p);
	/* After a compile refused for memory (LOOM_ERR_NOMEM): whether to
	 * compile again with the options changed (o, a copy of the user's);
	 * that compile's rebalanced is 1. NULL: never. */
	int (*retry)(const loom_program *p, loom_compile_opts *o);
	/* What the pass hung on p, freed with it (NULL: nothing). */
	void (*release)(loom_program *p);

	/* At run time, on a program whose compile ran the pass (NULL: the
	 * engine's way). execute: a strategy that runs the plan its own way
	 * (the pipeline's micro-batches) runs loom_run's mode; set_input and
	 * read: loom_set_input and loom_read(_f64) of a value the strategy
	 * holds its own way; eval_sync: before an EVAL run that follows
	 * training runs (each rank's buffers from its own batches: rank 0's
	 * to every rank); note: this rank's place in the strategy, for the
	 * memory report (buf empty: none). */
	loom_status (*execute)(loom_program *p, loom_run_mode mode);
	loom_status (*set_input)(loom_program *p, loom_value v, const void *data, size_t count);
	loom_status (*read)(loom_program *p, loom_value v, double *dst, size_t count);
	loom_status (*eval_sync)(loom_program *p);
	void (*note)(const loom_program *p, char *buf, size_t len);
} loom_pass;

/* The pass of the list that ran in p's compile and has member m, else NULL
 * (the first, in the list's order). */
#define LOOM_PASS_WITH(p, m) loom_pass_with((p), offsetof(loom_pass, m))
const loom_pass *loom_pass_with(const loom_program *p, size_t member);

/* The compile pipeline, in order (parallel/pass_list.c, above both
 * rooms: engine/ names no strategy). */
extern const loom_pass *const loom_compile_passes[];
extern const int loom_n_compile_passes;

/* Test hook: while set, the pass of this name is left out of every compile
 * (tests/engine/test_passes.c: each pass left out changes what compiles). */
extern const char *loom_test_skip_pass;

/* The engine's own passes (engine/compile_passes.c). */
extern const loom_pass loom_pass_amp, loom_pass_autodiff, loom_pass_device, loom_pass_fuse, loom_pass_formats,
	loom_pass_slots, loom_pass_memory_plan, loom_pass_accumulation, loom_pass_steps,
	loom_pass_backend_plan, loom_pass_backend_alloc, loom_pass_initial_values, loom_pass_vocab_pad,
	loom_pass_recompute, loom_pass_fp8_storage;

/* The vocab-pad pass's multiple: LOOM_VOCAB_PAD when set (0: off), else
 * loom_compile_opts.vocab_pad (engine/vocab_pad.c). */
int64_t loom_vocab_pad_multiple(const loom_compile_opts *o);

/* p->err (a backend's or a limit's message) as "backend NAME: ..."; st. */
loom_status loom_pass_backend_failed(loom_program *p, loom_status st);

/* A plan's peak: the arena's regions, its workspace, optimizer state and
 * ZeRO's master (ZeRO-3: parameter) shards, and `extra` (what a strategy allocates beyond them, p->peak_extra). */
size_t loom_plan_peak(const loom_plan *pl, size_t extra);

#endif /* LOOM_ENGINE_PASS_H */
