/*
 * tests/engine/gpt_parts.h — the parts the engine's GPT tests build their
 * small models from (test_vocab_pad, test_recompute): f32 parameters
 * listed as they are made, so that a test can read every one of them
 * back, a linear with its bias and a layer norm named as PyTorch names
 * them.
 */
#ifndef LOOM_TESTS_ENGINE_GPT_PARTS_H
#define LOOM_TESTS_ENGINE_GPT_PARTS_H

#include <stdint.h>

#include "loom.h"

typedef struct gpt {
	loom_graph *g;
	loom_value loss, logits, wte;
	loom_value mlp_act; /* test_recompute: the first block's GELU output */
	loom_value params[64];
	int n;
} gpt;

/* An f32 parameter [d0] (ndim 1) or [d0, d1], appended to m->params. */
loom_value gpt_param(gpt *m, const char *name, int ndim, int64_t d0, int64_t d1, loom_init init,
		     int64_t fan_in);
/* name.weight [out, in] and name.bias [out], as torch.nn.Linear. */
loom_value gpt_linear(gpt *m, const char *name, loom_value x, int64_t out, int64_t in);
/* name.weight and name.bias [c], ones and zeros, eps 1e-5. */
loom_value gpt_layernorm(gpt *m, const char *name, loom_value x, int64_t c);

#endif /* LOOM_TESTS_ENGINE_GPT_PARTS_H */
