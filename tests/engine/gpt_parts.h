/*
 * tests/engine/gpt_parts.h — the parts the engine's GPT tests build their
 * small models from (test_vocab_pad, test_recompute, test_fp8_train): f32 parameters
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
	loom_value loss, logits, wte, targets;
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
/* rms 0: gpt_layernorm; else an RMS norm with name.weight [c] (ones),
 * eps 1e-5, as LLaMA's. */
loom_value gpt_norm(gpt *m, const char *name, loom_value x, int64_t c, int rms);

/* A new graph in *m (zeroed first) with inputs ids and pos [B, T] and
 * targets [B*T] (m->targets), the token table wte [V, C] (m->wte) and
 * the positions' wpe [T, C]: the sum of both embeddings, [B, T, C]. */
loom_value gpt_embed(gpt *m, int64_t B, int64_t T, int64_t V, int64_t C);
/* A new graph in *m as gpt_embed makes it, then two GPT-2 blocks (pre-norm,
 * 2 heads, GELU MLP of 4C), a final layer norm and an untied classifier
 * "head": m->loss the cross-entropy over [B*T, V], m->mlp_act the first
 * block's GELU output. The graph's status (LOOM_OK, or its first error). */
loom_status gpt_two_blocks(gpt *m, int64_t B, int64_t T, int64_t V, int64_t C);
/* gpt_two_blocks with its five norms RMS norms where rms (gpt_norm). */
loom_status gpt_two_blocks_norm(gpt *m, int64_t B, int64_t T, int64_t V, int64_t C, int rms);
/* A new graph in *m as gpt_embed makes it, then one GPT-2 block
 * (pre-norm, 2 heads, GELU MLP of 4C), a final layer norm and the
 * classifier tied to wte: m->logits [B*T, V], m->loss their cross-entropy.
 * The graph's status (LOOM_OK, or its first error). */
loom_status gpt_tied_block(gpt *m, int64_t B, int64_t T, int64_t V, int64_t C);
/* The engine's GPT tests' options: the CPU, AdamW (lr 3e-3, weight decay
 * 0.1), amp at level, in bf16 above O0. */
void gpt_adamw_opts(loom_compile_opts *o, loom_opt_level amp);
/* The first of m's parameters whose bits differ between programs a and
 * b, or -1 when none does (-2: a read failed or memory ran out). */
int gpt_first_param_differs(loom_program *a, loom_program *b, const gpt *m);
/* Trains a and b (two plans of m) side by side for steps batches
 * (gpt_feed's, B, T, V) and compares every step's loss and then every
 * parameter bit for bit: 0 when all agree, else -1 with what differed
 * (or failed) in why. */
int gpt_train_same_bits(loom_program *a, loom_program *b, const gpt *m, int steps, int64_t B,
			int64_t T, int64_t V, char *why, size_t len);
/* Batch k: tokens, positions and next-token targets, the same for the
 * same k; last_class: the first target is class V - 1. */
loom_status gpt_feed(loom_program *p, int k, int64_t B, int64_t T, int64_t V, int last_class);

/* m's graph compiled for the CPU with default options but no fusion
 * (loom_compile_opts.no_fusion), or NULL with loom_last_error's message. */
loom_program *gpt_compile_unfused(const gpt *m);
/* Plan checks (gpt_plan.c, which reads the program's plan): how many
 * backward ADD nodes p keeps, and whether value v is placed on the bytes
 * of value a's root (a sum written in place over its addend, or an addend
 * lent the sum's bytes). */
int gpt_backward_adds(const loom_program *p);
int gpt_same_bytes(const loom_program *p, loom_value v, loom_value a);

#endif /* LOOM_TESTS_ENGINE_GPT_PARTS_H */
