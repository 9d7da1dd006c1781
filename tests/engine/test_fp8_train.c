/*
 * tests/engine/test_fp8_train.c — FP8 training emulated on the CPU
 * (loom_amp_opts.fp8: E4M3 products forward, E5M2 gradients backward,
 * current per-tensor scaling; amp/amp_pass.c, engine/cpu/fp8_qdq.c): a
 * small GPT (two blocks, untied classifier) trained 30 steps with AdamW at
 * O1 and O2, bf16 and fp8, from the same initial weights, and the ConvNet
 * (its middle conv in fp8; under LOOM_CPU_ISA=avx2, test_fp8_train_avx2,
 * through the planner's blocked nChw8c format) at O1;
 * fp8's loss follows bf16's at the same level within a measured bound at
 * every step, it learns, and it is not bf16 itself (the roundings run);
 * the roundings kept in fp8 (LOOM_FP8_STORAGE) give the same losses to the
 * bit in a smaller plan, and resume across the setting.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "examples/models.h"
#include "loom.h"
#include "tests/engine/gpt_parts.h"

#define V 40
#define C 32
#define T 16
#define B 4
#define STEPS 30

/*
 * The bound: the largest relative gap |fp8 - bf16| / bf16 over the 30
 * steps, measured 0.0091 at O1 (step 24) and 0.0051 at O2 (step 27), each
 * against bf16 at the same level (the log line prints it), allowed 0.03.
 * E4M3 keeps 3 mantissa bits to bf16's 7, so the losses part a little and
 * stay close while both learn (3.83 -> 1.59 in 30 steps).
 */
#define BOUND 0.03
/* The ConvNet's: measured 0.034 (portable), 0.038 (AVX-512 bf16) and 0.042
 * (AVX2, its QDQ nodes on nChw8c), all at the last step, where the loss is
 * down to 0.06 and a 0.002 gap is 4%; allowed 0.10. */
#define CONV_BOUND 0.10

static void build(gpt *m)
{
	cr_assert_eq(gpt_two_blocks(m, B, T, V, C), LOOM_OK, "%s",
		     m->g ? loom_graph_error(m->g) : "out of memory");
}

/* fp8: 0 bf16, else the scaling recipe (LOOM_FP8_SCALING_CURRENT or
 * _DELAYED); the compile options of these runs. */
static void fp8_opts(loom_compile_opts *o, int fp8)
{
	o->amp.fp8 = fp8 != 0;
	o->amp.fp8_scaling = fp8;
}

/* The GPT compiled for AdamW at level with fp8 (fp8_opts). */
static loom_program *compile_gpt(gpt *m, loom_opt_level level, int fp8)
{
	build(m);
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim.kind = LOOM_OPTIM_ADAMW;
	o.optim.lr = 3e-3;
	o.optim.weight_decay = 0.1;
	o.amp.level = level;
	o.amp.half = LOOM_BF16;
	fp8_opts(&o, fp8);
	loom_program *p = NULL;
	cr_assert_eq(loom_compile(m->g, m->loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	return p;
}

/* Steps [from, to) over 3 batches in turn; loss[k] the loss of step k. */
static void train_steps(loom_program *p, int from, int to, double *loss)
{
	for (int k = from; k < to; k++) {
		cr_assert_eq(gpt_feed(p, k % 3, B, T, V, 0), LOOM_OK, "%s", loom_last_error());
		cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_last_error());
		loss[k] = loom_loss(p);
		cr_assert(isfinite(loss[k]), "step %d: loss %g", k, loss[k]);
	}
}

/* 30 AdamW steps; loss[k] the loss of step k. */
static void train(loom_opt_level level, int fp8, double *loss)
{
	gpt m;
	loom_program *p = compile_gpt(&m, level, fp8);
	train_steps(p, 0, STEPS, loss);
	loom_program_free(p);
	loom_graph_free(m.g);
}

/* got (fp8) against ref (bf16), step by step: the worst relative gap within
 * bound, learning (the last loss below learn times the first), and not the
 * same bits (something was rounded). what names the run in the messages. */
static void follows(const char *what, const double *ref, const double *got, double bound,
		    double learn)
{
	double worst = 0, diff = 0;
	int at = 0;
	for (int k = 0; k < STEPS; k++) {
		double r = fabs(got[k] - ref[k]) / ref[k];
		diff += fabs(got[k] - ref[k]);
		if (r > worst)
			worst = r, at = k;
	}
	cr_log_info("%s against bf16 over %d steps: worst relative gap %.4f at step %d (%.5f vs "
		    "%.5f); losses %.4f -> %.4f (bf16 %.4f -> %.4f)",
		    what, STEPS, worst, at, got[at], ref[at], got[0], got[STEPS - 1], ref[0],
		    ref[STEPS - 1]);
	cr_assert_leq(worst, bound, "%s: step %d's loss %.5f is %.4f off bf16's %.5f", what, at,
		      got[at], worst, ref[at]);
	cr_assert_lt(got[STEPS - 1], learn * got[0], "%s does not learn: %.4f -> %.4f", what,
		     got[0], got[STEPS - 1]);
	cr_assert_gt(diff, 0, "%s gave bf16's losses to the bit: nothing rounded", what);
}

static void follows_bf16(loom_opt_level level, int recipe)
{
	double ref[STEPS], got[STEPS];
	char what[48];
	train(level, 0, ref);
	train(level, recipe, got);
	snprintf(what, sizeof(what), "fp8 O%d %s", (int)level,
		 recipe == LOOM_FP8_SCALING_DELAYED ? "delayed" : "current");
	follows(what, ref, got, BOUND, 0.8);
}

Test(fp8_train, o1_follows_bf16)
{
	follows_bf16(LOOM_O1, LOOM_FP8_SCALING_CURRENT);
}

Test(fp8_train, o2_follows_bf16)
{
	follows_bf16(LOOM_O2, LOOM_FP8_SCALING_CURRENT);
}

Test(fp8_train, o1_delayed_follows_bf16)
{
	follows_bf16(LOOM_O1, LOOM_FP8_SCALING_DELAYED);
}

Test(fp8_train, o2_delayed_follows_bf16)
{
	follows_bf16(LOOM_O2, LOOM_FP8_SCALING_DELAYED);
}

/* Delayed scaling's first step has no history and casts as current
 * scaling does (the same loss to the bit); later steps cast with the
 * history's scales, and part from it. */
Test(fp8_train, delayed_starts_as_current)
{
	double cur[STEPS], del[STEPS];
	train(LOOM_O2, LOOM_FP8_SCALING_CURRENT, cur);
	train(LOOM_O2, LOOM_FP8_SCALING_DELAYED, del);
	cr_assert_eq(del[0], cur[0], "step 0: delayed %.9g, current %.9g", del[0], cur[0]);
	double diff = 0;
	for (int k = 1; k < STEPS; k++)
		diff += fabs(del[k] - cur[k]);
	cr_assert_gt(diff, 0, "delayed scaling gave current scaling's losses at every step");
}

/* Delayed scaling resumes bit for bit: 12 steps, a checkpoint, a fresh
 * program that loads it and trains the other 18 give the uninterrupted
 * run's losses exactly (the scales and histories are in the file; without
 * them the resumed run would cast its first step by current scaling). */
Test(fp8_train, delayed_resumes_bit_for_bit)
{
	enum { CUT = 12 };
	double whole[STEPS], parts[STEPS];
	char path[] = "/tmp/loom_fp8_resume_XXXXXX";
	int fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	close(fd);
	train(LOOM_O2, LOOM_FP8_SCALING_DELAYED, whole);
	gpt m;
	loom_program *p = compile_gpt(&m, LOOM_O2, LOOM_FP8_SCALING_DELAYED);
	train_steps(p, 0, CUT, parts);
	cr_assert_eq(loom_save(p, path), LOOM_OK, "%s", loom_program_error(p));
	loom_program_free(p);
	loom_graph_free(m.g);
	p = compile_gpt(&m, LOOM_O2, LOOM_FP8_SCALING_DELAYED);
	cr_assert_eq(loom_load(p, path), LOOM_OK, "%s", loom_program_error(p));
	train_steps(p, CUT, STEPS, parts);
	loom_program_free(p);
	loom_graph_free(m.g);
	unlink(path);
	for (int k = 0; k < STEPS; k++)
		cr_assert_eq(parts[k], whole[k], "step %d: resumed %.9g, uninterrupted %.9g", k,
			     parts[k], whole[k]);
}

/* A checkpoint of one recipe is refused by a program of the other (the
 * recipe shapes the saved state), naming the fingerprint. */
Test(fp8_train, recipe_in_fingerprint)
{
	char path[] = "/tmp/loom_fp8_recipe_XXXXXX";
	int fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	close(fd);
	gpt m, n;
	loom_program *p = compile_gpt(&m, LOOM_O2, LOOM_FP8_SCALING_DELAYED);
	loom_program *q = compile_gpt(&n, LOOM_O2, LOOM_FP8_SCALING_CURRENT);
	cr_assert_eq(loom_save(p, path), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_load(q, path), LOOM_ERR_MISMATCH);
	cr_assert(strstr(loom_program_error(q), "fingerprint"), "%s", loom_program_error(q));
	unlink(path);
	loom_program_free(p);
	loom_program_free(q);
	loom_graph_free(m.g);
	loom_graph_free(n.g);
}

/* ------------------------------------------------------------ fp8 storage */

/* LOOM_FP8_STORAGE for the compiles that follow. */
static void fp8_storage(int on)
{
	cr_assert_eq(setenv("LOOM_FP8_STORAGE", on ? "1" : "0", 1), 0);
}

#define STORE_STEPS 8

/* STORE_STEPS steps with fp8 storage on or off; the plan's figures. */
static void train_stored(loom_opt_level level, int fp8, int store, double *loss,
			 loom_program_info *info)
{
	gpt m;
	fp8_storage(store);
	loom_program *p = compile_gpt(&m, level, fp8);
	loom_program_info_get(p, info);
	info->backend = NULL; /* the program's, freed below */
	train_steps(p, 0, STORE_STEPS, loss);
	loom_program_free(p);
	loom_graph_free(m.g);
	unsetenv("LOOM_FP8_STORAGE");
}

/* The roundings only products read kept in fp8 (engine/compile_passes.c's
 * fp8 storage pass, decoded by the CPU's products) give the losses of the
 * roundings kept in bf16 to the bit, at both levels and both recipes. */
static void storage_same_losses(loom_opt_level level, int recipe)
{
	double off[STORE_STEPS], on[STORE_STEPS];
	loom_program_info ioff, ion;
	train_stored(level, recipe, 0, off, &ioff);
	train_stored(level, recipe, 1, on, &ion);
	cr_assert_eq(ioff.n_fp8_stored, 0, "storage off: %d tensors stored", ioff.n_fp8_stored);
	cr_assert_gt(ion.n_fp8_stored, 0, "storage on: no tensor stored");
	for (int k = 0; k < STORE_STEPS; k++)
		cr_assert_eq(on[k], off[k], "O%d recipe %d step %d: stored %.17g, unstored %.17g",
			     (int)level, recipe, k, on[k], off[k]);
}

Test(fp8_storage, same_losses_current)
{
	storage_same_losses(LOOM_O1, LOOM_FP8_SCALING_CURRENT);
	storage_same_losses(LOOM_O2, LOOM_FP8_SCALING_CURRENT);
}

Test(fp8_storage, same_losses_delayed)
{
	storage_same_losses(LOOM_O1, LOOM_FP8_SCALING_DELAYED);
	storage_same_losses(LOOM_O2, LOOM_FP8_SCALING_DELAYED);
}

/* The plan counts a stored rounding at one byte an element (and its
 * scale): the activations with one buffer each fall by exactly what the
 * stored tensors save, the reused region and the arena fall too. The GPT
 * stores the E4M3 operands of its 8 fp8 products (each block's qkv,
 * projection, fc and fc projection): 16 tensors; the E5M2 gradients are
 * read by the bias gradient too, and stay bf16. */
Test(fp8_storage, plan_counts_one_byte)
{
	double loss[STORE_STEPS];
	loom_program_info ioff, ion;
	train_stored(LOOM_O1, LOOM_FP8_SCALING_CURRENT, 0, loss, &ioff);
	train_stored(LOOM_O1, LOOM_FP8_SCALING_CURRENT, 1, loss, &ion);
	cr_log_info("fp8 storage: %d tensors, %zu bytes kept, %zu saved; activations %zu -> %zu, "
		    "naive %zu -> %zu, arena %zu -> %zu", ion.n_fp8_stored, ion.fp8_stored_bytes,
		    ion.fp8_saved_bytes, ioff.activation_bytes, ion.activation_bytes,
		    ioff.activation_naive_bytes, ion.activation_naive_bytes, ioff.arena_bytes,
		    ion.arena_bytes);
	cr_assert_eq(ion.n_fp8_stored, 16);
	cr_assert_eq(ioff.fp8_saved_bytes, 0);
	cr_assert_gt(ion.fp8_saved_bytes, 0);
	cr_assert_eq(ioff.activation_naive_bytes - ion.activation_naive_bytes, ion.fp8_saved_bytes,
		     "naive activations %zu -> %zu, the stored tensors save %zu",
		     ioff.activation_naive_bytes, ion.activation_naive_bytes, ion.fp8_saved_bytes);
	cr_assert_lt(ion.activation_bytes, ioff.activation_bytes);
	cr_assert_lt(ion.arena_bytes, ioff.arena_bytes);
}

/* A checkpoint does not hold activations: one saved with fp8 storage on
 * resumes with it off (and the losses are those of the run never
 * interrupted, with it on). */
Test(fp8_storage, resumes_across_the_setting)
{
	enum { CUT = 4 };
	double whole[STORE_STEPS], parts[STORE_STEPS];
	loom_program_info info;
	char path[] = "/tmp/loom_fp8_store_XXXXXX";
	int fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	close(fd);
	train_stored(LOOM_O2, LOOM_FP8_SCALING_DELAYED, 1, whole, &info);
	gpt m;
	fp8_storage(1);
	loom_program *p = compile_gpt(&m, LOOM_O2, LOOM_FP8_SCALING_DELAYED);
	train_steps(p, 0, CUT, parts);
	cr_assert_eq(loom_save(p, path), LOOM_OK, "%s", loom_program_error(p));
	loom_program_free(p);
	loom_graph_free(m.g);
	fp8_storage(0);
	p = compile_gpt(&m, LOOM_O2, LOOM_FP8_SCALING_DELAYED);
	cr_assert_eq(loom_load(p, path), LOOM_OK, "%s", loom_program_error(p));
	train_steps(p, CUT, STORE_STEPS, parts);
	loom_program_free(p);
	loom_graph_free(m.g);
	unsetenv("LOOM_FP8_STORAGE");
	unlink(path);
	for (int k = 0; k < STORE_STEPS; k++)
		cr_assert_eq(parts[k], whole[k], "step %d: resumed %.17g, uninterrupted %.17g", k,
			     parts[k], whole[k]);
}

/* The ConvNet (examples/models.c) on 30 batches of 8 synthetic images
 * whose label is the brighter of 10 stripes: 30 SGD steps. */
static void train_convnet(int fp8, double *loss)
{
	enum { N = 8 };
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value l = loom_model_convnet(g, N, NULL);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim.lr = 0.001;
	o.optim.momentum = 0.9;
	o.amp.level = LOOM_O1;
	o.amp.half = LOOM_BF16;
	fp8_opts(&o, fp8);
	loom_program *p = NULL;
	cr_assert_eq(loom_compile(g, l, &o, &p), LOOM_OK, "%s", loom_last_error());
	static float x[N * 28 * 28];
	int32_t y[N];
	for (int k = 0; k < STEPS; k++) {
		for (int i = 0; i < N; i++) {
			y[i] = (int32_t)((i * 7 + k * 3) % 10);
			for (int j = 0; j < 28 * 28; j++)
				x[i * 784 + j] = (float)(((j * 13 + i * 5 + k * 11) % 17) / 34.0) +
						 (j % 28 / 3 == y[i] ? 0.25f : 0.0f);
		}
		cr_assert_eq(loom_set_input(p, "image", x, LOOM_F32, N * 784), LOOM_OK);
		cr_assert_eq(loom_set_input(p, "label", y, LOOM_I32, N), LOOM_OK);
		cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
		loss[k] = loom_loss(p);
		cr_assert(isfinite(loss[k]), "step %d: loss %g", k, loss[k]);
	}
	loom_program_free(p);
	loom_graph_free(g);
}

Test(fp8_train, convnet_follows_bf16)
{
	double ref[STEPS], got[STEPS];
	train_convnet(0, ref);
	train_convnet(LOOM_FP8_SCALING_CURRENT, got);
	follows("ConvNet fp8 O1 current", ref, got, CONV_BOUND, 0.5);
}

Test(fp8_train, convnet_delayed_follows_bf16)
{
	double ref[STEPS], got[STEPS];
	train_convnet(0, ref);
	train_convnet(LOOM_FP8_SCALING_DELAYED, got);
	follows("ConvNet fp8 O1 delayed", ref, got, CONV_BOUND, 0.5);
}
