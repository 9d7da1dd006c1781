/*
 * engine/backend.h — the backend interface: a table of functions plus the
 * context it creates (after ggml's ggml_backend_i), and the capability bits
 * the planner asks instead of comparing addresses. A backend runs nodes,
 * the device side of collectives, copies, events and synchronisation (the
 * required core, at most LOOM_BACKEND_CORE functions); what only some
 * backends do (graphs, timers, ZeRO, staged inputs...) sits in optional
 * groups it may leave NULL. The executor (engine/exec.c) walks the plan's
 * steps and calls it.
 */
#ifndef LOOM_ENGINE_BACKEND_H
#define LOOM_ENGINE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "engine/plan.h"
#include "engine/trace.h" /* loom_trace_now, the clock of the timers */

/* Capability bits (loom_backend.caps). */
enum {
	LOOM_BE_FUSES_RELU_POOL = 1u << 0,   /* max-pool honours attrs.pool.relu (graph/fuse.c) */
	LOOM_BE_FUSES_SIBLINGS = 1u << 1,    /* runs a node's siblings (made_by) with it */
	LOOM_BE_FUSES_LINEAR_RELU = 1u << 2, /* LINEAR honours attrs.mm.relu */
	LOOM_BE_FUSES_BN_RELU = 1u << 3,     /* BATCHNORM2D honours attrs.bn.relu */
	LOOM_BE_FUSES_ADD_RELU = 1u << 4,    /* ADD honours attrs.ew.relu */
	/* The arena is host memory: collectives go through the host (MPI)
	 * communicator; else the device (NCCL) one. */
	LOOM_BE_HOST_MEMORY = 1u << 5,
	/* Work is queued on asynchronous streams: a collective's end is an
	 * event on the communication stream, not the host seeing it done. */
	LOOM_BE_ASYNC_STREAMS = 1u << 6,
	/* optim honours opts.optim's clip_grad and decay_matrices_only and
	 * sets ts->grad_norm (ZeRO: clips by the ts->grad_norm the executor
	 * reduced over the shards; with the sharded group, answers
	 * grad_sumsq). */
	LOOM_BE_CLIPS_GRAD = 1u << 8,
	/* Every kernel reads and writes any float dtype, computing in fp32
	 * (the CPU's emulation): graph/fuse.c's loom_fuse_casts may give a
	 * producer its cast's dtype. */
	LOOM_BE_FUSES_CASTS = 1u << 9,
	/* Some kernels do (takes_any_dtype names their ops): graph/fuse.c's
	 * loom_fuse_casts_for folds casts at those ops only. */
	LOOM_BE_FUSES_SOME_CASTS = 1u << 10,
	/* Runs causal attention as one fused kernel where attn_fusable says
	 * so (graph/fuse_attention.c). */
	LOOM_BE_FUSES_ATTENTION = 1u << 11,
	/* Runs a residual add and the layer norm that reads it as one kernel
	 * where ln_residual_fusable says so (graph/fuse.c's
	 * loom_fuse_ln_residual; the add's node makes the layer norm). */
	LOOM_BE_FUSES_LN_RESIDUAL = 1u << 12,
	/* Runs a row norm's data gradient (layer norm's, RMS norm's) that adds
	 * itself into the other gradient of its input (autodiff's sum) as one
	 * kernel where
	 * ln_bwd_accum_fusable says so (graph/fuse.c's
	 * loom_fuse_ln_bwd_accum; the node's src[3] is the addend), and an
	 * embedding's gradient that adds itself into the tied table's other
	 * (loom_fuse_emb_bwd_accum; src[2]). */
	LOOM_BE_FUSES_LN_BWD_ACCUM = 1u << 13,
};

#define LOOM_BE_FUSES_ALL                                                              \
	(LOOM_BE_FUSES_RELU_POOL | LOOM_BE_FUSES_SIBLINGS | LOOM_BE_FUSES_LINEAR_RELU | \
	 LOOM_BE_FUSES_BN_RELU | LOOM_BE_FUSES_ADD_RELU)

/* What a backend counts (loom_backend.counters). host_syncs: the host's
 * waits for the device (stream and event synchronisations, event
 * queries), all of them; syncs_in_step: those between run_begin and
 * run_end, where a step should have none; captures and replays: steps
 * recorded as a graph, and graph launches after the capture's own. */
typedef struct loom_backend_counters {
	long host_syncs, syncs_in_step, captures, replays;
} loom_backend_counters;

/*
 * The optional groups. A backend leaves a group NULL where it has none of
 * what the group does; the callers check the group pointer once, and a
 * NULL group means what NULL entries meant before the groups: the feature
 * is off (or refused with a message that names the backend). An entry
 * marked (optional) may be NULL inside a group that is given.
 */

/* Planning hints, asked while the plan is compiled (some before the
 * backend has a context). NULL: no formats but NCHW, no cast folding by
 * op, no fused attention, no notes, every sibling run by its own entry. */
typedef struct loom_backend_planning {
	/* Whether op's kernel reads each source and writes its value in any
	 * float dtype, computing in fp32 (LOOM_BE_FUSES_SOME_CASTS); asked
	 * at compile time, before the backend has a context. // (optional) */
	int (*takes_any_dtype)(loom_op op);
	/* The memory formats node v of plan can run in (the format pass,
	 * graph/formats.c, asks before the memory plan; ctx may be NULL).
	 * NULL: NCHW only. // (optional) */
	void (*node_formats)(void *ctx, const loom_plan *plan, loom_value v,
			     loom_format_caps *caps);
	/* Whether the attention whose ATTN_PROBS node is probs runs fused
	 * (train: its backward too), asked by graph/fuse_attention.c before
	 * the context exists; may build and check the library's plan for the
	 * shape. LOOM_BE_FUSES_ATTENTION only. // (optional) */
	int (*attn_fusable)(const loom_graph *g, loom_value probs, int train);
	/* Whether the residual add a and the layer norm ln reading it run as
	 * one kernel (the add's; makes_sibling then says so for ln), asked by
	 * graph/fuse.c before the context exists.
	 * LOOM_BE_FUSES_LN_RESIDUAL only. // (optional) */
	int (*ln_residual_fusable)(const loom_graph *g, loom_value a, loom_value ln);
	/* Whether the gradient node d (a row norm's data gradient,
	 * LAYERNORM_BWD_DATA or RMSNORM_BWD_DATA: refuse the op without such a
	 * kernel; or an embedding's backward) runs with the sum s that adds it
	 * to another gradient (s's src[other]) in one kernel, d's result added
	 * into that gradient as the sum did; asked by graph/fuse.c before the
	 * context exists. LOOM_BE_FUSES_LN_BWD_ACCUM only. // (optional) */
	int (*ln_bwd_accum_fusable)(const loom_graph *g, loom_value d, loom_value s, int other);
	/* The multiple a classifier's vocabulary is padded to when the plan
	 * leaves it to the backend (loom_compile_opts.vocab_pad -1, the
	 * default, and LOOM_VOCAB_PAD unset: engine/vocab_pad.c): the row
	 * alignment its products want; 0: none. Data, not a function.
	 * // (optional) */
	int vocab_pad;
	/* One line on how node v runs (the kernel plan_create chose for it),
	 * for --dump-graph; buf[0] = 0 where there is nothing to say. // (optional) */
	void (*node_note)(void *ctx, const loom_plan *plan, loom_value v, char *buf, size_t len);
	/* Whether running node v also wrote its sibling w (a library call
	 * that makes both); NULL: never, each sibling runs by itself. // (optional) */
	int (*makes_sibling)(void *ctx, const loom_plan *plan, loom_value v, loom_value w);
	/* Whether node v of g reads source i when it is stored as fp8 codes
	 * and their scale (an FP8_QDQ value with a.fp8.store: graph/ops/ops.h,
	 * loom_fp8_stored), decoding it to the very bits the FP8_QDQ node
	 * writes unstored; asked by the fp8 storage pass (engine/
	 * compile_passes.c) before the context exists. NULL: never, an fp8
	 * rounding's value keeps its dtype's bytes. // (optional) */
	int (*reads_fp8)(const loom_graph *g, loom_value v, int i);
} loom_backend_planning;

/* Gradient accumulation (loom_run's ACCUMULATE and FOLD, a pipeline's
 * micro-batches). NULL: none; such a run is refused, naming the backend. */
typedef struct loom_backend_accumulate {
	/* Allocates plan->accum_bytes of zeroed sums into arena->accum, at the
	 * first ACCUMULATE run. */
	loom_status (*alloc_accum)(void *ctx, const loom_plan *plan, loom_arena *arena);
	/* Adds gradient accumulation segment s into its sum, or (fold) adds
	 * the sum into the segment and clears it. */
	loom_status (*accum)(void *ctx, const loom_plan *plan, const loom_arena *arena, int s,
			     int fold);
} loom_backend_accumulate;

/* Ranks that each hold some of the gradients (ZeRO): optim updates pieces
 * that are part of a slot, and these answer for pieces [first, last).
 * NULL: no sharded optimizer (ZeRO is refused). */
typedef struct loom_backend_sharded {
	/* Host verdict: the gradients of pieces [first, last) hold no inf/NaN
	 * (*finite = 1). May wait. */
	loom_status (*grads_finite)(void *ctx, const loom_plan *plan, const loom_arena *arena,
				    int first, int last, int *finite);
	/* Device verdict: checks the gradients of pieces [first, last) and
	 * leaves, in the compute stream's order, an i32 at *flag that is 0
	 * when they hold no inf/NaN; no wait. The executor sums it over the
	 * ranks on the device and passes LOOM_FINITE_ON_DEVICE to optim.
	 * NULL: the host verdict. // (optional) */
	loom_status (*grads_finite_device)(void *ctx, const loom_plan *plan,
					   const loom_arena *arena, int first, int last,
					   void **flag);
	/* Host value: the sum of squares of pieces [first, last)'s gradients
	 * as the optimizer applies them (times loom_grad_unscale(plan, ts)),
	 * in f64, in a fixed order. May wait. Clipping under ZeRO
	 * (with LOOM_BE_CLIPS_GRAD). // (optional) */
	loom_status (*grad_sumsq)(void *ctx, const loom_plan *plan, const loom_arena *arena,
				  const loom_train_state *ts, int first, int last, double *sumsq);
	/* Device value: grad_sumsq's sum left as an f64 at *sumsq in the
	 * compute stream's order, no wait. The executor sums it over the
	 * ranks on the device (one all-reduce); the optim that follows in
	 * this run clips by the square root of what *sumsq then holds (ZeRO's
	 * clipping inside a captured step). NULL: the host value. // (optional) */
	loom_status (*grad_sumsq_device)(void *ctx, const loom_plan *plan, const loom_arena *arena,
					 const loom_train_state *ts, int first, int last,
					 void **sumsq);
} loom_backend_sharded;

/* Trace timers and counters. NULL: a trace gets no spans (each counted
 * lost) and the report no counters. */
typedef struct loom_backend_timing {
	/* timer_record marks slot `slot` when the work queued so far on
	 * `stream` is done; timer_read (after synchronize) gives that moment
	 * in loom_trace_now()'s seconds. */
	loom_status (*timer_record)(void *ctx, int slot, loom_stream stream);
	loom_status (*timer_read)(void *ctx, int slot, double *seconds);
	/* The backend's counters (tests, reports). // (optional) */
	void (*counters)(void *ctx, loom_backend_counters *out);
} loom_backend_timing;

/* The loss read one step late (LOOM_ASYNC_LOSS=1). NULL: every step waits
 * for its loss. */
typedef struct loom_backend_async_loss {
	/* Queues a copy of the loss (f64 or f32 at loss) and of the device's
	 * training state into host memory after the work queued so far, and
	 * returns without waiting for it; then waits for the previous call's
	 * copy only and puts that step's loss, scaler and step into ts.
	 * synchronize takes a pending copy's loss. */
	loom_status (*loss_async)(void *ctx, const loom_plan *plan, const void *loss, int f64,
				  loom_train_state *ts);
} loom_backend_async_loss;

/* The step as one graph (loom_compile_opts.cuda_graph; engine/exec.c
 * drives it: the first training step eager, the second captured, the
 * later ones replayed). NULL: steps always run eagerly. */
typedef struct loom_backend_graph_ops {
	/* capture_begin: the work queued next on the backend's streams is
	 * recorded, not run. capture_end: keep, the recording becomes the
	 * step's graph and runs once; !keep, it is dropped (a step failed or
	 * could not be captured) and the streams run eagerly again. replay:
	 * the recorded step runs again. The arena's addresses stay put
	 * between them; run_begin, outside the graph, pushes what the host
	 * changed (lr, scaler, step) and the inputs are uploaded before it,
	 * in stream order. */
	loom_status (*capture_begin)(void *ctx, const loom_plan *plan);
	loom_status (*capture_end)(void *ctx, const loom_plan *plan, int keep);
	loom_status (*replay)(void *ctx, const loom_plan *plan);
} loom_backend_graph_ops;

/* Progress marks: how the host sees a replayed step's collectives end (a
 * captured event cannot be queried for a replay). NULL: a step with
 * collectives is never captured. */
typedef struct loom_backend_marks {
	/* n words of host-visible memory, zeroed, made once (outside a
	 * capture); *words is their host address, read without a call. */
	loom_status (*mark_words)(void *ctx, int n, const volatile uint64_t **words);
	/* Under capture: after the work queued so far on `stream`, the device
	 * writes word `slot` with the serial of the launch running it (the
	 * graph's head bumps the serial; a launch's own writes are its
	 * serial). */
	loom_status (*mark_record)(void *ctx, int slot, loom_stream stream);
	/* The serial of the latest launch (capture_end's run or a replay); 0
	 * before any. */
	uint64_t (*mark_serial)(void *ctx);
} loom_backend_marks;

/* Zero-copy inputs (loom_input_buffer, loom_input_commit). NULL: the
 * program fills a buffer of its own and uploads it at commit. */
typedef struct loom_backend_input {
	/* Hands out host memory the next batch of the input at arena address
	 * dst (bytes) goes into, a slot no queued copy still reads (it waits
	 * for the one that does, outside any step), or returns
	 * LOOM_ERR_UNSUPPORTED where it stages no such input (the program
	 * then uses its own buffer for it). */
	loom_status (*input_slot)(void *ctx, void *dst, size_t bytes, void **host);
	/* What the host wrote there is the input of the next run, as an
	 * upload of it, with no host copy. */
	loom_status (*input_commit)(void *ctx, void *dst, size_t bytes);
	/* The slot goes back unused. */
	loom_status (*input_release)(void *ctx, void *dst, size_t bytes);
} loom_backend_input;

/* amp.fp8's per-tensor state kept on the device (amp/fp8_scaling.h's
 * state, which the kernels read and write there), under either recipe:
 * under current scaling the casts record their amaxes, scales and
 * saturation counts there for the report. NULL: the kernels use ts.fp8
 * in host memory (the CPU), or a device backend casts by current scaling
 * only and records nothing (delayed is refused, naming the backend). */
typedef struct loom_backend_fp8 {
	/* ts.fp8 onto the device, at compile and after a checkpoint's load
	 * (allocating the device copy the first time); waits. */
	loom_status (*fp8_upload)(void *ctx, const loom_fp8_state *fs);
	/* The device copy into ts.fp8, for the host's readers (the report, a
	 * checkpoint); waits. Never called per step. */
	loom_status (*fp8_download)(void *ctx, loom_fp8_state *fs);
	/* Data parallelism: queues on the compute stream a copy of the step's
	 * amaxes (f32) and saturation counts (f64), one per tensor, into
	 * device buffers it returns, for the executor to max-reduce and sum
	 * over the ranks in stream order. NULL: one process only (delayed
	 * scaling is refused at world > 1). // (optional) */
	loom_status (*fp8_reduce_begin)(void *ctx, void **amax, void **saturated);
	/* Queues the step end of every tensor (loom_fp8_tensor_step_end) on
	 * the compute stream, no wait: a captured step holds it. reduced:
	 * the amaxes and counts are first taken back from fp8_reduce_begin's
	 * buffers (reduced over the ranks by then). */
	loom_status (*fp8_step_end)(void *ctx, const loom_plan *plan, int reduced);
} loom_backend_fp8;

/*
 * The backend: its name, capability bits, the required core (every entry
 * filled) and the optional groups. Every method receives the backend's
 * context; those that run work receive the plan, const. A failing method
 * returns a status and leaves its message for error(ctx), which the program
 * copies into its own error (the one path from a backend to
 * loom_program_error).
 */
typedef struct loom_backend {
	const char *name;
	unsigned caps; /* LOOM_BE_* */

	/* ---- the core: LOOM_BACKEND_CORE functions, from init to event_wait */

	/* Creates the context: library handles, streams (a second one for
	 * communication where the device has streams) and events. */
	loom_status (*init)(void **ctx, char *err, size_t errlen);
	void (*free)(void *ctx);
	/* The last failure's message; "" if none. */
	const char *(*error)(void *ctx);
	/* What runs the program ("cpu", "cuda: <device name>"). */
	const char *(*describe)(void *ctx);
	/* Whether this backend has an entry for op at all (a table lookup;
	 * ctx may be NULL). */
	int (*supports_op)(void *ctx, loom_op op);
	/* Whether it runs node v of plan as it is: its op, its dtype and its
	 * sources' dtypes and shapes (as ggml's supports_op sees the tensor).
	 * Asked for every node a step runs, before plan_create. */
	int (*supports_node)(void *ctx, const loom_plan *plan, loom_value v);
	/* The per-node plans (algorithms, library descriptors) for plan, made
	 * once; *ws_bytes gets the scratch the largest node needs. A failure
	 * is returned here, not at the first run. */
	loom_status (*plan_create)(void *ctx, const loom_plan *plan, size_t *ws_bytes);
	/* Allocates the arena regions with plan's sizes (zeroed) and takes
	 * ts's scaler and step as the state to start from. The backend owns
	 * the memory; *arena is the one copy of its addresses (the program's). */
	loom_status (*alloc)(void *ctx, const loom_plan *plan, const loom_train_state *ts,
			     loom_arena *arena);
	/* One run of steps: begin takes the run's flags and ts (a host-side
	 * change of ts goes to the device here), end closes it (a deferred
	 * verdict, e.g. the device's diagnosis, lands in ts). */
	loom_status (*run_begin)(void *ctx, const loom_plan *plan, const loom_arena *arena,
				 loom_train_state *ts, unsigned flags);
	loom_status (*run_end)(void *ctx, const loom_plan *plan, const loom_arena *arena,
			       loom_train_state *ts);
	/* Queues node v (on the compute stream). */
	loom_status (*run_node)(void *ctx, const loom_plan *plan, const loom_arena *arena,
				loom_value v);
	/* Diagnosis: records v in ts->first_nonfinite if it holds inf/NaN and
	 * none was found yet (now, or by run_end). */
	loom_status (*check_finite)(void *ctx, const loom_plan *plan, const loom_arena *arena,
				    loom_train_state *ts, loom_value v);
	/* The fused overflow check, unscale, loss-scale decision and
	 * SGD/AdamW update over pieces [first, last); skips the update on
	 * overflow (dynamic scaling). finite: -1, check the pieces' gradients
	 * here; 0 or 1, the verdict the executor reduced over the ranks;
	 * LOOM_FINITE_ON_DEVICE, the flag sharded->grads_finite_device gave,
	 * summed over the ranks on the device (non-zero: an overflow). */
	loom_status (*optim)(void *ctx, const loom_plan *plan, const loom_arena *arena,
			     loom_train_state *ts, int first, int last, int finite);
	/* What the communicator needs to order a collective on `stream` (a
	 * CUDA stream), NULL for host memory. */
	void *(*stream_handle)(void *ctx, loom_stream stream);
	/* Copies between host memory and an arena address. download returns
	 * when dst holds the data; upload may return before the copy ends. */
	loom_status (*upload)(void *ctx, void *dst, const void *src, size_t bytes);
	loom_status (*download)(void *ctx, void *dst, const void *src, size_t bytes);
	/* Copies between two arena addresses, in the compute stream's order. */
	loom_status (*copy)(void *ctx, void *dst, const void *src, size_t bytes);
	/* Waits for all queued work, brings the training state the device
	 * keeps (scaler, step) into ts and reports run-time faults (a bad
	 * label). The executor has waited for its collectives before. */
	loom_status (*synchronize)(void *ctx, const loom_plan *plan, loom_train_state *ts);
	/* Event `event` (< LOOM_BACKEND_EVENTS) marks the work queued so far on
	 * `stream`; event_wait makes later work on `stream` wait for it. */
	loom_status (*event_record)(void *ctx, int event, loom_stream stream);
	loom_status (*event_wait)(void *ctx, int event, loom_stream stream);

	/* ---- the optional groups (above): NULL where the backend has none */

	const loom_backend_planning *planning;
	const loom_backend_accumulate *accumulate;
	const loom_backend_sharded *sharded;
	const loom_backend_timing *timing;
	const loom_backend_async_loss *async_loss;
	const loom_backend_graph_ops *graph;
	const loom_backend_marks *marks;
	const loom_backend_input *input;
	const loom_backend_fp8 *fp8;
} loom_backend;

/* The core's size: its functions lie between init and event_wait, and stay
 * at most this many (ggml's ggml_backend_i has about a dozen); a new
 * feature goes into a group, or a new one. */
#define LOOM_BACKEND_CORE 20
#ifndef __cplusplus
_Static_assert(offsetof(loom_backend, init) == 2 * sizeof(void *),
	       "loom_backend: only name and caps come before the core");
_Static_assert(offsetof(loom_backend, event_wait) - offsetof(loom_backend, init) <
		       LOOM_BACKEND_CORE * sizeof(void (*)(void)),
	       "loom_backend: the required core has more than LOOM_BACKEND_CORE functions");
_Static_assert(offsetof(loom_backend, planning) ==
		       offsetof(loom_backend, event_wait) + sizeof(void (*)(void)),
	       "loom_backend: the core must end with event_wait, right before the groups");
_Static_assert(sizeof(loom_backend) == offsetof(loom_backend, fp8) + sizeof(void *),
	       "loom_backend: the groups end the struct; a new function goes into one");
#endif

/* Events a backend creates at init, named by index. */
#define LOOM_BACKEND_EVENTS 16

extern const loom_backend loom_cpu_backend;

/* The CUDA backend (engine/cuda/backend.cu). It lives in libloom_cuda.so:
 * the engine reaches it through the plugin's table (base/cuda_plugin.h),
 * never by this name, which only the plugin itself links against. */
const loom_backend *loom_cuda_backend_get(void);

#endif /* LOOM_ENGINE_BACKEND_H */
