/*
 * tests/engine/test_async.c — the executor on an asynchronous backend, with
 * no GPU: a fake device (the CPU backend's kernels behind two streams and
 * events, LOOM_BE_ASYNC_STREAMS) and a fake stream-ordered communicator
 * (as NCCL: a collective's end is in the order of the stream it was given,
 * its works made once). A collective lands only when the device reaches it
 * (a wait of the compute stream on an event after it on the communication
 * stream): an update that read a bucket before its sum would show. The
 * suites prove that a step never waits on the host (no wait or test of a
 * collective, no synchronise, from the step's thread between run_begin and
 * run_end), that the watchdog thread ends the works and names a collective
 * that never completes with the backend's own message (then aborts the
 * communicator), and that every step kind a data-parallel plan has runs
 * under it with one process's numbers; ZeRO's overflow verdict summed on
 * the device; and the executor's graph driver (suite graph): the first
 * training step eager, the second walked under capture, the later ones
 * replayed, a failed capture said once and run eagerly, the refusals;
 * over two ranks (suite graph_ranks), the captured step's collectives
 * seen by the watchdog through progress marks the fake device writes late
 * (at the host's next synchronise), a collective that never completes in
 * a replay named within the timeout with the same message, and the
 * capture refused, with its reason, where marks cannot hold. A WAIT for
 * one collective (ZeRO-3's gathers) waits for that one only.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "tests/engine/fake_async.h"

/* ------------------------------------------------------------ the fake device */

enum { FD_MAX_CALLS = 256 };

typedef struct fd_call {
	int op; /* 0 all-reduce, 1 reduce-scatter, 2 all-gather */
	void *buf;
	size_t count;
	loom_dtype dt;
	atomic_int landed; /* the device ran it (the watchdog thread reads this) */
} fd_call;

struct loom_comm_work {
	int call; /* the last start given this work */
	int kept;
};

static struct {
	pthread_t step_thread;
	int in_step;
	/* The step's thread waited on the host inside a step. */
	int host_waits, syncs_in_step;
	int works_made, starts, starts_reused, aborts, hung_call;
	int event_of[16]; /* event -> calls started on the comm stream before its record */
	int comm_started; /* calls queued on the comm stream so far */
	int landed_before_optim, optims;
	/* Compute-stream waits that left later collectives in flight (a
	 * WAIT for one collective). */
	int partial_waits;
	atomic_int mark_waits; /* wait_mark calls (the watchdog's thread) */
	fd_call calls[FD_MAX_CALLS];
	int n;
	const loom_backend *cpu;
} fd;

static int on_step_thread(void)
{
	return pthread_equal(pthread_self(), fd.step_thread);
}

/* The device runs call k: its effect, as test_exec's fake group of two
 * predicts it (the other rank has the same data). */
static void land(loom_comm *c, int k)
{
	fd_call *x = &fd.calls[k];
	if (atomic_load(&x->landed) || k == fd.hung_call)
		return;
	float *f = x->buf;
	size_t n = x->count;
	cr_assert_eq(x->dt, LOOM_F32, "the fake sums f32 only");
	if (x->op == 0)
		fake_twice(f, n, x->dt, c->world);
	else if (x->op == 1)
		fake_twice(f + n * (size_t)c->rank, n, x->dt, c->world);
	else
		for (int r = 0; r < c->world; r++)
			for (size_t e = n * (size_t)r; r != c->rank && e < n * (size_t)(r + 1); e++)
				f[e] = 1000.0f + (float)e;
	atomic_store(&x->landed, 1);
}

static loom_status fd_start(loom_comm *c, int op, void *buf, size_t count, loom_dtype dt,
			    void *stream, loom_comm_work **out)
{
	cr_assert_eq(stream, &fake_streams[LOOM_STREAM_COMM], "a collective on another stream");
	cr_assert_lt(fd.n, FD_MAX_CALLS);
	loom_comm_work *w = *out;
	fd.starts++;
	if (w)
		fd.starts_reused++;
	else if (!(w = calloc(1, sizeof(*w))))
		return loom_comm_fail(c, LOOM_ERR_NOMEM, "fake: out of memory");
	fd.calls[fd.n] = (fd_call){ .op = op, .buf = buf, .count = count, .dt = dt };
	w->call = fd.n++;
	fd.comm_started = fd.n;
	*out = w;
	return LOOM_OK;
}

static loom_status fd_allreduce_start(loom_comm *c, void *buf, size_t count, loom_dtype dt,
				      void *stream, loom_comm_work **out)
{
	return fd_start(c, 0, buf, count, dt, stream, out);
}

static loom_status fd_reduce_scatter_start(loom_comm *c, void *buf, size_t count, loom_dtype dt,
					   void *stream, loom_comm_work **out)
{
	return fd_start(c, 1, buf, count, dt, stream, out);
}

static loom_status fd_allgather_start(loom_comm *c, void *buf, size_t count, loom_dtype dt,
				      void *stream, loom_comm_work **out)
{
	return fd_start(c, 2, buf, count, dt, stream, out);
}

static loom_status fd_test(loom_comm *c, loom_comm_work *w, int *done)
{
	(void)c;
	if (on_step_thread() && fd.in_step)
		fd.host_waits++;
	*done = atomic_load(&fd.calls[w->call].landed);
	return LOOM_OK;
}

/* Past the group's timeout: NCCL's wording (comm/nccl.cu's timed_out) with
 * this backend's name. */
static loom_status fd_timed_out(loom_comm *c, const fd_call *x)
{
	char who[256];
	loom_pg_name_dead(c->pg, who, sizeof(who));
	return loom_comm_fail(c, LOOM_ERR_IO,
			      "rank %d: fake all-reduce of %zu %s timed out after %.1f s: %s",
			      c->pg->info.rank, x->count, loom_dtype_name(x->dt), c->pg->timeout_s,
			      who);
}

/* Polls until the device ran the call, within the group's timeout. */
static loom_status fd_wait(loom_comm *c, loom_comm_work *w)
{
	fd_call *x = &fd.calls[w->call];
	double t0 = loom_comm_now();
	loom_status st = LOOM_OK;
	if (on_step_thread() && fd.in_step)
		fd.host_waits++;
	while (!c->broken && !atomic_load(&x->landed)) {
		if (loom_comm_now() - t0 > c->pg->timeout_s) {
			st = fd_timed_out(c, x);
			break;
		}
		usleep(1000);
	}
	if (c->broken && st == LOOM_OK && !atomic_load(&x->landed))
		st = LOOM_ERR_STATE;
	if (!w->kept)
		free(w);
	return st;
}

/* A replayed collective: polls its mark (no event, no start), within the
 * timeout from the launch, with the same message; never frees w. */
static loom_status fd_wait_mark(loom_comm *c, loom_comm_work *w, const volatile uint64_t *mark,
				uint64_t serial, double t0)
{
	fd_call *x = &fd.calls[w->call];
	loom_status st = LOOM_OK;
	atomic_fetch_add(&fd.mark_waits, 1);
	if (on_step_thread() && fd.in_step)
		fd.host_waits++;
	while (!c->broken && __atomic_load_n(mark, __ATOMIC_ACQUIRE) < serial) {
		if (loom_comm_now() - t0 > c->pg->timeout_s) {
			st = fd_timed_out(c, x);
			break;
		}
		usleep(1000);
	}
	if (c->broken && st == LOOM_OK && __atomic_load_n(mark, __ATOMIC_ACQUIRE) < serial)
		st = LOOM_ERR_STATE;
	return st;
}

static loom_status fd_work_make(loom_comm *c, loom_comm_work **out)
{
	(void)c;
	loom_comm_work *w = calloc(1, sizeof(*w));
	cr_assert_not_null(w);
	w->kept = 1;
	fd.works_made++;
	*out = w;
	return LOOM_OK;
}

static void fd_work_free(loom_comm *c, loom_comm_work *w)
{
	(void)c;
	free(w);
}

static loom_status fd_broadcast(loom_comm *c, void *buf, size_t bytes, int root)
{
	(void)buf, (void)bytes;
	cr_assert_eq(root, c->rank);
	return LOOM_OK;
}

/* The host communicator: blocking, world 2 of identical ranks (the
 * start-up checks, ZeRO's verdict). A sum doubles. */
static int host_in_step;
static void *fh_last_buf; /* the last host all-reduce's buffer */

static loom_status fh_allreduce_start(loom_comm *c, void *buf, size_t count, loom_dtype dt,
				      void *stream, loom_comm_work **out)
{
	(void)stream;
	if (on_step_thread() && fd.in_step)
		host_in_step++;
	for (size_t e = 0; dt == LOOM_F32 && e < count; e++)
		((float *)buf)[e] *= (float)c->world;
	fh_last_buf = buf;
	*out = calloc(1, sizeof(**out));
	return LOOM_OK;
}

/* In the stream's order: the device runs it when it gets there, which in
 * this model (the compute stream runs eagerly) is now. */
static int ordered_calls;

static loom_status fd_allreduce_ordered(loom_comm *c, void *buf, size_t count, loom_dtype dt,
					void *stream)
{
	cr_assert_eq(stream, &fake_streams[LOOM_STREAM_COMPUTE]);
	cr_assert(dt == LOOM_I32 || dt == LOOM_F64);
	fake_twice(buf, count, dt, c->world);
	ordered_calls++;
	return LOOM_OK;
}

/* The max of two identical ranks' values: the values. */
static int max_calls;

static loom_status fd_allreduce_max_ordered(loom_comm *c, void *buf, size_t count, loom_dtype dt,
					    void *stream)
{
	(void)c, (void)buf, (void)count;
	cr_assert_eq(stream, &fake_streams[LOOM_STREAM_COMPUTE]);
	cr_assert_eq(dt, LOOM_F32);
	max_calls++;
	return LOOM_OK;
}

static void fd_abort(loom_comm *c)
{
	(void)c;
	fd.aborts++;
}

static const loom_comm_i fd_iface = {
	.name = "fake-device",
	.stream_ordered = 1,
	.allreduce_start = fd_allreduce_start,
	.test = fd_test,
	.wait = fd_wait,
	.broadcast = fd_broadcast,
	.allgather = fake_comm_allgather,
	.barrier = fake_comm_barrier,
	.abort = fd_abort,
	.free = fake_comm_free,
	.allreduce_ordered = fd_allreduce_ordered,
	.reduce_scatter_start = fd_reduce_scatter_start,
	.allgather_start = fd_allgather_start,
	.work_make = fd_work_make,
	.work_free = fd_work_free,
	.wait_mark = fd_wait_mark,
	.allreduce_max_ordered = fd_allreduce_max_ordered,
};

static const loom_comm_i fh_iface = {
	.name = "fake-host",
	.allreduce_start = fh_allreduce_start,
	.wait = fake_comm_wait_free,
	.broadcast = fd_broadcast,
	.allgather = fake_comm_allgather,
	.barrier = fake_comm_barrier,
	.abort = fd_abort,
	.free = fake_comm_free,
};

/* ------------------------------------------------------------ the async backend */

/* Event `ev` on the comm stream marks the collectives queued there so far;
 * a wait of the compute stream for it makes the device run them first. */
static loom_status fd_event_record(void *ctx, int ev, loom_stream stream)
{
	(void)ctx;
	cr_assert(ev >= 0 && ev < 16);
	fd.event_of[ev] = stream == LOOM_STREAM_COMM ? fd.comm_started : -1;
	return LOOM_OK;
}

static loom_pg *the_pg;

static loom_status fd_event_wait(void *ctx, int ev, loom_stream stream)
{
	(void)ctx;
	if (stream == LOOM_STREAM_COMPUTE) {
		for (int k = 0; k < fd.event_of[ev]; k++)
			land(the_pg->device, k);
		fd.partial_waits += fd.event_of[ev] >= 0 && fd.event_of[ev] < fd.comm_started;
	}
	return LOOM_OK;
}

/* The fake device's progress marks (a graph's collectives, as the CUDA
 * backend's mark_*): the words the host reads, the launch serial, the
 * slots the capture recorded. The device writes them late: at the host's
 * next synchronise (a slot hung is never written). */
enum { MK_MAX = 64 };
static struct {
	uint64_t words[MK_MAX];
	uint64_t serial;
	int recorded[MK_MAX];
	int n_records, hung_slot;
	int launched;     /* a launch in this run (capture_end's or a replay) */
	int late_at_end;  /* runs whose marks were not yet written at run_end */
	uint64_t handed_by_end; /* watchdog hand-offs seen at those run_ends */
} mk;

static void mk_device_catches_up(void)
{
	for (int k = 0; k < MK_MAX; k++)
		if (mk.recorded[k] && k != mk.hung_slot)
			__atomic_store_n(&mk.words[k], mk.serial, __ATOMIC_RELEASE);
}

static loom_status fd_run_begin(void *ctx, const loom_plan *pl, const loom_arena *a,
				loom_train_state *ts, unsigned flags)
{
	fd.in_step = 1;
	return fd.cpu->run_begin(ctx, pl, a, ts, flags);
}

static loom_status fd_run_end(void *ctx, const loom_plan *pl, const loom_arena *a,
			      loom_train_state *ts)
{
	fd.in_step = 0;
	if (mk.launched) {
		int late = 0;
		for (int k = 0; k < MK_MAX; k++)
			late |= mk.recorded[k] && mk.words[k] < mk.serial;
		mk.late_at_end += late;
		uint64_t handed, ended;
		loom_comm_watch_counts(the_pg ? the_pg->device : NULL, &handed, &ended);
		mk.handed_by_end = handed;
		mk.launched = 0;
	}
	return fd.cpu->run_end(ctx, pl, a, ts);
}

/* ZeRO's overflow flag "on the device": this rank's check, left for the
 * ordered all-reduce to sum. */
static int32_t fd_flag;
static int device_verdicts;

static loom_status fd_grads_finite_device(void *ctx, const loom_plan *pl, const loom_arena *a,
					  int first, int last, void **flag)
{
	int finite = 0;
	loom_status st = fd.cpu->sharded->grads_finite(ctx, pl, a, first, last, &finite);
	fd_flag = !finite;
	*flag = &fd_flag;
	device_verdicts++;
	return st;
}

/* The update reads the buckets: every collective queued before it must
 * have landed (a device wait came first). */
static loom_status fd_optim(void *ctx, const loom_plan *pl, const loom_arena *a,
			    loom_train_state *ts, int first, int last, int finite)
{
	if (finite == LOOM_FINITE_ON_DEVICE)
		finite = fd_flag == 0;
	fd.optims++;
	int all = 1;
	for (int k = 0; k < fd.n; k++)
		all &= atomic_load(&fd.calls[k].landed) || k == fd.hung_call;
	fd.landed_before_optim += all;
	return fd.cpu->optim(ctx, pl, a, ts, first, last, finite);
}

/* The host waits for the device: everything queued lands. */
static loom_status fd_synchronize(void *ctx, const loom_plan *pl, loom_train_state *ts)
{
	if (fd.in_step)
		fd.syncs_in_step++;
	for (int k = 0; the_pg && k < fd.n; k++)
		land(the_pg->device, k);
	mk_device_catches_up();
	return fd.cpu->synchronize(ctx, pl, ts);
}

static loom_status fd_download(void *ctx, void *dst, const void *src, size_t bytes)
{
	if (fd.in_step)
		fd.syncs_in_step++;
	return fd.cpu->download(ctx, dst, src, bytes);
}

static loom_backend fd_backend;
static loom_backend_sharded fd_sharded;
static loom_backend_graph_ops fd_graph;
static loom_backend_marks fd_marks;
static loom_opt_level mlp_level = LOOM_O0; /* the MLP's opt level */
static int mlp_fp8; /* O1 bf16 + fp8 delayed, every product */

static void setup(void)
{
	memset(&fd, 0, sizeof(fd));
	memset(&mk, 0, sizeof(mk));
	mk.hung_slot = -1;
	host_in_step = ordered_calls = device_verdicts = max_calls = 0;
	the_pg = NULL;
	fd.hung_call = -1;
	fd.step_thread = pthread_self();
	fd.cpu = &loom_cpu_backend;
	fake_async_backend(&fd_backend);
	fd_backend.event_record = fd_event_record;
	fd_backend.event_wait = fd_event_wait;
	fd_backend.run_begin = fd_run_begin;
	fd_backend.run_end = fd_run_end;
	fd_backend.optim = fd_optim;
	fd_backend.synchronize = fd_synchronize;
	fd_backend.download = fd_download;
	fd_sharded = *loom_cpu_backend.sharded;
	fd_sharded.grads_finite_device = fd_grads_finite_device;
	fd_backend.sharded = &fd_sharded;
	loom_test_backend = &fd_backend;
}

static void teardown(void)
{
	loom_test_backend = NULL;
	mlp_level = LOOM_O0;
	mlp_fp8 = 0;
}

/* A single process's group made into rank 0 of 2, with the fake host and
 * the fake device communicators. */
static loom_pg *fake_group(double timeout_s)
{
	return the_pg = fake_group_of_two(timeout_s, &fh_iface, &fd_iface);
}

/* x [6, 4] -> linear 4->8 -> relu -> linear 8->3 -> CE with y (test_exec's). */
static loom_program *compile_mlp(loom_graph **gp, loom_pg *pg, int zero)
{
	loom_compile_opts o;
	fake_mlp_opts(&o, pg, zero, 0.1);
	o.amp.level = mlp_level;
	if (mlp_fp8) {
		o.amp.level = LOOM_O1;
		o.amp.half = LOOM_BF16;
		o.amp.fp8 = o.amp.fp8_all_products = 1;
		o.amp.fp8_scaling = LOOM_FP8_SCALING_DELAYED;
	}
	return fake_mlp_compile(gp, &o);
}

/* The same MLP in one process on the CPU backend: the reference. */
static loom_program *compile_one(loom_graph **gp)
{
	const loom_backend *keep = loom_test_backend;
	loom_test_backend = NULL;
	loom_program *p = compile_mlp(gp, NULL, 0);
	loom_test_backend = keep;
	return p;
}

static void expect_equal(const loom_plan *pl, loom_value v, const float *a, const float *b,
			 int64_t e)
{
	cr_assert_eq(a[e], b[e], "%s[%lld]: %g, one process's %g", pl->g->nodes[v].name,
		     (long long)e, a[e], b[e]);
}

/* Every parameter; or (ZeRO) the elements in this rank's shard of their
 * bucket, the rest being the fake's sentinels gathered from rank 1. */
static void expect_params_equal(loom_program *p, loom_program *one, int only_shard)
{
	const loom_plan *pl = &p->plan;
	const loom_buckets *bk = &pl->buckets;
	int seen = 0;
	for (int s = 0; s < pl->n_params; s++) {
		loom_value v = pl->params[s].param;
		const float *a = loom_arena_ptr(&p->arena, pl, v);
		const float *b = loom_arena_ptr(&one->arena, &one->plan, v);
		if (!only_shard) {
			for (int64_t e = 0; e < pl->params[s].numel; e++, seen++)
				expect_equal(pl, v, a, b, e);
			continue;
		}
		for (int k = 0; k < bk->n; k++)
			for (int j = bk->b[k].first; j < bk->b[k].first + bk->b[k].n; j++) {
				if (bk->grad[j] != pl->params[s].grad)
					continue;
				int64_t e0 = (int64_t)(bk->offset[j] / sizeof(float));
				for (int64_t e = 0; e < pl->params[s].numel && e0 + e < bk->b[k].count / 2;
				     e++, seen++)
					expect_equal(pl, v, a, b, e);
			}
	}
	cr_assert_gt(seen, 0);
}

static void free_all(loom_program *p, loom_graph *g)
{
	loom_program_free(p);
	loom_graph_free(g);
}

/* The MLP on `pg` (no ZeRO, two buckets or more) and the one-process
 * reference, each trained `steps` steps. */
static loom_program *train_beside_one(loom_pg *pg, int steps, loom_graph **g,
				      loom_program **one, loom_graph **g1)
{
	loom_program *p = compile_mlp(g, pg, 0);
	*one = compile_one(g1);
	cr_assert_geq(p->plan.buckets.n, 2, "buckets: %d", p->plan.buckets.n);
	for (int step = 0; step < steps; step++) {
		cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
		cr_assert_eq(loom_run(*one, LOOM_RUN_TRAIN), LOOM_OK, "%s",
			     loom_program_error(*one));
	}
	return p;
}

/* A step (status st) that met an all-reduce of `count` f32 that never
 * ended: refused with the fake's timeout message (0.3 s), no host wait,
 * the communicator aborted once and broken; every later step refuses,
 * with the same cause. */
static void expect_timed_out(loom_program *p, loom_pg *pg, loom_status st, long long count)
{
	cr_assert_neq(st, LOOM_OK, "a collective that never ended went unnoticed");
	const char *msg = loom_program_error(p);
	char want[96];
	snprintf(want, sizeof(want), "all-reduce of %lld f32 timed out after 0.3 s", count);
	cr_assert(strstr(msg, "rank 0: fake") && strstr(msg, want), "message: %s", msg);
	cr_assert_eq(fd.host_waits, 0, "the step waited on the host");
	cr_assert_eq(fd.aborts, 1, "the communicator was aborted %d times", fd.aborts);
	cr_assert(pg->device->broken);
	cr_assert_neq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK);
}

TestSuite(async, .init = setup, .fini = teardown);

Test(async, a_step_never_waits_on_the_host_and_the_watchdog_ends_each_collective)
{
	loom_pg *pg = fake_group(10.0);
	loom_graph *g, *g1;
	loom_program *one, *p = train_beside_one(pg, 3, &g, &one, &g1);
	int nb = p->plan.buckets.n;
	/* Inside the steps: no wait, test or synchronise from this thread. */
	cr_assert_eq(fd.host_waits, 0, "the step waited %d times on the host", fd.host_waits);
	cr_assert_eq(fd.syncs_in_step, 0, "the step synchronised %d times", fd.syncs_in_step);
	/* The update read every sum: the device wait came before it. */
	cr_assert_eq(fd.optims, 3);
	cr_assert_eq(fd.landed_before_optim, 3, "an update ran before its bucket's sum landed");
	/* One work per bucket, made once, reused by every start. */
	cr_assert_eq(fd.works_made, nb);
	cr_assert_eq(fd.starts, 3 * nb);
	cr_assert_eq(fd.starts_reused, 3 * nb);
	/* The watchdog was handed each collective and ended it. */
	uint64_t handed, ended;
	cr_assert_eq(loom_comm_watch_drain(pg->device), LOOM_OK);
	loom_comm_watch_counts(pg->device, &handed, &ended);
	cr_assert_geq(handed, (uint64_t)nb);
	cr_assert_eq(handed, ended);
	/* Two ranks' sums averaged: one process's parameters, bit for bit. */
	expect_params_equal(p, one, 0);
	cr_assert_eq(fd.aborts, 0);
	free_all(one, g1);
	free_all(p, g);
	loom_pg_free(pg);
}

Test(async, the_watchdog_names_a_collective_that_never_completes_and_aborts, .timeout = 60)
{
	loom_pg *pg = fake_group(0.3);
	loom_graph *g;
	loom_program *p = compile_mlp(&g, pg, 0);
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	/* The next step's second collective never completes. */
	fd.hung_call = fd.n + 1;
	loom_status st = loom_run(p, LOOM_RUN_TRAIN);
	expect_timed_out(p, pg, st, (long long)fd.calls[fd.hung_call].count);
	free_all(p, g);
	loom_pg_free(pg);
}

Test(async, every_step_kind_of_a_zero_plan_runs_on_the_async_backend)
{
	loom_pg *pg = fake_group(10.0);
	loom_graph *g, *g1;
	loom_program *p = compile_mlp(&g, pg, 1);
	loom_program *one = compile_one(&g1);
	const loom_plan *pl = &p->plan;
	int kinds = 0;
	for (int i = 0; i < pl->n_steps; i++)
		kinds |= 1 << pl->steps[i].kind;
	int want = 1 << LOOM_STEP_NODE | 1 << LOOM_STEP_ACCUM | 1 << LOOM_STEP_COLLECTIVE |
		   1 << LOOM_STEP_WAIT | 1 << LOOM_STEP_OPTIM | 1 << LOOM_STEP_COPY;
	cr_assert_eq(kinds & want, want, "step kinds %#x", kinds);
	/* Gradient accumulation (no collective), then the folding step. */
	cr_assert_eq(loom_run(p, LOOM_RUN_ACCUMULATE), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(fd.n, 0, "an accumulating run started %d collectives", fd.n);
	cr_assert_eq(loom_run(one, LOOM_RUN_ACCUMULATE), LOOM_OK, "%s", loom_program_error(one));
	/* One update: the next would read the sentinels gathered into the
	 * other half of each parameter. */
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_run(one, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(one));
	cr_assert_eq(fd.host_waits, 0, "the step waited %d times on the host", fd.host_waits);
	cr_assert_eq(fd.landed_before_optim, 1);
	cr_assert_eq(fd.n, 2 * pl->buckets.n, "a reduce-scatter and an all-gather per bucket");
	cr_assert_eq(fd.starts, fd.starts_reused);
	/* Nor through the host communicator (fp32, no clipping: ZeRO takes
	 * no shard-wide verdict or norm, which under loss scaling or
	 * clipping still cross the host). */
	cr_assert_eq(host_in_step, 0);
	/* This rank's shard updated as one process's (the other half holds
	 * the fake's sentinels). */
	expect_params_equal(p, one, 1);
	free_all(one, g1);
	free_all(p, g);
	loom_pg_free(pg);
}

Test(async, zeros_overflow_verdict_is_summed_on_the_device)
{
	loom_pg *pg = fake_group(10.0);
	loom_graph *g, *g1;
	mlp_level = LOOM_O1; /* fp16, dynamic loss scaling: a verdict per update */
	loom_program *p = compile_mlp(&g, pg, 1);
	loom_program *one = compile_one(&g1);
	cr_assert(p->plan.scaling);
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_run(one, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(one));
	/* This rank's check summed over the ranks in the compute stream's
	 * order; nothing through the host communicator, no host wait. */
	cr_assert_eq(device_verdicts, 1);
	cr_assert_eq(ordered_calls, 1);
	cr_assert_eq(host_in_step, 0, "the verdict crossed the host %d times", host_in_step);
	cr_assert_eq(fd.host_waits, 0);
	cr_assert_eq(fd.landed_before_optim, 1);
	expect_params_equal(p, one, 1);
	free_all(one, g1);
	free_all(p, g);
	loom_pg_free(pg);
}

/* ------------------------------------------------------------ the step as one graph */

static struct {
	int begins, keeps, drops, replays, nodes, nodes_captured, fail_end;
} gr;

static loom_status gr_capture_begin(void *ctx, const loom_plan *pl)
{
	(void)ctx, (void)pl;
	gr.begins++;
	return LOOM_OK;
}

static loom_status gr_capture_end(void *ctx, const loom_plan *pl, int keep)
{
	(void)ctx, (void)pl;
	if (!keep) {
		gr.drops++;
		return LOOM_OK;
	}
	if (gr.fail_end)
		return LOOM_ERR_BACKEND;
	gr.keeps++;
	mk.serial++; /* the captured step runs once */
	mk.launched = 1;
	return LOOM_OK;
}

static loom_status gr_replay(void *ctx, const loom_plan *pl)
{
	(void)ctx, (void)pl;
	gr.replays++;
	mk.serial++;
	mk.launched = 1;
	return LOOM_OK;
}

static loom_status gr_run_node(void *ctx, const loom_plan *pl, const loom_arena *a, loom_value v)
{
	gr.nodes++;
	gr.nodes_captured += gr.begins > gr.keeps + gr.drops;
	return fd.cpu->run_node(ctx, pl, a, v);
}

static loom_status mk_words(void *ctx, int n, const volatile uint64_t **words)
{
	(void)ctx;
	cr_assert_leq(n, MK_MAX);
	*words = mk.words;
	return LOOM_OK;
}

/* After the collectives queued so far on the comm stream, under capture. */
static loom_status mk_record(void *ctx, int slot, loom_stream stream)
{
	(void)ctx;
	cr_assert_eq(stream, LOOM_STREAM_COMM, "a mark on the compute stream");
	cr_assert(gr.begins > gr.keeps + gr.drops, "a mark outside a capture");
	cr_assert(slot >= 0 && slot < MK_MAX);
	mk.recorded[slot] = 1;
	mk.n_records++;
	return LOOM_OK;
}

static uint64_t mk_serial(void *ctx)
{
	(void)ctx;
	return mk.serial;
}

static void graph_setup(void)
{
	setup();
	memset(&gr, 0, sizeof(gr));
	fd_graph = (loom_backend_graph_ops){ .capture_begin = gr_capture_begin,
					     .capture_end = gr_capture_end,
					     .replay = gr_replay };
	fd_backend.graph = &fd_graph;
	fd_backend.run_node = gr_run_node;
}

TestSuite(graph, .init = graph_setup, .fini = teardown);

Test(graph, the_first_step_runs_eagerly_the_second_is_captured_the_rest_replayed)
{
	loom_graph *g;
	loom_program *p = compile_mlp(&g, NULL, 0);
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	int per_step = gr.nodes;
	cr_assert_gt(per_step, 0);
	cr_assert_eq(gr.begins, 0, "the first step was captured");
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(gr.begins, 1);
	cr_assert_eq(gr.keeps, 1);
	cr_assert_eq(gr.nodes_captured, per_step, "the capture walked %d nodes of %d",
		     gr.nodes_captured, per_step);
	for (int s = 0; s < 3; s++) {
		cr_assert_eq(loom_set_lr(p, 0.01 * (s + 1)), LOOM_OK);
		cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	}
	cr_assert_eq(gr.replays, 3);
	cr_assert_eq(gr.nodes, 2 * per_step, "a replayed step walked its nodes");
	/* Other modes run eagerly beside the graph, which stays. */
	cr_assert_eq(loom_run(p, LOOM_RUN_EVAL), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_gt(gr.nodes, 2 * per_step);
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(gr.replays, 4);
	cr_assert_eq(gr.begins, 1);
	cr_assert_eq(p->exec->graph, 1);
	free_all(p, g);
}

static char logged[4096]; /* every line logged since the test cleared it */

static void keep_log(void *user, const char *line)
{
	size_t n = strlen(logged);
	(void)user;
	snprintf(logged + n, sizeof(logged) - n, "%s", line);
}

Test(graph, a_failed_capture_is_said_once_and_the_steps_run_eagerly)
{
	loom_graph *g;
	loom_program *p = compile_mlp(&g, NULL, 0);
	logged[0] = 0;
	loom_set_log(keep_log, NULL);
	gr.fail_end = 1;
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	int per_step = gr.nodes;
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	/* walked under capture, then again eagerly */
	cr_assert_eq(gr.nodes, 3 * per_step);
	cr_assert_eq(p->exec->graph, -1);
	cr_assert(strstr(logged, "cuda graph: capture failed"), "log: %s", logged);
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(gr.nodes, 4 * per_step);
	cr_assert_eq(gr.begins, 1);
	cr_assert_eq(gr.replays, 0);
	loom_set_log(NULL, NULL);
	free_all(p, g);
}

Test(graph, refused_where_it_cannot_hold_and_off_on_request)
{
	loom_graph *g;
	/* Over two ranks: refused at the first run, with its reason. */
	loom_pg *pg = fake_group(10.0);
	logged[0] = 0;
	loom_set_log(keep_log, NULL);
	loom_program *p = compile_mlp(&g, pg, 0);
	for (int s = 0; s < 3; s++)
		cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(gr.begins + gr.replays, 0);
	cr_assert(strstr(logged, "cuda graph: data parallel over 2 ranks"), "log: %s", logged);
	free_all(p, g);
	loom_pg_free(pg);
	the_pg = NULL;
	/* LOOM_CUDA_GRAPH=0: off. */
	setenv("LOOM_CUDA_GRAPH", "0", 1);
	p = compile_mlp(&g, NULL, 0);
	for (int s = 0; s < 3; s++)
		cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	unsetenv("LOOM_CUDA_GRAPH");
	cr_assert_eq(gr.begins + gr.replays, 0);
	cr_assert_str_eq(p->exec->graph_note, "off (LOOM_CUDA_GRAPH=0)");
	free_all(p, g);
	loom_set_log(NULL, NULL);
}

/* A staged run's end: one process's parameters, bit for bit; all freed. */
static void expect_one_and_free(loom_program *p, loom_graph *g, loom_program *one, loom_graph *g1,
				loom_pg *pg)
{
	expect_params_equal(p, one, 0);
	free_all(one, g1);
	free_all(p, g);
	loom_pg_free(pg);
}

/* Ranks that share a GPU: a group with a host communicator only (NCCL
 * refuses two ranks on one device). The buckets go through host buffers
 * (parallel/ddp_staged.c), summed by the host communicator, and the
 * parameters end as one process's, bit for bit. */
Test(async, without_a_device_communicator_the_buckets_are_staged_through_host_buffers)
{
	loom_pg *pg = the_pg = fake_group_of_two(10.0, &fh_iface, NULL);
	loom_graph *g, *g1;
	loom_program *one, *p = train_beside_one(pg, 3, &g, &one, &g1);
	int nb = p->plan.buckets.n;
	cr_assert_eq(host_in_step, 3 * nb, "host all-reduces %d, buckets %d x 3 steps", host_in_step,
		     nb);
	cr_assert_eq(fd.starts, 0, "a collective reached the device communicator");
	/* the sums were taken in a host copy, not in the arena's buckets */
	const unsigned char *b = fh_last_buf, *arena = p->arena.bucket;
	cr_assert(b && (b < arena || b >= arena + p->plan.buckets.b[nb - 1].base +
					    p->plan.buckets.b[nb - 1].bytes),
		  "the host summed the device's bucket in place");
	/* choosing the staged path is not a failure of the group's */
	cr_assert_str_empty(loom_pg_error(pg), "%s", loom_pg_error(pg));
	expect_one_and_free(p, g, one, g1, pg);
}

/* LOOM_DDP_STAGE_HOST=1 stages where the device communicator is open. */
Test(async, the_switch_stages_beside_an_open_device_communicator)
{
	loom_pg *pg = fake_group(10.0);
	setenv("LOOM_DDP_STAGE_HOST", "1", 1);
	loom_graph *g, *g1;
	loom_program *one, *p = train_beside_one(pg, 2, &g, &one, &g1);
	unsetenv("LOOM_DDP_STAGE_HOST");
	cr_assert_eq(fd.starts, 0, "a collective reached the device communicator");
	cr_assert_eq(host_in_step, 2 * p->plan.buckets.n);
	expect_one_and_free(p, g, one, g1, pg);
}

/* x [6, 4] as [6, 2, 2, 1] -> batch norm -> linear 4->3 -> CE with y. */
static loom_program *compile_bn(loom_graph **gp, loom_pg *pg, int zero, int sync_bn)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t xd[2] = { 6, 4 }, yd[1] = { 6 }, nchw[4] = { 6, 2, 2, 1 };
	loom_value x = loom_input(g, "x", LOOM_F32, 2, xd);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	loom_value h = loom_layer_batchnorm2d(g, "bn", loom_reshape(g, x, 4, nchw));
	loom_value l = loom_softmax_cross_entropy(g, loom_layer_linear(g, "fc", loom_flatten(g, h),
								       3, 1), y);
	loom_compile_opts o;
	fake_mlp_opts(&o, pg, zero, 0.1);
	o.sync_bn = sync_bn;
	loom_program *p = NULL;
	*gp = g;
	if (loom_compile(g, l, &o, &p) != LOOM_OK) {
		loom_program_free(p);
		return NULL;
	}
	fake_mlp_inputs(p);
	return p;
}

/* What staging does not carry yet (ZeRO) is refused with one line naming
 * it; synchronised batch norm's sums go through the host too, and two
 * identical ranks train as one process does. */
Test(async, staging_refuses_zero_and_stages_sync_bn)
{
	loom_pg *pg = the_pg = fake_group_of_two(10.0, &fh_iface, NULL);
	loom_graph *g, *g1;
	cr_assert_null(compile_bn(&g, pg, 1, 0), "ZeRO compiled under staging");
	const char *msg = loom_last_error();
	cr_assert(strstr(msg, "staged through host memory") &&
		  strstr(msg, "ZeRO (its reduce-scatter and all-gather) is not staged yet"), "%s", msg);
	loom_graph_free(g);
	loom_program *p = compile_bn(&g, pg, 0, 1);
	cr_assert_not_null(p, "%s", loom_last_error());
	loom_test_backend = NULL;
	loom_program *one = compile_bn(&g1, NULL, 0, 0);
	loom_test_backend = &fd_backend;
	cr_assert_not_null(one, "%s", loom_last_error());
	for (int step = 0; step < 3; step++) {
		cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
		cr_assert_eq(loom_run(one, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(one));
	}
	/* the statistics' sums (forward and backward) beside the buckets' */
	cr_assert_gt(host_in_step, 3 * p->plan.buckets.n, "host all-reduces: %d", host_in_step);
	for (int s = 0; s < p->plan.n_params; s++) {
		loom_value v = p->plan.params[s].param;
		const float *a = loom_arena_ptr(&p->arena, &p->plan, v);
		const float *b = loom_arena_ptr(&one->arena, &one->plan, v);
		for (int64_t e = 0; e < p->plan.params[s].numel; e++)
			cr_assert_float_eq(a[e], b[e], 1e-5, "%s[%lld]: %g, one process's %g",
					   p->plan.g->nodes[v].name, (long long)e, a[e], b[e]);
	}
	free_all(one, g1);
	free_all(p, g);
	loom_pg_free(pg);
}

/* ------------------------------------------------------------ a WAIT for one collective */

Test(async, a_wait_for_one_collective_waits_for_that_one_alone)
{
	loom_pg *pg = fake_group(10.0);
	loom_graph *g;
	loom_program *p = compile_mlp(&g, pg, 3);
	const loom_plan *pl = &p->plan;
	int ones = 0;
	for (int i = 0; i < pl->n_steps; i++)
		ones += pl->steps[i].kind == LOOM_STEP_WAIT && pl->steps[i].index >= 0;
	cr_assert_gt(ones, 0, "ZeRO-3's plan waits for no collective alone");
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	/* Some WAIT left the collectives started after its own in flight
	 * (a WAIT for all would have landed every one). */
	cr_assert_gt(fd.partial_waits, 0, "every WAIT waited for every collective in flight");
	cr_assert_eq(fd.host_waits, 0);
	cr_assert_eq(fd.landed_before_optim, 1, "an update ran before its bucket's sum landed");
	cr_assert_eq(loom_comm_watch_drain(pg->device), LOOM_OK);
	free_all(p, g);
	loom_pg_free(pg);
}

/* ------------------------------------------------------------ the graph over two ranks */

static void graph_ranks_setup(void)
{
	graph_setup();
	fd_marks = (loom_backend_marks){ .mark_words = mk_words,
					 .mark_record = mk_record,
					 .mark_serial = mk_serial };
	fd_backend.marks = &fd_marks;
}

TestSuite(graph_ranks, .init = graph_ranks_setup, .fini = teardown);

Test(graph_ranks, a_captured_step_hands_its_collectives_to_the_watchdog_by_mark)
{
	loom_pg *pg = fake_group(10.0);
	loom_graph *g, *g1;
	loom_program *one, *p = train_beside_one(pg, 2, &g, &one, &g1);
	int nb = p->plan.buckets.n;
	cr_assert_eq(p->exec->graph, 1, "refused: %s", p->exec->graph_note);
	cr_assert_eq(gr.begins, 1);
	cr_assert_eq(gr.keeps, 1);
	/* A mark after each bucket's collective, recorded in the capture. */
	cr_assert_eq(mk.n_records, nb);
	/* The captured walk ran the step: two ranks' sums averaged. */
	expect_params_equal(p, one, 0);
	for (int s = 0; s < 3; s++)
		cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(gr.replays, 3);
	/* Each launch (the capture's and 3 replays) handed every collective
	 * by its mark, each replay's before the device wrote them (the fake
	 * writes at the host's synchronise, after run_end); the watchdog
	 * waited on the marks, never the step's thread. */
	cr_assert_eq(p->exec->mark_handed, (uint64_t)(4 * nb));
	cr_assert_eq(mk.late_at_end, 3, "a replay's marks were written before its run ended");
	cr_assert_geq(mk.handed_by_end, (uint64_t)(4 * nb));
	cr_assert_eq(loom_comm_watch_drain(pg->device), LOOM_OK);
	cr_assert_eq(atomic_load(&fd.mark_waits), 4 * nb);
	uint64_t handed, ended;
	loom_comm_watch_counts(pg->device, &handed, &ended);
	cr_assert_eq(handed, ended);
	for (int k = 0; k < nb; k++)
		cr_assert_eq(mk.words[k], 4, "mark %d: %llu", k, (unsigned long long)mk.words[k]);
	cr_assert_eq(fd.host_waits, 0, "the step waited %d times on the host", fd.host_waits);
	cr_assert_eq(fd.syncs_in_step, 0);
	cr_assert_eq(fd.aborts, 0);
	free_all(one, g1);
	free_all(p, g);
	loom_pg_free(pg);
}

Test(graph_ranks, a_collective_that_never_completes_in_a_replay_is_named_and_aborted,
     .timeout = 60)
{
	loom_pg *pg = fake_group(0.3);
	loom_graph *g;
	loom_program *p = compile_mlp(&g, pg, 0);
	cr_assert_geq(p->plan.buckets.n, 2);
	for (int s = 0; s < 3; s++) /* eager, captured, replayed */
		cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(gr.replays, 1);
	/* The next replay's second collective never completes: mark 1, the
	 * step's second start. */
	mk.hung_slot = 1;
	int second = -1;
	for (int i = 0, seen = 0; i < p->plan.n_steps && second < 0; i++)
		if (p->plan.steps[i].kind == LOOM_STEP_COLLECTIVE && seen++ == 1)
			second = p->plan.steps[i].index;
	cr_assert_geq(second, 0);
	loom_status st = loom_run(p, LOOM_RUN_TRAIN);
	expect_timed_out(p, pg, st, (long long)p->plan.buckets.b[second].count);
	free_all(p, g);
	loom_pg_free(pg);
}

Test(graph_ranks, every_step_kind_of_zero_runs_captured_and_replayed)
{
	for (int zero = 1; zero <= 3; zero++) {
		graph_ranks_setup();
		loom_pg *pg = fake_group(10.0);
		loom_graph *g;
		loom_program *p = compile_mlp(&g, pg, zero);
		const loom_plan *pl = &p->plan;
		int kinds = 0, colls = 0;
		for (int i = 0; i < pl->n_steps; i++) {
			kinds |= 1 << pl->steps[i].kind;
			colls += pl->steps[i].kind == LOOM_STEP_COLLECTIVE;
		}
		int want = 1 << LOOM_STEP_NODE | 1 << LOOM_STEP_COLLECTIVE | 1 << LOOM_STEP_WAIT |
			   1 << LOOM_STEP_OPTIM;
		cr_assert_eq(kinds & want, want, "zero %d: step kinds %#x", zero, kinds);
		for (int s = 0; s < 4; s++)
			cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "zero %d: %s", zero,
				     loom_program_error(p));
		cr_assert_eq(p->exec->graph, 1, "zero %d refused: %s", zero, p->exec->graph_note);
		cr_assert_eq(gr.replays, 2, "zero %d", zero);
		/* A mark per collective the step starts (a bucket's
		 * reduce-scatter and all-gather: two). */
		cr_assert_eq(mk.n_records, colls, "zero %d", zero);
		cr_assert_eq(p->exec->n_marked, colls);
		cr_assert_eq(loom_comm_watch_drain(pg->device), LOOM_OK);
		cr_assert_eq(atomic_load(&fd.mark_waits), 3 * mk.n_records, "zero %d", zero);
		cr_assert_eq(fd.host_waits, 0, "zero %d", zero);
		cr_assert_eq(host_in_step, 0, "zero %d", zero);
		free_all(p, g);
		loom_pg_free(pg);
	}
}

static const loom_comm_i *fd_iface_without_marks(void)
{
	static loom_comm_i i;
	i = fd_iface;
	i.name = "fake-device-no-marks";
	i.wait_mark = NULL;
	return &i;
}

/* The first run's reason, logged once; the steps run eagerly. */
static void expect_refused(loom_pg *pg, const char *why)
{
	loom_graph *g;
	logged[0] = 0;
	loom_set_log(keep_log, NULL);
	loom_program *p = compile_mlp(&g, pg, 0);
	for (int s = 0; s < 3; s++)
		cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	loom_set_log(NULL, NULL);
	cr_assert_eq(gr.begins + gr.replays, 0, "captured despite: %s", why);
	cr_assert(strstr(logged, why), "log: %s", logged);
	free_all(p, g);
	memset(&gr, 0, sizeof(gr));
}

Test(graph_ranks, refused_where_marks_cannot_hold)
{
	loom_pg *pg = fake_group(10.0);
	/* The switch: over several ranks, off. */
	setenv("LOOM_CUDA_GRAPH_RANKS", "0", 1);
	expect_refused(pg, "cuda graph: data parallel over 2 ranks: off (LOOM_CUDA_GRAPH_RANKS=0)");
	unsetenv("LOOM_CUDA_GRAPH_RANKS");
	/* A communicator that cannot wait on a mark. */
	pg->device->i = fd_iface_without_marks();
	expect_refused(pg, "cuda graph: data parallel over 2 ranks: the communicator cannot wait "
			   "for a progress mark");
	pg->device->i = &fd_iface;
	/* A backend that writes no marks. */
	fd_backend.marks = NULL;
	expect_refused(pg, "cuda graph: data parallel over 2 ranks: the backend writes no progress "
			   "marks for the watchdog");
	fd_backend.marks = &fd_marks;
	/* Collectives through the host communicator (MPI on host buffers). */
	fd_backend.caps = loom_cpu_backend.caps;
	expect_refused(pg, "cuda graph: data parallel over 2 ranks: its collectives end on the host");
	fd_backend.caps = (loom_cpu_backend.caps & ~(unsigned)LOOM_BE_HOST_MEMORY) |
			  LOOM_BE_ASYNC_STREAMS;
	/* Collectives staged through host buffers (ranks sharing a GPU). */
	setenv("LOOM_DDP_STAGE_HOST", "1", 1);
	expect_refused(pg, "cuda graph: data parallel over 2 ranks: its collectives are staged "
			   "through host memory");
	unsetenv("LOOM_DDP_STAGE_HOST");
	loom_pg_free(pg);
}

/* LOOM_DDP_WORLD1_BUCKETS=1: a group of one rank keeps its buckets and
 * their all-reduces (the identity), captured and watched by mark as over
 * several ranks: the row one GPU runs with NCCL (test_cuda_ops). */
Test(graph_ranks, world1_buckets_hook_captures_the_all_reduces)
{
	loom_comm_options o = { .bootstrap = LOOM_COMM_BOOT_SINGLE, .timeout_s = 10.0 };
	loom_pg *pg;
	cr_assert_eq(loom_pg_init(&o, &pg), LOOM_OK, "%s", loom_pg_error(pg));
	loom_comm *d = calloc(1, sizeof(*d));
	cr_assert_not_null(d);
	if (pg->device)
		pg->device->i->free(pg->device);
	*d = (loom_comm){ .i = &fd_iface, .pg = pg, .rank = 0, .world = 1 };
	pg->device = d;
	the_pg = pg;
	loom_graph *g, *g1;
	/* Without the hook: no buckets at world 1. */
	loom_program *p = compile_mlp(&g, pg, 0);
	cr_assert_eq(p->plan.buckets.n, 0);
	free_all(p, g);
	setenv("LOOM_DDP_WORLD1_BUCKETS", "1", 1);
	p = compile_mlp(&g, pg, 0);
	unsetenv("LOOM_DDP_WORLD1_BUCKETS");
	loom_program *one = compile_one(&g1);
	int nb = p->plan.buckets.n;
	cr_assert_geq(nb, 2, "buckets at world 1 with the hook: %d", nb);
	for (int s = 0; s < 5; s++) {
		cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
		if (s < 2)
			cr_assert_eq(loom_run(one, LOOM_RUN_TRAIN), LOOM_OK, "%s",
				     loom_program_error(one));
		if (s == 1) /* eager, then captured: one process's numbers */
			expect_params_equal(p, one, 0);
	}
	cr_assert_eq(p->exec->graph, 1, "refused: %s", p->exec->graph_note);
	cr_assert_eq(gr.replays, 3);
	cr_assert_eq(mk.n_records, nb);
	cr_assert_eq(loom_comm_watch_drain(pg->device), LOOM_OK);
	cr_assert_eq(atomic_load(&fd.mark_waits), 4 * nb);
	cr_assert_eq(fd.host_waits, 0);
	free_all(one, g1);
	free_all(p, g);
	loom_pg_free(pg);
}

/* ------------------------------------------------------------ staged input slots */

/* The fake device that stages inputs in two slots (fake_slots_backend),
 * the loss read one step late so that a step is still queued when
 * loom_run returns. */
static void slots_setup(void)
{
	setup();
	fake_slots_backend(&fd_backend);
	setenv("LOOM_ASYNC_LOSS", "1", 1);
}

static void slots_teardown(void)
{
	unsetenv("LOOM_ASYNC_LOSS");
	teardown();
}

TestSuite(slots, .init = slots_setup, .fini = slots_teardown);

/* Batch s of the MLP: x [6, 4], y [6]. */
static void mlp_batch(int s, float *x, int32_t *y)
{
	for (int i = 0; i < 24; i++)
		x[i] = (float)((i * 7 + s * 5) % 11) / 11.0f - 0.5f;
	for (int i = 0; i < 6; i++)
		y[i] = (i + s) % 3;
}

/* The loader's pattern: the next batch's buffers asked for, and written at
 * once, while the step before is still queued. */
static void buffer_batch(loom_program *p, int s)
{
	void *x, *y;
	cr_assert_eq(loom_input_buffer(p, "x", LOOM_F32, 24, &x), LOOM_OK, "%s",
		     loom_program_error(p));
	cr_assert_eq(loom_input_buffer(p, "y", LOOM_I32, 6, &y), LOOM_OK, "%s",
		     loom_program_error(p));
	mlp_batch(s, x, y);
	cr_assert_eq(loom_input_commit(p, "x"), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_input_commit(p, "y"), LOOM_OK, "%s", loom_program_error(p));
}

static void set_batch(loom_program *p, int s)
{
	float x[24];
	int32_t y[6];
	mlp_batch(s, x, y);
	cr_assert_eq(loom_set_input(p, "x", x, LOOM_F32, 24), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "y", y, LOOM_I32, 6), LOOM_OK);
}

Test(slots, the_loader_writes_a_free_slot_with_no_host_copy)
{
	enum { S = 6 };
	loom_graph *g, *g1;
	loom_program *p = compile_mlp(&g, NULL, 0);
	loom_program *one = compile_one(&g1);
	fake_slots_counters at_start = fake_slots;
	loom_program_info i0;
	loom_program_info_get(p, &i0);
	buffer_batch(p, 0);
	for (int s = 0; s < S; s++) {
		cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
		if (s + 1 < S)
			buffer_batch(p, s + 1);
		set_batch(one, s);
		cr_assert_eq(loom_run(one, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(one));
	}
	/* Every step's batch went from the loader's writes to the "DMA":
	 * no host copy, no wait (the slot handed out was always free: two
	 * slots suffice with the copy at the step's head), and no write into
	 * a slot a queued step still read. */
	cr_assert_eq(fake_slots.host_copy_bytes, at_start.host_copy_bytes,
		     "%llu bytes copied by the host",
		     (unsigned long long)(fake_slots.host_copy_bytes - at_start.host_copy_bytes));
	cr_assert_eq(fake_slots.dma_bytes - at_start.dma_bytes, (uint64_t)S * (24 * 4 + 6 * 4));
	cr_assert_eq(fake_slots.handouts, 2 * S);
	cr_assert_eq(fake_slots.slot_waits, 0, "the host waited %d times for a slot",
		     fake_slots.slot_waits);
	loom_program_info i1;
	loom_program_info_get(p, &i1);
	cr_assert_eq(i1.input_upload_bytes, i0.input_upload_bytes);
	/* The steps are still queued here; a read waits for them. */
	cr_assert_gt(fake_slots.steps_queued, 0);
	float w[32];
	cr_assert_eq(loom_read(p, p->plan.params[0].param, w, (size_t)p->plan.params[0].numel),
		     LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(fake_slots.overwrites, 0, "a slot was written while a queued step read it");
	expect_params_equal(p, one, 0);
	free_all(one, g1);
	free_all(p, g);
}

Test(slots, a_hand_out_waits_for_the_queued_step_reading_its_slot)
{
	loom_graph *g, *g1;
	loom_program *p = compile_mlp(&g, NULL, 0);
	loom_program *one = compile_one(&g1);
	buffer_batch(p, 0);
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	set_batch(one, 0);
	cr_assert_eq(loom_run(one, LOOM_RUN_TRAIN), LOOM_OK);
	/* Batch 1 committed into the other slot, then replaced before any
	 * run took it: the second hand-out is the slot step 0 still reads,
	 * so it waits for that step, and never writes under it. */
	buffer_batch(p, 1);
	cr_assert_eq(fake_slots.slot_waits, 0);
	buffer_batch(p, 2);
	cr_assert_eq(fake_slots.slot_waits, 1, "x's hand-out waits for step 0 (then y's slot is "
					       "free too): %d waits", fake_slots.slot_waits);
	cr_assert_eq(fake_slots.overwrites, 0);
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	set_batch(one, 2);
	cr_assert_eq(loom_run(one, LOOM_RUN_TRAIN), LOOM_OK);
	float w[32];
	cr_assert_eq(loom_read(p, p->plan.params[0].param, w, (size_t)p->plan.params[0].numel),
		     LOOM_OK);
	cr_assert_eq(fake_slots.overwrites, 0);
	expect_params_equal(p, one, 0);
	free_all(one, g1);
	free_all(p, g);
}

Test(slots, set_input_copies_each_batch_on_the_host)
{
	enum { S = 4 };
	loom_graph *g;
	loom_program *p = compile_mlp(&g, NULL, 0);
	fake_slots_counters at_start = fake_slots;
	loom_program_info i0;
	loom_program_info_get(p, &i0);
	for (int s = 0; s < S; s++) {
		set_batch(p, s);
		cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	}
	uint64_t per_step = 24 * 4 + 6 * 4;
	cr_assert_eq(fake_slots.host_copy_bytes - at_start.host_copy_bytes, S * per_step);
	loom_program_info i1;
	loom_program_info_get(p, &i1);
	cr_assert_eq(i1.input_upload_bytes - i0.input_upload_bytes, S * per_step);
	cr_assert_eq(fake_slots.overwrites, 0);
	/* A hand-out beside it: set_input waits for its commit. */
	void *x;
	cr_assert_eq(loom_input_buffer(p, "x", LOOM_F32, 24, &x), LOOM_OK);
	float xv[24] = { 0 };
	cr_assert_eq(loom_set_input(p, "x", xv, LOOM_F32, 24), LOOM_ERR_STATE);
	cr_assert(strstr(loom_program_error(p), "'x'"), "%s", loom_program_error(p));
	cr_assert_eq(loom_input_release(p, "x"), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "x", xv, LOOM_F32, 24), LOOM_OK);
	free_all(p, g);
}

/* ------------------------------------------------------------ fp8 on the device */

/* A device copy of fp8's delayed state (loom_backend_fp8) that is ts.fp8
 * itself (the CPU's kernels record there; upload keeps its address): what
 * the executor does around it is what this checks. */
static loom_fp8_state *fd_fp8;
static float fd_amax[64];
static double fd_sat[64];
static int fd_packs, fd_reduced_ends;

static loom_status fd_fp8_upload(void *ctx, const loom_fp8_state *fs)
{
	(void)ctx;
	cr_assert_leq(fs->n, 64);
	fd_fp8 = (loom_fp8_state *)fs;
	return LOOM_OK;
}

static loom_status fd_fp8_download(void *ctx, loom_fp8_state *fs)
{
	(void)ctx, (void)fs;
	return LOOM_OK;
}

static loom_status fd_fp8_reduce_begin(void *ctx, void **amax, void **saturated)
{
	(void)ctx;
	for (int i = 0; i < fd_fp8->n; i++) {
		fd_amax[i] = fd_fp8->t[i].amax;
		fd_sat[i] = (double)fd_fp8->t[i].saturated;
	}
	*amax = fd_amax;
	*saturated = fd_sat;
	fd_packs++;
	return LOOM_OK;
}

static loom_status fd_fp8_step_end(void *ctx, const loom_plan *plan, int reduced)
{
	(void)ctx, (void)plan;
	for (int i = 0; reduced && i < fd_fp8->n; i++) {
		fd_fp8->t[i].amax = fd_amax[i];
		fd_fp8->t[i].saturated = (int64_t)fd_sat[i];
	}
	fd_reduced_ends += reduced;
	loom_fp8_step_end(fd_fp8);
	return LOOM_OK;
}

static const loom_backend_fp8 fd_fp8_group = {
	.fp8_upload = fd_fp8_upload,
	.fp8_download = fd_fp8_download,
	.fp8_reduce_begin = fd_fp8_reduce_begin,
	.fp8_step_end = fd_fp8_step_end,
};

/* Delayed scaling kept on a device across two ranks: accepted (the device
 * communicator has a max), each step's amaxes max-reduced and saturation
 * counts summed in the compute stream's order before the update, no host
 * wait; the scales one process's, the counts twice its. */
Test(async, fp8_amaxes_are_reduced_on_the_device)
{
	mlp_fp8 = 1;
	fd_backend.fp8 = &fd_fp8_group;
	fd_packs = fd_reduced_ends = 0;
	loom_pg *pg = fake_group(10.0);
	loom_graph *g, *g1;
	loom_program *one, *p = train_beside_one(pg, 3, &g, &one, &g1);
	cr_assert(p->ts.fp8.delayed && p->ts.fp8.n > 0);
	cr_assert_eq(fd_packs, 3);
	cr_assert_eq(fd_reduced_ends, 3);
	cr_assert_eq(max_calls, 3, "%d max-reductions", max_calls);
	cr_assert_eq(fd.syncs_in_step, 0, "the step synchronised %d times", fd.syncs_in_step);
	for (int i = 0; i < p->ts.fp8.n; i++) {
		const loom_fp8_tensor *a = &p->ts.fp8.t[i], *b = &one->ts.fp8.t[i];
		cr_expect(a->scale == b->scale && a->last_amax == b->last_amax &&
				  a->last_saturated == 2 * b->last_saturated,
			  "tensor %d: scale %g amax %g saturated %lld; one process %g %g %lld", i,
			  a->scale, a->last_amax, (long long)a->last_saturated, b->scale,
			  b->last_amax, (long long)b->last_saturated);
	}
	fd_backend.fp8 = NULL;
	free_all(one, g1);
	free_all(p, g);
	loom_pg_free(pg);
}
