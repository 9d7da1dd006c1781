/*
 * tests/engine/test_exec.c — the step list and the one executor, through a
 * recording backend (the CPU backend's table with its step methods counted):
 * each step kind a single process has (node, accumulation, optimizer) runs
 * when and as often as the list says, the list is what --dump-graph shows,
 * a backend that refuses a node is refused at compile naming the node with
 * its dtypes and shapes, and a trace records spans on a backend that is not
 * the CPU's table. Collective, wait and copy steps need ranks: tests/ddp
 * (the zero and zsteps cases).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "engine/program_internal.h"
#include "loom.h"

static struct {
	int nodes, accum_add, accum_fold, optim, optim_first, optim_last, optim_finite, begins;
	loom_op refuse; /* supports_node says no to this op (LOOM_OP_COUNT: none) */
} rec;

static loom_status rec_run_node(void *ctx, const loom_plan *pl, const loom_arena *a, loom_value v)
{
	rec.nodes++;
	return loom_cpu_backend.run_node(ctx, pl, a, v);
}

static loom_status rec_accum(void *ctx, const loom_plan *pl, const loom_arena *a, int s, int fold)
{
	if (fold)
		rec.accum_fold++;
	else
		rec.accum_add++;
	return loom_cpu_backend.accum(ctx, pl, a, s, fold);
}

static loom_status rec_optim(void *ctx, const loom_plan *pl, const loom_arena *a,
			     loom_train_state *ts, int first, int last, int finite)
{
	rec.optim++;
	rec.optim_first = first;
	rec.optim_last = last;
	rec.optim_finite = finite;
	return loom_cpu_backend.optim(ctx, pl, a, ts, first, last, finite);
}

static loom_status rec_run_begin(void *ctx, const loom_plan *pl, const loom_arena *a,
				 loom_train_state *ts, unsigned flags)
{
	rec.begins++;
	return loom_cpu_backend.run_begin(ctx, pl, a, ts, flags);
}

static int rec_supports_node(void *ctx, const loom_plan *pl, loom_value v)
{
	return pl->g->nodes[v].op != rec.refuse && loom_cpu_backend.supports_node(ctx, pl, v);
}

static loom_backend rec_backend;

static void setup(void)
{
	memset(&rec, 0, sizeof(rec));
	rec.refuse = LOOM_OP_COUNT;
	rec_backend = loom_cpu_backend;
	rec_backend.name = "recording";
	rec_backend.run_node = rec_run_node;
	rec_backend.accum = rec_accum;
	rec_backend.optim = rec_optim;
	rec_backend.run_begin = rec_run_begin;
	rec_backend.supports_node = rec_supports_node;
	loom_test_backend = &rec_backend;
}

static void teardown(void)
{
	loom_test_backend = NULL;
}

/* x [6, 4] -> linear 4->8 -> relu -> linear 8->3 -> CE with y. */
static loom_program *compile_mlp(loom_graph **gp, loom_optim_kind kind)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t xd[2] = { 6, 4 }, yd[1] = { 6 };
	loom_value x = loom_input(g, "x", LOOM_F32, 2, xd);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	loom_value h = loom_relu(g, loom_layer_linear(g, "fc1", x, 8, 1));
	loom_value loss = loom_softmax_cross_entropy(g, loom_layer_linear(g, "fc2", h, 3, 1), y);
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim.kind = kind;
	o.optim.lr = 0.1;
	loom_program *p;
	loom_status st = loom_compile(g, loss, &o, &p);
	*gp = g;
	if (st != LOOM_OK) {
		loom_program_free(p);
		return NULL;
	}
	float xv[24];
	int32_t yv[6] = { 0, 1, 2, 0, 1, 2 };
	for (int i = 0; i < 24; i++)
		xv[i] = (float)((i * 7) % 11) / 11.0f - 0.5f;
	cr_assert_eq(loom_set_input(p, "x", xv, LOOM_F32, 24), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "y", yv, LOOM_I32, 6), LOOM_OK);
	return p;
}

static int count_kind(const loom_plan *pl, loom_step_kind k, int first, int last)
{
	int n = 0;
	for (int i = first; i < last; i++)
		n += pl->steps[i].kind == k;
	return n;
}

/* Nodes a run of steps [0, last) computes: every node step that is not a
 * leaf or view, and the siblings each makes. */
static int computing_nodes(const loom_plan *pl, int last)
{
	int n = 0;
	for (int i = 0; i < last; i++) {
		const loom_step *s = &pl->steps[i];
		if (s->kind != LOOM_STEP_NODE)
			continue;
		n += !s->noop;
		for (loom_value w = loom_sibling_first(pl, s->v); w != LOOM_NONE;
		     w = loom_sibling_next(pl, w))
			n++;
	}
	return n;
}

TestSuite(exec, .init = setup, .fini = teardown);

Test(exec, the_step_list_of_a_plain_plan)
{
	loom_graph *g;
	loom_program *p = compile_mlp(&g, LOOM_OPTIM_SGD);
	cr_assert_not_null(p, "%s", loom_last_error());
	const loom_plan *pl = &p->plan;
	cr_assert_gt(pl->n_fwd_steps, 0);
	cr_assert_lt(pl->n_fwd_steps, pl->n_grad_steps);
	/* Forward and backward are node steps, then one accumulation step per
	 * gradient (no buckets), then the optimizer over every slot. */
	cr_assert_eq(count_kind(pl, LOOM_STEP_NODE, 0, pl->n_fwd_steps), pl->n_fwd_steps);
	cr_assert_eq(count_kind(pl, LOOM_STEP_ACCUM, 0, pl->n_grad_steps), pl->n_params);
	cr_assert_eq(pl->n_steps, pl->n_grad_steps + 1);
	const loom_step *o = &pl->steps[pl->n_steps - 1];
	cr_assert_eq(o->kind, LOOM_STEP_OPTIM);
	cr_assert_eq(o->phase, LOOM_PHASE_OPTIMIZER);
	cr_assert_eq(o->first, 0);
	cr_assert_eq(o->last, pl->n_pieces);
	cr_assert_eq(pl->n_pieces, pl->n_params);
	cr_assert_eq(count_kind(pl, LOOM_STEP_COLLECTIVE, 0, pl->n_steps), 0);
	for (int i = 0; i < pl->n_steps; i++)
		cr_assert_eq(pl->steps[i].stream, LOOM_STREAM_COMPUTE);
	loom_program_free(p);
	loom_graph_free(g);
}

Test(exec, node_steps_run_each_node_once_per_run)
{
	loom_graph *g;
	loom_program *p = compile_mlp(&g, LOOM_OPTIM_SGD);
	cr_assert_not_null(p, "%s", loom_last_error());
	const loom_plan *pl = &p->plan;
	cr_assert_eq(loom_run(p, LOOM_RUN_EVAL), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(rec.nodes, computing_nodes(pl, pl->n_fwd_steps));
	rec.nodes = 0;
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(rec.nodes, computing_nodes(pl, pl->n_steps));
	cr_assert_gt(rec.nodes, computing_nodes(pl, pl->n_fwd_steps));
	cr_assert_eq(rec.begins, 2, "one run_begin per run");
	loom_program_free(p);
	loom_graph_free(g);
}

Test(exec, accumulation_steps_add_then_fold)
{
	loom_graph *g;
	loom_program *p = compile_mlp(&g, LOOM_OPTIM_SGD);
	cr_assert_not_null(p, "%s", loom_last_error());
	int n = p->plan.n_accum;
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK);
	cr_assert_eq(rec.accum_add + rec.accum_fold, 0, "no accumulation without ACCUMULATE");
	cr_assert_eq(loom_run(p, LOOM_RUN_ACCUMULATE), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_run(p, LOOM_RUN_ACCUMULATE), LOOM_OK);
	cr_assert_eq(rec.accum_add, 2 * n);
	cr_assert_eq(rec.accum_fold, 0);
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK);
	cr_assert_eq(rec.accum_fold, n, "the step after folds every sum once");
	loom_program_free(p);
	loom_graph_free(g);
}

Test(exec, the_optimizer_step_runs_in_train_runs_only)
{
	loom_graph *g;
	loom_program *p = compile_mlp(&g, LOOM_OPTIM_ADAMW);
	cr_assert_not_null(p, "%s", loom_last_error());
	cr_assert_eq(loom_run(p, LOOM_RUN_GRAD), LOOM_OK);
	cr_assert_eq(loom_run(p, LOOM_RUN_FORWARD), LOOM_OK);
	cr_assert_eq(rec.optim, 0);
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK);
	cr_assert_eq(rec.optim, 1);
	cr_assert_eq(rec.optim_first, 0);
	cr_assert_eq(rec.optim_last, p->plan.n_params);
	cr_assert_eq(rec.optim_finite, -1, "one process: the backend checks the gradients itself");
	cr_assert_eq(loom_step_count(p), 1);
	loom_program_free(p);
	loom_graph_free(g);
}

Test(exec, the_dump_lists_every_step)
{
	loom_graph *g;
	loom_program *p = compile_mlp(&g, LOOM_OPTIM_SGD);
	cr_assert_not_null(p, "%s", loom_last_error());
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	loom_program_dump(p, f);
	fclose(f);
	char head[64];
	snprintf(head, sizeof(head), "steps: %d (", p->plan.n_steps);
	cr_assert_not_null(strstr(buf, head), "%s", buf);
	cr_assert_not_null(strstr(buf, "optim      optimizer compute pieces [0, 4) of 4"), "%s", buf);
	cr_assert_not_null(strstr(buf, "accum      backward"), "%s", buf);
	cr_assert_not_null(strstr(buf, "(nothing to run)"), "leaves are marked: %s", buf);
	free(buf);
	loom_program_free(p);
	loom_graph_free(g);
}

Test(exec, a_refused_node_fails_the_compile_naming_it)
{
	loom_graph *g;
	rec.refuse = LOOM_OP_LINEAR;
	loom_program *p = compile_mlp(&g, LOOM_OPTIM_SGD);
	cr_assert_null(p);
	const char *msg = loom_last_error();
	cr_assert_not_null(strstr(msg, "does not run node"), "%s", msg);
	cr_assert_not_null(strstr(msg, "linear"), "%s", msg);
	cr_assert_not_null(strstr(msg, "f32 [6, 8]"), "its dtype and shape: %s", msg);
	cr_assert_not_null(strstr(msg, "from (f32 [6, 4], f32 [8, 4], f32 [8])"),
			   "its sources' dtypes and shapes: %s", msg);
	loom_graph_free(g);
}

Test(exec, a_trace_records_on_any_backend)
{
	loom_graph *g;
	loom_program *p = compile_mlp(&g, LOOM_OPTIM_SGD);
	cr_assert_not_null(p, "%s", loom_last_error());
	char path[] = "/tmp/loom_exec_trace_XXXXXX";
	int fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	close(fd);
	cr_assert_eq(loom_trace_start(p, path), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK);
	cr_assert_eq(loom_trace_stop(p), LOOM_OK, "%s", loom_program_error(p));
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f);
	char *buf = calloc(1, 1 << 20);
	size_t n = fread(buf, 1, (1 << 20) - 1, f);
	fclose(f);
	unlink(path);
	cr_assert_gt(n, 0);
	cr_assert_not_null(strstr(buf, "\"name\":\"linear"), "a node span: %.400s", buf);
	cr_assert_not_null(strstr(buf, "\"name\":\"optimizer\""), "the optimizer phase");
	cr_assert_not_null(strstr(buf, "\"backend\":\"cpu\""), "%.200s", buf);
	free(buf);
	loom_program_free(p);
	loom_graph_free(g);
}
