/*
 * tests/ddp/worker_util.h — what the data-parallel test workers (ddp_worker,
 * accum_worker, eval_worker) share: the group and the "rank R: ERROR" line,
 * a small model with its parameters listed, the deterministic sample
 * stream, and the comparisons of parameters within and across ranks.
 */
#ifndef LOOM_TESTS_DDP_WORKER_UTIL_H
#define LOOM_TESTS_DDP_WORKER_UTIL_H

#include <stdint.h>

#include "comm/comm.h"
#include "loom.h"

#define WORKER_IN 20     /* the MLP's inputs per row */
#define WORKER_HID 32
#define WORKER_CLASSES 10
#define WORKER_MAXP 16

typedef struct worker_model {
	loom_graph *g;
	loom_program *p;
	loom_value loss;
	loom_value params[WORKER_MAXP]; /* those worker_param made, in order */
	int64_t numel[WORKER_MAXP];
	int np;
	int batch;
	int width; /* values per row of input "x" (worker_feed) */
} worker_model;

/* Joins the group from the environment (or alone) and gives this rank and
 * the world size; 1 after printing "rank ?: ERROR group: ..." if it fails. */
int worker_init(loom_pg **pg, int *rank, int *world);

/* Prints "rank R: ERROR what: status: msg" and returns 1 (the exit code). */
int worker_fail(const char *what, loom_status st, const char *msg);

/* Clears m for a graph at `batch` rows of `width` values, seeded. */
void worker_begin(worker_model *m, int batch, int width, uint64_t seed);

/* Frees m's program and graph (either may be absent) and clears them;
 * returns rc, so that a scenario ends with `return worker_free(rc, &m)`
 * on every path, its failures included. b may be NULL. */
int worker_free(int rc, worker_model *a, worker_model *b);

/* An f32 parameter of m's graph, listed in m->params. */
loom_value worker_param(worker_model *m, const char *name, int ndim, const int64_t *dims,
			loom_init init, int64_t fan_in);

/* MLP 20 -> 32 -> relu -> 10 on input "x" [batch, 20] and labels "y", no
 * batch norm: batch B x N equals batch N*B. */
void worker_mlp(worker_model *m, int batch, uint64_t seed);

/* examples/models.h's ConvNet at `batch` (inputs "image" and "label"),
 * seeded, compiled with o; *logits as loom_model_convnet gives it. */
loom_status worker_convnet(worker_model *m, int batch, uint64_t seed, const loom_compile_opts *o,
			   loom_value *logits);

/* The defaults but for: CPU (LOOM_WORKER_DEVICE=cuda: CUDA), group pg, level, SGD at
 * lr with momentum. */
void worker_opts(loom_compile_opts *o, loom_pg *pg, loom_opt_level level, double lr,
		 double momentum);

/* Rows [first, first + batch) of the deterministic sample stream into "x"
 * and "y"; a nonzero poison replaces the first value. */
loom_status worker_feed(worker_model *m, long first, double poison);

/* Every parameter's value, hashed in order. */
uint64_t worker_param_hash(worker_model *m);

/* 1 when every rank's h equals rank 0's, 0 when not, -1 when the
 * all-gather failed; 1 without a group (pg NULL) or at world 1. */
int worker_same_everywhere(loom_pg *pg, uint64_t h);

/* The largest |x - y| relative to y's largest magnitude (absolute where y
 * is all zeros). */
double worker_rel_diff(const double *x, const double *y, int64_t n);

/* worker_rel_diff of a's and b's parameters, worst over them. */
double worker_param_rel_diff(worker_model *a, worker_model *b);

#endif /* LOOM_TESTS_DDP_WORKER_UTIL_H */
