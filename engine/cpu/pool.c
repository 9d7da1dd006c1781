/*
 * engine/cpu/pool.c — CPU 2-D max pooling (forward, backward) for f32 and
 * f64 from pool_impl.h.
 */
#include <math.h>
#include <string.h>

#include "engine/cpu/cpu_internal.h"
#include "engine/cpu/kernels.h"

#define T float
#define SFX LOOM_CPU_F32
#include "engine/cpu/pool_impl.h"
#undef T
#undef SFX

/* f64 (gradient checks) only in the baseline copy. */
#ifdef LOOM_CPU_BASE
#define T double
#define SFX f64
#include "engine/cpu/pool_impl.h"
#undef T
#undef SFX
#endif
