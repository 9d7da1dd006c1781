/*
 * engine/pass.h — a compile pass: one stage of loom_compile's pipeline.
 *
 * loom_compile makes a program (the cloned graph, the options, the world
 * size) and walks loom_compile_passes (engine/passes.c) in order: each
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
} loom_pass;

/* The compile pipeline, in order (engine/passes.c). */
extern const loom_pass *const loom_compile_passes[];
extern const int loom_n_compile_passes;

/* Test hook: while set, the pass of this name is left out of every compile
 * (tests/engine/test_passes.c: each pass left out changes what compiles). */
extern const char *loom_test_skip_pass;

/* The engine's own passes (engine/compile_passes.c). */
extern const loom_pass loom_pass_amp, loom_pass_autodiff, loom_pass_device, loom_pass_fuse,
	loom_pass_slots, loom_pass_memory_plan, loom_pass_accumulation, loom_pass_steps,
	loom_pass_backend_plan, loom_pass_backend_alloc, loom_pass_initial_values;

/* p->err (a backend's or a limit's message) as "backend NAME: ..."; st. */
loom_status loom_pass_backend_failed(loom_program *p, loom_status st);

/* A plan's peak: the arena's regions, its workspace and optimizer state,
 * and `extra` (what a strategy allocates beyond them, p->peak_extra). */
size_t loom_plan_peak(const loom_plan *pl, size_t extra);

#endif /* LOOM_ENGINE_PASS_H */
