/*
 * engine/cpu/dense.c — CPU GEMM and linear forward for f32 and f64 from
 * dense_impl.h. Matrix products go to OpenBLAS.
 */
#include <math.h>
#include <string.h>

#include <cblas.h>

#include "engine/cpu/cpu_internal.h"
#include "engine/cpu/kernels.h"

/* Multiply-adds below which a GEMM is not worth splitting over threads. */
#define LOOM_CPU_GEMM_PAR_MIN (1 << 21)

#define T float
#define SFX f32
#define CBLAS_GEMM loom_cpu_sgemm_cblas
#include "engine/cpu/dense_impl.h"
#undef T
#undef SFX
#undef CBLAS_GEMM

#define T double
#define SFX f64
#define CBLAS_GEMM cblas_dgemm
#include "engine/cpu/dense_impl.h"
#undef T
#undef SFX
#undef CBLAS_GEMM
