/*
 * engine/cpu/ksearch.c — each convolution and product node's kernel, chosen
 * by measurement when the plan is made. The candidates (a conv: loom's
 * im2col + GEMM, oneDNN on NCHW, oneDNN blocked; a product: loom's split
 * sgemm, oneDNN's matmul primitive) run on the node's real shape on
 * scratch buffers: a warm-up of each, then up to five rounds that run each
 * once in turn (the load of a shared machine falls on all alike), each
 * keeping its best run, within a budget per plan. The winner is
 * kept (if it beats the fixed default by 10% or more: no flipping on noise)
 * per shape and thread count for the process, so a second plan of the
 * same model (evaluation, another rank's thread) measures nothing. Off
 * (loom_compile_opts.kernel_search's default, or LOOM_KERNEL_SEARCH=off), every node
 * takes a fixed default, the kernels nodes ran before the search, so that
 * tests and committed goldens keep their bits.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <omp.h>

#include "base/memo.h"
#include "base/options.h"
#include "engine/cpu/cpu_path.h"
#include "engine/cpu/kernels.h"
#include "engine/backend.h"
#include "engine/cpu/ksearch.h"
#include "graph/ops/ops.h"

#define SEARCH_MS_DEFAULT 5000.0 /* the budget of one plan's search */
#define CAND_MS 20.0             /* a round of candidates over 2x this: 2 rounds */
#define ROUNDS_MAX 5             /* timed rounds of quicker candidates */
#define MARGIN 0.10              /* how much faster than the default a kernel must be */
#define CACHE_MAX 1024

static const char *const kern_names[LOOM_CPU_KERN_COUNT] = {
	[LOOM_CPU_KERN_NONE] = "none",
	[LOOM_CPU_KERN_IM2COL] = "im2col",
	[LOOM_CPU_KERN_DNNL_NCHW] = "dnnl_nchw",
	[LOOM_CPU_KERN_DNNL_BLOCKED] = "dnnl_blocked",
	[LOOM_CPU_KERN_SGEMM] = "sgemm",
	[LOOM_CPU_KERN_MATMUL] = "matmul",
};

const char *loom_cpu_kern_name(loom_cpu_kern k)
{
	return (unsigned)k < LOOM_CPU_KERN_COUNT ? kern_names[k] : "?";
}

static size_t align64(size_t x)
{
	return (x + 63) & ~(size_t)63;
}

/* ------------------------------------------------------------ a node's problem */

/* What a searched node computes, from the plan. */
typedef struct kprob {
	int conv;
	loom_cpu_conv_kind kind; /* conv */
	loom_conv_shape s;
	int bias;                /* a conv forward's or a linear's bias */
	unsigned fmt;            /* conv: LOOM_CPU_CONV_*_BLOCKED, its activations' formats */
	int ta, tb, m, n, k;     /* product: C[m, n] = op(A) op(B) */
} kprob;

static int prob_of(const loom_plan *p, loom_value v, kprob *q)
{
	const loom_graph *g = p->g;
	const loom_node *nd = &g->nodes[v];
	memset(q, 0, sizeof(*q));
	if (nd->dtype == LOOM_F64)
		return -1; /* f64 stays on loom's kernels (OpenBLAS) */
	switch (nd->op) {
	case LOOM_OP_CONV2D:
		q->kind = LOOM_CPU_CONV_FWD;
		q->bias = nd->nsrc > 2;
		break;
	case LOOM_OP_CONV2D_BWD_DATA:
		q->kind = LOOM_CPU_CONV_BWD_DATA;
		break;
	case LOOM_OP_CONV2D_BWD_FILTER:
		q->kind = LOOM_CPU_CONV_BWD_FILTER;
		break;
	case LOOM_OP_LINEAR: {
		const loom_node *x = &g->nodes[nd->src[0]];
		const loom_node *w = &g->nodes[nd->src[1]];
		q->tb = 1;
		q->m = (int)loom_shape_rows(&x->shape);
		q->n = (int)w->shape.dims[0];
		q->k = (int)w->shape.dims[1];
		q->bias = nd->nsrc > 2;
		return 0;
	}
	case LOOM_OP_MATMUL: {
		const loom_node *x = &g->nodes[nd->src[0]];
		q->ta = nd->a.mm.ta;
		q->tb = nd->a.mm.tb;
		q->m = (int)loom_shape_rows(&nd->shape);
		q->n = (int)loom_shape_last(&nd->shape);
		q->k = (int)(q->ta ? loom_shape_rows(&x->shape) : loom_shape_last(&x->shape));
		return 0;
	}
	default:
		return -1;
	}
	q->conv = 1;
	loom_conv_shape_of(g, v, &q->s);
	/* Which of its activations the plan holds blocked (graph/formats.c):
	 * x and y by role (dy is y's gradient, dx x's). */
	loom_format x = LOOM_FORMAT_NCHW, y = LOOM_FORMAT_NCHW;
	if (q->kind == LOOM_CPU_CONV_FWD) {
		x = g->nodes[nd->src[0]].format;
		y = nd->format;
	} else if (q->kind == LOOM_CPU_CONV_BWD_DATA) {
		y = g->nodes[nd->src[0]].format;
		x = nd->format;
	} else {
		y = g->nodes[nd->src[0]].format;
		x = g->nodes[nd->src[1]].format;
	}
	q->fmt = (x == LOOM_FORMAT_NCHW8C ? LOOM_CPU_CONV_X_BLOCKED : 0) |
		 (y == LOOM_FORMAT_NCHW8C ? LOOM_CPU_CONV_Y_BLOCKED : 0);
	return 0;
}

static void prob_key(const kprob *q, char *buf, size_t len)
{
	const loom_conv_shape *s = &q->s;
	int t = omp_get_max_threads();
	if (q->conv)
		snprintf(buf, len, "conv%d n%d c%d %dx%d o%d k%dx%d s%d p%d b%d f%u t%d", (int)q->kind,
			 s->n, s->c_in, s->h_in, s->w_in, s->c_out, s->kh, s->kw, s->stride, s->pad,
			 q->bias, q->fmt, t);
	else
		snprintf(buf, len, "mm %c%c %dx%dx%d b%d t%d", q->ta ? 't' : 'n', q->tb ? 't' : 'n',
			 q->m, q->n, q->k, q->bias, t);
}

/* ------------------------------------------------------------ candidates */

int loom_cpu_kern_candidates(const loom_plan *p, loom_value v, loom_cpu_kern *out)
{
	kprob q;
	if (prob_of(p, v, &q))
		return 0;
	if (q.conv) {
		out[0] = LOOM_CPU_KERN_IM2COL;
		out[1] = LOOM_CPU_KERN_DNNL_NCHW;
		out[2] = LOOM_CPU_KERN_DNNL_BLOCKED;
		return 3;
	}
	out[0] = LOOM_CPU_KERN_SGEMM;
	out[1] = LOOM_CPU_KERN_MATMUL;
	return 2;
}

void loom_cpu_kern_release(loom_cpu_node_kern *nk)
{
	loom_cpu_dnnl_conv_free(nk->conv);
	loom_cpu_dnnl_matmul_free(nk->mm);
	nk->conv = NULL;
	nk->mm = NULL;
	nk->kern = LOOM_CPU_KERN_NONE;
}

static int make(const kprob *q, loom_cpu_kern k, loom_cpu_node_kern *nk)
{
	loom_cpu_kern_release(nk);
	switch (k) {
	case LOOM_CPU_KERN_IM2COL:
	case LOOM_CPU_KERN_SGEMM:
		/* loom's im2col reads and writes NCHW only */
		if (q->conv != (k == LOOM_CPU_KERN_IM2COL) || q->fmt)
			return -1;
		break;
	case LOOM_CPU_KERN_DNNL_NCHW:
	case LOOM_CPU_KERN_DNNL_BLOCKED:
		if (!q->conv)
			return -1;
		nk->conv = loom_cpu_dnnl_conv_new_fmt(q->kind, &q->s, 0, q->bias,
						      k == LOOM_CPU_KERN_DNNL_BLOCKED, q->fmt);
		if (!nk->conv)
			return -1;
		break;
	case LOOM_CPU_KERN_MATMUL:
		if (q->conv)
			return -1;
		nk->mm = loom_cpu_dnnl_matmul_new(q->ta, q->tb, q->m, q->n, q->k, q->ta ? q->m : q->k,
						  q->tb ? q->k : q->n, q->n, 1.0f, 0, q->bias, 0, 0);
		if (!nk->mm)
			return -1;
		break;
	default:
		return -1;
	}
	nk->kern = k;
	return 0;
}

int loom_cpu_kern_make(const loom_plan *p, loom_value v, loom_cpu_kern k, loom_cpu_node_kern *nk)
{
	kprob q;
	if (prob_of(p, v, &q))
		return -1;
	return make(&q, k, nk);
}

static size_t ws_of(const kprob *q, const loom_cpu_node_kern *nk)
{
	if (nk->conv)
		return align64(loom_cpu_dnnl_conv_ws(nk->conv));
	if (nk->kern == LOOM_CPU_KERN_IM2COL)
		return align64(loom_cpu_conv2d_workspace(&q->s, 4));
	return 0;
}

size_t loom_cpu_kern_ws(const loom_plan *p, loom_value v, const loom_cpu_node_kern *nk)
{
	kprob q;
	return prob_of(p, v, &q) ? 0 : ws_of(&q, nk);
}

static int run(const kprob *q, const loom_cpu_node_kern *nk, void *const *src, void *out,
	       void *ws)
{
	const void *bias = q->bias ? src[2] : NULL;
	switch (nk->kern) {
	case LOOM_CPU_KERN_IM2COL:
		if (q->kind == LOOM_CPU_CONV_FWD)
			loom_cpu_conv2d_fwd_f32(&q->s, src[0], src[1], bias, out, ws);
		else if (q->kind == LOOM_CPU_CONV_BWD_DATA)
			loom_cpu_conv2d_bwd_data_f32(&q->s, src[0], src[1], out, ws);
		else
			loom_cpu_conv2d_bwd_filter_f32(&q->s, src[0], src[1], out, ws);
		return 0;
	case LOOM_CPU_KERN_DNNL_NCHW:
	case LOOM_CPU_KERN_DNNL_BLOCKED:
		return loom_cpu_dnnl_conv_run(nk->conv, src[0], src[1], bias, out, ws);
	case LOOM_CPU_KERN_SGEMM:
		if (q->bias)
			loom_cpu_linear_fwd_f32(q->m, q->k, q->n, src[0], src[1], bias, out);
		else
			loom_cpu_gemm_f32(q->ta, q->tb, q->m, q->n, q->k, 1.0, src[0], src[1], 0.0, out);
		return 0;
	case LOOM_CPU_KERN_MATMUL:
		return loom_cpu_dnnl_matmul_run(nk->mm, src[0], src[1], bias, out);
	default:
		return -1;
	}
}

int loom_cpu_kern_run(const loom_plan *p, loom_value v, const loom_cpu_node_kern *nk,
		      void *const *src, void *out, void *ws)
{
	kprob q;
	if (prob_of(p, v, &q))
		return -1;
	return run(&q, nk, src, out, ws);
}

/*
 * The fixed default (the search off, its budget spent, or a forced kernel
 * this machine lacks): loom's sgemm for products, and for convolutions the
 * kernels they ran before the search was built, so that a run with the
 * search off keeps the bits of the committed goldens on every CPU: oneDNN
 * blocked for spatial kernels of 8 or more input channels (and, on
 * AVX-512, every spatial filter gradient; on AVX2 a 7x7 forward of 56 or
 * more output rows, and the data gradient of a 1x1 layer of 1024 or more
 * input channels), im2col + GEMM for the rest.
 */
static loom_cpu_kern fixed_default(const kprob *q)
{
	const loom_conv_shape *s = &q->s;
	if (!q->conv)
		return LOOM_CPU_KERN_SGEMM;
	if (q->fmt) /* the plan holds its activations blocked */
		return LOOM_CPU_KERN_DNNL_BLOCKED;
	int avx2 = loom_cpu_isa_get() == LOOM_CPU_ISA_AVX2, dnnl;
	if (s->kh == 1 && s->kw == 1)
		dnnl = avx2 && q->kind == LOOM_CPU_CONV_BWD_DATA && s->c_in >= 1024;
	else
		dnnl = s->c_in >= 8 ||
		       (q->kind == LOOM_CPU_CONV_BWD_FILTER &&
			loom_cpu_isa_get() >= LOOM_CPU_ISA_AVX512) ||
		       (avx2 && q->kind == LOOM_CPU_CONV_FWD && s->kh >= 7 && s->h_out >= 56);
	return dnnl ? LOOM_CPU_KERN_DNNL_BLOCKED : LOOM_CPU_KERN_IM2COL;
}

/* ------------------------------------------------------------ the choice */

/*
 * The fastest timed kernel (the first of equal times, in the candidates'
 * order, which is the enum's); but the fixed default where it was timed
 * and the fastest is not MARGIN faster than it, so that noise does not flip
 * a near tie between runs or processes; and the default where none was
 * timed (loom's own kernel).
 */
loom_cpu_kern loom_cpu_kern_choose(const double ms[LOOM_CPU_KERN_COUNT], loom_cpu_kern def)
{
	loom_cpu_kern best = LOOM_CPU_KERN_NONE;
	for (int k = LOOM_CPU_KERN_NONE + 1; k < LOOM_CPU_KERN_COUNT; k++)
		if (ms[k] > 0 && (best == LOOM_CPU_KERN_NONE || ms[k] < ms[best]))
			best = (loom_cpu_kern)k;
	if (best == LOOM_CPU_KERN_NONE || (ms[def] > 0 && ms[best] > (1.0 - MARGIN) * ms[def]))
		return def;
	return best;
}

/* ------------------------------------------------------------ measuring */

/* Scratch sources, result and workspace for one node's candidates. */
typedef struct bench_bufs {
	void *src[3];
	void *out;
	void *ws;
	size_t ws_bytes;
} bench_bufs;

static void bufs_free(bench_bufs *b)
{
	for (int i = 0; i < 3; i++)
		free(b->src[i]);
	free(b->out);
	free(b->ws);
	memset(b, 0, sizeof(*b));
}

/* Values in [-1, 1), the same each time (no denormals, no NaN). */
static float *rand_floats(int64_t n)
{
	float *x = aligned_alloc(64, align64(sizeof(float) * (size_t)(n > 0 ? n : 1)));
	uint32_t r = 12345;
	for (int64_t i = 0; x && i < n; i++) {
		r = r * 1664525u + 1013904223u;
		x[i] = (float)(r >> 8) / 8388608.0f - 1.0f;
	}
	return x;
}

static int bufs_make(const kprob *q, bench_bufs *b)
{
	int64_t n[4]; /* src 0, 1, 2 and the result, in floats */
	const loom_conv_shape *s = &q->s;
	memset(b, 0, sizeof(*b));
	if (q->conv) {
		int64_t x = (int64_t)s->n * s->c_in * s->h_in * s->w_in;
		int64_t w = (int64_t)s->c_out * s->c_in * s->kh * s->kw;
		int64_t y = (int64_t)s->n * s->c_out * s->h_out * s->w_out;
		int64_t kn[3][4] = { { x, w, s->c_out, y }, { y, w, 0, x }, { y, x, 0, w } };
		memcpy(n, kn[q->kind], sizeof(n));
		if (!q->bias)
			n[2] = 0;
	} else {
		n[0] = (int64_t)q->m * q->k;
		n[1] = (int64_t)q->k * q->n;
		n[2] = q->bias ? q->n : 0;
		n[3] = (int64_t)q->m * q->n;
	}
	for (int i = 0; i < 3; i++)
		if (n[i] && !(b->src[i] = rand_floats(n[i])))
			return -1;
	b->out = rand_floats(n[3]);
	return b->out ? 0 : -1;
}

static int bufs_ws(bench_bufs *b, size_t bytes)
{
	if (bytes <= b->ws_bytes)
		return 0;
	free(b->ws);
	b->ws = aligned_alloc(64, align64(bytes));
	b->ws_bytes = b->ws ? bytes : 0;
	return b->ws ? 0 : -1;
}

/* ------------------------------------------------------------ the process's cache */

typedef struct cache_entry {
	char key[96];
	loom_cpu_kern kern;
	double ms[LOOM_CPU_KERN_COUNT];
} cache_entry;

/* Keyed by the whole key buffer: every entry starts zeroed, so the bytes
 * past the string's end are zero in each. */
static cache_entry cache_e[CACHE_MAX];
static loom_memo cache = LOOM_MEMO_INIT(cache_e, sizeof(cache_e[0].key));

/* ------------------------------------------------------------ the plan */

/* The kernel an environment variable forces on this node's kind, or NONE. */
static loom_status forced(const kprob *q, loom_cpu_kern *k, char *err)
{
	const loom_opt id = q->conv ? LOOM_OPT_CPU_CONV : LOOM_OPT_CPU_PRODUCT;
	const char *var = loom_opt_row_get(id)->env, *e = loom_opt_env(id);
	*k = LOOM_CPU_KERN_NONE;
	if (!e || !*e)
		return LOOM_OK;
	for (int i = LOOM_CPU_KERN_IM2COL; i < LOOM_CPU_KERN_COUNT; i++) {
		int conv_kern = i <= LOOM_CPU_KERN_DNNL_BLOCKED;
		if (conv_kern == q->conv && !strcmp(e, kern_names[i])) {
			*k = (loom_cpu_kern)i;
			return LOOM_OK;
		}
	}
	return loom_errnf(err, LOOM_ERR_MAX, LOOM_ERR_INVALID, "%s=%s: not a kernel (%s)", var, e,
			  q->conv ? "im2col, dnnl_nchw or dnnl_blocked" : "sgemm or matmul");
}

static int search_off(const loom_plan *p)
{
	int c = loom_opt_choice(LOOM_OPT_KERNEL_SEARCH); /* off|on */
	if (c >= 0)
		return c == 0;
	return p->opts.kernel_search == LOOM_KERNEL_SEARCH_OFF;
}

/*
 * Each timed run starts with the node's buffers out of the caches, as in a
 * training step, where other nodes ran in between (Triton's do_bench clears
 * the cache the same way): run back to back on the same buffers, oneDNN's
 * blocked kernels, whose reorders stream the activations once more, timed
 * faster than they ran in the ConvNet's step. Writing twice the last-level
 * cache evicts them.
 */
static void cache_flush(void)
{
	static char *junk;
	static size_t bytes;
	if (!junk) {
		long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
		size_t want = 2 * (size_t)(l3 > 0 ? l3 : 32L << 20);
		if (want > (size_t)128 << 20)
			want = (size_t)128 << 20;
		pthread_mutex_lock(&cache.lock);
		if (!junk && (junk = malloc(want)))
			bytes = want;
		pthread_mutex_unlock(&cache.lock);
	}
	if (junk)
		memset(junk, (int)(bytes & 0x7f), bytes);
}

/* Times every candidate of q; the fastest into *nk, all times into e. */
static loom_status measure(const kprob *q, loom_cpu_node_kern *nk, cache_entry *e,
			   double *spent, char *err)
{
	loom_cpu_kern cand[LOOM_CPU_KERN_COUNT];
	int nc = q->conv ? 3 : 2;
	bench_bufs b;
	if (q->conv) {
		cand[0] = LOOM_CPU_KERN_IM2COL;
		cand[1] = LOOM_CPU_KERN_DNNL_NCHW;
		cand[2] = LOOM_CPU_KERN_DNNL_BLOCKED;
	} else {
		cand[0] = LOOM_CPU_KERN_SGEMM;
		cand[1] = LOOM_CPU_KERN_MATMUL;
	}
	if (bufs_make(q, &b)) {
		bufs_free(&b);
		return loom_errnf(err, LOOM_ERR_MAX, LOOM_ERR_NOMEM,
				  "out of memory timing the kernels of %s", e->key);
	}
	/* Each candidate made and run once (the warm-up: JIT code, pages,
	 * caches); then rounds that run each once in turn, so that the
	 * machine's load, which drifts, falls on all of them alike; each
	 * keeps its best run. */
	loom_cpu_node_kern c[LOOM_CPU_KERN_COUNT];
	double t0 = loom_trace_now(), round_ms = 0;
	int ok[LOOM_CPU_KERN_COUNT] = { 0 };
	memset(c, 0, sizeof(c));
	for (int i = 0; i < nc; i++) {
		ok[i] = !make(q, cand[i], &c[i]) && !bufs_ws(&b, ws_of(q, &c[i]));
		double t = loom_trace_now();
		ok[i] = ok[i] && !run(q, &c[i], b.src, b.out, b.ws);
		round_ms += (loom_trace_now() - t) * 1e3;
	}
	int rounds = round_ms < 2 * CAND_MS ? ROUNDS_MAX : 2;
	for (int r = 0; r < rounds; r++) {
		for (int i = 0; i < nc; i++) {
			if (!ok[i])
				continue;
			cache_flush();
			double t = loom_trace_now();
			ok[i] = !run(q, &c[i], b.src, b.out, b.ws);
			t = (loom_trace_now() - t) * 1e3;
			if (ok[i] && (e->ms[cand[i]] == 0 || t < e->ms[cand[i]]))
				e->ms[cand[i]] = t > 0 ? t : 1e-6;
		}
	}
	*spent += (loom_trace_now() - t0) * 1e3;
	for (int i = 0; i < nc; i++) {
		loom_cpu_kern_release(&c[i]);
		if (!ok[i])
			e->ms[cand[i]] = 0;
	}
	bufs_free(&b);
	e->kern = loom_cpu_kern_choose(e->ms, fixed_default(q));
	return LOOM_OK;
}

loom_status loom_cpu_kern_plan(const loom_plan *p, loom_cpu_node_kern *kern, char *err)
{
	double budget = p->opts.kernel_search_ms > 0 ? p->opts.kernel_search_ms : SEARCH_MS_DEFAULT;
	double spent = 0;
	int off = search_off(p);
	for (int i = 0; i < p->n_steps; i++) {
		const loom_step *st = &p->steps[i];
		loom_value v = st->v;
		kprob q;
		if (st->kind != LOOM_STEP_NODE || st->noop || kern[v].kern != LOOM_CPU_KERN_NONE ||
		    prob_of(p, v, &q))
			continue;
		loom_cpu_node_kern *nk = &kern[v];
		loom_cpu_kern k;
		loom_status s = forced(&q, &k, err);
		if (s != LOOM_OK)
			return s;
		cache_entry e = { .kern = LOOM_CPU_KERN_NONE };
		prob_key(&q, e.key, sizeof(e.key));
		if (k != LOOM_CPU_KERN_NONE) {
			nk->how = LOOM_CPU_KERN_FORCED;
		} else if (off) {
			k = fixed_default(&q);
			nk->how = LOOM_CPU_KERN_FIXED;
		} else if (loom_memo_get(&cache, e.key, &e)) {
			k = e.kern;
			nk->how = LOOM_CPU_KERN_CACHED;
		} else if (spent >= budget) {
			k = fixed_default(&q);
			nk->how = LOOM_CPU_KERN_OVER;
		} else {
			if ((s = measure(&q, nk, &e, &spent, err)) != LOOM_OK)
				return s;
			loom_memo_put(&cache, &e);
			k = e.kern;
			nk->how = LOOM_CPU_KERN_MEASURED;
		}
		memcpy(nk->ms, e.ms, sizeof(nk->ms));
		/* Where the chosen kernel cannot be made here (a forced
		 * oneDNN one on the portable path): loom's own; blocked
		 * activations need a oneDNN one. */
		if (make(&q, k, nk) && make(&q, q.conv ? LOOM_CPU_KERN_IM2COL : LOOM_CPU_KERN_SGEMM, nk) &&
		    (!q.fmt || make(&q, LOOM_CPU_KERN_DNNL_BLOCKED, nk)))
			return loom_errnf(err, LOOM_ERR_MAX, LOOM_ERR_NOMEM,
					  "cannot make a kernel for %s", e.key);
	}
	/* The nodes this rank does not run (another pipeline stage's) get
	 * the fixed default, unmeasured: the workspace is the largest node's
	 * of the whole graph, the same on every stage, as the pipeline's
	 * memory balance counts it (parallel/pipeline.c, stage_peak); sized from
	 * this rank's nodes only, it would change with the cut. */
	for (loom_value v = 0; v < p->g->n; v++) {
		kprob q;
		if (kern[v].kern != LOOM_CPU_KERN_NONE || loom_step_of(p, v) >= 0 || prob_of(p, v, &q))
			continue;
		kern[v].how = LOOM_CPU_KERN_FIXED;
		if (make(&q, fixed_default(&q), &kern[v]) && !q.fmt &&
		    make(&q, q.conv ? LOOM_CPU_KERN_IM2COL : LOOM_CPU_KERN_SGEMM, &kern[v]))
			return loom_errnf(err, LOOM_ERR_MAX, LOOM_ERR_NOMEM,
					  "cannot make a kernel for node %d", (int)v);
	}
	return LOOM_OK;
}

loom_cpu_kern loom_cpu_kern_choice(const loom_plan *p, loom_value v)
{
	kprob q;
	loom_cpu_kern k;
	char err[LOOM_ERR_MAX];
	if (prob_of(p, v, &q))
		return LOOM_CPU_KERN_NONE;
	if (forced(&q, &k, err) != LOOM_OK || k != LOOM_CPU_KERN_NONE)
		return k;
	if (search_off(p))
		return fixed_default(&q);
	cache_entry e = { .kern = LOOM_CPU_KERN_NONE };
	prob_key(&q, e.key, sizeof(e.key));
	if (loom_memo_get(&cache, e.key, &e))
		return e.kern;
	loom_cpu_node_kern nk = { 0 };
	double spent = 0;
	if (measure(&q, &nk, &e, &spent, err) != LOOM_OK)
		return fixed_default(&q);
	loom_memo_put(&cache, &e);
	return e.kern;
}

void loom_cpu_kern_note(const loom_plan *p, loom_value v, const loom_cpu_node_kern *nk,
			char *buf, size_t len)
{
	static const char *const how[] = {
		[LOOM_CPU_KERN_MEASURED] = "measured",
		[LOOM_CPU_KERN_CACHED] = "measured earlier",
		[LOOM_CPU_KERN_FIXED] = "fixed: kernel search off",
		[LOOM_CPU_KERN_FORCED] = "forced by LOOM_CPU_CONV / LOOM_CPU_PRODUCT",
		[LOOM_CPU_KERN_OVER] = "fixed: search budget spent",
	};
	size_t at = 0;
	(void)p;
	(void)v;
	buf[0] = 0;
	if (nk->kern == LOOM_CPU_KERN_NONE)
		return;
	const char *impl = nk->conv ? loom_cpu_dnnl_conv_impl(nk->conv) :
			   nk->mm   ? loom_cpu_dnnl_matmul_impl(nk->mm) :
				      NULL;
	at += snprintf(buf + at, len - at, "kernel %s%s%s%s (%s", loom_cpu_kern_name(nk->kern),
		       impl ? " [" : "", impl ? impl : "", impl ? "]" : "", how[nk->how]);
	const char *sep = ": ";
	for (int k = 1; k < LOOM_CPU_KERN_COUNT && at < len; k++) {
		if (nk->ms[k] <= 0)
			continue;
		at += snprintf(buf + at, len - at, "%s%s %.3f", sep, kern_names[k], nk->ms[k]);
		sep = ", ";
	}
	if (at < len)
		snprintf(buf + at, len - at, "%s)", sep[0] == ',' ? " ms" : "");
}
