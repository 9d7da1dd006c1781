/*
 * engine/cpu/optim.h — the optimizer step on host memory: the overflow check,
 * the unscale, the loss-scale decision and the SGD / AdamW update over all
 * parameters in one call (the CUDA backend mirrors it on the device).
 */
#ifndef LOOM_ENGINE_CPU_OPTIM_H
#define LOOM_ENGINE_CPU_OPTIM_H

#include "engine/plan.h"

/* Pieces [first, last) of plan pl on the arena a; ts's scaler decides (on
 * finite: 0 or 1, or -1 to check the pieces here), its step advances. */
loom_status loom_optim_step_host(const loom_plan *pl, const loom_arena *a, loom_train_state *ts,
				 int first, int last, int finite);

/* The sum of squares of pieces [first, last)'s gradients times inv, in
 * f64, in a fixed order (the same on every rank). */
double loom_optim_grad_sumsq_host(const loom_plan *pl, const loom_arena *a, double inv, int first,
				  int last);

/* Whether the gradients of pieces [first, last) hold no inf/NaN. */
int loom_optim_grads_finite_host(const loom_plan *pl, const loom_arena *a, int first, int last);

#endif /* LOOM_ENGINE_CPU_OPTIM_H */
