/*
 * amp/scaler.h — the dynamic loss scale (apex / torch GradScaler semantics).
 * The optimizers (engine/cpu/optim.c, engine/cuda/optim.cu) check the
 * gradients for inf/NaN, ask loom_scaler_update whether to apply, and unscale
 * each gradient as they apply it.
 *
 * The update is a pure function of (state, found_inf): no globals, no
 * allocation, only float and integer arithmetic. It is defined once, below,
 * as a static inline function that nvcc compiles for host and device: the
 * CUDA kernel that decides the step without a host sync and the CPU
 * optimizer run the same lines.
 */
#ifndef LOOM_AMP_SCALER_H
#define LOOM_AMP_SCALER_H

#include <stdint.h>

#ifdef __CUDACC__
#define LOOM_SCALER_HD __host__ __device__
#else
#define LOOM_SCALER_HD
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_SCALER_INIT_SCALE 65536.0f      /* 2^16, as apex and torch */
#define LOOM_SCALER_GROWTH_INTERVAL 2000
#define LOOM_SCALER_GROWTH_FACTOR 2.0f
#define LOOM_SCALER_BACKOFF_FACTOR 0.5f
#define LOOM_SCALER_MAX_SCALE 16777216.0f    /* 2^24, apex's cap */

/*
 * Plain data, so it can be copied to the device, checkpointed and compared
 * across ranks as it is. float, not double: the scale multiplies an fp32 loss
 * and is a power of two, which float holds exactly down to 2^-149.
 */
typedef struct loom_scaler {
	float scale;              /* the loss is multiplied by this */
	float growth_factor;      /* 2 */
	float backoff_factor;     /* 0.5 */
	float max_scale;          /* growth never goes past this: 2^24 */
	int32_t growth_tracker;   /* clean steps since the scale last changed */
	int32_t growth_interval;  /* clean steps before growing: 2000 */
	int32_t dynamic;          /* 0: a static scale that never changes */
	int32_t pad_;             /* keeps the layout the same on host and device */
	int64_t skipped_steps;    /* updates skipped for inf/NaN gradients */
	int64_t below_one_steps;  /* updates that left a dynamic scale below 1 */
} loom_scaler;

/*
 * Sets s to a fresh state: scale init_scale, apex's factors and cap.
 * A dynamic init_scale above the cap is clamped to it. growth_interval is
 * ignored when dynamic is 0. Returns 0 (LOOM_OK), or 1 (LOOM_ERR_INVALID)
 * for a null s, an init_scale that is not finite and > 0, or a dynamic
 * growth_interval < 1; s is then left untouched.
 */
int loom_scaler_init(loom_scaler *s, float init_scale, int32_t growth_interval,
		     int dynamic);

/*
 * Records one step whose gradients were (found_inf != 0) or were not
 * non-finite. Returns 1 when the optimizer step must be applied, 0 when it
 * must be skipped.
 * - inf/NaN: skip, reset the growth count, and (dynamic) multiply the scale
 *   by backoff_factor. There is no floor, as in apex, except that the scale
 *   never becomes 0: a backoff that would underflow keeps the old scale.
 *   A static scale skips too (unlike apex, which then applies inf into the
 *   weights) but never changes.
 * - clean: apply; (dynamic) after growth_interval consecutive clean steps
 *   multiply the scale by growth_factor, capped at max_scale, and reset the
 *   count.
 */
int loom_scaler_update(loom_scaler *s, int found_inf);

/* loom_scaler_update's body, for the host and (nvcc) the device. */
static inline LOOM_SCALER_HD int loom_scaler_update_inline(loom_scaler *s, int found_inf)
{
	int apply = 1;

	if (found_inf) {
		if (s->dynamic) {
			float next = s->scale * s->backoff_factor;

			/* no floor (apex has none), but 0 would make every
			 * later gradient 0 and its unscale 0 * inf */
			if (next > 0.0f)
				s->scale = next;
		}
		s->growth_tracker = 0;
		s->skipped_steps++;
		apply = 0;
	} else if (s->dynamic) {
		int32_t clean = s->growth_tracker + 1;

		if (clean >= s->growth_interval) {
			float next = s->scale * s->growth_factor;

			s->scale = next < s->max_scale ? next : s->max_scale;
			clean = 0;
		}
		s->growth_tracker = clean;
	}
	if (s->dynamic && s->scale < 1.0f)
		s->below_one_steps++;
	return apply;
}

/*
 * True when a dynamic scale has collapsed below 1: gradients overflow even
 * unscaled, so halving again will not help. The caller then reports which op
 * first produced a non-finite value. A static scale never counts as collapsed.
 */
int loom_scaler_collapsed(const loom_scaler *s);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_AMP_SCALER_H */
