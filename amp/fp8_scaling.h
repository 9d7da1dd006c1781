/*
 * amp/fp8_scaling.h — the per-tensor scales of FP8 training (amp.fp8) as
 * plan values: for every scaled tensor (an FP8_QDQ node that rounds through
 * E4M3 or E5M2; the node keeps its index in a.fp8.slot) the scale it casts
 * with, the amax and saturation count of the step in progress and of the
 * last one, and, under delayed scaling, an amax history of history_len
 * steps. Like the loss scaler (amp/scaler.h) the state lives in the
 * training state, is updated once per step in the optimizer's step-end
 * block (engine/exec.c, beside the loss scaler's update), checkpointed
 * (io/checkpoint.c) and the same on every rank (amaxes max-reduced first).
 *
 * Every run in training mode (TRAIN, and GRAD, FORWARD and ACCUMULATE,
 * whose amaxes wait for the next update) records; evaluation runs cast
 * with the scales and record nothing. A program without an optimizer step
 * (inference) has no step end and casts by current scaling.
 *
 * The update of one tensor is a static inline function of plain data, so a
 * device kernel runs the same lines (LOOM_SCALER_HD, and base/fp8.h's
 * loom_fp8_scale is LOOM_FP8_HD): the CUDA backend keeps the state on the
 * device under delayed scaling (engine/cuda/fp8.cu, the backend's
 * loom_backend_fp8 group) and ts.fp8 is then its host view, brought back
 * for the report and checkpoints.
 */
#ifndef LOOM_AMP_FP8_SCALING_H
#define LOOM_AMP_FP8_SCALING_H

#include <stdint.h>

#include "amp/scaler.h" /* LOOM_SCALER_HD */
#include "base/fp8.h"   /* loom_fp8_scale */

#ifdef __cplusplus
extern "C" {
#endif

/* Transformer Engine's DelayedScaling has amax_history_len 1024 by default
 * but its examples and recipes train with 16; 16 steps follow a tensor that
 * grows within a few steps and hold one outlier step for 16. */
#define LOOM_FP8_HISTORY_DEFAULT 16
#define LOOM_FP8_HISTORY_MAX 1024
#define LOOM_FP8_MARGIN_MAX 32

/* One scaled tensor. */
typedef struct loom_fp8_tensor {
	float scale;       /* delayed: what the next step casts with (1 before the first step) */
	float amax;        /* the step in progress: max |x| over its runs (micro-steps) so far */
	float last_amax;   /* the last finished step's (max-reduced over the ranks) */
	float last_scale;  /* the scale the last finished step cast with (its last run's) */
	float cur_scale;   /* the step in progress: the scale its last run cast with */
	int32_t fmt;       /* LOOM_FP8_E4M3 or LOOM_FP8_E5M2 (a loom_dtype) */
	float fmax;        /* that format's largest finite value */
	int64_t saturated; /* the step in progress: values clamped to the format's largest */
	int64_t last_saturated; /* the last finished step's, summed over the ranks */
} loom_fp8_tensor;

/* Every scaled tensor of a plan (n 0: fp8 off). */
typedef struct loom_fp8_state {
	int n;
	int delayed;      /* 1: delayed scaling, 0: current (each cast from its own amax) */
	int history_len;  /* delayed: steps of history per tensor */
	int margin;       /* delayed: the scale is divided by 2^margin */
	int filled;       /* steps in the history so far (at most history_len) */
	int pos;          /* the ring's next entry */
	loom_fp8_tensor *t;
	float *history;   /* n * history_len amaxes, tensor i's at i * history_len */
	int *node;        /* per tensor, its FP8_QDQ node */
} loom_fp8_state;

/* Allocates n tensors' state (history_len entries each under delayed),
 * scales 1, histories empty. 0, or 1 when out of memory. */
int loom_fp8_state_init(loom_fp8_state *s, int n, int delayed, int history_len, int margin);
void loom_fp8_state_free(loom_fp8_state *s);
/* Bytes the state holds (the memory report). */
size_t loom_fp8_state_bytes(const loom_fp8_state *s);

/*
 * The scale tensor i casts with this run: under delayed scaling with a
 * history, the history's; else (current scaling, or the first step, whose
 * history is empty) the tensor's own amax's.
 */
static inline int loom_fp8_uses_history(const loom_fp8_state *s)
{
	return s->delayed && s->filled > 0;
}

/* Delayed scaling's scale from an amax: TE's 2^(floor(log2(fmax / amax)) -
 * margin), a power of two (loom_fp8_scale without the margin). */
static inline LOOM_SCALER_HD float loom_fp8_delayed_scale(float amax, float fmax, int margin)
{
	float s = loom_fp8_scale(amax, fmax);
	for (int i = 0; i < margin && s > 0x1p-126f; i++)
		s *= 0.5f;
	return s;
}

/*
 * Step end for tensor i (after the amaxes were max-reduced over the ranks):
 * the step's amax into the history's entry pos (a non-finite amax, from an
 * overflowing step, enters as 0: it says nothing of the range), the next
 * scale from the history's max, and the step's counters into last_*.
 * filled is the count after this step's entry.
 */
static inline LOOM_SCALER_HD void loom_fp8_tensor_step_end(loom_fp8_tensor *t, float *hist,
							   int len, int pos, int filled,
							   int delayed, int margin)
{
	float a = t->amax;
	t->last_amax = a;
	t->last_scale = t->cur_scale;
	t->last_saturated = t->saturated;
	t->amax = 0;
	t->saturated = 0;
	if (!delayed)
		return;
	hist[pos] = a <= 3.4028234663852886e38f ? a : 0.0f;
	float m = 0;
	for (int k = 0; k < filled; k++)
		m = hist[k] > m ? hist[k] : m;
	t->scale = loom_fp8_delayed_scale(m, t->fmax, margin);
}

/* Step end for every tensor, and the ring advanced. */
void loom_fp8_step_end(loom_fp8_state *s);

/*
 * Checkpoints: the state as f32 values, and back. Layout: filled, pos, then
 * per tensor scale, last_amax, last_scale, last_saturated (as a float: a
 * count the report shows, exact to 2^24) and its history_len entries.
 * loom_fp8_state_unpack checks what it reads (filled and pos in range,
 * scales positive powers of two, amaxes finite and >= 0) and changes
 * nothing on a refusal: 1, with a message in err.
 */
size_t loom_fp8_state_floats(const loom_fp8_state *s);
void loom_fp8_state_pack(const loom_fp8_state *s, float *out);
int loom_fp8_state_unpack(loom_fp8_state *s, const float *in, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_AMP_FP8_SCALING_H */
