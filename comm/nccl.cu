/*
 * comm/nccl.cu — the device-memory backend: one NCCL communicator per group
 * (made from rank 0's unique id, non-blocking so that init too has a
 * deadline), its own CUDA stream, completion through events, and the
 * asynchronous error polled with ncclCommGetAsyncError; a collective past
 * the timeout aborts the communicator (ncclCommAbort) and names the ranks
 * the liveness probe finds dead.
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "base/check.h"

#define CUDA_OK(pg, call) LOOM_CUDA_CHECK(call, (pg)->err.msg, sizeof((pg)->err.msg))
#define NCCL_OK(pg, call) LOOM_NCCL_CHECK(call, (pg)->err.msg, sizeof((pg)->err.msg))

struct nccl_ctx {
	ncclComm_t comm;
	cudaStream_t stream;
	cudaEvent_t ready; /* the producer's stream reached the collective */
	float *scratch;    /* the barrier's one float */
	uint8_t *host;     /* the all-gather's pinned staging (cudaMallocHost) */
	size_t host_bytes;
};

struct loom_comm_work {
	cudaEvent_t done;
	double t0;
	size_t count;
	loom_dtype dt;
	const char *p2p; /* "send" or "receive" (count is bytes); NULL: a collective */
	int kept;        /* made once (nccl_work_make): wait ends it, never frees it */
	const char *what; /* "all-reduce", "reduce-scatter", "all-gather" */
};

extern "C" loom_status loom_nccl_unique_id(uint8_t id[LOOM_COMM_NCCL_ID_BYTES], char *err,
					   size_t errlen)
{
	static_assert(sizeof(ncclUniqueId) == LOOM_COMM_NCCL_ID_BYTES, "ncclUniqueId size");
	ncclUniqueId u;
	loom_status st = LOOM_NCCL_CHECK(ncclGetUniqueId(&u), err, errlen);

	if (!st)
		memcpy(id, &u, sizeof(u));
	return st;
}

static nccl_ctx *ctx_of(loom_comm *c)
{
	return (nccl_ctx *)c->ctx;
}

/* On a timeout: abort the communicator (its kernels would spin forever),
 * name who is dead, and never touch it again. */
static loom_status timed_out(loom_comm *c, const char *what)
{
	nccl_ctx *x = ctx_of(c);
	char who[512];

	loom_pg_name_dead(c->pg, who, sizeof(who));
	if (x->comm)
		ncclCommAbort(x->comm);
	x->comm = NULL;
	return loom_comm_fail(c, LOOM_ERR_IO, "rank %d: NCCL %s timed out after %.1f s: %s",
			      c->pg->info.rank, what, c->pg->timeout_s, who);
}

/* The communicator's asynchronous state: LOOM_OK while fine or in progress. */
static loom_status async_state(loom_comm *c, int *in_progress)
{
	nccl_ctx *x = ctx_of(c);
	ncclResult_t state = ncclSuccess;
	loom_status st = NCCL_OK(c->pg, ncclCommGetAsyncError(x->comm, &state));

	*in_progress = state == ncclInProgress;
	if (st)
		return loom_comm_fail(c, st, "%s", c->pg->err.msg);
	if (state != ncclSuccess && state != ncclInProgress) {
		ncclCommAbort(x->comm);
		x->comm = NULL;
		return loom_comm_fail(c, LOOM_ERR_BACKEND, "rank %d: NCCL failed: %s (%d)",
				      c->pg->info.rank, ncclGetErrorString(state), (int)state);
	}
	return LOOM_OK;
}

/* Polls until ev has completed, or (mark) until the device wrote serial or
 * a later one at *mark (neither: until the communicator is ready). */
static loom_status poll_mark(loom_comm *c, cudaEvent_t ev, const volatile uint64_t *mark,
			     uint64_t serial, double t0, const char *what)
{
	nccl_ctx *x = ctx_of(c);
	double next = 0;
	char who[512];

	for (;;) {
		int busy;
		loom_status st = async_state(c, &busy);

		if (st)
			return st;
		if (!ev && !mark && !busy)
			return LOOM_OK;
		/* A replayed graph's collective: its mark, written by the
		 * device after it (host-mapped memory, read without a call). */
		if (mark && *mark >= serial)
			return LOOM_OK;
		if (ev) {
			cudaError_t q = cudaEventQuery(ev);

			if (q == cudaSuccess)
				return LOOM_OK;
			if (q != cudaErrorNotReady)
				return loom_comm_fail(c, CUDA_OK(c->pg, q), "%s", c->pg->err.msg);
		}
		if (loom_comm_now() - t0 > c->pg->timeout_s)
			return timed_out(c, what);
		/* A peer found dead ends the wait at once: its kernels would
		 * spin until the timeout otherwise. */
		if (loom_pg_watch(c->pg, t0, &next, who, sizeof(who))) {
			if (x->comm)
				ncclCommAbort(x->comm);
			x->comm = NULL;
			return loom_comm_fail(c, LOOM_ERR_IO, "rank %d: NCCL %s failed after %.1f s: %s",
					      c->pg->info.rank, what, loom_comm_now() - t0, who);
		}
		loom_comm_backoff(loom_comm_now() - t0);
	}
}

static loom_status poll_until(loom_comm *c, cudaEvent_t ev, double t0, const char *what)
{
	return poll_mark(c, ev, NULL, 0, t0, what);
}

static loom_status nccl_type(loom_comm *c, loom_dtype dt, ncclDataType_t *t)
{
	switch (dt) {
	case LOOM_F32: *t = ncclFloat32; return LOOM_OK;
	case LOOM_F64: *t = ncclFloat64; return LOOM_OK;
	case LOOM_F16: *t = ncclFloat16; return LOOM_OK;
	case LOOM_BF16: *t = ncclBfloat16; return LOOM_OK;
	case LOOM_I32: *t = ncclInt32; return LOOM_OK;
	default:
		return loom_pg_fail(c->pg, LOOM_ERR_DTYPE, "NCCL all-reduce: no sum for dtype %d",
				    (int)dt);
	}
}

/* A collective call: ncclInProgress is the non-blocking communicator's "queued". */
static loom_status enqueued(loom_comm *c, ncclResult_t rc)
{
	if (rc == ncclSuccess || rc == ncclInProgress)
		return LOOM_OK;
	return loom_comm_fail(c, NCCL_OK(c->pg, rc), "%s", c->pg->err.msg);
}

/*
 * A collective on the communicator's stream. ncclInProgress means the
 * non-blocking communicator may still be putting it on the stream: whatever
 * is recorded or issued on that stream next (the done event, a copy back)
 * must come after it, so the host waits for the enqueue (not for the sum).
 */
static loom_status issued(loom_comm *c, ncclResult_t rc, const char *what)
{
	loom_status st = enqueued(c, rc);

	if (!st && rc == ncclInProgress)
		st = poll_until(c, NULL, loom_comm_now(), what);
	return st;
}

enum { START_ALLREDUCE, START_REDUCE_SCATTER, START_ALLGATHER };

/* The one enqueue of each bucket collective. ZeRO's pair is in place: rank
 * r's shard is elements [r * count, (r + 1) * count) of buf, as NCCL's
 * in-place forms want (recvbuff = sendbuff + rank * count for the
 * reduce-scatter, sendbuff = recvbuff + rank * count for the all-gather). */
static ncclResult_t enqueue(nccl_ctx *x, int kind, void *buf, char *mine, size_t count,
			    ncclDataType_t t)
{
	if (kind == START_REDUCE_SCATTER)
		return ncclReduceScatter(buf, mine, count, t, ncclSum, x->comm, x->stream);
	if (kind == START_ALLGATHER)
		return ncclAllGather(mine, buf, count, t, x->comm, x->stream);
	return ncclAllReduce(buf, buf, count, t, ncclSum, x->comm, x->stream);
}

/* A bucket collective on the communicator's stream, ordered after stream;
 * *out waits for it (its done event). */
static loom_status nccl_start(loom_comm *c, void *buf, size_t count, loom_dtype dt, void *stream,
			      loom_comm_work **out, int kind)
{
	static const char *const what[] = { "all-reduce enqueue", "reduce-scatter enqueue",
					    "all-gather enqueue" };
	nccl_ctx *x = ctx_of(c);
	ncclDataType_t t;
	loom_comm_work *w;
	loom_status st;
	char *mine = (char *)buf + (size_t)c->pg->info.rank * count * loom_dtype_size(dt);

	static const char *const names[] = { "all-reduce", "reduce-scatter", "all-gather" };
	if ((st = nccl_type(c, dt, &t)))
		return st;
	/* A made work (its event made once) is reused; else one per call. */
	w = *out ? *out : (loom_comm_work *)calloc(1, sizeof(*w));
	if (!w)
		return loom_pg_fail(c->pg, LOOM_ERR_NOMEM, "out of memory");
	w->t0 = loom_comm_now();
	w->count = count;
	w->dt = dt;
	w->what = names[kind];
	/* The collective waits for whatever produced buf, on the device, and
	 * stream's later work waits for the collective (stream order: the
	 * executor's wait step is then an event on the device, not the host). */
	if ((st = CUDA_OK(c->pg, cudaEventRecord(x->ready, (cudaStream_t)stream))) ||
	    (st = CUDA_OK(c->pg, cudaStreamWaitEvent(x->stream, x->ready, 0))) ||
	    (st = issued(c, enqueue(x, kind, buf, mine, count, t), what[kind])) ||
	    (!w->done &&
	     (st = CUDA_OK(c->pg, cudaEventCreateWithFlags(&w->done, cudaEventDisableTiming)))) ||
	    (st = CUDA_OK(c->pg, cudaEventRecord(w->done, x->stream))) ||
	    (stream && (st = CUDA_OK(c->pg, cudaStreamWaitEvent((cudaStream_t)stream, w->done, 0))))) {
		if (!w->kept) {
			if (w->done)
				cudaEventDestroy(w->done);
			free(w);
		}
		c->broken = 1;
		return st;
	}
	*out = w;
	return LOOM_OK;
}

/* A bucket's work, made once when the executor first runs the plan. */
static loom_status nccl_work_make(loom_comm *c, loom_comm_work **out)
{
	loom_comm_work *w = (loom_comm_work *)calloc(1, sizeof(*w));
	loom_status st;

	if (!w)
		return loom_pg_fail(c->pg, LOOM_ERR_NOMEM, "out of memory");
	w->kept = 1;
	if ((st = CUDA_OK(c->pg, cudaEventCreateWithFlags(&w->done, cudaEventDisableTiming)))) {
		free(w);
		return st;
	}
	*out = w;
	return LOOM_OK;
}

static void nccl_work_free(loom_comm *c, loom_comm_work *w)
{
	(void)c;
	if (w->done)
		cudaEventDestroy(w->done);
	free(w);
}

static loom_status nccl_allreduce_start(loom_comm *c, void *buf, size_t count, loom_dtype dt,
					void *stream, loom_comm_work **out)
{
	return nccl_start(c, buf, count, dt, stream, out, START_ALLREDUCE);
}

static loom_status nccl_reduce_scatter_start(loom_comm *c, void *buf, size_t count, loom_dtype dt,
					     void *stream, loom_comm_work **out)
{
	return nccl_start(c, buf, count, dt, stream, out, START_REDUCE_SCATTER);
}

static loom_status nccl_allgather_start(loom_comm *c, void *buf, size_t count, loom_dtype dt,
					void *stream, loom_comm_work **out)
{
	return nccl_start(c, buf, count, dt, stream, out, START_ALLGATHER);
}

/* Pipeline stages: ncclSend / ncclRecv of bytes on the communicator's
 * stream after stream's work so far; *out waits for it (its done event),
 * and the receiver's stream then sees the bytes. Compiled; run only where
 * a GPU is. */
static loom_status nccl_p2p_start(loom_comm *c, void *buf, size_t bytes, int peer, void *stream,
				  loom_comm_work **out, int send)
{
	nccl_ctx *x = ctx_of(c);
	loom_comm_work *w = (loom_comm_work *)calloc(1, sizeof(*w));
	loom_status st;

	if (!w)
		return loom_pg_fail(c->pg, LOOM_ERR_NOMEM, "out of memory");
	w->t0 = loom_comm_now();
	w->count = bytes;
	w->dt = LOOM_F32;
	w->p2p = send ? "send" : "receive";
	ncclResult_t rc;
	if ((st = CUDA_OK(c->pg, cudaEventRecord(x->ready, (cudaStream_t)stream))) ||
	    (st = CUDA_OK(c->pg, cudaStreamWaitEvent(x->stream, x->ready, 0))))
		goto fail;
	rc = send ? ncclSend(buf, bytes, ncclUint8, peer, x->comm, x->stream) :
		    ncclRecv(buf, bytes, ncclUint8, peer, x->comm, x->stream);
	if ((st = issued(c, rc, send ? "send enqueue" : "receive enqueue")) ||
	    (st = CUDA_OK(c->pg, cudaEventCreateWithFlags(&w->done, cudaEventDisableTiming))) ||
	    (st = CUDA_OK(c->pg, cudaEventRecord(w->done, x->stream))))
		goto fail;
	*out = w;
	return LOOM_OK;
fail:
	if (w->done)
		cudaEventDestroy(w->done);
	free(w);
	c->broken = 1;
	return st;
}

/* The timeout counts from now (a receive waited at its step). */
static void nccl_restart(loom_comm *c, loom_comm_work *w)
{
	(void)c;
	w->t0 = loom_comm_now();
}

static loom_status nccl_send_start(loom_comm *c, const void *buf, size_t bytes, int peer, int tag,
				   void *stream, loom_comm_work **out)
{
	(void)tag; /* NCCL matches sends and receives by order, per peer */
	return nccl_p2p_start(c, (void *)buf, bytes, peer, stream, out, 1);
}

static loom_status nccl_recv_start(loom_comm *c, void *buf, size_t bytes, int peer, int tag,
				   void *stream, loom_comm_work **out)
{
	(void)tag;
	return nccl_p2p_start(c, buf, bytes, peer, stream, out, 0);
}

/* The stream waits for the sum: ready marks the stream's work so far, NCCL
 * runs on the communicator's own stream after it (one stream for every NCCL
 * call, so they run in the order they were issued, as on every rank), and
 * ready again marks the sum for the stream. Record and wait are back to
 * back on the host, so the one event serves both. */
static loom_status nccl_ordered(loom_comm *c, void *buf, size_t count, loom_dtype dt,
				void *stream, ncclRedOp_t op)
{
	nccl_ctx *x = ctx_of(c);
	ncclDataType_t t;
	int busy;
	loom_status st;

	if ((st = nccl_type(c, dt, &t)) || (st = async_state(c, &busy)))
		return st;
	if ((st = CUDA_OK(c->pg, cudaEventRecord(x->ready, (cudaStream_t)stream))) ||
	    (st = CUDA_OK(c->pg, cudaStreamWaitEvent(x->stream, x->ready, 0))) ||
	    (st = issued(c, ncclAllReduce(buf, buf, count, t, op, x->comm, x->stream),
			 "all-reduce enqueue")) ||
	    (st = CUDA_OK(c->pg, cudaEventRecord(x->ready, x->stream))) ||
	    (st = CUDA_OK(c->pg, cudaStreamWaitEvent((cudaStream_t)stream, x->ready, 0)))) {
		c->broken = 1;
		return st;
	}
	return LOOM_OK;
}

static loom_status nccl_allreduce_ordered(loom_comm *c, void *buf, size_t count, loom_dtype dt,
					  void *stream)
{
	return nccl_ordered(c, buf, count, dt, stream, ncclSum);
}

/* fp8's amaxes (engine/exec.c): ncclMax, the same stream order. */
static loom_status nccl_allreduce_max_ordered(loom_comm *c, void *buf, size_t count,
					      loom_dtype dt, void *stream)
{
	return nccl_ordered(c, buf, count, dt, stream, ncclMax);
}

/* What a timeout names: "all-reduce of 4096 f32", "send of 512 bytes". */
static void work_what(const loom_comm_work *w, char *what, size_t len)
{
	if (w->p2p)
		snprintf(what, len, "%s of %zu bytes", w->p2p, w->count);
	else
		snprintf(what, len, "%s of %zu %s", w->what ? w->what : "all-reduce", w->count,
			 loom_dtype_name(w->dt));
}

static loom_status nccl_test(loom_comm *c, loom_comm_work *w, int *done)
{
	int busy;
	loom_status st = async_state(c, &busy);
	cudaError_t q;

	if (st)
		return st;
	q = cudaEventQuery(w->done);
	*done = q == cudaSuccess;
	if (q != cudaSuccess && q != cudaErrorNotReady)
		return loom_comm_fail(c, CUDA_OK(c->pg, q), "%s", c->pg->err.msg);
	return LOOM_OK;
}

static loom_status nccl_wait(loom_comm *c, loom_comm_work *w)
{
	char what[96];
	loom_status st;

	work_what(w, what, sizeof(what));
	/* The watchdog thread waits here too: the device is per thread. */
	if (c->pg->info.device >= 0)
		(void)cudaSetDevice(c->pg->info.device);
	st = c->broken ? LOOM_ERR_STATE : poll_until(c, w->done, w->t0, what);
	if (!w->kept) {
		cudaEventDestroy(w->done);
		free(w);
	}
	return st;
}

/* A replayed graph's collective: the one its capture started on w (whose
 * count and dtype name it), ended when its mark reaches serial; the
 * timeout counts from the launch (t0). The event is not queried: its
 * record was the capture's. */
static loom_status nccl_wait_mark(loom_comm *c, loom_comm_work *w, const volatile uint64_t *mark,
				  uint64_t serial, double t0)
{
	char what[96];

	work_what(w, what, sizeof(what));
	if (c->pg->info.device >= 0)
		(void)cudaSetDevice(c->pg->info.device);
	return c->broken ? LOOM_ERR_STATE : poll_mark(c, NULL, mark, serial, t0, what);
}

/* Enqueues nothing more; waits for the stream's work so far. */
static loom_status drain(loom_comm *c, double t0, const char *what)
{
	cudaEvent_t ev;
	loom_status st = CUDA_OK(c->pg, cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));

	if (st)
		return st;
	st = CUDA_OK(c->pg, cudaEventRecord(ev, ctx_of(c)->stream));
	if (!st)
		st = poll_until(c, ev, t0, what);
	cudaEventDestroy(ev);
	return st;
}

static loom_status nccl_broadcast(loom_comm *c, void *buf, size_t bytes, int root)
{
	nccl_ctx *x = ctx_of(c);
	double t0 = loom_comm_now();
	loom_status st =
		issued(c, ncclBroadcast(buf, buf, bytes, ncclUint8, root, x->comm, x->stream),
		       "broadcast enqueue");

	return st ? st : drain(c, t0, "broadcast");
}

/* Pinned host staging of at least bytes (grown, never shrunk): a copy from
 * pageable memory would block the host until the stream gets there, outside
 * the timeout. */
static loom_status host_stage(loom_comm *c, size_t bytes)
{
	nccl_ctx *x = ctx_of(c);
	loom_status st;

	if (x->host_bytes >= bytes)
		return LOOM_OK;
	if (x->host)
		cudaFreeHost(x->host);
	x->host = NULL;
	x->host_bytes = 0;
	if ((st = CUDA_OK(c->pg, cudaMallocHost((void **)&x->host, bytes))))
		return st;
	x->host_bytes = bytes;
	return LOOM_OK;
}

/* Host bytes in, host bytes out, through pinned and device staging: every
 * copy is asynchronous, and the one wait is drain's, with the timeout. */
static loom_status nccl_allgather(loom_comm *c, const void *send, size_t bytes, void *recv)
{
	nccl_ctx *x = ctx_of(c);
	size_t total = bytes * (size_t)c->pg->info.world;
	double t0 = loom_comm_now();
	uint8_t *d = NULL;
	loom_status st;

	if (!bytes)
		return LOOM_OK;
	if ((st = host_stage(c, total)))
		return st;
	if ((st = CUDA_OK(c->pg, cudaMalloc((void **)&d, total))))
		return st;
	uint8_t *mine = d + bytes * (size_t)c->pg->info.rank;
	memcpy(x->host, send, bytes);
	if (!(st = CUDA_OK(c->pg, cudaMemcpyAsync(mine, x->host, bytes, cudaMemcpyHostToDevice,
						   x->stream))) &&
	    !(st = issued(c, ncclAllGather(mine, d, bytes, ncclUint8, x->comm, x->stream),
			  "all-gather enqueue")) &&
	    !(st = CUDA_OK(c->pg, cudaMemcpyAsync(x->host, d, total, cudaMemcpyDeviceToHost,
						   x->stream))) &&
	    !(st = drain(c, t0, "all-gather")))
		memcpy(recv, x->host, total);
	/* A broken communicator may still write d and the staging: both stay. */
	if (!c->broken)
		cudaFree(d);
	else
		x->host = NULL, x->host_bytes = 0;
	return st;
}

static loom_status nccl_barrier(loom_comm *c)
{
	nccl_ctx *x = ctx_of(c);
	double t0 = loom_comm_now();
	loom_status st = issued(
		c, ncclAllReduce(x->scratch, x->scratch, 1, ncclFloat32, ncclSum, x->comm, x->stream),
		"barrier enqueue");

	return st ? st : drain(c, t0, "barrier");
}

static void nccl_abort(loom_comm *c)
{
	nccl_ctx *x = ctx_of(c);

	if (x->comm)
		ncclCommAbort(x->comm);
	x->comm = NULL;
}

/* The longest a healthy teardown may wait for the communicator to go
 * quiet; then (or as soon as a peer is found dead) it is aborted. */
#define NCCL_FINALIZE_MAX_S 30.0

/*
 * ncclCommFinalize flushes what was issued; on the non-blocking
 * communicator it returns at once and the state reads ncclInProgress until
 * the communicator is quiescent, after which ncclCommDestroy is local.
 * Polled with a deadline, and the peers probed once a second: 1 when it
 * may be destroyed, 0 when it must be aborted (a peer gone, an error, or
 * the deadline).
 */
static int finalized(loom_comm *c)
{
	nccl_ctx *x = ctx_of(c);
	double limit = c->pg->timeout_s < NCCL_FINALIZE_MAX_S ? c->pg->timeout_s :
								 NCCL_FINALIZE_MAX_S;
	double t0 = loom_comm_now(), probe_at = 1.0;
	ncclResult_t rc = ncclCommFinalize(x->comm);

	if (rc != ncclSuccess && rc != ncclInProgress)
		return 0;
	for (;;) {
		ncclResult_t state = ncclInProgress;
		double waited;
		char who[256];

		if (ncclCommGetAsyncError(x->comm, &state) != ncclSuccess)
			return 0;
		if (state == ncclSuccess)
			return 1;
		if (state != ncclInProgress)
			return 0;
		waited = loom_comm_now() - t0;
		if (waited > limit)
			return 0;
		if (waited > probe_at) {
			if (loom_pg_name_dead(c->pg, who, sizeof(who)) > 0)
				return 0;
			probe_at = waited + 1.0;
		}
		loom_comm_backoff(waited);
	}
}

/* Never hangs: a healthy communicator is finalized (with a deadline) and
 * destroyed, a broken or stuck one aborted. The stream, event and buffers
 * are freed only after a clean destroy; after an abort they stay (a kernel
 * of the aborted communicator may still name them). */
static void nccl_free(loom_comm *c)
{
	nccl_ctx *x = ctx_of(c);
	int clean = 0;

	if (x) {
		if (x->comm && !c->broken && finalized(c)) {
			ncclResult_t rc = ncclCommDestroy(x->comm); /* local after finalize */
			clean = rc == ncclSuccess || rc == ncclInProgress;
		}
		else if (x->comm)
			ncclCommAbort(x->comm);
		else
			clean = !c->broken; /* init never made one */
		x->comm = NULL;
		if (clean) {
			if (x->scratch)
				cudaFree(x->scratch);
			if (x->host)
				cudaFreeHost(x->host);
			if (x->ready)
				cudaEventDestroy(x->ready);
			if (x->stream)
				cudaStreamDestroy(x->stream);
		}
		free(x);
	}
	free(c);
}

static const loom_comm_i nccl_iface = {
	.name = "nccl",
	.stream_ordered = 1,
	.allreduce_start = nccl_allreduce_start,
	.test = nccl_test,
	.wait = nccl_wait,
	.broadcast = nccl_broadcast,
	.allgather = nccl_allgather,
	.barrier = nccl_barrier,
	.abort = nccl_abort,
	.free = nccl_free,
	.allreduce_ordered = nccl_allreduce_ordered,
	.reduce_scatter_start = nccl_reduce_scatter_start,
	.allgather_start = nccl_allgather_start,
	.send_start = nccl_send_start,
	.recv_start = nccl_recv_start,
	.split = NULL,
	.restart = nccl_restart,
	.work_make = nccl_work_make,
	.work_free = nccl_work_free,
	.wait_mark = nccl_wait_mark,
	.allreduce_max_ordered = nccl_allreduce_max_ordered,
};

extern "C" loom_status loom_nccl_use_device(loom_pg *pg, int local_rank)
{
	char note[192];
	int ndev = 0, dev;
	cudaError_t e = cudaGetDeviceCount(&ndev);

	if (e != cudaSuccess || ndev == 0) {
		cudaGetLastError();
		return loom_pg_fail(pg, LOOM_ERR_UNSUPPORTED,
				    "NCCL: rank %d sees no GPU (%s), so it has no device "
				    "communicator",
				    pg->info.rank,
				    e != cudaSuccess ? cudaGetErrorString(e) : "0 devices visible");
	}
	dev = loom_comm_pick_device(local_rank, ndev, note, sizeof(note));
	if (dev < 0)
		return loom_pg_fail(pg, LOOM_ERR_INVALID, "NCCL: rank %d has LOCAL_RANK %d",
				    pg->info.rank, local_rank);
	snprintf(pg->device_note, sizeof(pg->device_note), "%s", note);
	pg->info.device = dev;
	return CUDA_OK(pg, cudaSetDevice(dev));
}

extern "C" loom_status loom_nccl_backend_new(loom_pg *pg, loom_comm **out)
{
	loom_comm *c;
	nccl_ctx *x;
	ncclUniqueId id;
	ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
	loom_status st;

	*out = NULL;
	if ((st = loom_nccl_use_device(pg, pg->info.local_rank)))
		return st;
	c = (loom_comm *)calloc(1, sizeof(*c));
	x = (nccl_ctx *)calloc(1, sizeof(*x));
	if (!c || !x) {
		free(c);
		free(x);
		return loom_pg_fail(pg, LOOM_ERR_NOMEM, "out of memory");
	}
	c->i = &nccl_iface;
	c->ctx = x;
	c->pg = pg;
	c->rank = pg->info.rank;
	c->world = pg->info.world;
	*out = c;
	memcpy(&id, pg->nccl_id, sizeof(id));
	cfg.blocking = 0;
	double t0 = loom_comm_now();
	if ((st = CUDA_OK(pg, cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking))) ||
	    (st = CUDA_OK(pg, cudaEventCreateWithFlags(&x->ready, cudaEventDisableTiming))) ||
	    (st = CUDA_OK(pg, cudaMalloc((void **)&x->scratch, sizeof(float)))) ||
	    (st = enqueued(c, ncclCommInitRankConfig(&x->comm, pg->info.world, id,
						     pg->info.rank, &cfg))) ||
	    (st = poll_until(c, NULL, t0, "communicator init")))
		return st;
	return LOOM_OK;
}
