/*
 * engine/cpu/conv_dnnl.h — one convolution node (forward, data gradient or
 * filter gradient) as a oneDNN convolution primitive, built once when the
 * plan is made and run on loom's NCHW buffers at every step.
 */
#ifndef LOOM_ENGINE_CPU_CONV_DNNL_H
#define LOOM_ENGINE_CPU_CONV_DNNL_H

#include <stddef.h>

#include "graph/ops/geometry.h"

typedef enum loom_cpu_conv_kind {
	LOOM_CPU_CONV_FWD,        /* y = conv(x, w) + b: run(x, w, b, y) */
	LOOM_CPU_CONV_BWD_DATA,   /* dx from dy and w: run(dy, w, NULL, dx) */
	LOOM_CPU_CONV_BWD_FILTER, /* dw from dy and x: run(dy, x, NULL, dw) */
} loom_cpu_conv_kind;

typedef struct loom_cpu_dnnl_conv loom_cpu_dnnl_conv;

/*
 * The primitive for shape s, or NULL where oneDNN offers none (or the CPU
 * path is the portable one). bf16: the two tensor sources are bf16 bit
 * patterns, the result stays f32 (fp32 accumulation). bias: a forward with
 * an f32 bias. blocked: let oneDNN choose its own layouts and reorder from
 * and to NCHW inside each run; else oneDNN works on NCHW itself (its own
 * im2col + GEMM there). Both are candidates of the kernel search (ksearch.c).
 * The batch is split into one slice per thread (conv_dnnl.c).
 */
loom_cpu_dnnl_conv *loom_cpu_dnnl_conv_new(loom_cpu_conv_kind kind, const loom_conv_shape *s,
					   int bf16, int bias, int blocked);
/* The same with the node's activations in their plan formats
 * (graph/formats.c): x (the forward's input and the data gradient) and y
 * (the forward's result and its gradient) each NCHW or, with its bit,
 * nChw8c (channels a multiple of 8: a slice of images stays contiguous). */
enum {
	LOOM_CPU_CONV_X_BLOCKED = 1u << 0,
	LOOM_CPU_CONV_Y_BLOCKED = 1u << 1,
};
loom_cpu_dnnl_conv *loom_cpu_dnnl_conv_new_fmt(loom_cpu_conv_kind kind, const loom_conv_shape *s,
					       int bf16, int bias, int blocked, unsigned fmt);
void loom_cpu_dnnl_conv_free(loom_cpu_dnnl_conv *c);

/* Bytes of workspace a run needs (the blocked copies, oneDNN's scratchpad). */
size_t loom_cpu_dnnl_conv_ws(const loom_cpu_dnnl_conv *c);

/* Runs it on the caller's OpenMP threads, with ws (64-byte aligned) of
 * loom_cpu_dnnl_conv_ws bytes; 0 on success, -1 if oneDNN failed. */
int loom_cpu_dnnl_conv_run(loom_cpu_dnnl_conv *c, const void *a, const void *b,
			   const float *bias, float *out, void *ws);

/* oneDNN's name for the implementation it chose (e.g. "jit:avx512_core"). */
const char *loom_cpu_dnnl_conv_impl(const loom_cpu_dnnl_conv *c);

#endif /* LOOM_ENGINE_CPU_CONV_DNNL_H */
