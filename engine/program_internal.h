/*
 * engine/program_internal.h — what a compiled program is made of: the
 * compiled plan (graph, memory plan, parameter slots, fingerprint), the
 * training state (step, learning rate, loss scaler, what diagnosis found),
 * and the backend (an interface table plus its own context) that runs it.
 */
#ifndef LOOM_ENGINE_PROGRAM_INTERNAL_H
#define LOOM_ENGINE_PROGRAM_INTERNAL_H

#include <stdarg.h>

#include "amp/scaler.h"
#include "graph/graph_internal.h"
#include "graph/memplan.h"
#include "loom.h"

typedef struct loom_program loom_program;
struct loom_comm;      /* comm/comm.h: the collectives of data parallelism */
struct loom_comm_work; /* one outstanding all-reduce */
struct loom_trace;     /* engine/trace.h: the spans loom_trace_start records */

/* Size of every error buffer a backend or launcher writes into. */
#define LOOM_ERR_MAX 512

/* One trainable parameter as the optimizer sees it. */
typedef struct loom_param_slot {
	loom_value param;   /* the value the model reads (f16 under O2) */
	loom_value grad;    /* its gradient, same dtype */
	loom_value master;  /* O2: the f32 master weight, else LOOM_NONE */
	int64_t numel;
	size_t state_off[2]; /* optimizer state in the state region: SGD buf / Adam m, v */
	loom_dtype state_dtype;
} loom_param_slot;

/*
 * One run of gradients that gradient accumulation sums (LOOM_RUN_ACCUMULATE):
 * a bucket under data parallelism (its ALLREDUCE node, so that the running
 * sum is folded in right before the bucket's all-reduce starts), else one
 * parameter's gradient. Its sum lies at arena.accum + off, count f32.
 */
typedef struct loom_accum_seg {
	loom_value v;   /* the bucket's ALLREDUCE node, or the gradient */
	int64_t count;  /* elements (a bucket's padding included) */
	loom_dtype dtype;
	size_t off;
} loom_accum_seg;

/*
 * The compiled plan: everything decided at compile time. Backends read it
 * (const) and never write it; it does not change once loom_compile returns.
 */
typedef struct loom_plan {
	loom_graph *g; /* owned: the user's graph + AMP casts + backward */
	loom_value loss;
	int n_fwd;            /* nodes [0, n_fwd) are the forward pass */
	uint64_t fingerprint; /* of the user's graph and the options */
	loom_compile_opts opts;
	loom_memplan mp;
	loom_param_slot *params;
	int n_params;
	int n_state;          /* optimizer state buffers per parameter (0, 1, 2) */
	int scaling;          /* dynamic or static loss scaling is on */
	size_t ws_bytes, state_bytes, master_bytes;
	/* Data parallelism (world > 1): the gradient buckets, and the
	 * collectives for the backend's memory that their ALLREDUCE nodes
	 * start. The optimizer divides the summed gradients by world. */
	int world, rank;
	loom_buckets buckets;
	struct loom_comm *comm;
	/* Gradient accumulation: bucket k is accum[k] when there are buckets.
	 * accum_bytes of f32 sums, allocated at the first ACCUMULATE run. */
	loom_accum_seg *accum;
	int n_accum;
	size_t accum_bytes;
} loom_plan;

/* The training state: what a step changes besides the arena. */
typedef struct loom_train_state {
	double lr;
	int64_t step;
	loom_scaler scaler;
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
	double clip_grad;           /* max global gradient norm, 0: no clipping */
	int decay_matrices_only;    /* weight decay on parameters of >= 2 dims only */
	double grad_norm;           /* the last update's global norm (unscaled, averaged) */
} loom_train_state;

/* Base addresses of the arena's regions (backend memory). */
typedef struct loom_arena {
	unsigned char *persist, *act, *ws, *state;
	unsigned char *bucket; /* the gradient buckets (data parallelism; else unused) */
	unsigned char *accum;  /* gradient accumulation's sums; NULL until the first ACCUMULATE */
} loom_arena;

/* Streams a backend orders work on; a CPU backend has one in-order stream. */
typedef enum loom_stream {
	LOOM_STREAM_COMPUTE = 0,
	LOOM_STREAM_COMM,      /* all-reduce and other communication */
	LOOM_STREAM_COUNT
} loom_stream;

/* Events a backend creates at init, named by index. */
#define LOOM_BACKEND_EVENTS 16

/* Flags of one run. */
enum {
	LOOM_EXEC_TRAIN = 1 << 0,    /* training mode (batch-norm statistics) */
	/* Check every value for inf/NaN as it is made and record the first in
	 * ts->first_nonfinite before returning. May synchronise: it is the
	 * separate mode a collapsed loss scale turns on, never the step path. */
	LOOM_EXEC_DIAGNOSE = 1 << 1,
	/* Gradient accumulation. ACCUMULATE: add every accumulation segment
	 * into its sum once backward made it, and start no all-reduce. FOLD:
	 * add each sum into its segment and clear the sum, before the
	 * segment's all-reduce starts (or before the optimizer, without
	 * buckets). */
	LOOM_EXEC_ACCUMULATE = 1 << 2,
	LOOM_EXEC_FOLD = 1 << 3,
};

/*
 * A backend: a table of functions plus the context it creates (after ggml's
 * ggml_backend_i). Every method receives that context; those that run work
 * receive the plan, const. A failing method returns a status and leaves its
 * message for error(ctx); the program copies it into its own error.
 */
typedef struct loom_backend {
	const char *name;
	/* Creates the context: library handles, streams (a second one for
	 * communication where the device has streams) and events. */
	loom_status (*init)(void **ctx, char *err, size_t errlen);
	void (*free)(void *ctx);
	/* The last failure's message; "" if none. */
	const char *(*error)(void *ctx);
	/* What runs the program ("cpu", "cuda: <device name>"). */
	const char *(*describe)(void *ctx);
	/* Whether this backend has an entry for op: a NULL check of its table. */
	int (*supports_op)(void *ctx, loom_op op);
	/* The per-node plans (algorithms, library descriptors) for plan, made
	 * once; *ws_bytes gets the scratch the largest node needs. A failure
	 * is returned here, not at the first run. */
	loom_status (*plan_create)(void *ctx, const loom_plan *plan, size_t *ws_bytes);
	/* Allocates the arena regions with plan's sizes (zeroed) and takes
	 * ts's scaler and step as the state to start from. */
	loom_status (*alloc)(void *ctx, const loom_plan *plan, const loom_train_state *ts,
			     loom_arena *arena);
	/* Queues the nodes at positions [first, last) of plan->mp.schedule (the
	 * forward pass is [0, n_fwd), the backward [n_fwd, n): passes reorder
	 * within each); flags: LOOM_EXEC_*. */
	loom_status (*run)(void *ctx, const loom_plan *plan, loom_train_state *ts, int first,
			   int last, unsigned flags);
	/* The fused unscale + overflow check + optimizer update over all
	 * parameters; skips everything on overflow (dynamic scaling). */
	loom_status (*optim_step)(void *ctx, const loom_plan *plan, loom_train_state *ts);
	/* Copies between host memory and an arena address. download returns
	 * when dst holds the data; upload may return before the copy ends. */
	loom_status (*upload)(void *ctx, void *dst, const void *src, size_t bytes);
	loom_status (*download)(void *ctx, void *dst, const void *src, size_t bytes);
	/* Waits for all queued work, brings the training state the device
	 * keeps (scaler, step) into ts and reports run-time faults (a bad
	 * label). A change the host made to ts goes to the device at the next
	 * run or optimizer step. */
	loom_status (*synchronize)(void *ctx, const loom_plan *plan, loom_train_state *ts);
	/* Event `event` marks the work queued so far on `stream`; event_wait
	 * makes later work on `stream` wait for it. */
	loom_status (*event_record)(void *ctx, int event, loom_stream stream);
	loom_status (*event_wait)(void *ctx, int event, loom_stream stream);
	/* Allocates plan->accum_bytes of zeroed f32 sums into arena->accum,
	 * at the first ACCUMULATE run. NULL: no gradient accumulation. // (optional) */
	loom_status (*alloc_accum)(void *ctx, const loom_plan *plan, loom_arena *arena);
	/* Records one training step once, then replays it. */
	loom_status (*capture)(void *ctx, const loom_plan *plan, loom_train_state *ts); // (optional)
	loom_status (*replay)(void *ctx, const loom_plan *plan, loom_train_state *ts);  // (optional)
	/* Capabilities the planner may use. */
	int fuses_relu_pool; /* max-pool honours attrs.pool.relu (graph/fuse.c) */
	/* run makes a node's siblings (made_by, graph/fuse.c) when it runs the
	 * node, and skips them at their own place. */
	int fuses_siblings;
	int fuses_linear_relu; /* LINEAR honours attrs.mm.relu (graph/fuse.c) */
	int fuses_bn_relu;     /* BATCHNORM2D honours attrs.bn.relu (graph/fuse.c) */
	int fuses_add_relu;    /* ADD honours attrs.ew.relu (graph/fuse.c) */
	/* optim_step honours ts->clip_grad and ts->decay_matrices_only and
	 * sets ts->grad_norm. */
	int clips_grad;
} loom_backend;

struct loom_program {
	loom_plan plan;
	loom_train_state ts;
	const loom_backend *be;
	void *be_ctx;
	loom_arena arena; /* the regions be_ctx allocated */
	int ready;        /* compiled; a failed compile's handle only explains */
	char err[LOOM_ERR_MAX];
};

/* A program that compiled (a failed compile's handle is not). */
static inline int loom_program_usable(const loom_program *p)
{
	return p && p->ready;
}

/* Optimizer state buffers per parameter: SGD's momentum buffer, AdamW's m
 * and v. */
static inline int loom_optim_state_count(const loom_optim_opts *o)
{
	if (o->kind == LOOM_OPTIM_ADAMW)
		return 2;
	return o->kind == LOOM_OPTIM_SGD && o->momentum > 0 ? 1 : 0;
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

static inline void *loom_value_ptr(const loom_program *p, loom_value v)
{
	return loom_arena_ptr(&p->arena, &p->plan, v);
}

static inline size_t loom_plan_value_bytes(const loom_plan *pl, loom_value v)
{
	const loom_node *n = &pl->g->nodes[v];
	return (size_t)loom_shape_numel(&n->shape) * loom_dtype_size(n->dtype);
}

static inline size_t loom_value_bytes(const loom_program *p, loom_value v)
{
	return loom_plan_value_bytes(&p->plan, v);
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

/* The FLOPs of the plan's products (conv2d and its backward directions,
 * linear, matmul; 2 per multiply-add), forward nodes [0, n_fwd) and the
 * rest (engine/report.c; loom_program_info.flops_fwd/_bwd). */
void loom_plan_flops(const loom_plan *pl, double *fwd, double *bwd);

/* Prints one message through the user's log callback (loom_set_log). */
void loom_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Records a message on p and returns st. */
loom_status loom_program_fail(loom_program *p, loom_status st, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Copies the backend's last message into p's and returns st. */
loom_status loom_program_backend_fail(loom_program *p, loom_status st);

/* The backend's upload and download, with a failure's message in p. */
loom_status loom_program_upload(loom_program *p, void *dst, const void *src, size_t bytes);
loom_status loom_program_download(loom_program *p, void *dst, const void *src, size_t bytes);

/* Formats into err (LOOM_ERR_MAX bytes) and returns st: how backends and
 * their op entries report. */
loom_status loom_errf(char *err, loom_status st, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* The one wording of a label outside [0, classes) at softmax-CE node v,
 * for both backends. */
loom_status loom_bad_label(char *err, const loom_plan *pl, loom_value v, int32_t label, int row);

extern const loom_backend loom_cpu_backend;

/* The CUDA backend (engine/cuda/backend.cu). It lives in libloom_cuda.so:
 * the engine reaches it through the plugin's table (base/cuda_plugin.h),
 * never by this name, which only the plugin itself links against. */
const loom_backend *loom_cuda_backend_get(void);

/* engine/ddp.c, data parallelism in loom_compile. The group's world size
 * (1 without a group). */
int loom_ddp_world(const loom_compile_opts *o);
/* The bucket pass and the memory plan with buckets (in place of
 * loom_memplan_build), after the parameter slots exist. */
loom_status loom_ddp_plan(loom_program *p, char *err, size_t errlen);
/* sync_bn's marks: attrs.bn.sync on every batch norm, forward and backward. */
void loom_ddp_mark_sync_bn(loom_graph *g);
/* Test hook: while set, sync_bn marks the batch norms at world 1 too, where
 * no all-reduce runs (the sums are everyone's already), so that a backend's
 * split kernels can be checked against another's in one process. */
extern int loom_ddp_test_sync_one_rank;
/* Collective, once the arena holds the initial values: every rank's plan
 * compared with rank 0's, then rank 0's parameters and buffers broadcast. */
loom_status loom_ddp_start(loom_program *p);
/* Collective: rank 0's buffers (batch-norm running statistics, which each
 * rank updates from its own batches) to every rank, before evaluating. */
loom_status loom_ddp_sync_buffers(loom_program *p);

/* engine/accum.c: the accumulation segments of the plan (buckets, or each
 * parameter's gradient) and accum_bytes; after the memory plan. */
loom_status loom_accum_plan(loom_plan *pl);

/* Host-side initialisation of parameters and buffers (PyTorch's defaults),
 * into a host buffer of the value's dtype. */
void loom_init_value(const loom_graph *g, loom_value v, void *dst);

#endif /* LOOM_ENGINE_PROGRAM_INTERNAL_H */
