/*
 * engine/program_internal.h — what a compiled program holds: the rewritten
 * graph, its memory plan, the backend that runs it, the parameter slots the
 * optimizer walks, and the run-time state (step, learning rate, loss scale).
 */
#ifndef LOOM_ENGINE_PROGRAM_INTERNAL_H
#define LOOM_ENGINE_PROGRAM_INTERNAL_H

#include <stdarg.h>

#include "amp/scaler.h"
#include "graph/graph_internal.h"
#include "graph/memplan.h"
#include "loom.h"

typedef struct loom_program loom_program;

/*
 * A backend: a table of functions plus a context (ggml style). The executor
 * in program.c owns the plan; a backend owns memory and kernels.
 */
typedef struct loom_backend {
	const char *name;
	/* Allocates the arena regions (p->persist, p->act, p->ws, p->state)
	 * with the sizes in p, and picks per-node algorithms. */
	loom_status (*prepare)(loom_program *p);
	void (*release)(loom_program *p);
	/* Runs nodes [first, last) in training (train != 0) or eval mode. */
	loom_status (*run_nodes)(loom_program *p, int first, int last, int train);
	/* The fused unscale + overflow check + optimizer update over all
	 * parameters; skips everything on overflow (dynamic scaling). */
	loom_status (*optim_step)(loom_program *p);
	/* Copies between host memory and an arena address. */
	loom_status (*upload)(loom_program *p, void *dst, const void *src, size_t bytes);
	loom_status (*download)(loom_program *p, void *dst, const void *src, size_t bytes);
	/* Bytes of scratch node v needs (0 if none). */
	size_t (*workspace)(loom_program *p, loom_value v);
	/* Capabilities the planner may use. */
	int fuses_relu_pool; /* max-pool honours attrs.pool.relu (graph/fuse.c) */
	/* run_nodes makes a node's siblings (made_by, graph/fuse.c) when it
	 * runs the node, and skips them at their own place. */
	int fuses_siblings;
	int fuses_linear_relu; /* LINEAR honours attrs.mm.relu (graph/fuse.c) */
} loom_backend;

/* One trainable parameter as the optimizer sees it. */
typedef struct loom_param_slot {
	loom_value param;   /* the value the model reads (f16 under O2) */
	loom_value grad;    /* its gradient, same dtype */
	loom_value master;  /* O2: the f32 master weight, else LOOM_NONE */
	int64_t numel;
	size_t state_off[2]; /* optimizer state in p->state: SGD buf / Adam m, v */
	loom_dtype state_dtype;
} loom_param_slot;

struct loom_program {
	loom_graph *g; /* owned: the user's graph + AMP casts + backward */
	loom_value loss;
	int n_fwd;                /* nodes [0, n_fwd) are the forward pass */
	uint64_t fingerprint;     /* of the user's graph and the options */
	loom_compile_opts opts;
	loom_memplan mp;

	const loom_backend *be;
	void *be_ctx;
	unsigned char *persist, *act, *ws, *state; /* arena regions */
	size_t ws_bytes, state_bytes, master_bytes;

	loom_param_slot *params;
	int n_params;

	double lr;
	int64_t step;
	loom_scaler scaler;
	int scaling; /* dynamic or static loss scaling is on */
	int diagnose;               /* check each node for inf/NaN as it runs */
	loom_value first_nonfinite; /* the first node found non-finite */
	char amp_report[256];       /* what diagnose found, for the user */

	double last_loss;
	char backend_name[128];
	char err[512];
};

static inline void *loom_value_ptr(const loom_program *p, loom_value v)
{
	unsigned char *base = p->mp.region[v] == LOOM_REGION_PERSIST ? p->persist : p->act;
	return base + p->mp.offset[v];
}

static inline size_t loom_value_bytes(const loom_program *p, loom_value v)
{
	const loom_node *n = &p->g->nodes[v];
	return (size_t)loom_shape_numel(&n->shape) * loom_dtype_size(n->dtype);
}

/* Node v's first sibling, then the one after w (LOOM_NONE: no more). */
static inline loom_value loom_sibling_first(const loom_program *p, loom_value v)
{
	return p->mp.sibling ? p->mp.sibling[v] : LOOM_NONE;
}

static inline loom_value loom_sibling_next(const loom_program *p, loom_value w)
{
	return p->mp.sibling_next[w];
}

/* Made at an earlier node (so skipped at its own place)? */
static inline int loom_made_earlier(const loom_program *p, loom_value v)
{
	loom_value u = p->g->nodes[v].made_by;
	return u != LOOM_NONE && u < v;
}

/* Records a message on p and returns st. */
loom_status loom_program_fail(loom_program *p, loom_status st, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

extern const loom_backend loom_cpu_backend;

/* The CUDA backend, or NULL in a build without one. */
const loom_backend *loom_cuda_backend_get(void);

/* Host-side initialisation of parameters and buffers (PyTorch's defaults),
 * into a host buffer of the value's dtype. */
void loom_init_value(const loom_graph *g, loom_value v, void *dst);

#endif /* LOOM_ENGINE_PROGRAM_INTERNAL_H */
