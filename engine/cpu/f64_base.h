/*
 * engine/cpu/f64_base.h — the f64 kernels of an instruction-set copy's
 * file (conv.c, bn.c, pool.c, elementwise.c), in the baseline copy only
 * (gradient checks run in f64): includes LOOM_CPU_TEMPLATE_FILE with T
 * double, SFX f64 and CBLAS_GEMM cblas_dgemm where LOOM_CPU_BASE is set
 * (or, from f32_f64.h, LOOM_CPU_F64_EVERY_COPY).
 * No include guard: a file includes it once per text.
 */
#if defined(LOOM_CPU_BASE) || defined(LOOM_CPU_F64_EVERY_COPY)
#define T double
#define SFX f64
#define CBLAS_GEMM cblas_dgemm
#include LOOM_CPU_TEMPLATE_FILE
#undef T
#undef SFX
#undef CBLAS_GEMM
#endif
#undef LOOM_CPU_TEMPLATE_FILE
