/*
 * amp/fp8_scaling.c — the FP8 scaling state's allocation, step end and
 * checkpoint form (amp/fp8_scaling.h). The per-tensor update is the
 * header's inline body.
 */
#include "amp/fp8_scaling.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int loom_fp8_state_init(loom_fp8_state *s, int n, int delayed, int history_len, int margin)
{
	memset(s, 0, sizeof(*s));
	if (n <= 0)
		return 0;
	s->t = calloc((size_t)n, sizeof(*s->t));
	s->node = calloc((size_t)n, sizeof(*s->node));
	s->history = delayed ? calloc((size_t)n * (size_t)history_len, sizeof(float)) : NULL;
	if (!s->t || !s->node || (delayed && !s->history)) {
		loom_fp8_state_free(s);
		return 1;
	}
	s->n = n;
	s->delayed = delayed;
	s->history_len = delayed ? history_len : 0;
	s->margin = delayed ? margin : 0;
	for (int i = 0; i < n; i++)
		s->t[i].scale = s->t[i].last_scale = s->t[i].cur_scale = 1.0f;
	return 0;
}

void loom_fp8_state_free(loom_fp8_state *s)
{
	free(s->t);
	free(s->node);
	free(s->history);
	memset(s, 0, sizeof(*s));
}

size_t loom_fp8_state_bytes(const loom_fp8_state *s)
{
	return (size_t)s->n * (sizeof(loom_fp8_tensor) + sizeof(int) +
			       (size_t)s->history_len * sizeof(float));
}

void loom_fp8_step_end(loom_fp8_state *s)
{
	if (s->n == 0)
		return;
	int filled = s->delayed && s->filled < s->history_len ? s->filled + 1 : s->filled;
	for (int i = 0; i < s->n; i++)
		loom_fp8_tensor_step_end(&s->t[i], s->delayed ? s->history + (size_t)i * s->history_len : NULL,
					 s->history_len, s->pos, filled, s->delayed, s->margin);
	if (s->delayed) {
		s->filled = filled;
		s->pos = (s->pos + 1) % s->history_len;
	}
}

/* Per tensor: scale, last_amax, last_scale, last_saturated, history. */
#define PER_TENSOR 4

size_t loom_fp8_state_floats(const loom_fp8_state *s)
{
	return 2 + (size_t)s->n * (PER_TENSOR + (size_t)s->history_len);
}

void loom_fp8_state_pack(const loom_fp8_state *s, float *out)
{
	*out++ = (float)s->filled;
	*out++ = (float)s->pos;
	for (int i = 0; i < s->n; i++) {
		const loom_fp8_tensor *t = &s->t[i];
		*out++ = t->scale;
		*out++ = t->last_amax;
		*out++ = t->last_scale;
		*out++ = (float)t->last_saturated;
		for (int k = 0; k < s->history_len; k++)
			*out++ = s->history[(size_t)i * s->history_len + k];
	}
}

/* A positive, finite power of two (every scale loom makes is one). */
static int power_of_two(float x)
{
	int e;
	return x > 0 && isfinite(x) && frexpf(x, &e) == 0.5f;
}

static int check_packed(const loom_fp8_state *s, const float *in, char *err, size_t errlen)
{
	float filled = in[0], pos = in[1];
	if (!(filled >= 0 && filled <= s->history_len && filled == floorf(filled)) ||
	    !(pos >= 0 && (pos < s->history_len || (s->history_len == 0 && pos == 0)) &&
	      pos == floorf(pos))) {
		snprintf(err, errlen, "fp8 scaling: history count %g / position %g out of [0, %d]",
			 filled, pos, s->history_len);
		return 1;
	}
	const float *p = in + 2;
	for (int i = 0; i < s->n; i++, p += PER_TENSOR + s->history_len) {
		int ok = power_of_two(p[0]) && power_of_two(p[2]) && isfinite(p[1]) && p[1] >= 0 &&
			 p[3] >= 0 && p[3] == floorf(p[3]);
		for (int k = 0; k < s->history_len; k++)
			ok = ok && isfinite(p[PER_TENSOR + k]) && p[PER_TENSOR + k] >= 0;
		if (!ok) {
			snprintf(err, errlen, "fp8 scaling: tensor %d's scale, amax or history is "
					      "not a valid value (scale %g, amax %g)", i, p[0], p[1]);
			return 1;
		}
	}
	return 0;
}

int loom_fp8_state_unpack(loom_fp8_state *s, const float *in, char *err, size_t errlen)
{
	if (check_packed(s, in, err, errlen))
		return 1;
	s->filled = (int)in[0];
	s->pos = (int)in[1];
	in += 2;
	for (int i = 0; i < s->n; i++) {
		loom_fp8_tensor *t = &s->t[i];
		t->scale = *in++;
		t->last_amax = *in++;
		t->last_scale = t->cur_scale = *in++;
		t->last_saturated = (int64_t)*in++;
		t->amax = 0;
		t->saturated = 0;
		for (int k = 0; k < s->history_len; k++)
			s->history[(size_t)i * s->history_len + k] = *in++;
	}
	return 0;
}
