/*
 * tests/engine/cpu/test_ksearch.c — the kernels the CPU backend chooses by
 * measurement (engine/cpu/ksearch.c): every candidate the search can pick,
 * on every conv and product node of the ConvNet, a CIFAR ResNet-18 and a
 * GPT-shaped stack of linears, against a double-precision reference of the
 * node; and the search itself (a choice per node in --dump-graph, the
 * process's cache, the fixed default, a forced kernel, a bad one refused,
 * the choice rule on crafted times and on a real search's).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cpu/kernels.h"
#include "engine/cpu/ksearch.h"
#include "engine/cpu/ops.h"
#include "engine/program_internal.h"
#include "examples/models.h"
#include "graph/ops/ops.h"
#include "loom.h"
#include "tests/engine/print_text.h"

static void env_clean(void)
{
	unsetenv("LOOM_KERNEL_SEARCH");
	unsetenv("LOOM_CPU_CONV");
	unsetenv("LOOM_CPU_PRODUCT");
}

static uint32_t lcg = 1;

static double rnd(void)
{
	lcg = lcg * 1664525u + 1013904223u;
	return (double)(lcg >> 8) / 8388608.0 - 1.0;
}

static int64_t numel_of(const loom_plan *p, loom_value v)
{
	return loom_shape_numel(&p->g->nodes[v].shape);
}

/* The node in f64 on loom's reference kernels (OpenBLAS); abs: the same on
 * the sources' magnitudes, the scale of each result's rounding error. */
static void reference(const loom_plan *p, loom_value v, double *const *src, double *out)
{
	const loom_node *n = &p->g->nodes[v];
	loom_conv_shape s;
	void *ws = NULL;
	if (n->op == LOOM_OP_CONV2D || n->op == LOOM_OP_CONV2D_BWD_DATA ||
	    n->op == LOOM_OP_CONV2D_BWD_FILTER) {
		loom_conv_shape_of(p->g, v, &s);
		ws = aligned_alloc(64, (loom_cpu_conv2d_workspace(&s, 8) + 63) & ~(size_t)63);
		cr_assert(ws);
	}
	const loom_node *x = &p->g->nodes[n->src[0]];
	switch (n->op) {
	case LOOM_OP_CONV2D:
		loom_cpu_conv2d_fwd_f64(&s, src[0], src[1], n->nsrc > 2 ? src[2] : NULL, out, ws);
		break;
	case LOOM_OP_CONV2D_BWD_DATA:
		loom_cpu_conv2d_bwd_data_f64(&s, src[0], src[1], out, ws);
		break;
	case LOOM_OP_CONV2D_BWD_FILTER:
		loom_cpu_conv2d_bwd_filter_f64(&s, src[0], src[1], out, ws);
		break;
	case LOOM_OP_LINEAR: {
		const loom_node *w = &p->g->nodes[n->src[1]];
		loom_cpu_linear_fwd_f64((int)loom_shape_rows(&x->shape), (int)w->shape.dims[1],
					(int)w->shape.dims[0], src[0], src[1],
					n->nsrc > 2 ? src[2] : NULL, out);
		break;
	}
	default: {
		int ta = n->a.mm.ta, tb = n->a.mm.tb;
		int k = (int)(ta ? loom_shape_rows(&x->shape) : loom_shape_last(&x->shape));
		loom_cpu_gemm_f64(ta, tb, (int)loom_shape_rows(&n->shape),
				  (int)loom_shape_last(&n->shape), k, 1, src[0], src[1], 0, out);
		break;
	}
	}
	free(ws);
}

/* Every candidate of every searchable node of p against the reference;
 * returns how many (node, candidate) pairs ran. */
static int check_candidates(const loom_plan *p, const char *model)
{
	int ran = 0;
	for (loom_value v = 0; v < p->g->n; v++) {
		const loom_node *n = &p->g->nodes[v];
		loom_cpu_kern cand[LOOM_CPU_KERN_COUNT];
		int nc = loom_cpu_kern_candidates(p, v, cand);
		if (!nc)
			continue;
		float *sf[LOOM_MAX_SRC] = { 0 };
		double *sd[LOOM_MAX_SRC] = { 0 }, *sa[LOOM_MAX_SRC] = { 0 };
		int64_t no = numel_of(p, v);
		for (int i = 0; i < n->nsrc; i++) {
			int64_t c = numel_of(p, n->src[i]);
			sf[i] = malloc(sizeof(float) * c);
			sd[i] = malloc(sizeof(double) * c);
			sa[i] = malloc(sizeof(double) * c);
			cr_assert(sf[i] && sd[i] && sa[i]);
			for (int64_t j = 0; j < c; j++) {
				sf[i][j] = (float)rnd();
				sd[i][j] = sf[i][j];
				sa[i][j] = fabs(sd[i][j]);
			}
		}
		double *ref = malloc(sizeof(double) * no), *mag = malloc(sizeof(double) * no);
		float *out = malloc(sizeof(float) * no);
		cr_assert(ref && mag && out);
		reference(p, v, sd, ref);
		reference(p, v, sa, mag);
		for (int c = 0; c < nc; c++) {
			loom_cpu_node_kern nk = { 0 };
			if (loom_cpu_kern_make(p, v, cand[c], &nk))
				continue; /* not on this machine's path */
			size_t wsb = loom_cpu_kern_ws(p, v, &nk);
			void *ws = aligned_alloc(64, wsb ? wsb : 64);
			cr_assert(ws);
			for (int64_t j = 0; j < no; j++)
				out[j] = NAN;
			cr_assert_eq(loom_cpu_kern_run(p, v, &nk, (void *const *)sf, out, ws), 0,
				     "%s node %d (%s): %s failed", model, v,
				     loom_op_defs[n->op]->name, loom_cpu_kern_name(cand[c]));
			for (int64_t j = 0; j < no; j++)
				cr_assert(fabs(out[j] - ref[j]) <= 1e-4 * mag[j] + 1e-6,
					  "%s node %d (%s) on %s: element %lld is %.9g, reference %.9g",
					  model, v, loom_op_defs[n->op]->name,
					  loom_cpu_kern_name(cand[c]), (long long)j, out[j], ref[j]);
			free(ws);
			loom_cpu_kern_release(&nk);
			ran++;
		}
		for (int i = 0; i < n->nsrc; i++) {
			free(sf[i]);
			free(sd[i]);
			free(sa[i]);
		}
		free(ref);
		free(mag);
		free(out);
	}
	return ran;
}

/* Compiled with the search on or off; on, with a budget that no loaded
 * machine spends (under ASan, beside the other engineers' builds, the
 * ConvNet's search once ran past the default 5 s and its last node took
 * the fixed default), so that every node is measured. */
static loom_program *compile(loom_graph *g, loom_value loss, int search)
{
	loom_compile_opts o;
	loom_program *p = NULL;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.kernel_search = search ? LOOM_KERNEL_SEARCH_ON : LOOM_KERNEL_SEARCH_OFF;
	o.kernel_search_ms = 600e3;
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	return p;
}

/* The GPT's products (gpt_ddp's defaults: width 128, 4x MLP, qkv, 256-byte
 * vocabulary) over 64 rows: a stack of linears, their gradients matmuls. */
static loom_value gpt_products(loom_graph *g)
{
	static const int width[] = { 128, 384, 128, 512, 128, 256 };
	int64_t xd[2] = { 64, 128 };
	loom_value h = loom_input(g, "x", LOOM_F32, 2, xd);
	for (int i = 1; i < 6; i++) {
		char nm[16];
		int64_t wd[2] = { width[i], width[i - 1] }, bd[1] = { width[i] };
		snprintf(nm, sizeof(nm), "w%d", i);
		loom_value w = loom_param(g, nm, LOOM_F32, 2, wd, LOOM_INIT_KAIMING_UNIFORM, width[i - 1]);
		snprintf(nm, sizeof(nm), "b%d", i);
		loom_value b = i % 2 ? loom_param(g, nm, LOOM_F32, 1, bd, LOOM_INIT_UNIFORM_FAN_IN,
						   width[i - 1]) :
				       LOOM_NONE;
		h = loom_linear(g, h, w, b);
	}
	return loom_mean(g, h);
}

Test(ksearch, every_candidate_agrees_with_the_reference)
{
	env_clean();
	for (int m = 0; m < 3; m++) {
		loom_graph *g;
		loom_value logits, loss;
		cr_assert_eq(loom_graph_new(&g), LOOM_OK);
		const char *name = m == 0 ? "convnet" : m == 1 ? "resnet18" : "gpt products";
		loss = m == 0 ? loom_model_convnet(g, 4, &logits) :
		       m == 1 ? loom_model_resnet(g, 18, 2, 32, 10, &logits) :
				gpt_products(g);
		loom_program *p = compile(g, loss, 0);
		int ran = check_candidates(&p->plan, name);
		cr_assert_gt(ran, 0, "%s: no candidate ran", name);
		loom_program_free(p);
		loom_graph_free(g);
	}
}

/* The ConvNet's --dump-graph; every conv and product line carries its
 * kernel. */
static char *dump(loom_program *p)
{
	return print_text(loom_program_dump, p);
}

/* Lines holding a and b; a before b when before is set. */
static int lines_where(const char *text, const char *a, const char *b, int before)
{
	int n = 0;
	for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
		const char *e = strchr(l, '\n');
		size_t len = e ? (size_t)(e - l) : strlen(l);
		char line[1024];
		snprintf(line, sizeof(line), "%.*s", (int)len, l);
		const char *pa = strstr(line, a), *pb = b ? strstr(line, b) : pa;
		if (pa && pb && (!before || pa < pb))
			n++;
	}
	return n;
}

static int lines_with(const char *text, const char *a, const char *b)
{
	return lines_where(text, a, b, 0);
}

static char *convnet_dump(int search)
{
	loom_graph *g;
	loom_value logits;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value loss = loom_model_convnet(g, 8, &logits);
	loom_program *p = compile(g, loss, search);
	char *d = dump(p);
	loom_program_free(p);
	loom_graph_free(g);
	return d;
}

Test(ksearch, the_search_chooses_caches_and_can_be_fixed_or_forced)
{
	env_clean();
	char *d = convnet_dump(1);
	/* node lines (the op before the dtype column), not step lines */
	int convs = lines_where(d, "conv2d", " f32 ", 1);
	int prods = lines_where(d, "linear", " f32 ", 1) + lines_where(d, "matmul", " f32 ", 1);
	cr_assert_gt(convs, 0);
	cr_assert_gt(prods, 0);
	cr_assert_eq(lines_with(d, "conv2d", "(measured: im2col "), convs, "%s", d);
	cr_assert_eq(lines_with(d, "kernel ", "(measured: sgemm "), prods, "%s", d);
	free(d);

	d = convnet_dump(1); /* the same shapes: the process's cache */
	cr_assert_eq(lines_with(d, "kernel ", "(measured earlier: "), convs + prods, "%s", d);
	free(d);

	d = convnet_dump(0);
	cr_assert_eq(lines_with(d, "kernel ", "(fixed: kernel search off)"), convs + prods, "%s", d);
	cr_assert_eq(lines_with(d, "kernel sgemm", NULL), prods, "%s", d);
	free(d);

	setenv("LOOM_KERNEL_SEARCH", "off", 1);
	d = convnet_dump(1);
	cr_assert_eq(lines_with(d, "kernel ", "(fixed: kernel search off)"), convs + prods, "%s", d);
	free(d);
	unsetenv("LOOM_KERNEL_SEARCH");

	setenv("LOOM_CPU_CONV", "im2col", 1);
	setenv("LOOM_CPU_PRODUCT", "matmul", 1);
	d = convnet_dump(1);
	cr_assert_eq(lines_with(d, "kernel im2col (forced", NULL), convs, "%s", d);
	cr_assert_eq(lines_with(d, "kernel ", "(forced"), convs + prods, "%s", d);
	free(d);

	loom_graph *g;
	loom_value logits;
	loom_program *p = NULL;
	loom_compile_opts o;
	setenv("LOOM_CPU_CONV", "winograd", 1);
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value loss = loom_model_convnet(g, 8, &logits);
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	cr_assert_neq(loom_compile(g, loss, &o, &p), LOOM_OK);
	cr_assert(strstr(loom_last_error(), "LOOM_CPU_CONV=winograd"), "%s", loom_last_error());
	loom_program_free(p);
	o.kernel_search = 7;
	env_clean();
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_ERR_INVALID);
	cr_assert(strstr(loom_last_error(), "kernel_search"), "%s", loom_last_error());
	loom_program_free(p);
	loom_graph_free(g);
}

/* Three training steps of the ConvNet (O0 and O1 bf16) on the kernels the
 * environment forces (or the fixed default): the losses. */
static void convnet_losses(const char *conv, const char *prod, int level, double *loss)
{
	loom_graph *g;
	loom_value logits;
	loom_program *p = NULL;
	loom_compile_opts o;
	static float img[8 * 784];
	int32_t lab[8];
	uint32_t s = 7;
	env_clean();
	if (conv)
		setenv("LOOM_CPU_CONV", conv, 1);
	if (prod)
		setenv("LOOM_CPU_PRODUCT", prod, 1);
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value l = loom_model_convnet(g, 8, &logits);
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim.momentum = 0.9;
	o.amp.level = level;
	o.amp.half = LOOM_BF16;
	o.kernel_search = conv || prod ? LOOM_KERNEL_SEARCH_ON : LOOM_KERNEL_SEARCH_OFF;
	cr_assert_eq(loom_compile(g, l, &o, &p), LOOM_OK, "%s", loom_last_error());
	for (int step = 0; step < 3; step++) {
		for (int i = 0; i < 8 * 784; i++) {
			s = s * 1664525u + 1013904223u;
			img[i] = (float)((s >> 8) & 0xffff) / 32768.0f - 1.0f;
		}
		for (int i = 0; i < 8; i++)
			lab[i] = (i * 3 + step) % 10;
		cr_assert_eq(loom_set_input(p, "image", img, LOOM_F32, 8 * 784), LOOM_OK);
		cr_assert_eq(loom_set_input(p, "label", lab, LOOM_I32, 8), LOOM_OK);
		cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
		loss[step] = loom_loss(p);
	}
	loom_program_free(p);
	loom_graph_free(g);
	env_clean();
}

/* The backend's own dispatch of each kernel (ops_conv.c, ops_dense.c: the
 * primitives made at plan time, a linear's bias, the half emulation around
 * them) trains as the fixed default does. */
Test(ksearch, every_forced_kernel_trains_as_the_fixed_default)
{
	static const char *const forced[][2] = {
		{ "im2col", "sgemm" }, { "dnnl_nchw", "matmul" }, { "dnnl_blocked", "matmul" },
	};
	for (int level = LOOM_O0; level <= LOOM_O1; level++) {
		double ref[3], got[3];
		convnet_losses(NULL, NULL, level, ref);
		for (int f = 0; f < 3; f++) {
			convnet_losses(forced[f][0], forced[f][1], level, got);
			for (int s = 0; s < 3; s++)
				cr_assert(fabs(got[s] - ref[s]) <= 2e-3 * fabs(ref[s]),
					  "O%d, %s + %s: step %d loss %.9g, fixed default %.9g", level,
					  forced[f][0], forced[f][1], s, got[s], ref[s]);
		}
	}
}

/* ------------------------------------------------------------ the choice rule */

/* Times (ms) of the kernels named, 0 for the others (not timed). */
typedef struct timed {
	loom_cpu_kern k;
	double ms;
} timed;

static loom_cpu_kern choose_of(const timed *t, int n, loom_cpu_kern def)
{
	double ms[LOOM_CPU_KERN_COUNT] = { 0 };
	for (int i = 0; i < n; i++)
		ms[t[i].k] = t[i].ms;
	return loom_cpu_kern_choose(ms, def);
}

/* The rule as the README and ksearch.h state it, written out here: the
 * fastest timed kernel (the first of equal times), unless the default was
 * timed and the fastest is not at least 10% faster (time <= 0.9 x the
 * default's); the default where none was timed. */
static loom_cpu_kern rule(const double *ms, loom_cpu_kern def)
{
	int best = LOOM_CPU_KERN_NONE;
	for (int k = 1; k < LOOM_CPU_KERN_COUNT; k++)
		if (ms[k] > 0 && (best == LOOM_CPU_KERN_NONE || ms[k] < ms[best]))
			best = k;
	if (best == LOOM_CPU_KERN_NONE || (ms[def] > 0 && !(ms[best] <= 0.9 * ms[def])))
		return def;
	return (loom_cpu_kern)best;
}

/* The default unless a candidate is 10% faster, on crafted times. */
Test(ksearch, the_choice_is_the_default_unless_a_kernel_is_10_percent_faster)
{
	enum { IM2COL = LOOM_CPU_KERN_IM2COL, NCHW = LOOM_CPU_KERN_DNNL_NCHW,
	       BLOCKED = LOOM_CPU_KERN_DNNL_BLOCKED, SGEMM = LOOM_CPU_KERN_SGEMM,
	       MATMUL = LOOM_CPU_KERN_MATMUL };
	static const struct {
		const char *what;
		timed t[3];
		int n;
		loom_cpu_kern def, want;
	} cases[] = {
		{ "8% faster: the default", { { IM2COL, 1.0 }, { NCHW, 0.95 }, { BLOCKED, 0.92 } }, 3,
		  IM2COL, IM2COL },
		{ "15% faster: that one", { { IM2COL, 1.0 }, { NCHW, 0.85 }, { BLOCKED, 0.95 } }, 3,
		  IM2COL, NCHW },
		{ "10.1% faster: that one", { { IM2COL, 1.0 }, { NCHW, 0.899 } }, 2, IM2COL, NCHW },
		{ "9.9% faster: the default", { { IM2COL, 1.0 }, { NCHW, 0.901 } }, 2, IM2COL, IM2COL },
		{ "the fastest of two faster", { { IM2COL, 1.0 }, { NCHW, 0.8 }, { BLOCKED, 0.5 } }, 3,
		  IM2COL, BLOCKED },
		{ "equal times: the first", { { IM2COL, 1.0 }, { NCHW, 0.5 }, { BLOCKED, 0.5 } }, 3,
		  IM2COL, NCHW },
		{ "the default fastest", { { IM2COL, 0.4 }, { NCHW, 0.5 }, { BLOCKED, 0.6 } }, 3,
		  IM2COL, IM2COL },
		{ "the default last: 5% slower keeps it", { { IM2COL, 0.95 }, { BLOCKED, 1.0 } }, 2,
		  BLOCKED, BLOCKED },
		{ "the default last: 50% slower loses", { { IM2COL, 0.5 }, { BLOCKED, 1.0 } }, 2,
		  BLOCKED, IM2COL },
		{ "product, 15% faster", { { SGEMM, 2.0 }, { MATMUL, 1.7 } }, 2, SGEMM, MATMUL },
		{ "product, 7.5% faster", { { SGEMM, 2.0 }, { MATMUL, 1.85 } }, 2, SGEMM, SGEMM },
		{ "the default not timed: the fastest", { { MATMUL, 1.0 } }, 1, SGEMM, MATMUL },
		{ "nothing timed: the default", { { SGEMM, 0 } }, 0, SGEMM, SGEMM },
	};
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		loom_cpu_kern got = choose_of(cases[c].t, cases[c].n, cases[c].def);
		cr_expect_eq(got, cases[c].want, "%s: chose %s, want %s", cases[c].what,
			     loom_cpu_kern_name(got), loom_cpu_kern_name(cases[c].want));
	}
}

/* A real search's choices are the rule applied to the times it recorded:
 * x [2, 4, 8, 8] -> conv 3x3 to 8 channels -> flatten -> linear 512->10
 * -> mean: two conv nodes (3 candidates each), three products (2 each).
 * The fixed default of each node is what the search off gives it. */
Test(ksearch, a_real_search_chooses_by_the_rule_from_its_recorded_times)
{
	env_clean();
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t xd[4] = { 2, 4, 8, 8 };
	loom_value x = loom_input(g, "x", LOOM_F32, 4, xd);
	loom_value h = loom_layer_conv2d(g, "c", x, 8, 3, 1, 1, 1);
	loom_value loss = loom_mean(g, loom_layer_linear(g, "fc", loom_flatten(g, h), 10, 1));
	loom_program *p = compile(g, loss, 1);
	const loom_plan *pl = &p->plan;
	const loom_cpu_ctx *ctx = p->be_ctx;
	cr_assert_eq(ctx->n_kern, pl->g->n);
	int measured = 0, convs = 0;
	setenv("LOOM_KERNEL_SEARCH", "off", 1);
	for (loom_value v = 0; v < pl->g->n; v++) {
		const loom_cpu_node_kern *nk = &ctx->kern[v];
		if (nk->kern == LOOM_CPU_KERN_NONE)
			continue;
		/* measured now, or earlier in this process (the cache keeps
		 * the times and the choice made from them) */
		cr_assert(nk->how == LOOM_CPU_KERN_MEASURED || nk->how == LOOM_CPU_KERN_CACHED,
			  "node %d (%s): not measured (%d)", v, loom_op_defs[pl->g->nodes[v].op]->name,
			  (int)nk->how);
		loom_cpu_kern def = loom_cpu_kern_choice(pl, v); /* the search off: the default */
		loom_cpu_kern want = rule(nk->ms, def);
		char times[256];
		int at = 0;
		for (int k = 1; k < LOOM_CPU_KERN_COUNT; k++)
			if (nk->ms[k] > 0)
				at += snprintf(times + at, sizeof(times) - (size_t)at, " %s %.4f",
					       loom_cpu_kern_name((loom_cpu_kern)k), nk->ms[k]);
		cr_expect_eq(nk->kern, want, "node %d (%s): chose %s, the rule %s (default %s; ms:%s)",
			     v, loom_op_defs[pl->g->nodes[v].op]->name, loom_cpu_kern_name(nk->kern),
			     loom_cpu_kern_name(want), loom_cpu_kern_name(def), times);
		cr_expect_eq(loom_cpu_kern_choose(nk->ms, def), want);
		measured++;
		convs += pl->g->nodes[v].op == LOOM_OP_CONV2D ||
			 pl->g->nodes[v].op == LOOM_OP_CONV2D_BWD_FILTER;
	}
	unsetenv("LOOM_KERNEL_SEARCH");
	cr_assert_eq(measured, 5, "searched nodes: %d", measured);
	cr_assert_eq(convs, 2);
	loom_program_free(p);
	loom_graph_free(g);
}
