/*
 * engine/cpu/optim.h — the optimizer step on host memory: the overflow check,
 * the unscale, the loss-scale decision and the SGD / AdamW update over all
 * parameters in one call (the CUDA backend mirrors it on the device).
 */
#ifndef LOOM_ENGINE_CPU_OPTIM_H
#define LOOM_ENGINE_CPU_OPTIM_H

#include "engine/program_internal.h"

/* On the arena a of plan pl; ts's scaler decides, its step advances. */
loom_status loom_optim_step_host(const loom_plan *pl, const loom_arena *a, loom_train_state *ts);

#endif /* LOOM_ENGINE_CPU_OPTIM_H */
