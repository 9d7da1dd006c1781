/*
 * tests/engine/test_ln_residual.c — the residual add fused with the layer
 * norm that reads it (graph/fuse.c's loom_fuse_ln_residual, the CPU's
 * engine/cpu/ln_residual.c, LOOM_FUSE_LN_RESIDUAL): a small GPT (two
 * blocks) plans each add that feeds a layer norm as the norm's maker
 * (the embeddings' sum and the four residuals) and trains to the same
 * losses and parameters, bit for bit, as with the switch off, at O0 fp32
 * and O1/O2 bf16, and with the norms recomputed in the backward.
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

static loom_program *compile(gpt *m, loom_opt_level amp, int fuse, int recompute)
{
	loom_compile_opts o;
	gpt_adamw_opts(&o, amp);
	o.recompute = recompute;
	setenv("LOOM_FUSE_LN_RESIDUAL", fuse ? "1" : "0", 1);
	loom_program *p = NULL;
	cr_assert_eq(loom_compile(m->g, m->loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	unsetenv("LOOM_FUSE_LN_RESIDUAL");
	return p;
}

/* Layer norms the plan has an add make. */
static int fused(const loom_program *p)
{
	const loom_graph *g = p->plan.g;
	int n = 0;
	for (loom_value v = 0; v < g->n; v++) {
		const loom_node *nd = &g->nodes[v];
		n += nd->op == LOOM_OP_LAYERNORM && nd->made_by != LOOM_NONE &&
		     g->nodes[nd->made_by].op == LOOM_OP_ADD;
	}
	return n;
}

static void same_bits_at(loom_opt_level amp, int recompute)
{
	gpt m;
	cr_assert_eq(gpt_two_blocks(&m, B, T, V, C), LOOM_OK, "%s",
		     m.g ? loom_graph_error(m.g) : "out of memory");
	loom_program *f = compile(&m, amp, 1, recompute), *u = compile(&m, amp, 0, recompute);
	cr_assert_eq(fused(f), 5, "O%d: %d layer norms made by their add, expected 5", (int)amp,
		     fused(f));
	cr_assert_eq(fused(u), 0, "O%d: LOOM_FUSE_LN_RESIDUAL=0 still fuses %d", (int)amp,
		     fused(u));
	char why[256];
	cr_assert_eq(gpt_train_same_bits(f, u, &m, STEPS, B, T, V, why, sizeof(why)), 0,
		     "O%d, fused (a) against unfused (b): %s", (int)amp, why);
	loom_program_free(f);
	loom_program_free(u);
	loom_graph_free(m.g);
}

Test(ln_residual, o0_fp32_same_bits) { same_bits_at(LOOM_O0, 0); }
Test(ln_residual, o1_bf16_same_bits) { same_bits_at(LOOM_O1, 0); }
Test(ln_residual, o2_bf16_same_bits) { same_bits_at(LOOM_O2, 0); }
Test(ln_residual, o2_bf16_recomputed_norms_same_bits) { same_bits_at(LOOM_O2, 2); }

/* no_fusion plans none. */
Test(ln_residual, no_fusion_plans_none)
{
	gpt m;
	cr_assert_eq(gpt_two_blocks(&m, B, T, V, C), LOOM_OK);
	loom_program *p = gpt_compile_unfused(&m);
	cr_assert_not_null(p, "%s", loom_last_error());
	cr_assert_eq(fused(p), 0);
	loom_program_free(p);
	loom_graph_free(m.g);
}
