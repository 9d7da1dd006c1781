/*
 * engine/cpu/pool_dnnl.c — max pooling on nChw8c as oneDNN's pooling
 * primitives (pool_dnnl.h): one pair (forward training, backward) per slice
 * of the batch, each made for one thread and run as one job of loom's team,
 * as conv_dnnl.c runs its convolutions.
 */
#include <stdatomic.h>
#include <stdlib.h>

#include <oneapi/dnnl/dnnl.h>

#include "engine/cpu/cpu_internal.h"
#include "engine/cpu/dnnl_engine.h"
#include "engine/cpu/pool_dnnl.h"

static size_t align64(size_t x)
{
	return (x + 63) & ~(size_t)63;
}

/* One slice of the batch: its primitives and memory objects (handles set
 * at each run), and where its workspace and scratchpad lie in the side
 * buffer. */
typedef struct pool_one {
	dnnl_stream_t stream;
	dnnl_primitive_desc_t fpd, bpd;
	dnnl_primitive_t fwd, bwd;
	dnnl_memory_t x, y, dy, dx, ws, scratch;
	size_t ws_off, scratch_off;
	int n0, n; /* images [n0, n0 + n) */
} pool_one;

struct loom_cpu_dnnl_pool {
	loom_pool_shape s;
	int nslice;
	size_t side;
	pool_one one[LOOM_CPU_MAX_SLOTS];
};

static void one_free(pool_one *o)
{
	dnnl_memory_t m[] = { o->x, o->y, o->dy, o->dx, o->ws, o->scratch };
	loom_cpu_dnnl_release(o->stream, (int)(sizeof(m) / sizeof(m[0])), m, 2,
			      (dnnl_primitive_t[]){ o->fwd, o->bwd }, 2,
			      (dnnl_primitive_desc_t[]){ o->fpd, o->bpd });
}

void loom_cpu_dnnl_pool_free(loom_cpu_dnnl_pool *p)
{
	if (!p)
		return;
	for (int i = 0; i < p->nslice; i++)
		one_free(&p->one[i]);
	free(p);
}

static int mem(dnnl_memory_t *m, const dnnl_memory_desc_t *md)
{
	return dnnl_memory_create(m, md, loom_cpu_dnnl_engine(), DNNL_MEMORY_NONE) == dnnl_success
		       ? 0
		       : -1;
}

/* Slice o's primitives; *side grows by its workspace and scratchpad. */
static int one_make(const loom_pool_shape *s, pool_one *o, size_t *side)
{
	const dnnl_dims_t xd = { o->n, s->c, s->h_in, s->w_in };
	const dnnl_dims_t yd = { o->n, s->c, s->h_out, s->w_out };
	const dnnl_dims_t st = { s->stride, s->stride }, ker = { s->k, s->k }, dil = { 0, 0 };
	const dnnl_dims_t pl = { s->pad, s->pad };
	/* The right padding that gives loom's (floor) output size exactly. */
	const dnnl_dims_t pr = { (s->h_out - 1) * s->stride + s->k - s->h_in - s->pad,
				 (s->w_out - 1) * s->stride + s->k - s->w_in - s->pad };
	dnnl_memory_desc_t xmd, ymd;
	dnnl_pooling_v2_desc_t fd, bd;
	dnnl_primitive_attr_t attr = NULL;
	int rc = -1;
	if (pr[0] < 0 || pr[1] < 0 ||
	    dnnl_memory_desc_init_by_tag(&xmd, 4, xd, dnnl_f32, dnnl_nChw8c) != dnnl_success ||
	    dnnl_memory_desc_init_by_tag(&ymd, 4, yd, dnnl_f32, dnnl_nChw8c) != dnnl_success ||
	    dnnl_stream_create(&o->stream, loom_cpu_dnnl_engine(), dnnl_stream_default_flags) !=
		    dnnl_success ||
	    dnnl_primitive_attr_create(&attr) != dnnl_success ||
	    dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) !=
		    dnnl_success)
		goto out;
	if (s->relu) {
		dnnl_post_ops_t po;
		if (dnnl_post_ops_create(&po) != dnnl_success)
			goto out;
		dnnl_status_t a = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0, 0);
		dnnl_status_t b = dnnl_primitive_attr_set_post_ops(attr, po);
		dnnl_post_ops_destroy(po);
		if (a != dnnl_success || b != dnnl_success)
			goto out;
	}
	if (dnnl_pooling_v2_forward_desc_init(&fd, dnnl_forward_training, dnnl_pooling_max, &xmd,
					      &ymd, st, ker, dil, pl, pr) != dnnl_success ||
	    dnnl_primitive_desc_create(&o->fpd, &fd, attr, loom_cpu_dnnl_engine(), NULL) !=
		    dnnl_success ||
	    dnnl_pooling_v2_backward_desc_init(&bd, dnnl_pooling_max, &xmd, &ymd, st, ker, dil, pl,
					       pr) != dnnl_success)
		goto out;
	/* The backward's own attributes: the scratchpad in loom's memory, no
	 * post-op (the relu's mask is applied after it). */
	dnnl_primitive_attr_destroy(attr);
	attr = NULL;
	if (dnnl_primitive_attr_create(&attr) != dnnl_success ||
	    dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) !=
		    dnnl_success ||
	    dnnl_primitive_desc_create(&o->bpd, &bd, attr, loom_cpu_dnnl_engine(), o->fpd) !=
		    dnnl_success ||
	    dnnl_primitive_create(&o->fwd, o->fpd) != dnnl_success ||
	    dnnl_primitive_create(&o->bwd, o->bpd) != dnnl_success)
		goto out;
	const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(o->fpd, dnnl_query_workspace_md, 0);
	if (!wmd || dnnl_memory_desc_get_size(wmd) == 0)
		goto out; /* max pooling in training always has one */
	const dnnl_memory_desc_t *sf = dnnl_primitive_desc_query_md(o->fpd, dnnl_query_scratchpad_md, 0);
	const dnnl_memory_desc_t *sb = dnnl_primitive_desc_query_md(o->bpd, dnnl_query_scratchpad_md, 0);
	size_t sfb = sf ? dnnl_memory_desc_get_size(sf) : 0, sbb = sb ? dnnl_memory_desc_get_size(sb) : 0;
	if (mem(&o->x, &xmd) || mem(&o->y, &ymd) || mem(&o->dy, &ymd) || mem(&o->dx, &xmd) ||
	    mem(&o->ws, wmd))
		goto out;
	o->ws_off = *side;
	*side += align64(dnnl_memory_desc_get_size(wmd));
	if (sfb || sbb) {
		if (mem(&o->scratch, sfb >= sbb ? sf : sb))
			goto out;
		o->scratch_off = *side;
		*side += align64(sfb >= sbb ? sfb : sbb);
	}
	rc = 0;
out:
	if (attr)
		dnnl_primitive_attr_destroy(attr);
	return rc;
}

loom_cpu_dnnl_pool *loom_cpu_dnnl_pool_new(const loom_pool_shape *s)
{
	if (s->c % 8 || s->n < 1)
		return NULL;
	loom_cpu_dnnl_pool *p = loom_cpu_dnnl_calloc(sizeof(*p));
	if (!p)
		return NULL;
	p->s = *s;
	int nt = loom_cpu_slot_threads(s->n), per = (s->n + nt - 1) / nt;
	/* Made for one thread each: the slices run at once, one per thread. */
	int prev = omp_get_max_threads();
	omp_set_num_threads(1);
	for (int n0 = 0; n0 < s->n; n0 += per) {
		pool_one *o = &p->one[p->nslice++];
		o->n0 = n0;
		o->n = n0 + per <= s->n ? per : s->n - n0;
		if (one_make(s, o, &p->side)) {
			omp_set_num_threads(prev);
			loom_cpu_dnnl_pool_free(p);
			return NULL;
		}
	}
	omp_set_num_threads(prev);
	return p;
}

size_t loom_cpu_dnnl_pool_side(const loom_cpu_dnnl_pool *p)
{
	return p->side;
}

const char *loom_cpu_dnnl_pool_impl(const loom_cpu_dnnl_pool *p)
{
	const char *s = NULL;
	if (dnnl_primitive_desc_query(p->one[0].fpd, dnnl_query_impl_info_str, 0, &s) !=
	    dnnl_success)
		return "?";
	return s;
}

typedef struct pool_job {
	loom_cpu_dnnl_pool *p;
	const float *x, *dy;
	float *out;
	char *side;
	int bwd;
	_Atomic int fail;
} pool_job;

static int set(dnnl_memory_t m, const void *ptr)
{
	return dnnl_memory_set_data_handle(m, (void *)ptr) == dnnl_success ? 0 : -1;
}

static int one_run(const pool_job *j, pool_one *o)
{
	const loom_pool_shape *s = &j->p->s;
	const size_t x_img = (size_t)s->c * s->h_in * s->w_in;
	const size_t y_img = (size_t)s->c * s->h_out * s->w_out;
	const float *x = j->x + (size_t)o->n0 * x_img;
	dnnl_exec_arg_t a[4];
	int na = 0;
	if (set(o->ws, j->side + o->ws_off) ||
	    (o->scratch && set(o->scratch, j->side + o->scratch_off)))
		return -1;
	if (o->scratch)
		a[na++] = (dnnl_exec_arg_t){ DNNL_ARG_SCRATCHPAD, o->scratch };
	a[na++] = (dnnl_exec_arg_t){ DNNL_ARG_WORKSPACE, o->ws };
	if (!j->bwd) {
		if (set(o->x, x) || set(o->y, j->out + (size_t)o->n0 * y_img))
			return -1;
		a[na++] = (dnnl_exec_arg_t){ DNNL_ARG_SRC, o->x };
		a[na++] = (dnnl_exec_arg_t){ DNNL_ARG_DST, o->y };
		if (dnnl_primitive_execute(o->fwd, o->stream, na, a) != dnnl_success)
			return -1;
		return dnnl_stream_wait(o->stream) == dnnl_success ? 0 : -1;
	}
	float *dx = j->out + (size_t)o->n0 * x_img;
	if (set(o->dy, j->dy + (size_t)o->n0 * y_img) || set(o->dx, dx))
		return -1;
	a[na++] = (dnnl_exec_arg_t){ DNNL_ARG_DIFF_DST, o->dy };
	a[na++] = (dnnl_exec_arg_t){ DNNL_ARG_DIFF_SRC, o->dx };
	if (dnnl_primitive_execute(o->bwd, o->stream, na, a) != dnnl_success ||
	    dnnl_stream_wait(o->stream) != dnnl_success)
		return -1;
	if (s->relu) /* the fused relu's backward: x > 0 at each argmax */
		for (size_t i = 0; i < (size_t)o->n * x_img; i++)
			dx[i] = x[i] > 0 ? dx[i] : 0;
	return 0;
}

static void pool_job_slices(void *arg, int t, int nt)
{
	pool_job *j = arg;
	for (int i = t; i < j->p->nslice; i += nt)
		if (one_run(j, &j->p->one[i]))
			atomic_store(&j->fail, 1);
}

static int run(pool_job *j)
{
	loom_cpu_team_run(j->p->nslice, pool_job_slices, j);
	return atomic_load(&j->fail) ? -1 : 0;
}

int loom_cpu_dnnl_pool_fwd(loom_cpu_dnnl_pool *p, const float *x, float *y, void *side)
{
	pool_job j = { .p = p, .x = x, .out = y, .side = side };
	return run(&j);
}

int loom_cpu_dnnl_pool_bwd(loom_cpu_dnnl_pool *p, const float *x, const float *dy, float *dx,
			   void *side)
{
	pool_job j = { .p = p, .x = x, .dy = dy, .out = dx, .side = side, .bwd = 1 };
	return run(&j);
}
