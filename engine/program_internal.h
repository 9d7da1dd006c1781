/*
 * engine/program_internal.h — what only the engine sees of a program: the
 * plan and training state (engine/plan.h, what backends see too), the
 * backend that runs it (engine/backend.h), the executor's state, and the
 * engine's own helpers (errors, data-parallel start-up, accumulation,
 * initialisation).
 */
#ifndef LOOM_ENGINE_PROGRAM_INTERNAL_H
#define LOOM_ENGINE_PROGRAM_INTERNAL_H

#include <stdarg.h>
#include <stdio.h>

#include "engine/backend.h"
#include "engine/io_view.h" /* what io/ sees of a program, a part of this */
#include "engine/plan.h"
#include "loom.h"

typedef struct loom_program loom_program;

/*
 * The executor's state of a program (engine/exec.c): the collectives in
 * flight, per bucket, and the spans a traced run waits to read from the
 * backend's timers.
 */
typedef struct loom_exec_span {
	int32_t kind, id, aux;
	int t0, t1; /* timer slots */
} loom_exec_span;

typedef struct loom_exec {
	struct loom_comm_work **pending; /* per bucket: its collective, else NULL */
	int n_pending;
	/* An asynchronous backend over a stream-ordered communicator: the
	 * WAIT step is an event on the device and the watchdog waits on the
	 * host (engine/exec.c); kept: per bucket, its work made once (NULL
	 * where the communicator keeps none). */
	int device_wait;
	struct loom_comm_work **kept;
	/* The training step as one graph (engine/exec.c): graph -1 off, 0
	 * not decided yet, 1 on; graph_runs: training steps run so far on it
	 * (the first eager, the second captured, later replayed); capturing:
	 * the walk is being recorded; captured: the capture was kept and
	 * launched; graph_note: why it is off. */
	int graph, graph_runs, capturing, captured;
	char graph_note[160];
	/* A captured step's collectives, seen by the host through progress
	 * marks (engine/backend.h's mark_*), one per collective start of the
	 * step (a bucket's reduce-scatter and all-gather are two): marks, the
	 * backend's n_marks words; mark_work, per mark, the work made once
	 * that the captured start was given (it names the collective to the
	 * watchdog); n_marked: marks the capture recorded; mark_handed:
	 * hand-offs to the watchdog by mark so far (tests). */
	const volatile uint64_t *marks;
	struct loom_comm_work **mark_work;
	int n_marks, n_marked;
	uint64_t mark_handed;
	int *pending_span;   /* per bucket: its span's index in spans, -1: none */
	loom_exec_span *spans;
	int n_spans, cap_spans;
	int n_timers;        /* timer slots used by this run */
} loom_exec;

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

struct loom_program {
	loom_plan plan;
	loom_train_state ts;
	const loom_backend *be;
	void *be_ctx;
	loom_arena arena; /* the regions be_ctx allocated: the one copy of their
			   * addresses (the backend reads this one) */
	loom_exec exec;
	const loom_transport *transport; /* or NULL */
	const loom_shards *shards;       /* or NULL */
	int ready;        /* compiled; a failed compile's handle only explains */
	/* Bytes a strategy allocates beyond the arena, in the planned peak (a
	 * pipeline's accumulation sums of several micro-batches). */
	size_t peak_extra;
	/* Bit i: pass i of loom_compile_passes ran in this compile. */
	uint64_t passes_ran;
	/* Per forward value, the input buffers handed out
	 * (engine/input_buffer.c); NULL until the first loom_input_buffer. */
	struct loom_input_buf *inbuf;
	/* Input bytes the host copied through the backend's upload
	 * (loom_set_input, and a commit of the program's own buffer); a
	 * commit of the backend's slot copies none (tests, reports). */
	uint64_t input_upload_bytes;
	/* A run changed the device's copy of fp8's delayed state since ts.fp8
	 * was last brought back (loom_exec_fp8_host). */
	int fp8_on_device_newer;
	loom_error err; /* the last failure (base/errf.h) */
};

/* A program that compiled (a failed compile's handle is not). */
static inline int loom_program_usable(const loom_program *p)
{
	return p && p->ready;
}

static inline void *loom_value_ptr(const loom_program *p, loom_value v)
{
	return loom_arena_ptr(&p->arena, &p->plan, v);
}

static inline size_t loom_value_bytes(const loom_program *p, loom_value v)
{
	return loom_plan_value_bytes(&p->plan, v);
}

/* The FLOPs of the plan's products (conv2d and its backward directions,
 * linear, matmul; 2 per multiply-add), forward nodes [0, n_fwd) and the
 * rest (engine/report.c; loom_program_info.flops_fwd/_bwd). */
void loom_plan_flops(const loom_plan *pl, double *fwd, double *bwd);
/* One node's share of those (0 for a node that is no product). */
double loom_node_flops(const loom_graph *g, loom_value v);

/* loom_program_fail, loom_program_upload and _download, values by handle
 * wherever this rank keeps them (loom_value_read_whole, ...): engine/io_view.h. */

/* Copies the backend's last message into p's and returns st. */
loom_status loom_program_backend_fail(loom_program *p, loom_status st);

/* The accumulation sums, allocated by the first run that needs them. */
loom_status loom_program_accum_ready(loom_program *p);

/* engine/input_buffer.c: whether input v's buffer is handed out (then
 * loom_set_input waits for its commit or release), and the free of what
 * the hand-outs made. */
typedef struct loom_input_buf loom_input_buf;
int loom_input_buffer_out(const loom_program *p, loom_value v);
void loom_input_buffers_free(loom_program *p);

/* engine/accum.c: the accumulation segments of the plan (buckets, or each
 * parameter's gradient) and accum_bytes; after the memory plan. */
loom_status loom_accum_plan(loom_plan *pl);

/* engine/steps.c: the plan's step list from its schedule (nodes,
 * accumulation, the buckets' all-reduces, the optimizer's pieces), for a
 * plain or data-parallel plan; parallel/zero.c makes a ZeRO plan's. */
loom_status loom_steps_build(loom_plan *pl);
/* One piece per slot, the slots' own state offsets. */
loom_status loom_pieces_plain(loom_plan *pl);

/* engine/exec.c: the executor. Walks steps [first, last) of the plan on
 * p's backend with flags LOOM_EXEC_*; a failure's message is in p. */
loom_status loom_exec_run(loom_program *p, int first, int last, unsigned flags);
/* Waits for every collective in flight, then the backend's synchronize. */
loom_status loom_exec_synchronize(loom_program *p);
/* amp.fp8's delayed state kept on the device (loom_backend_fp8): host
 * brings it into ts.fp8 when a run changed it since (the host view: the
 * report, a checkpoint; waits); device puts ts.fp8 back there (after a
 * checkpoint's load). Both nothing elsewhere. */
loom_status loom_exec_fp8_host(loom_program *p);
loom_status loom_exec_fp8_device(loom_program *p);
/* After synchronize: the traced runs' spans, read from the backend's
 * timers, into the trace. */
loom_status loom_exec_trace_flush(loom_program *p);
/* For a transport's steps: a timer slot marking the work queued so far on
 * stream (-1: none), and a span of kind between two slots (its index). */
int loom_exec_timer(loom_program *p, loom_stream stream);
int loom_exec_add_span(loom_program *p, int kind, int id, int aux, int t0, int t1);
void loom_exec_free(loom_exec *x);
/* Before the backend is freed: no collective still writes into its arena. */
void loom_exec_drain(loom_program *p);
/* Whether the backend runs every node a step runs; else the message names
 * the first node it refuses, with its dtypes and shapes. */
loom_status loom_exec_check_support(loom_program *p);

/* Test hook: while set, loom_compile runs every program on this backend. */
extern const loom_backend *loom_test_backend;

/* The step list, one line per step (loom_program_dump ends with it). */
void loom_program_dump_steps(const loom_program *p, FILE *out);

/* The format pass for p (engine/formats.c): each value's memory format
 * from what p's backend takes, reorder nodes where they disagree. Run
 * after the fusion passes, before the memory plan. */
loom_status loom_plan_formats(loom_program *p);
/* Whether o (or LOOM_FORMATS, which decides instead) asks for the pass. */
int loom_formats_on(const loom_compile_opts *o);

/* Host-side initialisation of parameters and buffers (PyTorch's defaults),
 * into a host buffer of the value's dtype. */
void loom_init_value(const loom_graph *g, loom_value v, void *dst);

#endif /* LOOM_ENGINE_PROGRAM_INTERNAL_H */
