/*
 * tests/engine/gpt_parts.c — see gpt_parts.h.
 */
#include "tests/engine/gpt_parts.h"

#include <stdio.h>

loom_value gpt_param(gpt *m, const char *name, int ndim, int64_t d0, int64_t d1, loom_init init,
		     int64_t fan_in)
{
	int64_t d[2] = { d0, d1 };
	loom_value v = loom_param(m->g, name, LOOM_F32, ndim, d, init, fan_in);
	if (m->n < (int)(sizeof(m->params) / sizeof(m->params[0])))
		m->params[m->n++] = v;
	return v;
}

loom_value gpt_linear(gpt *m, const char *name, loom_value x, int64_t out, int64_t in)
{
	char wn[64], bn[64];
	snprintf(wn, sizeof(wn), "%s.weight", name);
	snprintf(bn, sizeof(bn), "%s.bias", name);
	loom_value w = gpt_param(m, wn, 2, out, in, LOOM_INIT_KAIMING_UNIFORM, in);
	loom_value b = gpt_param(m, bn, 1, out, 0, LOOM_INIT_UNIFORM_FAN_IN, in);
	return loom_linear(m->g, x, w, b);
}

loom_value gpt_layernorm(gpt *m, const char *name, loom_value x, int64_t c)
{
	char wn[64], bn[64];
	snprintf(wn, sizeof(wn), "%s.weight", name);
	snprintf(bn, sizeof(bn), "%s.bias", name);
	loom_value w = gpt_param(m, wn, 1, c, 0, LOOM_INIT_ONES, 0);
	loom_value b = gpt_param(m, bn, 1, c, 0, LOOM_INIT_ZEROS, 0);
	return loom_layernorm(m->g, x, w, b, 1e-5);
}
