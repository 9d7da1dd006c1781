/*
 * engine/cpu/conv_dnnl.c — convolution nodes as oneDNN convolution
 * primitives (forward, backward data, backward weights; f32, or bf16
 * sources with f32 results), created once per node and run on NCHW buffers.
 * oneDNN JIT-compiles them for the instruction set it finds (cpu_path.c caps
 * it), so the choice follows cpuid, never the CPU model.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#include "engine/cpu/conv_dnnl.h"
#include "engine/cpu/cpu_internal.h"
#include "engine/cpu/cpu_path.h"
#include "engine/cpu/dnnl_engine.h"
#include "engine/cpu/team.h"

enum { ARG_A, ARG_B, ARG_BIAS, ARG_OUT, NARGS };

/* One argument: loom's NCHW buffer, and where the primitive wants its own
 * layout (blocked), the primitive's copy and the reorder between them. */
typedef struct conv_arg {
	int used, dnnl_arg;
	dnnl_memory_t user;   /* NCHW, handle set at each run */
	dnnl_memory_t inner;  /* the primitive's layout; NULL when it is NCHW */
	size_t inner_off;     /* where in the workspace inner lives */
	dnnl_primitive_t reorder;
} conv_arg;

/* One slice's primitive. Its part of the workspace (the backend's, shared
 * by all nodes, since one node runs at a time): each blocked copy, then
 * oneDNN's scratchpad. */
typedef struct conv_one {
	dnnl_stream_t stream; /* its own: slices run concurrently */
	dnnl_primitive_t prim;
	dnnl_primitive_desc_t pd;
	conv_arg arg[NARGS];
	dnnl_memory_t scratch;
	size_t scratch_off, ws_bytes;
	dnnl_exec_arg_t exec[NARGS + 1];
	int nexec;
} conv_one;

static size_t align64(size_t x)
{
	return (x + 63) & ~(size_t)63;
}

static int md_init(dnnl_memory_desc_t *md, int ndims, const dnnl_dims_t dims,
		   dnnl_data_type_t dt, dnnl_format_tag_t tag)
{
	return dnnl_memory_desc_init_by_tag(md, ndims, dims, dt, tag) == dnnl_success ? 0 : -1;
}

/* The argument's NCHW memory and, if the primitive chose another layout,
 * its own buffer and the reorder (to it for sources, from it for the
 * result). */
static int arg_make(conv_one *c, conv_arg *a, int dnnl_arg,
		    const dnnl_memory_desc_t *user_md, const dnnl_memory_desc_t *prim_md,
		    int is_out)
{
	a->used = 1;
	a->dnnl_arg = dnnl_arg;
	if (dnnl_memory_create(&a->user, user_md, loom_cpu_dnnl_engine(), DNNL_MEMORY_NONE) !=
	    dnnl_success)
		return -1;
	if (dnnl_memory_desc_equal(user_md, prim_md))
		return 0;
	if (dnnl_memory_create(&a->inner, prim_md, loom_cpu_dnnl_engine(), DNNL_MEMORY_NONE) !=
	    dnnl_success)
		return -1;
	a->inner_off = c->ws_bytes;
	c->ws_bytes += align64(dnnl_memory_desc_get_size(prim_md));
	dnnl_primitive_desc_t rpd;
	const dnnl_memory_desc_t *from = is_out ? prim_md : user_md, *to = is_out ? user_md : prim_md;
	if (dnnl_reorder_primitive_desc_create(&rpd, from, loom_cpu_dnnl_engine(), to,
					       loom_cpu_dnnl_engine(), NULL) != dnnl_success)
		return -1;
	dnnl_status_t st = dnnl_primitive_create(&a->reorder, rpd);
	dnnl_primitive_desc_destroy(rpd);
	return st == dnnl_success ? 0 : -1;
}

static void one_free(conv_one *c)
{
	if (!c)
		return;
	for (int i = 0; i < NARGS; i++)
		loom_cpu_dnnl_release(NULL, 2, (dnnl_memory_t[]){ c->arg[i].inner, c->arg[i].user }, 1,
				      &c->arg[i].reorder, 0, NULL);
	loom_cpu_dnnl_release(c->stream, 1, &c->scratch, 1, &c->prim, 1, &c->pd);
	free(c);
}

/* One slice's memory descriptors and geometry: the primitive's (x, w, y, b;
 * `any` layout when blocked, so oneDNN picks) and loom's buffers' (xu, wu,
 * yu), each in its role's data type. */
typedef struct conv_descs {
	dnnl_memory_desc_t x, w, y, b, xu, wu, yu;
	dnnl_dims_t strides, pad, pad_r;
	dnnl_data_type_t in_t; /* the sources' type of a forward in this precision */
} conv_descs;

static int descs_init(conv_descs *d, loom_cpu_conv_kind kind, const loom_conv_shape *s, int bf16,
		      int blocked, unsigned fmt)
{
	const dnnl_dims_t xd = { s->n, s->c_in, s->h_in, s->w_in };
	const dnnl_dims_t wd = { s->c_out, s->c_in, s->kh, s->kw };
	const dnnl_dims_t yd = { s->n, s->c_out, s->h_out, s->w_out };
	const dnnl_dims_t bd = { s->c_out };
	const dnnl_data_type_t in_t = bf16 ? dnnl_bf16 : dnnl_f32;
	const dnnl_format_tag_t act = blocked ? dnnl_format_tag_any : dnnl_nchw;
	const dnnl_format_tag_t wgt = blocked ? dnnl_format_tag_any : dnnl_oihw;

	/* Data types by role: sources in in_t, the result in f32. */
	dnnl_data_type_t xt = kind == LOOM_CPU_CONV_BWD_DATA ? dnnl_f32 : in_t;
	dnnl_data_type_t wt = kind == LOOM_CPU_CONV_BWD_FILTER ? dnnl_f32 : in_t;
	dnnl_data_type_t yt = kind == LOOM_CPU_CONV_FWD ? dnnl_f32 : in_t;

	memset(d, 0, sizeof(*d));
	d->in_t = in_t;
	d->strides[0] = d->strides[1] = s->stride;
	d->pad[0] = d->pad[1] = s->pad;
	/* The right padding that gives loom's (floor) output size exactly. */
	d->pad_r[0] = (s->h_out - 1) * s->stride + s->kh - s->h_in - s->pad;
	d->pad_r[1] = (s->w_out - 1) * s->stride + s->kw - s->w_in - s->pad;
	if (md_init(&d->x, 4, xd, xt, act) || md_init(&d->w, 4, wd, wt, wgt) ||
	    md_init(&d->y, 4, yd, yt, act) || md_init(&d->b, 1, bd, dnnl_f32, dnnl_x) ||
	    md_init(&d->xu, 4, xd, xt, fmt & LOOM_CPU_CONV_X_BLOCKED ? dnnl_nChw8c : dnnl_nchw) ||
	    md_init(&d->wu, 4, wd, wt, dnnl_oihw) ||
	    md_init(&d->yu, 4, yd, yt, fmt & LOOM_CPU_CONV_Y_BLOCKED ? dnnl_nChw8c : dnnl_nchw))
		return -1;
	return 0;
}

/* The primitive descriptor of kind: the forward one first (also the hint
 * the backward ones need), with the data types of a forward in this
 * precision. */
static int pd_make(conv_one *c, loom_cpu_conv_kind kind, const conv_descs *d, int use_bias,
		   dnnl_primitive_attr_t attr)
{
	dnnl_convolution_desc_t fd, bdesc;
	dnnl_primitive_desc_t hint = NULL;
	dnnl_memory_desc_t fx = d->x, fw = d->w, fy = d->y;
	dnnl_status_t st;
	int rc;

	fx.data_type = d->in_t;
	fw.data_type = d->in_t;
	fy.data_type = dnnl_f32;
	if (dnnl_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct,
					       &fx, &fw, use_bias ? &d->b : NULL, &fy, d->strides,
					       d->pad, d->pad_r) != dnnl_success ||
	    dnnl_primitive_desc_create(&hint, &fd, attr, loom_cpu_dnnl_engine(), NULL) !=
		    dnnl_success) {
		if (hint)
			dnnl_primitive_desc_destroy(hint);
		return -1;
	}
	if (kind == LOOM_CPU_CONV_FWD) {
		c->pd = hint;
		return 0;
	}
	st = kind == LOOM_CPU_CONV_BWD_DATA ?
		     dnnl_convolution_backward_data_desc_init(&bdesc, dnnl_convolution_direct,
							      &d->x, &d->w, &d->y, d->strides,
							      d->pad, d->pad_r) :
		     dnnl_convolution_backward_weights_desc_init(&bdesc, dnnl_convolution_direct,
								 &d->x, &d->w, NULL, &d->y,
								 d->strides, d->pad, d->pad_r);
	rc = st != dnnl_success ||
	     dnnl_primitive_desc_create(&c->pd, &bdesc, attr, loom_cpu_dnnl_engine(), hint) !=
		     dnnl_success;
	dnnl_primitive_desc_destroy(hint);
	return rc ? -1 : 0;
}

/* Each argument of kind in its role, with its reorder where the primitive
 * chose another layout. */
static int args_make(conv_one *c, loom_cpu_conv_kind kind, const conv_descs *d, int use_bias)
{
	int rc = 0;

#define PD_MD(q) dnnl_primitive_desc_query_md(c->pd, q, 0)
	switch (kind) {
	case LOOM_CPU_CONV_FWD:
		rc |= arg_make(c, &c->arg[ARG_A], DNNL_ARG_SRC, &d->xu, PD_MD(dnnl_query_src_md), 0);
		rc |= arg_make(c, &c->arg[ARG_B], DNNL_ARG_WEIGHTS, &d->wu,
			       PD_MD(dnnl_query_weights_md), 0);
		if (use_bias)
			rc |= arg_make(c, &c->arg[ARG_BIAS], DNNL_ARG_BIAS, &d->b, &d->b, 0);
		rc |= arg_make(c, &c->arg[ARG_OUT], DNNL_ARG_DST, &d->yu, PD_MD(dnnl_query_dst_md),
			       1);
		break;
	case LOOM_CPU_CONV_BWD_DATA:
		rc |= arg_make(c, &c->arg[ARG_A], DNNL_ARG_DIFF_DST, &d->yu,
			       PD_MD(dnnl_query_diff_dst_md), 0);
		rc |= arg_make(c, &c->arg[ARG_B], DNNL_ARG_WEIGHTS, &d->wu,
			       PD_MD(dnnl_query_weights_md), 0);
		rc |= arg_make(c, &c->arg[ARG_OUT], DNNL_ARG_DIFF_SRC, &d->xu,
			       PD_MD(dnnl_query_diff_src_md), 1);
		break;
	case LOOM_CPU_CONV_BWD_FILTER:
		rc |= arg_make(c, &c->arg[ARG_A], DNNL_ARG_DIFF_DST, &d->yu,
			       PD_MD(dnnl_query_diff_dst_md), 0);
		rc |= arg_make(c, &c->arg[ARG_B], DNNL_ARG_SRC, &d->xu, PD_MD(dnnl_query_src_md),
			       0);
		rc |= arg_make(c, &c->arg[ARG_OUT], DNNL_ARG_DIFF_WEIGHTS, &d->wu,
			       PD_MD(dnnl_query_diff_weights_md), 1);
		break;
	}
#undef PD_MD
	return rc;
}

/* The execute list: each argument's memory (the primitive's copy where
 * there is one), then oneDNN's scratchpad, placed in the workspace after
 * the copies. */
static int exec_list(conv_one *c)
{
	const dnnl_memory_desc_t *sp;

	for (int i = 0; i < NARGS; i++) {
		conv_arg *a = &c->arg[i];
		if (!a->used)
			continue;
		c->exec[c->nexec].arg = a->dnnl_arg;
		c->exec[c->nexec].memory = a->inner ? a->inner : a->user;
		c->nexec++;
	}
	sp = dnnl_primitive_desc_query_md(c->pd, dnnl_query_scratchpad_md, 0);
	if (sp && dnnl_memory_desc_get_size(sp) > 0) {
		if (dnnl_memory_create(&c->scratch, sp, loom_cpu_dnnl_engine(), DNNL_MEMORY_NONE) !=
		    dnnl_success)
			return -1;
		c->scratch_off = c->ws_bytes;
		c->ws_bytes += align64(dnnl_memory_desc_get_size(sp));
		c->exec[c->nexec].arg = DNNL_ARG_SCRATCHPAD;
		c->exec[c->nexec].memory = c->scratch;
		c->nexec++;
	}
	return 0;
}

static conv_one *one_new(loom_cpu_conv_kind kind, const loom_conv_shape *s, int bf16, int bias,
			 int blocked, unsigned fmt)
{
	int use_bias = kind == LOOM_CPU_CONV_FWD && bias;
	dnnl_primitive_attr_t attr = NULL;
	conv_descs d;
	conv_one *c;

	if (descs_init(&d, kind, s, bf16, blocked, fmt))
		return NULL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	if (dnnl_stream_create(&c->stream, loom_cpu_dnnl_engine(), dnnl_stream_default_flags) !=
	    dnnl_success)
		goto fail;
	/* The scratchpad in loom's workspace: planned memory, no allocation
	 * in a step. */
	if (dnnl_primitive_attr_create(&attr) != dnnl_success ||
	    dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) !=
		    dnnl_success)
		goto fail;
	if (pd_make(c, kind, &d, use_bias, attr) ||
	    dnnl_primitive_create(&c->prim, c->pd) != dnnl_success ||
	    args_make(c, kind, &d, use_bias) || exec_list(c))
		goto fail;
	dnnl_primitive_attr_destroy(attr);
	return c;
fail:
	if (attr)
		dnnl_primitive_attr_destroy(attr);
	one_free(c);
	return NULL;
}

static int reorder(dnnl_stream_t stream, dnnl_primitive_t r, dnnl_memory_t from,
		   dnnl_memory_t to)
{
	dnnl_exec_arg_t args[2] = { { DNNL_ARG_FROM, from }, { DNNL_ARG_TO, to } };
	return dnnl_primitive_execute(r, stream, 2, args) == dnnl_success ? 0 : -1;
}

static int one_run(conv_one *c, const void *a, const void *b, const float *bias, float *out,
		   void *ws)
{
	const void *ptr[NARGS] = { a, b, bias, out };
	int rc = 0;
	if (c->scratch &&
	    dnnl_memory_set_data_handle(c->scratch, (char *)ws + c->scratch_off) != dnnl_success)
		return -1;
	for (int i = 0; i < NARGS; i++) {
		conv_arg *g = &c->arg[i];
		if (!g->used)
			continue;
		if (dnnl_memory_set_data_handle(g->user, (void *)ptr[i]) != dnnl_success ||
		    (g->inner && dnnl_memory_set_data_handle(g->inner, (char *)ws + g->inner_off) !=
					 dnnl_success))
			return -1;
		if (g->reorder && i != ARG_OUT)
			rc |= reorder(c->stream, g->reorder, g->user, g->inner);
	}
	if (rc || dnnl_primitive_execute(c->prim, c->stream, c->nexec, c->exec) != dnnl_success)
		return -1;
	conv_arg *o = &c->arg[ARG_OUT];
	if (o->reorder && reorder(c->stream, o->reorder, o->inner, o->user))
		return -1;
	return dnnl_stream_wait(c->stream) == dnnl_success ? 0 : -1;
}

static const char *one_impl(const conv_one *c)
{
	const char *s = NULL;
	if (dnnl_primitive_desc_query(c->pd, dnnl_query_impl_info_str, 0, &s) != dnnl_success)
		return "?";
	return s;
}

/*
 * A node: the batch split into one slice per thread, each slice its own
 * primitive (made for one thread) on its own part of the workspace, all
 * run as one job of loom's team (team.c), as loom's im2col kernels split
 * the batch. One job per node, not one region per reorder and per primitive
 * as oneDNN's own threading does: on the shared 2-core machine its barriers cost more
 * than the kernels gained (bench/RESULTS.md). The filter gradient sums the
 * slices' partial gradients after, in slice order (deterministic).
 */
struct loom_cpu_dnnl_conv {
	loom_cpu_conv_kind kind;
	int bf16, nslice, per; /* slices of `per` images, the last maybe fewer */
	size_t slot;           /* workspace bytes per slice */
	loom_conv_shape s;
	conv_one *one[LOOM_CPU_MAX_SLOTS];
};

void loom_cpu_dnnl_conv_free(loom_cpu_dnnl_conv *c)
{
	if (!c)
		return;
	for (int i = 0; i < c->nslice; i++)
		one_free(c->one[i]);
	free(c);
}

loom_cpu_dnnl_conv *loom_cpu_dnnl_conv_new(loom_cpu_conv_kind kind, const loom_conv_shape *s,
					   int bf16, int bias, int blocked)
{
	return loom_cpu_dnnl_conv_new_fmt(kind, s, bf16, bias, blocked, 0);
}

loom_cpu_dnnl_conv *loom_cpu_dnnl_conv_new_fmt(loom_cpu_conv_kind kind, const loom_conv_shape *s,
					       int bf16, int bias, int blocked, unsigned fmt)
{
	if (bf16 && loom_cpu_isa_get() != LOOM_CPU_ISA_AVX512_BF16)
		return NULL;
	loom_cpu_dnnl_conv *c = loom_cpu_dnnl_calloc(sizeof(*c));
	if (!c)
		return NULL;
	int nt = loom_cpu_slot_threads(s->n);
	c->kind = kind;
	c->bf16 = bf16;
	c->s = *s;
	c->per = (s->n + nt - 1) / nt;
	c->nslice = (s->n + c->per - 1) / c->per;
	/* Each slice's primitive is made for one thread: oneDNN sizes its
	 * work split by the thread count it sees now, and inside the node's
	 * parallel region it runs on the calling thread alone. */
	int prev = omp_get_max_threads();
	omp_set_num_threads(1);
	size_t ws = 0;
	for (int i = 0; i < c->nslice; i++) {
		loom_conv_shape si = *s;
		si.n = i + 1 < c->nslice ? c->per : s->n - i * c->per;
		/* one per slice, even of equal shapes: slices run at once and
		 * each sets its memory objects' handles */
		c->one[i] = one_new(kind, &si, bf16, bias, blocked, fmt);
		if (!c->one[i]) {
			omp_set_num_threads(prev);
			c->nslice = i;
			loom_cpu_dnnl_conv_free(c);
			return NULL;
		}
		if (c->one[i]->ws_bytes > ws)
			ws = c->one[i]->ws_bytes;
	}
	omp_set_num_threads(prev);
	c->slot = align64(ws);
	if (kind == LOOM_CPU_CONV_BWD_FILTER && c->nslice > 1)
		c->slot += align64(sizeof(float) * (size_t)s->c_out * s->c_in * s->kh * s->kw);
	return c;
}

size_t loom_cpu_dnnl_conv_ws(const loom_cpu_dnnl_conv *c)
{
	return c->slot * (size_t)c->nslice;
}

/* One node's run, shared by its threads. */
typedef struct conv_job {
	loom_cpu_dnnl_conv *c;
	const void *a, *b;
	const float *bias;
	float *out;
	void *ws;
	size_t part_off;
	_Atomic int fail;
} conv_job;

/* Thread t of nt runs slices t, t + nt, ... (one each when nt is the slice
 * count, as the node plans it). */
static void conv_job_slices(void *arg, int t, int nt)
{
	conv_job *j = arg;
	loom_cpu_dnnl_conv *c = j->c;
	const loom_conv_shape *s = &c->s;
	const size_t esz = c->bf16 ? 2 : 4;
	const size_t x_img = (size_t)s->c_in * s->h_in * s->w_in;
	const size_t y_img = (size_t)s->c_out * s->h_out * s->w_out;
	for (int i = t; i < c->nslice; i += nt) {
		size_t n0 = (size_t)i * c->per;
		char *slot = (char *)j->ws + c->slot * i;
		const char *ai, *bi = j->b;
		float *oi;
		switch (c->kind) {
		case LOOM_CPU_CONV_FWD:
			ai = (const char *)j->a + n0 * x_img * esz;
			oi = j->out + n0 * y_img;
			break;
		case LOOM_CPU_CONV_BWD_DATA:
			ai = (const char *)j->a + n0 * y_img * esz;
			oi = j->out + n0 * x_img;
			break;
		default:
			ai = (const char *)j->a + n0 * y_img * esz;
			bi = (const char *)j->b + n0 * x_img * esz;
			oi = c->nslice > 1 ? (float *)(slot + j->part_off) : j->out;
			break;
		}
		if (one_run(c->one[i], ai, bi, j->bias, oi, slot))
			atomic_store(&j->fail, 1);
	}
}

/* The filter gradient: the slices' partial sums added in slice order. */
static void conv_job_reduce(void *arg, int64_t lo, int64_t hi)
{
	conv_job *j = arg;
	const char *p0 = (const char *)j->ws + j->part_off;
	for (int64_t k = lo; k < hi; k++) {
		float acc = 0;
		for (int i = 0; i < j->c->nslice; i++)
			acc += ((const float *)(p0 + j->c->slot * i))[k];
		j->out[k] = acc;
	}
}

int loom_cpu_dnnl_conv_run(loom_cpu_dnnl_conv *c, const void *a, const void *b,
			   const float *bias, float *out, void *ws)
{
	const loom_conv_shape *s = &c->s;
	const size_t nw = (size_t)s->c_out * s->c_in * s->kh * s->kw;
	conv_job j = { c, a, b, bias, out, ws, c->slot - align64(sizeof(float) * nw), 0 };

	loom_cpu_team_run(c->nslice, conv_job_slices, &j);
	if (atomic_load(&j.fail))
		return -1;
	if (c->kind == LOOM_CPU_CONV_BWD_FILTER && c->nslice > 1)
		loom_cpu_team_for((int64_t)nw, nw >= 32768 ? loom_cpu_team_threads() : 1,
				  conv_job_reduce, &j);
	return 0;
}

const char *loom_cpu_dnnl_conv_impl(const loom_cpu_dnnl_conv *c)
{
	return one_impl(c->one[0]);
}
