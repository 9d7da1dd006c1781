/*
 * tests/amp/test_amp_pass.c — the cast-insertion pass as it shows in the
 * compiled graph: for O0..O3 with fp16 and bf16, on the ConvNet and on small
 * graphs, which dtype each node computes in, where the AMP casts sit, which
 * parameters are half and own an fp32 master, the loss scale each level
 * implies, and the option combinations refused as apex refuses them.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <string.h>

#include "amp/amp_pass.h"
#include "engine/program_internal.h"
#include "graph/graph_internal.h"
#include "graph/ops/ops.h"
#include "loom.h"

#define BATCH 2

static loom_compile_opts amp_opts(loom_opt_level level, loom_dtype half)
{
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.amp.level = level;
	o.amp.half = half;
	o.no_fusion = 1; /* the pass's own output, before the planner fuses relu into pools */
	return o;
}

/* conv 5x5 1->16 + bn + relu + maxpool, conv 5x5 16->32 + bn + relu +
 * maxpool, flatten, linear 1568->10, cross-entropy. */
static loom_graph *convnet(loom_value *loss)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t xd[4] = { BATCH, 1, 28, 28 }, yd[1] = { BATCH };
	loom_value x = loom_input(g, "x", LOOM_F32, 4, xd);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	loom_value h = loom_layer_conv2d(g, "conv1", x, 16, 5, 1, 2, 1);
	h = loom_maxpool2d(g, loom_relu(g, loom_layer_batchnorm2d(g, "bn1", h)), 2, 2, 0);
	h = loom_layer_conv2d(g, "conv2", h, 32, 5, 1, 2, 1);
	h = loom_maxpool2d(g, loom_relu(g, loom_layer_batchnorm2d(g, "bn2", h)), 2, 2, 0);
	h = loom_flatten(g, h);
	cr_assert_eq(loom_value_shape(g, h).dims[1], 1568);
	h = loom_layer_linear(g, "fc", h, 10, 1);
	*loss = loom_softmax_cross_entropy(g, h, y);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	return g;
}

static loom_program *compile_convnet(const loom_compile_opts *o)
{
	loom_value loss;
	loom_graph *g = convnet(&loss);
	loom_program *p;
	cr_assert_eq(loom_compile(g, loss, o, &p), LOOM_OK, "%s", loom_last_error());
	loom_graph_free(g);
	return p;
}

static const loom_node *node(const loom_program *p, loom_value v)
{
	return &p->plan.g->nodes[v];
}

/* The forward node that is op and called name (LOOM_NONE if none). */
static loom_value find(const loom_program *p, loom_op op, const char *name)
{
	for (int v = 0; v < p->plan.n_fwd; v++)
		if (node(p, v)->op == op && strcmp(node(p, v)->name, name) == 0)
			return v;
	return LOOM_NONE;
}

static loom_value must_find(const loom_program *p, loom_op op, const char *name)
{
	loom_value v = find(p, op, name);
	cr_assert_neq(v, LOOM_NONE, "no %s '%s' in the compiled graph", loom_op_defs[op]->name, name);
	return v;
}

/* The forward ops of kind op, in order. */
static int ops_of(const loom_program *p, loom_op op, loom_value *out, int max)
{
	int n = 0;
	for (int v = 0; v < p->plan.n_fwd; v++)
		if (node(p, v)->op == op && n < max)
			out[n++] = v;
	return n;
}

static int count_casts(const loom_program *p, int whole_graph)
{
	int n = 0;
	for (int v = 0; v < (whole_graph ? p->plan.g->n : p->plan.n_fwd); v++)
		n += node(p, v)->op == LOOM_OP_CAST;
	return n;
}

static int is_half(loom_dtype dt)
{
	return dt == LOOM_F16 || dt == LOOM_BF16;
}

/* Source i of v: as it is, or, when it is an AMP cast, what it casts. */
static loom_value through_cast(const loom_program *p, loom_value v, int i, loom_dtype want)
{
	loom_value s = node(p, v)->src[i];
	cr_assert_eq(node(p, s)->dtype, want, "source %d of node %d is %s, expected %s", i, v,
		     loom_dtype_name(node(p, s)->dtype), loom_dtype_name(want));
	return s;
}

/* Every CAST sits between a producer of another float dtype and its use,
 * carries the AMP flag, and exists once per (value, dtype). */
static void check_casts_well_placed(const loom_program *p)
{
	for (int v = 0; v < p->plan.n_fwd; v++) {
		const loom_node *n = node(p, v);
		if (n->op != LOOM_OP_CAST)
			continue;
		cr_assert(n->flags & LOOM_NODE_AMP, "cast %d is not flagged AMP", v);
		cr_assert_eq(n->nsrc, 1);
		loom_value s = n->src[0];
		cr_assert_lt(s, v, "cast %d before its source %d", v, s);
		cr_assert_neq(node(p, s)->dtype, n->dtype, "cast %d to its own dtype", v);
		int users = 0;
		for (int u = v + 1; u < p->plan.n_fwd; u++)
			for (int i = 0; i < node(p, u)->nsrc; i++)
				users += node(p, u)->src[i] == v;
		cr_assert(users > 0 || (n->flags & LOOM_NODE_OUTPUT), "cast %d has no reader", v);
		for (int w = v + 1; w < p->plan.n_fwd; w++)
			cr_assert(!(node(p, w)->op == LOOM_OP_CAST && node(p, w)->src[0] == s &&
				    node(p, w)->dtype == n->dtype),
				  "value %d cast to %s twice (%d and %d)", s, loom_dtype_name(n->dtype),
				  v, w);
	}
}

/* The compiled loss: f32, read in f32 whatever ran before it. */
static void check_loss_f32(const loom_program *p)
{
	cr_assert_eq(node(p, p->plan.loss)->dtype, LOOM_F32, "loss is %s",
		     loom_dtype_name(node(p, p->plan.loss)->dtype));
	cr_assert(node(p, p->plan.loss)->flags & LOOM_NODE_OUTPUT);
	cr_assert_eq(node(p, p->plan.loss)->shape.ndim, 0);
}

static int n_masters(const loom_program *p)
{
	int n = 0;
	for (int v = 0; v < p->plan.n_fwd; v++)
		n += node(p, v)->op == LOOM_OP_PARAM && node(p, v)->master != LOOM_NONE;
	return n;
}

static const char *const conv_params[] = { "conv1.weight", "conv1.bias", "conv2.weight",
					   "conv2.bias", "fc.weight", "fc.bias" };
static const char *const bn_params[] = { "bn1.weight", "bn1.bias", "bn2.weight", "bn2.bias" };
static const char *const bn_buffers[] = { "bn1.running_mean", "bn1.running_var",
					  "bn2.running_mean", "bn2.running_var" };
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* One training step on a fixed batch: every level must still train. */
static void one_step(loom_program *p)
{
	float x[BATCH * 28 * 28];
	int32_t y[BATCH] = { 3, 7 };
	for (int i = 0; i < BATCH * 28 * 28; i++)
		x[i] = (float)((i * 37) % 101) / 101.0f;
	cr_assert_eq(loom_set_input(p, "x", x, LOOM_F32, BATCH * 28 * 28), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "y", y, LOOM_I32, BATCH), LOOM_OK);
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	cr_assert(isfinite(loom_loss(p)) && loom_loss(p) > 0.5 && loom_loss(p) < 5, "loss %g",
		  loom_loss(p));
}

/* ------------------------------------------------------------------ O0 */

static void check_o0(loom_dtype half)
{
	loom_compile_opts o = amp_opts(LOOM_O0, half);
	loom_program *p = compile_convnet(&o);
	cr_assert_eq(count_casts(p, 1), 0, "O0 inserted casts");
	for (int v = 0; v < p->plan.g->n; v++) {
		const loom_node *n = node(p, v);
		cr_assert(!(n->flags & LOOM_NODE_AMP), "node %d flagged AMP under O0", v);
		cr_assert(n->dtype == LOOM_F32 || n->dtype == LOOM_I32, "node %d is %s under O0", v,
			  loom_dtype_name(n->dtype));
		cr_assert_eq(n->master, LOOM_NONE);
	}
	loom_program_info i;
	loom_program_info_get(p, &i);
	cr_assert_eq(i.loss_scale, 1.0);
	cr_assert_eq(i.master_bytes, 0);
	check_loss_f32(p);
	one_step(p);
	loom_program_free(p);
}

Test(amp_pass, o0_fp16_is_all_f32)
{
	check_o0(LOOM_F16);
}

Test(amp_pass, o0_bf16_is_all_f32)
{
	check_o0(LOOM_BF16);
}

/* ------------------------------------------------------------------ O1 */

static void check_o1(loom_dtype half)
{
	loom_compile_opts o = amp_opts(LOOM_O1, half);
	loom_program *p = compile_convnet(&o);
	check_casts_well_placed(p);
	cr_assert_eq(n_masters(p), 0, "O1 made master weights");
	/* Weights stay f32 and are cast per use. */
	for (int i = 0; i < COUNT(conv_params); i++) {
		loom_value w = must_find(p, LOOM_OP_PARAM, conv_params[i]);
		cr_assert_eq(node(p, w)->dtype, LOOM_F32, "%s", conv_params[i]);
		int casts = 0;
		for (int v = w + 1; v < p->plan.n_fwd; v++)
			casts += node(p, v)->op == LOOM_OP_CAST && node(p, v)->src[0] == w &&
				 node(p, v)->dtype == half;
		cr_assert_eq(casts, 1, "%s cast %d times to half", conv_params[i], casts);
	}
	/* The allow list runs in half on cast operands. */
	loom_value convs[2] = { 0 }, lin[1] = { 0 }, bns[2] = { 0 }, relus[2] = { 0 },
		   pools[2] = { 0 }, ce[1] = { 0 }, sums[4] = { 0 };
	cr_assert_eq(ops_of(p, LOOM_OP_CONV2D, convs, 2), 2);
	cr_assert_eq(ops_of(p, LOOM_OP_LINEAR, lin, 1), 1);
	for (int k = 0; k < 3; k++) {
		loom_value v = k < 2 ? convs[k] : lin[0];
		cr_assert_eq(node(p, v)->dtype, half, "%s runs in %s", node(p, v)->name,
			     loom_dtype_name(node(p, v)->dtype));
		for (int i = 0; i < node(p, v)->nsrc; i++) {
			loom_value s = through_cast(p, v, i, half);
			cr_assert_eq(node(p, s)->op, LOOM_OP_CAST, "%s source %d is not a cast",
				     node(p, v)->name, i);
			cr_assert_eq(node(p, node(p, s)->src[0])->dtype, LOOM_F32);
		}
	}
	/* Batch norm on the deny list: f32, reading the half conv through a cast. */
	cr_assert_eq(ops_of(p, LOOM_OP_BATCHNORM2D, bns, 2), 2);
	for (int k = 0; k < 2; k++) {
		cr_assert_eq(node(p, bns[k])->dtype, LOOM_F32);
		loom_value s = through_cast(p, bns[k], 0, LOOM_F32);
		cr_assert_eq(node(p, s)->op, LOOM_OP_CAST);
		cr_assert_eq(node(p, s)->src[0], convs[k]);
		for (int i = 1; i < 5; i++)
			cr_assert_eq(node(p, node(p, bns[k])->src[i])->op,
				     i < 3 ? LOOM_OP_PARAM : LOOM_OP_BUFFER);
	}
	/* relu and maxpool follow their (f32) input: no cast before them. */
	cr_assert_eq(ops_of(p, LOOM_OP_RELU, relus, 2), 2);
	cr_assert_eq(ops_of(p, LOOM_OP_MAXPOOL2D, pools, 2), 2);
	for (int k = 0; k < 2; k++) {
		cr_assert_eq(node(p, relus[k])->dtype, LOOM_F32);
		cr_assert_eq(node(p, relus[k])->src[0], bns[k]);
		cr_assert_eq(node(p, pools[k])->dtype, LOOM_F32);
		cr_assert_eq(node(p, pools[k])->src[0], relus[k]);
	}
	/* conv2 reads the f32 pool through a cast. */
	cr_assert_eq(node(p, node(p, convs[1])->src[0])->src[0], pools[0]);
	/* The loss in f32 on a cast of the half logits. */
	cr_assert_eq(ops_of(p, LOOM_OP_SOFTMAX_CE, ce, 1), 1);
	cr_assert_eq(node(p, ce[0])->dtype, LOOM_F32);
	cr_assert_eq(node(p, through_cast(p, ce[0], 0, LOOM_F32))->src[0], lin[0]);
	cr_assert_eq(ops_of(p, LOOM_OP_SUM, sums, 4), 0);
	check_loss_f32(p);
	/* Casts to half: x, conv2's and fc's inputs, 3 weights, 3 biases; to
	 * f32: both convs (for batch norm) and the logits. */
	cr_assert_eq(count_casts(p, 0), 12, "%d casts", count_casts(p, 0));

	loom_program_info i;
	loom_program_info_get(p, &i);
	cr_assert_eq(i.loss_scale, half == LOOM_F16 ? 65536.0 : 1.0);
	cr_assert_eq(i.master_bytes, 0);
	cr_assert_eq(i.param_bytes, (size_t)i.n_param_elems * 4);
	one_step(p);
	loom_program_free(p);
}

Test(amp_pass, o1_fp16_allow_and_deny_lists)
{
	check_o1(LOOM_F16);
}

Test(amp_pass, o1_bf16_allow_and_deny_lists)
{
	check_o1(LOOM_BF16);
}

/* O1 with bn_half, as torch.autocast runs batch norm: each batch norm
 * takes its half convolution as it is (no cast) and runs in half, its
 * parameters and statistics f32 leaves (no cast, no master), and the relu
 * and max pool after it follow it in half; conv2 then reads the half pool
 * uncast, and fc the flattened half pool. Casts: x, 3 weights, 3 biases
 * to half, the logits to f32: 8, against check_o1's 12. The backward nodes (autodiff, after the
 * pass) take the same dtypes: dx half, dgamma and dbeta f32. */
static void check_o1_bn_half(loom_dtype half)
{
	loom_compile_opts o = amp_opts(LOOM_O1, half);
	o.amp.bn_half = 1;
	loom_program *p = compile_convnet(&o);
	check_casts_well_placed(p);
	cr_assert_eq(n_masters(p), 0, "O1 made master weights");
	loom_value convs[2] = { 0 }, bns[2] = { 0 }, relus[2] = { 0 }, pools[2] = { 0 };
	cr_assert_eq(ops_of(p, LOOM_OP_CONV2D, convs, 2), 2);
	cr_assert_eq(ops_of(p, LOOM_OP_BATCHNORM2D, bns, 2), 2);
	cr_assert_eq(ops_of(p, LOOM_OP_RELU, relus, 2), 2);
	cr_assert_eq(ops_of(p, LOOM_OP_MAXPOOL2D, pools, 2), 2);
	for (int k = 0; k < 2; k++) {
		cr_assert_eq(node(p, bns[k])->dtype, half, "%s runs in %s", node(p, bns[k])->name,
			     loom_dtype_name(node(p, bns[k])->dtype));
		cr_assert_eq(node(p, bns[k])->src[0], convs[k], "%s reads a cast",
			     node(p, bns[k])->name);
		for (int i = 1; i < 5; i++) {
			const loom_node *s = node(p, node(p, bns[k])->src[i]);
			cr_assert_eq(s->op, i < 3 ? LOOM_OP_PARAM : LOOM_OP_BUFFER);
			cr_assert_eq(s->dtype, LOOM_F32, "%s is %s", s->name, loom_dtype_name(s->dtype));
			cr_assert_eq(s->master, LOOM_NONE);
		}
		cr_assert_eq(node(p, relus[k])->dtype, half);
		cr_assert_eq(node(p, relus[k])->src[0], bns[k]);
		cr_assert_eq(node(p, pools[k])->dtype, half);
	}
	cr_assert_eq(node(p, convs[1])->src[0], pools[0], "conv2 reads its half input through a cast");
	cr_assert_eq(count_casts(p, 0), 8, "%d casts", count_casts(p, 0));
	int dx = 0, dg = 0;
	for (int v = p->plan.n_fwd; v < p->plan.g->n; v++) {
		const loom_node *n = node(p, v);
		if (n->op == LOOM_OP_BN_BWD_DATA) {
			cr_assert_eq(n->dtype, half);
			cr_assert_eq(node(p, n->src[1])->dtype, LOOM_F32);
			dx++;
		} else if (n->op == LOOM_OP_BN_BWD_GAMMA) {
			cr_assert_eq(n->dtype, LOOM_F32);
			dg++;
		}
	}
	cr_assert_eq(dx, 2);
	cr_assert_eq(dg, 2);
	check_loss_f32(p);
	one_step(p);
	loom_program_free(p);
}

Test(amp_pass, o1_fp16_bn_half_as_autocast)
{
	check_o1_bn_half(LOOM_F16);
}

Test(amp_pass, o1_bf16_bn_half_as_autocast)
{
	check_o1_bn_half(LOOM_BF16);
}

/* Ops outside both lists follow their widest input: a relu on a half
 * linear runs in half; an add of a half and an f32 value runs in f32; a sum
 * (deny list) runs in f32. */
Test(amp_pass, o1_widest_input_and_reductions)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t xd[2] = { 4, 8 };
	loom_value x = loom_input(g, "x", LOOM_F32, 2, xd);
	loom_value h = loom_relu(g, loom_layer_linear(g, "fc", x, 8, 0));
	loom_set_name(g, h, "act");
	loom_value s = loom_add(g, h, x);
	loom_set_name(g, s, "skip");
	loom_value loss = loom_sum(g, s);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	loom_compile_opts o = amp_opts(LOOM_O1, LOOM_F16);
	loom_program *p;
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	loom_value relu = must_find(p, LOOM_OP_RELU, "act");
	loom_value add = must_find(p, LOOM_OP_ADD, "skip");
	cr_assert_eq(node(p, relu)->dtype, LOOM_F16);
	cr_assert_eq(node(p, node(p, relu)->src[0])->op, LOOM_OP_LINEAR, "a cast before the relu");
	cr_assert_eq(node(p, add)->dtype, LOOM_F32);
	loom_value a0 = node(p, add)->src[0];
	cr_assert_eq(node(p, a0)->op, LOOM_OP_CAST);
	cr_assert_eq(node(p, a0)->src[0], relu);
	cr_assert_eq(node(p, add)->src[1], 0, "the f32 input is read as it is");
	loom_value sums[1] = { 0 };
	cr_assert_eq(ops_of(p, LOOM_OP_SUM, sums, 1), 1);
	cr_assert_eq(node(p, sums[0])->dtype, LOOM_F32);
	check_casts_well_placed(p);
	check_loss_f32(p);
	loom_program_free(p);

	/* The same graph under O2: the sum stays f32, the add is half. */
	o = amp_opts(LOOM_O2, LOOM_F16);
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	cr_assert_eq(node(p, must_find(p, LOOM_OP_ADD, "skip"))->dtype, LOOM_F16);
	cr_assert_eq(ops_of(p, LOOM_OP_SUM, sums, 1), 1);
	cr_assert_eq(node(p, sums[0])->dtype, LOOM_F32);
	check_loss_f32(p);
	loom_program_free(p);
	loom_graph_free(g);
}

/* ------------------------------------------------------------------ O2 */

static void check_o2(loom_dtype half)
{
	loom_compile_opts o = amp_opts(LOOM_O2, half);
	loom_program *p = compile_convnet(&o);
	check_casts_well_placed(p);
	size_t master_bytes = 0;
	for (int i = 0; i < COUNT(conv_params); i++) {
		loom_value w = must_find(p, LOOM_OP_PARAM, conv_params[i]);
		cr_assert_eq(node(p, w)->dtype, half, "%s is %s", conv_params[i],
			     loom_dtype_name(node(p, w)->dtype));
		loom_value m = node(p, w)->master;
		cr_assert_neq(m, LOOM_NONE, "%s has no master", conv_params[i]);
		cr_assert_eq(node(p, m)->op, LOOM_OP_BUFFER);
		cr_assert_eq(node(p, m)->dtype, LOOM_F32);
		cr_assert(node(p, m)->flags & LOOM_NODE_AMP);
		cr_assert(loom_shape_eq(&node(p, m)->shape, &node(p, w)->shape));
		char want[96];
		snprintf(want, sizeof(want), "%s.master", conv_params[i]);
		cr_assert_str_eq(node(p, m)->name, want);
		cr_assert_eq(find(p, LOOM_OP_BUFFER, want), m);
		master_bytes += loom_value_bytes(p, m);
		/* The master has no reader in the graph: the optimizer owns it. */
		for (int u = 0; u < p->plan.g->n; u++)
			for (int k = 0; k < node(p, u)->nsrc; k++)
				cr_assert_neq(node(p, u)->src[k], m, "node %d reads a master", u);
		/* Its gradient is half, as the param. */
		cr_assert_eq(node(p, node(p, w)->grad)->dtype, half);
	}
	for (int i = 0; i < COUNT(bn_params); i++) {
		loom_value v = must_find(p, LOOM_OP_PARAM, bn_params[i]);
		cr_assert_eq(node(p, v)->dtype, LOOM_F32, "%s", bn_params[i]);
		cr_assert_eq(node(p, v)->master, LOOM_NONE, "%s", bn_params[i]);
	}
	for (int i = 0; i < COUNT(bn_buffers); i++)
		cr_assert_eq(node(p, must_find(p, LOOM_OP_BUFFER, bn_buffers[i]))->dtype, LOOM_F32);
	cr_assert_eq(n_masters(p), COUNT(conv_params));

	loom_value convs[2] = { 0 }, bns[2] = { 0 }, relus[2] = { 0 }, pools[2] = { 0 },
		   ce[1] = { 0 };
	cr_assert_eq(ops_of(p, LOOM_OP_CONV2D, convs, 2), 2);
	cr_assert_eq(ops_of(p, LOOM_OP_BATCHNORM2D, bns, 2), 2);
	cr_assert_eq(ops_of(p, LOOM_OP_RELU, relus, 2), 2);
	cr_assert_eq(ops_of(p, LOOM_OP_MAXPOOL2D, pools, 2), 2);
	for (int k = 0; k < 2; k++) {
		cr_assert_eq(node(p, convs[k])->dtype, half);
		/* Half weights are read as they are. */
		cr_assert_eq(node(p, node(p, convs[k])->src[1])->op, LOOM_OP_PARAM);
		/* Batch norm: half activations in and out, f32 affine and
		 * statistics read directly (cuDNN's mixed form). */
		cr_assert_eq(node(p, bns[k])->dtype, half);
		cr_assert_eq(node(p, bns[k])->src[0], convs[k]);
		for (int i = 1; i < 5; i++)
			cr_assert_eq(node(p, node(p, bns[k])->src[i])->dtype, LOOM_F32);
		cr_assert_eq(node(p, relus[k])->dtype, half);
		cr_assert_eq(node(p, pools[k])->dtype, half);
	}
	/* Casts only at the edges: the f32 input in, the logits out. */
	cr_assert_eq(count_casts(p, 0), 2, "%d casts", count_casts(p, 0));
	cr_assert_eq(node(p, node(p, convs[0])->src[0])->op, LOOM_OP_CAST);
	cr_assert_eq(ops_of(p, LOOM_OP_SOFTMAX_CE, ce, 1), 1);
	cr_assert_eq(node(p, ce[0])->dtype, LOOM_F32);
	cr_assert_eq(node(p, node(p, ce[0])->src[0])->op, LOOM_OP_CAST);
	check_loss_f32(p);

	loom_program_info info;
	loom_program_info_get(p, &info);
	cr_assert_eq(info.loss_scale, half == LOOM_F16 ? 65536.0 : 1.0);
	cr_assert_eq(info.master_bytes, master_bytes);
	cr_assert_gt(info.master_bytes, 0);
	for (int s = 0; s < p->plan.n_params; s++)
		if (is_half(node(p, p->plan.params[s].param)->dtype))
			cr_assert_eq(p->plan.params[s].master, node(p, p->plan.params[s].param)->master);
	one_step(p);
	loom_program_free(p);
}

Test(amp_pass, o2_fp16_half_model_fp32_batchnorm_and_masters)
{
	check_o2(LOOM_F16);
}

Test(amp_pass, o2_bf16_half_model_fp32_batchnorm_and_masters)
{
	check_o2(LOOM_BF16);
}

/* keep_batchnorm_fp32 = 0 under O2: batch norm goes half too, its
 * parameters with masters, its statistics half buffers. */
Test(amp_pass, o2_keep_batchnorm_fp32_off)
{
	loom_compile_opts o = amp_opts(LOOM_O2, LOOM_F16);
	o.amp.keep_batchnorm_fp32 = 0;
	loom_program *p = compile_convnet(&o);
	for (int i = 0; i < COUNT(bn_params); i++) {
		loom_value v = must_find(p, LOOM_OP_PARAM, bn_params[i]);
		cr_assert_eq(node(p, v)->dtype, LOOM_F16, "%s", bn_params[i]);
		cr_assert_neq(node(p, v)->master, LOOM_NONE, "%s", bn_params[i]);
	}
	for (int i = 0; i < COUNT(bn_buffers); i++)
		cr_assert_eq(node(p, must_find(p, LOOM_OP_BUFFER, bn_buffers[i]))->dtype, LOOM_F16);
	cr_assert_eq(n_masters(p), COUNT(conv_params) + COUNT(bn_params));
	one_step(p);
	loom_program_free(p);
}

/* ------------------------------------------------------------------ O3 */

static void check_o3(loom_dtype half, int keep_bn)
{
	loom_compile_opts o = amp_opts(LOOM_O3, half);
	o.amp.keep_batchnorm_fp32 = keep_bn;
	loom_program *p = compile_convnet(&o);
	check_casts_well_placed(p);
	cr_assert_eq(n_masters(p), 0, "O3 made master weights");
	for (int v = 0; v < p->plan.n_fwd; v++) {
		const loom_node *n = node(p, v);
		cr_assert_eq(n->master, LOOM_NONE);
		if (n->op == LOOM_OP_BUFFER)
			cr_assert_null(strstr(n->name, ".master"), "%s", n->name);
	}
	loom_dtype bn_dt = keep_bn == 1 ? LOOM_F32 : half;
	for (int i = 0; i < COUNT(conv_params); i++)
		cr_assert_eq(node(p, must_find(p, LOOM_OP_PARAM, conv_params[i]))->dtype, half);
	for (int i = 0; i < COUNT(bn_params); i++)
		cr_assert_eq(node(p, must_find(p, LOOM_OP_PARAM, bn_params[i]))->dtype, bn_dt);
	for (int i = 0; i < COUNT(bn_buffers); i++)
		cr_assert_eq(node(p, must_find(p, LOOM_OP_BUFFER, bn_buffers[i]))->dtype, bn_dt);
	/* Every op in half, the cross-entropy included; casts: the input in
	 * and the loss out. */
	for (int v = 0; v < p->plan.n_fwd; v++) {
		const loom_node *n = node(p, v);
		if (n->op == LOOM_OP_INPUT || n->op == LOOM_OP_PARAM || n->op == LOOM_OP_BUFFER ||
		    n->op == LOOM_OP_CAST)
			continue;
		cr_assert_eq(n->dtype, half, "node %d (%s) is %s under O3", v, loom_op_defs[n->op]->name,
			     loom_dtype_name(n->dtype));
	}
	cr_assert_eq(count_casts(p, 0), 2, "%d casts", count_casts(p, 0));
	check_loss_f32(p);
	cr_assert_eq(node(p, p->plan.loss)->op, LOOM_OP_CAST);
	cr_assert_eq(node(p, node(p, p->plan.loss)->src[0])->op, LOOM_OP_SOFTMAX_CE);
	loom_program_info i;
	loom_program_info_get(p, &i);
	cr_assert_eq(i.loss_scale, 1.0, "O3 scales the loss: %g", i.loss_scale);
	cr_assert_eq(i.master_bytes, 0);
	if (keep_bn != 1)
		cr_assert_eq(i.param_bytes, (size_t)i.n_param_elems * 2);
	one_step(p);
	loom_program_free(p);
}

Test(amp_pass, o3_fp16_pure_half)
{
	check_o3(LOOM_F16, -1);
}

Test(amp_pass, o3_bf16_pure_half)
{
	check_o3(LOOM_BF16, -1);
}

Test(amp_pass, o3_keep_batchnorm_fp32_on)
{
	check_o3(LOOM_F16, 1);
}

/* ------------------------------------------------------------ the ladder */

/* Masters exist only in O2; the scale is 2^16 only for fp16 O1/O2. */
Test(amp_pass, masters_and_scaling_by_level)
{
	loom_dtype halves[2] = { LOOM_F16, LOOM_BF16 };
	for (int h = 0; h < 2; h++)
		for (int l = LOOM_O0; l <= LOOM_O3; l++) {
			loom_compile_opts o = amp_opts((loom_opt_level)l, halves[h]);
			loom_program *p = compile_convnet(&o);
			loom_program_info i;
			loom_program_info_get(p, &i);
			cr_assert_eq(n_masters(p) > 0, l == LOOM_O2, "O%d %s: %d masters", l,
				     loom_dtype_name(halves[h]), n_masters(p));
			cr_assert_eq(i.master_bytes > 0, l == LOOM_O2);
			int scaled = halves[h] == LOOM_F16 && (l == LOOM_O1 || l == LOOM_O2);
			cr_assert_eq(i.loss_scale, scaled ? 65536.0 : 1.0, "O%d %s: scale %g", l,
				     loom_dtype_name(halves[h]), i.loss_scale);
			cr_assert_eq(p->plan.scaling, scaled);
			cr_assert_eq(loom_amp_uses_scaling(&o.amp), scaled);
			loom_program_free(p);
		}
}

Test(amp_pass, init_scale_and_static_scale)
{
	loom_compile_opts o = amp_opts(LOOM_O2, LOOM_F16);
	o.amp.init_scale = 1024;
	loom_program *p = compile_convnet(&o);
	loom_program_info i;
	loom_program_info_get(p, &i);
	cr_assert_eq(i.loss_scale, 1024.0);
	cr_assert(p->ts.scaler.dynamic);
	loom_program_free(p);

	o = amp_opts(LOOM_O3, LOOM_F16);
	o.amp.static_scale = 128;
	p = compile_convnet(&o);
	loom_program_info_get(p, &i);
	cr_assert_eq(i.loss_scale, 128.0);
	cr_assert(!p->ts.scaler.dynamic);
	loom_program_free(p);
}

/* ------------------------------------------------------------ refusals */

static void refused(const loom_compile_opts *o, loom_status want, const char *part,
		    const char *what)
{
	loom_value loss;
	loom_graph *g = convnet(&loss);
	loom_program *p = (loom_program *)1;
	loom_status st = loom_compile(g, loss, o, &p);
	cr_assert_eq(st, want, "%s: %s (%s)", what, loom_status_string(st), loom_last_error());
	/* The failed program comes back to explain itself (loom.h). */
	cr_assert_not_null(p, "%s: no handle", what);
	cr_assert_str_eq(loom_program_error(p), loom_last_error());
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_ERR_INVALID);
	loom_program_free(p);
	cr_assert_neq(strstr(loom_last_error(), part), NULL, "%s: message '%s' lacks '%s'", what,
		      loom_last_error(), part);
	char err[256] = "";
	if (want == LOOM_ERR_INVALID) {
		cr_assert_eq(loom_amp_check(&o->amp, err, sizeof(err)), want, "%s", what);
		cr_assert_str_eq(err, loom_last_error());
	}
	loom_graph_free(g);
}

Test(amp_pass, invalid_combinations_refused)
{
	loom_compile_opts o = amp_opts(LOOM_O1, LOOM_F16);
	o.amp.keep_batchnorm_fp32 = 1;
	refused(&o, LOOM_ERR_INVALID, "keep_batchnorm_fp32", "O1 + keep_batchnorm_fp32=1");
	o.amp.keep_batchnorm_fp32 = 0;
	refused(&o, LOOM_ERR_INVALID, "O1", "O1 + keep_batchnorm_fp32=0");

	o = amp_opts(LOOM_O0, LOOM_F16);
	o.amp.static_scale = 128;
	refused(&o, LOOM_ERR_INVALID, "O0", "O0 + static scale");
	for (int l = LOOM_O0; l <= LOOM_O3; l++) {
		if (l == LOOM_O1)
			continue;
		o = amp_opts((loom_opt_level)l, LOOM_F16);
		o.amp.bn_half = 1;
		refused(&o, LOOM_ERR_INVALID, "bn_half applies to O1 only", "bn_half off O1");
	}
	o = amp_opts(LOOM_O0, LOOM_F16);
	o.amp.keep_batchnorm_fp32 = 0;
	refused(&o, LOOM_ERR_INVALID, "O0", "O0 + keep_batchnorm_fp32=0");

	o = amp_opts(LOOM_O2, LOOM_BF16);
	o.amp.static_scale = 128;
	refused(&o, LOOM_ERR_INVALID, "bf16", "bf16 + static scale");

	o = amp_opts(LOOM_O2, LOOM_F32);
	refused(&o, LOOM_ERR_INVALID, "fp16 or bf16", "precision f32 as half");
	o = amp_opts(LOOM_O1, LOOM_F64);
	refused(&o, LOOM_ERR_INVALID, "fp16 or bf16", "precision f64 as half");

	o = amp_opts((loom_opt_level)9, LOOM_F16);
	refused(&o, LOOM_ERR_INVALID, "opt level", "level 9");

	o = amp_opts(LOOM_O2, LOOM_F16);
	o.amp.static_scale = -4;
	refused(&o, LOOM_ERR_INVALID, "positive", "negative static scale");
	o = amp_opts(LOOM_O2, LOOM_F16);
	o.amp.init_scale = 0;
	refused(&o, LOOM_ERR_INVALID, "positive", "zero dynamic scale");
}

/* Valid combinations pass loom_amp_check. */
Test(amp_pass, valid_overrides_accepted)
{
	char err[256];
	loom_compile_opts o = amp_opts(LOOM_O2, LOOM_F16);
	o.amp.keep_batchnorm_fp32 = 0;
	cr_assert_eq(loom_amp_check(&o.amp, err, sizeof(err)), LOOM_OK, "%s", err);
	o = amp_opts(LOOM_O3, LOOM_F16);
	o.amp.keep_batchnorm_fp32 = 1;
	cr_assert_eq(loom_amp_check(&o.amp, err, sizeof(err)), LOOM_OK, "%s", err);
	o = amp_opts(LOOM_O0, LOOM_BF16);
	o.amp.keep_batchnorm_fp32 = 1;
	cr_assert_eq(loom_amp_check(&o.amp, err, sizeof(err)), LOOM_OK, "%s", err);
	o = amp_opts(LOOM_O3, LOOM_F16);
	o.amp.static_scale = 8;
	cr_assert_eq(loom_amp_check(&o.amp, err, sizeof(err)), LOOM_OK, "%s", err);
	o = amp_opts(LOOM_O1, LOOM_BF16);
	o.amp.bn_half = 1;
	cr_assert_eq(loom_amp_check(&o.amp, err, sizeof(err)), LOOM_OK, "%s", err);
}

/* Mixed precision starts from an f32 model. */
Test(amp_pass, f64_model_refused)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t xd[2] = { 2, 3 };
	loom_value x = loom_input(g, "x64", LOOM_F64, 2, xd);
	loom_value loss = loom_sum(g, loom_layer_linear(g, "fc", x, 2, 1));
	loom_compile_opts o = amp_opts(LOOM_O1, LOOM_F16);
	loom_program *p;
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_ERR_DTYPE, "%s", loom_last_error());
	cr_assert_neq(strstr(loom_last_error(), "x64"), NULL, "%s", loom_last_error());
	loom_program_free(p); /* a failed compile returns its program too */
	o = amp_opts(LOOM_O0, LOOM_F16);
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	loom_program_free(p);
	loom_graph_free(g);
}

/* ------------------------------------------------------ a transformer block */

/* ids -> embedding -> layer norm -> qkv linear over [B, T, C] -> causal
 * attention -> linear -> tied output projection -> cross-entropy. */
static loom_program *compile_block_with(const loom_compile_opts *o);

static loom_program *compile_block(loom_opt_level level, loom_dtype half)
{
	loom_compile_opts o = amp_opts(level, half);
	return compile_block_with(&o);
}

static loom_program *compile_block_with(const loom_compile_opts *o)
{
	loom_graph *g;
	loom_program *p;
	int64_t bt[2] = { 2, 4 }, flat[1] = { 8 }, td[2] = { 10, 8 }, lg[2] = { 8, 10 };
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value ids = loom_input(g, "ids", LOOM_I32, 2, bt);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, flat);
	loom_value wte = loom_param(g, "wte", LOOM_F32, 2, td, LOOM_INIT_KAIMING_UNIFORM, 8);
	loom_value x = loom_layer_layernorm(g, "ln", loom_embedding(g, ids, wte));
	x = loom_causal_self_attention(g, loom_layer_linear(g, "qkv", x, 24, 1), 2);
	x = loom_layer_linear(g, "proj", x, 8, 1);
	loom_value logits = loom_reshape(g, loom_linear(g, x, wte, LOOM_NONE), 2, lg);
	loom_value loss = loom_softmax_cross_entropy(g, logits, y);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	cr_assert_eq(loom_compile(g, loss, o, &p), LOOM_OK, "%s", loom_last_error());
	loom_graph_free(g);
	int32_t idv[8] = { 1, 2, 3, 4, 5, 6, 7, 8 }, yv[8] = { 2, 3, 4, 5, 6, 7, 8, 9 };
	cr_assert_eq(loom_set_input(p, "ids", idv, LOOM_I32, 8), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "y", yv, LOOM_I32, 8), LOOM_OK);
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	cr_assert(isfinite(loom_loss(p)));
	return p;
}

static loom_dtype dtype_of_op(const loom_program *p, loom_op op)
{
	loom_value v[2];
	cr_assert_eq(ops_of(p, op, v, 2), 1, "%s nodes", loom_op_defs[op]->name);
	return node(p, v[0])->dtype;
}

/* O1: layer norm fp32 inside (apex's FP32 list; on the CPU it writes half
 * for the product that reads it, a cast folded in), the attention as
 * autocast runs it (half q, k, v, the softmax fp32 inside its kernel: no
 * cast between the qkv product and the probabilities), the products half,
 * the embedding following its fp32 table, the loss fp32. */
static void check_block_o1(loom_dtype half)
{
	loom_program *p = compile_block(LOOM_O1, half);
	loom_value ln[1] = { LOOM_NONE }, ap[1] = { LOOM_NONE };
	cr_assert_eq(ops_of(p, LOOM_OP_LAYERNORM, ln, 1), 1);
	cr_assert(node(p, ln[0])->dtype == LOOM_F32 ||
		  (node(p, ln[0])->dtype == half && (node(p, ln[0])->flags & LOOM_NODE_CAST_FOLDED)));
	cr_assert_eq(dtype_of_op(p, LOOM_OP_ATTN_PROBS), half);
	cr_assert_eq(ops_of(p, LOOM_OP_ATTN_PROBS, ap, 1), 1);
	cr_assert_eq(node(p, node(p, ap[0])->src[0])->op, LOOM_OP_LINEAR,
		     "attn_probs reads the qkv product itself, no cast");
	cr_assert_eq(dtype_of_op(p, LOOM_OP_ATTENTION), half);
	cr_assert_eq(dtype_of_op(p, LOOM_OP_EMBEDDING), LOOM_F32);
	cr_assert_eq(dtype_of_op(p, LOOM_OP_SOFTMAX_CE), LOOM_F32);
	loom_value lin[3];
	cr_assert_eq(ops_of(p, LOOM_OP_LINEAR, lin, 3), 3);
	for (int i = 0; i < 3; i++)
		cr_assert_eq(node(p, lin[i])->dtype, half);
	check_loss_f32(p);
	loom_program_free(p);
}

Test(amp_pass, o1_transformer_layernorm_fp32_attention_half)
{
	check_block_o1(LOOM_F16);
	check_block_o1(LOOM_BF16);
}

/* The block's attention through the planner (casts folded, O1's attention
 * in half with the softmax fp32 inside) against the fp32 plan on the same
 * parameters: the loss and the gradients reaching the qkv product's weight
 * within bf16's tolerance, at O1 and O2. T = 16 so that the probabilities'
 * rows are long enough to round. */
static double block_run(loom_opt_level level, double *g_qkv, size_t n_qkv)
{
	loom_graph *g;
	loom_program *p;
	int64_t bt[2] = { 2, 16 }, flat[1] = { 32 }, td[2] = { 10, 8 }, lg[2] = { 32, 10 };
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_graph_set_seed(g, 7);
	loom_value ids = loom_input(g, "ids", LOOM_I32, 2, bt);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, flat);
	loom_value wte = loom_param(g, "wte", LOOM_F32, 2, td, LOOM_INIT_KAIMING_UNIFORM, 8);
	loom_value x = loom_layer_layernorm(g, "ln", loom_embedding(g, ids, wte));
	int64_t wd[2] = { 24, 8 };
	loom_value wq = loom_param(g, "qkv.w", LOOM_F32, 2, wd, LOOM_INIT_KAIMING_UNIFORM, 8);
	x = loom_causal_self_attention(g, loom_linear(g, x, wq, LOOM_NONE), 2);
	x = loom_layer_linear(g, "proj", x, 8, 1);
	loom_value logits = loom_reshape(g, loom_linear(g, x, wte, LOOM_NONE), 2, lg);
	loom_value loss = loom_softmax_cross_entropy(g, logits, y);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	loom_compile_opts o = amp_opts(level, LOOM_BF16);
	o.no_fusion = 0;
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	int32_t idv[32], yv[32];
	for (int i = 0; i < 32; i++)
		idv[i] = (i * 7) % 10, yv[i] = (i * 3 + 1) % 10;
	cr_assert_eq(loom_set_input(p, "ids", idv, LOOM_I32, 32), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "y", yv, LOOM_I32, 32), LOOM_OK);
	cr_assert_eq(loom_run(p, LOOM_RUN_GRAD), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_read_grad_f64(p, wq, g_qkv, n_qkv), LOOM_OK, "%s", loom_program_error(p));
	double l = loom_loss(p);
	loom_program_free(p);
	loom_graph_free(g);
	return l;
}

Test(amp_pass, attention_in_bf16_matches_fp32)
{
	enum { N = 24 * 8 };
	double g0[N], gh[N];
	double l0 = block_run(LOOM_O0, g0, N);
	for (int level = LOOM_O1; level <= LOOM_O2; level++) {
		double lh = block_run((loom_opt_level)level, gh, N);
		cr_expect(fabs(lh - l0) <= 2e-3 * fabs(l0), "O%d loss %.6g, fp32 %.6g", level, lh, l0);
		double num = 0, den = 0;
		for (int i = 0; i < N; i++)
			num += (gh[i] - g0[i]) * (gh[i] - g0[i]), den += g0[i] * g0[i];
		cr_expect(den > 0 && sqrt(num / den) <= 2e-2,
			  "O%d: the qkv weight's gradient %.3g off fp32's (relative RMS)", level,
			  sqrt(num / den));
	}
}

/* O2: the half model throughout (layer norm's statistics stay fp32 inside
 * its kernels), the loss fp32, fp32 masters for the table and the norm. */
Test(amp_pass, o2_transformer_half_model)
{
	loom_program *p = compile_block(LOOM_O2, LOOM_BF16);
	cr_assert_eq(dtype_of_op(p, LOOM_OP_LAYERNORM), LOOM_BF16);
	cr_assert_eq(dtype_of_op(p, LOOM_OP_ATTN_PROBS), LOOM_BF16);
	cr_assert_eq(dtype_of_op(p, LOOM_OP_EMBEDDING), LOOM_BF16);
	cr_assert_eq(dtype_of_op(p, LOOM_OP_SOFTMAX_CE), LOOM_F32);
	cr_assert_eq(n_masters(p), 7, "%d masters", n_masters(p)); /* wte, ln, qkv, proj (+ biases) */
	loom_program_free(p);
}

/* ------------------------------------------------------------------ fp8 */

static int is_qdq(const loom_program *p, loom_value v, loom_dtype fwd, loom_dtype bwd)
{
	const loom_node *n = node(p, v);
	return n->op == LOOM_OP_FP8_QDQ && n->a.fp8.fwd == fwd && n->a.fp8.bwd == bwd &&
	       n->dtype == LOOM_BF16 && (n->flags & LOOM_NODE_AMP);
}

/* The nodes of [from, to) reading v, into out (at most max); how many. */
static int readers_in(const loom_program *p, loom_value v, int from, int to, loom_value *out,
		      int max)
{
	int k = 0;
	for (int u = from; u < to; u++)
		for (int i = 0; i < node(p, u)->nsrc; i++)
			if (node(p, u)->src[i] == v) {
				if (k < max)
					out[k] = u;
				k++;
				break;
			}
	return k;
}

static int count_qdq(const loom_program *p, int from, int to, loom_dtype fwd)
{
	int k = 0;
	for (int v = from; v < to; v++)
		k += node(p, v)->op == LOOM_OP_FP8_QDQ && node(p, v)->a.fp8.fwd == fwd;
	return k;
}

/*
 * amp.fp8 on the transformer block (qkv and proj linears, the tied
 * classifier): each linear but the classifier reads E4M3 roundings of its
 * input and weight (not of its bias) and is read only through an identity
 * whose backward rounds through E5M2; the backward's products read that
 * E5M2 gradient; the classifier keeps bf16 operands unless
 * fp8_all_products. Off, and at O3, no rounding anywhere.
 */
static void check_block_fp8(loom_opt_level level, int all)
{
	loom_compile_opts o = amp_opts(level, LOOM_BF16);
	o.amp.fp8 = 1;
	o.amp.fp8_all_products = all;
	loom_program *p = compile_block_with(&o);
	int nf = p->plan.n_fwd, n = p->plan.g->n;
	loom_value lin[3];
	cr_assert_eq(ops_of(p, LOOM_OP_LINEAR, lin, 3), 3);
	int rounded = 0;
	for (int k = 0; k < 3; k++) {
		const loom_node *l = node(p, lin[k]);
		int classifier = strcmp(l->name, "qkv") != 0 && strcmp(l->name, "proj") != 0;
		loom_value r[4];
		int nr = readers_in(p, lin[k], 0, n, r, 4);
		if (classifier && !all) {
			/* (its input is proj's output through proj's identity) */
			for (int i = 0; i < 2; i++)
				cr_assert(!is_qdq(p, l->src[i], LOOM_FP8_E4M3, LOOM_F32),
					  "the classifier's source %d is rounded", i);
			for (int i = 0; i < nr && i < 4; i++)
				cr_assert_neq(node(p, r[i])->op, LOOM_OP_FP8_QDQ);
			continue;
		}
		rounded++;
		cr_assert_eq(l->dtype, LOOM_BF16);
		for (int i = 0; i < 2; i++)
			cr_assert(is_qdq(p, l->src[i], LOOM_FP8_E4M3, LOOM_F32),
				  "linear '%s' source %d is %s, not its E4M3 rounding", l->name, i,
				  loom_op_defs[node(p, l->src[i])->op]->name);
		if (l->nsrc > 2)
			cr_assert_neq(node(p, l->src[2])->op, LOOM_OP_FP8_QDQ, "a bias rounded");
		cr_assert_eq(nr, 1, "linear '%s' has %d readers", l->name, nr);
		cr_assert(is_qdq(p, r[0], LOOM_F32, LOOM_FP8_E5M2),
			  "linear '%s' is read by %s, not the E5M2 gradient rounding", l->name,
			  loom_op_defs[node(p, r[0])->op]->name);
	}
	cr_assert_eq(rounded, all ? 3 : 2);
	/* the forward: two E4M3 roundings and one identity per rounded product */
	cr_assert_eq(count_qdq(p, 0, nf, LOOM_FP8_E4M3), 2 * rounded);
	cr_assert_eq(count_qdq(p, 0, nf, LOOM_F32), rounded);
	/* the backward: one E5M2 rounding per rounded product, read by its two
	 * backward products (dx and dw) */
	cr_assert_eq(count_qdq(p, nf, n, LOOM_FP8_E5M2), rounded);
	cr_assert_eq(count_qdq(p, nf, n, LOOM_FP8_E4M3), 0);
	for (int v = nf; v < n; v++) {
		if (node(p, v)->op != LOOM_OP_FP8_QDQ)
			continue;
		cr_assert(node(p, v)->flags & LOOM_NODE_BACKWARD);
		loom_value r[4], rr[4];
		int nr = readers_in(p, v, nf, n, r, 4), mm = 0;
		for (int i = 0; i < nr && i < 4; i++) {
			mm += node(p, r[i])->op == LOOM_OP_MATMUL;
			if (loom_op_is_view(node(p, r[i])->op)) /* [B, T, C] seen as rows */
				for (int j = 0, m = readers_in(p, r[i], nf, n, rr, 4); j < m && j < 4; j++)
					mm += node(p, rr[j])->op == LOOM_OP_MATMUL;
		}
		cr_assert_geq(mm, 2, "E5M2 gradient #%d read by %d products", v, mm);
	}
	check_loss_f32(p);
	loom_program_free(p);
}

Test(amp_pass, fp8_rounds_products_but_the_classifier)
{
	check_block_fp8(LOOM_O1, 0);
	check_block_fp8(LOOM_O2, 0);
}

Test(amp_pass, fp8_all_products_rounds_the_classifier_too)
{
	check_block_fp8(LOOM_O1, 1);
}

Test(amp_pass, fp8_off_or_at_o3_rounds_nothing)
{
	loom_compile_opts o = amp_opts(LOOM_O1, LOOM_BF16);
	loom_program *p = compile_block_with(&o);
	cr_assert_eq(count_qdq(p, 0, p->plan.g->n, LOOM_FP8_E4M3) +
			     count_qdq(p, 0, p->plan.g->n, LOOM_FP8_E5M2) +
			     count_qdq(p, 0, p->plan.g->n, LOOM_F32), 0);
	loom_program_free(p);
	o = amp_opts(LOOM_O3, LOOM_BF16);
	o.amp.fp8 = 1;
	p = compile_block_with(&o);
	cr_assert_eq(count_qdq(p, 0, p->plan.g->n, LOOM_FP8_E4M3) +
			     count_qdq(p, 0, p->plan.g->n, LOOM_F32), 0);
	loom_program_free(p);
}

Test(amp_pass, fp8_refusals)
{
	loom_compile_opts o = amp_opts(LOOM_O1, LOOM_F16);
	o.amp.fp8 = 1;
	refused(&o, LOOM_ERR_INVALID, "half must be bf16", "fp8 with fp16");
	o = amp_opts(LOOM_O1, LOOM_BF16);
	o.amp.fp8_all_products = 1;
	refused(&o, LOOM_ERR_INVALID, "fp8_all_products without fp8", "all products alone");
}

/* The ConvNet: conv1 reads the image (the first product) and fc is the
 * classifier, both bf16; conv2 reads E4M3 roundings of its input and
 * weight (not its bias), 4-D, and the backward's data and filter
 * gradients read its E5M2 dy. */
Test(amp_pass, fp8_rounds_the_middle_conv)
{
	loom_compile_opts o = amp_opts(LOOM_O1, LOOM_BF16);
	o.amp.fp8 = 1;
	loom_program *p = compile_convnet(&o);
	const loom_node *c1 = node(p, must_find(p, LOOM_OP_CONV2D, "conv1"));
	const loom_node *c2 = node(p, must_find(p, LOOM_OP_CONV2D, "conv2"));
	const loom_node *fc = node(p, must_find(p, LOOM_OP_LINEAR, "fc"));
	for (int i = 0; i < 2; i++) {
		cr_assert(!is_qdq(p, c1->src[i], LOOM_FP8_E4M3, LOOM_F32), "conv1 source %d", i);
		cr_assert(is_qdq(p, c2->src[i], LOOM_FP8_E4M3, LOOM_F32), "conv2 source %d", i);
		cr_assert(!is_qdq(p, fc->src[i], LOOM_FP8_E4M3, LOOM_F32), "fc source %d", i);
	}
	cr_assert_neq(node(p, c2->src[2])->op, LOOM_OP_FP8_QDQ, "conv2's bias rounded");
	cr_assert_eq(node(p, c2->src[0])->shape.ndim, 4);
	int nf = p->plan.n_fwd, n = p->plan.g->n;
	cr_assert_eq(count_qdq(p, 0, nf, LOOM_FP8_E4M3), 2);
	cr_assert_eq(count_qdq(p, 0, nf, LOOM_F32), 1);
	cr_assert_eq(count_qdq(p, nf, n, LOOM_FP8_E5M2), 1);
	int bwd = 0;
	for (int v = nf; v < n; v++)
		if ((node(p, v)->op == LOOM_OP_CONV2D_BWD_DATA ||
		     node(p, v)->op == LOOM_OP_CONV2D_BWD_FILTER) &&
		    (node(p, v)->src[1] == c2->src[0] || node(p, v)->src[1] == c2->src[1]) && ++bwd)
			cr_assert(node(p, node(p, v)->src[0])->op == LOOM_OP_FP8_QDQ &&
					  node(p, node(p, v)->src[0])->a.fp8.fwd == LOOM_FP8_E5M2,
				  "%s #%d reads dy #%d, not its E5M2 rounding",
				  loom_op_defs[node(p, v)->op]->name, v, node(p, v)->src[0]);
	cr_assert_eq(bwd, 2, "conv2's data and filter gradients");
	one_step(p);
	loom_program_free(p);
}

/* An MLP (x -> fc1 -> relu -> fc2 -> relu -> fc3 -> cross-entropy): its
 * first product reads the model's input and stays bf16 as the classifier
 * does; fc2 alone is rounded; with fp8_all_products all three. */
static void check_mlp_fp8(int all)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t xd[2] = { 4, 12 }, yd[1] = { 4 };
	loom_value x = loom_input(g, "x", LOOM_F32, 2, xd);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	loom_value h = loom_relu(g, loom_layer_linear(g, "fc1", x, 16, 1));
	h = loom_relu(g, loom_layer_linear(g, "fc2", h, 16, 1));
	loom_value loss = loom_softmax_cross_entropy(g, loom_layer_linear(g, "fc3", h, 5, 1), y);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	loom_compile_opts o = amp_opts(LOOM_O1, LOOM_BF16);
	o.amp.fp8 = 1;
	o.amp.fp8_all_products = all;
	loom_program *p;
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	const char *names[3] = { "fc1", "fc2", "fc3" };
	for (int k = 0; k < 3; k++) {
		const loom_node *l = node(p, must_find(p, LOOM_OP_LINEAR, names[k]));
		int want = all || k == 1;
		for (int i = 0; i < 2; i++)
			cr_assert_eq(is_qdq(p, l->src[i], LOOM_FP8_E4M3, LOOM_F32), want,
				     "%s source %d: rounded %d, want %d", names[k], i, !want, want);
	}
	cr_assert_eq(count_qdq(p, 0, p->plan.n_fwd, LOOM_F32), all ? 3 : 1);
	loom_program_free(p);
	loom_graph_free(g);
}

Test(amp_pass, fp8_keeps_the_first_and_last_products)
{
	check_mlp_fp8(0);
	check_mlp_fp8(1);
}
