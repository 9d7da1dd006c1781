/*
 * engine/cpu/elementwise.c — CPU elementwise kernels and reductions to a
 * scalar (relu, add, sum, broadcast) for f32 and f64 from elementwise_impl.h.
 */
#include "engine/cpu/cpu_internal.h"
#include "engine/cpu/kernels.h"

/* Elements per block of loom_cpu_sum: big enough for SIMD, small enough that
 * the per-block error stays tiny. */
#define LOOM_CPU_SUM_BLOCK 4096

#define T float
#define SFX LOOM_CPU_F32
#include "engine/cpu/elementwise_impl.h"
#undef T
#undef SFX

/* f64 (gradient checks) only in the baseline copy. */
#ifdef LOOM_CPU_BASE
#define T double
#define SFX f64
#include "engine/cpu/elementwise_impl.h"
#undef T
#undef SFX
#endif
