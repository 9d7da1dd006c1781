/*
 * comm/mpi.c — Open MPI as bootstrap and as the host-memory backend. Under
 * mpirun the group is MPI_COMM_WORLD; under env:// the singletons join
 * through Open MPI's name server (ompi-server, started by rank 0) with
 * MPI_Comm_accept/connect, one rank at a time in rank order.
 *
 * Every collective is non-blocking and polled against a deadline, so a dead
 * peer is an error naming it, never a hang (Open MPI 4.1 has no fault
 * tolerance: a blocking call on a dead peer would wait forever).
 */
#include "comm/comm_internal.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/half.h"
#include "base/check.h"

struct loom_pg_mpi {
	MPI_Comm comm;
	int we_inited;            /* we called MPI_Init, so we finalize */
	int broken;               /* a collective timed out: never finalize */
	char port[MPI_MAX_PORT_NAME]; /* rank 0 under env:// */
	MPI_Op sum_f16, sum_bf16;
};

struct loom_comm_work {
	MPI_Request req;
	double t0;
	uint64_t seq; /* its number among the group's collectives */
	size_t count;
	loom_dtype dt;
	const char *what;   /* "all-reduce", ... for the timeout's message */
	void *move_to;      /* reduce-scatter: where the shard goes once summed */
	const void *move_from;
	size_t move_bytes;
};

const char *loom_mpi_error_string(int code);

const char *loom_mpi_error_string(int code)
{
	static __thread char buf[MPI_MAX_ERROR_STRING];
	int len = 0;

	if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS)
		snprintf(buf, sizeof(buf), "MPI error %d", code);
	return buf;
}

#define MPI_CHECK(pg, call) LOOM_MPI_CHECK(call, (pg)->err.msg, sizeof((pg)->err.msg))

/* ------------------------------------------------------------ sums */

/* MPI user ops: the sum of two halves of one format in fp32, rounded once. */
#define HALF_SUM_OP(name, to_f32, from_f32)                                     \
	static void name(void *in, void *inout, int *len, MPI_Datatype *dt)     \
	{                                                                       \
		const uint16_t *a = in;                                         \
		uint16_t *b = inout;                                            \
		(void)dt;                                                       \
		for (int i = 0; i < *len; i++)                                  \
			b[i] = from_f32(to_f32(a[i]) + to_f32(b[i]));           \
	}

HALF_SUM_OP(sum_f16, loom_f16_to_f32, loom_f32_to_f16)
HALF_SUM_OP(sum_bf16, loom_bf16_to_f32, loom_f32_to_bf16)

/* ------------------------------------------------------------ bootstrap */

static loom_status mpi_start(loom_pg *pg)
{
	struct loom_pg_mpi *m;
	int inited = 0, provided;
	loom_status st;

	m = calloc(1, sizeof(*m));
	if (!m)
		return loom_pg_fail(pg, LOOM_ERR_NOMEM, "out of memory");
	pg->mpi = m;
	m->comm = MPI_COMM_NULL;
	m->sum_f16 = m->sum_bf16 = MPI_OP_NULL;
	MPI_Initialized(&inited);
	if (!inited) {
		st = MPI_CHECK(pg, MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided));
		if (st)
			return st;
		m->we_inited = 1;
	}
	MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
	MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
	if ((st = MPI_CHECK(pg, MPI_Op_create(sum_f16, 1, &m->sum_f16))) ||
	    (st = MPI_CHECK(pg, MPI_Op_create(sum_bf16, 1, &m->sum_bf16))))
		return st;
	return LOOM_OK;
}

/* Polls req until done or deadline; on timeout names the dead ranks. The
 * watchdog (loom_pg_watch, once a second) ends the wait early when a peer
 * is found dead: only a silent peer costs the whole timeout. */
static loom_status mpi_poll(loom_pg *pg, MPI_Request *req, double t0, uint64_t seq,
			   const char *what)
{
	double deadline = t0 + pg->timeout_s, next = 0, grace = 0;
	char who[512];
	loom_status st;
	int done = 0;

	for (;;) {
		st = MPI_CHECK(pg, MPI_Test(req, &done, MPI_STATUS_IGNORE));
		if (st || done)
			return st;
		if (loom_comm_now() > deadline)
			break;
		/* A peer that finished its part and exited may still have
		 * bytes on the way: a dead peer ends the wait half a second
		 * after it was found, if the collective has not completed. */
		if (grace > 0 && loom_comm_now() > grace) {
			pg->mpi->broken = 1;
			return loom_pg_fail(pg, LOOM_ERR_IO, "rank %d: %s failed after %.1f s: %s",
					    pg->info.rank, what, loom_comm_now() - t0, who);
		}
		if (grace <= 0 && loom_pg_watch(pg, t0, &next, who, sizeof(who)))
			grace = loom_comm_now() + 0.5;
		loom_comm_backoff(loom_comm_now() - t0);
	}
	pg->mpi->broken = 1;
	loom_pg_name_culprit(pg, seq, who, sizeof(who));
	return loom_pg_fail(pg, LOOM_ERR_IO, "rank %d: %s timed out after %.1f s: %s",
			    pg->info.rank, what, pg->timeout_s, who);
}

static loom_status exchange_peers(loom_pg *pg)
{
	MPI_Request req;
	loom_status st;
	int k;

	st = MPI_CHECK(pg, MPI_Iallgather(&pg->peers[pg->info.rank], sizeof(loom_comm_peer),
					  MPI_BYTE, pg->peers, sizeof(loom_comm_peer), MPI_BYTE,
					  pg->mpi->comm, &req));
	if (!st)
		st = mpi_poll(pg, &req, loom_comm_now(), 0, "start-up exchange of peers");
	if (st)
		return st;
	for (k = 0; k < pg->info.world; k++) {
		loom_comm_peer *p = &pg->peers[k];

		p->host[LOOM_COMM_HOSTLEN - 1] = 0;
		if (p->rank != (uint32_t)k)
			return loom_pg_fail(pg, LOOM_ERR_FORMAT,
					    "start-up: peer entry %d names rank %u", k, p->rank);
		/* Same host: loopback reaches its probe whatever the interfaces. */
		snprintf(p->addr, sizeof(p->addr), "%s",
			 strcmp(p->host, pg->peers[pg->info.rank].host) ? p->host : "127.0.0.1");
	}
	return LOOM_OK;
}

/* The group's communicator made: it returns errors, and its rank and size
 * must be the launcher's (else code, with who and what says them). */
static loom_status adopt_comm(loom_pg *pg, loom_status code, const char *who, const char *expected)
{
	int rank, size;

	MPI_Comm_set_errhandler(pg->mpi->comm, MPI_ERRORS_RETURN);
	MPI_Comm_rank(pg->mpi->comm, &rank);
	MPI_Comm_size(pg->mpi->comm, &size);
	if (rank != pg->info.rank || size != pg->info.world)
		return loom_pg_fail(pg, code, "%s says rank %d of %d, %s %d of %d", who, rank, size,
				    expected, pg->info.rank, pg->info.world);
	return LOOM_OK;
}

loom_status loom_mpi_init_world(loom_pg *pg)
{
	loom_status st;

	st = mpi_start(pg);
	if (st)
		return st;
	if ((st = MPI_CHECK(pg, MPI_Comm_dup(MPI_COMM_WORLD, &pg->mpi->comm))))
		return st;
	st = adopt_comm(pg, LOOM_ERR_MISMATCH, "mpirun: MPI", "OMPI_COMM_WORLD_RANK/SIZE say");
	return st ? st : exchange_peers(pg);
}

loom_status loom_mpi_open(loom_pg *pg, char *port, size_t len)
{
	loom_status st = mpi_start(pg);

	if (st)
		return st;
	if (pg->info.rank == 0) {
		st = MPI_CHECK(pg, MPI_Open_port(MPI_INFO_NULL, pg->mpi->port));
		if (st)
			return st;
		snprintf(port, len, "%s", pg->mpi->port);
	}
	return LOOM_OK;
}

/* An inter-communicator made one (high: this side's ranks after the
 * other's), and freed. */
static loom_status merge_inter(loom_pg *pg, MPI_Comm inter, int high, MPI_Comm *out)
{
	loom_status st = MPI_CHECK(pg, MPI_Intercomm_merge(inter, high, out));

	MPI_Comm_free(&inter);
	return st;
}

/* The group so far accepts the next rank and merges it in (collective over
 * cur; only rank 0's port counts). */
static loom_status accept_one(loom_pg *pg, const char *port, MPI_Comm *cur)
{
	MPI_Comm inter, merged;
	loom_status st;

	st = MPI_CHECK(pg, MPI_Comm_accept(port, MPI_INFO_NULL, 0, *cur, &inter));
	if (st)
		return st;
	if ((st = merge_inter(pg, inter, 0, &merged)))
		return st;
	if (*cur != MPI_COMM_SELF)
		MPI_Comm_free(cur);
	*cur = merged;
	return LOOM_OK;
}

loom_status loom_mpi_join(loom_pg *pg, loom_rdv *r, const char *port)
{
	MPI_Comm cur = MPI_COMM_SELF, inter;
	char err[LOOM_COMM_ERRLEN];
	loom_status st;
	int size = 1, k;

	if (pg->info.rank == 0) {
		for (k = 1; k < pg->info.world; k++) {
			st = loom_rdv_send_go(r, k, err, sizeof(err));
			if (st)
				return loom_pg_fail(pg, st, "env:// join of rank %d: %s", k, err);
			st = accept_one(pg, port, &cur);
			if (st)
				return st;
		}
	} else {
		st = loom_rdv_wait_go(r, pg->join_timeout_s, err, sizeof(err));
		if (st)
			return loom_pg_fail(pg, st, "env:// join: %s", err);
		st = MPI_CHECK(pg, MPI_Comm_connect(port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter));
		if (st)
			return st;
		if ((st = merge_inter(pg, inter, 1, &cur)))
			return st;
		MPI_Comm_size(cur, &size);
		while (size < pg->info.world) {
			st = accept_one(pg, port, &cur);
			if (st)
				return st;
			MPI_Comm_size(cur, &size);
		}
	}
	/* Ranks follow RANK whatever order the joins took. */
	st = MPI_CHECK(pg, MPI_Comm_split(cur, 0, pg->info.rank, &pg->mpi->comm));
	if (cur != MPI_COMM_SELF)
		MPI_Comm_free(&cur);
	if (st)
		return st;
	return adopt_comm(pg, LOOM_ERR_STATE, "env:// join: the joined group", "expected");
}

void loom_mpi_finish(loom_pg *pg)
{
	struct loom_pg_mpi *m = pg->mpi;
	int finalized = 0;

	if (!m)
		return;
	if (!m->broken) {
		if (m->comm != MPI_COMM_NULL)
			MPI_Comm_free(&m->comm);
		if (m->port[0])
			MPI_Close_port(m->port);
		if (m->sum_f16 != MPI_OP_NULL)
			MPI_Op_free(&m->sum_f16);
		if (m->sum_bf16 != MPI_OP_NULL)
			MPI_Op_free(&m->sum_bf16);
		MPI_Finalized(&finalized);
		if (m->we_inited && !finalized)
			MPI_Finalize();
	}
	free(m);
	pg->mpi = NULL;
}

/* ------------------------------------------------------------ backend */

/* A sub-communicator's own MPI communicator (loom_comm_split). */
struct mpi_sub {
	MPI_Comm comm;
};

/* The MPI communicator behind c: a split's own, or the group's. (It once
 * called itself for the group's: optimised builds read the group's struct
 * through the split's cast by luck, as comm is the first field of both; the
 * ASan build spun forever in the first all-reduce.) */
static MPI_Comm comm_of(loom_comm *c)
{
	return c->owned ? ((struct mpi_sub *)c->ctx)->comm : c->pg->mpi->comm;
}

static loom_status mpi_type(loom_comm *c, loom_dtype dt, MPI_Datatype *type, MPI_Op *op)
{
	struct loom_pg_mpi *m = c->pg->mpi;

	*op = MPI_SUM;
	switch (dt) {
	case LOOM_F32:
		*type = MPI_FLOAT;
		return LOOM_OK;
	case LOOM_F64:
		*type = MPI_DOUBLE;
		return LOOM_OK;
	case LOOM_I32:
		*type = MPI_INT32_T;
		return LOOM_OK;
	case LOOM_F16:
		*type = MPI_UINT16_T;
		*op = m->sum_f16;
		return LOOM_OK;
	case LOOM_BF16:
		*type = MPI_UINT16_T;
		*op = m->sum_bf16;
		return LOOM_OK;
	default:
		return loom_pg_fail(c->pg, LOOM_ERR_DTYPE, "all-reduce: no sum for dtype %d",
				    (int)dt);
	}
}

static loom_status fits_int(loom_comm *c, size_t n, const char *what)
{
	if (n > (size_t)0x7fffffff)
		return loom_pg_fail(c->pg, LOOM_ERR_UNSUPPORTED,
				    "%s of %zu elements: MPI counts stop at 2^31-1; split it", what,
				    n);
	return LOOM_OK;
}

/* A failed or timed-out collective breaks the backend for good. */
static loom_status finish(loom_comm *c, MPI_Request *req, double t0, uint64_t seq,
			  const char *what)
{
	loom_status st = mpi_poll(c->pg, req, t0, seq, what);

	if (st)
		c->broken = 1;
	return st;
}

/* A work for a collective of count dt about to start (NULL: out of memory,
 * said in the group's error). */
static struct loom_comm_work *work_new(loom_comm *c, size_t count, loom_dtype dt, const char *what)
{
	struct loom_comm_work *w = calloc(1, sizeof(*w));

	if (!w) {
		loom_pg_fail(c->pg, LOOM_ERR_NOMEM, "out of memory");
		return NULL;
	}
	w->t0 = loom_comm_now();
	w->seq = c->pg->seq;
	w->count = count;
	w->dt = dt;
	w->what = what;
	return w;
}

/* The start call's verdict: *out gets w, or w goes and the backend breaks. */
static loom_status started(loom_comm *c, loom_status st, struct loom_comm_work *w,
			   loom_comm_work **out)
{
	if (st) {
		free(w);
		c->broken = 1;
		return st;
	}
	*out = w;
	return LOOM_OK;
}

/*
 * All-reduce, or (scatter) MPI_Ireduce_scatter_block in place: it sums
 * every rank's block r into the start of rank r's buffer; the wait moves it
 * to the rank's own place, so that the shard lies where the bucket's
 * elements are.
 */
static loom_status mpi_reduce_start(loom_comm *c, void *buf, size_t count, loom_dtype dt,
				    loom_comm_work **out, int scatter)
{
	const char *what = scatter ? "reduce-scatter" : "all-reduce";
	struct loom_comm_work *w;
	MPI_Datatype type = MPI_DATATYPE_NULL;
	MPI_Op op;
	loom_status st;
	size_t esz = loom_dtype_size(dt);

	if ((st = mpi_type(c, dt, &type, &op)) ||
	    (st = fits_int(c, scatter ? count * (size_t)c->world : count, what)))
		return st;
	if (!(w = work_new(c, count, dt, what)))
		return LOOM_ERR_NOMEM;
	if (!scatter)
		return started(c, MPI_CHECK(c->pg, MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count,
								  type, op, comm_of(c), &w->req)),
			       w, out);
	w->move_to = (unsigned char *)buf + (size_t)c->rank * count * esz;
	w->move_from = buf;
	w->move_bytes = count * esz;
	return started(c, MPI_CHECK(c->pg, MPI_Ireduce_scatter_block(MPI_IN_PLACE, buf, (int)count,
								     type, op, comm_of(c),
								     &w->req)), w, out);
}

static loom_status mpi_allreduce_start(loom_comm *c, void *buf, size_t count, loom_dtype dt,
				       void *stream, loom_comm_work **out)
{
	(void)stream;
	return mpi_reduce_start(c, buf, count, dt, out, 0);
}

static loom_status mpi_reduce_scatter_start(loom_comm *c, void *buf, size_t count, loom_dtype dt,
					    void *stream, loom_comm_work **out)
{
	(void)stream;
	return mpi_reduce_start(c, buf, count, dt, out, 1);
}

/* In place: rank r's block of buf is its contribution. */
static loom_status mpi_allgather_start(loom_comm *c, void *buf, size_t count, loom_dtype dt,
				       void *stream, loom_comm_work **out)
{
	struct loom_comm_work *w;
	size_t bytes = count * loom_dtype_size(dt);
	loom_status st;

	(void)stream;
	if ((st = fits_int(c, bytes, "all-gather")))
		return st;
	if (!(w = work_new(c, count, dt, "all-gather")))
		return LOOM_ERR_NOMEM;
	return started(c, MPI_CHECK(c->pg, MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf,
							  (int)bytes, MPI_BYTE, comm_of(c),
							  &w->req)), w, out);
}

/* Pipeline stages: MPI_Isend / MPI_Irecv of bytes, finished by test and
 * wait like the collectives (wait polls against the group's timeout). */
static loom_status mpi_p2p_start(loom_comm *c, void *buf, size_t bytes, int peer, int tag,
				 loom_comm_work **out, int send)
{
	struct loom_comm_work *w;
	loom_status st;
	const char *what = send ? "send" : "receive";

	if ((st = fits_int(c, bytes, what)))
		return st;
	if (!(w = work_new(c, bytes, LOOM_F32, what)))
		return LOOM_ERR_NOMEM;
	w->dt = LOOM_DTYPE_COUNT; /* the wait's message: count is bytes */
	return started(c, MPI_CHECK(c->pg, send ? MPI_Isend(buf, (int)bytes, MPI_BYTE, peer,
							    tag & 0x7fff, comm_of(c), &w->req) :
						  MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer,
							    tag & 0x7fff, comm_of(c), &w->req)),
		       w, out);
}

static loom_status mpi_send_start(loom_comm *c, const void *buf, size_t bytes, int peer, int tag,
				  void *stream, loom_comm_work **out)
{
	(void)stream;
	return mpi_p2p_start(c, (void *)buf, bytes, peer, tag, out, 1);
}

static loom_status mpi_recv_start(loom_comm *c, void *buf, size_t bytes, int peer, int tag,
				  void *stream, loom_comm_work **out)
{
	(void)stream;
	return mpi_p2p_start(c, buf, bytes, peer, tag, out, 0);
}

/* The timeout counts from now (a receive posted early, waited at its step). */
static void mpi_restart(loom_comm *c, struct loom_comm_work *w)
{
	(void)c;
	w->t0 = loom_comm_now();
}

static const loom_comm_i mpi_iface;
static loom_status mpi_barrier(loom_comm *c);

static loom_status mpi_split(loom_comm *c, int color, int key, loom_comm **out)
{
	loom_comm *s = calloc(1, sizeof(*s));
	struct mpi_sub *x = calloc(1, sizeof(*x));
	loom_status st;

	if (!s || !x) {
		free(s);
		free(x);
		return loom_pg_fail(c->pg, LOOM_ERR_NOMEM, "out of memory");
	}
	x->comm = MPI_COMM_NULL;
	/* MPI_Comm_split blocks: a barrier first, polled against the
	 * timeout, so that a dead rank is an error and not a hang. */
	if ((st = mpi_barrier(c)) ||
	    (st = MPI_CHECK(c->pg, MPI_Comm_split(comm_of(c), color, key, &x->comm)))) {
		free(s);
		free(x);
		return st;
	}
	MPI_Comm_set_errhandler(x->comm, MPI_ERRORS_RETURN);
	s->i = &mpi_iface;
	s->ctx = x;
	s->pg = c->pg;
	s->owned = 1;
	MPI_Comm_rank(x->comm, &s->rank);
	MPI_Comm_size(x->comm, &s->world);
	*out = s;
	return LOOM_OK;
}

/* The group's own communicator is the group's; a split's MPI
 * communicator is freed with it. */
static void mpi_free(loom_comm *c)
{
	struct mpi_sub *x = c->owned ? c->ctx : NULL;

	/* MPI_Comm_free is collective in spirit only (local in Open MPI);
	 * skipped once MPI broke, as MPI_Finalize is. */
	if (x && x->comm != MPI_COMM_NULL && !c->pg->mpi->broken)
		MPI_Comm_free(&x->comm);
	free(x);
	free(c);
}

static loom_status mpi_test(loom_comm *c, loom_comm_work *w, int *done)
{
	loom_status st = MPI_CHECK(c->pg, MPI_Test(&w->req, done, MPI_STATUS_IGNORE));

	if (st)
		c->broken = 1;
	return st;
}

static loom_status mpi_wait(loom_comm *c, loom_comm_work *w)
{
	char what[96];
	loom_status st;

	if (w->dt == LOOM_DTYPE_COUNT) /* a send or receive: count is bytes */
		snprintf(what, sizeof(what), "%s of %zu bytes", w->what, w->count);
	else
		snprintf(what, sizeof(what), "%s of %zu %s", w->what, w->count,
			 loom_dtype_name(w->dt));
	st = finish(c, &w->req, w->t0, w->seq, what);
	if (!st && w->move_to && w->move_to != w->move_from)
		memmove(w->move_to, w->move_from, w->move_bytes);
	free(w);
	return st;
}

static loom_status mpi_broadcast(loom_comm *c, void *buf, size_t bytes, int root)
{
	MPI_Request req;
	double t0 = loom_comm_now();
	loom_status st = fits_int(c, bytes, "broadcast");

	if (st)
		return st;
	st = MPI_CHECK(c->pg, MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, comm_of(c), &req));
	return st ? st : finish(c, &req, t0, c->pg->seq, "broadcast");
}

static loom_status mpi_allgather(loom_comm *c, const void *send, size_t bytes, void *recv)
{
	MPI_Request req;
	double t0 = loom_comm_now();
	loom_status st = fits_int(c, bytes, "all-gather");

	if (st)
		return st;
	st = MPI_CHECK(c->pg, MPI_Iallgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes,
					     MPI_BYTE, comm_of(c), &req));
	return st ? st : finish(c, &req, t0, c->pg->seq, "all-gather");
}

static loom_status mpi_barrier(loom_comm *c)
{
	MPI_Request req;
	double t0 = loom_comm_now();
	loom_status st = MPI_CHECK(c->pg, MPI_Ibarrier(comm_of(c), &req));

	return st ? st : finish(c, &req, t0, c->pg->seq, "barrier");
}

static void mpi_abort(loom_comm *c)
{
	/* Outstanding requests cannot be cancelled (collectives), so the only
	 * safe thing is to never touch MPI again, MPI_Finalize included. */
	c->pg->mpi->broken = 1;
}

static const loom_comm_i mpi_iface = {
	.name = "mpi",
	.allreduce_start = mpi_allreduce_start,
	.test = mpi_test,
	.wait = mpi_wait,
	.broadcast = mpi_broadcast,
	.allgather = mpi_allgather,
	.barrier = mpi_barrier,
	.abort = mpi_abort,
	.free = mpi_free,
	.reduce_scatter_start = mpi_reduce_scatter_start,
	.allgather_start = mpi_allgather_start,
	.send_start = mpi_send_start,
	.recv_start = mpi_recv_start,
	.split = mpi_split,
	.restart = mpi_restart,
};

loom_status loom_mpi_backend_new(loom_pg *pg, loom_comm **out)
{
	return loom_comm_new_on(pg, &mpi_iface, pg->mpi, out);
}
