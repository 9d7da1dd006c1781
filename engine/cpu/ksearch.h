/*
 * engine/cpu/ksearch.h — the kernel each convolution and product node runs,
 * chosen when the plan is made by timing the candidates on the node's own
 * shape (as cuDNN's Find does on a GPU), cached per shape and thread count
 * for the life of the process (ksearch.c).
 */
#ifndef LOOM_ENGINE_CPU_KSEARCH_H
#define LOOM_ENGINE_CPU_KSEARCH_H

#include <stddef.h>

#include "engine/cpu/conv_dnnl.h"
#include "engine/cpu/matmul_dnnl.h"
#include "engine/plan.h"

typedef enum loom_cpu_kern {
	LOOM_CPU_KERN_NONE = 0,     /* not a searched node */
	LOOM_CPU_KERN_IM2COL,       /* conv: loom's im2col + GEMM (conv_impl.h) */
	LOOM_CPU_KERN_DNNL_NCHW,    /* conv: oneDNN's convolution on NCHW itself */
	LOOM_CPU_KERN_DNNL_BLOCKED, /* conv: oneDNN's convolution in its blocked
				     * layouts, reordered inside the node */
	LOOM_CPU_KERN_SGEMM,        /* product: loom's split of the GEMM over
				     * its threads (cpu_path.c's sgemm) */
	LOOM_CPU_KERN_MATMUL,       /* product: oneDNN's matmul primitive */
	LOOM_CPU_KERN_COUNT
} loom_cpu_kern;

/* How a node's kernel was chosen. */
typedef enum loom_cpu_kern_how {
	LOOM_CPU_KERN_MEASURED,  /* timed now */
	LOOM_CPU_KERN_CACHED,    /* timed earlier in this process, same shape and threads */
	LOOM_CPU_KERN_FIXED,     /* the fixed default: the search is off */
	LOOM_CPU_KERN_FORCED,    /* LOOM_CPU_CONV / LOOM_CPU_PRODUCT named it */
	LOOM_CPU_KERN_OVER,      /* the fixed default: the search's budget was spent */
} loom_cpu_kern_how;

/* One node's kernel and what it needs at run time. */
typedef struct loom_cpu_node_kern {
	loom_cpu_kern kern;
	loom_cpu_kern_how how;
	loom_cpu_dnnl_conv *conv;  /* DNNL_NCHW / DNNL_BLOCKED */
	loom_cpu_dnnl_matmul *mm;  /* MATMUL */
	double ms[LOOM_CPU_KERN_COUNT]; /* each candidate's best time; 0: not timed */
} loom_cpu_node_kern;

const char *loom_cpu_kern_name(loom_cpu_kern k);

/* The candidates node v can run (conv and product nodes whose kernel runs
 * in f32), in the order the search tries them; 0 for any other node. */
int loom_cpu_kern_candidates(const loom_plan *p, loom_value v, loom_cpu_kern *out);

/* Makes candidate k for node v into *nk (its oneDNN primitive if it has
 * one); -1 where this machine has no such kernel for the node. */
int loom_cpu_kern_make(const loom_plan *p, loom_value v, loom_cpu_kern k, loom_cpu_node_kern *nk);
void loom_cpu_kern_release(loom_cpu_node_kern *nk);

/* Bytes of workspace (64-byte aligned) nk needs for node v. */
size_t loom_cpu_kern_ws(const loom_plan *p, loom_value v, const loom_cpu_node_kern *nk);

/* Runs node v on nk: src are the node's f32 sources, out its f32 result
 * (a linear's fused relu is the caller's), ws nk's workspace. 0 on
 * success, -1 if a library failed (the caller may run loom's kernel). */
int loom_cpu_kern_run(const loom_plan *p, loom_value v, const loom_cpu_node_kern *nk,
		      void *const *src, void *out, void *ws);

/* The search's rule, given each kernel's best time (ms, indexed by kernel;
 * 0: not timed) and the node's fixed default def: the fastest timed kernel
 * (the first of equal times), unless def was timed and the fastest is not
 * at least 10% faster than it (ms > 0.9 * ms[def]): then def; def too
 * where none was timed. Pure: loom_cpu_kern_plan's measured choice is
 * this of the times it records (loom_cpu_node_kern.ms). */
loom_cpu_kern loom_cpu_kern_choose(const double ms[LOOM_CPU_KERN_COUNT], loom_cpu_kern def);

/*
 * Chooses the kernel of every node of plan's steps into kern[] (g->n
 * entries, zeroed by the caller): measured under plan->opts.kernel_search
 * (LOOM_KERNEL_SEARCH=off or =on in the environment decides instead),
 * within the budget plan->opts.kernel_search_ms. err gets a message on
 * failure (a bad LOOM_CPU_CONV / LOOM_CPU_PRODUCT, no memory).
 */
loom_status loom_cpu_kern_plan(const loom_plan *p, loom_cpu_node_kern *kern, char *err);

/* The kernel node v would get with its activations NCHW (forced, the
 * fixed default, or measured and cached as loom_cpu_kern_plan does): what
 * the format pass asks before the plan is made. NONE: not a searched node. */
loom_cpu_kern loom_cpu_kern_choice(const loom_plan *p, loom_value v);

/* One line on node v's kernel for --dump-graph ("" for other nodes). */
void loom_cpu_kern_note(const loom_plan *p, loom_value v, const loom_cpu_node_kern *nk,
			char *buf, size_t len);

#endif /* LOOM_ENGINE_CPU_KSEARCH_H */
