/*
 * engine/cpu/bn.c — CPU batch norm (training and eval forward, backward data
 * and gamma) and per-channel sums, for f32 and f64 from bn_impl.h.
 */
#include <math.h>

#include "engine/cpu/cpu_internal.h"
#include "engine/cpu/kernels.h"

/* Values summed in the element type before going into a double. */
#define LOOM_CPU_BN_BLOCK 1024

#define T float
#define SFX LOOM_CPU_F32
#include "engine/cpu/bn_impl.h"
#undef T
#undef SFX

/* f64 (gradient checks) only in the baseline copy. */
#define LOOM_CPU_TEMPLATE_FILE "engine/cpu/bn_impl.h"
#include "engine/cpu/f64_base.h"
