/*
 * tests/engine/test_recompute.c — activation recomputation
 * (loom_compile_opts.recompute, LOOM_RECOMPUTE; graph/recompute.c) on the
 * CPU: a small GPT (two blocks, GELU MLPs, layer norms) trains to the same
 * bits at every level (the copies run the same kernels on the same inputs),
 * at O0, O1 and O2 with AdamW; the plan holds fewer activation bytes and
 * says how many values it makes again; the copies are backward nodes that
 * only backward nodes read, each before its first reader; a value the user
 * reads stays as it is; bad levels are refused and the environment decides
 * over the option.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/program_internal.h"
#include "loom.h"
#include "tests/engine/gpt_parts.h"

#define V 40
#define C 32
#define T 16
#define B 4
#define STEPS 3

/* Two GPT-2 blocks and an untied classifier; mark: the first block's
 * GELU output is an output the user reads. */
static void build(gpt *m, int mark)
{
	cr_assert_eq(gpt_two_blocks(m, B, T, V, C), LOOM_OK, "%s",
		     m->g ? loom_graph_error(m->g) : "out of memory");
	if (mark)
		loom_mark_output(m->g, m->mlp_act);
	cr_assert_eq(loom_graph_status(m->g), LOOM_OK, "%s", loom_graph_error(m->g));
}

static loom_status try_compile(gpt *m, int level, loom_opt_level amp, loom_program **p)
{
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim.kind = LOOM_OPTIM_ADAMW;
	o.optim.lr = 3e-3;
	o.optim.weight_decay = 0.1;
	o.amp.level = amp;
	if (amp != LOOM_O0)
		o.amp.half = LOOM_BF16;
	o.recompute = level;
	return loom_compile(m->g, m->loss, &o, p);
}

static loom_program *compile(gpt *m, int level, loom_opt_level amp)
{
	loom_program *p = NULL;
	cr_assert_eq(try_compile(m, level, amp, &p), LOOM_OK, "%s", loom_last_error());
	return p;
}

static void feed(loom_program *p, int k)
{
	cr_assert_eq(gpt_feed(p, k, B, T, V, 0), LOOM_OK, "%s", loom_last_error());
}

static void train(loom_program *p, double *loss)
{
	for (int k = 0; k < STEPS; k++) {
		feed(p, k);
		cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_last_error());
		loss[k] = loom_loss(p);
	}
}

/* Every parameter of a and b: the same bits. */
static void same_params(loom_program *a, loom_program *b, const gpt *m, int level)
{
	for (int i = 0; i < m->n; i++) {
		size_t n = (size_t)loom_shape_numel(&m->g->nodes[m->params[i]].shape);
		double *x = malloc(sizeof(double) * n), *y = malloc(sizeof(double) * n);
		cr_assert_eq(loom_read_f64(a, m->params[i], x, n), LOOM_OK);
		cr_assert_eq(loom_read_f64(b, m->params[i], y, n), LOOM_OK);
		cr_assert(memcmp(x, y, sizeof(double) * n) == 0,
			  "recompute %d: parameter %s differs from the plain run's", level,
			  m->g->nodes[m->params[i]].name);
		free(x);
		free(y);
	}
}

/* The copies: backward nodes named ".recompute", read only by backward
 * nodes, each after it; nothing in the forward reads one. */
static void copies_well_placed(const loom_program *p)
{
	const loom_graph *g = p->plan.g;
	int copies = 0;
	for (loom_value v = 0; v < g->n; v++) {
		const loom_node *n = &g->nodes[v];
		int is_copy = strstr(n->name, ".recompute") != NULL;
		copies += is_copy;
		if (is_copy) {
			cr_assert(v >= p->plan.n_fwd, "copy %d '%s' in the forward", v, n->name);
			cr_assert(n->flags & LOOM_NODE_BACKWARD);
			cr_assert(n->bwd_of != LOOM_NONE && n->bwd_of < p->plan.n_fwd);
		}
		for (int i = 0; i < n->nsrc; i++) {
			loom_value s = n->src[i];
			if (s == LOOM_NONE || !strstr(g->nodes[s].name, ".recompute"))
				continue;
			cr_assert(v >= p->plan.n_fwd, "forward node %d reads copy %d", v, s);
			cr_assert(s < v, "node %d reads copy %d made after it", v, s);
		}
	}
	cr_assert_eq(copies, p->plan.n_recomputed, "%d copies named, %d counted", copies,
		     p->plan.n_recomputed);
}

static void same_bits_at(loom_opt_level amp)
{
	gpt m;
	build(&m, 0);
	loom_program *p[4];
	double loss[4][STEPS];
	loom_program_info info[4];
	for (int r = 0; r < 4; r++) {
		p[r] = compile(&m, r, amp);
		loom_program_info_get(p[r], &info[r]);
		copies_well_placed(p[r]);
		train(p[r], loss[r]);
	}
	cr_assert_eq(info[0].n_recomputed, 0);
	cr_assert(info[1].n_recomputed >= 2, "level 1: %d values made again (the two GELUs)",
		  info[1].n_recomputed);
	cr_assert(info[2].n_recomputed > info[1].n_recomputed,
		  "level 2 makes the norms again too: %d against %d", info[2].n_recomputed,
		  info[1].n_recomputed);
	cr_assert(info[3].n_recomputed >= info[2].n_recomputed + 2,
		  "level 3 makes the two attention probabilities again too: %d against %d",
		  info[3].n_recomputed, info[2].n_recomputed);
	for (int r = 1; r < 4; r++) {
		for (int k = 0; k < STEPS; k++)
			cr_assert(memcmp(&loss[r][k], &loss[0][k], sizeof(double)) == 0,
				  "O%d recompute %d step %d: loss %.17g against %.17g", (int)amp, r,
				  k, loss[r][k], loss[0][k]);
		same_params(p[r], p[0], &m, r);
	}
	cr_assert(info[1].activation_bytes < info[0].activation_bytes,
		  "O%d level 1 plans %zu activation bytes, none %zu", (int)amp,
		  info[1].activation_bytes, info[0].activation_bytes);
	cr_assert(info[2].activation_bytes < info[1].activation_bytes,
		  "O%d level 2 plans %zu activation bytes, level 1 %zu", (int)amp,
		  info[2].activation_bytes, info[1].activation_bytes);
	cr_assert(info[3].activation_bytes < info[2].activation_bytes,
		  "O%d level 3 plans %zu activation bytes, level 2 %zu", (int)amp,
		  info[3].activation_bytes, info[2].activation_bytes);
	for (int r = 0; r < 4; r++)
		loom_program_free(p[r]);
	loom_graph_free(m.g);
}

Test(recompute, o0_same_bits_less_memory) { same_bits_at(LOOM_O0); }
Test(recompute, o1_bf16_same_bits_less_memory) { same_bits_at(LOOM_O1); }
Test(recompute, o2_bf16_same_bits_less_memory) { same_bits_at(LOOM_O2); }

/* A value the user reads (loom_mark_output) keeps its place and is not
 * made again: the other GELU is. */
Test(recompute, an_output_is_left_alone)
{
	gpt m;
	build(&m, 1);
	loom_program *p = compile(&m, 1, LOOM_O0);
	cr_assert_eq(p->plan.n_recomputed, 1, "%d values made again; only the second GELU may be",
		     p->plan.n_recomputed);
	double *x = malloc(sizeof(double) * B * T * 4 * C);
	feed(p, 0);
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK);
	cr_assert_eq(loom_read_f64(p, m.mlp_act, x, B * T * 4 * C), LOOM_OK, "%s",
		     loom_last_error());
	free(x);
	loom_program_free(p);
	loom_graph_free(m.g);
}

Test(recompute, bad_level_refused)
{
	gpt m;
	build(&m, 0);
	loom_program *p = NULL;
	cr_assert_eq(try_compile(&m, 4, LOOM_O0, &p), LOOM_ERR_INVALID);
	cr_assert(strstr(loom_last_error(), "recompute: level 4"), "%s", loom_last_error());
	loom_program_free(p);
	loom_graph_free(m.g);
}

/* LOOM_RECOMPUTE decides over the option; an inference plan has no
 * backward to make anything in. */
Test(recompute, environment_and_inference)
{
	gpt m;
	build(&m, 0);
	setenv("LOOM_RECOMPUTE", "3", 1);
	loom_program *p = compile(&m, 0, LOOM_O0);
	cr_assert(p->plan.n_recomputed > 0, "LOOM_RECOMPUTE=3 over recompute 0");
	loom_program_free(p);
	setenv("LOOM_RECOMPUTE", "0", 1);
	p = compile(&m, 2, LOOM_O0);
	cr_assert_eq(p->plan.n_recomputed, 0, "LOOM_RECOMPUTE=0 over recompute 2");
	loom_program_free(p);
	unsetenv("LOOM_RECOMPUTE");
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.inference = 1;
	o.recompute = 2;
	cr_assert_eq(loom_compile(m.g, m.loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	cr_assert_eq(p->plan.n_recomputed, 0);
	loom_program_free(p);
	loom_graph_free(m.g);
}

/* A setting's variable holding what its row does not take fails the
 * compile, naming the variable and what it takes, instead of running the
 * default as if it were unset (base/options.def). */
Test(recompute, a_bad_setting_in_the_environment_fails_the_compile)
{
	static const char *bad[][2] = { { "LOOM_RECOMPUTE", "2x" },
					{ "LOOM_CUDA_GRAPH", "yes" },
					{ "LOOM_CUDA_NHWC", "sometimes" },
					{ "LOOM_COMM_TIMEOUT_S", "-1" } };
	gpt m;
	build(&m, 0);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		loom_compile_opts o;
		loom_program *p = NULL;
		char want[64];
		loom_compile_opts_default(&o);
		o.device = LOOM_DEVICE_CPU;
		setenv(bad[i][0], bad[i][1], 1);
		cr_assert_eq(loom_compile(m.g, m.loss, &o, &p), LOOM_ERR_INVALID, "%s=%s",
			     bad[i][0], bad[i][1]);
		snprintf(want, sizeof(want), "%s=%s: ", bad[i][0], bad[i][1]);
		cr_assert(strstr(loom_last_error(), want), "%s", loom_last_error());
		loom_program_free(p);
		unsetenv(bad[i][0]);
	}
	setenv("LOOM_CUDA_NHWC", "half", 1); /* one of its words: compiles */
	loom_program *p = compile(&m, 0, LOOM_O0);
	loom_program_free(p);
	unsetenv("LOOM_CUDA_NHWC");
	loom_graph_free(m.g);
}

/* A plan over memory_limit_mb is compiled again at level 3 before it is
 * refused: a limit between level 3's peak and the plain one's gives a
 * program with values made again; one below level 3's is refused, the
 * message saying what was made again; under LOOM_RECOMPUTE it is refused
 * at once. */
Test(recompute, memory_limit_compiles_again_with_recompute)
{
	gpt m;
	build(&m, 0);
	loom_program *p0 = compile(&m, 0, LOOM_O0), *p2 = compile(&m, 3, LOOM_O0), *p = NULL;
	loom_program_info i0, i2;
	loom_program_info_get(p0, &i0);
	loom_program_info_get(p2, &i2);
	loom_program_free(p0);
	loom_program_free(p2);
	cr_assert_lt(i2.arena_bytes, i0.arena_bytes);
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim.kind = LOOM_OPTIM_ADAMW;
	o.memory_limit_mb = (i0.arena_bytes + i2.arena_bytes) / 2.0 / 1048576.0;
	cr_assert_eq(loom_compile(m.g, m.loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	cr_assert_eq(p->plan.n_recomputed, i2.n_recomputed);
	double loss[STEPS];
	train(p, loss);
	loom_program_free(p);
	p = NULL;
	o.memory_limit_mb = (i2.arena_bytes - 4096) / 1048576.0;
	cr_assert_eq(loom_compile(m.g, m.loss, &o, &p), LOOM_ERR_NOMEM);
	cr_assert(strstr(loom_last_error(), "activations made again (recompute 3)") &&
			  strstr(loom_last_error(), "exceeds the memory limit"),
		  "%s", loom_last_error());
	loom_program_free(p);
	p = NULL;
	setenv("LOOM_RECOMPUTE", "0", 1);
	o.memory_limit_mb = (i0.arena_bytes + i2.arena_bytes) / 2.0 / 1048576.0;
	cr_assert_eq(loom_compile(m.g, m.loss, &o, &p), LOOM_ERR_NOMEM);
	unsetenv("LOOM_RECOMPUTE");
	loom_program_free(p);
	loom_graph_free(m.g);
}
