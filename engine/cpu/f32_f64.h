/*
 * engine/cpu/f32_f64.h — writes a kernel file's f32 and f64 kernels from
 * one text: includes LOOM_CPU_TEMPLATE_FILE twice with LOOM_CPU_TEMPLATE
 * defined, T float and SFX f32, then T double and SFX f64. The file's
 * kernels sit under #else of its #ifndef LOOM_CPU_TEMPLATE. No include
 * guard: each kernel file includes it once, after defining
 * LOOM_CPU_TEMPLATE_FILE as its own path.
 */
#define LOOM_CPU_TEMPLATE
#define T float
#define SFX f32
#include LOOM_CPU_TEMPLATE_FILE
#undef T
#undef SFX
#define T double
#define SFX f64
#include LOOM_CPU_TEMPLATE_FILE
#undef T
#undef SFX
#undef LOOM_CPU_TEMPLATE
#undef LOOM_CPU_TEMPLATE_FILE
