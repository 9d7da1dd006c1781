/*
 * tests/graph/test_fuse.c — the fusion passes (graph/fuse.c): relu into
 * max-pool, linear, batch norm and the residual add, sibling outputs, and
 * AMP casts into their producers and readers:
 * which nodes they fuse, which they must leave alone, and that the fused
 * plan trains like the unfused one while planning no more memory.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/program_internal.h"
#include "examples/models.h"
#include "graph/ops/ops.h"
#include "loom.h"

#define B 8

static loom_program *compile_at(loom_graph *g, loom_value loss, int no_fusion,
				 loom_opt_level level)
{
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim.momentum = 0.9;
	o.no_fusion = no_fusion;
	o.amp.level = level;
	loom_program *p = NULL;
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	return p;
}

static loom_program *compile(loom_graph *g, loom_value loss, int no_fusion)
{
	return compile_at(g, loss, no_fusion, LOOM_O0);
}

static int count(const loom_program *p, loom_op op, int relu)
{
	int n = 0;
	for (int v = 0; v < p->plan.g->n; v++)
		if (p->plan.g->nodes[v].op == op && (relu < 0 || p->plan.g->nodes[v].a.pool.relu == relu))
			n++;
	return n;
}

static int bn_relus(const loom_program *p)
{
	int n = 0;
	for (int v = 0; v < p->plan.g->n; v++)
		n += p->plan.g->nodes[v].op == LOOM_OP_BATCHNORM2D && p->plan.g->nodes[v].a.bn.relu;
	return n;
}

static int add_relus(const loom_program *p)
{
	int n = 0;
	for (int v = 0; v < p->plan.g->n; v++)
		n += p->plan.g->nodes[v].op == LOOM_OP_ADD && p->plan.g->nodes[v].a.ew.relu;
	return n;
}

/* B rows of `features` values in (-amp, amp) into input x, labels in
 * [0, classes) into input y. */
typedef struct inputs {
	const char *x, *y;
	int features, classes;
	float amp;
} inputs;

static const inputs CONVNET_IN = { "image", "label", 784, 10, 1 };

static void feed(loom_program *p, const inputs *in, unsigned seed)
{
	float *x = malloc(sizeof(float) * B * in->features);
	int32_t y[B];
	cr_assert(x);
	srand(seed);
	for (int i = 0; i < B * in->features; i++)
		x[i] = ((float)rand() / RAND_MAX * 2 - 1) * in->amp;
	for (int i = 0; i < B; i++)
		y[i] = rand() % in->classes;
	cr_assert_eq(loom_set_input(p, in->x, x, LOOM_F32, (size_t)B * in->features), LOOM_OK);
	cr_assert_eq(loom_set_input(p, in->y, y, LOOM_I32, B), LOOM_OK);
	free(x);
}

/* Five training steps of the fused plan f and the unfused plan u on the
 * same data. tol 0: the same losses and, bit for bit, the same parameters
 * and buffers; else each within tol relative (of the tensor's largest
 * magnitude, so values near zero are not held to a tighter bound). */
static void expect_trains_within(loom_graph *g, loom_program *f, loom_program *u,
				 const inputs *in, double tol)
{
	for (int step = 0; step < 5; step++) {
		feed(f, in, 100 + step);
		feed(u, in, 100 + step);
		cr_assert_eq(loom_run(f, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(f));
		cr_assert_eq(loom_run(u, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(u));
		double lf = loom_loss(f), lu = loom_loss(u);
		if (tol == 0)
			cr_assert_eq(lf, lu, "step %d: loss %.17g fused vs %.17g", step, lf, lu);
		else
			cr_assert_leq(fabs(lf - lu), tol * fabs(lu), "step %d: loss %.17g fused vs %.17g",
				      step, lf, lu);
	}
	for (int v = 0; v < g->n; v++) {
		if (g->nodes[v].op != LOOM_OP_PARAM && g->nodes[v].op != LOOM_OP_BUFFER)
			continue;
		size_t n = (size_t)loom_shape_numel(&g->nodes[v].shape);
		double *a = malloc(n * 8), *b = malloc(n * 8);
		cr_assert_eq(loom_read_f64(f, v, a, n), LOOM_OK);
		cr_assert_eq(loom_read_f64(u, v, b, n), LOOM_OK);
		if (tol == 0) {
			cr_assert(memcmp(a, b, n * 8) == 0, "'%s' differs between fused and unfused",
				  g->nodes[v].name);
		} else {
			double big = 0, worst = 0;
			for (size_t i = 0; i < n; i++) {
				big = fmax(big, fabs(b[i]));
				worst = fmax(worst, fabs(a[i] - b[i]));
			}
			cr_assert_leq(worst, tol * big, "'%s': fused and unfused differ by %g (largest %g)",
				      g->nodes[v].name, worst, big);
		}
		free(a);
		free(b);
	}
}

static void expect_trains_alike(loom_graph *g, loom_program *f, loom_program *u,
				const inputs *in)
{
	expect_trains_within(g, f, u, in, 0);
}

Test(fuse, convnet_relus_fold_into_pools)
{
	loom_graph *g;
	loom_graph_new(&g);
	loom_value loss = loom_model_convnet(g, B, NULL);
	loom_program *p = compile(g, loss, 0);
	cr_assert_eq(count(p, LOOM_OP_RELU, -1), 0, "a relu survived fusion");
	cr_assert_eq(count(p, LOOM_OP_RELU_BWD, -1), 0, "a relu backward survived fusion");
	cr_assert_eq(count(p, LOOM_OP_MAXPOOL2D, 1), 2);
	cr_assert_eq(count(p, LOOM_OP_MAXPOOL2D_BWD, 1), 2);
	/* The batch norms' relus feed pools: the pool fusion has them. */
	cr_assert_eq(bn_relus(p), 0, "a batch norm took a relu that feeds a pool");
	/* The fused pools read batch norm's output directly. */
	for (int v = 0; v < p->plan.g->n; v++)
		if (p->plan.g->nodes[v].op == LOOM_OP_MAXPOOL2D)
			cr_assert_eq(p->plan.g->nodes[p->plan.g->nodes[v].src[0]].op, LOOM_OP_BATCHNORM2D);
	loom_program *q = compile(g, loss, 1);
	cr_assert_eq(count(q, LOOM_OP_RELU, -1), 2);
	cr_assert_eq(count(q, LOOM_OP_MAXPOOL2D, 1), 0);
	loom_program_info fi, ui;
	loom_program_info_get(p, &fi);
	loom_program_info_get(q, &ui);
	cr_assert_lt(fi.activation_bytes, ui.activation_bytes, "fused %zu vs unfused %zu bytes",
		     fi.activation_bytes, ui.activation_bytes);
	loom_program_free(p);
	loom_program_free(q);
	loom_graph_free(g);
}

Test(fuse, fused_trains_bit_for_bit_like_unfused)
{
	loom_graph *g;
	loom_graph_new(&g);
	loom_value logits;
	loom_value loss = loom_model_convnet(g, B, &logits);
	loom_program *f = compile(g, loss, 0), *u = compile(g, loss, 1);
	expect_trains_alike(g, f, u, &CONVNET_IN);
	loom_program_free(f);
	loom_program_free(u);
	loom_graph_free(g);
}

Test(fuse, relu_with_other_readers_is_left_alone)
{
	/* relu feeds a pool and also a residual add: the add needs the relu's
	 * own values, so nothing may be fused. */
	loom_graph *g;
	loom_graph_new(&g);
	int64_t xd[4] = { 2, 3, 4, 4 }, yd[1] = { 2 };
	loom_value x = loom_input(g, "x", LOOM_F32, 4, xd);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	loom_value h = loom_layer_conv2d(g, "c", x, 3, 3, 1, 1, 1);
	loom_value r = loom_relu(g, h);
	loom_value pooled = loom_maxpool2d(g, r, 2, 2, 0);
	loom_value skip = loom_maxpool2d(g, loom_add(g, r, h), 2, 2, 0);
	loom_value z = loom_add(g, pooled, skip);
	loom_value loss = loom_softmax_cross_entropy(g, loom_layer_linear(g, "fc", loom_flatten(g, z), 5, 1), y);
	loom_program *p = compile(g, loss, 0);
	cr_assert_eq(count(p, LOOM_OP_RELU, -1), 1, "the shared relu was fused away");
	cr_assert_eq(count(p, LOOM_OP_MAXPOOL2D, 1), 0);
	loom_program_free(p);
	loom_graph_free(g);
}

/* ------------------------------------------------------------ siblings */

static int siblings_of(const loom_program *p, loom_op maker, loom_op sib)
{
	int n = 0;
	for (int v = 0; v < p->plan.g->n; v++) {
		const loom_node *nd = &p->plan.g->nodes[v];
		if (nd->op == sib && nd->made_by != LOOM_NONE && nd->made_by < v &&
		    p->plan.g->nodes[nd->made_by].op == maker)
			n++;
	}
	return n;
}

Test(fuse, convnet_siblings_are_marked)
{
	loom_graph *g;
	loom_graph_new(&g);
	loom_value loss = loom_model_convnet(g, B, NULL);
	loom_program *p = compile(g, loss, 0);
	/* Two batch norms: dgamma and dbeta made with dx; the linear's bias
	 * gradient made with its weight gradient. Nothing else. */
	cr_assert_eq(siblings_of(p, LOOM_OP_BN_BWD_DATA, LOOM_OP_BN_BWD_GAMMA), 2);
	cr_assert_eq(siblings_of(p, LOOM_OP_BN_BWD_DATA, LOOM_OP_CHANNEL_SUM), 2);
	cr_assert_eq(siblings_of(p, LOOM_OP_MATMUL, LOOM_OP_CHANNEL_SUM), 1);
	int marked = 0;
	for (int v = 0; v < p->plan.g->n; v++) {
		const loom_node *nd = &p->plan.g->nodes[v];
		if (nd->made_by == LOOM_NONE)
			continue;
		marked++;
		/* Everything a sibling reads exists when its maker runs. */
		for (int i = 0; i < nd->nsrc; i++)
			cr_assert_lt(nd->src[i], nd->made_by, "node %d reads %d, made at %d", v,
				     (int)nd->src[i], (int)nd->made_by);
	}
	cr_assert_eq(marked, 5);
	/* Each maker knows its siblings, in node order. */
	int listed = 0;
	for (int v = 0; v < p->plan.g->n; v++)
		for (loom_value w = loom_sibling_first(&p->plan, v); w != LOOM_NONE;
		     w = loom_sibling_next(&p->plan, w)) {
			cr_assert_eq(p->plan.g->nodes[w].made_by, v);
			listed++;
		}
	cr_assert_eq(listed, 5);
	loom_program_free(p);

	/* no_fusion leaves every value to its own node. */
	p = compile(g, loss, 1);
	for (int v = 0; v < p->plan.g->n; v++)
		cr_assert_eq(p->plan.g->nodes[v].made_by, LOOM_NONE, "node %d marked under no_fusion", v);
	loom_program_free(p);
	loom_graph_free(g);
}

/* Two layer norms over [2, 3, 8] into a linear: each dx makes its dgamma
 * and its dbeta (the column sums of dy's rows view, made before dx by the
 * gradient rule); everything they read exists when dx runs. */
Test(fuse, layernorm_gradients_are_dx_siblings)
{
	loom_graph *g;
	loom_graph_new(&g);
	int64_t xd[3] = { 2, 3, 8 }, yd[1] = { 6 }, fd[2] = { 6, 8 };
	loom_value x = loom_input(g, "x", LOOM_F32, 3, xd);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	loom_value h = loom_layer_layernorm(g, "ln1", loom_layer_linear(g, "fc0", x, 8, 1));
	int64_t cd[1] = { 8 };
	loom_value g2 = loom_param(g, "ln2.weight", LOOM_F32, 1, cd, LOOM_INIT_ONES, 1);
	loom_value b2 = loom_param(g, "ln2.bias", LOOM_F32, 1, cd, LOOM_INIT_ZEROS, 1);
	h = loom_layernorm(g, h, g2, b2, 1e-5);
	loom_value logits = loom_layer_linear(g, "fc", loom_reshape(g, h, 2, fd), 5, 1);
	loom_value loss = loom_softmax_cross_entropy(g, logits, y);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	loom_program *p = compile(g, loss, 0);
	cr_assert_eq(siblings_of(p, LOOM_OP_LAYERNORM_BWD_DATA, LOOM_OP_LAYERNORM_BWD_GAMMA), 2);
	cr_assert_eq(siblings_of(p, LOOM_OP_LAYERNORM_BWD_DATA, LOOM_OP_CHANNEL_SUM), 2);
	for (int v = 0; v < p->plan.g->n; v++) {
		const loom_node *nd = &p->plan.g->nodes[v];
		if (nd->made_by == LOOM_NONE || p->plan.g->nodes[nd->made_by].op != LOOM_OP_LAYERNORM_BWD_DATA)
			continue;
		for (int i = 0; i < nd->nsrc; i++)
			cr_assert_lt(nd->src[i], nd->made_by, "node %d reads %d, made at %d", v,
				     (int)nd->src[i], (int)nd->made_by);
	}
	loom_program *u = compile(g, loss, 1);
	cr_assert_eq(siblings_of(u, LOOM_OP_LAYERNORM_BWD_DATA, LOOM_OP_LAYERNORM_BWD_GAMMA), 0);
	loom_program_free(u);
	loom_program_free(p);
	loom_graph_free(g);
}

Test(fuse, conv_bias_sum_is_not_a_matmul_sibling)
{
	/* A conv bias's gradient is a channel sum of a 4-D dy: no matrix
	 * product makes it. A linear without bias has no sibling at all. */
	loom_graph *g;
	loom_graph_new(&g);
	int64_t xd[4] = { 2, 3, 6, 6 }, yd[1] = { 2 };
	loom_value x = loom_input(g, "x", LOOM_F32, 4, xd);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	loom_value h = loom_layer_conv2d(g, "c", x, 4, 3, 1, 1, 1);
	loom_value z = loom_layer_linear(g, "fc", loom_flatten(g, h), 5, 0);
	loom_value loss = loom_softmax_cross_entropy(g, z, y);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	loom_program *p = compile(g, loss, 0);
	for (int v = 0; v < p->plan.g->n; v++)
		cr_assert_eq(p->plan.g->nodes[v].made_by, LOOM_NONE, "node %d (%s) was marked", v,
			     loom_op_defs[p->plan.g->nodes[v].op]->name);
	loom_program_free(p);
	loom_graph_free(g);
}

/* ------------------------------------------------------------ linear + relu */

static loom_value mlp(loom_graph *g, int mark_hidden)
{
	int64_t xd[2] = { B, 20 }, yd[1] = { B };
	loom_value x = loom_input(g, "x", LOOM_F32, 2, xd);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	loom_value h = loom_layer_linear(g, "fc1", x, 32, 1);
	if (mark_hidden)
		loom_mark_output(g, h);
	loom_value r = loom_relu(g, h);
	loom_value z = loom_relu(g, loom_layer_linear(g, "fc2", r, 16, 0));
	return loom_softmax_cross_entropy(g, loom_layer_linear(g, "fc3", z, 5, 1), y);
}

static int linear_relus(const loom_program *p)
{
	int n = 0;
	for (int v = 0; v < p->plan.g->n; v++)
		n += p->plan.g->nodes[v].op == LOOM_OP_LINEAR && p->plan.g->nodes[v].a.mm.relu;
	return n;
}

Test(fuse, linear_relu_fuses_and_trains_bit_for_bit)
{
	loom_graph *g;
	loom_graph_new(&g);
	loom_value loss = mlp(g, 0);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	loom_program *f = compile(g, loss, 0), *u = compile(g, loss, 1);
	/* With and without a bias; the last linear has no relu. */
	cr_assert_eq(linear_relus(f), 2);
	cr_assert_eq(count(f, LOOM_OP_RELU, -1), 0, "a relu survived fusion");
	cr_assert_eq(count(f, LOOM_OP_RELU_BWD, -1), 2, "relu's backward is kept");
	cr_assert_eq(linear_relus(u), 0);
	static const inputs in = { "x", "y", 20, 5, 2 };
	expect_trains_alike(g, f, u, &in);
	loom_program_free(f);
	loom_program_free(u);
	loom_graph_free(g);
}

Test(fuse, linear_read_by_others_keeps_its_relu)
{
	/* The hidden layer is marked as an output: its pre-relu values must
	 * stay readable, so that linear is not fused (the next one is). */
	loom_graph *g;
	loom_graph_new(&g);
	loom_value loss = mlp(g, 1);
	loom_program *p = compile(g, loss, 0);
	cr_assert_eq(linear_relus(p), 1);
	cr_assert_eq(count(p, LOOM_OP_RELU, -1), 1);
	loom_program_free(p);
	loom_graph_free(g);
}

/* ------------------------------------------------- batch norm / add + relu */

Test(fuse, resnet18_bn_and_residual_relus_fuse)
{
	/* CIFAR stem: conv, bn + relu; eight basic blocks, each with
	 * bn1 + relu and relu(bn2 + shortcut). bn2 and the downsample batch
	 * norms feed the add, not a relu, and stay as they are. */
	loom_graph *g;
	loom_graph_new(&g);
	loom_value loss = loom_model_resnet(g, 18, 2, 32, 10, NULL);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	loom_program *f = compile(g, loss, 0), *u = compile(g, loss, 1);
	cr_assert_eq(bn_relus(f), 9);
	cr_assert_eq(add_relus(f), 8);
	cr_assert_eq(count(f, LOOM_OP_RELU, -1), 0, "a relu survived fusion");
	cr_assert_eq(count(u, LOOM_OP_RELU, -1), 17);
	cr_assert_eq(bn_relus(u) + add_relus(u), 0, "fused under no_fusion");
	/* Every relu backward reads a fused node's output (the relu'd
	 * value), and only forward adds carry a relu. */
	int bwd = 0;
	for (int v = 0; v < f->plan.g->n; v++) {
		const loom_node *n = &f->plan.g->nodes[v];
		if (n->op == LOOM_OP_ADD && n->a.ew.relu)
			cr_assert(!(n->flags & LOOM_NODE_BACKWARD), "backward add %d fused", v);
		if (n->op != LOOM_OP_RELU_BWD)
			continue;
		const loom_node *x = &f->plan.g->nodes[n->src[0]];
		cr_assert((x->op == LOOM_OP_BATCHNORM2D && x->a.bn.relu) ||
				  (x->op == LOOM_OP_ADD && x->a.ew.relu),
			  "relu backward %d reads %s", v, loom_op_defs[x->op]->name);
		bwd++;
	}
	cr_assert_eq(bwd, 17);
	loom_program_info fi, ui;
	loom_program_info_get(f, &fi);
	loom_program_info_get(u, &ui);
	cr_assert_leq(fi.activation_bytes, ui.activation_bytes, "fused %zu vs unfused %zu bytes",
		      fi.activation_bytes, ui.activation_bytes);
	cr_log_info("resnet18 cifar b2 activations: fused %zu, unfused %zu, naive %zu bytes",
		    fi.activation_bytes, ui.activation_bytes, ui.activation_naive_bytes);
	loom_program_free(f);
	loom_program_free(u);
	loom_graph_free(g);
}

/* Two ResNet basic blocks on a [B, 3, 8, 8] image: a stem conv + bn + relu,
 * an identity block and a strided one with a downsample shortcut. */
static loom_value block(loom_graph *g, const char *name, loom_value x, int out, int stride)
{
	char n[64];
	snprintf(n, sizeof(n), "%s.conv1", name);
	loom_value h = loom_layer_conv2d(g, n, x, out, 3, stride, 1, 0);
	snprintf(n, sizeof(n), "%s.bn1", name);
	h = loom_relu(g, loom_layer_batchnorm2d(g, n, h));
	snprintf(n, sizeof(n), "%s.conv2", name);
	h = loom_layer_conv2d(g, n, h, out, 3, 1, 1, 0);
	snprintf(n, sizeof(n), "%s.bn2", name);
	h = loom_layer_batchnorm2d(g, n, h);
	loom_value s = x;
	if (stride != 1 || loom_value_shape(g, x).dims[1] != out) {
		snprintf(n, sizeof(n), "%s.down.conv", name);
		s = loom_layer_conv2d(g, n, x, out, 1, stride, 0, 0);
		snprintf(n, sizeof(n), "%s.down.bn", name);
		s = loom_layer_batchnorm2d(g, n, s);
	}
	return loom_relu(g, loom_add(g, h, s));
}

static loom_value resnet_blocks(loom_graph *g)
{
	int64_t xd[4] = { B, 3, 8, 8 }, yd[1] = { B };
	loom_value x = loom_input(g, "image", LOOM_F32, 4, xd);
	loom_value y = loom_input(g, "label", LOOM_I32, 1, yd);
	loom_value h = loom_layer_conv2d(g, "conv1", x, 8, 3, 1, 1, 0);
	h = loom_relu(g, loom_layer_batchnorm2d(g, "bn1", h));
	h = block(g, "layer1", h, 8, 1);
	h = block(g, "layer2", h, 16, 2);
	loom_value z = loom_layer_linear(g, "fc", loom_global_avgpool(g, h), 5, 1);
	return loom_softmax_cross_entropy(g, z, y);
}

static const inputs BLOCKS_IN = { "image", "label", 3 * 8 * 8, 5, 2 };

Test(fuse, resnet_blocks_train_bit_for_bit_like_unfused)
{
	loom_graph *g;
	loom_graph_new(&g);
	loom_value loss = resnet_blocks(g);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	loom_program *f = compile(g, loss, 0), *u = compile(g, loss, 1);
	cr_assert_eq(bn_relus(f), 3);
	cr_assert_eq(add_relus(f), 2);
	expect_trains_alike(g, f, u, &BLOCKS_IN);
	loom_program_free(f);
	loom_program_free(u);
	loom_graph_free(g);
}

/* Under AMP the relu runs before the rounding to half instead of after it:
 * the same values (rounding keeps signs; a -0 may become +0), so the run
 * stays within half rounding of the unfused one. At O1 batch norm and the
 * add run in fp32 and the two plans agree bit for bit; O2 runs them in half
 * (bit for bit on this data too, but a zero's sign may differ, so only half
 * rounding is promised). */
static void resnet_blocks_at(loom_opt_level level, double tol)
{
	loom_graph *g;
	loom_graph_new(&g);
	loom_value loss = resnet_blocks(g);
	loom_program *f = compile_at(g, loss, 0, level), *u = compile_at(g, loss, 1, level);
	cr_assert_eq(bn_relus(f), 3, "O%d", (int)level);
	cr_assert_eq(add_relus(f), 2, "O%d", (int)level);
	expect_trains_within(g, f, u, &BLOCKS_IN, tol);
	loom_program_free(f);
	loom_program_free(u);
	loom_graph_free(g);
}

Test(fuse, resnet_blocks_o1_train_like_unfused)
{
	resnet_blocks_at(LOOM_O1, 0);
}

Test(fuse, resnet_blocks_o2_train_within_half_rounding)
{
	resnet_blocks_at(LOOM_O2, 1.0 / 2048);
}

/* ------------------------------------------------- casts at named ops */

/* loom_fuse_casts_for, as the CUDA backend calls it (its takes_any_dtype;
 * here fakes): x (bf16) widened to f32 and read by a relu and an add;
 * p = relu(w) (f32) narrowed to bf16 for a relu. */
typedef struct cast_case {
	loom_graph *g;
	loom_value x, c, r, a, p, d;
} cast_case;

static void cast_case_build(cast_case *k)
{
	int64_t dims[2] = { 4, 8 };
	loom_graph_new(&k->g);
	loom_graph *g = k->g;
	k->x = loom_input(g, "x", LOOM_BF16, 2, dims);
	loom_value z = loom_input(g, "z", LOOM_F32, 2, dims);
	loom_value w = loom_input(g, "w", LOOM_F32, 2, dims);
	k->c = loom_node_add(g, LOOM_OP_CAST, LOOM_F32, loom_shape_make(2, dims), 1, &k->x);
	k->r = loom_relu(g, k->c);
	k->a = loom_add(g, k->c, z);
	k->p = loom_relu(g, w);
	k->d = loom_node_add(g, LOOM_OP_CAST, LOOM_BF16, loom_shape_make(2, dims), 1, &k->p);
	loom_relu(g, k->d);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
}

static int takes_relu_add(loom_op op)
{
	return op == LOOM_OP_RELU || op == LOOM_OP_ADD;
}

static int takes_relu(loom_op op)
{
	return op == LOOM_OP_RELU;
}

static int takes_none(loom_op op)
{
	(void)op;
	return 0;
}

Test(fuse, casts_fold_only_at_ops_that_take_any_dtype)
{
	cast_case k;
	const loom_node *n;

	/* Both readers take: the widening cast goes into both, which read
	 * x itself; the narrowing one folds into its producer. */
	cast_case_build(&k);
	cr_assert_eq(loom_fuse_casts_for(k.g, takes_relu_add), 2);
	n = k.g->nodes;
	cr_assert_eq(n[k.c].op, LOOM_OP_RESHAPE);
	cr_assert_eq(n[k.r].src[0], k.x);
	cr_assert_eq(n[k.a].src[0], k.x);
	cr_assert_eq(n[k.d].op, LOOM_OP_RESHAPE);
	cr_assert_eq(n[k.p].dtype, LOOM_BF16);
	cr_assert(n[k.p].flags & LOOM_NODE_CAST_FOLDED);
	loom_graph_free(k.g);

	/* The add does not take: the widening cast stays for both readers. */
	cast_case_build(&k);
	cr_assert_eq(loom_fuse_casts_for(k.g, takes_relu), 1);
	n = k.g->nodes;
	cr_assert_eq(n[k.c].op, LOOM_OP_CAST);
	cr_assert_eq(n[k.r].src[0], k.c);
	cr_assert_eq(n[k.a].src[0], k.c);
	cr_assert_eq(n[k.d].op, LOOM_OP_RESHAPE);
	loom_graph_free(k.g);

	/* No op takes: nothing changes. */
	cast_case_build(&k);
	cr_assert_eq(loom_fuse_casts_for(k.g, takes_none), 0);
	n = k.g->nodes;
	cr_assert_eq(n[k.c].op, LOOM_OP_CAST);
	cr_assert_eq(n[k.d].op, LOOM_OP_CAST);
	cr_assert_eq(n[k.p].dtype, LOOM_F32);
	loom_graph_free(k.g);

	/* The CPU's rule (every op takes, one reader): the widening cast
	 * read twice stays; the narrowing one folds. */
	cast_case_build(&k);
	cr_assert_eq(loom_fuse_casts(k.g), 1);
	n = k.g->nodes;
	cr_assert_eq(n[k.c].op, LOOM_OP_CAST);
	cr_assert_eq(n[k.d].op, LOOM_OP_RESHAPE);
	loom_graph_free(k.g);
}

/* ------------------------------------------- a widening cast and siblings */

/*
 * Batch norm's backward built by hand with its gamma in bf16, widened to
 * f32 by a cast that dx alone reads: x, dy [2, 3, 4, 4] f32, gh [3] bf16;
 * c = cast(gh) f32, dx = bn_bwd_data(x, c, dy), and (siblings 1) dgamma =
 * bn_bwd_gamma(x, dy) and dbeta = channel_sum(dy), which
 * loom_fuse_siblings marks as made by dx. No shipped model has it (there
 * the forward batch norm reads gamma too), so the rule that guards it is
 * tested here. The outputs are dx, dgamma and dbeta; the loss sum(dx).
 */
typedef struct bn_cast_case {
	loom_graph *g;
	loom_value x, gh, dy, c, dx, dg, db, loss;
} bn_cast_case;

static void bn_cast_case_build(bn_cast_case *k, int siblings)
{
	int64_t xd[4] = { 2, 3, 4, 4 }, cd[1] = { 3 };
	loom_shape xs = loom_shape_make(4, xd), cs = loom_shape_make(1, cd);
	loom_graph_new(&k->g);
	loom_graph *g = k->g;
	k->x = loom_input(g, "x", LOOM_F32, 4, xd);
	k->gh = loom_input(g, "gh", LOOM_BF16, 1, cd);
	k->dy = loom_input(g, "dy", LOOM_F32, 4, xd);
	k->c = loom_node_add(g, LOOM_OP_CAST, LOOM_F32, cs, 1, &k->gh);
	loom_value s3[3] = { k->x, k->c, k->dy }, s2[2] = { k->x, k->dy };
	k->dx = loom_node_add(g, LOOM_OP_BN_BWD_DATA, LOOM_F32, xs, 3, s3);
	g->nodes[k->dx].a.bn.eps = 1e-5;
	k->dg = k->db = LOOM_NONE;
	if (siblings) {
		k->dg = loom_node_add(g, LOOM_OP_BN_BWD_GAMMA, LOOM_F32, cs, 2, s2);
		g->nodes[k->dg].a.bn.eps = 1e-5;
		k->db = loom_node_add(g, LOOM_OP_CHANNEL_SUM, LOOM_F32, cs, 1, &k->dy);
		loom_mark_output(g, k->dg);
		loom_mark_output(g, k->db);
	}
	loom_mark_output(g, k->dx);
	k->loss = loom_sum(g, k->dx);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
}

/* The case's outputs after one forward run of p (compiled for inference,
 * fused or not) on fixed inputs, as f64: dx, then dgamma and dbeta. */
static double *bn_cast_case_run(bn_cast_case *k, int no_fusion, size_t *n_out)
{
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.inference = 1;
	o.no_fusion = no_fusion;
	loom_program *p = NULL;
	cr_assert_eq(loom_compile(k->g, k->loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	if (!no_fusion) { /* the plan's graph (a clone: the same node numbers) */
		const loom_node *n = p->plan.g->nodes;
		cr_assert_eq(n[k->dg].made_by, k->dx);
		cr_assert_eq(n[k->c].op, LOOM_OP_CAST, "the plan folded the cast into dx");
		cr_assert_eq(n[k->dx].src[1], k->c);
	}
	enum { NX = 2 * 3 * 4 * 4 };
	float x[NX], dy[NX];
	uint16_t gh[3] = { 0x3f40, 0xbfa0, 0x4020 }; /* bf16: 0.75, -1.25, 2.5 */
	srand(7);
	for (int i = 0; i < NX; i++) {
		x[i] = (float)rand() / RAND_MAX * 2 - 1;
		dy[i] = (float)rand() / RAND_MAX * 2 - 1;
	}
	cr_assert_eq(loom_set_input(p, "x", x, LOOM_F32, NX), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_set_input(p, "dy", dy, LOOM_F32, NX), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_set_input(p, "gh", gh, LOOM_BF16, 3), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_run(p, LOOM_RUN_EVAL), LOOM_OK, "%s", loom_program_error(p));
	double *out = malloc(sizeof(double) * (NX + 6));
	cr_assert(out);
	cr_assert_eq(loom_read_f64(p, k->dx, out, NX), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_read_f64(p, k->dg, out + NX, 3), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_read_f64(p, k->db, out + NX + 3, 3), LOOM_OK, "%s", loom_program_error(p));
	*n_out = NX + 6;
	loom_program_free(p);
	return out;
}

static int takes_all(loom_op op)
{
	(void)op;
	return 1;
}

/*
 * A widening cast goes into its one kernel reader (sole_kernel_reader)
 * unless that reader makes siblings: such a node keeps its dtypes, as the
 * one-pass kernel that makes batch norm's dx with dgamma and dbeta takes
 * equal dtypes only (engine/cpu/ops_bn.c's bn_fuses_sibling; cuDNN's
 * backward on a GPU). Folded, dx would read bf16 gamma and the sibling sums
 * would run again on their own. The same for a backend that names the ops
 * taking any dtype (taking_readers). Without the siblings the same cast folds
 * (so the graph is one where only that rule keeps it); with them it stays,
 * and the compiled plan computes dx, dgamma and dbeta bit for bit as the
 * unfused one.
 */
Test(fuse, widening_cast_stays_before_a_reader_that_makes_siblings)
{
	bn_cast_case k;
	const loom_node *n;

	bn_cast_case_build(&k, 0);
	cr_assert_eq(loom_fuse_siblings(k.g), 0);
	cr_assert_eq(loom_fuse_casts(k.g), 1, "without siblings the cast folds into dx");
	n = k.g->nodes;
	cr_assert_eq(n[k.c].op, LOOM_OP_RESHAPE);
	cr_assert_eq(n[k.dx].src[1], k.gh);
	loom_graph_free(k.g);

	bn_cast_case_build(&k, 1);
	cr_assert_eq(loom_fuse_siblings(k.g), 2);
	n = k.g->nodes;
	cr_assert_eq(n[k.dg].made_by, k.dx);
	cr_assert_eq(n[k.db].made_by, k.dx);
	cr_assert_eq(loom_fuse_casts(k.g), 0, "the cast folded into dx, which makes siblings");
	n = k.g->nodes;
	cr_assert_eq(n[k.c].op, LOOM_OP_CAST);
	cr_assert_eq(n[k.c].dtype, LOOM_F32);
	cr_assert_eq(n[k.dx].src[1], k.c, "dx reads node %d, not the cast %d", (int)n[k.dx].src[1],
		     (int)k.c);
	loom_graph_free(k.g);

	/* A backend that names its ops (loom_fuse_casts_for, the CUDA
	 * backend's rule) keeps the cast too, though every op takes. */
	bn_cast_case_build(&k, 0);
	cr_assert_eq(loom_fuse_casts_for(k.g, takes_all), 1);
	cr_assert_eq(k.g->nodes[k.dx].src[1], k.gh);
	loom_graph_free(k.g);
	bn_cast_case_build(&k, 1);
	cr_assert_eq(loom_fuse_siblings(k.g), 2);
	cr_assert_eq(loom_fuse_casts_for(k.g, takes_all), 0,
		     "named ops: the cast folded into dx, which makes siblings");
	cr_assert_eq(k.g->nodes[k.c].op, LOOM_OP_CAST);
	cr_assert_eq(k.g->nodes[k.dx].src[1], k.c);
	loom_graph_free(k.g);

	/* Compiled (the CPU's fuse pass), against the unfused plan. */
	bn_cast_case_build(&k, 1);
	size_t nf, nu;
	double *f = bn_cast_case_run(&k, 0, &nf), *u = bn_cast_case_run(&k, 1, &nu);
	cr_assert_eq(nf, nu);
	int nonzero = 0;
	for (size_t i = 0; i < nf; i++)
		nonzero += f[i] != 0;
	cr_assert_gt(nonzero, (int)nf / 2);
	for (size_t i = 0; i < nf; i++)
		cr_assert(memcmp(&f[i], &u[i], sizeof(double)) == 0,
			  "output element %zu: %.17g fused, %.17g unfused", i, f[i], u[i]);
	free(f);
	free(u);
	loom_graph_free(k.g);
}
