/*
 * test_syncbn_one_rank.c — engine/ddp.c's world-1 test hook for sync_bn (the
 * one test_cuda_ops uses to check the CUDA split kernels against the CPU's):
 * it marks every batch norm, the CPU then runs its split path with no
 * all-reduce, and that path equals the unsplit one to rounding. Without the
 * hook sync_bn at world 1 still marks nothing. No MPI, no GPU.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/parallel.h"
#include "engine/program_internal.h"
#include "loom.h"

typedef struct net {
	loom_graph *g;
	loom_value y, loss, param[4], buf[2];
} net;

/* loss = sum(batchnorm(x) . r) over x [4, 6, 5, 5], r random: dy random. */
static void build(net *m)
{
	int64_t xd[4] = { 4, 6, 5, 5 }, c = 6, rd[2] = { 600, 1 }, row[2] = { 1, 600 };
	cr_assert_eq(loom_graph_new(&m->g), LOOM_OK);
	loom_graph *g = m->g;
	m->param[0] = loom_param(g, "x", LOOM_F32, 4, xd, LOOM_INIT_ZEROS, 1);
	m->param[1] = loom_param(g, "gamma", LOOM_F32, 1, &c, LOOM_INIT_ZEROS, 1);
	m->param[2] = loom_param(g, "beta", LOOM_F32, 1, &c, LOOM_INIT_ZEROS, 1);
	m->param[3] = loom_param(g, "r", LOOM_F32, 2, rd, LOOM_INIT_ZEROS, 1);
	m->buf[0] = loom_buffer(g, "rm", LOOM_F32, 1, &c, LOOM_INIT_ZEROS);
	m->buf[1] = loom_buffer(g, "rv", LOOM_F32, 1, &c, LOOM_INIT_ONES);
	m->y = loom_batchnorm2d(g, m->param[0], m->param[1], m->param[2], m->buf[0], m->buf[1],
				0.1, 1e-5);
	m->loss = loom_sum(g, loom_matmul(g, loom_reshape(g, m->y, 2, row), m->param[3]));
	loom_mark_output(g, m->y);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
}

static loom_program *compile(net *m, int sync_bn, int hook)
{
	loom_compile_opts o;
	loom_program *p = NULL;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim.kind = LOOM_OPTIM_NONE;
	o.sync_bn = sync_bn;
	loom_ddp_test_sync_one_rank = hook;
	loom_status st = loom_compile(m->g, m->loss, &o, &p);
	loom_ddp_test_sync_one_rank = 0;
	cr_assert_eq(st, LOOM_OK, "%s", loom_last_error());
	return p;
}

/* Batch-norm nodes (forward and both backward) and how many are marked. */
static int marked(const loom_program *p, int *bns)
{
	int k = 0;
	*bns = 0;
	for (int v = 0; v < p->plan.g->n; v++) {
		const loom_node *n = &p->plan.g->nodes[v];
		if (n->op == LOOM_OP_BATCHNORM2D || n->op == LOOM_OP_BN_BWD_DATA ||
		    n->op == LOOM_OP_BN_BWD_GAMMA) {
			(*bns)++;
			k += n->a.bn.sync != 0;
		}
	}
	return k;
}

static void fill(loom_program *p, const net *m)
{
	uint64_t s = 0x9e3779b97f4a7c15ull;
	for (int i = 0; i < 4; i++) {
		loom_shape sh = loom_value_shape(m->g, m->param[i]);
		size_t n = (size_t)loom_shape_numel(&sh);
		double *v = malloc(n * sizeof(double));
		cr_assert(v);
		for (size_t k = 0; k < n; k++) {
			s ^= s << 13, s ^= s >> 7, s ^= s << 17;
			/* x off centre (mean 3): the centred sums matter */
			v[k] = (double)(s >> 11) / (double)(1ull << 53) * 2 - 1 + (i == 0 ? 3 : 0);
		}
		cr_assert_eq(loom_write_f64(p, m->param[i], v, n), LOOM_OK, "%s",
			     loom_program_error(p));
		free(v);
	}
}

/* max |a - b| / (max |b| + 1e-30) of value v (grad: its gradient). */
static double rel_diff(loom_program *a, loom_program *b, const net *m, loom_value v, int grad)
{
	loom_shape sh = loom_value_shape(m->g, v);
	size_t n = (size_t)loom_shape_numel(&sh);
	double *x = malloc(n * sizeof(double)), *y = malloc(n * sizeof(double));
	cr_assert(x && y);
	cr_assert_eq(grad ? loom_read_grad_f64(a, v, x, n) : loom_read_f64(a, v, x, n), LOOM_OK);
	cr_assert_eq(grad ? loom_read_grad_f64(b, v, y, n) : loom_read_f64(b, v, y, n), LOOM_OK);
	double d = 0, ref = 0;
	for (size_t k = 0; k < n; k++) {
		d = fmax(d, fabs(x[k] - y[k]));
		ref = fmax(ref, fabs(y[k]));
	}
	free(x);
	free(y);
	return d / (ref + 1e-30);
}

Test(syncbn_one_rank, without_the_hook_world_1_marks_nothing)
{
	net m;
	int bns;
	build(&m);
	loom_program *p = compile(&m, 1, 0);
	cr_expect_eq(marked(p, &bns), 0);
	cr_expect_eq(bns, 3, "batch-norm nodes: %d", bns);
	loom_program_free(p);
	loom_graph_free(m.g);
}

Test(syncbn_one_rank, the_hook_marks_and_the_split_path_equals_the_plain_one)
{
	net m;
	int bns;
	build(&m);
	loom_program *plain = compile(&m, 0, 1); /* the hook alone: sync_bn off, nothing */
	loom_program *sync = compile(&m, 1, 1);
	cr_expect_eq(marked(plain, &bns), 0);
	cr_expect_eq(marked(sync, &bns), 3, "marked %d of %d", marked(sync, &bns), bns);
	fill(plain, &m);
	fill(sync, &m);
	for (int step = 0; step < 2; step++) {
		cr_assert_eq(loom_run(plain, LOOM_RUN_GRAD), LOOM_OK, "%s", loom_program_error(plain));
		cr_assert_eq(loom_run(sync, LOOM_RUN_GRAD), LOOM_OK, "%s", loom_program_error(sync));
	}
	cr_expect(rel_diff(sync, plain, &m, m.y, 0) < 1e-5, "output %g",
		  rel_diff(sync, plain, &m, m.y, 0));
	for (int i = 0; i < 3; i++)
		cr_expect(rel_diff(sync, plain, &m, m.param[i], 1) < 1e-4, "gradient %d: %g", i,
			  rel_diff(sync, plain, &m, m.param[i], 1));
	for (int i = 0; i < 2; i++)
		cr_expect(rel_diff(sync, plain, &m, m.buf[i], 0) < 1e-5, "buffer %d: %g", i,
			  rel_diff(sync, plain, &m, m.buf[i], 0));
	cr_expect(fabs(loom_loss(sync) - loom_loss(plain)) <= 1e-4 * (fabs(loom_loss(plain)) + 1),
		  "loss %g vs %g", loom_loss(sync), loom_loss(plain));
	loom_program_free(sync);
	loom_program_free(plain);
	loom_graph_free(m.g);
}
