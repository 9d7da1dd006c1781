/*
 * engine/cpu/f32_f64.h — writes f32 and f64 kernels from one text:
 * includes LOOM_CPU_TEMPLATE_FILE twice with LOOM_CPU_TEMPLATE defined, T
 * float, SFX f32 and CBLAS_GEMM the f32 GEMM (loom_cpu_sgemm_cblas), then
 * T double, SFX f64 and cblas_dgemm. A family file names itself (its
 * kernels under #else of its #ifndef LOOM_CPU_TEMPLATE), dense.c its
 * dense_impl.h. No include guard: a file includes it once per text.
 */
#define LOOM_CPU_TEMPLATE
#define T float
#define SFX f32
#define CBLAS_GEMM loom_cpu_sgemm_cblas
#include LOOM_CPU_TEMPLATE_FILE
#undef T
#undef SFX
#undef CBLAS_GEMM
#define T double
#define SFX f64
#define CBLAS_GEMM cblas_dgemm
#include LOOM_CPU_TEMPLATE_FILE
#undef T
#undef SFX
#undef CBLAS_GEMM
#undef LOOM_CPU_TEMPLATE
#undef LOOM_CPU_TEMPLATE_FILE
