/*
 * tests/engine/cpu/test_formats.c — memory formats decided by the planner
 * (graph/formats.c) on the CPU backend: reorders round-trip exactly; every
 * op that runs in nChw8c gives what it gives in NCHW (forward: logits, loss
 * and batch norm's running statistics; backward: every parameter's
 * gradient; then an eval-mode forward), fused and unfused, f32 and O1 bf16; ConvNet, ResNet-18 and
 * ResNet-50 plans hold no reorder between two blocked ops; --dump-graph
 * shows the formats; LOOM_FORMATS=nchw keeps every value NCHW.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cpu/blocked.h"
#include "engine/cpu/cpu_path.h"
#include "engine/cpu/ops.h"
#include "engine/program_internal.h"
#include "examples/models.h"
#include "graph/ops/ops.h"
#include "loom.h"
#include "tests/engine/print_text.h"

static void env_clean(void)
{
	unsetenv("LOOM_FORMATS");
	unsetenv("LOOM_KERNEL_SEARCH");
	unsetenv("LOOM_CPU_CONV");
}

/*
 * A CPU with avx512_bf16 runs O1's half convolutions natively, on NCHW
 * (conv_bf16.c; engine/cpu/ops_format.c), so nothing of a bf16 plan is
 * blocked there. The cases below test the blocked path, which every other
 * x86-64 CPU takes: they cap the path at AVX-512 (LOOM_CPU_ISA, read once
 * per process, and Criterion runs each case in a process of its own), so
 * they test the same thing whichever CPU the suite lands on.
 * native_bf16_convolutions_stay_nchw tests the native rule.
 */
static void below_native_bf16(void)
{
	setenv("LOOM_CPU_ISA", "avx512", 1);
}

static uint32_t lcg = 7;

static double rnd(void)
{
	lcg = lcg * 1664525u + 1013904223u;
	return (double)(lcg >> 8) / 8388608.0 - 1.0;
}

/* ------------------------------------------------------------ reorders */

Test(formats, reorder_round_trips_exactly)
{
	const int n = 3, c = 16;
	const int64_t hw = 5 * 7, total = n * c * hw;
	for (size_t esz = 2; esz <= 8; esz *= 2) {
		unsigned char *a = malloc(esz * total), *b = malloc(esz * total),
			      *back = malloc(esz * total);
		cr_assert(a && b && back);
		for (int64_t i = 0; i < (int64_t)esz * total; i++)
			a[i] = (unsigned char)(rnd() * 127 + 128);
		for (int f = 0; f < LOOM_FORMAT_COUNT; f++)
			for (int t = 0; t < LOOM_FORMAT_COUNT; t++) {
				loom_cpu_reorder(f, t, esz, n, c, hw, a, b);
				loom_cpu_reorder(t, f, esz, n, c, hw, b, back);
				cr_assert(!memcmp(a, back, esz * total), "%s -> %s -> %s, %zu bytes",
					  loom_format_name(f), loom_format_name(t), loom_format_name(f),
					  esz);
			}
		free(a);
		free(b);
		free(back);
	}
	/* where nChw8c puts element (i, ch, k): [i][ch / 8][k][ch % 8] */
	float x[2 * 16 * 3], y[2 * 16 * 3];
	for (int i = 0; i < 2 * 16 * 3; i++)
		x[i] = (float)i;
	loom_cpu_reorder(LOOM_FORMAT_NCHW, LOOM_FORMAT_NCHW8C, 4, 2, 16, 3, x, y);
	for (int i = 0; i < 2; i++)
		for (int ch = 0; ch < 16; ch++)
			for (int k = 0; k < 3; k++)
				cr_assert_eq(y[((i * 2 + ch / 8) * 3 + k) * 8 + ch % 8],
					     x[(i * 16 + ch) * 3 + k]);
	loom_cpu_reorder(LOOM_FORMAT_NCHW, LOOM_FORMAT_NHWC, 4, 2, 16, 3, x, y);
	cr_assert_eq(y[(1 * 3 + 2) * 16 + 5], x[(1 * 16 + 5) * 3 + 2]);
}

/* ------------------------------------------------------------ a model both ways */

/*
 * Every op the CPU runs in nChw8c: conv (forward, data and filter
 * gradients; with and without bias), batch norm (forward, dx, dgamma),
 * relu, add, max pooling (2x2, and 3x3 stride 2 padded), the per-channel
 * sum, views that keep the shape, then NCHW-only ops after reorders
 * (global average pooling, a 1x1 conv on im2col, a flatten).
 */
static loom_value block_model(loom_graph *g, int batch, loom_value *logits)
{
	int64_t xd[4] = { batch, 8, 10, 10 }, ld[1] = { batch };
	loom_value x = loom_input(g, "image", LOOM_F32, 4, xd);
	loom_value label = loom_input(g, "label", LOOM_I32, 1, ld);
	loom_value h = loom_layer_conv2d(g, "c1", x, 16, 3, 1, 1, 0);
	h = loom_relu(g, loom_layer_batchnorm2d(g, "b1", h));
	loom_value r = loom_layer_conv2d(g, "c2", h, 16, 3, 1, 1, 1);
	r = loom_layer_batchnorm2d(g, "b2", r);
	h = loom_relu(g, loom_add(g, r, h));
	h = loom_maxpool2d(g, h, 3, 2, 1);
	h = loom_layer_conv2d(g, "c3", h, 24, 3, 1, 1, 1);
	h = loom_maxpool2d(g, loom_relu(g, loom_layer_batchnorm2d(g, "b3", h)), 2, 2, 0);
	loom_value f = loom_layer_conv2d(g, "c4", h, 8, 1, 1, 0, 0);
	loom_value pooled = loom_global_avgpool(g, loom_relu(g, f));
	loom_value fl = loom_flatten(g, h);
	loom_value z = loom_add(g, loom_layer_linear(g, "fc", fl, 10, 1),
				loom_layer_linear(g, "fc2", pooled, 10, 0));
	*logits = z;
	loom_mark_output(g, z);
	return loom_softmax_cross_entropy(g, z, label);
}

typedef struct run_result {
	double *vals; /* logits, loss, running stats, then every parameter's gradient */
	int64_t n;
	int blocked_ops[LOOM_OP_COUNT]; /* nodes of each op in nChw8c */
	int reorders;
} run_result;

static void append(run_result *r, const double *v, int64_t n)
{
	r->vals = realloc(r->vals, sizeof(double) * (r->n + n));
	cr_assert(r->vals);
	memcpy(r->vals + r->n, v, sizeof(double) * n);
	r->n += n;
}

typedef loom_value (*model_fn)(loom_graph *g, int batch, loom_value *logits);

static run_result run_model(model_fn model, int batch, int chans, int size, int formats,
			    int bf16, int no_fusion)
{
	run_result res = { 0 };
	loom_graph *g;
	loom_program *p;
	loom_value logits;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value loss = model(g, batch, &logits);
	cr_assert_neq(loss, LOOM_NONE, "%s", g->err.msg);
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.formats = formats;
	o.no_fusion = no_fusion;
	if (bf16) {
		o.amp.level = LOOM_O1;
		o.amp.half = LOOM_BF16;
	}
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_program_error(p));
	int64_t nx = (int64_t)batch * chans * size * size;
	float *img = malloc(sizeof(float) * nx);
	int32_t *lab = malloc(sizeof(int32_t) * batch);
	lcg = 99;
	for (int64_t i = 0; i < nx; i++)
		img[i] = (float)rnd();
	for (int i = 0; i < batch; i++)
		lab[i] = i % 10;
	cr_assert_eq(loom_set_input(p, "image", img, LOOM_F32, nx), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "label", lab, LOOM_I32, batch), LOOM_OK);
	cr_assert_eq(loom_run(p, LOOM_RUN_GRAD), LOOM_OK, "%s", loom_program_error(p));

	double buf[65536];
	int64_t nl = (int64_t)batch * 10;
	cr_assert_eq(loom_read_f64(p, logits, buf, nl), LOOM_OK);
	append(&res, buf, nl);
	cr_assert_eq(loom_read_f64(p, loss, buf, 1), LOOM_OK);
	append(&res, buf, 1);
	for (loom_value v = 0; v < g->n; v++) {
		const loom_node *nd = &g->nodes[v];
		int64_t cnt = loom_shape_numel(&nd->shape);
		if (nd->op != LOOM_OP_PARAM && nd->op != LOOM_OP_BUFFER)
			continue;
		cr_assert(cnt <= 65536);
		if (nd->op == LOOM_OP_BUFFER)
			cr_assert_eq(loom_read_f64(p, v, buf, cnt), LOOM_OK, "%s", nd->name);
		else
			cr_assert_eq(loom_read_grad_f64(p, v, buf, cnt), LOOM_OK, "%s %s", nd->name,
				     loom_program_error(p));
		append(&res, buf, cnt);
	}
	/* eval mode: batch norm on its running statistics */
	cr_assert_eq(loom_run(p, LOOM_RUN_EVAL), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_read_f64(p, logits, buf, nl), LOOM_OK);
	append(&res, buf, nl);
	const loom_graph *cg = p->plan.g;
	for (loom_value v = 0; v < cg->n; v++) {
		if (cg->nodes[v].op == LOOM_OP_REORDER)
			res.reorders++;
		else if (cg->nodes[v].format == LOOM_FORMAT_NCHW8C ||
			 (cg->nodes[v].nsrc > 0 &&
			  cg->nodes[cg->nodes[v].src[0]].format == LOOM_FORMAT_NCHW8C))
			res.blocked_ops[cg->nodes[v].op]++;
	}
	cr_assert_eq(res.reorders, p->plan.n_reorders);
	free(img);
	free(lab);
	loom_program_free(p);
	loom_graph_free(g);
	return res;
}

/* Each value within tol of the largest magnitude of its run of values. */
static void agree(const run_result *a, const run_result *b, double tol, const char *what)
{
	cr_assert_eq(a->n, b->n);
	double big = 0, worst = 0;
	int64_t at = 0;
	for (int64_t i = 0; i < a->n; i++)
		if (fabs(a->vals[i]) > big)
			big = fabs(a->vals[i]);
	for (int64_t i = 0; i < a->n; i++) {
		double d = fabs(a->vals[i] - b->vals[i]);
		cr_assert(isfinite(b->vals[i]), "%s: value %lld not finite", what, (long long)i);
		if (d > worst) {
			worst = d;
			at = i;
		}
	}
	cr_assert(worst <= tol * big, "%s: value %lld: %g in NCHW, %g planned (largest %g)", what,
		  (long long)at, a->vals[at], b->vals[at], big);
}

static void both_ways(int bf16, int no_fusion)
{
	env_clean();
	run_result ref = run_model(block_model, 4, 8, 10, LOOM_FORMATS_NCHW, bf16, no_fusion);
	run_result got = run_model(block_model, 4, 8, 10, LOOM_FORMATS_AUTO, bf16, no_fusion);
	cr_assert_eq(ref.reorders, 0);
	/* the ops this test stands for did run blocked */
	static const loom_op ops[] = { LOOM_OP_CONV2D, LOOM_OP_CONV2D_BWD_DATA,
				       LOOM_OP_CONV2D_BWD_FILTER, LOOM_OP_BATCHNORM2D,
				       LOOM_OP_BN_BWD_DATA, LOOM_OP_BN_BWD_GAMMA,
				       LOOM_OP_CHANNEL_SUM, LOOM_OP_ADD, LOOM_OP_MAXPOOL2D,
				       LOOM_OP_MAXPOOL2D_BWD };
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		cr_assert(got.blocked_ops[ops[i]] > 0, "no %s node ran blocked",
			  loom_op_defs[ops[i]]->name);
	if (no_fusion) {
		cr_assert(got.blocked_ops[LOOM_OP_RELU] > 0);
		cr_assert(got.blocked_ops[LOOM_OP_RELU_BWD] > 0);
	}
	if (bf16)
		cr_assert(got.blocked_ops[LOOM_OP_CAST] > 0 || got.blocked_ops[LOOM_OP_RESHAPE] > 0);
	agree(&ref, &got, bf16 ? 3e-2 : 2e-5, bf16 ? "bf16" : "f32");
	free(ref.vals);
	free(got.vals);
}

Test(formats, blocked_ops_agree_with_nchw_f32)
{
	both_ways(0, 0);
}

Test(formats, blocked_ops_agree_with_nchw_f32_unfused)
{
	both_ways(0, 1);
}

Test(formats, blocked_ops_agree_with_nchw_bf16_o1, .init = below_native_bf16)
{
	both_ways(1, 0);
}

Test(formats, blocked_ops_agree_with_nchw_bf16_o1_unfused, .init = below_native_bf16)
{
	both_ways(1, 1);
}

/* ------------------------------------------------------------ plans */

/* Whether node v of plan runs in nChw8c (its result, or for a node whose
 * result is not 4-D, its first source). */
static int runs_blocked(const loom_graph *g, loom_value v)
{
	const loom_node *n = &g->nodes[v];
	if (n->format == LOOM_FORMAT_NCHW8C)
		return 1;
	return n->shape.ndim != 4 && n->nsrc > 0 && g->nodes[n->src[0]].format == LOOM_FORMAT_NCHW8C;
}

/* No reorder sits between two ops that both run blocked; returns the
 * reorders and (in *blocked) the values held blocked. */
static int check_plan(const loom_program *p, int *blocked)
{
	const loom_graph *g = p->plan.g;
	int n = 0;
	*blocked = 0;
	for (loom_value v = 0; v < g->n; v++) {
		*blocked += g->nodes[v].format == LOOM_FORMAT_NCHW8C;
		if (g->nodes[v].op != LOOM_OP_REORDER)
			continue;
		n++;
		loom_value s = g->nodes[v].src[0];
		int readers_blocked = 1, readers = 0;
		for (loom_value u = v + 1; u < g->n; u++)
			for (int i = 0; i < g->nodes[u].nsrc; i++)
				if (g->nodes[u].src[i] == v) {
					readers++;
					/* a mixed reader (a conv) takes either */
					int conv = g->nodes[u].op == LOOM_OP_CONV2D ||
						   g->nodes[u].op == LOOM_OP_CONV2D_BWD_DATA ||
						   g->nodes[u].op == LOOM_OP_CONV2D_BWD_FILTER;
					readers_blocked &= !conv && runs_blocked(g, u) ==
								 (g->nodes[s].format == LOOM_FORMAT_NCHW8C);
				}
		cr_assert(readers > 0, "reorder %d is read by nothing", (int)v);
		cr_assert(!(runs_blocked(g, s) && g->nodes[v].format == LOOM_FORMAT_NCHW8C),
			  "reorder %d from a blocked value to blocked", (int)v);
		cr_assert(!(g->nodes[s].format == LOOM_FORMAT_NCHW8C && readers_blocked &&
			    g->nodes[v].format == LOOM_FORMAT_NCHW),
			  "reorder %d: from blocked to NCHW for readers that run blocked", (int)v);
	}
	return n;
}

static loom_value resnet18(loom_graph *g, int batch, loom_value *logits)
{
	return loom_model_resnet_width(g, 18, batch, 32, 10, 16, logits);
}

static loom_value resnet50(loom_graph *g, int batch, loom_value *logits)
{
	return loom_model_resnet_width(g, 50, batch, 32, 10, 8, logits);
}

static loom_value convnet(loom_graph *g, int batch, loom_value *logits)
{
	return loom_model_convnet(g, batch, logits);
}

static loom_program *compile(model_fn model, int batch, int bf16, loom_graph **gout)
{
	loom_graph *g;
	loom_program *p;
	loom_value logits;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value loss = model(g, batch, &logits);
	cr_assert_neq(loss, LOOM_NONE);
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	if (bf16) {
		o.amp.level = LOOM_O1;
		o.amp.half = LOOM_BF16;
	}
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_program_error(p));
	*gout = g;
	return p;
}

/*
 * The reorders each plan needs, all at the edges of its blocked part: the
 * ConvNet 2 (its blocked stage to the flatten and back; conv1 has one
 * input channel and runs im2col on NCHW); a ResNet-18 5 (the stem, an
 * im2col conv of 3 input channels, NCHW, meets the first residual add: 1
 * forward, 2 backward; into its global pooling and back), whatever runs
 * between in its stages; a ResNet-50 2 (the pooling).
 */
static void plan_case(model_fn model, int bf16, int max_reorders, int min_blocked, const char *what)
{
	env_clean();
	loom_graph *g;
	loom_program *p = compile(model, 8, bf16, &g);
	int blocked, n = check_plan(p, &blocked);
	if (getenv("FORMATS_DUMP"))
		loom_program_dump(p, stderr);
	cr_assert(n <= max_reorders, "%s: %d reorders (at most %d expected)", what, n, max_reorders);
	cr_assert(blocked >= min_blocked, "%s: %d values blocked (at least %d expected)", what,
		  blocked, min_blocked);
	loom_program_free(p);
	loom_graph_free(g);
}

Test(formats, convnet_plan_has_no_reorder_between_blocked_ops, .init = below_native_bf16)
{
	plan_case(convnet, 0, 2, 8, "ConvNet f32");
	plan_case(convnet, 1, 2, 8, "ConvNet O1 bf16");
}

Test(formats, resnet18_plan_has_no_reorder_between_blocked_ops, .init = below_native_bf16)
{
	plan_case(resnet18, 0, 5, 100, "ResNet-18 f32");
	plan_case(resnet18, 1, 5, 100, "ResNet-18 O1 bf16");
}

Test(formats, resnet50_plan_has_no_reorder_between_blocked_ops, .init = below_native_bf16)
{
	plan_case(resnet50, 0, 2, 200, "ResNet-50 f32");
	plan_case(resnet50, 1, 2, 200, "ResNet-50 O1 bf16");
}

/* On a CPU with avx512_bf16, O1's half convolutions (forward, data and
 * filter gradients) read and write NCHW: the native kernels take no other
 * format, so the planner must not block them. */
Test(formats, native_bf16_convolutions_stay_nchw)
{
	env_clean();
	if (loom_cpu_isa_get() != LOOM_CPU_ISA_AVX512_BF16)
		cr_skip_test("needs a CPU with avx512_bf16 (this one runs %s)",
			     loom_cpu_isa_name(loom_cpu_isa_get()));
	loom_graph *g;
	loom_program *p = compile(resnet18, 8, 1, &g);
	const loom_graph *cg = p->plan.g;
	int convs = 0;
	for (loom_value v = 0; v < cg->n; v++) {
		const loom_node *n = &cg->nodes[v];
		if (n->op != LOOM_OP_CONV2D && n->op != LOOM_OP_CONV2D_BWD_DATA &&
		    n->op != LOOM_OP_CONV2D_BWD_FILTER)
			continue;
		convs++;
		cr_assert_eq(n->format, LOOM_FORMAT_NCHW, "%s %d is not NCHW",
			     loom_op_defs[n->op]->name, (int)v);
		for (int i = 0; i < n->nsrc; i++)
			cr_assert_eq(cg->nodes[n->src[i]].format, LOOM_FORMAT_NCHW,
				     "%s %d reads a blocked value", loom_op_defs[n->op]->name, (int)v);
	}
	cr_assert(convs >= 50, "%d convolution nodes", convs);
	loom_program_free(p);
	loom_graph_free(g);
}

/* ------------------------------------------------------------ dump and switch */

static char *dump_of(loom_program *p)
{
	return print_text(loom_program_dump, p);
}

Test(formats, dump_graph_prints_formats)
{
	env_clean();
	loom_graph *g;
	loom_program *p = compile(convnet, 8, 0, &g);
	char *text = dump_of(p);
	cr_assert(strstr(text, "batchnorm2d 'bn2'"), "%s", text);
	cr_assert(strstr(strstr(text, "batchnorm2d 'bn2'"), "[nChw8c]"), "%s", text);
	cr_assert(strstr(text, "[nChw8c -> nchw]"), "%s", text);
	cr_assert(strstr(text, "[nchw -> nChw8c]"), "%s", text);
	free(text);
	loom_program_free(p);
	loom_graph_free(g);
}

Test(formats, nchw_switch_keeps_every_value_nchw)
{
	env_clean();
	setenv("LOOM_FORMATS", "nchw", 1);
	loom_graph *g;
	loom_program *p = compile(resnet18, 4, 0, &g);
	for (loom_value v = 0; v < p->plan.g->n; v++)
		cr_assert_eq(p->plan.g->nodes[v].format, LOOM_FORMAT_NCHW);
	cr_assert_eq(p->plan.n_reorders, 0);
	char *text = dump_of(p);
	cr_assert(!strstr(text, "nChw8c"));
	free(text);
	loom_program_free(p);
	loom_graph_free(g);
	unsetenv("LOOM_FORMATS");
}

/* User-visible values stay NCHW: a value marked as an output is read in
 * the user's layout even where its neighbours run blocked. */
Test(formats, outputs_stay_nchw)
{
	env_clean();
	loom_graph *g;
	loom_program *p;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t xd[4] = { 2, 8, 6, 6 };
	loom_value x = loom_input(g, "image", LOOM_F32, 4, xd);
	loom_value h = loom_layer_conv2d(g, "c1", x, 16, 3, 1, 1, 0);
	loom_value b = loom_layer_batchnorm2d(g, "b1", h);
	loom_mark_output(g, b);
	loom_value y = loom_layer_conv2d(g, "c2", loom_relu(g, b), 16, 3, 1, 1, 0);
	loom_value loss = loom_mean(g, y);
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.inference = 1;
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_program_error(p));
	const loom_graph *cg = p->plan.g;
	int bn_seen = 0;
	for (loom_value v = 0; v < cg->n; v++) {
		if (cg->nodes[v].op == LOOM_OP_BATCHNORM2D) {
			cr_assert_eq(cg->nodes[v].format, LOOM_FORMAT_NCHW);
			bn_seen = 1;
		}
		if (loom_op_is_leaf(cg->nodes[v].op))
			cr_assert_eq(cg->nodes[v].format, LOOM_FORMAT_NCHW);
	}
	cr_assert(bn_seen);
	float img[2 * 8 * 6 * 6], out[2 * 16 * 6 * 6];
	for (int i = 0; i < 2 * 8 * 6 * 6; i++)
		img[i] = (float)rnd();
	cr_assert_eq(loom_set_input(p, "image", img, LOOM_F32, 2 * 8 * 6 * 6), LOOM_OK);
	cr_assert_eq(loom_run(p, LOOM_RUN_EVAL), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_read(p, b, out, 2 * 16 * 6 * 6), LOOM_OK, "%s", loom_program_error(p));
	loom_program_free(p);
	loom_graph_free(g);
}
