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
	pg->device = d;
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
