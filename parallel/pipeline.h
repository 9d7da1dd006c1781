/*
 * parallel/pipeline.h — pipeline parallelism (model parallel) as a compile pass
 * over the plan: the graph cut into stages, this rank's stage kept, the
 * micro-batches scheduled (GPipe or 1F1B) as one fixed step list with send
 * and receive steps for the values that cross a cut. What engine/program.c
 * and engine/exec.c call.
 */
#ifndef LOOM_PARALLEL_PIPELINE_H
#define LOOM_PARALLEL_PIPELINE_H

#include "engine/pass.h"

struct loom_comm;
struct loom_comm_work;

/* What the pass decided and what the executor keeps between steps. */
typedef struct loom_pipe {
	int stages, stage;     /* S, and this rank's stage (rank % S) */
	int replicas, replica; /* data-parallel copies of each stage */
	int micro;             /* M micro-batches per batch */
	int schedule;          /* loom_schedule */
	/* Activations: one slot per micro-batch in flight on this stage
	 * (GPipe: M; 1F1B: at most S - stage), each slot_bytes (the
	 * activation region of one micro-batch). */
	int slots;
	size_t slot_bytes;
	signed char *stage_of; /* per value: the stage that makes it; -1: a leaf,
				* which every rank holds */
	signed char *owner;    /* per leaf: the stage that updates it (a parameter's
				* gradient's, a buffer's reader's) */
	/* Per stage, for the start-up table and the memory report. */
	double *est_s;         /* estimated seconds, forward + backward, one micro-batch */
	double *gflop;         /* its products' GFLOP per micro-batch */
	int *n_nodes;
	int64_t *n_param_elems;
	size_t *act_bytes;     /* planned activations of one micro-batch on the stage */
	size_t *persist_bytes; /* its persistent values (parameters, gradients, masters, I/O) */
	int *in_flight;        /* slots the schedule needs */
	size_t *peak_bytes;    /* its rank's planned peak less the backend's workspace:
				* persistent, the slots, optimizer state, accumulation sums */
	/* The cut: loom_pipeline_balance, or -1 at the user's marks. */
	int balance;
	int rebalanced;        /* memory-balanced because the time-balanced cut
				* left a stage over memory_limit_mb */
	int refused;           /* loom_pipeline_limit refused the plan */
	/* Under the memory balance: the time-balanced cut's largest stage and
	 * its planned peak less the workspace (what the cut improves on). */
	int time_stage;
	size_t time_peak;
	struct loom_pg *pg;      /* the group: its ranks' notes name their stages */
	struct loom_comm *world; /* the group's host communicator */
	struct loom_comm *dp;    /* this stage's replicas (NULL: one replica) */
	struct loom_comm *rep;   /* this replica's stages (the world with one replica) */
	int n_graph;             /* nodes when the stages were assigned (the graph
				  * every rank built; buckets come after) */
	int eval_steps;        /* steps [0, eval_steps): an EVAL run's; the rest TRAIN's */
	/* Values that change per micro-batch and live outside the activation
	 * slots: every input (the user gives M micro-batches at once) and the
	 * forward outputs this stage makes (the loss, marked values). Host
	 * copies of all M, put back before each micro-batch's forward (inputs)
	 * and backward (both). */
	int n_vals;
	loom_value *vals;
	unsigned char *is_input;
	size_t *bytes;         /* one micro-batch's */
	unsigned char **host;  /* M * bytes each */
	double *loss;          /* per micro-batch, the last stage's */
	/* How values cross a cut (loom_pipeline_assign): xfer says which
	 * memory the transport `comm` reads and writes. */
	int xfer;              /* loom_pipe_xfer */
	struct loom_comm *comm;
	/* The receives, as step indices in step order: the executor posts
	 * them in this order, each from its step's `post` on, so that two
	 * receives with one tag (a value's, in successive micro-batches)
	 * match the sends in order. */
	int *recv_at;
	int n_recv;
	/* The executor's: sends in flight, with the slot whose memory they
	 * read and their micro-batch. */
	struct loom_comm_work **sends;
	int *send_slot, *send_micro;
	void **send_copy;      /* a send of a value outside the slots, or staged, reads a copy */
	int n_sends, cap_sends;
	/* The executor's: receives in flight. recv_work[k]: the k-th
	 * receive's (recv_at), recv_host[k] its host buffer when staged.
	 * [recv_wait, recv_next): posted, not yet waited for; recv_end: the
	 * run's last + 1. n_early: receives posted before their step since
	 * compile (tests read it). */
	struct loom_comm_work **recv_work;
	void **recv_host;
	int recv_wait, recv_next, recv_end;
	int64_t n_early;
	unsigned char *act_base; /* slot 0's activation region */
} loom_pipe;

/*
 * How a stage's values reach its neighbours:
 * HOST    the backend's memory is the host's: the host communicator (MPI)
 *         sends and receives the arena's bytes;
 * DEVICE  device memory and a device communicator (NCCL): its send and
 *         receive on the device's bytes, in stream order;
 * STAGED  device memory, no device communicator (NCCL refuses two ranks on
 *         one GPU, NVIDIA/nccl#1241): a send downloads into a host copy,
 *         a receive lands in a host buffer and is uploaded at its step, over
 *         the host communicator. LOOM_PIPE_STAGE_HOST=1 in the environment
 *         at compile (a test hook) takes this path on a host backend too.
 */
typedef enum loom_pipe_xfer {
	LOOM_PIPE_XFER_HOST = 0,
	LOOM_PIPE_XFER_DEVICE,
	LOOM_PIPE_XFER_STAGED,
	LOOM_PIPE_XFER_COUNT
} loom_pipe_xfer;

/* The group's world size over the stages (the replicas of each stage),
 * or an error in err: the world must be a multiple of the stages. */
loom_status loom_pipeline_check(const loom_compile_opts *o, int world, char *err, size_t errlen);

/*
 * Before the memory plan, once the parameter slots exist: every node's
 * stage, each leaf's owner, the sub-communicators (collective). A cut that
 * sends a value against the pipeline's direction, or a parameter read by
 * two stages, is refused naming it.
 */
loom_status loom_pipeline_assign(loom_program *p, char *err, size_t errlen);

/*
 * After the backend planned its workspace: every stage's planned peak (its
 * own memory plan, its activation slots, optimizer state and accumulation
 * sums, the workspace) against memory_limit_mb. Every rank knows every
 * stage's plan, so all give the same verdict: a stage over the limit
 * refuses the compile on every rank (LOOM_ERR_NOMEM, err naming the stage,
 * its peak and the cut's). Else rank 0 prints the stage table.
 */
loom_status loom_pipeline_limit(loom_program *p, char *err, size_t errlen);

/* Whether a compile that loom_pipeline_limit refused may be tried again
 * with the memory-balanced cut: its cut balanced time (no marks). */
int loom_pipeline_may_rebalance(const loom_plan *pl);

/* The values this rank's stage gives storage (one byte per node, malloc'd,
 * for loom_memplan_build_held), or NULL without stages. */
loom_status loom_pipeline_held(const loom_plan *pl, unsigned char **held);

/* Whether this rank's stage updates parameter slot s (1 without stages):
 * the data-parallel buckets hold only those. */
int loom_pipeline_owns(const loom_plan *pl, int slot);

/*
 * After loom_steps_build on a plain plan (world = the replicas): assigns
 * every node a stage, keeps this rank's, and rewrites the step list into
 * the schedule of M micro-batches: [EVAL's forwards | TRAIN's forwards and
 * backwards with their sends, receives, accumulation; the optimizer over
 * this stage's parameters]. Grows the activation region to the slots the
 * schedule needs, and plans every stage's memory for the stage table.
 */
loom_status loom_pipeline_plan(loom_program *p, char *err, size_t errlen);

/* Collective over the group, once the arena holds the initial values: every
 * rank's stage assignment and plan compared (a difference names the stage
 * and node), then each stage's parameters and buffers from its first
 * replica to the others. */
loom_status loom_pipeline_start(loom_program *p);

/* A run of a pipeline program: TRAIN (the whole batch, one update) or
 * EVAL (forward of every micro-batch); other modes are refused. */
loom_status loom_pipeline_run(loom_program *p, loom_run_mode mode);

/* loom_set_input for a pipeline program: M micro-batches of input v. */
loom_status loom_pipeline_set_input(loom_program *p, loom_value v, const void *data, size_t count);

/* A forward output (the loss, a marked value) of every micro-batch, as
 * f64; held by the stage that makes it, broadcast from it on every rank
 * (collective: every rank calls it). count: M times the value's elements. */
loom_status loom_pipeline_read(loom_program *p, loom_value v, double *dst, size_t count);

/* The stage that holds and updates leaf v (a parameter, master, buffer
 * or input): a checkpoint record's source. */
int loom_pipeline_leaf_owner(const loom_plan *pl, loom_value v);

/* Collective over the group: `bytes` at addr on replica 0 of `stage` into
 * dst on every rank (how a checkpoint gathers what one stage holds; addr
 * is read on that rank only). */
loom_status loom_pipeline_fetch(loom_program *p, int stage, const void *addr, void *dst,
				size_t bytes);

void loom_pipeline_free(loom_pipe *pp);

#endif /* LOOM_PARALLEL_PIPELINE_H */
