/*
 * comm/comm.h — data-parallel communication: the process group (who am I,
 * how many are we, which device is mine), the collective interface the plan
 * calls (a struct of function pointers, MPI for host memory, NCCL for device
 * memory), the start-up fingerprint check and the parameter broadcast.
 *
 * Contract shared by every call here: a failure returns a loom_status and
 * leaves a message naming the rank or variable at fault in loom_pg_error();
 * nothing here exits, aborts or waits longer than the group's timeout.
 */
#ifndef LOOM_COMM_H
#define LOOM_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Seconds a collective may take before it is an error (LOOM_COMM_TIMEOUT_S
 * in the environment overrides it, as does loom_comm_options.timeout_s). */
#define LOOM_COMM_DEFAULT_TIMEOUT_S 300.0

/* ------------------------------------------------------------ process group */

typedef enum loom_comm_bootstrap {
	LOOM_COMM_BOOT_AUTO = 0, /* mpirun's variables, else torchrun's, else single */
	LOOM_COMM_BOOT_SINGLE,   /* one process, world 1, no MPI */
	LOOM_COMM_BOOT_MPI,      /* started by Open MPI's mpirun: MPI_COMM_WORLD */
	LOOM_COMM_BOOT_ENV,      /* torchrun's env://: rendezvous on MASTER_ADDR:PORT, or
				    through torchrun's agent store there */
	LOOM_COMM_BOOT_SLURM,    /* srun's SLURM_PROCID/NTASKS/LOCALID: the same rendezvous
				    on the step's first node (or MASTER_ADDR) */
	LOOM_COMM_BOOT_COUNT
} loom_comm_bootstrap;

typedef struct loom_comm_options {
	loom_comm_bootstrap bootstrap;
	double timeout_s;      /* per collective; 0: LOOM_COMM_TIMEOUT_S or the default */
	double join_timeout_s; /* rendezvous: every rank must arrive; 0: timeout_s */
	int want_device;       /* also open the NCCL communicator on GPU local_rank */
} loom_comm_options;

typedef struct loom_pg loom_pg;

/* What a rank knows about the group once it is up. */
typedef struct loom_pg_info {
	int rank, world;             /* global */
	int local_rank, local_world; /* on this host */
	int device;                  /* the GPU this rank owns (local_rank), -1: none */
	loom_comm_bootstrap how;     /* how the group was formed (never AUTO) */
} loom_pg_info;

/*
 * Forms the group from the environment, as opts->bootstrap says (NULL opts:
 * AUTO, default timeouts). Collective: every rank must call it. *out is set
 * even on failure (NULL only when out of memory) so that loom_pg_error()
 * explains it; free it with loom_pg_free().
 */
loom_status loom_pg_init(const loom_comm_options *opts, loom_pg **out);
void loom_pg_free(loom_pg *pg);
const loom_pg_info *loom_pg_get_info(const loom_pg *pg);
/* The last error ("" while none); a NULL group answers a constant text. */
const char *loom_pg_error(const loom_pg *pg);
double loom_pg_timeout(const loom_pg *pg);
const char *loom_comm_bootstrap_name(loom_comm_bootstrap b); /* "mpirun", ... */
/* Under torchrun (TORCHELASTIC_ERROR_FILE set; otherwise nothing): from now
 * on stderr is kept as well as written, and an exit with a non-zero status
 * leaves the last line written there as the message of torchrun's error
 * file, so that its failure report names loom's cause. Idempotent;
 * loom_launch_maybe and loom_pg_init call it. */
void loom_comm_error_file_arm(void);
/* Under torchrun's agent (TORCHELASTIC_RUN_ID, TORCHELASTIC_MAX_RESTARTS or
 * TORCHELASTIC_USE_AGENT_STORE set; not a worker of loom's own launcher,
 * which arms its own): the process dies with the agent that started it,
 * however the agent ends (SIGKILL, the OOM killer), rather than train on
 * alone (a parent-death signal, SIGKILL). An agent already gone by then
 * ends the process (exit 1, said on stderr). Idempotent;
 * loom_launch_maybe and loom_pg_init call it. */
void loom_comm_agent_arm(void);
void loom_pg_set_timeout(loom_pg *pg, double seconds);
/* The training step this rank is at: each collective it enters is recorded
 * as "step S's all-reduce of ..." so that, when a collective times out, the
 * others can say which rank has not reached which step's collective. */
void loom_pg_set_step(loom_pg *pg, int64_t step);
/* A few words on the part rank plays (at most LOOM_PG_NOTE_BYTES - 1), which
 * the messages that name it add: "rank 1 (pipeline stage 1) died ...". NULL
 * or "" clears it; the last note set stands (parallel/pipeline_transport.c sets one per
 * rank at compile and clears them when the program is freed). */
#define LOOM_PG_NOTE_BYTES 48
void loom_pg_set_rank_note(loom_pg *pg, int rank, const char *note);

/* ------------------------------------------------------------- collectives */

typedef enum loom_comm_memory {
	LOOM_COMM_HOST = 0, /* MPI (or the world-1 stand-in) */
	LOOM_COMM_DEVICE,   /* NCCL, on the group's GPU */
	LOOM_COMM_MEMORY_COUNT
} loom_comm_memory;

typedef struct loom_comm loom_comm;
typedef struct loom_comm_work loom_comm_work; /* one outstanding collective */

/*
 * A collective backend. Every member that can fail returns a loom_status and
 * writes its message with loom_comm_fail(); each respects the group's
 * timeout. Buffers are in the memory the backend serves. Sums are in place;
 * f16 and bf16 are summed element-wise in fp32 and rounded back (as NCCL
 * does), f32 exactly as the library does. Collectives are called by every
 * rank in the same order.
 */
typedef struct loom_comm_i {
	const char *name;
	/* 1: a bucket start's result is in the order of the stream given it
	 * (its later work sees the result; a device backend), so the host
	 * may hand the work to the watchdog instead of waiting for it. */
	int stream_ordered;
	/* Why a step whose collectives go through this communicator cannot
	 * be captured as one graph, where it has its own reason (a device
	 * bucket staged through host memory).   // (optional) */
	const char *no_graph;
	/* Starts a sum of buf over all ranks; *out waits for it. stream: the CUDA
	 * stream that produced buf (NULL: the default stream; MPI ignores it). */
	loom_status (*allreduce_start)(loom_comm *c, void *buf, size_t count, loom_dtype dt,
				       void *stream, loom_comm_work **out);
	/* Drives an outstanding all-reduce without blocking; *done = 1 when it
	 * has completed (the work then still needs wait()).   // (optional) */
	loom_status (*test)(loom_comm *c, loom_comm_work *w, int *done);
	/* Blocks until w completes or the timeout passes; frees w either way. */
	loom_status (*wait)(loom_comm *c, loom_comm_work *w);
	/* Copies root's bytes to every rank. */
	loom_status (*broadcast)(loom_comm *c, void *buf, size_t bytes, int root);
	/* Small metadata in HOST memory for every backend: rank r's bytes land at
	 * recv + r * bytes. */
	loom_status (*allgather)(loom_comm *c, const void *send, size_t bytes, void *recv);
	loom_status (*barrier)(loom_comm *c);
	/* Gives up on everything outstanding without blocking; the backend is
	 * unusable afterwards but may still be freed. */
	void (*abort)(loom_comm *c);
	void (*free)(loom_comm *c);
	/* Sums buf over all ranks in the order of stream: the stream's later
	 * work sees the sum, the host does not wait (nothing to wait() for), so
	 * a CUDA graph can capture it. A dead peer shows at the next wait() of
	 * an all-reduce_start, whose timeout aborts the communicator. Device
	 * backends only (synchronised batch norm on CUDA).   // (optional) */
	loom_status (*allreduce_ordered)(loom_comm *c, void *buf, size_t count, loom_dtype dt,
					 void *stream);
	/* ZeRO's pair, in place on buf (world * count elements; rank r's shard
	 * is elements [r * count, (r + 1) * count)); *out waits, as for
	 * allreduce_start. reduce_scatter: rank r's shard ends as the sum of
	 * every rank's shard r (the rest of buf is scratch). allgather: every
	 * rank's shard ends in every rank's buf. stream as allreduce_start. */
	loom_status (*reduce_scatter_start)(loom_comm *c, void *buf, size_t count, loom_dtype dt,
					    void *stream, loom_comm_work **out);
	loom_status (*allgather_start)(loom_comm *c, void *buf, size_t count, loom_dtype dt,
				       void *stream, loom_comm_work **out);
	/* Pipeline stages' point-to-point pair: bytes to / from rank peer of
	 * this communicator, matched by tag and in the order they were
	 * started (between one pair of ranks, in one direction); *out waits
	 * (test and wait as for allreduce_start, with the group's timeout).
	 * stream: as allreduce_start (the send waits for it; the receive's
	 * data is ready for it after wait).   // (optional) */
	loom_status (*send_start)(loom_comm *c, const void *buf, size_t bytes, int peer, int tag,
				  void *stream, loom_comm_work **out);
	loom_status (*recv_start)(loom_comm *c, void *buf, size_t bytes, int peer, int tag,
				  void *stream, loom_comm_work **out);
	/* A new communicator of the ranks that gave the same color, ranked by
	 * key (MPI_Comm_split); collective over c. The caller frees it with
	 * loom_comm_free.   // (optional) */
	loom_status (*split)(loom_comm *c, int color, int key, loom_comm **out);
	/* The group's timeout for w counts from now, not from its start: a
	 * receive posted ahead of the step that waits for it (parallel/pipeline_transport.c)
	 * has the whole timeout from that step, however long the compute in
	 * between took.   // (optional) */
	void (*restart)(loom_comm *c, loom_comm_work *w);
	/* A work made once, that every start given it in *out reuses (with
	 * its event): no allocation per step. wait() and the watchdog end it
	 * without freeing it; work_free does.   // (optional) */
	loom_status (*work_make)(loom_comm *c, loom_comm_work **out);
	void (*work_free)(loom_comm *c, loom_comm_work *w);
	/* A made work's collective as a replayed graph ran it: no start, no
	 * event of its own, but a progress mark, a word of host-visible
	 * memory the device writes after the collective with the launch's
	 * serial (engine/backend.h's mark_record). Blocks until *mark >=
	 * serial or the group's timeout, counted from t0 (the launch), has
	 * passed; on a timeout the same message naming the rank and the
	 * collective (w's, as its capture started it) and the same abort as
	 * wait(). Never frees w.   // (optional) */
	loom_status (*wait_mark)(loom_comm *c, loom_comm_work *w, const volatile uint64_t *mark,
				 uint64_t serial, double t0);
	/* allreduce_ordered with the max for the sum (fp8's amaxes on the
	 * device, engine/exec.c).   // (optional) */
	loom_status (*allreduce_max_ordered)(loom_comm *c, void *buf, size_t count, loom_dtype dt,
					     void *stream);
} loom_comm_i;

/* What every backend shares; the backend keeps its own state in ctx. */
struct loom_comm {
	const loom_comm_i *i;
	void *ctx;
	loom_pg *pg;
	int broken; /* a timeout or failure happened: every later call refuses */
	/* This rank's place in the communicator: the group's for the group's
	 * own, the split's for a sub-communicator (loom_comm_split). */
	int rank, world;
	int owned; /* made by loom_comm_split: loom_comm_free frees it */
	struct loom_comm_watch *watch; /* the watchdog (comm/watchdog.c), once started */
};

/* The backend of the group for this memory (owned by the group; NULL and an
 * error when there is none, e.g. DEVICE without a GPU or without want_device). */
loom_comm *loom_pg_comm(loom_pg *pg, loom_comm_memory mem);
/* The same, for a caller that only asks whether there is one (a plan
 * choosing its path): NULL without recording an error in the group. */
loom_comm *loom_pg_comm_if(loom_pg *pg, loom_comm_memory mem);

/* Contract wrappers: check the arguments and the broken flag, then dispatch. */
loom_status loom_comm_allreduce(loom_comm *c, void *buf, size_t count, loom_dtype dt);
loom_status loom_comm_allreduce_start(loom_comm *c, void *buf, size_t count, loom_dtype dt,
				      void *stream, loom_comm_work **out);
/* LOOM_ERR_UNSUPPORTED where the backend has no allreduce_ordered (MPI);
 * _max_ordered: the max over the ranks, where allreduce_max_ordered is. */
loom_status loom_comm_allreduce_ordered(loom_comm *c, void *buf, size_t count, loom_dtype dt,
					void *stream);
loom_status loom_comm_allreduce_max_ordered(loom_comm *c, void *buf, size_t count, loom_dtype dt,
					    void *stream);
/* ZeRO's reduce-scatter and all-gather (loom_comm_i), in place. */
loom_status loom_comm_reduce_scatter_start(loom_comm *c, void *buf, size_t count, loom_dtype dt,
					   void *stream, loom_comm_work **out);
loom_status loom_comm_allgather_start(loom_comm *c, void *buf, size_t count, loom_dtype dt,
				      void *stream, loom_comm_work **out);
loom_status loom_comm_test(loom_comm *c, loom_comm_work *w, int *done);
loom_status loom_comm_wait(loom_comm *c, loom_comm_work *w);
loom_status loom_comm_broadcast(loom_comm *c, void *buf, size_t bytes, int root);
loom_status loom_comm_allgather(loom_comm *c, const void *send, size_t bytes, void *recv);
loom_status loom_comm_barrier(loom_comm *c);
void loom_comm_abort(loom_comm *c);

/* Pipeline stages: non-blocking send / receive of bytes with rank peer of
 * c (loom_comm_i.send_start); LOOM_ERR_UNSUPPORTED where the backend has
 * none. Finish them with loom_comm_test / loom_comm_wait. */
loom_status loom_comm_send_start(loom_comm *c, const void *buf, size_t bytes, int peer, int tag,
				 void *stream, loom_comm_work **out);
loom_status loom_comm_recv_start(loom_comm *c, void *buf, size_t bytes, int peer, int tag,
				 void *stream, loom_comm_work **out);
/* w's timeout counts from now (loom_comm_i.restart); nothing where the
 * backend has no restart. */
void loom_comm_restart(loom_comm *c, loom_comm_work *w);
/* A sub-communicator of the ranks of c with the same color (data
 * parallelism among one pipeline stage's replicas); collective over c. */
loom_status loom_comm_split(loom_comm *c, int color, int key, loom_comm **out);
/* Frees a communicator loom_comm_split made (the group's own are the
 * group's: ignored). */
void loom_comm_free(loom_comm *c);

/* ------------------------------------------- device-side waits, the watchdog */

/*
 * On a device backend (NCCL) a collective started on `stream` is in that
 * stream's order: the stream's later work sees its result, with no host
 * wait. The host still owes it a wait (its timeout, its asynchronous
 * error, its abort): loom_comm_watch hands w to the communicator's
 * watchdog thread, which waits for it in the backend's own wait() (the
 * same timeout, the same message naming the rank and the collective, the
 * same abort of the communicator) while the step goes on.
 *
 * loom_comm_work_make: a work made once that the three bucket starts
 * reuse when given it in *out (the starts otherwise want *out NULL);
 * *out is NULL where the backend keeps none (MPI, world 1), and the
 * starts then make their own as before. loom_comm_work_free frees it
 * (after the watchdog is done with it: loom_comm_watch_drain).
 */
loom_status loom_comm_work_make(loom_comm *c, loom_comm_work **out);
void loom_comm_work_free(loom_comm *c, loom_comm_work *w);
/* Whether c's bucket starts order their result on the stream given them
 * (a device backend), so that loom_comm_watch may stand for wait(). */
int loom_comm_stream_ordered(const loom_comm *c);
/* Hands w to the watchdog (started at the first call); never blocks on w.
 * A made work (loom_comm_work_make) handed again before the watchdog got
 * to it is watched once. The watchdog's first failure is kept: this and
 * every later call here return it, its message in loom_pg_error. */
loom_status loom_comm_watch(loom_comm *c, loom_comm_work *w);
/* A replayed graph's collective (a made work whose capture started it):
 * hands the watchdog "wait until *mark reaches serial" (the backend's
 * wait_mark: its timeout counted from now, its message, its abort). The
 * same work handed again before the watchdog took it is watched once, for
 * the later serial from the later hand-off (as a start's work restarts
 * its clock). Without a watchdog thread the host waits here.
 * LOOM_ERR_UNSUPPORTED where c has no wait_mark. */
loom_status loom_comm_watch_mark(loom_comm *c, loom_comm_work *w, const volatile uint64_t *mark,
				 uint64_t serial);
/* Whether c can wait for a replayed collective's mark (wait_mark). */
int loom_comm_has_marks(const loom_comm *c);
/* The watchdog's verdict so far, without waiting: LOOM_OK, or its first
 * failure (the message put back into loom_pg_error). */
loom_status loom_comm_watch_status(loom_comm *c);
/* Waits until the watchdog has ended every work handed to it (each within
 * the group's timeout), then its verdict. Outside a step only. */
loom_status loom_comm_watch_drain(loom_comm *c);
/* How many works the watchdog has been handed and has ended (tests). */
void loom_comm_watch_counts(const loom_comm *c, uint64_t *handed, uint64_t *ended);

/* Broadcasts n buffers from root (initial parameters and buffers). */
loom_status loom_comm_broadcast_many(loom_comm *c, void *const *bufs, const size_t *bytes,
				     size_t n, int root);

/* ---------------------------------------------------- start-up fingerprint */

/*
 * What a rank compiled, for the start-up check: a header blob (options, opt
 * level, bucket layout, ...) and one 64-bit hash per item (per node), with a
 * describing text per item for the message ("node 14 conv2d has shape
 * [100,32,14,14]"). When the text has the form "<what> has <value>", the
 * message quotes only the other rank's value.
 */
typedef struct loom_fingerprint {
	const char *item_noun; /* "node"; NULL: "item" */
	const void *head;
	size_t head_len;
	const uint64_t *items;
	size_t n_items;
	void (*describe)(void *user, size_t i, char *buf, size_t len); /* (optional) */
	void *user;
} loom_fingerprint;

/*
 * Collective, on a host backend: compares every rank's fingerprint with rank
 * 0's. LOOM_ERR_MISMATCH on every rank if any differs, naming the first rank
 * and item that differ ("rank 1: node 14 conv2d has shape [100,32,14,14],
 * rank 0 has [50,32,14,14]"); LOOM_ERR_FORMAT if a rank sent a malformed one.
 */
loom_status loom_comm_check_fingerprint(loom_comm *c, const loom_fingerprint *fp);

/* ------------------------------------------- settings every rank must share */

#define LOOM_COMM_SETTING_LEN 48

/* One setting, named as the user gave it ("--opt-level") with its value as
 * text ("O2"; numbers printed so that equal text means equal values). */
typedef struct loom_comm_setting {
	const char *name;
	char value[LOOM_COMM_SETTING_LEN];
} loom_comm_setting;

/*
 * Collective, on a host backend: compares every rank's n settings with rank
 * 0's. LOOM_ERR_MISMATCH on every rank if any differs, naming the first rank
 * and setting that differ and both values: "rank 1 has --opt-level O2,
 * rank 0 has O0". A rank with another number of settings (another build)
 * is named too.
 */
loom_status loom_comm_check_settings(loom_comm *c, const loom_comm_setting *s, size_t n);

/* FNV-1a, the hash the plan's fingerprint uses for its items. */
uint64_t loom_comm_hash(const void *data, size_t len, uint64_t seed);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_COMM_H */
