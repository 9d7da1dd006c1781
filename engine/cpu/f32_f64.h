/*
 * engine/cpu/f32_f64.h — writes f32 and f64 kernels from one text:
 * includes LOOM_CPU_TEMPLATE_FILE twice with LOOM_CPU_TEMPLATE defined, T
 * float, SFX f32 and CBLAS_GEMM the f32 GEMM (loom_cpu_sgemm_cblas), then
 * T double, SFX f64 and cblas_dgemm (f64_base.h's text, in every copy). A
 * family file names itself (its kernels under #else of its #ifndef
 * LOOM_CPU_TEMPLATE), dense.c its dense_impl.h. No include guard: a file
 * includes it once per text.
 */
#define LOOM_CPU_TEMPLATE
#define T float
#define SFX f32
#define CBLAS_GEMM loom_cpu_sgemm_cblas
#include LOOM_CPU_TEMPLATE_FILE
#undef T
#undef SFX
#undef CBLAS_GEMM
#define LOOM_CPU_F64_EVERY_COPY
#include "engine/cpu/f64_base.h"
#undef LOOM_CPU_F64_EVERY_COPY
#undef LOOM_CPU_TEMPLATE
