/*
 * engine/cpu/ops.h — the CPU backend's entry points, one per op (a
 * loom_cpu_op row of backend.c's table), defined in the file of its
 * family. An entry unpacks the node's shapes and attributes and calls its
 * kernel (kernels.h) in the node's kernel dtype.
 */
#ifndef LOOM_ENGINE_CPU_OPS_H
#define LOOM_ENGINE_CPU_OPS_H

#include "engine/cpu/bn_dnnl.h"
#include "engine/cpu/ksearch.h"
#include "engine/cpu/pool_dnnl.h"
#include "engine/cpu/kernels.h"
#include "engine/backend.h"

/*
 * A node's side buffer: what its forward leaves for its backward (max
 * pooling's argmax, batch norm's statistics) in the plan's workspace
 * region, after the scratch every node shares (side.c). The forward node
 * owns it and its primitives; each backward node names its forward.
 */
typedef enum loom_cpu_side_kind {
	LOOM_CPU_SIDE_NONE = 0,
	LOOM_CPU_SIDE_POOL_DNNL, /* oneDNN's max pooling, its workspace kept */
	LOOM_CPU_SIDE_BN_DNNL,   /* oneDNN's batch norm, mean and variance kept (f32) */
	LOOM_CPU_SIDE_BN_SAVED,  /* loom's batch norm loops, mean and variance kept (f64) */
} loom_cpu_side_kind;

typedef struct loom_cpu_node_side {
	loom_cpu_side_kind kind;
	loom_value owner;        /* the forward node whose buffer this is (itself on it) */
	size_t off, bytes;       /* the owner's: from the side region's start */
	loom_cpu_dnnl_pool *pool; /* the owner's */
	loom_cpu_dnnl_bn *bn;
	unsigned run;            /* the owner's: the run that last wrote it */
} loom_cpu_node_side;

/* The CPU backend's context: the program's arena (the one copy of its
 * addresses, which the program owns), the current run's mode, errors. */
typedef struct loom_cpu_ctx {
	unsigned char *base; /* the one allocation behind the arena */
	const loom_arena *arena;
	int train;           /* this run is in training mode */
	float seed_scale;    /* this run's loss scale, for GRAD_SEED */
	loom_fp8_state *fp8; /* this run's fp8 scales (the training state's) */
	/* Per node: the kernel of each conv and product node, chosen when
	 * the plan is made (ksearch.c), with its oneDNN primitive if any. */
	loom_cpu_node_kern *kern;
	int n_kern;
	unsigned flags;              /* this run's LOOM_EXEC_* */
	unsigned char *accum_base;   /* the allocation behind arena->accum */
	double *timer;               /* trace timers (loom_trace_now() seconds) */
	int n_timer;
	int spin_held;               /* loom_cpu_spin_step_begin called by this run */
	loom_cpu_node_side *side;    /* per node (side.c); NULL: none planned */
	int n_side;
	size_t side_base;            /* where the side buffers start in the workspace */
	unsigned run;                /* counts runs: a side buffer written in this one */
	char err[LOOM_ERR_MAX];
} loom_cpu_ctx;

/* The buffers one node runs on: its sources and output, already widened
 * to f32 scratch where the node reads or writes half (backend.c), and the
 * node's workspace. */
typedef struct loom_cpu_io {
	void *src[LOOM_MAX_SRC];
	void *out;
	void *ws;
} loom_cpu_io;

/* An op's entry: runs node v on its buffers. */
typedef loom_status loom_cpu_op_entry(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				      const loom_cpu_io *io);
typedef loom_cpu_op_entry *loom_cpu_op_fn;

/*
 * One op on the CPU: backend.c's table holds one per op (NULL: the CPU
 * cannot run it). A family file (layernorm.c, attention.c, ...) defines
 * the rows of its ops as `const loom_cpu_op loom_cpu_<op>`, declared only
 * next to backend.c's table; the older families (ops_<family>.c) export
 * their run functions, declared below, and backend.c makes their rows.
 */
typedef struct loom_cpu_op {
	loom_cpu_op_fn run;
	/* (optional) bytes of kernel workspace node v needs in elements of
	 * elem bytes; backend.c sizes the plan's workspace from it and puts
	 * the half emulation's f32 copies after it. */
	size_t (*ws)(const loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v, size_t elem);
	/* (optional) runs node v straight on its bf16 arrays (half: bit i
	 * LOOM_CPU_BF16_SRC(i) for a bf16 source i, LOOM_CPU_BF16_OUT for a
	 * bf16 result; never 0; the other floats f32), fp32 inside and the
	 * same bits as backend.c's widen / f32 / round emulation; returns 1
	 * with its status in *st, or 0 to decline (the emulation runs). The
	 * workspace holds what ws asked for plus the emulation's f32 copies.
	 * LOOM_CPU_BF16_NATIVE_GPT=0 in the environment: never called. */
	int (*bf16)(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v, const loom_cpu_io *io,
		    unsigned half, loom_status *st);
	/* The entry reads and writes its own dtypes: no half emulation. */
	int raw;
} loom_cpu_op;

/* Node v's node and its source i, for the entries. */
static inline const loom_node *loom_cpu_node(const loom_plan *plan, loom_value v)
{
	return &plan->g->nodes[v];
}

static inline const loom_node *loom_cpu_src(const loom_plan *plan, loom_value v, int i)
{
	return &plan->g->nodes[plan->g->nodes[v].src[i]];
}

/* The dtype node n's kernel runs in: f64 for f64 nodes, f32 for the rest. */
static inline loom_dtype loom_cpu_kernel_dtype(const loom_node *n)
{
	return n->dtype == LOOM_F64 ? LOOM_F64 : LOOM_F32;
}

/* Calls fn_f64 or fn_f32. */
#define LOOM_CPU_DISPATCH(dt, fn, ...)                          \
	do {                                                    \
		if ((dt) == LOOM_F64)                           \
			fn##_f64(__VA_ARGS__);                  \
		else                                            \
			fn##_f32(__VA_ARGS__);                  \
	} while (0)

/* The entries, declared with their one shape, loom_cpu_op_entry, each by
 * its full name so that grep finds it. */
/* backend.c: leaves (set by the caller) and views (the memory planner gave
 * them their source's storage) have nothing to compute. */
loom_cpu_op_entry loom_cpu_op_nothing;

/* ops_conv.c */
loom_cpu_op_entry loom_cpu_op_conv2d;
loom_cpu_op_entry loom_cpu_op_conv2d_bwd_data;
loom_cpu_op_entry loom_cpu_op_conv2d_bwd_filter;
/* Bytes of kernel workspace a conv node needs in elements of elem bytes. */
size_t loom_cpu_conv_workspace(const loom_plan *plan, loom_value v, size_t elem);
/* Node v's kernel workspace: loom_cpu_conv_workspace, or its chosen
 * kernel's (ksearch.c) if larger. */
size_t loom_cpu_conv_node_ws(const loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			     size_t elem);

/* ops_bn.c */
loom_cpu_op_entry loom_cpu_op_batchnorm2d;
loom_cpu_op_entry loom_cpu_op_bn_bwd_data;
loom_cpu_op_entry loom_cpu_op_bn_bwd_gamma;
loom_cpu_op_entry loom_cpu_op_channel_sum;
/* Bytes of workspace a batch-norm node needs: its per-channel sums when it
 * is synchronised over the ranks, else none. */
size_t loom_cpu_bn_workspace(const loom_plan *plan, loom_value v, size_t elem);

/* ln_residual.c: the residual add that makes its layer norm
 * (graph/fuse.c's loom_fuse_ln_residual). fusable: the planning question
 * (LOOM_FUSE_LN_RESIDUAL, dtypes f32/bf16/f16, rows of at most
 * LOOM_CPU_BF16_ROWS); makes_sibling: the executor's (the add's kernel
 * wrote its layer norm); loom_cpu_ln_residual: runs add node v with its
 * layer norm and returns 1, or returns 0 where v makes none. */
int loom_cpu_ln_residual_fusable(const loom_graph *g, loom_value a, loom_value ln);
int loom_cpu_makes_sibling(void *ctx, const loom_plan *plan, loom_value v, loom_value w);
int loom_cpu_ln_residual(const loom_plan *plan, const loom_arena *arena, loom_value v);

/* ln_bwd_accum.c: a row norm's dx (layer norm's, RMS norm's) added into
 * the residual's other gradient (graph/fuse.c's loom_fuse_ln_bwd_accum).
 * fusable: the planning question (LOOM_FUSE_LN_BWD_ACCUM, dtypes
 * f32/bf16/f16, rows of at most LOOM_CPU_BF16_ROWS); loom_cpu_ln_bwd_accum:
 * runs node v, a LAYERNORM_BWD_DATA or RMSNORM_BWD_DATA carrying
 * LOOM_NODE_ACCUM, and returns 1, or returns 0 for any other node. */
int loom_cpu_ln_bwd_accum_fusable(const loom_graph *g, loom_value d, loom_value s, int other);
int loom_cpu_ln_bwd_accum(const loom_plan *plan, const loom_arena *arena, loom_value v);

/* An operand of the fused row kernels (ln_residual.c, ln_bwd_accum.c):
 * node v's bytes in the arena and its dtype, which travel together. */
typedef struct loom_cpu_arr {
	void *p;
	loom_dtype t;
} loom_cpu_arr;

static inline loom_cpu_arr loom_cpu_arr_of(const loom_plan *plan, const loom_arena *arena,
					   loom_value v)
{
	loom_cpu_arr a = { loom_arena_ptr(arena, plan, v), (loom_dtype)plan->g->nodes[v].dtype };
	return a;
}

/* One thread's scratch for the fused row kernels' blocks: f32 arrays of
 * LOOM_CPU_BF16_ROWS elements (f[0], f[1] the block's own), one of
 * f16/bf16 bits (hb); par: the per-column operands widened, in: the
 * block's two row operands widened. */
typedef struct loom_cpu_row_scratch {
	float f[6][LOOM_CPU_BF16_ROWS] __attribute__((aligned(64)));
	uint16_t hb[LOOM_CPU_BF16_ROWS] __attribute__((aligned(64)));
	const float *par[2], *in[2];
} loom_cpu_row_scratch;

/* ln_residual.c: the fused row kernels' driver. rows x c (c at most
 * LOOM_CPU_BF16_ROWS) in blocks of whole rows, at most LOOM_CPU_BF16_ROWS
 * elements each, over the threads from LOOM_CPU_PAR_MIN elements (a static
 * schedule). Each thread widens the npar (at most 2) per-column operands
 * par (c elements: gamma, beta) once into its s->par; for each of its
 * blocks, rows [r0, r0 + nr), the two row operands in[0], in[1] at
 * [r0 c, (r0 + nr) c) into s->in, then block(g, r0, nr, s). */
void loom_cpu_row_blocks(const void *g, int64_t rows, int c, const loom_cpu_arr *par, int npar,
			 const loom_cpu_arr in[2],
			 void (*block)(const void *g, int64_t r0, int64_t nr,
				       loom_cpu_row_scratch *s));

/* norm_bf16.c: the f32 row kernel of a row norm's data gradient node n
 * (layer norm's or RMS norm's, by n's op), the one the norms' entries run. */
loom_cpu_norm_bwd_data_f32 loom_cpu_norm_bwd_data_kernel(const loom_node *n);
/* emb_bwd_accum.c: an embedding's gradient added into the tied table's
 * other gradient (graph/fuse.c's loom_fuse_emb_bwd_accum). fusable: the
 * planning question (LOOM_FUSE_EMB_BWD_ACCUM, dtypes f32/bf16/f16, at
 * most LOOM_CPU_BF16_ROWS columns); ws: the node's workspace (its ids
 * grouped by row; 0 for any other node); loom_cpu_emb_bwd_accum: runs
 * node v, an EMBEDDING_BWD carrying LOOM_NODE_ACCUM, and returns 1, or
 * returns 0 for any other node. */
int loom_cpu_emb_bwd_accum_fusable(const loom_graph *g, loom_value d, loom_value s, int other);
size_t loom_cpu_emb_bwd_accum_ws(const loom_plan *plan, loom_value v);
int loom_cpu_emb_bwd_accum(const loom_plan *plan, const loom_arena *arena, loom_value v);
/* The planning group's ln_bwd_accum_fusable: either of the two above's,
 * by d's op (ln_bwd_accum.c). */
int loom_cpu_bwd_accum_fusable(const loom_graph *g, loom_value d, loom_value s, int other);

/* side.c: plans the side buffers of plan's nodes into ctx->side (the
 * switches LOOM_CPU_DNNL_POOL and LOOM_CPU_DNNL_BN decide which nodes get
 * one); *bytes gets their total. Releases the previous plan's first. */
loom_status loom_cpu_side_plan(loom_cpu_ctx *ctx, const loom_plan *plan, size_t *bytes);
void loom_cpu_side_release(loom_cpu_ctx *ctx);
/* Node v's side entry, or NULL if it has none. */
static inline loom_cpu_node_side *loom_cpu_side_of(loom_cpu_ctx *ctx, loom_value v)
{
	return ctx->side && v < ctx->n_side && ctx->side[v].kind ? &ctx->side[v] : NULL;
}
/* The owner's buffer of entry e in this run's workspace. */
static inline void *loom_cpu_side_ptr(const loom_cpu_ctx *ctx, const loom_cpu_node_side *e)
{
	return ctx->arena->ws + ctx->side_base + ctx->side[e->owner].off;
}
/* One line on node v's side buffer for --dump-graph ("" if none). */
void loom_cpu_side_note(loom_cpu_ctx *ctx, loom_value v, char *buf, size_t len);

/* ops_pool.c */
loom_cpu_op_entry loom_cpu_op_maxpool2d;
loom_cpu_op_entry loom_cpu_op_maxpool2d_bwd;
/* Forward and backward. */
loom_cpu_op_entry loom_cpu_op_global_avgpool;

/* ops_dense.c */
loom_cpu_op_entry loom_cpu_op_linear;
loom_cpu_op_entry loom_cpu_op_matmul;

/* ops_elementwise.c */
loom_cpu_op_entry loom_cpu_op_relu;
loom_cpu_op_entry loom_cpu_op_relu_bwd;
/* Every unary op of graph/unary.h, forward and backward. */
loom_cpu_op_entry loom_cpu_op_unary;
loom_cpu_op_entry loom_cpu_op_add;
loom_cpu_op_entry loom_cpu_op_sum;
loom_cpu_op_entry loom_cpu_op_broadcast;
loom_cpu_op_entry loom_cpu_op_grad_seed;
/* Reads and writes any float dtypes itself (no half emulation around it). */
/* The same values in the node's format (graph/formats.c), any dtype. */
loom_cpu_op_entry loom_cpu_op_reorder;
/* Which formats node v runs in (the backend's node_formats). */
void loom_cpu_node_formats(void *ctx, const loom_plan *plan, loom_value v, loom_format_caps *caps);
loom_cpu_op_entry loom_cpu_op_cast;
/* A cast of n elements between any two float dtypes. */
void loom_cpu_cast(loom_dtype from, const void *src, loom_dtype to, void *dst, int64_t n);

/* Runs node v if it is a bf16 add, relu, GELU, max pooling or their
 * backward whose sources are all bf16, with the fused bf16 kernels of
 * kernels.h (the same bits as backend.c's widen / f32 / round path), and
 * returns 1; else 0.
 * LOOM_CPU_BF16_NATIVE_EW=0 in the environment: always 0 (the old path). */
int loom_cpu_ew_bf16_native(const loom_plan *plan, loom_value v, const loom_cpu_io *io);

/* accum.c: gradient accumulation on segment s of plan->accum: add it into
 * its sum, or (fold) add the sum into it and clear the sum. */
void loom_cpu_accum(const loom_plan *plan, const loom_arena *arena, int s, int fold);

#endif /* LOOM_ENGINE_CPU_OPS_H */
