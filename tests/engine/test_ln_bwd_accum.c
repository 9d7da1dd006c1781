/*
 * tests/engine/test_ln_bwd_accum.c — a row norm's dx added into the
 * residual's other gradient (graph/fuse.c's loom_fuse_ln_bwd_accum, the
 * CPU's engine/cpu/ln_bwd_accum.c, LOOM_FUSE_LN_BWD_ACCUM): a small GPT
 * (two blocks) plans the sum of each residual value's two gradients in
 * its norm's backward (the four residual values a block's norm reads; the
 * final norm's input has one gradient), no ADD left for them, the sum
 * written over the addend's bytes, and trains to the same losses and
 * parameters, bit for bit, as with the switch off, at O0 fp32 and O1/O2
 * bf16, with the residual add's forward fusion on and off, and with the
 * norms recomputed in the backward; with layer norms (GPT-2's) and with
 * RMS norms (LLaMA's, the rms_ rows).
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "engine/program_internal.h"
#include "loom.h"
#include "tests/engine/gpt_parts.h"

#define V 40
#define C 32
#define T 16
#define B 4
#define STEPS 4

static loom_program *compile(gpt *m, loom_opt_level amp, int fuse, int ln_residual,
			     int recompute)
{
	loom_compile_opts o;
	gpt_adamw_opts(&o, amp);
	o.recompute = recompute;
	setenv("LOOM_FUSE_LN_BWD_ACCUM", fuse ? "1" : "0", 1);
	setenv("LOOM_FUSE_LN_RESIDUAL", ln_residual ? "1" : "0", 1);
	loom_program *p = NULL;
	cr_assert_eq(loom_compile(m->g, m->loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	unsetenv("LOOM_FUSE_LN_BWD_ACCUM");
	unsetenv("LOOM_FUSE_LN_RESIDUAL");
	return p;
}

/* Norm data gradients (op: layer norm's or RMS norm's) that add into
 * their last source; *in_place: how many of them the memory plan wrote
 * over that source's bytes. */
static int fused(const loom_program *p, loom_op op, int *in_place)
{
	const loom_graph *g = p->plan.g;
	int n = 0;
	*in_place = 0;
	for (loom_value v = 0; v < g->n; v++) {
		const loom_node *nd = &g->nodes[v];
		if (!(nd->flags & LOOM_NODE_ACCUM))
			continue;
		cr_assert_eq(nd->op, op);
		cr_assert_eq(nd->nsrc, 4);
		n++;
		/* The same bytes: the plan places a value over a source it
		 * reads only as an in-place write. */
		*in_place += gpt_same_bytes(p, v, nd->src[3]);
	}
	return n;
}

static void same_bits_at(loom_opt_level amp, int ln_residual, int recompute, int rms)
{
	const loom_op op = rms ? LOOM_OP_RMSNORM_BWD_DATA : LOOM_OP_LAYERNORM_BWD_DATA;
	gpt m;
	cr_assert_eq(gpt_two_blocks_norm(&m, B, T, V, C, rms), LOOM_OK, "%s",
		     m.g ? loom_graph_error(m.g) : "out of memory");
	loom_program *f = compile(&m, amp, 1, ln_residual, recompute);
	loom_program *u = compile(&m, amp, 0, ln_residual, recompute);
	int fi, ui;
	cr_assert_eq(fused(f, op, &fi), 4, "O%d: %d norm gradients add into the residual's, "
		     "expected 4", (int)amp, fused(f, op, &fi));
	cr_assert_eq(fused(u, op, &ui), 0, "O%d: LOOM_FUSE_LN_BWD_ACCUM=0 still fuses", (int)amp);
	cr_expect_eq(gpt_backward_adds(u) - gpt_backward_adds(f), 4,
		     "O%d: %d backward adds unfused, %d fused", (int)amp, gpt_backward_adds(u),
		     gpt_backward_adds(f));
	cr_expect_eq(fi, 4, "O%d: %d of 4 sums written over their addend", (int)amp, fi);
	char why[256];
	cr_assert_eq(gpt_train_same_bits(f, u, &m, STEPS, B, T, V, why, sizeof(why)), 0,
		     "O%d, fused (a) against unfused (b): %s", (int)amp, why);
	loom_program_free(f);
	loom_program_free(u);
	loom_graph_free(m.g);
}

Test(ln_bwd_accum, o0_fp32_same_bits) { same_bits_at(LOOM_O0, 1, 0, 0); }
Test(ln_bwd_accum, o1_bf16_same_bits) { same_bits_at(LOOM_O1, 1, 0, 0); }
Test(ln_bwd_accum, o2_bf16_same_bits) { same_bits_at(LOOM_O2, 1, 0, 0); }
Test(ln_bwd_accum, o2_bf16_without_ln_residual_same_bits) { same_bits_at(LOOM_O2, 0, 0, 0); }
Test(ln_bwd_accum, o1_bf16_recomputed_norms_same_bits) { same_bits_at(LOOM_O1, 1, 2, 0); }
Test(ln_bwd_accum, rms_o0_fp32_same_bits) { same_bits_at(LOOM_O0, 1, 0, 1); }
Test(ln_bwd_accum, rms_o1_bf16_same_bits) { same_bits_at(LOOM_O1, 1, 0, 1); }
Test(ln_bwd_accum, rms_o2_bf16_same_bits) { same_bits_at(LOOM_O2, 1, 0, 1); }
Test(ln_bwd_accum, rms_o1_bf16_recomputed_norms_same_bits) { same_bits_at(LOOM_O1, 1, 2, 1); }

/* no_fusion plans none. */
Test(ln_bwd_accum, no_fusion_plans_none)
{
	gpt m;
	cr_assert_eq(gpt_two_blocks(&m, B, T, V, C), LOOM_OK);
	loom_program *p = gpt_compile_unfused(&m);
	cr_assert_not_null(p, "%s", loom_last_error());
	int in_place;
	cr_assert_eq(fused(p, LOOM_OP_LAYERNORM_BWD_DATA, &in_place), 0);
	loom_program_free(p);
	loom_graph_free(m.g);
}
