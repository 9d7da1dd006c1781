/*
 * tests/engine/test_zero_norm.c — ZeRO's gradient-clipping norm summed over
 * the ranks on the device (parallel/shards.c, the backend's
 * grad_sumsq_device): on a fake asynchronous backend (the CPU's kernels,
 * LOOM_BE_ASYNC_STREAMS) and a fake stream-ordered communicator of two
 * identical ranks whose collectives land at once, a ZeRO step with clipping
 * takes its norm as one f64 all-reduce in the compute stream's order, never
 * through the host, and updates this rank's shard bit for bit as the host's
 * gather does (LOOM_ZERO_DEVICE_NORM=0); the graph refusal
 * (loom_zero_shards.no_graph) holds only where the norm crosses the host.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "parallel/shards.h"
#include "tests/engine/fake_async.h"

/* What a step did. */
static struct {
	int in_step;
	int host_in_step;    /* host-communicator calls inside a step */
	int ordered_f64;     /* one-value f64 all-reduces in the compute stream's order */
	int device_norms;    /* grad_sumsq_device calls */
	int norm_pending;    /* the next optim clips by the device's sum */
	double sumsq;        /* "device memory": this rank's sum, then the ranks' */
} zn;

static const loom_backend *cpu = &loom_cpu_backend;

/* ------------------------------------------------------------ the fake communicators */

struct loom_comm_work {
	int kept;
};

/* Device collectives land at once (the compute stream runs eagerly in
 * this model): a reduce-scatter doubles this rank's shard, an all-gather
 * leaves the other shard as it was (the test reads this rank's only). */
static loom_status zd_start(loom_comm *c, void *buf, size_t count, loom_dtype dt,
			    loom_comm_work **out, size_t first)
{
	fake_twice((char *)buf + first * loom_dtype_size(dt), count, dt, c->world);
	if (!*out && !(*out = calloc(1, sizeof(**out))))
		return loom_comm_fail(c, LOOM_ERR_NOMEM, "fake: out of memory");
	return LOOM_OK;
}

static loom_status zd_allreduce_start(loom_comm *c, void *buf, size_t count, loom_dtype dt,
				      void *stream, loom_comm_work **out)
{
	(void)stream;
	return zd_start(c, buf, count, dt, out, 0);
}

static loom_status zd_reduce_scatter_start(loom_comm *c, void *buf, size_t count,
					   loom_dtype dt, void *stream, loom_comm_work **out)
{
	(void)stream;
	return zd_start(c, buf, count, dt, out, count * (size_t)c->rank);
}

static loom_status zd_allgather_start(loom_comm *c, void *buf, size_t count, loom_dtype dt,
				      void *stream, loom_comm_work **out)
{
	(void)c, (void)buf, (void)count, (void)dt, (void)stream;
	if (!*out && !(*out = calloc(1, sizeof(**out))))
		return LOOM_ERR_NOMEM;
	return LOOM_OK;
}

static loom_status zd_test(loom_comm *c, loom_comm_work *w, int *done)
{
	(void)c, (void)w;
	*done = 1;
	return LOOM_OK;
}

static loom_status zd_wait(loom_comm *c, loom_comm_work *w)
{
	(void)c;
	if (!w->kept)
		free(w);
	return LOOM_OK;
}

static loom_status zd_work_make(loom_comm *c, loom_comm_work **out)
{
	(void)c;
	if (!(*out = calloc(1, sizeof(**out))))
		return LOOM_ERR_NOMEM;
	(*out)->kept = 1;
	return LOOM_OK;
}

static void zd_work_free(loom_comm *c, loom_comm_work *w)
{
	(void)c;
	free(w);
}

static loom_status zd_allreduce_ordered(loom_comm *c, void *buf, size_t count, loom_dtype dt,
					void *stream)
{
	cr_assert_eq(stream, &fake_streams[LOOM_STREAM_COMPUTE]);
	if (dt == LOOM_F64 && count == 1)
		zn.ordered_f64++;
	fake_twice(buf, count, dt, c->world);
	return LOOM_OK;
}

static loom_status zh_allreduce_start(loom_comm *c, void *buf, size_t count, loom_dtype dt,
				      void *stream, loom_comm_work **out)
{
	(void)stream;
	zn.host_in_step += zn.in_step;
	fake_twice(buf, count, dt, c->world);
	return (*out = calloc(1, sizeof(**out))) ? LOOM_OK : LOOM_ERR_NOMEM;
}

/* The host's all-gather (the old norm's path), counted inside a step. */
static loom_status z_allgather(loom_comm *c, const void *send, size_t bytes, void *recv)
{
	zn.host_in_step += zn.in_step;
	return fake_comm_allgather(c, send, bytes, recv);
}

static const loom_comm_i zd_iface = {
	.name = "fake-device",
	.stream_ordered = 1,
	.allreduce_start = zd_allreduce_start,
	.test = zd_test,
	.wait = zd_wait,
	.broadcast = fake_comm_broadcast,
	.allgather = z_allgather,
	.barrier = fake_comm_barrier,
	.abort = fake_comm_abort,
	.free = fake_comm_free,
	.allreduce_ordered = zd_allreduce_ordered,
	.reduce_scatter_start = zd_reduce_scatter_start,
	.allgather_start = zd_allgather_start,
	.work_make = zd_work_make,
	.work_free = zd_work_free,
};

static const loom_comm_i zh_iface = {
	.name = "fake-host",
	.allreduce_start = zh_allreduce_start,
	.wait = fake_comm_wait_free,
	.broadcast = fake_comm_broadcast,
	.allgather = z_allgather,
	.barrier = fake_comm_barrier,
	.abort = fake_comm_abort,
	.free = fake_comm_free,
};

/* A single process's group made into rank 0 of 2. */
static loom_pg *fake_group(void)
{
	return fake_group_of_two(10, &zh_iface, &zd_iface);
}

/* ------------------------------------------------------------ the fake device */

static loom_status zb_run_begin(void *ctx, const loom_plan *pl, const loom_arena *a,
				loom_train_state *ts, unsigned flags)
{
	zn.in_step = 1;
	return cpu->run_begin(ctx, pl, a, ts, flags);
}

static loom_status zb_run_end(void *ctx, const loom_plan *pl, const loom_arena *a,
			      loom_train_state *ts)
{
	zn.in_step = 0;
	return cpu->run_end(ctx, pl, a, ts);
}

/* This rank's sum of squares "on the device", for the ordered all-reduce. */
static loom_status zb_grad_sumsq_device(void *ctx, const loom_plan *pl, const loom_arena *a,
					const loom_train_state *ts, int first, int last,
					void **sumsq)
{
	loom_status st = cpu->sharded->grad_sumsq(ctx, pl, a, ts, first, last, &zn.sumsq);
	*sumsq = &zn.sumsq;
	zn.device_norms++;
	zn.norm_pending = 1;
	return st;
}

/* The update clips by the device's sum over the ranks (CUDA's clip kernel
 * reads ctl->sumsq); the CPU's update reads ts->grad_norm. */
static loom_status zb_optim(void *ctx, const loom_plan *pl, const loom_arena *a,
			    loom_train_state *ts, int first, int last, int finite)
{
	if (zn.norm_pending)
		ts->grad_norm = sqrt(zn.sumsq);
	zn.norm_pending = 0;
	return cpu->optim(ctx, pl, a, ts, first, last, finite);
}

static loom_backend zb;
static loom_backend_sharded zb_sharded;

static void setup(void)
{
	memset(&zn, 0, sizeof(zn));
	fake_async_backend(&zb);
	zb.run_begin = zb_run_begin;
	zb.run_end = zb_run_end;
	zb.optim = zb_optim;
	zb_sharded = *cpu->sharded;
	zb_sharded.grad_sumsq_device = zb_grad_sumsq_device;
	zb.sharded = &zb_sharded;
	loom_test_backend = &zb;
	unsetenv("LOOM_ZERO_DEVICE_NORM");
}

static void teardown(void)
{
	loom_test_backend = NULL;
	unsetenv("LOOM_ZERO_DEVICE_NORM");
}

/* x [6, 4] -> linear 4->8 -> relu -> linear 8->3 -> CE with y, ZeRO-`zero`
 * with SGD and a clip that binds. */
static loom_program *compile_mlp(loom_graph **gp, loom_pg *pg, int zero, double clip)
{
	loom_compile_opts o;
	fake_mlp_opts(&o, pg, zero, 0.5);
	o.optim.clip_grad = clip;
	return fake_mlp_compile(gp, &o);
}

/* The elements of this rank's shard of every bucket, equal bit for bit. */
static void expect_shard_equal(loom_program *p, loom_program *q)
{
	const loom_plan *pl = &p->plan;
	const loom_buckets *bk = &pl->buckets;
	int seen = 0;
	for (int s = 0; s < pl->n_params; s++) {
		loom_value v = pl->params[s].param;
		const float *a = loom_arena_ptr(&p->arena, pl, v);
		const float *b = loom_arena_ptr(&q->arena, &q->plan, v);
		for (int k = 0; k < bk->n; k++)
			for (int j = bk->b[k].first; j < bk->b[k].first + bk->b[k].n; j++) {
				if (bk->grad[j] != pl->params[s].grad)
					continue;
				int64_t e0 = (int64_t)(bk->offset[j] / sizeof(float));
				for (int64_t e = 0; e < pl->params[s].numel && e0 + e < bk->b[k].count / 2;
				     e++, seen++)
					cr_assert_eq(a[e], b[e], "%s[%lld]: %g, the host path's %g",
						     pl->g->nodes[v].name, (long long)e, a[e], b[e]);
			}
	}
	cr_assert_gt(seen, 0);
}

TestSuite(zero_norm, .init = setup, .fini = teardown);

Test(zero_norm, zero_clipping_takes_its_norm_on_the_device_as_the_host_would)
{
	for (int zero = 1; zero <= 2; zero++) {
		loom_pg *pg = fake_group(), *pg_host = fake_group();
		loom_graph *g, *gh;
		loom_program *p = compile_mlp(&g, pg, zero, 0.05);
		cr_assert_eq(p->plan.zero, zero);
		memset(&zn, 0, sizeof(zn));
		cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
		/* One f64 summed in the compute stream's order; nothing
		 * through the host communicator inside the step. */
		cr_assert_eq(zn.device_norms, 1, "zero %d", zero);
		cr_assert_eq(zn.ordered_f64, 1, "zero %d", zero);
		cr_assert_eq(zn.host_in_step, 0, "zero %d: the norm crossed the host %d times", zero,
			     zn.host_in_step);
		double norm = p->ts.grad_norm;
		cr_assert(norm > 0.05, "zero %d: the clip does not bind (norm %g)", zero, norm);

		/* The old path: every rank's sum gathered on the host. */
		setenv("LOOM_ZERO_DEVICE_NORM", "0", 1);
		loom_program *h = compile_mlp(&gh, pg_host, zero, 0.05);
		memset(&zn, 0, sizeof(zn));
		cr_assert_eq(loom_run(h, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(h));
		cr_assert_eq(zn.device_norms, 0);
		cr_assert_gt(zn.host_in_step, 0, "the host path took no norm on the host");
		unsetenv("LOOM_ZERO_DEVICE_NORM");
		cr_assert_eq(h->ts.grad_norm, norm, "zero %d: norm %.17g, the host's %.17g", zero,
			     norm, h->ts.grad_norm);
		expect_shard_equal(p, h);
		loom_program_free(h);
		loom_graph_free(gh);
		loom_program_free(p);
		loom_graph_free(g);
		loom_pg_free(pg);
		loom_pg_free(pg_host);
	}
}

Test(zero_norm, the_graph_refusal_holds_only_where_the_norm_crosses_the_host)
{
	loom_pg *pg = fake_group();
	loom_graph *g;
	loom_program *p = compile_mlp(&g, pg, 1, 0.05);
	cr_assert_eq(p->shards, &loom_zero_shards);
	const char *why = loom_zero_shards.no_graph(p);
	cr_assert_null(why, "refused with the norm on the device: %s", why);
	setenv("LOOM_ZERO_DEVICE_NORM", "0", 1);
	why = loom_zero_shards.no_graph(p);
	cr_assert(why && strstr(why, "gradient norm crosses the host"), "LOOM_ZERO_DEVICE_NORM=0: %s",
		  why ? why : "(allowed)");
	unsetenv("LOOM_ZERO_DEVICE_NORM");
	/* A backend without the device sum. */
	zb_sharded.grad_sumsq_device = NULL;
	why = loom_zero_shards.no_graph(p);
	cr_assert(why && strstr(why, "gradient norm crosses the host"), "no grad_sumsq_device: %s",
		  why ? why : "(allowed)");
	loom_program_free(p);
	loom_graph_free(g);
	loom_pg_free(pg);
}
