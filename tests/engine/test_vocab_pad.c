/*
 * tests/engine/test_vocab_pad.c — a classifier over a padded vocabulary
 * (loom_compile_opts.vocab_pad, LOOM_VOCAB_PAD; engine/vocab_pad.c) on the
 * CPU: a small GPT with a tied table of 50 rows, padded to 64, trains as
 * the unpadded one does (losses and parameters within a tight tolerance:
 * the products run at other shapes, so their blocking may sum in another
 * order); the padding rows of the table, its gradient, its O2 master and
 * Adam's state stay exactly zero under weight decay; reads, writes,
 * checkpoints (across padded and unpadded) and safetensors keep 50 rows;
 * an id past the 50 real rows fails its step, naming them.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/program_internal.h"
#include "loom.h"
#include "loom_io.h"
#include "tests/engine/gpt_parts.h"

#define V 50
#define C 32
#define T 8
#define B 2
#define STEPS 4

/* One GPT-2 block, the tied classifier over vocab classes; extra: the
 * logits also summed into the loss (a reader the pass does not know: it
 * must leave them unpadded). */
static void build_of(gpt *m, int extra, int64_t vocab)
{
	cr_assert_eq(gpt_tied_block(m, B, T, vocab, C), LOOM_OK, "%s",
		     m->g ? loom_graph_error(m->g) : "no memory");
	loom_graph *g = m->g;
	if (extra)
		m->loss = loom_add(g, m->loss, loom_sum(g, m->logits));
	loom_mark_output(g, m->logits);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
}

static void build(gpt *m, int extra)
{
	build_of(m, extra, V);
}

/* SGD with momentum, or AdamW; both with weight decay. */
static loom_optim_kind optim = LOOM_OPTIM_SGD;

static loom_program *compile(gpt *m, int pad, loom_opt_level level)
{
	loom_compile_opts o;
	loom_program *p;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim.kind = optim;
	o.optim.lr = optim == LOOM_OPTIM_SGD ? 0.1 : 3e-3;
	o.optim.momentum = 0.9;
	o.optim.weight_decay = 0.1;
	o.amp.level = level;
	if (level != LOOM_O0)
		o.amp.half = LOOM_BF16;
	o.vocab_pad = pad;
	cr_assert_eq(loom_compile(m->g, m->loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	return p;
}

/* Batch k: fixed tokens, positions, next-token targets (two batches). */
static void feed(loom_program *p, int k)
{
	cr_assert_eq(gpt_feed(p, k % 2, B, T, V, 1 /* the last real class, next to the padding */), LOOM_OK, "%s", loom_last_error());
}

static void train(loom_program *p, int from, int steps, double *loss)
{
	for (int k = 0; k < steps; k++) {
		feed(p, from + k);
		cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_last_error());
		loss[k] = loom_loss(p);
	}
}

static double *read_param(loom_program *p, const gpt *m, int i, size_t *n)
{
	*n = (size_t)loom_shape_numel(&m->g->nodes[m->params[i]].shape);
	double *x = malloc(sizeof(double) * *n);
	cr_assert_eq(loom_read_f64(p, m->params[i], x, *n), LOOM_OK, "%s", loom_last_error());
	return x;
}

/* Every parameter of a and b within tol (relative to the larger). */
static void same_params(loom_program *a, loom_program *b, const gpt *m, double tol)
{
	for (int i = 0; i < m->n; i++) {
		size_t n;
		double *x = read_param(a, m, i, &n), *y = read_param(b, m, i, &n);
		for (size_t j = 0; j < n; j++)
			cr_assert(fabs(x[j] - y[j]) <= tol * (1 + fabs(x[j])),
				  "%s[%zu]: %.9g against %.9g", m->g->nodes[m->params[i]].name, j,
				  x[j], y[j]);
		free(x);
		free(y);
	}
}

/* The plan's value behind wte (its half copy under O2 is the param). */
static const loom_node *plan_wte(const loom_program *p, loom_value *pv)
{
	const loom_graph *g = p->plan.g;
	for (loom_value v = 0; v < p->plan.n_fwd; v++)
		if (g->nodes[v].op == LOOM_OP_PARAM && strcmp(g->nodes[v].name, "wte") == 0) {
			*pv = v;
			return &g->nodes[v];
		}
	cr_assert_fail("no wte in the plan");
	return NULL;
}

/* Bytes [from, to) of the storage at addr (on the device) are all zero. */
static void tail_zero(loom_program *p, const void *addr, size_t from, size_t to, const char *what)
{
	unsigned char *h = malloc(to);
	cr_assert_eq(loom_program_download(p, h, addr, to), LOOM_OK);
	for (size_t i = from; i < to; i++)
		cr_assert_eq(h[i], 0, "%s: padding byte %zu of [%zu, %zu) is %u", what, i, from, to,
			     h[i]);
	free(h);
}

/* The padding rows of the table, its gradient, its master and Adam's
 * state: exactly zero. */
static void padding_zero(loom_program *p)
{
	loom_value v;
	const loom_node *w = plan_wte(p, &v);
	cr_assert_eq(w->shape.dims[0], 64, "the plan's table is padded to 64 rows");
	cr_assert_eq(w->unpad_rows, V);
	size_t row = (size_t)C, esz = loom_dtype_size(w->dtype);
	tail_zero(p, loom_value_ptr(p, v), V * row * esz, 64 * row * esz, "wte");
	loom_value gr = w->grad;
	tail_zero(p, loom_value_ptr(p, gr), V * row * loom_dtype_size(p->plan.g->nodes[gr].dtype),
		  64 * row * loom_dtype_size(p->plan.g->nodes[gr].dtype), "wte's gradient");
	if (w->master != LOOM_NONE)
		tail_zero(p, loom_value_ptr(p, w->master), V * row * 4, 64 * row * 4, "wte's master");
	for (int s = 0; s < p->plan.n_params; s++) {
		const loom_param_slot *sl = &p->plan.params[s];
		if (sl->param != v)
			continue;
		cr_assert_eq(sl->numel, 64 * C);
		size_t ssz = loom_dtype_size(sl->state_dtype);
		for (int k = 0; k < p->plan.n_state; k++)
			tail_zero(p, p->arena.state + sl->state_off[k], V * row * ssz, 64 * row * ssz,
				  "Adam's state");
	}
}

/* Trained side by side, padded and not: the same losses and parameters
 * (tol; under AdamW the losses only: Adam's normalised step turns the
 * rounding noise of a gradient that is zero in exact arithmetic, the
 * attention's key bias, into steps of the learning rate's size). */
static void same_training(loom_opt_level level, loom_optim_kind kind, double tol)
{
	optim = kind;
	gpt m;
	build(&m, 0);
	loom_program *a = compile(&m, 0, level), *b = compile(&m, 64, level);
	cr_assert_eq(a->plan.vocab_padded, 0);
	cr_assert_eq(b->plan.vocab, V);
	cr_assert_eq(b->plan.vocab_padded, 64);
	same_params(a, b, &m, 0); /* the same initial values, bit for bit */
	loom_program_info ia, ib;
	loom_program_info_get(a, &ia);
	loom_program_info_get(b, &ib);
	cr_expect_eq(ia.n_param_elems, ib.n_param_elems, "the parameter count is the real one");
	padding_zero(b);
	double la[STEPS], lb[STEPS];
	train(a, 0, STEPS, la);
	train(b, 0, STEPS, lb);
	for (int k = 0; k < STEPS; k++)
		cr_expect(fabs(la[k] - lb[k]) <= tol * fabs(la[k]), "step %d: loss %.9g against %.9g",
			  k, la[k], lb[k]);
	cr_expect(lb[STEPS - 1] < lb[0], "it learns: %g -> %g", lb[0], lb[STEPS - 1]);
	if (kind == LOOM_OPTIM_SGD)
		same_params(a, b, &m, tol);
	padding_zero(b);
	/* The logits a user reads: the real classes, as unpadded. */
	float *xa = malloc(sizeof(float) * B * T * V), *xb = malloc(sizeof(float) * B * T * V);
	cr_assert_eq(loom_read(a, m.logits, xa, B * T * V), LOOM_OK, "%s", loom_last_error());
	cr_assert_eq(loom_read(b, m.logits, xb, B * T * V), LOOM_OK, "%s", loom_last_error());
	for (int i = 0; i < B * T * V; i++)
		cr_assert(fabsf(xa[i] - xb[i]) <= (float)(tol * 10) * (1 + fabsf(xa[i])), "logit %d: %g against %g",
			  i, xa[i], xb[i]);
	free(xa);
	free(xb);
	loom_program_free(a);
	loom_program_free(b);
	loom_graph_free(m.g);
}

Test(vocab_pad, trains_as_unpadded_in_f32)
{
	same_training(LOOM_O0, LOOM_OPTIM_SGD, 1e-5);
	same_training(LOOM_O0, LOOM_OPTIM_ADAMW, 1e-5);
}

Test(vocab_pad, trains_as_unpadded_in_bf16_o1_and_o2_with_masters)
{
	same_training(LOOM_O1, LOOM_OPTIM_SGD, 1e-2);
	same_training(LOOM_O2, LOOM_OPTIM_SGD, 1e-2);
	same_training(LOOM_O2, LOOM_OPTIM_ADAMW, 1e-2);
}

Test(vocab_pad, reads_and_writes_keep_the_real_vocabulary)
{
	gpt m;
	build(&m, 0);
	loom_program *p = compile(&m, 64, LOOM_O0);
	double *w = malloc(sizeof(double) * 64 * C);
	cr_assert_eq(loom_read_f64(p, m.wte, w, V * C), LOOM_OK, "%s", loom_last_error());
	cr_assert_eq(loom_read_f64(p, m.wte, w, 64 * C), LOOM_ERR_SHAPE, "the padded count refused");
	cr_assert_eq(loom_read_grad_f64(p, m.wte, w, V * C), LOOM_OK, "%s", loom_last_error());
	for (int i = 0; i < 64 * C; i++)
		w[i] = 1.0 + i;
	cr_assert_eq(loom_write_f64(p, m.wte, w, V * C), LOOM_OK, "%s", loom_last_error());
	double *r = malloc(sizeof(double) * V * C);
	cr_assert_eq(loom_read_f64(p, m.wte, r, V * C), LOOM_OK);
	for (int i = 0; i < V * C; i++)
		cr_assert_eq(r[i], 1.0 + i);
	padding_zero(p);
	free(w);
	free(r);
	loom_program_free(p);
	loom_graph_free(m.g);
}

/* A checkpoint of one layout loads into the other and training goes on
 * alike; safetensors has the real rows. */
static void across(int save_pad, int load_pad)
{
	gpt m;
	build(&m, 0);
	char ck[] = "/tmp/vocab_pad_ckXXXXXX";
	int fd = mkstemp(ck);
	cr_assert_geq(fd, 0);
	close(fd);
	loom_program *a = compile(&m, save_pad, LOOM_O0), *b = compile(&m, load_pad, LOOM_O0);
	double la[STEPS], lb[STEPS];
	train(a, 0, 2, la);
	cr_assert_eq(loom_save(a, ck), LOOM_OK, "%s", loom_last_error());
	cr_assert_eq(loom_load(b, ck), LOOM_OK, "%s", loom_last_error());
	same_params(a, b, &m, 0);
	train(a, 2, 2, la);
	train(b, 2, 2, lb);
	for (int k = 0; k < 2; k++)
		cr_expect(fabs(la[k] - lb[k]) <= 1e-5 * fabs(la[k]), "step %d after the load: %.9g "
			  "against %.9g", k + 2, la[k], lb[k]);
	same_params(a, b, &m, 1e-5);
	if (load_pad)
		padding_zero(b);
	unlink(ck);
	loom_program_free(a);
	loom_program_free(b);
	loom_graph_free(m.g);
}

Test(vocab_pad, a_padded_checkpoint_loads_unpadded)
{
	across(64, 0);
}

Test(vocab_pad, an_unpadded_checkpoint_loads_padded)
{
	across(0, 64);
}

Test(vocab_pad, safetensors_have_the_real_rows)
{
	gpt m;
	build(&m, 0);
	char st[] = "/tmp/vocab_pad_stXXXXXX";
	int fd = mkstemp(st);
	cr_assert_geq(fd, 0);
	close(fd);
	loom_program *a = compile(&m, 64, LOOM_O2), *b = compile(&m, 0, LOOM_O2);
	double l[2];
	train(a, 0, 2, l);
	cr_assert_eq(loom_export_safetensors(a, st, NULL), LOOM_OK, "%s", loom_last_error());
	/* the header names wte [50, 32] */
	FILE *f = fopen(st, "rb");
	char head[4096] = { 0 };
	cr_assert(fread(head, 1, sizeof(head) - 1, f) > 8);
	fclose(f);
	cr_assert(strstr(head + 8, "\"wte\":{\"dtype\":\"F32\",\"shape\":[50,32]") ||
		  strstr(head + 8, "\"shape\":[50,32]"), "the file's wte: %.300s", head + 8);
	cr_assert_eq(loom_import_safetensors(b, st, NULL, NULL), LOOM_OK, "%s", loom_last_error());
	cr_assert_eq(loom_import_safetensors(a, st, NULL, NULL), LOOM_OK, "%s", loom_last_error());
	same_params(a, b, &m, 0);
	padding_zero(a);
	unlink(st);
	loom_program_free(a);
	loom_program_free(b);
	loom_graph_free(m.g);
}

Test(vocab_pad, the_environment_decides_and_unknown_readers_keep_it_unpadded)
{
	gpt m;
	build(&m, 0);
	setenv("LOOM_VOCAB_PAD", "0", 1);
	loom_program *p = compile(&m, 64, LOOM_O0);
	cr_expect_eq(p->plan.vocab_padded, 0, "LOOM_VOCAB_PAD=0 turns it off");
	loom_program_free(p);
	setenv("LOOM_VOCAB_PAD", "16", 1);
	p = compile(&m, 0, LOOM_O0);
	cr_expect_eq(p->plan.vocab_padded, 64, "LOOM_VOCAB_PAD=16 pads 50 to 64");
	loom_program_free(p);
	unsetenv("LOOM_VOCAB_PAD");
	loom_graph_free(m.g);
	build(&m, 1);
	p = compile(&m, 64, LOOM_O0);
	cr_expect_eq(p->plan.vocab_padded, 0, "the logits' other reader keeps them unpadded");
	loom_program_free(p);
	loom_graph_free(m.g);
}

/* A forward-only plan pads too: a trained program's parameters written into
 * it padded and unpadded, their EVAL loss and the logits a user reads (each
 * row past its padding) agree. */
Test(vocab_pad, a_forward_only_plan_reads_the_same_logits)
{
	gpt m;
	build(&m, 0);
	loom_program *t = compile(&m, 0, LOOM_O0), *inf[2];
	double l[2];
	train(t, 0, 2, l);
	for (int k = 0; k < 2; k++) {
		loom_compile_opts o;
		loom_compile_opts_default(&o);
		o.device = LOOM_DEVICE_CPU;
		o.inference = 1;
		o.vocab_pad = k ? 64 : 0;
		cr_assert_eq(loom_compile(m.g, m.loss, &o, &inf[k]), LOOM_OK, "%s", loom_last_error());
		cr_assert_eq(inf[k]->plan.vocab_padded, k ? 64 : 0);
		for (int i = 0; i < m.n; i++) {
			size_t n;
			double *x = read_param(t, &m, i, &n);
			cr_assert_eq(loom_write_f64(inf[k], m.params[i], x, n), LOOM_OK, "%s",
				     loom_last_error());
			free(x);
		}
		feed(inf[k], 1);
		cr_assert_eq(loom_run(inf[k], LOOM_RUN_EVAL), LOOM_OK, "%s", loom_last_error());
	}
	cr_expect(fabs(loom_loss(inf[0]) - loom_loss(inf[1])) <= 1e-6 * fabs(loom_loss(inf[0])),
		  "loss %.9g against %.9g", loom_loss(inf[0]), loom_loss(inf[1]));
	float *xa = malloc(sizeof(float) * B * T * V), *xb = malloc(sizeof(float) * B * T * V);
	cr_assert_eq(loom_read(inf[0], m.logits, xa, B * T * V), LOOM_OK, "%s", loom_last_error());
	cr_assert_eq(loom_read(inf[1], m.logits, xb, B * T * V), LOOM_OK, "%s", loom_last_error());
	for (int i = 0; i < B * T * V; i++)
		cr_assert(fabsf(xa[i] - xb[i]) <= 1e-5f * (1 + fabsf(xa[i])), "logit %d: %g against %g",
			  i, xa[i], xb[i]);
	free(xa);
	free(xb);
	for (int k = 0; k < 2; k++)
		loom_program_free(inf[k]);
	loom_program_free(t);
	loom_graph_free(m.g);
}

/* A device backend's default (the option -1, LOOM_VOCAB_PAD unset): its
 * planning's multiple, here CUDA's 128 on the CPU's kernels, pads GPT-2's
 * 50257 classes to llm.c's 50304 and trains as the CPU's unpadded plan;
 * the option 0 or LOOM_VOCAB_PAD=0 keeps it unpadded, the CPU's own
 * default pads nothing, and the default leaves a 50-class head alone. */
static loom_program *compile_on(const loom_backend *be, gpt *m, int pad)
{
	loom_compile_opts o;
	loom_program *p = NULL;
	loom_compile_opts_default(&o);
	cr_assert_eq(o.vocab_pad, -1, "the default leaves the multiple to the backend");
	o.device = LOOM_DEVICE_CPU;
	o.optim.lr = 0.1;
	if (pad >= 0)
		o.vocab_pad = pad;
	loom_test_backend = be;
	loom_status st = loom_compile(m->g, m->loss, &o, &p);
	loom_test_backend = NULL;
	cr_assert_eq(st, LOOM_OK, "%s", loom_last_error());
	return p;
}

Test(vocab_pad, a_device_backend_pads_gpt2_by_default)
{
	static loom_backend dev;
	static loom_backend_planning dev_planning;
	dev = loom_cpu_backend;
	dev_planning = *loom_cpu_backend.planning;
	dev_planning.vocab_pad = 128;
	dev.name = "fake-device";
	dev.planning = &dev_planning;
	cr_assert_eq(loom_cpu_backend.planning->vocab_pad, 0, "the CPU pads nothing by default");
	gpt m;
	build_of(&m, 0, 50257);
	loom_program *pd = compile_on(&dev, &m, -1);
	cr_expect_eq(pd->plan.vocab, 50257);
	cr_expect_eq(pd->plan.vocab_padded, 50304, "the device's default pads 50257 to %lld",
		     (long long)pd->plan.vocab_padded);
	loom_program *off = compile_on(&dev, &m, 0);
	cr_expect_eq(off->plan.vocab_padded, 0, "vocab_pad 0 turns the device's default off");
	setenv("LOOM_VOCAB_PAD", "0", 1);
	loom_program *env_off = compile_on(&dev, &m, -1);
	unsetenv("LOOM_VOCAB_PAD");
	cr_expect_eq(env_off->plan.vocab_padded, 0, "LOOM_VOCAB_PAD=0 turns it off");
	loom_program *cpu = compile_on(NULL, &m, -1);
	cr_expect_eq(cpu->plan.vocab_padded, 0, "the CPU's default is unpadded");
	/* A small classifier: 50 classes to 128 would add more than an
	 * eighth; asked for, 64 still pads it. */
	gpt small;
	build(&small, 0);
	loom_program *sp = compile_on(&dev, &small, -1), *sp64 = compile_on(&dev, &small, 64);
	cr_expect_eq(sp->plan.vocab_padded, 0, "the default padded 50 classes to %lld",
		     (long long)sp->plan.vocab_padded);
	cr_expect_eq(sp64->plan.vocab_padded, 64);
	loom_program_free(sp);
	loom_program_free(sp64);
	loom_graph_free(small.g);
	/* The padded plan's step and the rows a user reads are the unpadded
	 * plan's (the products' other shapes may sum in another order). */
	double lp, lu;
	loom_program *both[2] = { pd, cpu };
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(gpt_feed(both[i], 0, B, T, 50257, 1), LOOM_OK, "%s", loom_last_error());
		cr_assert_eq(loom_run(both[i], LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_last_error());
	}
	lp = loom_loss(pd);
	lu = loom_loss(cpu);
	cr_expect(fabs(lp - lu) <= 1e-6 * fabs(lu), "loss %.9g padded, %.9g unpadded", lp, lu);
	same_params(pd, cpu, &m, 1e-5);
	loom_program_free(pd);
	loom_program_free(off);
	loom_program_free(env_off);
	loom_program_free(cpu);
	loom_graph_free(m.g);
}

/* The option's range: -1 (the backend's) up to 2^20. */
Test(vocab_pad, a_negative_multiple_is_refused)
{
	gpt m;
	build(&m, 0);
	loom_compile_opts o;
	loom_program *p = NULL;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.vocab_pad = -2;
	cr_assert_eq(loom_compile(m.g, m.loss, &o, &p), LOOM_ERR_INVALID);
	cr_expect(strstr(loom_last_error(), "vocab_pad -2") != NULL, "%s", loom_last_error());
	loom_program_free(p);
	loom_graph_free(m.g);
}

/* Every parameter of m read from p (freed by the caller). */
static double **read_all(loom_program *p, const gpt *m)
{
	double **x = calloc((size_t)m->n, sizeof(double *));
	cr_assert(x);
	for (int i = 0; i < m->n; i++) {
		size_t n;
		x[i] = read_param(p, m, i, &n);
	}
	return x;
}

/*
 * An id past the real vocabulary but inside the padded table (50 of 64
 * rows): the step fails in the words both backends share (loom_bad_id),
 * naming the table's real rows, leaves every parameter as it was (bit for
 * bit), and the next good step trains. The CUDA backend's twin is
 * test_cuda_ops' bad_id_fails_the_step_like_the_cpu.
 */
Test(vocab_pad, an_id_past_the_real_vocabulary_fails_the_step)
{
	optim = LOOM_OPTIM_SGD;
	gpt m;
	build(&m, 0);
	for (loom_value v = 0; v < m.g->n; v++)
		if (m.g->nodes[v].op == LOOM_OP_EMBEDDING && m.g->nodes[v].src[1] == m.wte)
			loom_set_name(m.g, v, "tok_emb");
	loom_program *p = compile(&m, 64, LOOM_O0);
	cr_assert_eq(p->plan.vocab_padded, 64);
	double loss[1];
	train(p, 0, 1, loss);
	double **before = read_all(p, &m);
	feed(p, 1);
	int32_t ids[B * T];
	for (int j = 0; j < B * T; j++)
		ids[j] = j % V;
	ids[3] = V;
	cr_assert_eq(loom_set_input(p, "ids", ids, LOOM_I32, B * T), LOOM_OK);
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_ERR_INVALID, "%s", loom_program_error(p));
	cr_expect_str_eq(loom_program_error(p),
			 "embedding 'tok_emb': id 50 at position 3 is outside the table's [0, 50)");
	double **after = read_all(p, &m);
	for (int i = 0; i < m.n; i++) {
		size_t n = (size_t)loom_shape_numel(&m.g->nodes[m.params[i]].shape);
		cr_expect(!memcmp(before[i], after[i], n * sizeof(double)),
			  "%s changed by the failed step", m.g->nodes[m.params[i]].name);
		free(before[i]);
		free(after[i]);
	}
	free(before);
	free(after);
	train(p, 2, 1, loss);
	cr_expect(isfinite(loss[0]), "the next step's loss %g", loss[0]);
	loom_program_free(p);
	loom_graph_free(m.g);
}
