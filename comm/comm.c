/*
 * comm/comm.c — the contract wrappers every caller goes through (argument
 * checks, the broken flag, the default all-reduce as start + wait), the
 * world-1 backend that needs no MPI, and the parameter broadcast.
 */
#include "comm/comm_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static loom_status usable(loom_comm *c, const char *what)
{
	if (!c)
		return LOOM_ERR_INVALID;
	if (c->broken)
		return loom_pg_fail(c->pg, LOOM_ERR_STATE,
				    "%s on a %s communicator that already failed (first error "
				    "above); start over",
				    what, c->i->name);
	return LOOM_OK;
}

/* Records the collective being entered, for the hang report (progress.c). */
static void entering(loom_comm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void entering(loom_comm *c, const char *fmt, ...)
{
	char what[96];
	va_list ap;

	if (c->pg->info.world < 2)
		return;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	loom_progress_enter(c->pg, what);
}

loom_status loom_comm_allreduce_start(loom_comm *c, void *buf, size_t count, loom_dtype dt,
				      void *stream, loom_comm_work **out)
{
	loom_status st = usable(c, "all-reduce");

	if (st)
		return st;
	if (!out || (count && !buf) || !loom_dtype_size(dt))
		return loom_pg_fail(c->pg, LOOM_ERR_INVALID, "all-reduce: bad arguments");
	if (!c->i->work_make)
		*out = NULL; /* else NULL or a made work, reused */
	entering(c, "all-reduce of %zu %s", count, loom_dtype_name(dt));
	return c->i->allreduce_start(c, buf, count, dt, stream, out);
}

/* The shard pair: same checks, and a backend without them says so. */
static loom_status shard_args(loom_comm *c, void *buf, size_t count, loom_dtype dt,
			      loom_comm_work **out, const char *what, int have)
{
	loom_status st = usable(c, what);

	if (st)
		return st;
	if (!out || (count && !buf) || !loom_dtype_size(dt))
		return loom_pg_fail(c->pg, LOOM_ERR_INVALID, "%s: bad arguments", what);
	if (!have)
		return loom_pg_fail(c->pg, LOOM_ERR_UNSUPPORTED, "%s: the %s backend has none",
				    what, c->i->name);
	if (!c->i->work_make)
		*out = NULL; /* else NULL or a made work, reused */
	return LOOM_OK;
}

/* A sharded collective's start through the backend's fn (NULL: it has
 * none), after the arguments' checks that every shard shares. */
static loom_status shard_start(loom_comm *c,
			       loom_status (*fn)(loom_comm *c, void *buf, size_t count,
						 loom_dtype dt, void *stream, loom_comm_work **out),
			       const char *what, void *buf, size_t count, loom_dtype dt,
			       void *stream, loom_comm_work **out)
{
	loom_status st = shard_args(c, buf, count, dt, out, what, fn != NULL);

	if (st)
		return st;
	entering(c, "%s of %zu %s", what, count, loom_dtype_name(dt));
	return fn(c, buf, count, dt, stream, out);
}

loom_status loom_comm_reduce_scatter_start(loom_comm *c, void *buf, size_t count, loom_dtype dt,
					   void *stream, loom_comm_work **out)
{
	return shard_start(c, c ? c->i->reduce_scatter_start : NULL, "reduce-scatter", buf, count,
			   dt, stream, out);
}

loom_status loom_comm_allgather_start(loom_comm *c, void *buf, size_t count, loom_dtype dt,
				      void *stream, loom_comm_work **out)
{
	return shard_start(c, c ? c->i->allgather_start : NULL, "all-gather", buf, count, dt,
			   stream, out);
}

/* The stream-ordered all-reduces: max 0, the sum; 1, the max. */
static loom_status ordered(loom_comm *c, int max, void *buf, size_t count, loom_dtype dt,
			   void *stream)
{
	loom_status st = usable(c, "all-reduce");

	if (st)
		return st;
	if ((count && !buf) || !loom_dtype_size(dt))
		return loom_pg_fail(c->pg, LOOM_ERR_INVALID, "all-reduce: bad arguments");
	if (!(max ? c->i->allreduce_max_ordered : c->i->allreduce_ordered))
		return loom_pg_fail(c->pg, LOOM_ERR_UNSUPPORTED,
				    "all-reduce (%s) in stream order: the %s backend has none (a "
				    "device backend, NCCL, has)",
				    max ? "max" : "sum", c->i->name);
	entering(c, "all-reduce (%s) of %zu %s", max ? "max" : "sum", count, loom_dtype_name(dt));
	return (max ? c->i->allreduce_max_ordered : c->i->allreduce_ordered)(c, buf, count, dt,
									     stream);
}

loom_status loom_comm_allreduce_ordered(loom_comm *c, void *buf, size_t count, loom_dtype dt,
					void *stream)
{
	return ordered(c, 0, buf, count, dt, stream);
}

loom_status loom_comm_allreduce_max_ordered(loom_comm *c, void *buf, size_t count, loom_dtype dt,
					    void *stream)
{
	return ordered(c, 1, buf, count, dt, stream);
}

/* Point-to-point: the same checks, and the peer is a rank of c other
 * than this one; then the progress record names the transfer. */
static loom_status p2p_args(loom_comm *c, const void *buf, size_t bytes, int peer,
			    loom_comm_work **out, const char *what, int have)
{
	loom_status st = usable(c, what);

	if (st)
		return st;
	if (!out || (bytes && !buf) || peer < 0 || peer >= c->world || peer == c->rank)
		return loom_pg_fail(c->pg, LOOM_ERR_INVALID, "%s: bad arguments (peer %d of %d)",
				    what, peer, c->world);
	if (!have)
		return loom_pg_fail(c->pg, LOOM_ERR_UNSUPPORTED, "%s: the %s backend has none",
				    what, c->i->name);
	*out = NULL;
	entering(c, "%s of %zu bytes %s rank %d", what, bytes, strcmp(what, "send") ? "from" : "to",
		 peer);
	return LOOM_OK;
}

loom_status loom_comm_send_start(loom_comm *c, const void *buf, size_t bytes, int peer, int tag,
				 void *stream, loom_comm_work **out)
{
	loom_status st = p2p_args(c, buf, bytes, peer, out, "send", c && c->i->send_start);

	return st ? st : c->i->send_start(c, buf, bytes, peer, tag, stream, out);
}

loom_status loom_comm_recv_start(loom_comm *c, void *buf, size_t bytes, int peer, int tag,
				 void *stream, loom_comm_work **out)
{
	loom_status st = p2p_args(c, buf, bytes, peer, out, "receive", c && c->i->recv_start);

	return st ? st : c->i->recv_start(c, buf, bytes, peer, tag, stream, out);
}

void loom_comm_restart(loom_comm *c, loom_comm_work *w)
{
	if (c && w && c->i->restart)
		c->i->restart(c, w);
}

loom_status loom_comm_split(loom_comm *c, int color, int key, loom_comm **out)
{
	loom_status st = usable(c, "split");

	if (st)
		return st;
	if (!out || color < 0)
		return loom_pg_fail(c->pg, LOOM_ERR_INVALID, "split: bad arguments (color %d)", color);
	*out = NULL;
	if (!c->i->split)
		return loom_pg_fail(c->pg, LOOM_ERR_UNSUPPORTED, "split: the %s backend has none",
				    c->i->name);
	entering(c, "split by color %d", color);
	return c->i->split(c, color, key, out);
}

void loom_comm_free(loom_comm *c)
{
	if (c && c->owned) {
		loom_comm_watch_stop(c);
		c->i->free(c);
	}
}

loom_status loom_comm_test(loom_comm *c, loom_comm_work *w, int *done)
{
	loom_status st = usable(c, "test");

	*done = 0;
	if (st)
		return st;
	if (!c->i->test)
		return LOOM_OK;
	return c->i->test(c, w, done);
}

loom_status loom_comm_wait(loom_comm *c, loom_comm_work *w)
{
	if (!c || !w)
		return LOOM_ERR_INVALID;
	/* wait() frees w even on a broken backend. */
	return c->i->wait(c, w);
}

loom_status loom_comm_allreduce(loom_comm *c, void *buf, size_t count, loom_dtype dt)
{
	loom_comm_work *w = NULL;
	loom_status st = loom_comm_allreduce_start(c, buf, count, dt, NULL, &w);

	return st ? st : loom_comm_wait(c, w);
}

loom_status loom_comm_broadcast(loom_comm *c, void *buf, size_t bytes, int root)
{
	loom_status st = usable(c, "broadcast");

	if (st)
		return st;
	if ((bytes && !buf) || root < 0 || root >= c->pg->info.world)
		return loom_pg_fail(c->pg, LOOM_ERR_INVALID, "broadcast: bad buffer or root %d",
				    root);
	entering(c, "broadcast of %zu bytes from rank %d", bytes, root);
	return c->i->broadcast(c, buf, bytes, root);
}

loom_status loom_comm_allgather(loom_comm *c, const void *send, size_t bytes, void *recv)
{
	loom_status st = usable(c, "all-gather");

	if (st)
		return st;
	if (bytes && (!send || !recv))
		return loom_pg_fail(c->pg, LOOM_ERR_INVALID, "all-gather: NULL buffer");
	entering(c, "all-gather of %zu bytes", bytes);
	return c->i->allgather(c, send, bytes, recv);
}

loom_status loom_comm_barrier(loom_comm *c)
{
	loom_status st = usable(c, "barrier");

	if (st)
		return st;
	entering(c, "barrier");
	return c->i->barrier(c);
}

void loom_comm_abort(loom_comm *c)
{
	if (!c)
		return;
	c->broken = 1;
	c->i->abort(c);
}

loom_status loom_comm_broadcast_many(loom_comm *c, void *const *bufs, const size_t *bytes,
				     size_t n, int root)
{
	size_t k;

	for (k = 0; k < n; k++) {
		loom_status st = loom_comm_broadcast(c, bufs[k], bytes[k], root);

		if (st)
			return st;
	}
	return LOOM_OK;
}

uint64_t loom_comm_hash(const void *data, size_t len, uint64_t seed)
{
	const uint8_t *p = data;
	uint64_t h = 1469598103934665603ull ^ seed;
	size_t k;

	for (k = 0; k < len; k++) {
		h ^= p[k];
		h *= 1099511628211ull;
	}
	return h;
}

/* ------------------------------------------------------------ world 1 */

struct loom_comm_work {
	int unused;
};

static loom_status self_allreduce_start(loom_comm *c, void *buf, size_t count, loom_dtype dt,
					void *stream, loom_comm_work **out)
{
	(void)buf, (void)count, (void)dt, (void)stream;
	*out = calloc(1, sizeof(**out));
	return *out ? LOOM_OK : loom_pg_fail(c->pg, LOOM_ERR_NOMEM, "out of memory");
}

static loom_status self_test(loom_comm *c, loom_comm_work *w, int *done)
{
	(void)c, (void)w;
	*done = 1;
	return LOOM_OK;
}

static loom_status self_wait(loom_comm *c, loom_comm_work *w)
{
	(void)c;
	free(w);
	return LOOM_OK;
}

static loom_status self_broadcast(loom_comm *c, void *buf, size_t bytes, int root)
{
	(void)c, (void)buf, (void)bytes, (void)root;
	return LOOM_OK;
}

static loom_status self_allgather(loom_comm *c, const void *send, size_t bytes, void *recv)
{
	(void)c;
	memmove(recv, send, bytes);
	return LOOM_OK;
}

static loom_status self_barrier(loom_comm *c)
{
	(void)c;
	return LOOM_OK;
}

static void self_abort(loom_comm *c)
{
	(void)c;
}

static void self_free(loom_comm *c)
{
	free(c);
}

static const loom_comm_i self_iface = {
	.name = "self",
	.allreduce_start = self_allreduce_start,
	.test = self_test,
	.wait = self_wait,
	.broadcast = self_broadcast,
	.allgather = self_allgather,
	.barrier = self_barrier,
	.abort = self_abort,
	.free = self_free,
	/* One rank: its shard is the whole sum and everyone's already. */
	.reduce_scatter_start = self_allreduce_start,
	.allgather_start = self_allreduce_start,
};

loom_status loom_self_backend_new(loom_pg *pg, loom_comm **out)
{
	return loom_comm_new_on(pg, &self_iface, NULL, out);
}

loom_status loom_comm_new_on(loom_pg *pg, const loom_comm_i *iface, void *ctx, loom_comm **out)
{
	loom_comm *c = calloc(1, sizeof(*c));

	if (!c)
		return loom_pg_fail(pg, LOOM_ERR_NOMEM, "out of memory");
	c->i = iface;
	c->ctx = ctx;
	c->pg = pg;
	c->rank = pg->info.rank;
	c->world = pg->info.world;
	*out = c;
	return LOOM_OK;
}
