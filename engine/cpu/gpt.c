/*
 * engine/cpu/gpt.c — the transformer kernels of gpt_kernels.h for f32 and
 * f64 from gpt_impl.h. f32 products take the chosen GEMM path (oneDNN or
 * OpenBLAS, cpu_path.c), f64 ones OpenBLAS.
 */
#include <math.h>
#include <string.h>

#include <cblas.h>

#include "engine/cpu/cpu_internal.h"
#include "engine/cpu/gpt_kernels.h"

/* Multiply-adds below which the heads are not worth splitting over threads. */
#define LOOM_CPU_GEMM_PAR_MIN (1 << 21)

#define T float
#define SFX f32
#define CBLAS_GEMM loom_cpu_sgemm_cblas
#include "engine/cpu/gpt_impl.h"
#undef T
#undef SFX
#undef CBLAS_GEMM

#define T double
#define SFX f64
#define CBLAS_GEMM cblas_dgemm
#include "engine/cpu/gpt_impl.h"
#undef T
#undef SFX
#undef CBLAS_GEMM

size_t loom_cpu_layernorm_bwd_gamma_ws(int c)
{
	return sizeof(double) * (size_t)loom_cpu_slots() * (size_t)c;
}

size_t loom_cpu_attn_probs_bwd_ws(int t, size_t elem)
{
	return elem * (size_t)loom_cpu_slots() * (size_t)t * (size_t)t;
}
