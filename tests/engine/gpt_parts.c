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

loom_value gpt_norm(gpt *m, const char *name, loom_value x, int64_t c, int rms)
{
	char wn[64];
	if (!rms)
		return gpt_layernorm(m, name, x, c);
	snprintf(wn, sizeof(wn), "%s.weight", name);
	return loom_rms_norm(m->g, x, gpt_param(m, wn, 1, c, 0, LOOM_INIT_ONES, 0), 1e-5);
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

int gpt_first_param_differs(loom_program *a, loom_program *b, const gpt *m)
{
	int first = -1;
	for (int i = 0; i < m->n && first == -1; i++) {
		loom_shape s = loom_value_shape(m->g, m->params[i]);
		size_t n = (size_t)loom_shape_numel(&s);
		double *x = malloc(sizeof(double) * n), *y = malloc(sizeof(double) * n);
		if (!x || !y || loom_read_f64(a, m->params[i], x, n) != LOOM_OK ||
		    loom_read_f64(b, m->params[i], y, n) != LOOM_OK)
			first = -2;
		else if (memcmp(x, y, sizeof(double) * n) != 0)
			first = i;
		free(x);
		free(y);
	}
	return first;
}

void gpt_adamw_opts(loom_compile_opts *o, loom_opt_level amp)
{
	loom_compile_opts_default(o);
	o->device = LOOM_DEVICE_CPU;
	o->optim.kind = LOOM_OPTIM_ADAMW;
	o->optim.lr = 3e-3;
	o->optim.weight_decay = 0.1;
	o->amp.level = amp;
	if (amp != LOOM_O0)
		o->amp.half = LOOM_BF16;
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

loom_status gpt_two_blocks(gpt *m, int64_t B, int64_t T, int64_t V, int64_t C)
{
	return gpt_two_blocks_norm(m, B, T, V, C, 0);
}

loom_status gpt_two_blocks_norm(gpt *m, int64_t B, int64_t T, int64_t V, int64_t C, int rms)
{
	loom_value x = gpt_embed(m, B, T, V, C);
	loom_graph *g = m->g;
	if (x == LOOM_NONE)
		return g ? loom_graph_status(g) : LOOM_ERR_NOMEM;
	int64_t lg[2] = { B * T, V };
	for (int l = 0; l < 2; l++) {
		char nm[32];
		snprintf(nm, sizeof(nm), "h%d.ln_1", l);
		loom_value h = gpt_norm(m, nm, x, C, rms);
		snprintf(nm, sizeof(nm), "h%d.c_attn", l);
		h = loom_causal_self_attention(g, gpt_linear(m, nm, h, 3 * C, C), 2);
		snprintf(nm, sizeof(nm), "h%d.attn_proj", l);
		x = loom_add(g, x, gpt_linear(m, nm, h, C, C));
		snprintf(nm, sizeof(nm), "h%d.ln_2", l);
		loom_value n2 = gpt_norm(m, nm, x, C, rms);
		snprintf(nm, sizeof(nm), "h%d.c_fc", l);
		h = loom_gelu(g, gpt_linear(m, nm, n2, 4 * C, C));
		if (l == 0)
			m->mlp_act = h;
		snprintf(nm, sizeof(nm), "h%d.mlp_proj", l);
		x = loom_add(g, x, gpt_linear(m, nm, h, C, 4 * C));
	}
	x = gpt_norm(m, "ln_f", x, C, rms);
	loom_value logits = loom_reshape(g, gpt_linear(m, "head", x, V, C), 2, lg);
	m->loss = loom_softmax_cross_entropy(g, logits, m->targets);
	return loom_graph_status(g);
}

loom_status gpt_tied_block(gpt *m, int64_t B, int64_t T, int64_t V, int64_t C)
{
	loom_value x = gpt_embed(m, B, T, V, C);
	loom_graph *g = m->g;
	if (x == LOOM_NONE)
		return g ? loom_graph_status(g) : LOOM_ERR_NOMEM;
	int64_t lg[2] = { B * T, V };
	loom_value h = gpt_layernorm(m, "ln_1", x, C);
	h = loom_causal_self_attention(g, gpt_linear(m, "c_attn", h, 3 * C, C), 2);
	x = loom_add(g, x, gpt_linear(m, "c_proj", h, C, C));
	h = loom_gelu(g, gpt_linear(m, "c_fc", gpt_layernorm(m, "ln_2", x, C), 4 * C, C));
	x = loom_add(g, x, gpt_linear(m, "mlp_proj", h, C, 4 * C));
	x = gpt_layernorm(m, "ln_f", x, C);
	m->logits = loom_reshape(g, loom_linear(g, x, m->wte, LOOM_NONE), 2, lg);
	m->loss = loom_softmax_cross_entropy(g, m->logits, m->targets);
	return loom_graph_status(g);
}

loom_program *gpt_compile_unfused(const gpt *m)
{
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.no_fusion = 1;
	loom_program *p = NULL;
	return loom_compile(m->g, m->loss, &o, &p) == LOOM_OK ? p : NULL;
}

int gpt_train_same_bits(loom_program *a, loom_program *b, const gpt *m, int steps, int64_t B,
			int64_t T, int64_t V, char *why, size_t len)
{
	for (int k = 0; k < steps; k++) {
		loom_program *pr[2] = { a, b };
		double loss[2];
		for (int i = 0; i < 2; i++) {
			if (gpt_feed(pr[i], k, B, T, V, 0) != LOOM_OK ||
			    loom_run(pr[i], LOOM_RUN_TRAIN) != LOOM_OK) {
				snprintf(why, len, "step %d, program %c: %s", k, "ab"[i],
					 loom_last_error());
				return -1;
			}
			loss[i] = loom_loss(pr[i]);
		}
		if (memcmp(&loss[0], &loss[1], sizeof(double))) {
			snprintf(why, len, "step %d: loss %.17g against %.17g", k, loss[0], loss[1]);
			return -1;
		}
	}
	int d = gpt_first_param_differs(a, b, m);
	if (d != -1) {
		if (d >= 0)
			snprintf(why, len, "parameter %d (m->params' order) differs", d);
		else
			snprintf(why, len, "reading the parameters failed");
		return -1;
	}
	return 0;
}
