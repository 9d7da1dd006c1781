/*
 * tests/ddp/worker_util.c — the helpers the data-parallel test workers
 * share (worker_util.h): one copy, so that the sample stream and the
 * comparisons the scripts rely on are the same in every worker.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/models.h"
#include "tests/ddp/worker_util.h"

static int worker_rank = -1; /* for worker_fail's line */

int worker_init(loom_pg **pg, int *rank, int *world)
{
	*pg = NULL;
	if (loom_pg_init(NULL, pg) != LOOM_OK) {
		printf("rank ?: ERROR group: %s\n", loom_pg_error(*pg));
		return 1;
	}
	*rank = worker_rank = loom_pg_get_info(*pg)->rank;
	*world = loom_pg_get_info(*pg)->world;
	return 0;
}

int worker_fail(const char *what, loom_status st, const char *msg)
{
	printf("rank %d: ERROR %s: %s: %s\n", worker_rank, what, loom_status_string(st), msg);
	fflush(stdout);
	return 1;
}

void worker_begin(worker_model *m, int batch, int width, uint64_t seed)
{
	memset(m, 0, sizeof(*m));
	m->batch = batch;
	m->width = width;
	loom_graph_new(&m->g);
	loom_graph_set_seed(m->g, seed);
}

int worker_free(int rc, worker_model *a, worker_model *b)
{
	worker_model *m[2] = { a, b };
	for (int i = 0; i < 2; i++) {
		if (!m[i])
			continue;
		loom_program_free(m[i]->p);
		loom_graph_free(m[i]->g);
		m[i]->p = NULL;
		m[i]->g = NULL;
	}
	return rc;
}

loom_value worker_param(worker_model *m, const char *name, int ndim, const int64_t *dims,
			loom_init init, int64_t fan_in)
{
	loom_value v = loom_param(m->g, name, LOOM_F32, ndim, dims, init, fan_in);
	int64_t n = 1;
	for (int i = 0; i < ndim; i++)
		n *= dims[i];
	m->numel[m->np] = n;
	m->params[m->np++] = v;
	return v;
}

void worker_mlp(worker_model *m, int batch, uint64_t seed)
{
	worker_begin(m, batch, WORKER_IN, seed);
	loom_graph *g = m->g;
	int64_t xd[2] = { batch, WORKER_IN }, yd[1] = { batch }, w1[2] = { WORKER_HID, WORKER_IN },
		b1[1] = { WORKER_HID }, w2[2] = { WORKER_CLASSES, WORKER_HID },
		b2[1] = { WORKER_CLASSES };
	loom_value x = loom_input(g, "x", LOOM_F32, 2, xd);
	loom_value a = worker_param(m, "l1.weight", 2, w1, LOOM_INIT_KAIMING_UNIFORM, WORKER_IN);
	loom_value b = worker_param(m, "l1.bias", 1, b1, LOOM_INIT_UNIFORM_FAN_IN, WORKER_IN);
	loom_value h = loom_relu(g, loom_linear(g, x, a, b));
	a = worker_param(m, "l2.weight", 2, w2, LOOM_INIT_KAIMING_UNIFORM, WORKER_HID);
	b = worker_param(m, "l2.bias", 1, b2, LOOM_INIT_UNIFORM_FAN_IN, WORKER_HID);
	h = loom_linear(g, h, a, b);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	m->loss = loom_softmax_cross_entropy(g, h, y);
}

loom_status worker_convnet(worker_model *m, int batch, uint64_t seed, const loom_compile_opts *o,
			   loom_value *logits)
{
	worker_begin(m, batch, 784, seed);
	m->loss = loom_model_convnet(m->g, batch, logits);
	return loom_compile(m->g, m->loss, o, &m->p);
}

void worker_opts(loom_compile_opts *o, loom_pg *pg, loom_opt_level level, double lr,
		 double momentum)
{
	const char *dev = getenv("LOOM_WORKER_DEVICE");
	loom_compile_opts_default(o);
	/* LOOM_WORKER_DEVICE=cuda: the GPU suite runs the same scenarios on the
	 * CUDA backend (tests/engine/cuda/gpu_suite.sh); the CPU otherwise. */
	o->device = dev && strcmp(dev, "cuda") == 0 ? LOOM_DEVICE_CUDA : LOOM_DEVICE_CPU;
	o->optim.lr = lr;
	o->optim.momentum = momentum;
	o->amp.level = level;
	o->pg = pg;
}

loom_status worker_feed(worker_model *m, long first, double poison)
{
	int b = m->batch, n = m->width;
	float *x = malloc(sizeof(float) * (size_t)b * n);
	int32_t *y = malloc(sizeof(int32_t) * (size_t)b);
	for (int i = 0; i < b; i++) {
		long idx = first + i;
		for (int j = 0; j < n; j++)
			x[i * n + j] = (float)sin(0.37 * idx + 1.3 * j) + (float)(idx % 3) * 0.1f;
		y[i] = (int32_t)(idx % WORKER_CLASSES);
	}
	if (poison != 0)
		x[0] = (float)poison;
	loom_status st = loom_set_input(m->p, "x", x, LOOM_F32, (size_t)b * n);
	if (st == LOOM_OK)
		st = loom_set_input(m->p, "y", y, LOOM_I32, (size_t)b);
	free(x);
	free(y);
	return st;
}

uint64_t worker_param_hash(worker_model *m)
{
	uint64_t h = 0;
	for (int i = 0; i < m->np; i++) {
		double *d = malloc(sizeof(double) * m->numel[i]);
		loom_read_f64(m->p, m->params[i], d, m->numel[i]);
		h = loom_comm_hash(d, sizeof(double) * m->numel[i], h);
		free(d);
	}
	return h;
}

int worker_same_everywhere(loom_pg *pg, uint64_t h)
{
	uint64_t all[64];
	int world = pg ? loom_pg_get_info(pg)->world : 1;
	if (world == 1)
		return 1;
	if (loom_comm_allgather(loom_pg_comm(pg, LOOM_COMM_HOST), &h, sizeof(h), all) != LOOM_OK)
		return -1;
	for (int r = 1; r < world; r++)
		if (all[r] != all[0])
			return 0;
	return 1;
}

double worker_rel_diff(const double *x, const double *y, int64_t n)
{
	double diff = 0, mag = 0;
	for (int64_t k = 0; k < n; k++) {
		diff = fmax(diff, fabs(x[k] - y[k]));
		mag = fmax(mag, fabs(y[k]));
	}
	return mag > 0 ? diff / mag : diff;
}

double worker_param_rel_diff(worker_model *a, worker_model *b)
{
	double worst = 0;
	for (int i = 0; i < a->np; i++) {
		double *x = malloc(sizeof(double) * a->numel[i]), *y = malloc(sizeof(double) * a->numel[i]);
		loom_read_f64(a->p, a->params[i], x, a->numel[i]);
		loom_read_f64(b->p, b->params[i], y, a->numel[i]);
		worst = fmax(worst, worker_rel_diff(x, y, a->numel[i]));
		free(x);
		free(y);
	}
	return worst;
}
