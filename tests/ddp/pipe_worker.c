/*
 * tests/ddp/pipe_worker.c — one rank of the pipeline tests (test_pipe.sh
 * starts it under mpirun, env:// or the launcher). Modes:
 *   equiv MODEL LEVEL SCHED M  S stages of M micro-batches (S = the world)
 *                              against one process running LOOM_RUN_ACCUMULATE
 *                              over the same micro-batches, 20 steps
 *   mismatch                   rank 1 builds another graph: the start-up check
 *                              names the stage and node
 *   kill                       the last rank exits after compiling: every other
 *                              rank ends with an error
 *   memory M                   the planned activations under 1F1B and GPipe
 *   pstate                     each stage plans only its own parameters,
 *                              gradients, masters and optimizer state
 *   cut                        loom_stage_boundary places the cut
 *   eval                       EVAL through the stages equals one process's
 *   balance SCHED M            the memory-balanced cut's largest planned peak
 *                              against the time-balanced cut's, on imb
 *   fallback M                 --memory-limit between the two cuts' peaks:
 *                              the time cut gives way to the memory cut,
 *                              which trains as one process; below both:
 *                              refused naming both
 * MODEL: mlp (20-32-32-10, no batch norm), cnn (two convolutions with
 * pools and a linear layer, no batch norm) or imb (cnn's shape with wide
 * linear layers after: the convolutions take the time, the linear layers
 * the memory). equiv takes the cut's balance as a last argument: time
 * (default) or memory.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <signal.h>

#include "comm/comm.h"
#include "comm/launch.h"
#include "loom.h"
#include "tests/ddp/worker_util.h"

#define B 4 /* rows per micro-batch */
#define STEPS 20

static int rank, world;

static loom_opt_level level_of(const char *s)
{
	return strcmp(s, "O2") == 0 ? LOOM_O2 : LOOM_O0;
}

static void mlp3(worker_model *m, int hid, loom_value *logits)
{
	worker_begin(m, B, WORKER_IN, 7);
	loom_graph *g = m->g;
	int64_t xd[2] = { B, WORKER_IN }, yd[1] = { B };
	int64_t w1[2] = { hid, WORKER_IN }, b1[1] = { hid }, w2[2] = { hid, hid }, b2[1] = { hid },
		w3[2] = { WORKER_CLASSES, hid }, b3[1] = { WORKER_CLASSES };
	loom_value x = loom_input(g, "x", LOOM_F32, 2, xd);
	loom_value a = worker_param(m, "l1.weight", 2, w1, LOOM_INIT_KAIMING_UNIFORM, WORKER_IN);
	loom_value b = worker_param(m, "l1.bias", 1, b1, LOOM_INIT_UNIFORM_FAN_IN, WORKER_IN);
	loom_value h = loom_relu(g, loom_linear(g, x, a, b));
	a = worker_param(m, "l2.weight", 2, w2, LOOM_INIT_KAIMING_UNIFORM, hid);
	b = worker_param(m, "l2.bias", 1, b2, LOOM_INIT_UNIFORM_FAN_IN, hid);
	h = loom_relu(g, loom_linear(g, h, a, b));
	a = worker_param(m, "l3.weight", 2, w3, LOOM_INIT_KAIMING_UNIFORM, hid);
	b = worker_param(m, "l3.bias", 1, b3, LOOM_INIT_UNIFORM_FAN_IN, hid);
	h = loom_linear(g, h, a, b);
	loom_mark_output(g, h);
	*logits = h;
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	m->loss = loom_softmax_cross_entropy(g, h, y);
}

/* The tutorial ConvNet's shape without batch norm, smaller. */
static void cnn(worker_model *m, loom_value *logits)
{
	worker_begin(m, B, 784, 11);
	loom_graph *g = m->g;
	int64_t xd[4] = { B, 1, 28, 28 }, yd[1] = { B };
	int64_t c1[4] = { 4, 1, 5, 5 }, cb1[1] = { 4 }, c2[4] = { 8, 4, 5, 5 }, cb2[1] = { 8 },
		fw[2] = { WORKER_CLASSES, 8 * 7 * 7 }, fb[1] = { WORKER_CLASSES };
	loom_value x = loom_input(g, "x", LOOM_F32, 4, xd);
	loom_value w = worker_param(m, "c1.weight", 4, c1, LOOM_INIT_KAIMING_UNIFORM, 25);
	loom_value b = worker_param(m, "c1.bias", 1, cb1, LOOM_INIT_UNIFORM_FAN_IN, 25);
	loom_value h = loom_maxpool2d(g, loom_relu(g, loom_conv2d(g, x, w, b, 1, 2)), 2, 2, 0);
	w = worker_param(m, "c2.weight", 4, c2, LOOM_INIT_KAIMING_UNIFORM, 100);
	b = worker_param(m, "c2.bias", 1, cb2, LOOM_INIT_UNIFORM_FAN_IN, 100);
	h = loom_maxpool2d(g, loom_relu(g, loom_conv2d(g, h, w, b, 1, 2)), 2, 2, 0);
	h = loom_flatten(g, h);
	w = worker_param(m, "fc.weight", 2, fw, LOOM_INIT_KAIMING_UNIFORM, 8 * 7 * 7);
	b = worker_param(m, "fc.bias", 1, fb, LOOM_INIT_UNIFORM_FAN_IN, 8 * 7 * 7);
	h = loom_linear(g, h, w, b);
	*logits = h;
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	m->loss = loom_softmax_cross_entropy(g, h, y);
}

/* Imbalanced in memory under the time cut: the two convolutions are most
 * of the estimated time, the linear layers after them (200 k, 65 k and
 * 65 k weights) most of the parameters, so a time cut right after the
 * convolutions leaves the last stage the parameters, their gradients,
 * momentum and accumulation sums. */
static void imb(worker_model *m, loom_value *logits)
{
	worker_begin(m, B, 784, 13);
	loom_graph *g = m->g;
	int64_t xd[4] = { B, 1, 28, 28 }, yd[1] = { B };
	int64_t c1[4] = { 8, 1, 5, 5 }, cb1[1] = { 8 }, c2[4] = { 16, 8, 5, 5 }, cb2[1] = { 16 },
		w1[2] = { 256, 16 * 7 * 7 }, b1[1] = { 256 }, w2[2] = { 256, 256 }, b2[1] = { 256 },
		w4[2] = { WORKER_CLASSES, 256 }, b4[1] = { WORKER_CLASSES };
	loom_value x = loom_input(g, "x", LOOM_F32, 4, xd);
	loom_value w = worker_param(m, "c1.weight", 4, c1, LOOM_INIT_KAIMING_UNIFORM, 25);
	loom_value b = worker_param(m, "c1.bias", 1, cb1, LOOM_INIT_UNIFORM_FAN_IN, 25);
	loom_value h = loom_maxpool2d(g, loom_relu(g, loom_conv2d(g, x, w, b, 1, 2)), 2, 2, 0);
	w = worker_param(m, "c2.weight", 4, c2, LOOM_INIT_KAIMING_UNIFORM, 200);
	b = worker_param(m, "c2.bias", 1, cb2, LOOM_INIT_UNIFORM_FAN_IN, 200);
	h = loom_maxpool2d(g, loom_relu(g, loom_conv2d(g, h, w, b, 1, 2)), 2, 2, 0);
	h = loom_flatten(g, h);
	w = worker_param(m, "fc1.weight", 2, w1, LOOM_INIT_KAIMING_UNIFORM, 16 * 7 * 7);
	b = worker_param(m, "fc1.bias", 1, b1, LOOM_INIT_UNIFORM_FAN_IN, 16 * 7 * 7);
	h = loom_relu(g, loom_linear(g, h, w, b));
	w = worker_param(m, "fc2.weight", 2, w2, LOOM_INIT_KAIMING_UNIFORM, 256);
	b = worker_param(m, "fc2.bias", 1, b2, LOOM_INIT_UNIFORM_FAN_IN, 256);
	h = loom_relu(g, loom_linear(g, h, w, b));
	w = worker_param(m, "fc3.weight", 2, w2, LOOM_INIT_KAIMING_UNIFORM, 256);
	b = worker_param(m, "fc3.bias", 1, b2, LOOM_INIT_UNIFORM_FAN_IN, 256);
	h = loom_relu(g, loom_linear(g, h, w, b));
	w = worker_param(m, "fc4.weight", 2, w4, LOOM_INIT_KAIMING_UNIFORM, 256);
	b = worker_param(m, "fc4.bias", 1, b4, LOOM_INIT_UNIFORM_FAN_IN, 256);
	h = loom_linear(g, h, w, b);
	*logits = h;
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	m->loss = loom_softmax_cross_entropy(g, h, y);
}

static void build(worker_model *m, const char *model, loom_value *logits)
{
	if (strcmp(model, "cnn") == 0)
		cnn(m, logits);
	else if (strcmp(model, "imb") == 0)
		imb(m, logits);
	else
		mlp3(m, 32, logits);
}

/* Rows [first, first + n) of the sample stream into "x" and "y"; row
 * `bad` (if >= 0) starts with `poison`. */
static loom_status feed_poisoned(loom_program *p, int width, long first, int n, int bad,
				 float poison)
{
	float *x = malloc(sizeof(float) * (size_t)n * width);
	int32_t *y = malloc(sizeof(int32_t) * (size_t)n);
	for (int i = 0; i < n; i++) {
		long idx = first + i;
		for (int j = 0; j < width; j++)
			x[i * width + j] = (float)sin(0.37 * idx + 1.3 * j) + (float)(idx % 3) * 0.1f;
		y[i] = (int32_t)(idx % WORKER_CLASSES);
	}
	if (bad >= 0 && bad < n)
		x[bad * width] = poison;
	loom_status st = loom_set_input(p, "x", x, LOOM_F32, (size_t)n * width);
	if (st == LOOM_OK)
		st = loom_set_input(p, "y", y, LOOM_I32, (size_t)n);
	free(x);
	free(y);
	return st;
}

static void drop(worker_model *m)
{
	loom_program_free(m->p);
	loom_graph_free(m->g);
}

static loom_status feed_rows(loom_program *p, int width, long first, int n)
{
	return feed_poisoned(p, width, first, n, -1, 0);
}

static void pipe_opts(loom_compile_opts *o, loom_pg *pg, loom_opt_level lv, int stages, int micro,
		      int sched)
{
	worker_opts(o, pg, lv, 0.05, 0.9);
	o->pipeline_stages = stages;
	o->micro_batches = micro;
	o->schedule = sched;
}

static int sched_of(const char *s)
{
	return strcmp(s, "gpipe") == 0 ? LOOM_SCHEDULE_GPIPE : LOOM_SCHEDULE_1F1B;
}

/* One process, gradient accumulation over the same micro-batches. */
static loom_status reference_step(worker_model *r, int width, int step, int micro)
{
	loom_status st = LOOM_OK;
	for (int j = 0; j < micro && st == LOOM_OK; j++) {
		st = feed_rows(r->p, width, (long)step * micro * B + j * B, B);
		if (st == LOOM_OK)
			st = loom_run(r->p, j < micro - 1 ? LOOM_RUN_ACCUMULATE : LOOM_RUN_TRAIN);
	}
	return st;
}

static int equiv(loom_pg *pg, const char *model, const char *lv, const char *sched, int micro,
		 const char *balance)
{
	worker_model m, r;
	loom_value lo, lr;
	loom_compile_opts o, ro;
	loom_status st;
	build(&m, model, &lo);
	build(&r, model, &lr);
	pipe_opts(&o, pg, level_of(lv), world, micro, sched_of(sched));
	o.pipeline_balance = strcmp(balance, "memory") == 0 ? LOOM_BALANCE_MEMORY : LOOM_BALANCE_TIME;
	worker_opts(&ro, NULL, level_of(lv), 0.05, 0.9);
	if ((st = loom_compile(m.g, m.loss, &o, &m.p)))
		return worker_fail("compile (pipeline)", st, loom_last_error());
	if ((st = loom_compile(r.g, r.loss, &ro, &r.p)))
		return worker_fail("compile (one process)", st, loom_last_error());
	double worst_loss = 0;
	for (int s = 0; s < STEPS; s++) {
		if ((st = feed_rows(m.p, m.width, (long)s * micro * B, micro * B)) ||
		    (st = loom_run(m.p, LOOM_RUN_TRAIN)))
			return worker_fail("step (pipeline)", st, loom_program_error(m.p));
		/* the reference's loss: the mean of its micro-batches' */
		double sum = 0;
		for (int j = 0; j < micro; j++) {
			if ((st = feed_rows(r.p, r.width, (long)s * micro * B + j * B, B)) ||
			    (st = loom_run(r.p, j < micro - 1 ? LOOM_RUN_ACCUMULATE : LOOM_RUN_TRAIN)))
				return worker_fail("step (one process)", st, loom_program_error(r.p));
			sum += loom_loss(r.p);
		}
		double d = fabs(loom_loss(m.p) - sum / micro);
		if (d > worst_loss)
			worst_loss = d;
	}
	/* Parameters: read from the stage that owns each (collective). */
	uint64_t hm = worker_param_hash(&m), hr = worker_param_hash(&r);
	double rel = worker_param_rel_diff(&m, &r);
	int moved = loom_step_count(m.p) == loom_step_count(r.p) && loom_step_count(r.p) > 10;
	int ok = hm == hr && moved && worst_loss <= 1e-6;
	printf("rank %d: %s equiv %s %s %s M %d world %d%s: %s to one process accumulating (max "
	       "relative difference %.3g, loss %.3g apart), step %lld\n",
	       rank, ok ? "OK" : "WRONG", model, lv, sched, micro, world,
	       o.pipeline_balance == LOOM_BALANCE_MEMORY ? " memory cut" : "",
	       hm == hr ? "bit-identical" : "DIFFERENT", rel, worst_loss,
	       (long long)loom_step_count(r.p));
	loom_program_free(m.p);
	loom_program_free(r.p);
	loom_graph_free(m.g);
	loom_graph_free(r.g);
	return ok ? 0 : 1;
}

/* 2 stages x (world / 2) replicas against one process accumulating every
 * replica's micro-batches: the same mean gradient, summed in another order
 * (each stage's buckets all-reduced among its replicas), so equal to
 * rounding: bounded at 1e-6 relative, after `steps` steps. (imb at one
 * thread stays within 1.2e-7 for 17 steps, then a rounding difference
 * flips a max pool's choice and the runs part by 1e-3: it runs 12.) */
static int dpequiv(loom_pg *pg, const char *model, int micro, const char *balance, int steps)
{
	worker_model m, r;
	loom_value lo, lr;
	loom_compile_opts o, ro;
	loom_status st;
	int S = 2, reps = world / S, rep = rank / S;
	build(&m, model, &lo);
	build(&r, model, &lr);
	pipe_opts(&o, pg, LOOM_O0, S, micro, LOOM_SCHEDULE_1F1B);
	o.pipeline_balance = strcmp(balance, "memory") == 0 ? LOOM_BALANCE_MEMORY : LOOM_BALANCE_TIME;
	o.optim.momentum = 0;
	worker_opts(&ro, NULL, LOOM_O0, 0.05, 0);
	if ((st = loom_compile(m.g, m.loss, &o, &m.p)))
		return worker_fail("compile (pipeline)", st, loom_last_error());
	if ((st = loom_compile(r.g, r.loss, &ro, &r.p)))
		return worker_fail("compile (one process)", st, loom_last_error());
	int all = micro * reps;
	for (int s = 0; s < steps; s++) {
		long base = (long)s * all * B;
		if ((st = feed_rows(m.p, m.width, base + (long)rep * micro * B, micro * B)) ||
		    (st = loom_run(m.p, LOOM_RUN_TRAIN)))
			return worker_fail("step (pipeline)", st, loom_program_error(m.p));
		for (int j = 0; j < all; j++)
			if ((st = feed_rows(r.p, r.width, base + (long)j * B, B)) ||
			    (st = loom_run(r.p, j < all - 1 ? LOOM_RUN_ACCUMULATE : LOOM_RUN_TRAIN)))
				return worker_fail("step (one process)", st, loom_program_error(r.p));
	}
	double rel = worker_param_rel_diff(&m, &r);
	int ok = rel <= 1e-6 && loom_step_count(r.p) == steps;
	printf("rank %d: %s dpequiv %s M %d stages 2 replicas %d%s: max relative difference %.3g "
	       "to one process at the global batch after %d steps\n", rank, ok ? "OK" : "WRONG", model,
	       micro, reps, o.pipeline_balance == LOOM_BALANCE_MEMORY ? " memory cut" : "", rel, steps);
	loom_program_free(m.p);
	loom_program_free(r.p);
	loom_graph_free(m.g);
	loom_graph_free(r.g);
	return ok ? 0 : 1;
}

/* Loss scaling across the stages (O2): step 3's second micro-batch has an
 * input of 1e30 (inf in f16), so the gradients overflow; every rank skips
 * that step and halves the scale, the same. */
static int overflow(loom_pg *pg)
{
	worker_model m;
	loom_value lo;
	loom_compile_opts o;
	mlp3(&m, 32, &lo);
	pipe_opts(&o, pg, LOOM_O2, world, 2, LOOM_SCHEDULE_1F1B);
	loom_status st = loom_compile(m.g, m.loss, &o, &m.p);
	if (st)
		return worker_fail("compile", st, loom_last_error());
	for (int s = 0; s < 5; s++)
		if ((st = feed_poisoned(m.p, m.width, s * 2L * B, 2 * B, s == 2 ? B : -1, 1e30f)) ||
		    (st = loom_run(m.p, LOOM_RUN_TRAIN)))
			return worker_fail("step", st, loom_program_error(m.p));
	loom_program_info in;
	loom_program_info_get(m.p, &in);
	double mine[3] = { (double)in.skipped_steps, in.loss_scale, (double)loom_step_count(m.p) };
	int same = worker_same_everywhere(pg, loom_comm_hash(mine, sizeof(mine), 0)) == 1;
	int ok = same && in.skipped_steps == 1 && in.loss_scale == 32768.0 && loom_step_count(m.p) == 4;
	printf("rank %d: %s overflow: skipped %lld steps %lld scale %g, the same on every rank %d\n",
	       rank, ok ? "OK" : "WRONG", (long long)in.skipped_steps,
	       (long long)loom_step_count(m.p), in.loss_scale, same);
	drop(&m);
	return ok ? 0 : 1;
}

/* Rank 1 builds a wider hidden layer: compile fails everywhere. */
static int mismatch(loom_pg *pg)
{
	worker_model m;
	loom_value lo;
	loom_compile_opts o;
	mlp3(&m, rank == 1 ? 33 : 32, &lo);
	pipe_opts(&o, pg, LOOM_O0, world, 2, LOOM_SCHEDULE_1F1B);
	loom_status st = loom_compile(m.g, m.loss, &o, &m.p);
	printf("rank %d: %s mismatch: %s: %s\n", rank, st == LOOM_ERR_MISMATCH ? "OK" : "WRONG",
	       loom_status_string(st), loom_last_error());
	drop(&m);
	return st == LOOM_ERR_MISMATCH ? 0 : 1;
}

/* The last stage's rank dies after compiling: the others end with an error
 * naming its rank and stage ("rank 1 (pipeline stage 1) died") within the
 * timeout. */
static int kill_last(loom_pg *pg)
{
	worker_model m;
	loom_value lo;
	loom_compile_opts o;
	mlp3(&m, 32, &lo);
	pipe_opts(&o, pg, LOOM_O0, world, 2, LOOM_SCHEDULE_1F1B);
	loom_status st = loom_compile(m.g, m.loss, &o, &m.p);
	if (st)
		return worker_fail("compile", st, loom_last_error());
	if (rank == world - 1) {
		fflush(stdout);
		raise(SIGKILL);
	}
	st = LOOM_OK;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int s = 0; s < 3 && st == LOOM_OK; s++)
		if ((st = feed_rows(m.p, m.width, s * 2L * B, 2 * B)) == LOOM_OK)
			st = loom_run(m.p, LOOM_RUN_TRAIN);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	/* test_pipe.sh compares the seconds with the group's timeout */
	printf("rank %d: %s kill: after %.1f s: %s: %s\n", rank, st != LOOM_OK ? "OK" : "WRONG",
	       (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec),
	       loom_status_string(st), loom_program_error(m.p));
	fflush(stdout);
	/* MPI cannot finalise with a dead peer */
	_exit(st != LOOM_OK ? 0 : 1);
}

/* The planner's activation slots: 1F1B holds at most S - stage
 * micro-batches, GPipe all M. */
static int memory(loom_pg *pg, int micro)
{
	size_t act[2];
	for (int k = 0; k < 2; k++) {
		worker_model m;
		loom_value lo;
		loom_compile_opts o;
		build(&m, "cnn", &lo);
		pipe_opts(&o, pg, LOOM_O0, world, micro, k ? LOOM_SCHEDULE_GPIPE : LOOM_SCHEDULE_1F1B);
		o.memory_report = 1;
		loom_status st = loom_compile(m.g, m.loss, &o, &m.p);
		if (st)
			return worker_fail("compile", st, loom_last_error());
		loom_program_info in;
		loom_program_info_get(m.p, &in);
		act[k] = in.activation_bytes;
		loom_program_free(m.p);
		loom_graph_free(m.g);
	}
	int stage = rank % world, in_flight = world - stage < micro ? world - stage : micro;
	/* 1F1B / GPipe = in flight / M exactly (the same slot size) */
	int ok = act[0] * (size_t)micro == act[1] * (size_t)in_flight && act[0] > 0 &&
		 act[0] * (size_t)micro <= act[1] * (size_t)world;
	printf("rank %d: %s memory M %d stage %d: 1f1b %zu bytes, gpipe %zu bytes (ratio %.3f, "
	       "stages/M %.3f)\n", rank, ok ? "OK" : "WRONG", micro, stage, act[0], act[1],
	       (double)act[0] / (double)act[1], (double)world / micro);
	return ok ? 0 : 1;
}

/* Per-stage memory (O2, AdamW, the MLP at S = world stages): each rank's
 * planned parameter, gradient, fp32 master and optimizer-state bytes are
 * its stage's, below one process's, and the stages' sum is one process's
 * to the byte (the state is laid out per slot, 64-byte aligned, as one
 * process lays it out; the rest are the values' own sizes). */
static int pstate(loom_pg *pg)
{
	double fig[2][4];
	size_t persist[2];
	for (int k = 0; k < 2; k++) {
		worker_model m;
		loom_value lo;
		loom_compile_opts o;
		mlp3(&m, 32, &lo);
		if (k)
			pipe_opts(&o, pg, LOOM_O2, world, 2, LOOM_SCHEDULE_1F1B);
		else
			worker_opts(&o, NULL, LOOM_O2, 0.05, 0.9);
		o.optim.kind = LOOM_OPTIM_ADAMW;
		o.memory_report = k;
		loom_status st = loom_compile(m.g, m.loss, &o, &m.p);
		if (st)
			return worker_fail("compile", st, loom_last_error());
		loom_program_info in;
		loom_program_info_get(m.p, &in);
		fig[k][0] = (double)in.param_bytes;
		fig[k][1] = (double)in.grad_bytes;
		fig[k][2] = (double)in.master_bytes;
		fig[k][3] = (double)in.optim_state_bytes;
		persist[k] = in.param_bytes + in.grad_bytes + in.master_bytes + in.optim_state_bytes;
		drop(&m);
	}
	double sum[4] = { fig[1][0], fig[1][1], fig[1][2], fig[1][3] };
	if (loom_comm_allreduce(loom_pg_comm(pg, LOOM_COMM_HOST), sum, 4, LOOM_F64) != LOOM_OK)
		return worker_fail("allreduce", LOOM_ERR_BACKEND, "the stages' sums");
	int ok = persist[1] > 0 && persist[1] < persist[0];
	for (int i = 0; i < 4; i++)
		ok &= sum[i] == fig[0][i];
	printf("rank %d: %s pstate stages %d stage %d: params %.0f grads %.0f masters %.0f state "
	       "%.0f = %zu bytes of one process's %zu (%.3f); the stages' sums %.0f %.0f %.0f %.0f, "
	       "one process %.0f %.0f %.0f %.0f\n",
	       rank, ok ? "OK" : "WRONG", world, rank % world, fig[1][0], fig[1][1], fig[1][2],
	       fig[1][3], persist[1], persist[0], (double)persist[1] / (double)persist[0], sum[0],
	       sum[1], sum[2], sum[3], fig[0][0], fig[0][1], fig[0][2], fig[0][3]);
	return ok ? 0 : 1;
}

/* A user's cut: after the first relu, on an MLP; stage 0 then holds l1
 * only, though the memory balance is asked for (marks win; the stage
 * table says the cut is the marks'). Checked by training: equal to one
 * process as without a mark. */
static int cut(loom_pg *pg)
{
	worker_model m, r;
	loom_value lo, lr;
	loom_compile_opts o, ro;
	mlp3(&m, 32, &lo);
	/* the first relu is node: x, w, b, linear, relu -> value 4 */
	loom_stage_boundary(m.g, 4);
	build(&r, "mlp", &lr);
	pipe_opts(&o, pg, LOOM_O0, world, 2, LOOM_SCHEDULE_1F1B);
	o.pipeline_balance = LOOM_BALANCE_MEMORY;
	worker_opts(&ro, NULL, LOOM_O0, 0.05, 0.9);
	loom_status st = loom_compile(m.g, m.loss, &o, &m.p);
	if (st)
		return worker_fail("compile (cut)", st, loom_last_error());
	if ((st = loom_compile(r.g, r.loss, &ro, &r.p)))
		return worker_fail("compile (one process)", st, loom_last_error());
	for (int s = 0; s < 5; s++) {
		if ((st = feed_rows(m.p, m.width, s * 2L * B, 2 * B)) || (st = loom_run(m.p, LOOM_RUN_TRAIN)))
			return worker_fail("step", st, loom_program_error(m.p));
		if ((st = reference_step(&r, r.width, s, 2)))
			return worker_fail("step (one process)", st, loom_program_error(r.p));
	}
	/* two marks for two stages: refused, naming the count */
	worker_model bad;
	loom_value lb;
	mlp3(&bad, 32, &lb);
	loom_stage_boundary(bad.g, 4);
	loom_stage_boundary(bad.g, 7);
	loom_program *bp = NULL;
	st = loom_compile(bad.g, bad.loss, &o, &bp);
	int refused = st == LOOM_ERR_INVALID && strstr(loom_last_error(), "2 values marked");
	int same = worker_param_hash(&m) == worker_param_hash(&r);
	printf("rank %d: %s cut: %s to one process; two marks: %s\n", rank,
	       same && refused ? "OK" : "WRONG", same ? "bit-identical" : "DIFFERENT",
	       loom_last_error());
	loom_program_free(bp);
	loom_graph_free(bad.g);
	loom_program_free(m.p);
	loom_program_free(r.p);
	loom_graph_free(m.g);
	loom_graph_free(r.g);
	return same && refused ? 0 : 1;
}

/* EVAL through the stages: the logits of every micro-batch, on every rank,
 * equal one process's EVAL micro-batch by micro-batch. */
static int eval(loom_pg *pg, int micro)
{
	worker_model m, r;
	loom_value lo, lr;
	loom_compile_opts o, ro;
	build(&m, "mlp", &lo);
	build(&r, "mlp", &lr);
	pipe_opts(&o, pg, LOOM_O0, world, micro, LOOM_SCHEDULE_1F1B);
	worker_opts(&ro, NULL, LOOM_O0, 0.05, 0.9);
	loom_status st = loom_compile(m.g, m.loss, &o, &m.p);
	if (st || (st = loom_compile(r.g, r.loss, &ro, &r.p)))
		return worker_fail("compile", st, loom_last_error());
	for (int s = 0; s < 3; s++) {
		if ((st = feed_rows(m.p, m.width, s * (long)micro * B, micro * B)) ||
		    (st = loom_run(m.p, LOOM_RUN_TRAIN)))
			return worker_fail("step", st, loom_program_error(m.p));
		if ((st = reference_step(&r, r.width, s, micro)))
			return worker_fail("step (one process)", st, loom_program_error(r.p));
	}
	size_t n = (size_t)micro * B * WORKER_CLASSES;
	double *a = malloc(sizeof(double) * n), *b = malloc(sizeof(double) * n);
	if ((st = feed_rows(m.p, m.width, 1000, micro * B)) || (st = loom_run(m.p, LOOM_RUN_EVAL)) ||
	    (st = loom_read_f64(m.p, lo, a, n)))
		return worker_fail("eval", st, loom_program_error(m.p));
	double loss = 0;
	for (int j = 0; j < micro; j++) {
		if ((st = feed_rows(r.p, r.width, 1000 + j * B, B)) || (st = loom_run(r.p, LOOM_RUN_EVAL)) ||
		    (st = loom_read_f64(r.p, lr, b + (size_t)j * B * WORKER_CLASSES, B * WORKER_CLASSES)))
			return worker_fail("eval (one process)", st, loom_program_error(r.p));
		loss += loom_loss(r.p) / micro;
	}
	int same = memcmp(a, b, sizeof(double) * n) == 0 && fabs(loom_loss(m.p) - loss) <= 1e-6;
	printf("rank %d: %s eval M %d: logits of %zu values %s, loss %.6f vs %.6f\n", rank,
	       same ? "OK" : "WRONG", micro, n, same ? "bit-identical" : "DIFFERENT",
	       loom_loss(m.p), loss);
	free(a);
	free(b);
	loom_program_free(m.p);
	loom_program_free(r.p);
	loom_graph_free(m.g);
	loom_graph_free(r.g);
	return same ? 0 : 1;
}

/* Checkpoints: `psave PATH K STAGES` trains K steps (2 micro-batches; STAGES
 * 1: plain data parallelism over the world) and saves (every rank calls
 * loom_save; rank 0 writes); `pload PATH STAGES` loads and prints the
 * parameters' hash and step, the same on every rank. */
static int ckpt(loom_pg *pg, int save, const char *path, int k, int stages)
{
	worker_model m;
	loom_value lo;
	loom_compile_opts o;
	mlp3(&m, 32, &lo);
	if (stages > 1)
		pipe_opts(&o, pg, LOOM_O2, stages, 2, LOOM_SCHEDULE_1F1B);
	else
		worker_opts(&o, pg, LOOM_O2, 0.05, 0.9);
	o.optim.kind = LOOM_OPTIM_ADAMW;
	o.optim.lr = 1e-3;
	loom_status st = loom_compile(m.g, m.loss, &o, &m.p);
	if (st)
		return worker_fail("compile", st, loom_last_error());
	if (!save && (st = loom_load(m.p, path)))
		return worker_fail("load", st, loom_program_error(m.p));
	int rows = stages > 1 ? 2 * B : B;
	for (int s = 0; save && s < k; s++)
		if ((st = feed_rows(m.p, m.width, (long)s * 2 * B, rows)) ||
		    (st = loom_run(m.p, LOOM_RUN_TRAIN)))
			return worker_fail("step", st, loom_program_error(m.p));
	if (save && (st = loom_save(m.p, path)))
		return worker_fail("save", st, loom_program_error(m.p));
	uint64_t h = worker_param_hash(&m);
	/* and it trains on from there */
	if ((st = feed_rows(m.p, m.width, 500, rows)) || (st = loom_run(m.p, LOOM_RUN_TRAIN)))
		return worker_fail("step after", st, loom_program_error(m.p));
	printf("rank %d: OK %s stages %d world %d step %lld hash %016llx\n", rank,
	       save ? "psave" : "pload", stages, world, (long long)loom_step_count(m.p) - 1,
	       (unsigned long long)h);
	drop(&m);
	return 0;
}

/* The library's lines (loom_set_log), kept to read the planned peaks. */
static char logbuf[1 << 16];
static size_t loglen;

static void keep_log(void *user, const char *msg)
{
	size_t n = strlen(msg);
	(void)user;
	if (loglen + n < sizeof(logbuf)) {
		memcpy(logbuf + loglen, msg, n + 1);
		loglen += n;
	}
	fputs(msg, stderr);
}

/* One cut of imb: every stage's planned peak as its own rank reports it
 * (--memory-report, gathered), and as the start-up table gives it (rank
 * 0's, broadcast); the largest of the ranks' and its stage. */
typedef struct cut_fig {
	double rank_mib[8], table_mib[8];
	double largest;
	int stage;
	loom_status st;
	char err[512];
} cut_fig;

static int compile_cut(loom_pg *pg, int sched, int micro, int balance, double limit, cut_fig *f,
		       worker_model *keep)
{
	worker_model m;
	loom_value lo;
	loom_compile_opts o;
	memset(f, 0, sizeof(*f));
	imb(&m, &lo);
	pipe_opts(&o, pg, LOOM_O0, world, micro, sched);
	o.pipeline_balance = balance;
	o.memory_limit_mb = limit;
	o.memory_report = 1;
	loglen = 0;
	logbuf[0] = 0;
	loom_set_log(keep_log, NULL);
	f->st = loom_compile(m.g, m.loss, &o, &m.p);
	loom_set_log(NULL, NULL);
	snprintf(f->err, sizeof(f->err), "%s", f->st ? loom_last_error() : "");
	if (f->st == LOOM_OK) {
		const char *r = strstr(logbuf, "planned peak ");
		const char *mine = strstr(logbuf, "): planned peak ");
		if (mine)
			f->rank_mib[rank] = atof(mine + strlen("): planned peak "));
		for (int k = 0; rank == 0 && k < world && k < 8; k++) {
			char key[32];
			snprintf(key, sizeof(key), "stage %d: ", k);
			const char *t = strstr(logbuf, key);
			if (t && (r = strstr(t, "planned peak ")))
				f->table_mib[k] = atof(r + strlen("planned peak "));
		}
	}
	struct loom_comm *host = loom_pg_comm(pg, LOOM_COMM_HOST);
	if (loom_comm_allreduce(host, f->rank_mib, 8, LOOM_F64) != LOOM_OK ||
	    loom_comm_allreduce(host, f->table_mib, 8, LOOM_F64) != LOOM_OK)
		return worker_fail("allreduce", LOOM_ERR_BACKEND, "the stages' peaks");
	for (int k = 0; k < world && k < 8; k++)
		if (k == 0 || f->rank_mib[k] > f->largest) {
			f->largest = f->rank_mib[k];
			f->stage = k;
		}
	if (keep)
		*keep = m;
	else
		drop(&m);
	return 0;
}

/* Whether the table's peak of every stage is its rank's own planned peak. */
static int table_is_ranks(const cut_fig *f)
{
	for (int k = 0; k < world && k < 8; k++)
		if (f->table_mib[k] != f->rank_mib[k] || f->rank_mib[k] <= 0)
			return 0;
	return 1;
}

/* imb at S = world stages: the memory-balanced cut's largest planned peak
 * is no larger than the time-balanced cut's, and smaller (the time cut
 * leaves the linear layers on the last stage); the start-up table's peaks
 * are the ranks' own. */
static int balance(loom_pg *pg, const char *sched, int micro)
{
	cut_fig t, m;
	if (compile_cut(pg, sched_of(sched), micro, LOOM_BALANCE_TIME, 0, &t, NULL) ||
	    compile_cut(pg, sched_of(sched), micro, LOOM_BALANCE_MEMORY, 0, &m, NULL))
		return 1;
	if (t.st || m.st)
		return worker_fail("compile", t.st ? t.st : m.st, t.st ? t.err : m.err);
	int ok = m.largest < t.largest && table_is_ranks(&t) && table_is_ranks(&m);
	printf("rank %d: %s balance %s M %d stages %d: largest planned peak: time cut %.2f MiB "
	       "(stage %d), memory cut %.2f MiB (stage %d); stages (time / memory):", rank,
	       ok ? "OK" : "WRONG", sched, micro, world, t.largest, t.stage, m.largest, m.stage);
	for (int k = 0; k < world && k < 8; k++)
		printf(" %.2f/%.2f", t.rank_mib[k], m.rank_mib[k]);
	printf("; the table's are the ranks' own: %s\n",
	       table_is_ranks(&t) && table_is_ranks(&m) ? "yes" : "NO");
	return ok ? 0 : 1;
}

/* A memory limit between the two cuts' largest peaks: the time cut would
 * be refused, the compile takes the memory cut (one line says so) and
 * trains as one process accumulating; a limit below both is refused on
 * every rank, naming both cuts' largest stages and peaks. */
static int fallback(loom_pg *pg, int micro)
{
	cut_fig t, m, f, no;
	worker_model fm, r;
	loom_value lr;
	loom_compile_opts ro;
	loom_status st;
	if (compile_cut(pg, LOOM_SCHEDULE_1F1B, micro, LOOM_BALANCE_TIME, 0, &t, NULL) ||
	    compile_cut(pg, LOOM_SCHEDULE_1F1B, micro, LOOM_BALANCE_MEMORY, 0, &m, NULL))
		return 1;
	if (t.st || m.st)
		return worker_fail("compile", t.st ? t.st : m.st, t.st ? t.err : m.err);
	double limit = (t.largest + m.largest) / 2;
	if (compile_cut(pg, LOOM_SCHEDULE_1F1B, micro, LOOM_BALANCE_TIME, limit, &f, &fm))
		return 1;
	if (f.st)
		return worker_fail("compile under the limit", f.st, f.err);
	int said = rank != 0 || strstr(logbuf, "loom: pipeline: the memory-balanced cut, since the "
					       "time-balanced cut's stage") != NULL;
	build(&r, "imb", &lr);
	worker_opts(&ro, NULL, LOOM_O0, 0.05, 0.9);
	if ((st = loom_compile(r.g, r.loss, &ro, &r.p)))
		return worker_fail("compile (one process)", st, loom_last_error());
	for (int s = 0; s < 5; s++) {
		if ((st = feed_rows(fm.p, fm.width, s * (long)micro * B, micro * B)) ||
		    (st = loom_run(fm.p, LOOM_RUN_TRAIN)))
			return worker_fail("step", st, loom_program_error(fm.p));
		if ((st = reference_step(&r, r.width, s, micro)))
			return worker_fail("step (one process)", st, loom_program_error(r.p));
	}
	int same = worker_param_hash(&fm) == worker_param_hash(&r);
	drop(&fm);
	drop(&r);
	/* below both: every rank refuses, naming both */
	double low = m.largest * 0.9;
	if (compile_cut(pg, LOOM_SCHEDULE_1F1B, micro, LOOM_BALANCE_TIME, low, &no, NULL))
		return 1;
	char want[256];
	snprintf(want, sizeof(want), "the time-balanced cut's stage %d plans %.2f MiB, the "
		 "memory-balanced cut's stage %d %.2f MiB", t.stage, t.largest, m.stage, m.largest);
	int refused = no.st == LOOM_ERR_NOMEM && strstr(no.err, want) != NULL;
	int ok = f.largest == m.largest && said && same && refused && limit < t.largest;
	printf("rank %d: %s fallback M %d: limit %.2f MiB: the time cut's largest %.2f MiB over it, "
	       "the memory cut's %.2f MiB used (%.2f; said %d), %s to one process; limit %.2f: %s\n",
	       rank, ok ? "OK" : "WRONG", micro, limit, t.largest, m.largest, f.largest, said,
	       same ? "bit-identical" : "DIFFERENT", low, no.st ? no.err : "NOT REFUSED");
	return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
	loom_pg *pg = NULL;
	int lrc = loom_launch_maybe(&argc, argv);
	if (lrc >= 0)
		return lrc;
	if (argc < 2) {
		fprintf(stderr, "usage: pipe_worker equiv|mismatch|kill|memory|cut|eval|balance|"
			"fallback ...\n");
		return 2;
	}
	if (worker_init(&pg, &rank, &world))
		return 1;
	int rc;
	const char *mode = argv[1];
	if (strcmp(mode, "equiv") == 0 && argc >= 6)
		rc = equiv(pg, argv[2], argv[3], argv[4], atoi(argv[5]), argc >= 7 ? argv[6] : "time");
	else if (strcmp(mode, "balance") == 0 && argc >= 4)
		rc = balance(pg, argv[2], atoi(argv[3]));
	else if (strcmp(mode, "fallback") == 0 && argc >= 3)
		rc = fallback(pg, atoi(argv[2]));
	else if (strcmp(mode, "dpequiv") == 0 && argc >= 4)
		rc = dpequiv(pg, argv[2], atoi(argv[3]), argc >= 5 ? argv[4] : "time",
			     argc >= 6 ? atoi(argv[5]) : STEPS);
	else if (strcmp(mode, "overflow") == 0)
		rc = overflow(pg);
	else if (strcmp(mode, "mismatch") == 0)
		rc = mismatch(pg);
	else if (strcmp(mode, "kill") == 0)
		rc = kill_last(pg);
	else if (strcmp(mode, "memory") == 0 && argc >= 3)
		rc = memory(pg, atoi(argv[2]));
	else if (strcmp(mode, "cut") == 0)
		rc = cut(pg);
	else if (strcmp(mode, "pstate") == 0)
		rc = pstate(pg);
	else if (strcmp(mode, "psave") == 0 && argc >= 5)
		rc = ckpt(pg, 1, argv[2], atoi(argv[3]), atoi(argv[4]));
	else if (strcmp(mode, "pload") == 0 && argc >= 4)
		rc = ckpt(pg, 0, argv[2], 0, atoi(argv[3]));
	else if (strcmp(mode, "eval") == 0 && argc >= 3)
		rc = eval(pg, atoi(argv[2]));
	else {
		fprintf(stderr, "pipe_worker: unknown mode or missing arguments: %s\n", mode);
		rc = 2;
	}
	loom_pg_free(pg);
	return rc;
}
