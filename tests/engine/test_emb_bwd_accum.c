/*
 * tests/engine/test_emb_bwd_accum.c — the embedding's gradient added into
 * the tied table's other gradient (graph/fuse.c's loom_fuse_emb_bwd_accum,
 * the CPU's engine/cpu/emb_bwd_accum.c, LOOM_FUSE_EMB_BWD_ACCUM): a small
 * GPT whose classifier is its token table plans the table's two gradients
 * as one EMBEDDING_BWD that adds into the classifier's dW, no ADD left for
 * them, dW placed in the gradient's own bytes (where the two share a
 * dtype: not at O1, whose dW is bf16 and gradient f32), and trains to the same
 * losses and parameters, bit for bit, as with the switch off, at O0 fp32
 * and O1/O2 bf16, with the vocabulary padded and not, and the table's
 * gradient of one backward over repeated ids equal; an untied GPT plans
 * none.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/program_internal.h"
#include "loom.h"
#include "tests/engine/gpt_parts.h"

#define V 50
#define C 32
#define T 8
#define B 4
#define STEPS 4

/* One GPT-2 block over the tied table (V rows, padded to 64 by pad 16). */
static void build(gpt *m)
{
	cr_assert_eq(gpt_tied_block(m, B, T, V, C), LOOM_OK, "%s",
		     m->g ? loom_graph_error(m->g) : "no memory");
}

static loom_program *compile(gpt *m, loom_opt_level amp, int fuse, int pad)
{
	loom_compile_opts o;
	gpt_adamw_opts(&o, amp);
	o.vocab_pad = pad;
	setenv("LOOM_FUSE_EMB_BWD_ACCUM", fuse ? "1" : "0", 1);
	loom_program *p = NULL;
	cr_assert_eq(loom_compile(m->g, m->loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	unsetenv("LOOM_FUSE_EMB_BWD_ACCUM");
	cr_assert_eq(p->plan.vocab_padded, pad ? 64 : 0, "vocab_pad %d: %lld rows", pad,
		     (long long)p->plan.vocab_padded);
	return p;
}

/* Embedding gradients that add into their last source; *in_place: how
 * many of them share that source's bytes (dW written in the gradient's
 * place, or the sum written over dW); *is_grad: how many are a
 * parameter's gradient. */
static int fused(const loom_program *p, int *in_place, int *is_grad)
{
	const loom_graph *g = p->plan.g;
	int n = 0;
	*in_place = *is_grad = 0;
	for (loom_value v = 0; v < g->n; v++) {
		const loom_node *nd = &g->nodes[v];
		if (!(nd->flags & LOOM_NODE_ACCUM) || nd->op != LOOM_OP_EMBEDDING_BWD)
			continue;
		cr_assert_eq(nd->nsrc, 3);
		n++;
		*in_place += gpt_same_bytes(p, v, nd->src[2]);
		*is_grad += (nd->flags & LOOM_NODE_GRAD) != 0;
	}
	return n;
}

static void same_bits_at(loom_opt_level amp, int pad)
{
	gpt m;
	memset(&m, 0, sizeof(m));
	build(&m);
	loom_program *f = compile(&m, amp, 1, pad);
	loom_program *u = compile(&m, amp, 0, pad);
	int fi, fg, ui, ug;
	cr_assert_eq(fused(f, &fi, &fg), 1, "O%d pad %d: %d embedding gradients add into the "
		     "classifier's, expected 1", (int)amp, pad, fused(f, &fi, &fg));
	cr_assert_eq(fused(u, &ui, &ug), 0, "O%d: LOOM_FUSE_EMB_BWD_ACCUM=0 still fuses", (int)amp);
	cr_expect_eq(gpt_backward_adds(u) - gpt_backward_adds(f), 1, "O%d pad %d: %d backward adds "
		     "unfused, %d fused", (int)amp, pad, gpt_backward_adds(u), gpt_backward_adds(f));
	/* O1: dW bf16 (the product's half output), the table's gradient f32
	 * (its parameter's): no shared bytes, the rows dW widened. */
	cr_expect_eq(fi, amp != LOOM_O1, "O%d pad %d: %d sums share dW's bytes, expected %d",
		     (int)amp, pad, fi, amp != LOOM_O1);
	cr_expect_eq(fg, 1, "O%d pad %d: the fused node is not wte's gradient", (int)amp, pad);
	char why[256];
	cr_assert_eq(gpt_train_same_bits(f, u, &m, STEPS, B, T, V, why, sizeof(why)), 0,
		     "O%d pad %d, fused (a) against unfused (b): %s", (int)amp, pad, why);
	loom_program_free(f);
	loom_program_free(u);
	loom_graph_free(m.g);
}

Test(emb_bwd_accum, o0_fp32_same_bits) { same_bits_at(LOOM_O0, 0); }
Test(emb_bwd_accum, o1_bf16_same_bits) { same_bits_at(LOOM_O1, 0); }
Test(emb_bwd_accum, o2_bf16_same_bits) { same_bits_at(LOOM_O2, 0); }
Test(emb_bwd_accum, o0_fp32_padded_vocabulary_same_bits) { same_bits_at(LOOM_O0, 16); }
Test(emb_bwd_accum, o1_bf16_padded_vocabulary_same_bits) { same_bits_at(LOOM_O1, 16); }
Test(emb_bwd_accum, o2_bf16_padded_vocabulary_same_bits) { same_bits_at(LOOM_O2, 16); }

/* Tokens drawn from a few rows (each summed over several positions, so
 * the order and the rounding of the scatter-add's sums show), most rows
 * untouched; positions and targets as gpt_feed's. */
static void feed_repeats(loom_program *p)
{
	int32_t ids[B * T], pos[B * T], tg[B * T];
	for (int i = 0; i < B * T; i++) {
		ids[i] = (int32_t)((i * i + 3 * i) % 7 * 7 + 1);
		pos[i] = i % T;
		tg[i] = (int32_t)((i * 11 + 1) % V);
	}
	cr_assert_eq(loom_set_input(p, "ids", ids, LOOM_I32, B * T), LOOM_OK, "%s", loom_last_error());
	cr_assert_eq(loom_set_input(p, "pos", pos, LOOM_I32, B * T), LOOM_OK, "%s", loom_last_error());
	cr_assert_eq(loom_set_input(p, "targets", tg, LOOM_I32, B * T), LOOM_OK, "%s",
		     loom_last_error());
}

/* The table's gradient of one backward, fused against unfused: equal
 * values (a -0 the add would have made +0 may stay -0: emb_bwd_accum.c). */
static void same_gradient_at(loom_opt_level amp, int pad)
{
	gpt m;
	memset(&m, 0, sizeof(m));
	build(&m);
	loom_program *p[2] = { compile(&m, amp, 1, pad), compile(&m, amp, 0, pad) };
	double *gr[2];
	for (int k = 0; k < 2; k++) {
		gr[k] = malloc(sizeof(double) * V * C);
		cr_assert_not_null(gr[k]);
		feed_repeats(p[k]);
		cr_assert_eq(loom_run(p[k], LOOM_RUN_GRAD), LOOM_OK, "%s", loom_last_error());
		cr_assert_eq(loom_read_grad_f64(p[k], m.wte, gr[k], V * C), LOOM_OK, "%s",
			     loom_last_error());
	}
	for (int j = 0; j < V * C; j++)
		cr_assert(gr[0][j] == gr[1][j] || (isnan(gr[0][j]) && isnan(gr[1][j])),
			  "O%d pad %d: wte's gradient [%d][%d]: %.9g fused, %.9g unfused", (int)amp,
			  pad, j / C, j % C, gr[0][j], gr[1][j]);
	for (int k = 0; k < 2; k++) {
		free(gr[k]);
		loom_program_free(p[k]);
	}
	loom_graph_free(m.g);
}

Test(emb_bwd_accum, the_gradient_o0_fp32) { same_gradient_at(LOOM_O0, 0); }
Test(emb_bwd_accum, the_gradient_o1_bf16) { same_gradient_at(LOOM_O1, 0); }
Test(emb_bwd_accum, the_gradient_o2_bf16) { same_gradient_at(LOOM_O2, 0); }
Test(emb_bwd_accum, the_gradient_o2_bf16_padded_vocabulary) { same_gradient_at(LOOM_O2, 16); }

/* An untied classifier (gpt_two_blocks' "head") has no sum to fuse. */
Test(emb_bwd_accum, an_untied_table_plans_none)
{
	gpt m;
	cr_assert_eq(gpt_two_blocks(&m, B, T, V, C), LOOM_OK);
	loom_program *p = compile(&m, LOOM_O0, 1, 0);
	int in_place, is_grad;
	cr_assert_eq(fused(p, &in_place, &is_grad), 0);
	loom_program_free(p);
	loom_graph_free(m.g);
}
