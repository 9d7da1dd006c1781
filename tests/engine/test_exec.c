/*
 * tests/engine/test_exec.c — the step list and the one executor, through a
 * recording backend (the CPU backend's table with its step methods counted),
 * one test per step kind: node, accumulation and optimizer steps run when
 * and as often as the list says; collective, wait and copy steps run on a
 * group of two ranks held in this one process (rank 0 is this test, the
 * other rank is a fake communicator whose sums and gathers the tests can
 * predict), as do the pipeline's send, receive and micro-batch steps (this
 * rank is stage 0 of two); ZeRO-3's all-gathers sit exactly the prefetch
 * depth of layers ahead of their first use. Also: the list is what --dump-graph shows, a
 * backend that refuses a node is refused at compile naming the node with its
 * dtypes and shapes, and a trace records spans on a backend that is not the
 * CPU's table; and the pass list is the compile pipeline: each pass left out
 * changes what a compile gives. The real multi-process runs are tests/ddp's.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "comm/comm_internal.h"
#include "parallel/pipeline.h"
#include "engine/pass.h"
#include "engine/program_internal.h"
#include "loom.h"
#include "tests/engine/fake_async.h"
#include "tests/engine/print_text.h"

static struct {
	int nodes, accum_add, accum_fold, optim, optim_first, optim_last, optim_finite, begins;
	loom_op refuse; /* supports_node says no to this op (LOOM_OP_COUNT: none) */
	/* With the fake group: collectives in flight while a node ran, and
	 * when the optimizer and each copy ran. */
	int nodes_overlapped, in_flight_at_optim, waited_at_optim;
	int copies, in_flight_at_copy;
} rec;

/* ------------------------------------------------------------ a group of two in one process */

/*
 * The host communicator of a group of `world` ranks in which this process
 * is rank `rank` and every other rank is played here. The other ranks run
 * the same program on the same data, so a sum is this rank's buffer times
 * the world; what the others contribute to an all-gather is a sentinel
 * (1000 + the element's index in the buffer), so that a test sees where
 * each element came from; what they send this rank is recv_fill. Each call
 * is logged, and its effect lands at wait(), as a real collective's lands
 * at some point before it: whatever the executor reads too early shows.
 */
enum { FK_ALLREDUCE, FK_REDUCE_SCATTER, FK_ALLGATHER, FK_SEND, FK_RECV };

typedef struct fk_call {
	int op;
	void *buf;
	size_t count; /* elements (collectives), bytes (send, receive) */
	loom_dtype dt;
	int peer, tag;
	int waited;
	void *sent; /* send: the bytes as they were at wait() */
	int nodes_at; /* the nodes the recording backend had run when it started */
	int restart_at; /* ... when its timeout was restarted (-1: never) */
} fk_call;

#define FK_MAX 256

static struct {
	fk_call calls[FK_MAX];
	int n, in_flight, recvs;
	float recv_fill[8]; /* the k-th receive's every f32 element */
} fk;

typedef struct fk_work {
	int call;
} fk_work;

static void fk_reset(void)
{
	for (int i = 0; i < fk.n; i++)
		free(fk.calls[i].sent);
	memset(&fk, 0, sizeof(fk));
}

static loom_status fk_start(loom_comm *c, int op, void *buf, size_t count, loom_dtype dt, int peer,
			    int tag, loom_comm_work **out)
{
	fk_work *w = malloc(sizeof(*w));
	if (!w || fk.n == FK_MAX) {
		free(w);
		return loom_comm_fail(c, LOOM_ERR_NOMEM, "fake: out of call slots");
	}
	fk.calls[fk.n] = (fk_call){ .op = op, .buf = buf, .count = count, .dt = dt, .peer = peer,
				    .tag = tag, .nodes_at = rec.nodes, .restart_at = -1 };
	w->call = fk.n++;
	fk.in_flight++;
	*out = (loom_comm_work *)w;
	return LOOM_OK;
}

static loom_status fk_allreduce_start(loom_comm *c, void *buf, size_t count, loom_dtype dt,
				      void *stream, loom_comm_work **out)
{
	(void)stream;
	return fk_start(c, FK_ALLREDUCE, buf, count, dt, -1, 0, out);
}

static loom_status fk_reduce_scatter_start(loom_comm *c, void *buf, size_t count, loom_dtype dt,
					   void *stream, loom_comm_work **out)
{
	(void)stream;
	return fk_start(c, FK_REDUCE_SCATTER, buf, count, dt, -1, 0, out);
}

/* Every rank holds what this one does: its shard to every rank's place
 * (as fake_comm_allgather), so that what a gather leaves is known. */
static loom_status fk_allgather_start(loom_comm *c, void *buf, size_t count, loom_dtype dt,
				      void *stream, loom_comm_work **out)
{
	(void)stream;
	size_t bytes = count * loom_dtype_size(dt);
	for (int r = 0; r < c->world; r++)
		if (r != c->rank)
			memmove((unsigned char *)buf + (size_t)r * bytes,
				(unsigned char *)buf + (size_t)c->rank * bytes, bytes);
	return fk_start(c, FK_ALLGATHER, buf, count, dt, -1, 0, out);
}

static loom_status fk_send_start(loom_comm *c, const void *buf, size_t bytes, int peer, int tag,
				 void *stream, loom_comm_work **out)
{
	(void)stream;
	return fk_start(c, FK_SEND, (void *)buf, bytes, LOOM_F32, peer, tag, out);
}

static loom_status fk_recv_start(loom_comm *c, void *buf, size_t bytes, int peer, int tag,
				 void *stream, loom_comm_work **out)
{
	(void)stream;
	return fk_start(c, FK_RECV, buf, bytes, LOOM_F32, peer, tag, out);
}

/* Elements [lo, hi) of an f32 or f64 buffer times k. */
static void fk_scale(void *buf, loom_dtype dt, size_t lo, size_t hi, double k)
{
	for (size_t e = lo; e < hi; e++)
		if (dt == LOOM_F64)
			((double *)buf)[e] *= k;
		else
			((float *)buf)[e] *= (float)k;
}

/* Nothing ends before wait(): the executor must wait for it. */
static loom_status fk_test(loom_comm *c, loom_comm_work *w, int *done)
{
	(void)c, (void)w;
	*done = 0;
	return LOOM_OK;
}

static loom_status fk_wait(loom_comm *c, loom_comm_work *work)
{
	fk_work *w = (fk_work *)work;
	fk_call *k = &fk.calls[w->call];
	size_t n = k->count;
	free(w);
	cr_assert(k->op == FK_SEND || k->op == FK_RECV || k->dt == LOOM_F32 || k->dt == LOOM_F64,
		  "the fake sums f32 and f64 only");
	switch (k->op) {
	case FK_ALLREDUCE:
		fk_scale(k->buf, k->dt, 0, n, c->world);
		break;
	case FK_REDUCE_SCATTER: /* this rank's shard holds every rank's */
		fk_scale(k->buf, k->dt, n * (size_t)c->rank, n * (size_t)(c->rank + 1), c->world);
		break;
	case FK_ALLGATHER:
		cr_assert_eq(k->dt, LOOM_F32);
		for (int r = 0; r < c->world; r++)
			for (size_t e = n * (size_t)r; r != c->rank && e < n * (size_t)(r + 1); e++)
				((float *)k->buf)[e] = 1000.0f + (float)e;
		break;
	case FK_SEND:
		k->sent = malloc(n ? n : 1);
		cr_assert_not_null(k->sent);
		memcpy(k->sent, k->buf, n);
		break;
	case FK_RECV:
		cr_assert_lt(fk.recvs, 8);
		for (size_t e = 0; e < n / sizeof(float); e++)
			((float *)k->buf)[e] = fk.recv_fill[fk.recvs];
		fk.recvs++;
		break;
	}
	k->waited = 1;
	fk.in_flight--;
	return LOOM_OK;
}

static void fk_restart(loom_comm *c, loom_comm_work *w)
{
	(void)c;
	fk.calls[((fk_work *)w)->call].restart_at = rec.nodes;
}

/* The root is this rank in every broadcast these tests make. An error,
 * not an assertion: it runs inside loom_compile, also in the pass cases'
 * forked children, which must not talk to Criterion (below). */
static loom_status fk_broadcast(loom_comm *c, void *buf, size_t bytes, int root)
{
	(void)buf, (void)bytes;
	if (root != c->rank)
		return loom_comm_fail(c, LOOM_ERR_INVALID, "fake: broadcast from rank %d; the fake "
				      "broadcasts from this rank (%d) only", root, c->rank);
	return LOOM_OK;
}

static const loom_comm_i fk_iface = {
	.name = "fake",
	.allreduce_start = fk_allreduce_start,
	.test = fk_test,
	.wait = fk_wait,
	.broadcast = fk_broadcast,
	.allgather = fake_comm_allgather,
	.barrier = fake_comm_barrier,
	.abort = fake_comm_abort,
	.free = fake_comm_free,
	.reduce_scatter_start = fk_reduce_scatter_start,
	.allgather_start = fk_allgather_start,
	.send_start = fk_send_start,
	.recv_start = fk_recv_start,
	.restart = fk_restart,
};

/* A test's program, its graph and (if any) its group, freed in that order. */
static void free_ranked(loom_program *p, loom_graph *g, loom_pg *pg)
{
	loom_program_free(p);
	loom_graph_free(g);
	if (pg)
		loom_pg_free(pg);
}

/* A single process's group made into rank `rank` of `world`, with the fake
 * as its host communicator (no MPI, no sockets); NULL, with why in err,
 * if it could not be made. */
static loom_pg *fake_group_or_null(int world, int rank, char *err, size_t errlen)
{
	loom_comm_options o = { .bootstrap = LOOM_COMM_BOOT_SINGLE };
	loom_pg *pg;
	if (loom_pg_init(&o, &pg) != LOOM_OK) {
		snprintf(err, errlen, "loom_pg_init: %s", loom_pg_error(pg));
		loom_pg_free(pg);
		return NULL;
	}
	loom_comm_peer *peers = calloc((size_t)world, sizeof(*peers));
	loom_comm *c = calloc(1, sizeof(*c));
	if (!peers || !c) {
		snprintf(err, errlen, "out of memory");
		free(peers);
		free(c);
		loom_pg_free(pg);
		return NULL;
	}
	peers[rank] = pg->peers[0];
	free(pg->peers);
	pg->peers = peers;
	pg->host->i->free(pg->host);
	*c = (loom_comm){ .i = &fk_iface, .pg = pg, .rank = rank, .world = world };
	pg->host = c;
	pg->info.rank = pg->info.local_rank = rank;
	pg->info.world = pg->info.local_world = world;
	return pg;
}

static loom_pg *fake_group(int world, int rank)
{
	char err[300];
	loom_pg *pg = fake_group_or_null(world, rank, err, sizeof(err));
	cr_assert_not_null(pg, "%s", err);
	return pg;
}

static loom_status rec_run_node(void *ctx, const loom_plan *pl, const loom_arena *a, loom_value v)
{
	rec.nodes++;
	rec.nodes_overlapped += fk.in_flight > 0;
	return loom_cpu_backend.run_node(ctx, pl, a, v);
}

static loom_status rec_accum(void *ctx, const loom_plan *pl, const loom_arena *a, int s, int fold)
{
	if (fold)
		rec.accum_fold++;
	else
		rec.accum_add++;
	return loom_cpu_backend.accumulate->accum(ctx, pl, a, s, fold);
}

static loom_status rec_optim(void *ctx, const loom_plan *pl, const loom_arena *a,
			     loom_train_state *ts, int first, int last, int finite)
{
	rec.optim++;
	rec.optim_first = first;
	rec.optim_last = last;
	rec.optim_finite = finite;
	rec.in_flight_at_optim = fk.in_flight;
	for (int i = 0; i < fk.n; i++)
		rec.waited_at_optim += fk.calls[i].waited && fk.calls[i].op != FK_SEND;
	return loom_cpu_backend.optim(ctx, pl, a, ts, first, last, finite);
}

static loom_status rec_run_begin(void *ctx, const loom_plan *pl, const loom_arena *a,
				 loom_train_state *ts, unsigned flags)
{
	rec.begins++;
	return loom_cpu_backend.run_begin(ctx, pl, a, ts, flags);
}

static loom_status rec_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
	rec.copies++;
	rec.in_flight_at_copy += fk.in_flight;
	return loom_cpu_backend.copy(ctx, dst, src, bytes);
}

static int rec_supports_node(void *ctx, const loom_plan *pl, loom_value v)
{
	return pl->g->nodes[v].op != rec.refuse && loom_cpu_backend.supports_node(ctx, pl, v);
}

static loom_backend rec_backend;
static loom_backend_accumulate rec_accumulate;

static void setup(void)
{
	memset(&rec, 0, sizeof(rec));
	fk_reset();
	rec.refuse = LOOM_OP_COUNT;
	rec_backend = loom_cpu_backend;
	rec_backend.name = "recording";
	rec_backend.run_node = rec_run_node;
	rec_accumulate = *loom_cpu_backend.accumulate;
	rec_accumulate.accum = rec_accum;
	rec_backend.accumulate = &rec_accumulate;
	rec_backend.optim = rec_optim;
	rec_backend.run_begin = rec_run_begin;
	rec_backend.supports_node = rec_supports_node;
	rec_backend.copy = rec_copy;
	loom_test_backend = &rec_backend;
}

static void teardown(void)
{
	loom_test_backend = NULL;
	fk_reset();
}

/* x [6, 4] -> linear 4->8 -> relu -> linear 8->3 -> CE with y; the loss. */
/* The MLP built on g; its loss. */
static loom_value mlp_on(loom_graph *g)
{
	int64_t xd[2] = { 6, 4 }, yd[1] = { 6 };
	loom_value x = loom_input(g, "x", LOOM_F32, 2, xd);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	loom_value h = loom_relu(g, loom_layer_linear(g, "fc1", x, 8, 1));
	return loom_softmax_cross_entropy(g, loom_layer_linear(g, "fc2", h, 3, 1), y);
}

static loom_value build_mlp(loom_graph **gp)
{
	cr_assert_eq(loom_graph_new(gp), LOOM_OK);
	return mlp_on(*gp);
}

static void mlp_opts(loom_compile_opts *o, loom_optim_kind kind)
{
	loom_compile_opts_default(o);
	o->device = LOOM_DEVICE_CPU;
	o->optim.kind = kind;
	o->optim.lr = 0.1;
}

/* Compiled with o and given its inputs; NULL if the compile failed. */
static loom_program *compile_mlp_with(loom_graph *g, loom_value loss, const loom_compile_opts *o)
{
	loom_program *p;
	if (loom_compile(g, loss, o, &p) != LOOM_OK) {
		loom_program_free(p);
		return NULL;
	}
	fake_mlp_inputs(p);
	return p;
}

static loom_program *compile_mlp(loom_graph **gp, loom_optim_kind kind)
{
	loom_compile_opts o;
	mlp_opts(&o, kind);
	loom_value loss = build_mlp(gp);
	return compile_mlp_with(*gp, loss, &o);
}

/* The MLP as rank 0 of the fake group of two, its gradients in buckets of
 * about 100 bytes (several buckets: fc2's weight alone is 96). */
static loom_program *compile_mlp_ranked(loom_graph **gp, loom_pg *pg, int zero)
{
	loom_compile_opts o;
	mlp_opts(&o, LOOM_OPTIM_SGD);
	o.pg = pg;
	o.zero_stage = zero;
	o.bucket_cap_mb = o.first_bucket_mb = 100e-6;
	loom_value loss = build_mlp(gp);
	loom_program *p = compile_mlp_with(*gp, loss, &o);
	cr_assert_not_null(p, "%s", loom_last_error());
	cr_assert_eq(p->plan.world, 2);
	cr_assert_geq(p->plan.buckets.n, 2, "buckets: %d", p->plan.buckets.n);
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
	char *buf = print_text(loom_program_dump, p);
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

/* ------------------------------------------------------------ collective, wait, copy */

/* The step that computes v: its own node step, or its maker's. */
static int step_of(const loom_plan *pl, loom_value v)
{
	loom_value u = loom_made_earlier(pl, v) ? pl->g->nodes[v].made_by : v;
	for (int i = 0; i < pl->n_steps; i++)
		if (pl->steps[i].kind == LOOM_STEP_NODE && pl->steps[i].v == u)
			return i;
	return -1;
}

/* The fake's calls of kind op, in the order they were made: how many, and
 * the first `max` in out. */
static int calls_of(int op, const fk_call **out, int max)
{
	int n = 0;
	for (int i = 0; i < fk.n; i++)
		if (fk.calls[i].op == op) {
			if ((unsigned)n < (unsigned)max) /* (gcc's -Warray-bounds: n never wraps) */
				out[n] = &fk.calls[i];
			n++;
		}
	return n;
}

/* Every parameter's gradient, read back after a GRAD run. */
static double *grads_of(loom_program *p, loom_graph *g, size_t *n_out)
{
	size_t n = 0;
	for (loom_value v = 0; v < g->n; v++)
		if (g->nodes[v].op == LOOM_OP_PARAM)
			n += (size_t)loom_shape_numel(&g->nodes[v].shape);
	double *all = malloc(n * sizeof(double)), *at = all;
	cr_assert_not_null(all);
	for (loom_value v = 0; v < g->n; v++) {
		if (g->nodes[v].op != LOOM_OP_PARAM)
			continue;
		size_t k = (size_t)loom_shape_numel(&g->nodes[v].shape);
		cr_assert_eq(loom_read_grad_f64(p, v, at, k), LOOM_OK, "%s", loom_program_error(p));
		at += k;
	}
	*n_out = n;
	return all;
}

Test(exec, allreduce_steps_sum_each_bucket_once_backward_made_it)
{
	loom_pg *pg = fake_group(2, 0);
	loom_graph *g, *g1;
	loom_program *p = compile_mlp_ranked(&g, pg, 0);
	loom_program *one = compile_mlp(&g1, LOOM_OPTIM_SGD);
	cr_assert_not_null(one, "%s", loom_last_error());
	const loom_plan *pl = &p->plan;
	const loom_buckets *bk = &pl->buckets;
	/* The list: each bucket's accumulation, then its all-reduce on the
	 * communication stream, after the steps that make its gradients. */
	int order[32], n = 0;
	cr_assert_leq(bk->n, 32);
	for (int i = 0; i < pl->n_steps; i++) {
		const loom_step *s = &pl->steps[i];
		if (s->kind != LOOM_STEP_COLLECTIVE)
			continue;
		cr_assert_lt(i, pl->n_grad_steps, "step %d: all-reduces start during backward", i);
		cr_assert_eq(s->coll, LOOM_COLL_ALLREDUCE, "step %d: %s", i, loom_coll_name(s->coll));
		cr_assert_eq(s->stream, LOOM_STREAM_COMM);
		cr_assert_eq(s->phase, LOOM_PHASE_BACKWARD);
		cr_assert(s->index >= 0 && s->index < bk->n, "step %d: bucket %d", i, s->index);
		const loom_bucket *b = &bk->b[s->index];
		cr_assert_eq(s->v, b->node);
		cr_assert_eq(pl->steps[i - 1].kind, LOOM_STEP_ACCUM);
		cr_assert_eq(pl->steps[i - 1].index, s->index);
		for (int j = b->first; j < b->first + b->n; j++) {
			int m = step_of(pl, bk->grad[j]);
			cr_assert(m >= 0 && m < i, "bucket %d: gradient %d made at step %d, all-reduced at %d",
				  s->index, (int)bk->grad[j], m, i);
		}
		for (int k = 0; k < n; k++)
			cr_assert_neq(order[k], s->index, "bucket %d all-reduced twice", s->index);
		order[n++] = s->index;
	}
	cr_assert_eq(n, bk->n, "one all-reduce per bucket");

	/* The run: each bucket whole, in the list's order; the sum is the
	 * two ranks' (the same gradients: one process's times two). */
	cr_assert_eq(loom_run(p, LOOM_RUN_GRAD), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_run(one, LOOM_RUN_GRAD), LOOM_OK, "%s", loom_program_error(one));
	const fk_call *c[32];
	cr_assert_eq(calls_of(FK_ALLREDUCE, c, 32), bk->n);
	for (int k = 0; k < n; k++) {
		const loom_bucket *b = &bk->b[order[k]];
		cr_assert_eq(c[k]->buf, p->arena.bucket + b->base, "all-reduce %d: not bucket %d", k,
			     order[k]);
		cr_assert_eq(c[k]->count, (size_t)b->count);
		cr_assert_eq(c[k]->dt, b->dtype);
		cr_assert(c[k]->waited);
	}
	size_t ng, ng1;
	double *two = grads_of(p, g, &ng), *ref = grads_of(one, g1, &ng1);
	cr_assert_eq(ng, ng1);
	int nonzero = 0;
	for (size_t i = 0; i < ng; i++) {
		cr_assert_eq(two[i], 2 * ref[i], "gradient element %zu: %g, one process's %g", i,
			     two[i], ref[i]);
		nonzero += ref[i] != 0;
	}
	cr_assert_gt(nonzero, 0);
	free(two);
	free(ref);

	/* Gradient accumulation (DDP's no_sync): nothing is sent. */
	fk_reset();
	rec.accum_add = 0;
	cr_assert_eq(loom_run(p, LOOM_RUN_ACCUMULATE), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(fk.n, 0, "an ACCUMULATE run made %d collective calls", fk.n);
	cr_assert_eq(rec.accum_add, bk->n);
	free_ranked(one, g1, NULL);
	free_ranked(p, g, pg);
}

Test(exec, the_wait_step_ends_the_collectives_in_flight_before_the_update)
{
	loom_pg *pg = fake_group(2, 0);
	loom_graph *g;
	loom_program *p = compile_mlp_ranked(&g, pg, 0);
	const loom_plan *pl = &p->plan;
	/* One wait: the optimizer phase's first step, right before the update. */
	cr_assert_eq(count_kind(pl, LOOM_STEP_WAIT, 0, pl->n_steps), 1);
	const loom_step *w = &pl->steps[pl->n_grad_steps];
	cr_assert_eq(w->kind, LOOM_STEP_WAIT, "step %d is %s", pl->n_grad_steps,
		     loom_step_kind_name(w->kind));
	cr_assert_eq(w->stream, LOOM_STREAM_COMPUTE);
	cr_assert_eq(w->phase, LOOM_PHASE_OPTIMIZER);
	cr_assert_eq(pl->steps[pl->n_grad_steps + 1].kind, LOOM_STEP_OPTIM);
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	/* Backward went on while all-reduces were in flight (nothing ends
	 * before its wait here), and the wait ended them all before the
	 * update read the sums. */
	cr_assert_gt(rec.nodes_overlapped, 0, "no node ran beside a collective");
	cr_assert_eq(rec.optim, 1);
	cr_assert_eq(rec.in_flight_at_optim, 0, "the update ran with collectives in flight");
	cr_assert_eq(rec.waited_at_optim, pl->buckets.n);
	cr_assert_eq(fk.in_flight, 0);
	free_ranked(p, g, pg);
}

Test(exec, zero_reduce_scatters_each_bucket_then_all_gathers_it_after_the_update)
{
	loom_pg *pg = fake_group(2, 0);
	loom_graph *g, *g1;
	loom_program *p = compile_mlp_ranked(&g, pg, 1);
	loom_program *one = compile_mlp(&g1, LOOM_OPTIM_SGD);
	cr_assert_not_null(one, "%s", loom_last_error());
	const loom_plan *pl = &p->plan;
	const loom_buckets *bk = &pl->buckets;
	int nb = bk->n, rs = 0;
	cr_assert_eq(pl->zero, 1);
	/* Backward: a reduce-scatter per bucket where the all-reduce was. */
	for (int i = 0; i < pl->n_grad_steps; i++) {
		const loom_step *s = &pl->steps[i];
		if (s->kind != LOOM_STEP_COLLECTIVE)
			continue;
		cr_assert_eq(s->coll, LOOM_COLL_REDUCE_SCATTER, "step %d: %s", i, loom_coll_name(s->coll));
		cr_assert_eq(s->stream, LOOM_STREAM_COMM);
		cr_assert_eq(pl->steps[i - 1].kind, LOOM_STEP_ACCUM);
		rs++;
	}
	cr_assert_eq(rs, nb);
	/* Then: wait, update, an all-gather per bucket, wait, a copy per bucket. */
	const loom_step *s = &pl->steps[pl->n_grad_steps];
	cr_assert_eq(pl->n_steps, pl->n_grad_steps + 3 + 2 * nb);
	cr_assert_eq(s[0].kind, LOOM_STEP_WAIT);
	cr_assert_eq(s[1].kind, LOOM_STEP_OPTIM);
	for (int k = 0; k < nb; k++) {
		const loom_step *a = &s[2 + k];
		cr_assert_eq(a->kind, LOOM_STEP_COLLECTIVE, "step %d", pl->n_grad_steps + 2 + k);
		cr_assert_eq(a->coll, LOOM_COLL_ALLGATHER);
		cr_assert_eq(a->index, k);
		cr_assert_eq(a->stream, LOOM_STREAM_COMM);
		cr_assert_eq(a->phase, LOOM_PHASE_OPTIMIZER);
	}
	cr_assert_eq(s[2 + nb].kind, LOOM_STEP_WAIT);

	/* The run: each bucket's shard (half of it) reduced, then gathered,
	 * from the bucket's own memory; every reduce-scatter ended before the
	 * update, which no all-gather started ahead of. */
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	const fk_call *r[32], *a[32];
	cr_assert_eq(calls_of(FK_REDUCE_SCATTER, r, 32), nb);
	cr_assert_eq(calls_of(FK_ALLGATHER, a, 32), nb);
	cr_assert_eq(calls_of(FK_ALLREDUCE, a, 0), 0);
	cr_assert_lt(r[nb - 1], a[0], "an all-gather started before the last reduce-scatter");
	cr_assert_eq(rec.in_flight_at_optim, 0);
	cr_assert_eq(rec.optim, 1);
	cr_assert_eq(rec.waited_at_optim, nb);
	int seen = 0;
	for (int i = 0; i < nb; i++)
		for (int k = 0; k < nb; k++) {
			const loom_bucket *b = &bk->b[k];
			if (r[i]->buf != p->arena.bucket + b->base)
				continue;
			seen |= 1 << k;
			cr_assert_eq(r[i]->count, (size_t)b->count / 2, "bucket %d: shard", k);
			cr_assert_eq(a[k]->buf, p->arena.bucket + b->base, "all-gather %d", k);
			cr_assert_eq(a[k]->count, (size_t)b->count / 2);
		}
	cr_assert_eq(seen, (1 << nb) - 1, "a reduce-scatter of every bucket");
	/* This rank's shard held the two ranks' sum: its update is one
	 * process's, bit for bit (2g / 2 = g). */
	cr_assert_eq(loom_run(one, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(one));
	int mine = 0;
	for (int k = 0; k < nb; k++) {
		const loom_bucket *b = &bk->b[k];
		int64_t shard = b->count / 2;
		for (int j = b->first; j < b->first + b->n; j++)
			for (int sl = 0; sl < pl->n_params; sl++) {
				if (pl->params[sl].grad != bk->grad[j])
					continue;
				loom_value v = pl->params[sl].param;
				const float *w2 = loom_arena_ptr(&p->arena, pl, v);
				const float *w1 = loom_arena_ptr(&one->arena, &one->plan, v);
				int64_t e0 = (int64_t)(bk->offset[j] / sizeof(float));
				for (int64_t e = 0; e < pl->params[sl].numel && e0 + e < shard; e++, mine++)
					cr_assert_eq(w2[e], w1[e], "%s[%lld]: %g, one process's %g",
						     pl->g->nodes[v].name, (long long)e, w2[e], w1[e]);
			}
	}
	cr_assert_gt(mine, 0);
	free_ranked(one, g1, NULL);
	free_ranked(p, g, pg);
}

Test(exec, zero_copy_steps_put_the_gathered_parameters_back)
{
	loom_pg *pg = fake_group(2, 0);
	loom_graph *g;
	loom_program *p = compile_mlp_ranked(&g, pg, 1);
	const loom_plan *pl = &p->plan;
	const loom_buckets *bk = &pl->buckets;
	int nb = bk->n, members = 0;
	for (int k = 0; k < nb; k++) {
		const loom_step *c = &pl->steps[pl->n_steps - nb + k];
		cr_assert_eq(c->kind, LOOM_STEP_COPY, "step %d", pl->n_steps - nb + k);
		cr_assert_eq(c->index, k);
		cr_assert_eq(c->stream, LOOM_STREAM_COMPUTE);
		members += bk->b[k].n;
	}
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	/* One copy per parameter, none while its all-gather was in flight;
	 * then every element is its bucket's: the other rank's shard (the
	 * fake's 1000 + index) and this rank's update alike. */
	cr_assert_eq(rec.copies, members);
	cr_assert_eq(rec.in_flight_at_copy, 0);
	int theirs = 0, mine = 0;
	for (int k = 0; k < nb; k++) {
		const loom_bucket *b = &bk->b[k];
		const float *bucket = (const float *)(p->arena.bucket + b->base);
		int64_t shard = b->count / 2;
		for (int j = b->first; j < b->first + b->n; j++)
			for (int sl = 0; sl < pl->n_params; sl++) {
				if (pl->params[sl].grad != bk->grad[j])
					continue;
				loom_value v = pl->params[sl].param;
				const float *w = loom_arena_ptr(&p->arena, pl, v);
				int64_t e0 = (int64_t)(bk->offset[j] / sizeof(float));
				for (int64_t e = 0; e < pl->params[sl].numel; e++) {
					int64_t be = e0 + e;
					float want = be >= shard ? 1000.0f + (float)be : bucket[be];
					cr_assert_eq(w[e], want, "%s[%lld] (bucket %d element %lld): %g, want %g",
						     pl->g->nodes[v].name, (long long)e, k, (long long)be,
						     w[e], want);
					theirs += be >= shard;
					mine += be < shard;
				}
			}
	}
	cr_assert_gt(theirs, 0);
	cr_assert_gt(mine, 0);
	free_ranked(p, g, pg);
}

/* ------------------------------------------------------------ ZeRO-3: the gathers' places */

enum { Z3_LAYERS = 4 };

/* x [4, 8] -> Z3_LAYERS x (linear 8->8 without bias -> relu) -> mean, as
 * rank 0 of the fake two under ZeRO-3 with zero_prefetch `prefetch`; each
 * weight (256 bytes) its own bucket (cap 100 bytes), so that a gather is
 * one layer's. */
static loom_program *compile_zero3_layers(loom_graph **gp, loom_pg *pg, int prefetch)
{
	int64_t xd[2] = { 4, 8 };
	cr_assert_eq(loom_graph_new(gp), LOOM_OK);
	loom_value h = loom_input(*gp, "x", LOOM_F32, 2, xd);
	for (int i = 0; i < Z3_LAYERS; i++) {
		char nm[16];
		snprintf(nm, sizeof(nm), "fc%d", i);
		h = loom_relu(*gp, loom_layer_linear(*gp, nm, h, 8, 0));
	}
	loom_value loss = loom_mean(*gp, h);
	loom_compile_opts o;
	mlp_opts(&o, LOOM_OPTIM_SGD);
	o.pg = pg;
	o.zero_stage = 3;
	o.zero_prefetch = prefetch;
	o.bucket_cap_mb = o.first_bucket_mb = 100e-6;
	loom_program *p = NULL;
	cr_assert_eq(loom_compile(*gp, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	cr_assert_eq(p->plan.zero, 3);
	cr_assert_eq(p->plan.buckets.n, Z3_LAYERS, "buckets: %d", p->plan.buckets.n);
	return p;
}

/* The step of gather k's all-gather (wait 0) or of its wait (wait 1). */
static int gather_step(const loom_plan *pl, int k, int wait)
{
	int at = -1;
	for (int i = 0; i < pl->n_steps; i++) {
		const loom_step *s = &pl->steps[i];
		if (s->index != pl->buckets.n + k)
			continue;
		if (wait ? s->kind == LOOM_STEP_WAIT :
			   s->kind == LOOM_STEP_COLLECTIVE && s->coll == LOOM_COLL_ALLGATHER) {
			cr_assert_eq(at, -1, "gather %d: two %s steps", k, wait ? "wait" : "all-gather");
			at = i;
		}
	}
	cr_assert_geq(at, 0, "gather %d: no %s step", k, wait ? "wait" : "all-gather");
	return at;
}

/* A collective step of a kind the executor does not start on buckets is
 * refused before anything of it happens: the first gather made a broadcast
 * copies no shard, calls no communicator, leaves nothing in flight. */
Test(exec, a_collective_of_another_kind_is_refused_before_it_starts)
{
	loom_pg *pg = fake_group(2, 0);
	loom_graph *g;
	loom_program *p = compile_zero3_layers(&g, pg, 0);
	loom_plan *pl = &p->plan;
	int i = 0;
	while (i < pl->n_steps && pl->steps[i].kind != LOOM_STEP_COLLECTIVE)
		i++;
	cr_assert_lt(i, pl->n_steps, "no collective step");
	cr_assert_geq(pl->steps[i].index, pl->buckets.n, "the first collective is not a gather");
	pl->steps[i].coll = LOOM_COLL_BROADCAST;
	rec.copies = 0;
	cr_assert_eq(loom_run(p, LOOM_RUN_GRAD), LOOM_ERR_UNSUPPORTED);
	cr_expect_not_null(strstr(loom_program_error(p), "no broadcast step on buckets"), "%s",
			   loom_program_error(p));
	cr_expect_eq(rec.copies, 0, "the shard was copied first");
	cr_expect_eq(fk.n, 0, "%d communicator calls", fk.n);
	cr_expect_eq(p->exec->n_pending, 0);
	cr_expect_null(p->exec->pending[pl->steps[i].index], "left in flight");
	free_ranked(p, g, pg);
}

/*
 * Each layer's all-gather is issued exactly `depth` layers ahead of its
 * first use, within its phase (forward, backward): the first `depth` of a
 * phase at the phase's first use, the rest right before the first use of
 * the layer `depth` earlier (prefetch -1: none ahead; 0: the default, 1).
 * A gather's first use is its wait's step (the wait sits right before the
 * first node that reads the gathered bucket). Checked on the step list:
 * between layer r's all-gather and its wait lie the waits of exactly
 * min(r, depth) other layers of its phase, and no node computes between
 * the all-gather and the wait of layer r - depth (it is issued at that
 * layer's first use, not before). An off-by-one in zero3.c's prefetch
 * distance changes no bits (tests/ddp: zero3pf), only these places.
 */
Test(exec, zero3_gathers_each_layer_prefetch_layers_ahead_of_its_first_use)
{
	static const struct { int prefetch, depth; } cases[] = {
		{ -1, 0 }, { 0, 1 }, { 1, 1 }, { 2, 2 },
	};
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		int depth = cases[c].depth;
		loom_pg *pg = fake_group(2, 0);
		loom_graph *g;
		loom_program *p = compile_zero3_layers(&g, pg, cases[c].prefetch);
		const loom_plan *pl = &p->plan;
		int ng = pl->n_gathers;
		int gs[2 * Z3_LAYERS], ws[2 * Z3_LAYERS], bwd[2 * Z3_LAYERS];
		/* A forward gather per layer; a backward one per layer whose
		 * weight the backward reads (dx: all but the first layer's). */
		cr_assert_eq(ng, 2 * Z3_LAYERS - 1, "prefetch %d: %d gathers", cases[c].prefetch, ng);
		for (int k = 0; k < ng; k++) {
			gs[k] = gather_step(pl, k, 0);
			ws[k] = gather_step(pl, k, 1);
			bwd[k] = !!(pl->g->nodes[pl->gathers[k].v].flags & LOOM_NODE_BACKWARD);
			cr_assert_lt(gs[k], ws[k], "gather %d waited before it started", k);
		}
		for (int k = 0; k < ng; k++) {
			/* r: layer k's place among its phase's first uses;
			 * its waits between its all-gather and its wait */
			int r = 0, between = 0, target = -1;
			for (int j = 0; j < ng; j++) {
				if (bwd[j] != bwd[k])
					continue;
				r += ws[j] < ws[k];
				between += ws[j] > gs[k] && ws[j] < ws[k];
			}
			int want = r < depth ? r : depth;
			cr_expect_eq(between, want,
				     "prefetch %d: %s gather %d (layer %d of its phase) issued %d layers "
				     "ahead of its first use (step %d, its all-gather step %d), not %d",
				     cases[c].prefetch, bwd[k] ? "backward" : "forward", k, r, between,
				     ws[k], gs[k], want);
			for (int j = 0; j < ng; j++) {
				int rj = 0;
				for (int i = 0; i < ng; i++)
					rj += bwd[i] == bwd[k] && ws[i] < ws[j];
				if (bwd[j] == bwd[k] && rj == r - want)
					target = j;
			}
			cr_assert_geq(target, 0);
			int early = 0;
			for (int i = gs[k] + 1; i < ws[target]; i++)
				early += pl->steps[i].kind == LOOM_STEP_NODE && !pl->steps[i].noop;
			cr_expect_eq(early, 0,
				     "prefetch %d: gather %d issued at step %d, %d computing nodes before "
				     "its place (the first use of gather %d, step %d)",
				     cases[c].prefetch, k, gs[k], early, target, ws[target]);
		}
		free_ranked(p, g, pg);
	}
}

/* ------------------------------------------------------------ pipeline: send, recv, micro */

/* Two micro-batches of x [2, 3]: all positive, then of both signs. */
static const float pipe_x[2][6] = { { 0.5f, 1, 1.5f, 2, 2.5f, 3 }, { 1, -1, 2, -2, 3, -3 } };

/*
 * h = relu(x + w), w zeros, the last value of stage 0; loss = sum(h) on
 * stage 1. This process is rank 0 of the fake two: stage 0, which sends h
 * forward and receives its gradient back (the fake's recv_fill), two
 * micro-batches, GPipe, SGD at lr 1: w's update is minus the mean over the
 * micro-batches of the gradient received where relu let it through.
 */
static loom_program *compile_pipe_fused(loom_graph **gp, loom_pg *pg, loom_value *h, loom_value *w,
					int fuse);

static loom_program *compile_pipe(loom_graph **gp, loom_pg *pg, loom_value *h, loom_value *w)
{
	return compile_pipe_fused(gp, pg, h, w, 1);
}

static loom_program *compile_pipe_fused(loom_graph **gp, loom_pg *pg, loom_value *h, loom_value *w,
					int fuse)
{
	loom_graph *g;
	int64_t d[2] = { 2, 3 };
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value x = loom_input(g, "x", LOOM_F32, 2, d);
	*w = loom_param(g, "w", LOOM_F32, 2, d, LOOM_INIT_ZEROS, 3);
	*h = loom_relu(g, loom_add(g, x, *w));
	cr_assert_eq(loom_stage_boundary(g, *h), LOOM_OK);
	loom_value loss = loom_sum(g, *h);
	loom_compile_opts o;
	mlp_opts(&o, LOOM_OPTIM_SGD);
	o.optim.lr = 1;
	o.pg = pg;
	o.pipeline_stages = 2;
	o.micro_batches = 2;
	o.schedule = LOOM_SCHEDULE_GPIPE;
	o.no_fusion = !fuse;
	loom_program *p;
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	cr_assert_not_null(p->plan.pipe);
	cr_assert_eq(p->plan.pipe->stage, 0);
	cr_assert_eq(loom_set_input(p, "x", pipe_x, LOOM_F32, 12), LOOM_OK, "%s",
		     loom_program_error(p));
	fk.recv_fill[0] = 1;
	fk.recv_fill[1] = 3;
	*gp = g;
	return p;
}

/* The micro-batch step i belongs to: the last MICRO step at or before it
 * in [first, i]; -1 if none. */
static int micro_at(const loom_plan *pl, int first, int i)
{
	for (; i >= first; i--)
		if (pl->steps[i].kind == LOOM_STEP_MICRO)
			return pl->steps[i].micro;
	return -1;
}

Test(exec, send_steps_pass_each_micro_batchs_boundary_value_forward)
{
	loom_pg *pg = fake_group(2, 0);
	loom_graph *g;
	loom_value h, w;
	loom_program *p = compile_pipe(&g, pg, &h, &w);
	const loom_plan *pl = &p->plan;
	int first = pl->pipe->eval_steps, n = 0;
	/* TRAIN's steps: one send of h to rank 1 per micro-batch, in its
	 * forward, after the step that makes h. */
	for (int i = first; i < pl->n_steps; i++) {
		const loom_step *s = &pl->steps[i];
		if (s->kind != LOOM_STEP_SEND)
			continue;
		cr_assert_eq(s->v, h, "step %d sends value %d", i, (int)s->v);
		cr_assert_eq(s->peer, 1);
		cr_assert_eq(s->phase, LOOM_PHASE_FORWARD);
		cr_assert_eq(s->micro, n, "sends in micro-batch order");
		cr_assert_eq(micro_at(pl, first, i), n);
		int m = step_of(pl, h);
		cr_assert(m >= 0, "no step makes h");
		int made = 0;
		for (int k = i - 1; k >= first && pl->steps[k].kind != LOOM_STEP_MICRO; k--)
			made |= pl->steps[k].kind == LOOM_STEP_NODE && pl->steps[k].v == pl->steps[m].v;
		cr_assert(made, "step %d sends h before its micro-batch made it", i);
		n++;
	}
	cr_assert_eq(n, 2);
	/* The run: what left for rank 1 is each micro-batch's relu(x + 0),
	 * as it was when the send ended. */
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	const fk_call *c[4];
	cr_assert_eq(calls_of(FK_SEND, c, 4), 2);
	for (int j = 0; j < 2; j++) {
		cr_assert_eq(c[j]->peer, 1);
		cr_assert_eq(c[j]->tag, (int)h);
		cr_assert_eq(c[j]->count, 6 * sizeof(float));
		cr_assert(c[j]->waited && c[j]->sent);
		const float *got = c[j]->sent;
		for (int e = 0; e < 6; e++)
			cr_assert_eq(got[e], pipe_x[j][e] > 0 ? pipe_x[j][e] : 0.0f,
				     "micro-batch %d, element %d: sent %g", j, e, got[e]);
	}
	free_ranked(p, g, pg);
}

/* The TRAIN run's micro-batch passes of the two-stage test model compiled
 * under schedule with M micro-batches, as this rank of the fake two runs
 * them: "F0 F1 B0 ..." (a forward's end marker left out). */
static void train_order(int rank, loom_schedule schedule, int M, char *buf, size_t len)
{
	loom_pg *pg = fake_group(2, rank);
	loom_graph *g;
	int64_t d[2] = { 2, 3 };
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value x = loom_input(g, "x", LOOM_F32, 2, d);
	loom_value w = loom_param(g, "w", LOOM_F32, 2, d, LOOM_INIT_ZEROS, 3);
	loom_value h = loom_relu(g, loom_add(g, x, w));
	cr_assert_eq(loom_stage_boundary(g, h), LOOM_OK);
	loom_compile_opts o;
	mlp_opts(&o, LOOM_OPTIM_SGD);
	o.pg = pg;
	o.pipeline_stages = 2;
	o.micro_batches = M;
	o.schedule = schedule;
	loom_program *p;
	cr_assert_eq(loom_compile(g, loom_sum(g, h), &o, &p), LOOM_OK, "%s", loom_last_error());
	const loom_plan *pl = &p->plan;
	cr_assert_eq(pl->pipe->stage, rank);
	size_t at = 0;
	buf[0] = 0;
	for (int i = pl->pipe->eval_steps; i < pl->n_steps; i++) {
		const loom_step *st = &pl->steps[i];
		if (st->kind != LOOM_STEP_MICRO || (st->phase == LOOM_PHASE_FORWARD && st->index != 0))
			continue;
		at += (size_t)snprintf(buf + at, len - at, "%s%c%d", at ? " " : "",
				       st->phase == LOOM_PHASE_BACKWARD ? 'B' : 'F', st->micro);
	}
	free_ranked(p, g, pg);
}

/* The schedules' orders, 4 micro-batches over 2 stages: GPipe every
 * forward then every backward; 1F1B as many forwards as stages follow
 * (stage 0: one ahead), then one forward, one backward. */
Test(exec, each_schedule_runs_its_order_of_micro_batches)
{
	char got[256];
	train_order(0, LOOM_SCHEDULE_GPIPE, 4, got, sizeof(got));
	cr_assert_str_eq(got, "F0 F1 F2 F3 B0 B1 B2 B3", "GPipe, stage 0");
	train_order(1, LOOM_SCHEDULE_GPIPE, 4, got, sizeof(got));
	cr_assert_str_eq(got, "F0 F1 F2 F3 B0 B1 B2 B3", "GPipe, stage 1");
	train_order(0, LOOM_SCHEDULE_1F1B, 4, got, sizeof(got));
	cr_assert_str_eq(got, "F0 F1 B0 F2 B1 F3 B2 B3", "1F1B, stage 0");
	train_order(1, LOOM_SCHEDULE_1F1B, 4, got, sizeof(got));
	cr_assert_str_eq(got, "F0 B0 F1 B1 F2 B2 F3 B3", "1F1B, stage 1");
}

/* The update of w after one step of the two-stage test model, whatever
 * the transport or the post points: the same as in place. */
static void expect_pipe_update(loom_program *p, loom_value w)
{
	double wv[6];
	cr_assert_eq(loom_read_f64(p, w, wv, 6), LOOM_OK, "%s", loom_program_error(p));
	for (int e = 0; e < 6; e++)
		cr_assert_eq(wv[e], pipe_x[1][e] > 0 ? -2.0 : -0.5, "w[%d] = %g", e, wv[e]);
}

Test(exec, recv_steps_take_each_micro_batchs_gradient_from_the_next_stage)
{
	loom_pg *pg = fake_group(2, 0);
	loom_graph *g;
	loom_value h, w;
	loom_program *p = compile_pipe(&g, pg, &h, &w);
	const loom_plan *pl = &p->plan;
	int first = pl->pipe->eval_steps, n = 0;
	loom_value got_v = LOOM_NONE;
	/* TRAIN's steps: one receive per micro-batch from rank 1, first in
	 * its backward, of a gradient shaped as h. */
	for (int i = first; i < pl->n_steps; i++) {
		const loom_step *s = &pl->steps[i];
		if (s->kind != LOOM_STEP_RECV)
			continue;
		cr_assert_eq(s->peer, 1);
		cr_assert_eq(s->phase, LOOM_PHASE_BACKWARD);
		cr_assert_eq(s->micro, n);
		cr_assert_eq(pl->steps[i - 1].kind, LOOM_STEP_MICRO, "step %d: not first in its backward", i);
		cr_assert_eq(pl->steps[i - 1].micro, n);
		cr_assert_geq(s->v, pl->n_fwd, "a backward value");
		cr_assert_eq(loom_plan_value_bytes(pl, s->v), 6 * sizeof(float));
		cr_assert(got_v == LOOM_NONE || got_v == s->v);
		got_v = s->v;
		n++;
	}
	cr_assert_eq(n, 2);
	cr_assert_eq(count_kind(pl, LOOM_STEP_RECV, 0, first), 0, "stage 0's forward receives nothing");
	/* The run: each receive from rank 1, tagged with the value; each
	 * micro-batch's backward used its own (1, then 3): w = -(1 + 3) / 2
	 * where both passed relu, -1 / 2 where micro-batch 1's did not. */
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	const fk_call *c[4];
	cr_assert_eq(calls_of(FK_RECV, c, 4), 2);
	for (int j = 0; j < 2; j++) {
		cr_assert_eq(c[j]->peer, 1);
		cr_assert_eq(c[j]->tag, (int)got_v);
		cr_assert_eq(c[j]->count, 6 * sizeof(float));
	}
	expect_pipe_update(p, w);
	free_ranked(p, g, pg);
}

static struct {
	unsigned char *act[64];
	int n;
} acts;

static loom_status act_run_node(void *ctx, const loom_plan *pl, const loom_arena *a, loom_value v)
{
	if (acts.n < 64)
		acts.act[acts.n++] = a->act;
	return rec_run_node(ctx, pl, a, v);
}

Test(exec, micro_steps_give_each_micro_batch_its_inputs_and_activation_slot)
{
	loom_pg *pg = fake_group(2, 0);
	loom_graph *g;
	loom_value h, w;
	rec_backend.run_node = act_run_node;
	acts.n = 0;
	loom_program *p = compile_pipe(&g, pg, &h, &w);
	const loom_plan *pl = &p->plan;
	const loom_pipe *pp = pl->pipe;
	/* The list: EVAL begins and ends each forward; TRAIN the same, then
	 * each backward, micro-batch j in slot j (GPipe keeps both). */
	static const int want[][3] = { { 0, 0, 0 }, { 0, 1, 0 }, { 1, 0, 1 }, { 1, 1, 1 },
				       { 0, 0, 0 }, { 0, 1, 0 }, { 1, 0, 1 }, { 1, 1, 1 },
				       { 0, 2, 0 }, { 1, 2, 1 } };
	int n = 0;
	cr_assert_eq(pp->slots, 2);
	for (int i = 0; i < pl->n_steps; i++) {
		const loom_step *s = &pl->steps[i];
		if (s->kind == LOOM_STEP_OPTIM)
			continue;
		if (s->kind != LOOM_STEP_MICRO) {
			/* every other step belongs to the micro-batch begun last */
			cr_assert_eq(s->micro, micro_at(pl, i < pp->eval_steps ? 0 : pp->eval_steps, i),
				     "step %d (%s)", i, loom_step_kind_name(s->kind));
			continue;
		}
		cr_assert_lt(n, 10);
		cr_assert_eq(s->micro, want[n][0], "micro step %d (step %d)", n, i);
		cr_assert_eq(s->index, want[n][1], "micro step %d (step %d)", n, i);
		cr_assert_eq(s->first, want[n][2], "micro step %d (step %d)", n, i);
		cr_assert_eq(i < pp->eval_steps, n < 4, "micro step %d on the wrong side of EVAL's", n);
		n++;
	}
	cr_assert_eq(n, 10);
	/* The run: the nodes ran in both slots and nowhere else; micro-batch
	 * 1's inputs reached its forward (its relu(x) was sent), and micro-batch
	 * 0's backward found its own activations in its slot after micro-batch
	 * 1's forward ran in the other (w got -0.5, not 0, where only
	 * micro-batch 0's relu passed). */
	unsigned char *base = p->arena.act;
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	int in[2] = { 0, 0 };
	for (int i = 0; i < acts.n; i++) {
		int slot = acts.act[i] == base ? 0 : acts.act[i] == base + pp->slot_bytes ? 1 : -1;
		cr_assert_geq(slot, 0, "node %d ran outside the slots", i);
		in[slot]++;
	}
	cr_assert(in[0] > 0 && in[1] > 0, "nodes in slot 0: %d, slot 1: %d", in[0], in[1]);
	const fk_call *c[4];
	cr_assert_eq(calls_of(FK_SEND, c, 4), 2);
	cr_assert_eq(((const float *)c[1]->sent)[1], 0.0f, "micro-batch 1's x[1] = -1");
	cr_assert_eq(((const float *)c[1]->sent)[2], 2.0f);
	double wv[6];
	cr_assert_eq(loom_read_f64(p, w, wv, 6), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(wv[1], -0.5, "w[1] = %g", wv[1]);
	cr_assert_eq(wv[0], -2.0, "w[0] = %g", wv[0]);
	free_ranked(p, g, pg);
}


/*
 * An early receive: stage 0's gradient of h (fused into add's relu, so no
 * forward value of the stage dies before the gradient is born and nothing
 * shares its bytes) is posted from the TRAIN run's first step, as each
 * micro-batch's slot is free from then on (GPipe: a slot per micro-batch);
 * the data still lands in each micro-batch's own slot.
 */
Test(exec, a_receive_is_posted_when_its_slot_is_free_before_its_step)
{
	loom_pg *pg = fake_group(2, 0);
	loom_graph *g;
	loom_value h, w;
	loom_program *p = compile_pipe(&g, pg, &h, &w);
	const loom_plan *pl = &p->plan;
	const loom_pipe *pp = pl->pipe;
	int first = pp->eval_steps, n = 0;
	for (int i = first; i < pl->n_steps; i++) {
		const loom_step *s = &pl->steps[i];
		if (s->kind != LOOM_STEP_RECV)
			continue;
		cr_assert_eq(s->post, first, "step %d (micro-batch %d) posts at %d", i, s->micro, s->post);
		n++;
	}
	cr_assert_eq(n, 2);
	cr_assert_eq(pp->n_recv, 2);
	int before = rec.nodes;
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(pp->n_early, 2, "%lld receives posted early", (long long)pp->n_early);
	const fk_call *c[4], *snd[4];
	cr_assert_eq(calls_of(FK_RECV, c, 4), 2);
	cr_assert_eq(calls_of(FK_SEND, snd, 4), 2);
	for (int j = 0; j < 2; j++) {
		cr_assert_eq(c[j]->nodes_at, before, "receive %d posted after %d nodes of the run", j,
			     c[j]->nodes_at - before);
		cr_assert_lt(c[j], snd[0], "receive %d posted after the first send", j);
		cr_assert(c[j]->waited);
		/* its timeout counts from its step, where nodes have run since */
		cr_assert_gt(c[j]->restart_at, c[j]->nodes_at, "receive %d's timeout not restarted at its step", j);
		cr_assert_eq(c[j]->buf, pp->act_base + (size_t)j * pp->slot_bytes + pl->mp.offset[pl->steps[pp->recv_at[j]].v],
			     "receive %d lands outside its micro-batch's slot", j);
	}
	expect_pipe_update(p, w);
	free_ranked(p, g, pg);
}

/*
 * Aliasing: without fusion, relu's h is a value of its own that stage 0
 * sends and that dies (in the plan) where stage 1 reads it, and the
 * planner puts h's gradient in its bytes. Posted early, the receive could
 * land while h is still read (by its send); so it is posted at its step.
 */
Test(exec, a_receive_sharing_a_dead_values_bytes_is_posted_at_its_step)
{
	loom_pg *pg = fake_group(2, 0);
	loom_graph *g;
	loom_value h, w;
	loom_program *p = compile_pipe_fused(&g, pg, &h, &w, 0);
	const loom_plan *pl = &p->plan;
	const loom_pipe *pp = pl->pipe;
	int first = pp->eval_steps, n = 0, nodes_before[2] = { 0, 0 }, nodes = 0;
	for (int i = first; i < pl->n_steps; i++) {
		const loom_step *s = &pl->steps[i];
		nodes += s->kind == LOOM_STEP_NODE && !s->noop;
		if (s->kind != LOOM_STEP_RECV)
			continue;
		cr_assert_eq(pl->mp.offset[s->v], pl->mp.offset[h], "the gradient does not share h's bytes");
		cr_assert_eq(pl->mp.region[s->v], LOOM_REGION_ACT);
		cr_assert_eq(s->post, i, "step %d (micro-batch %d) posts at %d", i, s->micro, s->post);
		nodes_before[n++] = nodes;
	}
	cr_assert_eq(n, 2);
	int before = rec.nodes;
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(pp->n_early, 0, "%lld receives posted early", (long long)pp->n_early);
	const fk_call *c[4];
	cr_assert_eq(calls_of(FK_RECV, c, 4), 2);
	for (int j = 0; j < 2; j++)
		cr_assert_eq(c[j]->nodes_at - before, nodes_before[j],
			     "receive %d posted after %d nodes, its step comes after %d", j,
			     c[j]->nodes_at - before, nodes_before[j]);
	expect_pipe_update(p, w);
	free_ranked(p, g, pg);
}

/*
 * The staged transport (a GPU without a device communicator), forced on
 * the CPU by its test hook: every send reads a host copy and every receive
 * lands in a host buffer outside the arena, uploaded into its micro-batch's
 * slot at its step, so the update is the same as in place.
 */
Test(exec, staged_sends_and_receives_go_through_host_buffers)
{
	loom_pg *pg = fake_group(2, 0);
	loom_graph *g;
	loom_value h, w;
	cr_assert_eq(setenv("LOOM_PIPE_STAGE_HOST", "1", 1), 0);
	loom_program *p = compile_pipe(&g, pg, &h, &w);
	unsetenv("LOOM_PIPE_STAGE_HOST");
	const loom_plan *pl = &p->plan;
	const loom_pipe *pp = pl->pipe;
	cr_assert_eq(pp->xfer, LOOM_PIPE_XFER_STAGED);
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	const unsigned char *lo = pp->act_base, *hi = pp->act_base + pl->mp.act_bytes;
	const fk_call *c[4];
	cr_assert_eq(calls_of(FK_RECV, c, 4), 2);
	cr_assert_eq(calls_of(FK_SEND, c + 2, 2), 2);
	for (int j = 0; j < 4; j++) {
		const unsigned char *b = c[j]->buf;
		cr_assert(b < lo || b >= hi, "%s %d reads or writes the arena's slots",
			  j < 2 ? "receive" : "send", j % 2);
	}
	for (int j = 0; j < 2; j++) {
		const float *got = c[2 + j]->sent;
		for (int e = 0; e < 6; e++)
			cr_assert_eq(got[e], pipe_x[j][e] > 0 ? pipe_x[j][e] : 0.0f,
				     "micro-batch %d, element %d: sent %g", j, e, got[e]);
	}
	cr_assert_eq(pp->n_early, 2);
	expect_pipe_update(p, w);
	free_ranked(p, g, pg);
}

/* Staged, a receive lands in a host buffer and writes the slot only at its
 * step: the gradient that shares h's bytes (unfused) is posted early too. */
Test(exec, a_staged_receive_is_posted_early_even_where_its_bytes_are_shared)
{
	loom_pg *pg = fake_group(2, 0);
	loom_graph *g;
	loom_value h, w;
	cr_assert_eq(setenv("LOOM_PIPE_STAGE_HOST", "1", 1), 0);
	loom_program *p = compile_pipe_fused(&g, pg, &h, &w, 0);
	unsetenv("LOOM_PIPE_STAGE_HOST");
	const loom_plan *pl = &p->plan;
	const loom_pipe *pp = pl->pipe;
	for (int k = 0; k < pp->n_recv; k++) {
		const loom_step *s = &pl->steps[pp->recv_at[k]];
		cr_assert_eq(pl->mp.offset[s->v], pl->mp.offset[h]);
		cr_assert_eq(s->post, pp->eval_steps, "receive %d posts at %d", k, s->post);
	}
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(pp->n_early, 2);
	expect_pipe_update(p, w);
	free_ranked(p, g, pg);
}

/* ------------------------------------------------------------ the pass list */

/*
 * The pass list is the compile pipeline: every pass of loom_compile_passes
 * has a case here, a compile that the pass changes. Compiled whole and with
 * the pass left out (loom_test_skip_pass), the case must differ: the
 * compile's status or message, the plan and step list (--dump-graph's
 * text), the planned peak, or a parameter's initial values. Each compile
 * runs in a child process, so that a pass whose absence crashes a later
 * one counts as a difference too.
 */
typedef struct pass_case {
	const char *pass;
	loom_opt_level level;
	int world, zero, stages, accumulate;
	int conv; /* a conv -> batch norm -> relu -> pool graph, the planner's formats on */
	int vocab; /* a tied classifier of 50 classes, vocab_pad 64 */
	int recompute; /* x -> linear -> gelu -> linear, recompute 1 */
	int fp8; /* amp.fp8 on every product (its stored roundings) */
} pass_case;

static const pass_case pass_cases[] = {
	{ "amp", .level = LOOM_O2 },
	{ "autodiff" },
	{ "recompute", .recompute = 1 },
	{ "device" },
	{ "fuse" },
	{ "formats", .conv = 1 },
	{ "vocab pad", .vocab = 1 },
	{ "fp8 storage", .level = LOOM_O1, .fp8 = 1 },
	{ "slots" },
	{ "pipeline cut", .world = 2, .stages = 2 },
	{ "data parallel", .world = 2 },
	{ "zero3 gathers", .world = 2, .zero = 3 },
	{ "memory plan" },
	{ "accumulation", .accumulate = 1 },
	{ "steps" },
	{ "zero", .world = 2, .zero = 1 },
	{ "pipeline", .world = 2, .stages = 2 },
	{ "backend plan" },
	{ "pipeline limit", .world = 2, .stages = 2 },
	{ "backend arena" },
	{ "initial values" },
};

/* The case compiled, described into f. It runs in a forked child: no
 * Criterion call here (an assertion's report would go down the parent's
 * socket to the runner from a process that is not the test's), what fails
 * is written into the description instead. */
static void describe_compile(const pass_case *k, FILE *f)
{
	loom_graph *g;
	loom_value loss, h, w;
	char err[300];
	loom_pg *pg = k->world > 1 ? fake_group_or_null(k->world, 0, err, sizeof(err)) : NULL;
	loom_program *p = NULL;
	loom_status st;
	if (k->world > 1 && !pg) {
		fprintf(f, "no group: %s\n", err);
		return;
	}
	if (loom_graph_new(&g) != LOOM_OK) {
		fprintf(f, "loom_graph_new failed\n");
		loom_pg_free(pg);
		return;
	}
	if (k->stages) {
		int64_t d[2] = { 2, 3 };
		loom_value x = loom_input(g, "x", LOOM_F32, 2, d);
		w = loom_param(g, "w", LOOM_F32, 2, d, LOOM_INIT_ZEROS, 3);
		h = loom_relu(g, loom_add(g, x, w));
		loom_stage_boundary(g, h);
		loss = loom_sum(g, h);
	} else if (k->conv) {
		int64_t d[4] = { 2, 8, 6, 6 };
		loom_value x = loom_input(g, "x", LOOM_F32, 4, d);
		h = loom_layer_conv2d(g, "c", x, 8, 3, 1, 1, 0);
		h = loom_maxpool2d(g, loom_relu(g, loom_layer_batchnorm2d(g, "b", h)), 2, 2, 0);
		loss = loom_sum(g, h);
	} else if (k->vocab) {
		int64_t dw[2] = { 50, 16 }, di[1] = { 4 };
		loom_value ids = loom_input(g, "ids", LOOM_I32, 1, di);
		w = loom_param(g, "wte", LOOM_F32, 2, dw, LOOM_INIT_KAIMING_UNIFORM, 16);
		h = loom_linear(g, loom_embedding(g, ids, w), w, LOOM_NONE);
		loss = loom_softmax_cross_entropy(g, h, loom_input(g, "labels", LOOM_I32, 1, di));
	} else if (k->recompute) {
		int64_t dx[2] = { 4, 8 }, dw1[2] = { 32, 8 }, dw2[2] = { 8, 32 };
		loom_value x = loom_input(g, "x", LOOM_F32, 2, dx);
		loom_value w1 = loom_param(g, "w1", LOOM_F32, 2, dw1, LOOM_INIT_KAIMING_UNIFORM, 8);
		w = loom_param(g, "w2", LOOM_F32, 2, dw2, LOOM_INIT_KAIMING_UNIFORM, 32);
		h = loom_gelu(g, loom_linear(g, x, w1, LOOM_NONE));
		loss = loom_sum(g, loom_linear(g, h, w, LOOM_NONE));
	} else {
		loss = mlp_on(g);
	}
	loom_compile_opts o;
	mlp_opts(&o, LOOM_OPTIM_SGD);
	o.optim.momentum = 0.9;
	o.amp.level = k->level;
	o.amp.half = LOOM_BF16;
	o.pg = pg;
	o.zero_stage = k->zero;
	o.bucket_cap_mb = o.first_bucket_mb = 100e-6;
	o.pipeline_stages = k->stages;
	o.vocab_pad = k->vocab ? 64 : 0;
	o.recompute = k->recompute;
	o.amp.fp8 = o.amp.fp8_all_products = k->fp8;
	o.micro_batches = k->stages ? 2 : 0;
	if (k->conv) { /* .bazelrc pins LOOM_FORMATS=nchw for the other tests */
		unsetenv("LOOM_FORMATS");
		o.formats = LOOM_FORMATS_AUTO;
	}
	st = loom_compile(g, loss, &o, &p);
	fprintf(f, "status %d: %s\n", (int)st, st != LOOM_OK ? loom_last_error() : "");
	if (st == LOOM_OK) {
		loom_program_dump(p, f);
		fprintf(f, "peak %zu\n", loom_plan_peak(&p->plan, p->peak_extra));
		for (int v = 0; !k->stages && v < g->n; v++) {
			if (g->nodes[v].op != LOOM_OP_PARAM)
				continue;
			double val[32];
			size_t n = (size_t)loom_shape_numel(&g->nodes[v].shape);
			n = n < 32 ? n : 32;
			if (n == (size_t)loom_shape_numel(&g->nodes[v].shape) &&
			    loom_read_f64(p, v, val, n) == LOOM_OK)
				for (size_t i = 0; i < n; i++)
					fprintf(f, "%s[%zu] %.17g\n", g->nodes[v].name, i, val[i]);
		}
	}
	/* Sent before the teardown, so that a crash there (a pass left out)
	 * shows after the description instead of replacing it. */
	fflush(f);
	free_ranked(p, g, pg);
}

/* A compile that a missing pass made crash ends its child quietly (no
 * sanitizer report: the crash is the difference the test looks for). */
static void crashed(int sig)
{
	_exit(100 + sig);
}

/* describe_compile's text from a child process (with the pass named
 * left out), or the way the child ended. */
static char *compiled_in_child(const pass_case *k, const char *skip)
{
	int fd[2];
	cr_assert_eq(pipe(fd), 0);
	fflush(NULL);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(fd[0]);
		if (!freopen("/dev/null", "w", stderr))
			_exit(3);
		struct sigaction sa = { .sa_handler = crashed };
		sigaction(SIGSEGV, &sa, NULL);
		sigaction(SIGBUS, &sa, NULL);
		loom_test_skip_pass = skip;
		FILE *f = fdopen(fd[1], "w");
		describe_compile(k, f);
		fclose(f);
		_exit(0);
	}
	close(fd[1]);
	char *buf = NULL;
	size_t len = 0;
	FILE *out = open_memstream(&buf, &len);
	char chunk[4096];
	ssize_t n;
	while ((n = read(fd[0], chunk, sizeof(chunk))) != 0) {
		if (n < 0 && errno == EINTR)
			continue;
		cr_assert_gt(n, 0, "reading the child's description: %s", strerror(errno));
		fwrite(chunk, 1, (size_t)n, out);
	}
	close(fd[0]);
	int ws;
	pid_t w;
	while ((w = waitpid(pid, &ws, 0)) < 0 && errno == EINTR)
		;
	cr_assert_eq(w, pid, "waitpid: %s", strerror(errno));
	if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
		fprintf(out, "\nchild ended: %d\n", WIFEXITED(ws) ? WEXITSTATUS(ws) : -WTERMSIG(ws));
	fclose(out);
	return buf;
}

static void pass_setup(void)
{
	memset(&rec, 0, sizeof(rec));
	fk_reset();
	loom_test_backend = NULL;
	loom_test_skip_pass = NULL;
}

TestSuite(passes, .init = pass_setup, .fini = teardown);

Test(passes, every_pass_of_the_list_has_a_case_and_every_case_a_pass)
{
	size_t nc = sizeof(pass_cases) / sizeof(pass_cases[0]);
	for (int i = 0; i < loom_n_compile_passes; i++) {
		size_t c = 0;
		while (c < nc && strcmp(pass_cases[c].pass, loom_compile_passes[i]->name) != 0)
			c++;
		cr_expect_lt(c, nc, "pass '%s' has no case in tests/engine/test_exec.c",
			     loom_compile_passes[i]->name);
	}
	for (size_t c = 0; c < nc; c++) {
		int i = 0;
		while (i < loom_n_compile_passes &&
		       strcmp(pass_cases[c].pass, loom_compile_passes[i]->name) != 0)
			i++;
		cr_expect_lt(i, loom_n_compile_passes, "case '%s' names no pass of the list",
			     pass_cases[c].pass);
	}
}

Test(passes, each_pass_left_out_changes_what_compiles, .timeout = 120)
{
	for (size_t c = 0; c < sizeof(pass_cases) / sizeof(pass_cases[0]); c++) {
		const pass_case *k = &pass_cases[c];
		char *whole = compiled_in_child(k, NULL);
		char *again = compiled_in_child(k, NULL);
		char *without = compiled_in_child(k, k->pass);
		cr_expect(strncmp(whole, "status 0:", 9) == 0, "case '%s' does not compile: %s",
			  k->pass, whole);
		cr_expect(!strstr(whole, "\nchild ended"), "case '%s', every pass run, ends badly: %s",
			  k->pass, whole);
		/* else a difference could be noise */
		cr_expect(strcmp(whole, again) == 0, "case '%s' compiles differently twice", k->pass);
		if (getenv("LOOM_TEST_SHOW_PASSES"))
			fprintf(stderr, "--- %s left out:\n%.600s\n", k->pass, without);
		cr_expect(strcmp(whole, without) != 0,
			  "pass '%s' left out, its case compiles the same plan:\n%s", k->pass, whole);
		free(whole);
		free(again);
		free(without);
	}
}
