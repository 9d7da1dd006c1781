/*
 * tests/graph/test_autodiff.c — the structure autodiff leaves in a compiled
 * program: one gradient per parameter in the parameter's shape and dtype,
 * zero gradients for parameters the loss never reaches, no backward work for
 * inputs, accumulation where a value has several consumers, and the loss kept
 * readable. Numbers are checked in test_gradcheck.c; this looks at p->plan.g.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "engine/program_internal.h"
#include "graph/graph_internal.h"
#include "graph/ops/ops.h"
#include "loom.h"
#include "tests/graph/nets.h"

static loom_program *compile(loom_graph *g, loom_value loss, loom_optim_kind kind,
			     loom_opt_level level)
{
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "build: %s", loom_graph_error(g));
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim.kind = kind;
	o.amp.level = level;
	o.no_fusion = 1; /* autodiff's own graph, before the planner fuses relu into pools */
	loom_program *p = NULL;
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "compile: %s", loom_last_error());
	return p;
}

static int count_op(const loom_program *p, loom_op op)
{
	int n = 0;
	for (int v = 0; v < p->plan.g->n; v++)
		n += p->plan.g->nodes[v].op == op;
	return n;
}

/* Every parameter of the forward graph has a gradient node of its own shape
 * and dtype, flagged as a gradient, readable after a step. */
static void check_every_param_has_grad(loom_program *p, int expect_params)
{
	int nparams = 0;
	char b1[96], b2[96];
	for (int v = 0; v < p->plan.n_fwd; v++) {
		const loom_node *n = &p->plan.g->nodes[v];
		if (n->op != LOOM_OP_PARAM)
			continue;
		/* O2 masters are parameters too, but the optimizer owns them. */
		int is_master = 0;
		for (int u = 0; u < p->plan.n_fwd; u++)
			if (p->plan.g->nodes[u].op == LOOM_OP_PARAM && p->plan.g->nodes[u].master == v)
				is_master = 1;
		if (is_master)
			continue;
		nparams++;
		cr_assert_neq(n->grad, LOOM_NONE, "param '%s' has no gradient", n->name);
		cr_assert_geq(n->grad, p->plan.n_fwd, "param '%s': its gradient %d is a forward node",
			      n->name, (int)n->grad);
		const loom_node *gn = &p->plan.g->nodes[n->grad];
		cr_assert(loom_shape_eq(&gn->shape, &n->shape), "param '%s' %s has a gradient %s",
			  n->name, loom_shape_str(&n->shape, b1, sizeof(b1)),
			  loom_shape_str(&gn->shape, b2, sizeof(b2)));
		cr_assert_eq(gn->dtype, n->dtype, "param '%s' is %s, its gradient %s", n->name,
			     loom_dtype_name(n->dtype), loom_dtype_name(gn->dtype));
		cr_assert(gn->flags & LOOM_NODE_GRAD, "param '%s': gradient not flagged", n->name);
		cr_assert(gn->flags & LOOM_NODE_BACKWARD);
		cr_assert_eq(p->plan.mp.region[n->grad], LOOM_REGION_PERSIST,
			     "param '%s': its gradient is not kept", n->name);
	}
	cr_assert_eq(nparams, expect_params);
	loom_program_info info;
	loom_program_info_get(p, &info);
	cr_assert_eq(info.n_params, expect_params);
}

static void convnet_structure(loom_dtype dt, loom_opt_level level)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_test_convnet m = loom_test_convnet_build(g, dt, 4, 8, 3, 4, 5);
	loom_program *p = compile(g, m.loss, LOOM_OPTIM_SGD, level);
	check_every_param_has_grad(p, 10);

	/* The gradients are readable with the parameter's element count. */
	loom_value ps[10] = { m.conv1_w, m.conv1_b, m.bn1_g, m.bn1_b, m.conv2_w,
			      m.conv2_b, m.bn2_g, m.bn2_b, m.fc_w, m.fc_b };
	float img[4 * 64];
	int32_t lab[4] = { 0, 1, 4, 2 };
	for (int i = 0; i < 4 * 64; i++)
		img[i] = (float)((i * 37) % 17) / 17.0f - 0.5f;
	double dimg[4 * 64];
	for (int i = 0; i < 4 * 64; i++)
		dimg[i] = img[i];
	if (dt == LOOM_F64)
		cr_assert_eq(loom_set_input(p, "image", dimg, dt, 4 * 64), LOOM_OK);
	else
		cr_assert_eq(loom_set_input(p, "image", img, dt, 4 * 64), LOOM_OK,
			     "%s", loom_program_error(p));
	cr_assert_eq(loom_set_input(p, "labels", lab, LOOM_I32, 4), LOOM_OK);
	/* Zero weights would make every gradient below the fc layer vanish;
	 * give conv and fc weights something. */
	double buf[512];
	for (int i = 0; i < 512; i++)
		buf[i] = sin(0.7 * i);
	cr_assert_eq(loom_write_f64(p, m.conv1_w, buf, 27), LOOM_OK);
	cr_assert_eq(loom_write_f64(p, m.conv2_w, buf, 108), LOOM_OK);
	cr_assert_eq(loom_write_f64(p, m.fc_w, buf, 5 * 16), LOOM_OK);
	cr_assert_eq(loom_run(p, LOOM_RUN_GRAD), LOOM_OK, "%s", loom_program_error(p));
	for (int i = 0; i < 10; i++) {
		loom_shape s = loom_value_shape(g, ps[i]);
		size_t n = (size_t)loom_shape_numel(&s);
		cr_assert_eq(loom_read_grad_f64(p, ps[i], buf, n), LOOM_OK, "%s",
			     loom_program_error(p));
		for (size_t k = 0; k < n; k++)
			cr_assert(isfinite(buf[k]));
		cr_assert_neq(loom_read_grad_f64(p, ps[i], buf, n + 1), LOOM_OK);
	}
	loom_program_free(p);
	loom_graph_free(g);
}

Test(autodiff, every_param_gets_its_own_gradient_f32)
{
	convnet_structure(LOOM_F32, LOOM_O0);
}

Test(autodiff, every_param_gets_its_own_gradient_f64)
{
	convnet_structure(LOOM_F64, LOOM_O0);
}

Test(autodiff, every_param_gets_its_own_gradient_amp_o1)
{
	convnet_structure(LOOM_F32, LOOM_O1);
}

Test(autodiff, every_param_gets_its_own_gradient_amp_o2)
{
	convnet_structure(LOOM_F32, LOOM_O2);
}

/* --------------------------------------------------------- unused params */

Test(autodiff, unused_param_gets_zero_gradient)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t xd[2] = { 2, 3 }, wd[2] = { 4, 3 }, yd[1] = { 2 }, ud[2] = { 3, 5 };
	loom_value x = loom_input(g, "x", LOOM_F64, 2, xd);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	loom_value w = loom_param(g, "w", LOOM_F64, 2, wd, LOOM_INIT_ZEROS, 0);
	loom_value unused = loom_param(g, "unused", LOOM_F64, 2, ud, LOOM_INIT_ONES, 0);
	/* A parameter on a dead branch: it feeds nodes, but not the loss. */
	loom_value dead = loom_param(g, "dead", LOOM_F64, 2, ud, LOOM_INIT_ONES, 0);
	loom_value side = loom_sum(g, loom_relu(g, dead));
	loom_value loss = loom_softmax_cross_entropy(g, loom_linear(g, x, w, LOOM_NONE), y);
	cr_assert_neq(side, LOOM_NONE);
	loom_program *p = compile(g, loss, LOOM_OPTIM_NONE, LOOM_O0);
	check_every_param_has_grad(p, 3);
	/* Nothing is differentiated through the dead branch. */
	cr_assert_eq(count_op(p, LOOM_OP_RELU_BWD), 0);

	double xs[6] = { 1, -2, 3, 0.5, 0.25, -1 }, ones[15];
	int32_t ys[2] = { 1, 3 };
	for (int i = 0; i < 15; i++)
		ones[i] = 3.0 + i;
	cr_assert_eq(loom_set_input(p, "x", xs, LOOM_F64, 6), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "y", ys, LOOM_I32, 2), LOOM_OK);
	cr_assert_eq(loom_write_f64(p, unused, ones, 15), LOOM_OK);
	cr_assert_eq(loom_write_f64(p, dead, ones, 15), LOOM_OK);
	cr_assert_eq(loom_run(p, LOOM_RUN_GRAD), LOOM_OK, "%s", loom_program_error(p));
	double gu[15], gd[15], gw[12];
	cr_assert_eq(loom_read_grad_f64(p, unused, gu, 15), LOOM_OK);
	cr_assert_eq(loom_read_grad_f64(p, dead, gd, 15), LOOM_OK);
	for (int i = 0; i < 15; i++) {
		cr_assert_eq(gu[i], 0.0, "unused grad[%d] = %g", i, gu[i]);
		cr_assert_eq(gd[i], 0.0, "dead grad[%d] = %g", i, gd[i]);
	}
	/* The used parameter, in contrast, has a real gradient. */
	cr_assert_eq(loom_read_grad_f64(p, w, gw, 12), LOOM_OK);
	double mx = 0;
	for (int i = 0; i < 12; i++)
		mx = fmax(mx, fabs(gw[i]));
	cr_assert_gt(mx, 1e-3);
	loom_program_free(p);
	loom_graph_free(g);
}

/* ---------------------------------------------------- inputs, no gradient */

Test(autodiff, inputs_get_no_gradient_nodes)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_test_convnet m = loom_test_convnet_build(g, LOOM_F32, 2, 8, 3, 4, 5);
	loom_program *p = compile(g, m.loss, LOOM_OPTIM_SGD, LOOM_O0);
	const loom_graph *pg = p->plan.g;

	cr_assert_eq(pg->nodes[m.image].grad, LOOM_NONE);
	cr_assert_eq(pg->nodes[m.labels].grad, LOOM_NONE);
	/* conv2's input depends on parameters (bn1, conv1): one data gradient.
	 * conv1's input is the image: none. */
	cr_assert_eq(count_op(p, LOOM_OP_CONV2D_BWD_DATA), 1);
	cr_assert_eq(count_op(p, LOOM_OP_CONV2D_BWD_FILTER), 2);
	for (int v = p->plan.n_fwd; v < pg->n; v++) {
		const loom_node *n = &pg->nodes[v];
		if (n->op == LOOM_OP_CONV2D_BWD_DATA) {
			cr_assert_neq(n->src[1], m.conv1_w, "conv1 got a data gradient");
			cr_assert_eq(n->src[1], m.conv2_w);
			loom_shape s = loom_value_shape(g, m.pool1);
			cr_assert(loom_shape_eq(&n->shape, &s));
		}
		/* No backward node is shaped like the image batch. */
		loom_shape is = loom_value_shape(g, m.image);
		cr_assert(!loom_shape_eq(&n->shape, &is), "backward node %d is image-shaped (%s)", v,
			  loom_op_defs[n->op]->name);
	}
	/* One backward op per differentiable forward op on the parameter path. */
	cr_assert_eq(count_op(p, LOOM_OP_SOFTMAX_CE_BWD), 1);
	cr_assert_eq(count_op(p, LOOM_OP_BN_BWD_DATA), 2);
	cr_assert_eq(count_op(p, LOOM_OP_BN_BWD_GAMMA), 2);
	cr_assert_eq(count_op(p, LOOM_OP_RELU_BWD), 2);
	cr_assert_eq(count_op(p, LOOM_OP_MAXPOOL2D_BWD), 2);
	cr_assert_eq(count_op(p, LOOM_OP_GRAD_SEED), 1);
	/* Biases: conv1, conv2, bn1, bn2, fc. */
	cr_assert_eq(count_op(p, LOOM_OP_CHANNEL_SUM), 5);
	loom_program_free(p);
	loom_graph_free(g);
}

/* An input-only side branch adds nothing to the backward graph. */
Test(autodiff, input_only_branch_has_no_backward)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t xd[2] = { 2, 3 }, wd[2] = { 3, 3 };
	loom_value x = loom_input(g, "x", LOOM_F32, 2, xd);
	loom_value w = loom_param(g, "w", LOOM_F32, 2, wd, LOOM_INIT_ONES, 0);
	loom_value a = loom_sum(g, loom_relu(g, x));
	loom_value b = loom_sum(g, loom_linear(g, x, w, LOOM_NONE));
	loom_value loss = loom_add(g, a, b);
	loom_program *p = compile(g, loss, LOOM_OPTIM_NONE, LOOM_O0);
	cr_assert_eq(count_op(p, LOOM_OP_RELU_BWD), 0);
	/* linear: only dw (a transposed matmul), no dx. */
	cr_assert_eq(count_op(p, LOOM_OP_MATMUL), 1);
	for (int v = p->plan.n_fwd; v < p->plan.g->n; v++)
		if (p->plan.g->nodes[v].op == LOOM_OP_MATMUL)
			cr_assert_eq(p->plan.g->nodes[v].a.mm.ta, 1, "the matmul is dw = dy^T x");
	loom_program_free(p);
	loom_graph_free(g);
}

/* ------------------------------------------------ the loss stays readable */

Test(autodiff, loss_is_kept_readable)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t xd[2] = { 2, 2 }, wd[2] = { 3, 2 }, yd[1] = { 2 };
	loom_value x = loom_input(g, "x", LOOM_F64, 2, xd);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	loom_value w = loom_param(g, "w", LOOM_F64, 2, wd, LOOM_INIT_ZEROS, 0);
	loom_value logits = loom_linear(g, x, w, LOOM_NONE);
	cr_assert_eq(loom_mark_output(g, logits), LOOM_OK);
	loom_value loss = loom_softmax_cross_entropy(g, logits, y);
	loom_program *p = compile(g, loss, LOOM_OPTIM_NONE, LOOM_O0);
	cr_assert(p->plan.g->nodes[p->plan.loss].flags & LOOM_NODE_OUTPUT);
	cr_assert_eq(p->plan.mp.region[p->plan.loss], LOOM_REGION_PERSIST);

	double xs[4] = { 1, 2, -1, 0.5 }, ws[6] = { 0.1, 0.2, -0.3, 0.4, 0.5, -0.6 };
	int32_t ys[2] = { 2, 0 };
	loom_set_input(p, "x", xs, LOOM_F64, 4);
	loom_set_input(p, "y", ys, LOOM_I32, 2);
	loom_write_f64(p, w, ws, 6);
	for (int mode = LOOM_RUN_GRAD; mode <= LOOM_RUN_EVAL; mode++) {
		cr_assert_eq(loom_run(p, (loom_run_mode)mode), LOOM_OK);
		double l, z[6], want = 0;
		/* After a whole GRAD run (backward reuses activation memory) the
		 * loss and the marked output still hold their forward values. */
		cr_assert_eq(loom_read_f64(p, loss, &l, 1), LOOM_OK, "%s", loom_program_error(p));
		cr_assert_eq(loom_read_f64(p, logits, z, 6), LOOM_OK, "%s", loom_program_error(p));
		for (int i = 0; i < 2; i++) {
			double m = -1e300, s = 0;
			for (int c = 0; c < 3; c++) {
				double e = xs[2 * i] * ws[2 * c] + xs[2 * i + 1] * ws[2 * c + 1];
				cr_assert_float_eq(z[3 * i + c], e, 1e-14);
				m = fmax(m, e);
			}
			for (int c = 0; c < 3; c++)
				s += exp(z[3 * i + c] - m);
			want += (m + log(s) - z[3 * i + ys[i]]) / 2;
		}
		cr_assert_float_eq(l, want, 1e-14);
		cr_assert_float_eq(loom_loss(p), want, 1e-14);
	}
	loom_program_free(p);
	loom_graph_free(g);
}

/* ----------------------------------------------------- graph invariants */

Test(autodiff, backward_nodes_follow_forward_in_topological_order)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_test_convnet m = loom_test_convnet_build(g, LOOM_F32, 2, 8, 3, 4, 5);
	loom_program *p = compile(g, m.loss, LOOM_OPTIM_SGD, LOOM_O0);
	cr_assert_gt(p->plan.g->n, p->plan.n_fwd);
	for (int v = 0; v < p->plan.g->n; v++) {
		const loom_node *n = &p->plan.g->nodes[v];
		if (v < p->plan.n_fwd)
			cr_assert(!(n->flags & LOOM_NODE_BACKWARD), "forward node %d flagged", v);
		else
			cr_assert(n->flags & LOOM_NODE_BACKWARD, "backward node %d (%s) not flagged",
				  v, loom_op_defs[n->op]->name);
		for (int i = 0; i < n->nsrc; i++)
			cr_assert(n->src[i] >= 0 && n->src[i] < v, "node %d reads %d", v,
				  (int)n->src[i]);
	}
	loom_program_free(p);
	loom_graph_free(g);
}

Test(autodiff, compile_leaves_the_user_graph_alone)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_test_convnet m = loom_test_convnet_build(g, LOOM_F32, 2, 8, 3, 4, 5);
	int n = g->n;
	uint64_t fp = loom_graph_fingerprint(g);
	loom_program *p1 = compile(g, m.loss, LOOM_OPTIM_SGD, LOOM_O0);
	loom_program *p2 = compile(g, m.loss, LOOM_OPTIM_SGD, LOOM_O0);
	cr_assert_eq(g->n, n);
	cr_assert_eq(loom_graph_fingerprint(g), fp);
	for (int v = 0; v < n; v++)
		cr_assert_eq(g->nodes[v].grad, LOOM_NONE);
	/* Compiling twice gives the same plan. */
	cr_assert_eq(p1->plan.g->n, p2->plan.g->n);
	for (int v = 0; v < p1->plan.g->n; v++) {
		cr_assert_eq(p1->plan.g->nodes[v].op, p2->plan.g->nodes[v].op);
		cr_assert_eq(p1->plan.mp.offset[v], p2->plan.mp.offset[v]);
	}
	loom_program_free(p1);
	loom_program_free(p2);
	loom_graph_free(g);
}

/* A parameter used by two layers: its gradient is the sum of both uses,
 * through an accumulation node. d sum(x w^T) / dw[o][i] = sum_n x[n][i]. */
Test(autodiff, shared_param_gradients_accumulate)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t xd[2] = { 2, 3 }, wd[2] = { 4, 3 };
	loom_value x1 = loom_input(g, "x1", LOOM_F64, 2, xd);
	loom_value x2 = loom_input(g, "x2", LOOM_F64, 2, xd);
	loom_value w = loom_param(g, "w", LOOM_F64, 2, wd, LOOM_INIT_ZEROS, 0);
	loom_value a = loom_sum(g, loom_linear(g, x1, w, LOOM_NONE));
	loom_value b = loom_sum(g, loom_linear(g, x2, w, LOOM_NONE));
	loom_program *p = compile(g, loom_add(g, a, b), LOOM_OPTIM_NONE, LOOM_O0);
	loom_value gw = p->plan.g->nodes[w].grad;
	cr_assert_eq(p->plan.g->nodes[gw].op, LOOM_OP_ADD, "the gradient of a shared param is a sum");
	double v1[6] = { 1, 2, 3, 4, 5, 6 }, v2[6] = { -1, 0.5, 2, 0, 1, -3 }, d[12];
	loom_set_input(p, "x1", v1, LOOM_F64, 6);
	loom_set_input(p, "x2", v2, LOOM_F64, 6);
	cr_assert_eq(loom_run(p, LOOM_RUN_GRAD), LOOM_OK);
	cr_assert_eq(loom_read_grad_f64(p, w, d, 12), LOOM_OK);
	for (int o = 0; o < 4; o++)
		for (int i = 0; i < 3; i++)
			cr_assert_float_eq(d[3 * o + i], v1[i] + v1[3 + i] + v2[i] + v2[3 + i], 1e-14,
					   "dw[%d][%d]", o, i);
	loom_program_free(p);
	loom_graph_free(g);
}

/* Two parameters whose gradient is the same value (a + b): each is flagged,
 * readable, and both read the same numbers. */
Test(autodiff, params_sharing_one_gradient_value)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t d[1] = { 5 };
	loom_value a = loom_param(g, "a", LOOM_F64, 1, d, LOOM_INIT_ONES, 0);
	loom_value b = loom_param(g, "b", LOOM_F64, 1, d, LOOM_INIT_ONES, 0);
	loom_program *p = compile(g, loom_mean(g, loom_add(g, a, b)), LOOM_OPTIM_SGD, LOOM_O0);
	check_every_param_has_grad(p, 2);
	cr_assert_eq(loom_run(p, LOOM_RUN_GRAD), LOOM_OK);
	cr_assert_float_eq(loom_loss(p), 2.0, 1e-15);
	double ga[5], gb[5];
	cr_assert_eq(loom_read_grad_f64(p, a, ga, 5), LOOM_OK);
	cr_assert_eq(loom_read_grad_f64(p, b, gb, 5), LOOM_OK);
	for (int i = 0; i < 5; i++) {
		cr_assert_float_eq(ga[i], 0.2, 1e-15);
		cr_assert_float_eq(gb[i], 0.2, 1e-15);
	}
	/* A training step moves both by lr * 0.2. */
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK);
	cr_assert_eq(loom_read_f64(p, a, ga, 5), LOOM_OK);
	cr_assert_eq(loom_read_f64(p, b, gb, 5), LOOM_OK);
	for (int i = 0; i < 5; i++) {
		cr_assert_float_eq(ga[i], 1 - 0.01 * 0.2, 1e-15);
		cr_assert_float_eq(gb[i], 1 - 0.01 * 0.2, 1e-15);
	}
	loom_program_free(p);
	loom_graph_free(g);
}

/* The loss itself a function of one scalar parameter: the gradient is the
 * seed (d loss / d loss = 1). */
Test(autodiff, loss_of_a_scalar_param)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t d[1] = { 1 };
	loom_value a = loom_param(g, "a", LOOM_F64, 1, d, LOOM_INIT_ONES, 0);
	loom_program *p = compile(g, loom_sum(g, a), LOOM_OPTIM_NONE, LOOM_O0);
	cr_assert_eq(loom_run(p, LOOM_RUN_GRAD), LOOM_OK);
	double ga;
	cr_assert_eq(loom_read_grad_f64(p, a, &ga, 1), LOOM_OK);
	cr_assert_float_eq(ga, 1.0, 0);
	loom_program_free(p);
	loom_graph_free(g);
}

/* Under O1/O2 the AMP pass inserts casts and masters, shifting node indices
 * of the compiled graph: the user's handles must still reach the user's
 * values, and an O2 write must reach the fp32 master that the optimizer
 * copies back over the half parameter. */
static void amp_handles(loom_opt_level level)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_test_convnet m = loom_test_convnet_build(g, LOOM_F32, 2, 8, 3, 4, 5);
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim.lr = 0; /* a TRAIN step must then leave every weight as written */
	o.amp.level = level;
	o.amp.static_scale = 1;
	loom_program *p = NULL;
	cr_assert_eq(loom_compile(g, m.loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	cr_assert_gt(p->plan.n_fwd, g->n, "the pass inserted nothing: this test tests nothing");
	loom_value ps[4] = { m.conv1_w, m.bn2_g, m.fc_w, m.fc_b };
	double w[128], r[128];
	for (int i = 0; i < 128; i++)
		w[i] = 0.25 * (i % 7) - 0.5; /* exact in f16 */
	float img[2 * 64] = { 0 };
	int32_t lab[2] = { 1, 3 };
	cr_assert_eq(loom_set_input(p, "image", img, LOOM_F32, 2 * 64), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "labels", lab, LOOM_I32, 2), LOOM_OK);
	for (int k = 0; k < 4; k++) {
		loom_shape s = loom_value_shape(g, ps[k]);
		size_t n = (size_t)loom_shape_numel(&s);
		cr_assert_eq(loom_write_f64(p, ps[k], w, n), LOOM_OK, "param %d: %s", k,
			     loom_program_error(p));
	}
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	for (int k = 0; k < 4; k++) {
		loom_shape s = loom_value_shape(g, ps[k]);
		size_t n = (size_t)loom_shape_numel(&s);
		cr_assert_eq(loom_read_f64(p, ps[k], r, n), LOOM_OK, "%s", loom_program_error(p));
		for (size_t i = 0; i < n; i++)
			cr_assert_eq(r[i], w[i], "param %d [%zu]: wrote %g, read %g", k, i, w[i], r[i]);
		cr_assert_eq(loom_read_grad_f64(p, ps[k], r, n), LOOM_OK, "%s",
			     loom_program_error(p));
	}
	double l;
	cr_assert_eq(loom_read_f64(p, m.loss, &l, 1), LOOM_OK, "%s", loom_program_error(p));
	cr_assert(isfinite(l));
	loom_program_free(p);
	loom_graph_free(g);
}

Test(autodiff, amp_o1_handles_reach_the_users_values)
{
	amp_handles(LOOM_O1);
}

Test(autodiff, amp_o2_handles_reach_the_users_values)
{
	amp_handles(LOOM_O2);
}

/*
 * Gradient rules append nodes while they read their node's shape and sources;
 * an append may move the node array (loom_node_add grows it with realloc).
 * Deep chains of relus and convs put every kind of append (conv, batch norm,
 * accumulation) on a growth boundary somewhere in the sweep: under the asan
 * configuration a read of the old array fails here, and in any build every
 * gradient must have its parameter's shape.
 */
Test(autodiff, appends_that_move_the_node_array)
{
	for (int depth = 1; depth <= 40; depth++) {
		loom_graph *g = NULL;
		cr_assert_eq(loom_graph_new(&g), LOOM_OK);
		int64_t xd[4] = { 2, 3, 6, 6 }, ld[1] = { 2 };
		loom_value x = loom_input(g, "x", LOOM_F32, 4, xd);
		loom_value y = loom_input(g, "y", LOOM_I32, 1, ld);
		char name[32];
		for (int i = 0; i < depth; i++) {
			snprintf(name, sizeof(name), "c%d", i);
			x = loom_layer_conv2d(g, name, x, 3, 3, 1, 1, 1);
			snprintf(name, sizeof(name), "bn%d", i);
			x = loom_relu(g, loom_layer_batchnorm2d(g, name, x));
			x = loom_add(g, x, x); /* two consumers: accumulation */
		}
		loom_value logits = loom_layer_linear(g, "fc", loom_flatten(g, x), 4, 1);
		loom_value loss = loom_softmax_cross_entropy(g, logits, y);
		loom_program *p = compile(g, loss, LOOM_OPTIM_SGD, LOOM_O1);
		check_every_param_has_grad(p, 4 * depth + 2);
		loom_program_free(p);
		loom_graph_free(g);
	}
}
