/*
 * engine/cpu/conv.c — CPU 2-D convolution (forward, backward data, backward
 * filter) for f32 and f64, instantiated from conv_impl.h, plus the workspace
 * size the executor reserves for them.
 */
#include <string.h>

#include "engine/cpu/cpu_internal.h"
#include "engine/cpu/kernels.h"

#ifdef LOOM_CPU_BASE
/* One thread's scratch: im2col of one image [K, P], then either the
 * transposed forward output [P, c_out] or a private dw^T [K, c_out]
 * (bwd_filter). Rounded to a cache line so slots never share one. */
size_t loom_cpu_conv_slot_bytes(const loom_conv_shape *s, size_t elem)
{
	size_t k = (size_t)s->c_in * s->kh * s->kw;
	size_t p = (size_t)s->h_out * s->w_out;
	size_t tail = (p > k ? p : k) * (size_t)s->c_out;
	size_t padded = (size_t)(s->h_in + 2 * s->pad) * (s->w_in + 2 * s->pad);
	size_t bytes = elem * (k * p + tail + padded);
	return (bytes + 63) & ~(size_t)63;
}

size_t loom_cpu_conv2d_workspace(const loom_conv_shape *s, size_t elem)
{
	return loom_cpu_conv_slot_bytes(s, elem) * (size_t)loom_cpu_slots();
}
#endif

#define T float
#define SFX LOOM_CPU_F32
#define CBLAS_GEMM loom_cpu_sgemm_cblas
#include "engine/cpu/conv_impl.h"
#undef T
#undef SFX
#undef CBLAS_GEMM

/* f64 (gradient checks) only in the baseline copy. */
#define LOOM_CPU_TEMPLATE_FILE "engine/cpu/conv_impl.h"
#include "engine/cpu/f64_base.h"
