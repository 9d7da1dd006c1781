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

#define LOOM_CPU_TEMPLATE_FILE "engine/cpu/dense_impl.h"
#include "engine/cpu/f32_f64.h"
