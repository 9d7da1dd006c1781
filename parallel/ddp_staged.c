/*
 * parallel/ddp_staged.c — data parallelism on a device backend without a
 * device communicator (ranks that share a GPU, where NCCL refuses two ranks
 * on one device), or under LOOM_DDP_STAGE_HOST=1 on any backend: a
 * communicator whose bucket all-reduce copies the bucket to a host buffer,
 * sums it with the group's host communicator (MPI) and copies the sum back
 * when waited for.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "parallel/parallel.h"

/* The host buffers mirror the bucket region: a bucket at offset o of the
 * arena's region is staged at o of buf, so each bucket has its own,
 * allocated once at plan time. */
typedef struct staged_ctx {
	loom_program *p;
	loom_comm *host;
	unsigned char *buf;
	size_t bytes;
	/* Any other buffer (synchronised batch norm's sums): one at a time,
	 * through this scratch, grown as needed and kept. */
	unsigned char *scratch;
	size_t scratch_bytes;
	int scratch_busy;
} staged_ctx;

/* One staged all-reduce: the host's work, and where its sum goes back. */
struct loom_comm_work {
	loom_comm_work *inner;
	void *dev;
	const void *host;
	size_t bytes;
	int scratch; /* it holds the scratch */
};

/* A backend's failure (its message in the program), said in the group's
 * error as the executor reads it. */
static loom_status staged_be(loom_comm *c, loom_status st)
{
	staged_ctx *s = c->ctx;
	if (st == LOOM_OK)
		return LOOM_OK;
	return loom_comm_fail(c, st, "host-staged collective: %s", loom_program_error(s->p));
}

/* The host buffer that stages buf: its bucket's, or the scratch. */
static loom_status host_side(loom_comm *c, void *buf, size_t bytes, unsigned char **host,
			     int *scratch)
{
	staged_ctx *s = c->ctx;
	const unsigned char *region = s->p->arena.bucket, *b = buf;
	*scratch = !region || b < region || b + bytes > region + s->bytes;
	if (!*scratch) {
		*host = s->buf + (b - region);
		return LOOM_OK;
	}
	if (s->scratch_busy)
		return loom_comm_fail(c, LOOM_ERR_STATE, "host-staged all-reduce of %zu bytes "
				      "outside the buckets while another is in flight", bytes);
	if (bytes > s->scratch_bytes) {
		unsigned char *n = realloc(s->scratch, bytes);
		if (!n)
			return loom_comm_fail(c, LOOM_ERR_NOMEM, "host-staged all-reduce: out of memory");
		s->scratch = n;
		s->scratch_bytes = bytes;
	}
	*host = s->scratch;
	s->scratch_busy = 1;
	return LOOM_OK;
}

/* The download waits for the compute stream, which produced buf (the
 * communication stream only waits for it too), then the host sum starts
 * on the host copy. */
static loom_status staged_allreduce_start(loom_comm *c, void *buf, size_t count, loom_dtype dt,
					  void *stream, loom_comm_work **out)
{
	staged_ctx *s = c->ctx;
	loom_program *p = s->p;
	size_t bytes = count * loom_dtype_size(dt);
	unsigned char *host = NULL;
	int scratch;
	(void)stream;
	loom_comm_work *w = calloc(1, sizeof(*w));
	if (!w)
		return loom_comm_fail(c, LOOM_ERR_NOMEM, "host-staged all-reduce: out of memory");
	loom_status st = host_side(c, buf, bytes, &host, &scratch);
	if (st != LOOM_OK) {
		free(w);
		return st;
	}
	*w = (loom_comm_work){ .dev = buf, .host = host, .bytes = bytes, .scratch = scratch };
	st = staged_be(c, loom_program_download(p, host, buf, bytes));
	if (st == LOOM_OK)
		st = loom_comm_allreduce_start(s->host, host, count, dt, NULL, &w->inner);
	if (st != LOOM_OK) {
		s->scratch_busy &= !scratch;
		free(w);
		return st;
	}
	*out = w;
	return LOOM_OK;
}

static loom_status staged_test(loom_comm *c, loom_comm_work *w, int *done)
{
	staged_ctx *s = c->ctx;
	return loom_comm_test(s->host, w->inner, done);
}

/* The host sum ends, then goes up in the compute stream's order (before
 * the update that reads it). */
static loom_status staged_wait(loom_comm *c, loom_comm_work *w)
{
	staged_ctx *s = c->ctx;
	loom_status st = loom_comm_wait(s->host, w->inner);
	if (st == LOOM_OK)
		st = staged_be(c, loom_program_upload(s->p, w->dev, w->host, w->bytes));
	/* The upload may still read w->host; the next write there is a
	 * download, which waits for the stream's work before it. */
	s->scratch_busy &= !w->scratch;
	free(w);
	return st;
}

/* Synchronised batch norm's sums, inside a node: the host waits for the
 * stream (the download), sums, and the sum goes up before the stream's
 * later work. */
static loom_status staged_allreduce_ordered(loom_comm *c, void *buf, size_t count, loom_dtype dt,
					    void *stream)
{
	loom_comm_work *w = NULL;
	loom_status st = staged_allreduce_start(c, buf, count, dt, stream, &w);
	return st == LOOM_OK ? staged_wait(c, w) : st;
}

/* Start-up only (rank 0's parameters): through a host copy made here. */
static loom_status staged_broadcast(loom_comm *c, void *buf, size_t bytes, int root)
{
	staged_ctx *s = c->ctx;
	loom_program *p = s->p;
	unsigned char *tmp = malloc(bytes ? bytes : 1);
	if (!tmp)
		return loom_comm_fail(c, LOOM_ERR_NOMEM, "host-staged broadcast: out of memory");
	loom_status st = staged_be(c, loom_program_download(p, tmp, buf, bytes));
	if (st == LOOM_OK)
		st = loom_comm_broadcast(s->host, tmp, bytes, root);
	if (st == LOOM_OK)
		st = staged_be(c, loom_program_upload(p, buf, tmp, bytes));
	/* the upload may still read tmp */
	if (st == LOOM_OK)
		st = staged_be(c, loom_pass_sync(p));
	free(tmp);
	return st;
}

static loom_status staged_allgather(loom_comm *c, const void *send, size_t bytes, void *recv)
{
	staged_ctx *s = c->ctx;
	return loom_comm_allgather(s->host, send, bytes, recv);
}

static loom_status staged_barrier(loom_comm *c)
{
	staged_ctx *s = c->ctx;
	return loom_comm_barrier(s->host);
}

static void staged_abort(loom_comm *c)
{
	staged_ctx *s = c->ctx;
	loom_comm_abort(s->host);
}

static void staged_free(loom_comm *c)
{
	staged_ctx *s = c->ctx;
	free(s->buf);
	free(s->scratch);
	free(s);
	free(c);
}

static const loom_comm_i staged_iface = {
	.name = "host-staged MPI",
	.no_graph = "its collectives are staged through host memory (ranks sharing a GPU, "
		    "or LOOM_DDP_STAGE_HOST=1)",
	.allreduce_start = staged_allreduce_start,
	.allreduce_ordered = staged_allreduce_ordered,
	.test = staged_test,
	.wait = staged_wait,
	.broadcast = staged_broadcast,
	.allgather = staged_allgather,
	.barrier = staged_barrier,
	.abort = staged_abort,
	.free = staged_free,
};

/* What staging does not carry yet, or NULL. */
static const char *staged_refuses(const loom_program *p)
{
	if (p->plan.opts.zero_stage > 0)
		return "ZeRO (its reduce-scatter and all-gather)";
	return NULL;
}

loom_status loom_ddp_staged_new(loom_program *p, loom_comm *host, char *err, size_t errlen)
{
	const char *no = staged_refuses(p);
	if (no) {
		snprintf(err, errlen,
			 "data parallel on the %s backend with its collectives staged through host "
			 "memory (no device communicator: ranks share a GPU, or "
			 "LOOM_DDP_STAGE_HOST=1): %s is not staged yet", loom_pass_backend_name(p),
			 no);
		return LOOM_ERR_UNSUPPORTED;
	}
	loom_comm *c = calloc(1, sizeof(*c));
	staged_ctx *s = calloc(1, sizeof(*s));
	if (!c || !s) {
		free(c);
		free(s);
		snprintf(err, errlen, "data parallel: out of memory");
		return LOOM_ERR_NOMEM;
	}
	*s = (staged_ctx){ .p = p, .host = host };
	*c = (loom_comm){ .i = &staged_iface, .ctx = s, .pg = host->pg, .rank = host->rank,
			  .world = host->world, .owned = 1 };
	p->plan.comm = c;
	return LOOM_OK;
}

loom_status loom_ddp_staged_buffers(loom_program *p, char *err, size_t errlen)
{
	if (!loom_ddp_staged(&p->plan))
		return LOOM_OK;
	staged_ctx *s = p->plan.comm->ctx;
	const loom_buckets *b = &p->plan.buckets;
	size_t end = 0;
	for (int k = 0; k < b->n; k++)
		if (b->b[k].base + b->b[k].bytes > end)
			end = b->b[k].base + b->b[k].bytes;
	free(s->buf);
	s->bytes = end;
	if (!(s->buf = malloc(end ? end : 1))) {
		snprintf(err, errlen, "data parallel: out of memory for %zu bytes of host buffers", end);
		return LOOM_ERR_NOMEM;
	}
	return LOOM_OK;
}

int loom_ddp_staged(const loom_plan *pl)
{
	return pl->comm && pl->comm->i == &staged_iface;
}

void loom_ddp_staged_free(loom_program *p)
{
	if (loom_ddp_staged(&p->plan)) {
		loom_comm_free(p->plan.comm);
		p->plan.comm = NULL;
	}
}
