/*
 * engine/plan.h — what a backend sees of a compiled program: the const plan
 * (graph, memory plan, parameter slots, the step list the executor walks),
 * the arena's regions, and the training state a step reads and advances.
 * Backends include this and engine/backend.h, never the engine's own
 * program_internal.h.
 */
#ifndef LOOM_ENGINE_PLAN_H
#define LOOM_ENGINE_PLAN_H

#include <stdarg.h>

#include "amp/fp8_scaling.h"
#include "amp/scaler.h"
#include "graph/graph_internal.h"
#include "base/errf.h" /* LOOM_ERR_MAX, loom_errnf */
#include "graph/memplan.h"
#include "loom.h"

struct loom_comm;      /* comm/comm.h: the collectives of data parallelism */
struct loom_comm_work; /* one outstanding collective */
struct loom_trace;     /* engine/trace.h: the spans loom_trace_start records */

/* One trainable parameter as the optimizer sees it. */
typedef struct loom_param_slot {
	loom_value param;   /* the value the model reads (f16 under O2) */
	loom_value grad;    /* its gradient, same dtype */
	loom_value master;  /* O2: the f32 master weight, else LOOM_NONE */
	int64_t numel;
	size_t state_off[2]; /* plain plans: optimizer state in the state region
			      * (SGD buf / Adam m, v); sharded plans: see pieces */
	loom_dtype state_dtype;
	/* A matrix: 2 or more dims and no embedding's table (a table tied to
	 * an output projection stays an embedding); what the decay of
	 * matrices only decays (not embeddings, biases, norms). */
	int matrix;
} loom_param_slot;

/*
 * The unit of an optimizer update: elements [off, off + n) of slot's
 * parameter, with its optimizer state at state_off[k] in the state region
 * (element off's). A plain plan has one piece per slot; ZeRO-1
 * (parallel/zero.c) has the pieces of this rank's shards only, and each piece
 * also writes its updated parameter into its gradient's place in the
 * bucket (pack_off, bytes into the bucket region), for the all-gather.
 * Under O2 a ZeRO piece's fp32 master is its own too (shard_master: at
 * master_off in the state region, element off's); the slot's master value
 * then has no storage (LOOM_NODE_SHARDED).
 */
typedef struct loom_optim_piece {
	int slot;
	int64_t off, n;
	size_t state_off[2];
	int pack;        /* write the updated parameter at bucket + pack_off */
	size_t pack_off;
	int shard_master; /* the master is at state + master_off, from element off */
	size_t master_off;
} loom_optim_piece;

/*
 * One run of gradients that gradient accumulation sums (LOOM_RUN_ACCUMULATE):
 * a bucket under data parallelism, else one parameter's gradient. Its sum
 * lies at arena.accum + off, count f32 (f64 for f64 gradients).
 */
typedef struct loom_accum_seg {
	loom_value v;   /* the bucket's ALLREDUCE node, or the gradient */
	int64_t count;  /* elements (a bucket's padding included) */
	loom_dtype dtype;
	size_t off;
} loom_accum_seg;

/*
 * ZeRO-3 (parallel/zero3.c): one all-gather of a bucket's parameters into
 * value v (a LOOM_OP_ALLGATHER node the memory plan placed; the bucket's
 * parameters are views into it), before their forward or their backward
 * readers. This rank's shard of the bucket (count / world elements of the
 * bucket's dtype) lies at src_off in the state region, or in the bucket
 * region (src_bucket: O2's half shards, which the optimizer packs there).
 */
typedef struct loom_gather {
	loom_value v;
	int bucket;
	int src_bucket;
	size_t src_off;
} loom_gather;

/* Streams a backend orders work on; a CPU backend has one in-order stream. */
typedef enum loom_stream {
	LOOM_STREAM_COMPUTE = 0,
	LOOM_STREAM_COMM,      /* collectives */
	LOOM_STREAM_COUNT
} loom_stream;

/* Phases of a step, for traces and run ranges. */
typedef enum loom_phase {
	LOOM_PHASE_FORWARD = 0,
	LOOM_PHASE_BACKWARD,
	LOOM_PHASE_OPTIMIZER,
	LOOM_PHASE_COUNT
} loom_phase;

/* What a step does. */
typedef enum loom_step_kind {
	LOOM_STEP_NODE = 0,   /* node v and the values it makes besides (fused siblings) */
	LOOM_STEP_ACCUM,      /* accumulation segment `index`: adds (ACCUMULATE runs)
			       * or folds (FOLD runs); nothing in other runs */
	LOOM_STEP_COLLECTIVE, /* `coll` on bucket `index`; skipped by ACCUMULATE runs. An index
			       * from buckets.n on: ZeRO-3's gather index - buckets.n (an
			       * all-gather from this rank's shard, never skipped) */
	LOOM_STEP_WAIT,       /* the collectives started so far end (index >= 0: that one
			       * only); later compute sees them */
	LOOM_STEP_OPTIM,      /* the fused check + unscale + update over pieces [first, last) */
	LOOM_STEP_COPY,       /* ZeRO: bucket `index`'s gathered parameters into the parameters */
	LOOM_STEP_SEND,       /* pipeline: value v of micro-batch `micro` to rank `peer` */
	LOOM_STEP_RECV,       /* pipeline: value v of micro-batch `micro` from rank `peer` */
	LOOM_STEP_MICRO,      /* pipeline: micro-batch `micro`'s forward (phase) or backward
			       * starts: its activation slot, its inputs (parallel/pipeline_transport.c) */
	LOOM_STEP_KIND_COUNT
} loom_step_kind;

typedef enum loom_coll_op {
	LOOM_COLL_ALLREDUCE = 0,
	LOOM_COLL_REDUCE_SCATTER, /* this rank's shard of the bucket holds the sum */
	LOOM_COLL_ALLGATHER,      /* every rank's shard to every rank */
	LOOM_COLL_BROADCAST,
	LOOM_COLL_COUNT
} loom_coll_op;

typedef struct loom_step {
	loom_step_kind kind;
	loom_stream stream;
	loom_phase phase;
	loom_value v;      /* NODE: the node; COLLECTIVE, ACCUM: the bucket's node or
			    * the gradient; else LOOM_NONE */
	loom_coll_op coll; /* COLLECTIVE */
	int index;         /* COLLECTIVE, COPY: the bucket; ACCUM: the segment */
	int first, last;   /* OPTIM: pieces */
	int noop;          /* NODE: a leaf or view, nothing to compute */
	/* Pipeline stages (parallel/pipeline_schedule.c): SEND, RECV, MICRO: the
	 * micro-batch; SEND, RECV: the peer's rank in the group. ACCUM:
	 * LOOM_ACCUM_BY_RUN (the run's flags decide), _ADD or _FOLD. */
	int micro, peer;
	int accum;
	/* RECV: the step from which its receive may be posted (parallel/pipeline_schedule.c
	 * decides: its activation slot free of the micro-batch before and no
	 * value of its own micro-batch's plan that died before it shares its
	 * bytes); its own index where it must be posted at its step. */
	int post;
} loom_step;

enum { LOOM_ACCUM_BY_RUN = 0, LOOM_ACCUM_ADD, LOOM_ACCUM_FOLD };

/* "node", "accum", ...: dumps and traces. */
const char *loom_step_kind_name(loom_step_kind k);
const char *loom_coll_name(loom_coll_op op);

/*
 * The compiled plan: everything decided at compile time. Backends read it
 * (const) and never write it; it does not change once loom_compile returns.
 */
typedef struct loom_plan {
	loom_graph *g; /* owned: the user's graph + AMP casts + backward */
	loom_value loss;
	int n_fwd;            /* nodes [0, n_fwd) are the forward pass */
	int n_reorders;       /* reorder nodes the format pass inserted (graph/formats.c) */
	int n_recomputed;     /* values made again in the backward (graph/recompute.c) */
	/* The vocab-pad pass (engine/vocab_pad.c): the classifier's vocabulary
	 * and the padded row count its values were laid out with; 0 when the
	 * plan pads nothing. */
	int64_t vocab, vocab_padded;
	uint64_t fingerprint; /* of the user's graph and the options */
	loom_compile_opts opts;
	loom_memplan mp;
	loom_param_slot *params;
	int n_params;
	int n_state;          /* optimizer state buffers per parameter (0, 1, 2) */
	int scaling;          /* dynamic or static loss scaling is on */
	/* The state region holds the optimizer state (state_bytes), then,
	 * ZeRO under O2, this rank's shards of the fp32 masters
	 * (master_shard_bytes; loom_plan_state_region_bytes). master_bytes:
	 * the masters this rank holds, whole (persistent region) or shards. */
	size_t ws_bytes, state_bytes, master_bytes, master_shard_bytes;
	/* The optimizer's pieces (one per slot, or a shard's). */
	loom_optim_piece *pieces;
	int n_pieces;
	/* The steps, in order: a FORWARD run walks [0, n_fwd_steps), a GRAD
	 * run [0, n_grad_steps), a TRAIN run all of them. */
	loom_step *steps;
	int n_steps, n_fwd_steps, n_grad_steps;
	/* Data parallelism (world > 1): the gradient buckets and the
	 * collectives for the backend's memory. The optimizer divides the
	 * summed gradients by world. zero: the ZeRO stage (0 or 1). */
	int world, rank, zero;
	loom_buckets buckets;
	/* ZeRO-3: the gathers of parameter buckets (parallel/zero3.c), and
	 * the forward's length in the schedule (its gathers inserted; 0:
	 * n_fwd). param_shard_bytes: this rank's shards of the parameters
	 * (in the state region under O0/O1, beside the optimizer state). */
	loom_gather *gathers;
	int n_gathers, n_fwd_sched;
	size_t param_shard_bytes;
	size_t gathered_peak; /* the most gathered bytes alive at once (in the activations) */
	struct loom_comm *comm;
	/* Gradient accumulation: bucket k is accum[k] when there are buckets.
	 * accum_bytes of sums, allocated at the first ACCUMULATE run. */
	loom_accum_seg *accum;
	int n_accum;
	size_t accum_bytes;
	/* Pipeline stages (parallel/pipeline.h), else NULL. */
	struct loom_pipe *pipe;
} loom_plan;

/* The training state: what a step changes besides the arena. */
typedef struct loom_train_state {
	double lr;
	int64_t step;
	loom_scaler scaler;
	/* amp.fp8: each scaled tensor's scale, amaxes and saturation counts
	 * (FP8_QDQ node v's is fp8.t[a.fp8.slot]); kernels record a training
	 * run's amaxes into it, the OPTIM step ends the step (engine/exec.c). */
	loom_fp8_state fp8;
	double last_loss;
	int diagnose;               /* next runs check each node for inf/NaN */
	loom_value first_nonfinite; /* the first node found non-finite */
	char amp_report[256];       /* what diagnosis found, for the user */
	/* ACCUMULATE runs since the last update: their gradients wait in the
	 * accumulation sums, and the update divides by micro + 1. */
	int micro;
	struct loom_trace *trace;   /* recording spans (loom_trace_start), else NULL */
	int buffers_own;            /* data parallel: trained since rank 0's
				     * buffers were last broadcast */
	double grad_norm;           /* the last update's global norm (unscaled, averaged);
				     * ZeRO: the executor's, summed over the shards,
				     * before the optimizer step that clips by it */
} loom_train_state;

/* An optimizer step's finite (the backend's optim): the verdict is the
 * flag a shard's device check left (the backend's sharded
 * grads_finite_device), summed over the ranks on the device; non-zero, an
 * overflow. A strategy's verdict (engine/pass.h's loom_shards) gives it. */
#define LOOM_FINITE_ON_DEVICE (-2)

/* Base addresses of the arena's regions (backend memory). */
typedef struct loom_arena {
	unsigned char *persist, *act, *ws, *state;
	unsigned char *bucket; /* the gradient buckets (data parallelism; else unused) */
	unsigned char *accum;  /* gradient accumulation's sums; NULL until the first ACCUMULATE */
} loom_arena;

/* Flags of one run. */
enum {
	LOOM_EXEC_TRAIN = 1 << 0,    /* training mode (batch-norm statistics) */
	/* Check every value for inf/NaN as it is made and record the first in
	 * ts->first_nonfinite before returning. May synchronise: it is the
	 * separate mode a collapsed loss scale turns on, never the step path. */
	LOOM_EXEC_DIAGNOSE = 1 << 1,
	/* Gradient accumulation: ACCUM steps add (ACCUMULATE, which also
	 * skips the collectives) or fold and clear (FOLD) their sums. */
	LOOM_EXEC_ACCUMULATE = 1 << 2,
	LOOM_EXEC_FOLD = 1 << 3,
	/* run_begin only: the run replays the captured step (no step is
	 * walked); a backend that stages inputs for the graph's own copies
	 * leaves them to it. */
	LOOM_EXEC_REPLAY = 1 << 4,
};

/* Optimizer state buffers per parameter: SGD's momentum buffer, AdamW's m
 * and v. */
static inline int loom_optim_state_count(const loom_optim_opts *o)
{
	if (o->kind == LOOM_OPTIM_ADAMW)
		return 2;
	return o->kind == LOOM_OPTIM_SGD && o->momentum > 0 ? 1 : 0;
}

/* What the optimizer multiplies the summed gradients by: the loss scale
 * undone, averaged over the ranks (data parallel: the buckets hold the
 * sum) and the micro-steps of gradient accumulation. */
static inline double loom_grad_unscale(const loom_plan *pl, const loom_train_state *ts)
{
	return 1.0 / (ts->scaler.scale * pl->world * (ts->micro + 1));
}

/* What a backend allocates for the state region. */
static inline size_t loom_plan_state_region_bytes(const loom_plan *pl)
{
	return pl->state_bytes + pl->master_shard_bytes;
}

/* Whether v has storage on this rank (a pipeline stage holds only the
 * values its nodes make or read, and the leaves it owns). */
static inline int loom_plan_holds(const loom_plan *pl, loom_value v)
{
	return !pl->mp.held || pl->mp.held[v];
}

static inline void *loom_arena_ptr(const loom_arena *a, const loom_plan *pl, loom_value v)
{
	unsigned char *base = pl->mp.region[v] == LOOM_REGION_PERSIST ? a->persist :
			      pl->mp.region[v] == LOOM_REGION_BUCKET ? a->bucket : a->act;
	return base + pl->mp.offset[v];
}

/* 'P' persistent, 'B' a gradient bucket, 'A' activations: for dumps. */
static inline char loom_region_letter(int region)
{
	return region == LOOM_REGION_PERSIST ? 'P' : region == LOOM_REGION_BUCKET ? 'B' : 'A';
}

static inline size_t loom_plan_value_bytes(const loom_plan *pl, loom_value v)
{
	const loom_node *n = &pl->g->nodes[v];
	return (size_t)loom_shape_numel(&n->shape) * loom_dtype_size(n->dtype);
}

/* Node v's first sibling, then the one after w (LOOM_NONE: no more). */
static inline loom_value loom_sibling_first(const loom_plan *pl, loom_value v)
{
	return pl->mp.sibling ? pl->mp.sibling[v] : LOOM_NONE;
}

static inline loom_value loom_sibling_next(const loom_plan *pl, loom_value w)
{
	return pl->mp.sibling_next[w];
}

/* Made at an earlier node (so skipped at its own place)? */
static inline int loom_made_earlier(const loom_plan *pl, loom_value v)
{
	loom_value u = pl->g->nodes[v].made_by;
	return u != LOOM_NONE && u < v;
}

/* The first step of this rank's plan that runs node v, -1 if none. */
static inline int loom_step_of(const loom_plan *pl, loom_value v)
{
	for (int i = 0; i < pl->n_steps; i++)
		if (pl->steps[i].kind == LOOM_STEP_NODE && pl->steps[i].v == v)
			return i;
	return -1;
}

/* The one wording of a label outside [0, classes) at softmax-CE node v,
 * for both backends. */
loom_status loom_bad_label(char *err, const loom_plan *pl, loom_value v, int32_t label, int row);
/* The one wording of an id outside the table's real rows [0, vocab) at
 * position pos of embedding node v's ids, for both backends. */
loom_status loom_bad_id(char *err, const loom_plan *pl, loom_value v, int32_t id, int64_t pos);

#endif /* LOOM_ENGINE_PLAN_H */
