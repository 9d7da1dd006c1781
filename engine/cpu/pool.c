/*
 * engine/cpu/pool.c — CPU 2-D max pooling (forward, backward) for f32 and
 * f64 from pool_impl.h.
 */
#include <math.h>
#include <string.h>

#include "engine/cpu/cpu_internal.h"
#include "engine/cpu/kernels.h"

#define T float
#define SFX f32
#include "engine/cpu/pool_impl.h"
#undef T
#undef SFX

#define T double
#define SFX f64
#include "engine/cpu/pool_impl.h"
#undef T
#undef SFX
