/*
 * test_cuda_formats.c — the CUDA backend's memory formats (engine/cuda/
 * formats.c, its node_formats) through the planner's format pass, on the
 * CPU, no GPU needed: a plan compiled NCHW on the CPU is handed to
 * graph/formats.c with the CUDA rules as its backend's answers. Under
 * LOOM_CUDA_NHWC=half, a mixed-precision ResNet's convolutions, batch
 * norms, relus, adds, max pool and the global pool's input and gradient
 * hold NHWC, with no reorder (LOOM_CUDA_POOL_NHWC=0: reorders only at the
 * global pooling); fp32 plans stay NCHW unless "all";
 * "0" keeps every value NCHW; the own batch-norm kernels keep theirs NCHW;
 * a convolution with a bias stays NCHW. Then cuDNN's fused batch-norm
 * calls (engine/cuda/bn_fuse.c) on a plan compiled through the format pass
 * with the CUDA rules: the adds that run their batch norm, the backwards
 * that do the relu's and the add + relu's backward with the forward's
 * reserve, and where that reserve sits in the saved slot.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/cuda/bn_fuse.h"
#include "engine/cuda/formats.h"
#include "engine/program_internal.h"
#include "examples/models.h"
#include "graph/ops/ops.h"
#include "loom.h"

typedef struct query_ctx {
	const loom_plan *plan;
	loom_cuda_nhwc_mode mode;
	int own_bn;
} query_ctx;

static void cuda_rules(void *ctx, const loom_graph *g, loom_value v, loom_format_caps *caps)
{
	const query_ctx *q = ctx;
	(void)g;
	loom_cuda_formats_query(q->plan, v, caps, q->mode, q->own_bn);
}

typedef struct fmt_count {
	int nodes[LOOM_OP_COUNT], nhwc[LOOM_OP_COUNT];
	int reorders, to_nhwc, to_nchw;
} fmt_count;

/* amp.bn_half for the next compiles (O1's batch norm in the half type). */
static int bn_half;

static loom_program *compile_nchw(loom_graph *g, loom_value loss, loom_opt_level level,
				  loom_dtype half)
{
	loom_compile_opts o;
	loom_program *p = NULL;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.formats = LOOM_FORMATS_NCHW;
	o.amp.level = level;
	o.amp.half = half;
	o.amp.bn_half = bn_half;
	o.optim.kind = LOOM_OPTIM_SGD;
	o.optim.lr = 0.01;
	setenv("LOOM_FORMATS", "nchw", 1);
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	return p;
}

/* Runs the format pass over p's (NCHW) plan with the CUDA rules. */
static fmt_count cuda_formats(loom_program *p, loom_cuda_nhwc_mode mode, int own_bn)
{
	fmt_count fc;
	memset(&fc, 0, sizeof(fc));
	loom_plan *pl = &p->plan;
	query_ctx q = { pl, mode, own_bn };
	int n_fwd = pl->n_fwd, n_re = 0;
	cr_assert_eq(loom_formats_pass(pl->g, &n_fwd, &pl->loss, cuda_rules, &q, &n_re), LOOM_OK);
	pl->n_fwd = n_fwd;
	const loom_graph *g = pl->g;
	for (loom_value v = 0; v < g->n; v++) {
		const loom_node *n = &g->nodes[v];
		fc.nodes[n->op]++;
		fc.nhwc[n->op] += n->format == LOOM_FORMAT_NHWC;
		if (n->op == LOOM_OP_REORDER) {
			fc.reorders++;
			fc.to_nhwc += n->format == LOOM_FORMAT_NHWC;
			fc.to_nchw += n->format == LOOM_FORMAT_NCHW;
		}
		/* CUDA has no kernel for the blocked format */
		cr_assert_neq(n->format, LOOM_FORMAT_NCHW8C, "node %d nChw8c on CUDA", (int)v);
		/* the user's values stay NCHW */
		if (n->flags & (LOOM_NODE_OUTPUT | LOOM_NODE_GRAD) || loom_op_is_leaf(n->op))
			cr_assert_eq(n->format, LOOM_FORMAT_NCHW, "node %d '%s' is the user's", (int)v,
				     n->name);
	}
	cr_assert_eq(n_re, fc.reorders);
	return fc;
}

static loom_program *resnet(loom_graph **gout, int depth, loom_opt_level level, loom_dtype half)
{
	loom_graph *g;
	loom_value logits;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value loss = loom_model_resnet_width(g, depth, 4, 32, 10, 8, &logits);
	cr_assert_neq(loss, LOOM_NONE);
	*gout = g;
	return compile_nchw(g, loss, level, half);
}

/* Every node of op ops[i] in NHWC. */
static void all_nhwc(const fmt_count *fc, const char *what)
{
	static const loom_op ops[] = { LOOM_OP_CONV2D, LOOM_OP_CONV2D_BWD_DATA, LOOM_OP_BATCHNORM2D,
				       LOOM_OP_BN_BWD_DATA, LOOM_OP_ADD };
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		cr_expect(fc->nodes[ops[i]] > 0 && fc->nhwc[ops[i]] == fc->nodes[ops[i]],
			  "%s: %d of %d %s nodes NHWC", what, fc->nhwc[ops[i]], fc->nodes[ops[i]],
			  loom_op_defs[ops[i]]->name);
}

/*
 * ResNet-50 at O2 fp16 and O1 bf16: every convolution, data gradient,
 * batch norm and add NHWC; the filter gradients NCHW (the weight's
 * layout); the global pool reading NHWC and its backward writing it, so
 * no reorder anywhere (the first convolution reorders the image in its
 * workspace). LOOM_CUDA_POOL_NHWC=0: the global pool NCHW with a reorder
 * into it and one out of its backward, and nowhere else.
 */
static void half_case(loom_opt_level level, loom_dtype half, const char *what)
{
	loom_graph *g;
	loom_program *p = resnet(&g, 50, level, half);
	fmt_count fc = cuda_formats(p, LOOM_CUDA_NHWC_HALF, 0);
	all_nhwc(&fc, what);
	cr_expect_eq(fc.nhwc[LOOM_OP_CONV2D_BWD_FILTER], 0, "%s: filter gradients NCHW", what);
	cr_expect_eq(fc.nhwc[LOOM_OP_MAXPOOL2D], fc.nodes[LOOM_OP_MAXPOOL2D], "%s", what);
	cr_expect_eq(fc.nhwc[LOOM_OP_GLOBAL_AVGPOOL], 0, "%s: [N, C] is NCHW", what);
	cr_expect(fc.nhwc[LOOM_OP_RELU] + fc.nhwc[LOOM_OP_RELU_BWD] > 0, "%s: no relu in NHWC", what);
	cr_expect(fc.nodes[LOOM_OP_GLOBAL_AVGPOOL_BWD] == 1 &&
			  fc.nhwc[LOOM_OP_GLOBAL_AVGPOOL_BWD] == 1,
		  "%s: the global pool's backward in NHWC", what);
	cr_expect_eq(fc.reorders, 0, "%s: %d reorders (%d to NHWC, %d to NCHW)", what, fc.reorders,
		     fc.to_nhwc, fc.to_nchw);
	if (getenv("FORMATS_DUMP"))
		loom_program_dump(p, stderr);
	loom_program_free(p);
	loom_graph_free(g);

	/* the old path: the global pool NCHW, reordered into and out of */
	setenv("LOOM_CUDA_POOL_NHWC", "0", 1);
	p = resnet(&g, 50, level, half);
	fc = cuda_formats(p, LOOM_CUDA_NHWC_HALF, 0);
	unsetenv("LOOM_CUDA_POOL_NHWC");
	all_nhwc(&fc, what);
	cr_expect_eq(fc.nhwc[LOOM_OP_GLOBAL_AVGPOOL_BWD], 0, "%s, LOOM_CUDA_POOL_NHWC=0", what);
	cr_expect(fc.reorders > 0 && fc.reorders <= 2,
		  "%s, LOOM_CUDA_POOL_NHWC=0: %d reorders (%d to NHWC, %d to NCHW)", what,
		  fc.reorders, fc.to_nhwc, fc.to_nchw);
	loom_program_free(p);
	loom_graph_free(g);
}

Test(cuda_formats, resnet50_o2_fp16_nhwc)
{
	half_case(LOOM_O2, LOOM_F16, "ResNet-50 O2 fp16");
}

Test(cuda_formats, resnet50_o1_bf16_nhwc)
{
	half_case(LOOM_O1, LOOM_BF16, "ResNet-50 O1 bf16");
}

/* The ImageNet stem (7x7/2 conv of 3 channels, relu + 3x3/2 max pool):
 * the pool and its backward NHWC, no reorder (the stem's 3-channel image
 * is the convolution's to reorder). */
Test(cuda_formats, resnet18_imagenet_stem_o2_fp16)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value loss = loom_model_resnet(g, 18, 2, 65, 10, NULL);
	cr_assert_neq(loss, LOOM_NONE);
	loom_program *p = compile_nchw(g, loss, LOOM_O2, LOOM_F16);
	fmt_count fc = cuda_formats(p, LOOM_CUDA_NHWC_HALF, 0);
	all_nhwc(&fc, "ResNet-18 O2 fp16");
	cr_expect(fc.nodes[LOOM_OP_MAXPOOL2D] == 1 && fc.nhwc[LOOM_OP_MAXPOOL2D] == 1,
		  "%d max pools, %d NHWC", fc.nodes[LOOM_OP_MAXPOOL2D], fc.nhwc[LOOM_OP_MAXPOOL2D]);
	cr_expect_eq(fc.nhwc[LOOM_OP_MAXPOOL2D_BWD], fc.nodes[LOOM_OP_MAXPOOL2D_BWD]);
	cr_expect_eq(fc.reorders, 0, "%d reorders", fc.reorders);
	loom_program_free(p);
	loom_graph_free(g);
}

Test(cuda_formats, fp32_stays_nchw_unless_all)
{
	loom_graph *g;
	loom_program *p = resnet(&g, 18, LOOM_O0, LOOM_F16);
	fmt_count fc = cuda_formats(p, LOOM_CUDA_NHWC_HALF, 0);
	cr_expect_eq(fc.reorders, 0);
	cr_expect_eq(fc.nhwc[LOOM_OP_CONV2D], 0);
	loom_program_free(p);
	loom_graph_free(g);

	p = resnet(&g, 18, LOOM_O0, LOOM_F16);
	fc = cuda_formats(p, LOOM_CUDA_NHWC_ALL, 0);
	all_nhwc(&fc, "ResNet-18 fp32, all");
	cr_expect_eq(fc.reorders, 0, "%d reorders", fc.reorders);
	loom_program_free(p);
	loom_graph_free(g);
}

Test(cuda_formats, off_keeps_every_value_nchw)
{
	setenv("LOOM_CUDA_NHWC", "0", 1);
	cr_expect_eq(loom_cuda_nhwc_mode_get(), LOOM_CUDA_NHWC_OFF);
	setenv("LOOM_CUDA_NHWC", "all", 1);
	cr_expect_eq(loom_cuda_nhwc_mode_get(), LOOM_CUDA_NHWC_ALL);
	setenv("LOOM_CUDA_NHWC", "half", 1);
	cr_expect_eq(loom_cuda_nhwc_mode_get(), LOOM_CUDA_NHWC_HALF);
	/* Off by default: NHWC measured 3-4x slower than NCHW on an H100. */
	unsetenv("LOOM_CUDA_NHWC");
	cr_expect_eq(loom_cuda_nhwc_mode_get(), LOOM_CUDA_NHWC_OFF);
	loom_graph *g;
	loom_program *p = resnet(&g, 18, LOOM_O2, LOOM_F16);
	fmt_count fc = cuda_formats(p, LOOM_CUDA_NHWC_OFF, 0);
	cr_expect_eq(fc.reorders, 0);
	for (int op = 0; op < LOOM_OP_COUNT; op++)
		cr_expect_eq(fc.nhwc[op], 0, "%s", loom_op_defs[op]->name);
	loom_program_free(p);
	loom_graph_free(g);
}

/* The own batch-norm kernels (the test hook; bf16 and O3 plans) are NCHW:
 * their nodes stay NCHW, reordered to and from their NHWC neighbours. */
Test(cuda_formats, own_batchnorm_stays_nchw)
{
	loom_graph *g;
	loom_program *p = resnet(&g, 18, LOOM_O2, LOOM_F16);
	fmt_count fc = cuda_formats(p, LOOM_CUDA_NHWC_HALF, 1);
	cr_expect(fc.nodes[LOOM_OP_BATCHNORM2D] > 0);
	cr_expect_eq(fc.nhwc[LOOM_OP_BATCHNORM2D], 0);
	cr_expect_eq(fc.nhwc[LOOM_OP_BN_BWD_DATA], 0);
	cr_expect_eq(fc.nhwc[LOOM_OP_BN_BWD_GAMMA], 0);
	cr_expect_gt(fc.nhwc[LOOM_OP_CONV2D], 0);
	cr_expect_gt(fc.reorders, 6);
	loom_program_free(p);
	loom_graph_free(g);
}

/*
 * bf16 batch norm with fp32 parameters (O2 bf16; O1 bf16 under
 * amp.bn_half) goes to cuDNN under LOOM_CUDA_BN_BF16_CUDNN=1, so the
 * format pass puts it in NHWC with its neighbours: no reorder in the
 * ResNet. At 0 (the default) the own kernels keep it NCHW, reordered at
 * its edges. All-bf16 parameters (O3) never go to cuDNN.
 */
static void bf16_bn_case(loom_opt_level level, int on, const char *what)
{
	loom_graph *g;
	setenv("LOOM_CUDA_BN_BF16_CUDNN", on ? "1" : "0", 1);
	loom_program *p = resnet(&g, 18, level, LOOM_BF16);
	int takes = 0, bns = 0;
	for (loom_value v = 0; v < p->plan.g->n; v++) {
		const loom_node *n = &p->plan.g->nodes[v];
		if (n->op != LOOM_OP_BATCHNORM2D && n->op != LOOM_OP_BN_BWD_DATA)
			continue;
		bns++;
		takes += loom_cuda_bn_cudnn_takes(&p->plan, n);
		cr_expect_eq(p->plan.g->nodes[n->src[0]].dtype, LOOM_BF16, "%s: %s's input", what,
			     n->name);
	}
	cr_expect(bns > 0 && takes == (on ? bns : 0), "%s: cuDNN takes %d of %d batch-norm nodes",
		  what, takes, bns);
	fmt_count fc = cuda_formats(p, LOOM_CUDA_NHWC_HALF, 0);
	if (on) {
		all_nhwc(&fc, what);
		cr_expect_eq(fc.reorders, 0, "%s: %d reorders", what, fc.reorders);
	} else {
		cr_expect_eq(fc.nhwc[LOOM_OP_BATCHNORM2D], 0, "%s", what);
		cr_expect_gt(fc.reorders, 6, "%s", what);
	}
	loom_program_free(p);
	loom_graph_free(g);
	unsetenv("LOOM_CUDA_BN_BF16_CUDNN");
}

Test(cuda_formats, bf16_batchnorm_on_cudnn_under_its_switch)
{
	cr_expect_eq(loom_cuda_bn_bf16_cudnn_on(), 0, "LOOM_CUDA_BN_BF16_CUDNN is on by default");
	for (int on = 0; on <= 1; on++) {
		bf16_bn_case(LOOM_O2, on, on ? "ResNet-18 O2 bf16, bn on cudnn" : "ResNet-18 O2 bf16");
		bn_half = 1;
		bf16_bn_case(LOOM_O1, on,
			     on ? "ResNet-18 O1 bf16 bn_half, bn on cudnn" : "ResNet-18 O1 bf16 bn_half");
		bn_half = 0;
	}
	setenv("LOOM_CUDA_BN_BF16_CUDNN", "1", 1);
	loom_graph *g;
	loom_program *p = resnet(&g, 18, LOOM_O3, LOOM_BF16);
	for (loom_value v = 0; v < p->plan.g->n; v++) {
		const loom_node *n = &p->plan.g->nodes[v];
		if (n->op == LOOM_OP_BATCHNORM2D || n->op == LOOM_OP_BN_BWD_DATA)
			cr_expect(!loom_cuda_bn_cudnn_takes(&p->plan, n), "O3 bf16: %s on cuDNN",
				  n->name);
	}
	loom_program_free(p);
	loom_graph_free(g);
	unsetenv("LOOM_CUDA_BN_BF16_CUDNN");
}

/* A convolution with a bias (whose kernel adds it in NCHW) and a
 * broadcasting add stay NCHW; one without a bias takes NHWC. */
Test(cuda_formats, conv_bias_and_broadcast_stay_nchw)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t xd[4] = { 2, 8, 6, 6 }, ld[1] = { 2 };
	loom_value x = loom_input(g, "x", LOOM_F32, 4, xd);
	loom_value label = loom_input(g, "label", LOOM_I32, 1, ld);
	loom_value a = loom_layer_conv2d(g, "a", x, 16, 3, 1, 1, 1);   /* bias */
	loom_value b = loom_layer_conv2d(g, "b", a, 16, 3, 1, 1, 0);   /* none */
	loom_value h = loom_relu(g, loom_add(g, a, b));
	loom_value z = loom_layer_linear(g, "fc", loom_flatten(g, h), 10, 1);
	loom_value loss = loom_softmax_cross_entropy(g, z, label);
	loom_program *p = compile_nchw(g, loss, LOOM_O2, LOOM_F16);
	fmt_count fc = cuda_formats(p, LOOM_CUDA_NHWC_HALF, 0);
	const loom_graph *pg = p->plan.g;
	int with_bias = 0, without = 0;
	for (loom_value v = 0; v < pg->n; v++) {
		const loom_node *n = &pg->nodes[v];
		if (n->op != LOOM_OP_CONV2D)
			continue;
		if (n->nsrc > 2) {
			with_bias++;
			cr_expect_eq(n->format, LOOM_FORMAT_NCHW, "conv with a bias in %s",
				     loom_format_name(n->format));
		} else {
			without++;
			cr_expect_eq(n->format, LOOM_FORMAT_NHWC, "conv without a bias in %s",
				     loom_format_name(n->format));
		}
	}
	cr_expect(with_bias == 1 && without == 1, "%d with a bias, %d without", with_bias, without);
	(void)fc;
	loom_program_free(p);
	loom_graph_free(g);
}

/* ------------------------------------------------------------ fused batch norm */

/* The CPU backend answering the format pass with the CUDA rules and
 * fusing as CUDA does; no node plans (nothing runs): a plan with CUDA's
 * formats, steps and memory plan, no GPU needed. */
static loom_backend cuda_like;
static loom_backend_planning cuda_like_planning;

static void cuda_like_formats(void *ctx, const loom_plan *plan, loom_value v,
			      loom_format_caps *caps)
{
	(void)ctx;
	loom_cuda_formats_query(plan, v, caps, LOOM_CUDA_NHWC_HALF, 0);
}

static loom_status no_node_plans(void *ctx, const loom_plan *plan, size_t *ws_bytes)
{
	(void)ctx;
	(void)plan;
	*ws_bytes = 0;
	return LOOM_OK;
}

static int every_node(void *ctx, const loom_plan *plan, loom_value v)
{
	(void)ctx;
	(void)plan;
	(void)v;
	return 1;
}

static loom_program *compile_cuda_like(loom_graph *g, loom_value loss, loom_opt_level level)
{
	loom_compile_opts o;
	loom_program *p = NULL;
	cuda_like = loom_cpu_backend;
	cuda_like.name = "cuda-like";
	cuda_like.caps |= LOOM_BE_FUSES_ALL;
	cuda_like_planning = *loom_cpu_backend.planning;
	cuda_like_planning.node_formats = cuda_like_formats;
	cuda_like.planning = &cuda_like_planning;
	cuda_like.plan_create = no_node_plans;
	cuda_like.supports_node = every_node;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.formats = LOOM_FORMATS_AUTO;
	o.amp.level = level;
	o.amp.half = LOOM_F16;
	o.optim.kind = LOOM_OPTIM_SGD;
	o.optim.lr = 0.01;
	setenv("LOOM_FORMATS", "auto", 1);
	loom_test_backend = &cuda_like;
	loom_status st = loom_compile(g, loss, &o, &p);
	loom_test_backend = NULL;
	unsetenv("LOOM_FORMATS");
	cr_assert_eq(st, LOOM_OK, "%s", loom_last_error());
	return p;
}

typedef struct bn_fusions {
	int bn_fwd, bn_bwd, adds_fused, act, add_act, relu_bwds, paired;
} bn_fusions;

/* fuse_plan.cu's plan_bn_add and plan_bn_bwd_ex as a CPU sees them: batch
 * norm on cuDNN wherever formats.c put it in NHWC, each backward paired
 * with the forward of the same x, its f32 dgamma/dbeta siblings made by
 * its call. */
static bn_fusions bn_fusions_of(const loom_plan *pl)
{
	const loom_graph *g = pl->g;
	bn_fusions r;
	memset(&r, 0, sizeof(r));
	int *step_of = loom_cuda_first_steps(pl);
	unsigned char *nhwc = calloc(g->n, 1), *makes = calloc(g->n, 1);
	loom_value *add_by = malloc(sizeof(loom_value) * g->n);
	cr_assert(step_of && nhwc && makes && add_by);
	for (loom_value v = 0; v < g->n; v++) {
		const loom_node *n = &g->nodes[v];
		add_by[v] = LOOM_NONE;
		nhwc[v] = (n->op == LOOM_OP_BATCHNORM2D || n->op == LOOM_OP_BN_BWD_DATA) &&
			  n->format == LOOM_FORMAT_NHWC && !n->a.bn.sync &&
			  loom_cuda_bn_cudnn_takes(pl, n);
		r.bn_fwd += n->op == LOOM_OP_BATCHNORM2D && nhwc[v];
		r.bn_bwd += n->op == LOOM_OP_BN_BWD_DATA && nhwc[v];
		r.relu_bwds += n->op == LOOM_OP_RELU_BWD;
	}
	for (loom_value a = 0; a < g->n; a++) {
		loom_value z, b = loom_cuda_bn_add_match(pl, step_of, a, nhwc, add_by, &z);
		if (b == LOOM_NONE)
			continue;
		cr_expect_neq(z, LOOM_NONE);
		add_by[b] = a;
		r.adds_fused++;
	}
	for (loom_value b = 0; b < g->n; b++) {
		const loom_node *bn = &g->nodes[b];
		if (bn->op != LOOM_OP_BN_BWD_DATA || !nhwc[b])
			continue;
		loom_value f = LOOM_NONE;
		for (loom_value w = 0; w < g->n; w++)
			if (g->nodes[w].op == LOOM_OP_BATCHNORM2D && g->nodes[w].src[0] == bn->src[0] &&
			    nhwc[w])
				f = w;
		if (f == LOOM_NONE)
			continue;
		r.paired++;
		memset(makes, 0, g->n);
		for (loom_value w = loom_sibling_first(pl, b); w != LOOM_NONE; w = loom_sibling_next(pl, w))
			makes[w] = g->nodes[w].dtype == LOOM_F32 &&
				   (g->nodes[w].op == LOOM_OP_BN_BWD_GAMMA ||
				    g->nodes[w].op == LOOM_OP_CHANNEL_SUM);
		loom_cuda_bn_bwd_fusion fu;
		int ops = loom_cuda_bn_bwd_match(pl, step_of, b, f, add_by, makes, &fu);
		if (ops == LOOM_CUDA_BN_EX_NONE)
			continue;
		cr_expect_eq(fu.relu_bwd, bn->src[2]);
		cr_expect_eq(g->nodes[fu.relu_bwd].op, LOOM_OP_RELU_BWD);
		cr_expect_eq(fu.beta, g->nodes[f].src[2]);
		if (ops == LOOM_CUDA_BN_EX_ACT) {
			cr_expect_eq(fu.y, f, "BN_ACTIVATION reads the forward's relu'd output");
			r.act++;
		} else {
			cr_expect_eq(fu.y, add_by[f], "BN_ADD_ACTIVATION reads the add's output");
			r.add_act++;
		}
	}
	free(step_of);
	free(nhwc);
	free(makes);
	free(add_by);
	return r;
}

/*
 * ResNet-50 at O2 fp16 in NHWC: every batch norm on cuDNN with its
 * backward paired; each bottleneck's bn3 run by its add (batch norm + add
 * + relu) and its backward doing the add + relu's (BN_ADD_ACTIVATION);
 * the backwards of the batch norms with a fused relu doing the relu's
 * (BN_ACTIVATION): all 33, and the add + relu's in the 12 identity blocks
 * (a projection block's relu backward is read by the shortcut's batch-norm
 * backward first, so it runs by itself there).
 */
Test(cuda_formats, resnet50_o2_bn_ex_backward_fusions)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value logits;
	loom_value loss = loom_model_resnet_width(g, 50, 4, 32, 10, 8, &logits);
	cr_assert_neq(loss, LOOM_NONE);
	loom_program *p = compile_cuda_like(g, loss, LOOM_O2);
	const loom_graph *pg = p->plan.g;
	int nhwc_bn = 0, bns = 0, relu_bns = 0;
	for (loom_value v = 0; v < pg->n; v++)
		if (pg->nodes[v].op == LOOM_OP_BATCHNORM2D) {
			bns++;
			nhwc_bn += pg->nodes[v].format == LOOM_FORMAT_NHWC;
			relu_bns += pg->nodes[v].a.bn.relu;
		}
	bn_fusions r = bn_fusions_of(&p->plan);
	cr_log_info("ResNet-50 O2: %d batch norms (%d NHWC, %d with a relu), %d backwards paired, "
		    "%d adds fused, %d BN_ACTIVATION and %d BN_ADD_ACTIVATION backwards",
		    bns, nhwc_bn, relu_bns, r.paired, r.adds_fused, r.act, r.add_act);
	cr_expect_eq(bns, 53, "ResNet-50 has 53 batch norms, the plan %d", bns);
	cr_expect_eq(r.bn_fwd, bns, "%d of %d batch norms NHWC on cuDNN", r.bn_fwd, bns);
	cr_expect_eq(r.paired, r.bn_bwd, "%d of %d backwards paired", r.paired, r.bn_bwd);
	cr_expect_eq(r.adds_fused, 16, "one add + relu per bottleneck runs its bn3: %d",
		     r.adds_fused);
	cr_expect(r.add_act >= 12 && r.add_act <= r.adds_fused,
		  "%d BN_ADD_ACTIVATION backwards of %d fused adds, want the 12 identity blocks'",
		  r.add_act, r.adds_fused);
	cr_expect_eq(r.act, relu_bns, "%d BN_ACTIVATION backwards of %d batch norms with a relu",
		     r.act, relu_bns);
	if (getenv("FORMATS_DUMP"))
		loom_program_dump(p, stderr);
	loom_program_free(p);
	loom_graph_free(g);
}

/* The saved slot: the statistics (room for either family's pair), then
 * the reserve from an aligned offset; without one, the statistics alone. */
Test(cuda_formats, bn_saved_slot_holds_the_reserve)
{
	const int64_t chans[3] = { 1, 64, 2048 };
	for (int i = 0; i < 3; i++) {
		int64_t c = chans[i];
		size_t off = loom_cuda_bn_reserve_off(c);
		cr_expect_geq(off, 2 * sizeof(double) * (size_t)c, "c %lld", (long long)c);
		cr_expect_eq(off % 256, 0, "c %lld: offset %zu unaligned", (long long)c, off);
		cr_expect_eq(loom_cuda_bn_slot_bytes(c, 0), 2 * sizeof(double) * (size_t)c);
		cr_expect_eq(loom_cuda_bn_slot_bytes(c, 1000), off + 1000);
	}
}
