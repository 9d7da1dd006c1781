/*
 * engine/pass.h — a compile pass: one stage of loom_compile's pipeline.
 *
 * loom_compile makes a program (the cloned graph, the options, the world
 * size) and walks loom_compile_passes (parallel/pass_list.c) in order: each
 * pass that is wanted sees the plan and the options and adds to it or
 * rewrites it (casts, gradients, fusions, slots, buckets, the memory plan,
 * steps, shards, stages, the backend's plans). Once every pass has run and
 * the arena holds the initial values, the passes that ran and have a start
 * member run it in the same order: the collective start-up a strategy needs
 * before step 1 (the plan check, the broadcast of rank 0's values, the
 * pipeline's peers). A strategy is a pass (parallel/passes.c), not a
 * branch in loom_compile.
 *
 * This header is what a pass sees of the engine: the program (the plan,
 * the training state, the arena, the hooks a strategy installs), the pass
 * table, and the functions the engine offers a pass. The backend is
 * opaque here: a strategy never touches it, it asks the engine
 * (loom_pass_backend_name and below, engine/pass_api.c). The backend's
 * table (engine/backend.h), the executor's state and the engine's other
 * helpers stay in engine/program_internal.h, which builds on this one:
 * neither parallel/ nor io/ reaches either header, directly or through
 * a chain (tests/base:test_include_arrows).
 */
#ifndef LOOM_ENGINE_PASS_H
#define LOOM_ENGINE_PASS_H

#include <stddef.h>
#include <stdint.h>

#include "engine/io_view.h" /* loom_program_fail, values by handle, loom_stage_info */
#include "engine/plan.h"
#include "loom.h"

typedef struct loom_program loom_program;
struct loom_backend; /* engine/backend.h: the engine's, never a pass's */

/*
 * A strategy that moves values between ranks as steps of its own (SEND,
 * RECV, MICRO: a pipeline's stages, parallel/pipeline_transport.c). The
 * executor hands those steps over and gives the transport a turn around
 * them; it names no strategy. NULL in a program without such steps.
 */
typedef struct loom_transport {
	/* A run of steps [first, last) begins. */
	void (*run_begin)(loom_program *p, int first, int last);
	/* Before step i: what may start early (receives posted ahead). */
	loom_status (*before_step)(loom_program *p, int i);
	/* A SEND, RECV or MICRO step, the i-th of the plan. */
	loom_status (*step)(loom_program *p, const loom_step *s, int i);
	/* A turn between nodes, where the host moves transfers along. */
	loom_status (*progress)(loom_program *p);
	/* Waits for everything in flight (loom_exec_synchronize). */
	loom_status (*finish)(loom_program *p);
	/* After a failure: waits for what is posted and drops its data. */
	void (*drop)(loom_program *p);
	/* Why a step that moves values this way cannot run as one captured
	 * graph (said once at the first run). */
	const char *no_graph;
	/* What io/ reads of the stages (engine/io_view.h: loom_io_stages,
	 * loom_io_leaf_owner, loom_io_stage_fetch); NULL: none. */
	void (*stages)(const loom_program *p, loom_stage_info *out);
	int (*leaf_owner)(const loom_program *p, loom_value v);
	loom_status (*fetch)(loom_program *p, int stage, const void *addr, void *dst, size_t bytes);
} loom_transport;

/*
 * A strategy whose ranks each hold part of the gradients (ZeRO's shards,
 * a pipeline's stages): what the optimizer step needs from all of them,
 * set by its pass (parallel/passes.c). The executor calls it and names no
 * strategy.
 */
typedef struct loom_shards {
	/* Before the optimizer, under loss scaling: the overflow verdict over
	 * every rank's gradients (*finite 1 or 0, or LOOM_FINITE_ON_DEVICE). */
	loom_status (*verdict)(loom_program *p, const loom_step *s, int *finite);
	/* With clipping: the global gradient norm into p->ts.grad_norm; NULL:
	 * the backend's own norm is global already. */
	loom_status (*norm)(loom_program *p, const loom_step *s);
	/* Why the step cannot run as one captured graph (const loom_program *),
	 * or NULL. */
	const char *(*no_graph)(const loom_program *p);

	/* Values whose storage is this rank's shards (ZeRO's O2 masters,
	 * ZeRO-3's parameters); the engine reads and writes them through
	 * these (loom_value_shard and below). NULL: no value is sharded.
	 * shard_of: v's slot, and in *k the buffer of gather and scatter
	 * that holds it (-1: the f32 master shards; -2: ZeRO-3's half
	 * parameter shards); -1 if v is whole in the arena. */
	int (*shard_of)(const loom_program *p, loom_value v, int *k);
	/* The slot whose parameter or master is v, if that slot's O2 master
	 * is sharded; else -1 (v's master, if any, is whole). */
	int (*master_slot)(const loom_program *p, loom_value v);
	/* Slot s's state buffer k (k >= 0: optimizer state; k < 0 as
	 * shard_of says), whole (numel elements of the buffer's dtype):
	 * gathered from every rank's shards (collective), or this rank's
	 * pieces of it from the whole src. */
	loom_status (*gather)(loom_program *p, int s, int k, void *dst);
	loom_status (*scatter)(loom_program *p, int s, int k, const void *src);
	/* loom_program_info's gradient and parameter bytes as this rank holds
	 * them (NULL: the engine's count of whole values stands). */
	void (*info)(const loom_program *p, loom_program_info *info);
} loom_shards;

/*
 * A program: what its passes build and install (the plan, the training
 * state, the backend and its arena, the strategy's hooks) and the engine's
 * bookkeeping. The executor's state is the engine's own
 * (engine/program_internal.h): a pass reaches it through the loom_exec_*
 * functions below, never by its fields.
 */
struct loom_exec;

struct loom_program {
	loom_plan plan;
	loom_train_state ts;
	const struct loom_backend *be; /* the engine's: a pass asks loom_pass_* */
	void *be_ctx;
	loom_arena arena; /* the regions be_ctx allocated: the one copy of their
			   * addresses (the backend reads this one) */
	const loom_transport *transport; /* or NULL */
	const loom_shards *shards;       /* or NULL */
	/* Bytes a strategy allocates beyond the arena, in the planned peak (a
	 * pipeline's accumulation sums of several micro-batches). */
	size_t peak_extra;
	loom_error err; /* the last failure (base/errf.h) */

	/* The engine's own; passes leave it alone. */
	struct loom_exec *exec; /* the executor's state, allocated with the program */
	int ready;        /* compiled; a failed compile's handle only explains */
	/* Bit i: pass i of loom_compile_passes ran in this compile. */
	uint64_t passes_ran;
	/* Per forward value, the input buffers handed out
	 * (engine/input_buffer.c); NULL until the first loom_input_buffer. */
	struct loom_input_buf *inbuf;
	/* Input bytes the host copied through the backend's upload
	 * (loom_set_input, and a commit of the program's own buffer); a
	 * commit of the backend's slot copies none (tests, reports). */
	uint64_t input_upload_bytes;
};

static inline void *loom_value_ptr(const loom_program *p, loom_value v)
{
	return loom_arena_ptr(&p->arena, &p->plan, v);
}

static inline size_t loom_value_bytes(const loom_program *p, loom_value v)
{
	return loom_plan_value_bytes(&p->plan, v);
}

/*
 * What the engine offers a pass, at compile time and in a strategy's
 * run-time members and hooks.
 */

/* The executor (engine/exec.c): walks steps [first, last) of the plan on
 * p's backend with flags LOOM_EXEC_*; a failure's message is in p. */
loom_status loom_exec_run(loom_program *p, int first, int last, unsigned flags);
/* Waits for every collective in flight, then the backend's synchronize. */
loom_status loom_exec_synchronize(loom_program *p);
/* Whether a WAIT step waits on the device (an asynchronous backend over a
 * stream-ordered communicator; the watchdog keeps the timeouts) rather
 * than on the host; decided by the first run. */
int loom_exec_device_wait(const loom_program *p);
/* For a transport's steps: a timer slot marking the work queued so far on
 * stream (-1: none), and a span of kind between two slots (its index). */
int loom_exec_timer(loom_program *p, loom_stream stream);
int loom_exec_add_span(loom_program *p, int kind, int id, int aux, int t0, int t1);

/* Copies the backend's last message into p's and returns st. */
loom_status loom_program_backend_fail(loom_program *p, loom_status st);

/*
 * p's backend, as a pass sees it (engine/pass_api.c). A failure's message,
 * naming the backend, is in p. loom_program_upload and _download
 * (engine/io_view.h) copy between host memory and the arena.
 */

/* Its name ("cpu", "cuda"), for messages. */
const char *loom_pass_backend_name(const loom_program *p);
/* Whether the arena is host memory: collectives go through the host (MPI)
 * communicator; else the device (NCCL) one. */
int loom_pass_host_memory(const loom_program *p);
/* The backend's synchronize: waits for all queued work and brings the
 * state it keeps (scaler, step) into p->ts. No collective is waited for
 * (loom_exec_synchronize does both). */
loom_status loom_pass_sync(loom_program *p);
/* What a communicator needs to order a collective on stream `which` (a
 * CUDA stream); NULL for host memory. */
void *loom_pass_stream(loom_program *p, loom_stream which);

/* What the backend does for ranks that each hold part of the gradients
 * (ZeRO's shards): the optimizer updates pieces of slots, and these
 * answer for pieces [first, last). loom_pass_shard_caps: LOOM_SHARD_*
 * bits, 0 where the backend has no sharded optimizer. */
enum {
	LOOM_SHARD_OPTIM = 1u << 0,         /* updates a shard; checks its gradients on the host */
	LOOM_SHARD_FINITE_DEVICE = 1u << 1, /* checks them on the device too */
	LOOM_SHARD_SUMSQ = 1u << 2,         /* a shard's gradient sum of squares on the host */
	LOOM_SHARD_SUMSQ_DEVICE = 1u << 3,  /* ... on the device */
};
unsigned loom_pass_shard_caps(const loom_program *p);
/* Host verdict: the gradients of the pieces hold no inf/NaN (*finite 1);
 * may wait. Device verdict: an i32 left at *flag in the compute stream's
 * order, 0 when they hold none; no wait. LOOM_ERR_UNSUPPORTED, naming the
 * backend, where it lacks the check. */
loom_status loom_pass_grads_finite(loom_program *p, int first, int last, int *finite);
loom_status loom_pass_grads_finite_device(loom_program *p, int first, int last, void **flag);
/* The sum of squares of the pieces' gradients as the optimizer applies
 * them (unscaled), f64: into *sumsq on the host (may wait), or left at
 * *sumsq on the device in the compute stream's order (no wait).
 * LOOM_ERR_UNSUPPORTED, naming the backend, where it lacks the sum. */
loom_status loom_pass_grad_sumsq(loom_program *p, int first, int last, double *sumsq);
loom_status loom_pass_grad_sumsq_device(loom_program *p, int first, int last, void **sumsq);
/* The accumulation sums, allocated by the first run that needs them. */
loom_status loom_program_accum_ready(loom_program *p);
/* engine/accum.c: the accumulation segments of the plan (buckets, or each
 * parameter's gradient) and accum_bytes; after the memory plan. */
loom_status loom_accum_plan(loom_plan *pl);

/* The FLOPs of the plan's products (conv2d and its backward directions,
 * linear, matmul; 2 per multiply-add), forward nodes [0, n_fwd) and the
 * rest (engine/report.c; loom_program_info.flops_fwd/_bwd). */
void loom_plan_flops(const loom_plan *pl, double *fwd, double *bwd);
/* One node's share of those (0 for a node that is no product). */
double loom_node_flops(const loom_graph *g, loom_value v);

/* Host-side initialisation of parameters and buffers (PyTorch's defaults),
 * into a host buffer of the value's dtype. */
void loom_init_value(const loom_graph *g, loom_value v, void *dst);


/* What the compile hands every pass beside the program. */
typedef struct loom_pass_ctx {
	loom_value loss;  /* the loss in p's graph (the AMP pass may move it) */
	int rebalanced;   /* pipeline stages cut by memory (loom_compile's retry) */
	/* The values this rank's part of the plan gives storage (one byte per
	 * node, malloc'd; NULL: all): a pipeline stage's, set by the cut, read
	 * by the memory plan, freed by loom_compile. */
	unsigned char *held;
} loom_pass_ctx;

typedef struct loom_pass {
	const char *name;
	/* Whether this compile needs the pass (NULL: always). */
	int (*wanted)(const loom_program *p);
	/* Adds to or rewrites p's plan; a failure's message in p->err. */
	loom_status (*run)(loom_program *p, loom_pass_ctx *c);
	/* Start-up once the arena holds the initial values (NULL: none);
	 * collective for a strategy. A failure's message in p->err. */
	loom_status (*start)(loom_program *p);
	/* After a compile refused for memory (LOOM_ERR_NOMEM): whether to
	 * compile again with the options changed (o, a copy of the user's);
	 * that compile's rebalanced is 1. NULL: never. */
	int (*retry)(const loom_program *p, loom_compile_opts *o);
	/* What the pass hung on p, freed with it (NULL: nothing). */
	void (*release)(loom_program *p);

	/* At run time, on a program whose compile ran the pass (NULL: the
	 * engine's way). execute: a strategy that runs the plan its own way
	 * (the pipeline's micro-batches) runs loom_run's mode; set_input and
	 * read: loom_set_input and loom_read(_f64) of a value the strategy
	 * holds its own way; eval_sync: before an EVAL run that follows
	 * training runs (each rank's buffers from its own batches: rank 0's
	 * to every rank); note: this rank's place in the strategy, for the
	 * memory report (buf empty: none). */
	loom_status (*execute)(loom_program *p, loom_run_mode mode);
	loom_status (*set_input)(loom_program *p, loom_value v, const void *data, size_t count);
	loom_status (*read)(loom_program *p, loom_value v, double *dst, size_t count);
	loom_status (*eval_sync)(loom_program *p);
	void (*note)(const loom_program *p, char *buf, size_t len);
} loom_pass;

/* The pass of the list that ran in p's compile and has member m, else NULL
 * (the first, in the list's order). */
#define LOOM_PASS_WITH(p, m) loom_pass_with((p), offsetof(loom_pass, m))
const loom_pass *loom_pass_with(const loom_program *p, size_t member);

/* The compile pipeline, in order (parallel/pass_list.c, above both
 * rooms: engine/ names no strategy). */
extern const loom_pass *const loom_compile_passes[];
extern const int loom_n_compile_passes;

/* Test hook: while set, the pass of this name is left out of every compile
 * (tests/engine/test_passes.c: each pass left out changes what compiles). */
extern const char *loom_test_skip_pass;

/* The engine's own passes (engine/compile_passes.c). */
extern const loom_pass loom_pass_amp, loom_pass_autodiff, loom_pass_device, loom_pass_fuse, loom_pass_formats,
	loom_pass_slots, loom_pass_memory_plan, loom_pass_accumulation, loom_pass_steps,
	loom_pass_backend_plan, loom_pass_backend_alloc, loom_pass_initial_values, loom_pass_vocab_pad,
	loom_pass_recompute, loom_pass_fp8_storage;

/* The vocab-pad pass's multiple: LOOM_VOCAB_PAD when set (0: off), else
 * loom_compile_opts.vocab_pad (engine/vocab_pad.c). */
int64_t loom_vocab_pad_multiple(const loom_compile_opts *o);

/* p->err (a backend's or a limit's message) as "backend NAME: ..."; st. */
loom_status loom_pass_backend_failed(loom_program *p, loom_status st);

/* A plan's peak: the arena's regions, its workspace, optimizer state and
 * ZeRO's master (ZeRO-3: parameter) shards, and `extra` (what a strategy allocates beyond them, p->peak_extra). */
size_t loom_plan_peak(const loom_plan *pl, size_t extra);

#endif /* LOOM_ENGINE_PASS_H */
