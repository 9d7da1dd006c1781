/*
 * engine/cpu/pool_dnnl.h — a max pooling node on nChw8c f32 values as
 * oneDNN's pooling primitives (forward training with its workspace, the
 * window's argmax, and the backward that reads it), made once when the plan
 * is made and run at every step. The workspace lives from the forward to
 * the backward in the node's side buffer, which the backend places in the
 * plan's workspace region (backend.c).
 */
#ifndef LOOM_ENGINE_CPU_POOL_DNNL_H
#define LOOM_ENGINE_CPU_POOL_DNNL_H

#include <stddef.h>

#include "graph/ops/geometry.h"

typedef struct loom_cpu_dnnl_pool loom_cpu_dnnl_pool;

/* The primitives for shape s (its fused relu included: a relu post-op
 * forward, and dx masked by x > 0 after the backward, which is what the
 * fused backward computes: a position gets gradient only as some window's
 * max, and then that max is its own value). NULL where oneDNN offers none,
 * or on the portable path. The batch is split into one slice per thread,
 * each slice's primitives made for one thread (as conv_dnnl.c). */
loom_cpu_dnnl_pool *loom_cpu_dnnl_pool_new(const loom_pool_shape *s);
void loom_cpu_dnnl_pool_free(loom_cpu_dnnl_pool *p);

/* Bytes of side buffer (64-byte aligned) the pair needs: every slice's
 * workspace and scratchpad. */
size_t loom_cpu_dnnl_pool_side(const loom_cpu_dnnl_pool *p);

/* y from x, the argmax into side. 0 on success, -1 if oneDNN failed. */
int loom_cpu_dnnl_pool_fwd(loom_cpu_dnnl_pool *p, const float *x, float *y, void *side);
/* dx from dy and the argmax the forward left in side (x: the forward's
 * input, read only under a fused relu). 0 on success, -1 if oneDNN failed. */
int loom_cpu_dnnl_pool_bwd(loom_cpu_dnnl_pool *p, const float *x, const float *dy, float *dx,
			   void *side);

/* oneDNN's name for the forward's implementation ("jit:avx"). */
const char *loom_cpu_dnnl_pool_impl(const loom_cpu_dnnl_pool *p);

#endif /* LOOM_ENGINE_CPU_POOL_DNNL_H */
