/*
 * tests/engine/fake_async.c — the shared fake asynchronous device and group
 * of two (fake_async.h).
 */
#include "tests/engine/fake_async.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

char fake_streams[2];

static void *fake_stream_handle(void *ctx, loom_stream stream)
{
	(void)ctx;
	return &fake_streams[stream];
}

static loom_status fake_event(void *ctx, int ev, loom_stream stream)
{
	(void)ctx, (void)ev, (void)stream;
	return LOOM_OK;
}

void fake_async_backend(loom_backend *b)
{
	*b = loom_cpu_backend;
	b->name = "fake-async";
	b->caps = (loom_cpu_backend.caps & ~(unsigned)LOOM_BE_HOST_MEMORY) | LOOM_BE_ASYNC_STREAMS;
	b->stream_handle = fake_stream_handle;
	b->event_record = fake_event;
	b->event_wait = fake_event;
}

void fake_twice(void *buf, size_t count, loom_dtype dt, int world)
{
	for (size_t e = 0; e < count; e++) {
		if (dt == LOOM_F32)
			((float *)buf)[e] *= (float)world;
		else if (dt == LOOM_F64)
			((double *)buf)[e] *= world;
		else if (dt == LOOM_I32)
			((int32_t *)buf)[e] *= world;
	}
}

loom_status fake_comm_broadcast(loom_comm *c, void *buf, size_t bytes, int root)
{
	(void)c, (void)buf, (void)bytes, (void)root;
	return LOOM_OK;
}

loom_status fake_comm_allgather(loom_comm *c, const void *send, size_t bytes, void *recv)
{
	for (int r = 0; r < c->world; r++)
		memmove((unsigned char *)recv + (size_t)r * bytes, send, bytes);
	return LOOM_OK;
}

loom_status fake_comm_barrier(loom_comm *c)
{
	(void)c;
	return LOOM_OK;
}

void fake_comm_abort(loom_comm *c)
{
	(void)c;
}

void fake_comm_free(loom_comm *c)
{
	free(c);
}

loom_status fake_comm_wait_free(loom_comm *c, loom_comm_work *w)
{
	(void)c;
	free(w);
	return LOOM_OK;
}

loom_pg *fake_group_of_two(double timeout_s, const loom_comm_i *host, const loom_comm_i *device)
{
	loom_comm_options o = { .bootstrap = LOOM_COMM_BOOT_SINGLE, .timeout_s = timeout_s };
	loom_pg *pg;
	cr_assert_eq(loom_pg_init(&o, &pg), LOOM_OK, "%s", loom_pg_error(pg));
	loom_comm_peer *peers = calloc(2, sizeof(*peers));
	loom_comm *h = calloc(1, sizeof(*h)), *d = calloc(1, sizeof(*d));
	cr_assert(peers && h && d);
	peers[0] = pg->peers[0];
	free(pg->peers);
	pg->peers = peers;
	pg->host->i->free(pg->host);
	if (pg->device)
		pg->device->i->free(pg->device);
	*h = (loom_comm){ .i = host, .pg = pg, .rank = 0, .world = 2 };
	*d = (loom_comm){ .i = device, .pg = pg, .rank = 0, .world = 2 };
	pg->host = h;
	pg->device = device ? d : NULL;
	if (!device)
		free(d);
	pg->info.rank = pg->info.local_rank = 0;
	pg->info.world = pg->info.local_world = 2;
	return pg;
}

void fake_mlp_opts(loom_compile_opts *o, loom_pg *pg, int zero, double lr)
{
	loom_compile_opts_default(o);
	o->device = LOOM_DEVICE_CPU;
	o->optim.kind = LOOM_OPTIM_SGD;
	o->optim.lr = lr;
	o->pg = pg;
	o->zero_stage = zero;
	o->bucket_cap_mb = o->first_bucket_mb = 100e-6;
}

void fake_mlp_inputs(loom_program *p)
{
	float xv[24];
	int32_t yv[6] = { 0, 1, 2, 0, 1, 2 };
	for (int i = 0; i < 24; i++)
		xv[i] = (float)((i * 7) % 11) / 11.0f - 0.5f;
	cr_assert_eq(loom_set_input(p, "x", xv, LOOM_F32, 24), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "y", yv, LOOM_I32, 6), LOOM_OK);
}

loom_program *fake_mlp_compile(loom_graph **gp, const loom_compile_opts *o)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t xd[2] = { 6, 4 }, yd[1] = { 6 };
	loom_value x = loom_input(g, "x", LOOM_F32, 2, xd);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	loom_value h = loom_relu(g, loom_layer_linear(g, "fc1", x, 8, 1));
	loom_value loss = loom_softmax_cross_entropy(g, loom_layer_linear(g, "fc2", h, 3, 1), y);
	*gp = g;
	loom_program *p;
	cr_assert_eq(loom_compile(g, loss, o, &p), LOOM_OK, "%s", loom_last_error());
	fake_mlp_inputs(p);
	return p;
}

/* ------------------------------------------------------------ staged inputs */

#include "engine/input_slots.h"

fake_slots_counters fake_slots;

enum { FS_MAX_INPUTS = 8 };

typedef struct fs_input {
	void *dst;
	size_t bytes;
	unsigned char *host[2];
	uint64_t reader[2]; /* the queued step reading slot k, 0: none */
	uint64_t sum[2];    /* slot k's contents when that step was queued */
	int slot, pending, out;
} fs_input;

static struct {
	loom_backend inner; /* the methods wrapped */
	fs_input in[FS_MAX_INPUTS];
	int n;
	uint64_t serial; /* steps queued */
	double prev_loss;
	int have_prev;
} fs;

static uint64_t fs_sum(const unsigned char *p, size_t n)
{
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 1099511628211ull;
	return h;
}

/* The device finishes every step up to `upto`: the slots they read are
 * free, and must have held still. */
static void fs_finish(uint64_t upto)
{
	for (int i = 0; i < fs.n; i++)
		for (int k = 0; k < 2; k++) {
			fs_input *in = &fs.in[i];
			if (!in->reader[k] || in->reader[k] > upto)
				continue;
			if (fs_sum(in->host[k], in->bytes) != in->sum[k])
				fake_slots.overwrites++;
			in->reader[k] = 0;
			fake_slots.steps_done++;
		}
}

static fs_input *fs_find(void *dst, size_t bytes)
{
	for (int i = 0; i < fs.n; i++)
		if (fs.in[i].dst == dst && fs.in[i].bytes == bytes)
			return &fs.in[i];
	return NULL;
}

/* Waits (as an event sync) for the step reading slot k of in. */
static void fs_wait_slot(fs_input *in, int k)
{
	if (in->reader[k]) {
		fake_slots.slot_waits++;
		fs_finish(in->reader[k]);
	}
}

static loom_status fs_alloc(void *ctx, const loom_plan *pl, const loom_train_state *ts,
			    loom_arena *a)
{
	loom_status st = fs.inner.alloc(ctx, pl, ts, a);
	if (st != LOOM_OK)
		return st;
	for (int v = 0; v < pl->g->n; v++) {
		if (pl->g->nodes[v].op != LOOM_OP_INPUT || !loom_plan_holds(pl, v))
			continue;
		cr_assert_lt(fs.n, FS_MAX_INPUTS);
		fs_input *in = &fs.in[fs.n++];
		*in = (fs_input){ .dst = loom_arena_ptr(a, pl, v),
				  .bytes = loom_plan_value_bytes(pl, v), .slot = -1, .out = -1 };
		for (int k = 0; k < 2; k++)
			cr_assert_not_null(in->host[k] = calloc(1, in->bytes));
	}
	return LOOM_OK;
}

static void fs_free(void *ctx)
{
	for (int i = 0; i < fs.n; i++)
		for (int k = 0; k < 2; k++)
			free(fs.in[i].host[k]);
	fs.n = 0;
	fs.inner.free(ctx);
}

/* loom_set_input's copy into a slot (the host copy zero-copy saves). */
static loom_status fs_upload(void *ctx, void *dst, const void *src, size_t bytes)
{
	fs_input *in = fs_find(dst, bytes);
	if (!in)
		return fs.inner.upload(ctx, dst, src, bytes);
	int k = loom_input_slot_fill(in->slot, in->pending);
	fs_wait_slot(in, k);
	memcpy(in->host[k], src, bytes);
	fake_slots.host_copy_bytes += bytes;
	in->slot = k;
	in->pending = 1;
	return LOOM_OK;
}

static loom_status fs_input_slot(void *ctx, void *dst, size_t bytes, void **host)
{
	(void)ctx;
	fs_input *in = fs_find(dst, bytes);
	if (!in)
		return LOOM_ERR_UNSUPPORTED;
	cr_assert_lt(in->out, 0, "a second hand-out of one input's slot reached the backend");
	int k = loom_input_slot_take(in->slot);
	fs_wait_slot(in, k);
	in->out = k;
	*host = in->host[k];
	fake_slots.handouts++;
	return LOOM_OK;
}

static loom_status fs_input_commit(void *ctx, void *dst, size_t bytes)
{
	(void)ctx;
	fs_input *in = fs_find(dst, bytes);
	cr_assert(in && in->out >= 0, "a commit without a hand-out reached the backend");
	in->slot = in->out;
	in->pending = 1;
	in->out = -1;
	return LOOM_OK;
}

static loom_status fs_input_release(void *ctx, void *dst, size_t bytes)
{
	(void)ctx;
	fs_input *in = fs_find(dst, bytes);
	if (in)
		in->out = -1;
	return LOOM_OK;
}

/* A run queues the copies of the inputs filled since (the DMA reads the
 * slot now; the step holds it until it finishes). */
static loom_status fs_run_begin(void *ctx, const loom_plan *pl, const loom_arena *a,
				loom_train_state *ts, unsigned flags)
{
	fs.serial++;
	fake_slots.steps_queued++;
	for (int i = 0; i < fs.n; i++) {
		fs_input *in = &fs.in[i];
		if (!in->pending)
			continue;
		memcpy(in->dst, in->host[in->slot], in->bytes);
		fake_slots.dma_bytes += in->bytes;
		in->reader[in->slot] = fs.serial;
		in->sum[in->slot] = fs_sum(in->host[in->slot], in->bytes);
		in->pending = 0;
	}
	return fs.inner.run_begin(ctx, pl, a, ts, flags);
}

static loom_status fs_download(void *ctx, void *dst, const void *src, size_t bytes)
{
	fs_finish(fs.serial);
	return fs.inner.download(ctx, dst, src, bytes);
}

static loom_status fs_synchronize(void *ctx, const loom_plan *pl, loom_train_state *ts)
{
	fs_finish(fs.serial);
	fs.have_prev = 0;
	return fs.inner.synchronize(ctx, pl, ts);
}

/* LOOM_ASYNC_LOSS=1: this step's loss kept, the previous step finished
 * and its loss given. */
static loom_status fs_loss_async(void *ctx, const loom_plan *pl, const void *loss, int f64,
				 loom_train_state *ts)
{
	(void)ctx, (void)pl;
	fs_finish(fs.serial - 1);
	if (fs.have_prev)
		ts->last_loss = fs.prev_loss;
	fs.prev_loss = f64 ? *(const double *)loss : *(const float *)loss;
	fs.have_prev = 1;
	return LOOM_OK;
}

static const loom_backend_async_loss fs_async_loss = { .loss_async = fs_loss_async };

static const loom_backend_input fs_input_ops = {
	.input_slot = fs_input_slot,
	.input_commit = fs_input_commit,
	.input_release = fs_input_release,
};

void fake_slots_backend(loom_backend *b)
{
	memset(&fake_slots, 0, sizeof(fake_slots));
	memset(&fs, 0, sizeof(fs));
	fs.inner = *b;
	b->alloc = fs_alloc;
	b->free = fs_free;
	b->upload = fs_upload;
	b->download = fs_download;
	b->synchronize = fs_synchronize;
	b->run_begin = fs_run_begin;
	b->async_loss = &fs_async_loss;
	b->input = &fs_input_ops;
}
