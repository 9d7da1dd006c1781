/*
 * amp/scaler.c — the loss-scale state machine: initialisation and the
 * out-of-line update. The update's body lives in scaler.h, shared with the
 * one-thread CUDA kernel that decides a step on the device.
 */
#include "amp/scaler.h"

#include <math.h>

int loom_scaler_init(loom_scaler *s, float init_scale, int32_t growth_interval,
		     int dynamic)
{
	if (!s || !isfinite(init_scale) || !(init_scale > 0.0f))
		return 1;
	if (dynamic && growth_interval < 1)
		return 1;
	s->scale = init_scale;
	s->growth_factor = LOOM_SCALER_GROWTH_FACTOR;
	s->backoff_factor = LOOM_SCALER_BACKOFF_FACTOR;
	s->max_scale = LOOM_SCALER_MAX_SCALE;
	s->growth_tracker = 0;
	s->growth_interval = dynamic ? growth_interval : 0;
	s->dynamic = dynamic ? 1 : 0;
	s->pad_ = 0;
	s->skipped_steps = 0;
	s->below_one_steps = 0;
	/* apex clamps growth at the cap; a start above it would otherwise
	 * shrink on the first growth, which reads like a backoff */
	if (s->dynamic && s->scale > s->max_scale)
		s->scale = s->max_scale;
	return 0;
}

int loom_scaler_update(loom_scaler *s, int found_inf)
{
	return loom_scaler_update_inline(s, found_inf);
}

int loom_scaler_collapsed(const loom_scaler *s)
{
	return s->dynamic && s->scale < 1.0f;
}
