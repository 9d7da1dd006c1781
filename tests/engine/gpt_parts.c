/*
 * tests/engine/gpt_parts.c — see gpt_parts.h.
 */
#include "tests/engine/gpt_parts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

loom_value gpt_embed(gpt *m, int64_t B, int64_t T, int64_t V, int64_t C)
{
	memset(m, 0, sizeof(*m));
	if (loom_graph_new(&m->g) != LOOM_OK)
		return LOOM_NONE;
	loom_graph *g = m->g;
	int64_t bt[2] = { B, T }, flat[1] = { B * T };
	loom_value ids = loom_input(g, "ids", LOOM_I32, 2, bt);
	loom_value pos = loom_input(g, "pos", LOOM_I32, 2, bt);
	m->targets = loom_input(g, "targets", LOOM_I32, 1, flat);
	m->wte = gpt_param(m, "wte", 2, V, C, LOOM_INIT_KAIMING_UNIFORM, 4);
	loom_value wpe = gpt_param(m, "wpe", 2, T, C, LOOM_INIT_KAIMING_UNIFORM, 4);
	return loom_add(g, loom_embedding(g, ids, m->wte), loom_embedding(g, pos, wpe));
}

loom_status gpt_feed(loom_program *p, int k, int64_t B, int64_t T, int64_t V, int last_class)
{
	const size_t n = (size_t)(B * T);
	int32_t *ids = malloc(sizeof(int32_t) * 3 * n), *pos = ids + n, *tg = ids + 2 * n;
	loom_status st;
	if (!ids)
		return LOOM_ERR_NOMEM;
	for (size_t i = 0; i < n; i++) {
		ids[i] = (int32_t)(((int64_t)i * 7 + k * 13 + 3) % V);
		pos[i] = (int32_t)((int64_t)i % T);
		tg[i] = (int32_t)(((int64_t)i * 11 + k * 5 + 1) % V);
	}
	if (last_class)
		tg[0] = (int32_t)(V - 1);
	if ((st = loom_set_input(p, "ids", ids, LOOM_I32, n)) == LOOM_OK &&
	    (st = loom_set_input(p, "pos", pos, LOOM_I32, n)) == LOOM_OK)
		st = loom_set_input(p, "targets", tg, LOOM_I32, n);
	free(ids);
	return st;
}
