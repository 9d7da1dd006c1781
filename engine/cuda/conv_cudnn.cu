/*
 * engine/cuda/conv_cudnn.cu — CONV2D, CONV2D_BWD_DATA and CONV2D_BWD_FILTER
 * through cuDNN's convolution API, with fp32 accumulation. Descriptors and
 * the algorithm are chosen once, when the backend is asked for workspace
 * sizes (before prepare), and cached in the node's plan. The conv bias is
 * added after by an own kernel (elementwise.cu). A half convolution cuDNN
 * has no algorithm for runs in f32 on copies in the workspace, cast back.
 * CPU twin: engine/cpu/conv.c.
 * fp32 runs on TF32 tensor cores (CUDNN_TENSOR_OP_MATH or the heuristic's
 * DEFAULT, which is TF32 on sm_80+), as PyTorch allows for cuDNN, unless the
 * plan is exact (no_tf32, `--tf32 off`): then CUDNN_FMA_MATH, so that fp32
 * results stay close to the CPU's. Conversion to half
 * (CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) is never taken for fp32.
 * The algorithm: the heuristic's (cudnnGet*Algorithm_v7) first usable one,
 * then, unless the kernel search is off (loom_compile_opts.kernel_search,
 * LOOM_KERNEL_SEARCH=off), cuDNN's measurement (cudnnFind*AlgorithmEx) on
 * scratch buffers of the node's shape, under the same rules, among every
 * algorithm unless deterministic (loom_compile_opts.deterministic,
 * LOOM_DETERMINISTIC=1: the deterministic ones only); the measured fastest
 * replaces the heuristic's only when 5% faster, and the choice is
 * cached per shape, dtype, math and determinism for the process. A search that cannot
 * run (no scratch memory, Find failing, its budget spent) keeps the
 * heuristic's; it never fails the compile.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/memo.h"
#include "base/options.h"
#include "engine/cuda/cuda_internal.h"

static int deterministic_on(const loom_plan *p);

/* The math type a convolution in dt asks the heuristic with. */
static cudnnMathType_t conv_math(const loom_plan *p, cudnnDataType_t dt)
{
	if (dt != CUDNN_DATA_FLOAT)
		return CUDNN_TENSOR_OP_MATH;
	return loom_cuda_tf32_on(p) ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

static loom_status set_descs(const loom_plan *p, loom_cuda_ctx *c, loom_cuda_conv_plan *cp, const loom_node *n,
			     cudnnDataType_t dt)
{
	loom_conv_shape cs;
	loom_status st;
	loom_conv_shape_of(p->g, (loom_value)(n - p->g->nodes), &cs);
	const int64_t xd[4] = { cs.n, cs.c_in, cs.h_in, cs.w_in };
	const int64_t wd[4] = { cs.c_out, cs.c_in, cs.kh, cs.kw };
	const int64_t yd[4] = { cs.n, cs.c_out, cs.h_out, cs.w_out };
	int on, oc, oh, ow;
	/* NHWC: x and y NHWC, the filter KRSC (the tensor-core kernels' own) */
	const cudnnTensorFormat_t tf =
		cp->fmt == LOOM_FORMAT_NHWC ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;

	if ((st = LOOM_CUDNN_CHECK(cudnnSetTensor4dDescriptor(cp->x, tf, dt,
							      (int)xd[0], (int)xd[1], (int)xd[2],
							      (int)xd[3]),
				   c->err, sizeof(c->err))) != LOOM_OK)
		return st;
	if ((st = LOOM_CUDNN_CHECK(cudnnSetTensor4dDescriptor(cp->y, tf, dt,
							      (int)yd[0], (int)yd[1], (int)yd[2],
							      (int)yd[3]),
				   c->err, sizeof(c->err))) != LOOM_OK)
		return st;
	if ((st = LOOM_CUDNN_CHECK(cudnnSetFilter4dDescriptor(cp->w, dt, tf,
							      (int)wd[0], (int)wd[1], (int)wd[2],
							      (int)wd[3]),
				   c->err, sizeof(c->err))) != LOOM_OK)
		return st;
	if ((st = LOOM_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
					   cp->conv, cs.pad, cs.pad, cs.stride, cs.stride, 1, 1, CUDNN_CROSS_CORRELATION,
					   CUDNN_DATA_FLOAT),
				   c->err, sizeof(c->err))) != LOOM_OK)
		return st;
	if ((st = LOOM_CUDNN_CHECK(cudnnSetConvolutionMathType(cp->conv, conv_math(p, dt)),
				   c->err, sizeof(c->err))) != LOOM_OK)
		return st;
	if ((st = LOOM_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(cp->conv, cp->x, cp->w,
									 &on, &oc, &oh, &ow),
				   c->err, sizeof(c->err))) != LOOM_OK)
		return st;
	if (on != yd[0] || oc != yd[1] || oh != yd[2] || ow != yd[3])
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_SHAPE,
					 "cuda conv: cuDNN computes output %dx%dx%dx%d, the graph has "
					 "%lldx%lldx%lldx%lld",
					 on, oc, oh, ow, (long long)yd[0], (long long)yd[1],
					 (long long)yd[2], (long long)yd[3]);
	return LOOM_OK;
}

/* The first algorithm (fastest by cuDNN's heuristic) that works, fits the
 * workspace cap and, for fp32, never converts to half, nor to TF32 unless
 * tf32 allows it. -1 if none. */
template <typename Perf>
static int first_usable(const Perf *perf, int count, int f32, int tf32, cudnnMathType_t *math)
{
	for (int i = 0; i < count; i++) {
		if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > LOOM_CUDA_CONV_WS_MAX)
			continue;
		if (f32 && perf[i].mathType != CUDNN_FMA_MATH && perf[i].mathType != CUDNN_DEFAULT_MATH &&
		    !(tf32 && perf[i].mathType == CUDNN_TENSOR_OP_MATH))
			continue;
		*math = perf[i].mathType;
		return (int)perf[i].algo;
	}
	return -1;
}

static loom_status set_algo(loom_cuda_ctx *c, const loom_node *n, loom_cuda_conv_plan *cp, int algo,
			    cudnnMathType_t math, int exact);

/* ------------------------------------------------------------ the search */

#define SEARCH_MS_DEFAULT 10000.0 /* one plan's measuring, at most */
#define SEARCH_MARGIN 0.05        /* the measured best replaces the heuristic's only when 5% faster */
#define SEARCH_HEADROOM ((size_t)256 << 20) /* device memory the scratch leaves free */
#define CACHE_MAX 1024

/* What a measurement depends on: the node's op, shape and dtype, the math
 * allowed (tf32), the device and whether only deterministic algorithms
 * were taken (det). */
typedef struct conv_key {
	int op, dt, tf32, device, fmt, det;
	int64_t n, c_in, h_in, w_in, c_out, kh, kw, pad, stride;
} conv_key;

typedef struct conv_choice {
	conv_key key;
	int algo, math, heur_algo;
	float ms, heur_ms;
} conv_choice;

static conv_choice cache_e[CACHE_MAX];
static loom_memo cache = LOOM_MEMO_INIT(cache_e, sizeof(conv_key));

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

void loom_cuda_conv_search_begin(const loom_plan *p, loom_cuda_ctx *c)
{
	loom_cuda_conv_search *s = &c->search;
	const char *e = loom_opt_env(LOOM_OPT_KERNEL_SEARCH);
	memset(s, 0, sizeof(*s));
	/* As the CPU's search decides (engine/cpu/ksearch.c): the environment
	 * (on or off) over the option, whose default is off. */
	if (e && (!strcmp(e, "off") || !strcmp(e, "on")))
		s->off = !strcmp(e, "off");
	else
		s->off = p->opts.kernel_search == LOOM_KERNEL_SEARCH_OFF;
	s->budget_ms = p->opts.kernel_search_ms > 0 ? p->opts.kernel_search_ms : SEARCH_MS_DEFAULT;
	if (s->off)
		return;
	for (int v = 0; v < p->g->n; v++) {
		const loom_node *n = &p->g->nodes[v];
		loom_conv_shape cs;
		if (n->op != LOOM_OP_CONV2D && n->op != LOOM_OP_CONV2D_BWD_DATA &&
		    n->op != LOOM_OP_CONV2D_BWD_FILTER)
			continue;
		loom_conv_shape_of(p->g, v, &cs);
		/* f32 bytes: enough for every dtype and for the f32 fallback */
		size_t xb = loom_cuda_align((size_t)(cs.n * cs.c_in * cs.h_in * cs.w_in) * 4);
		size_t wb = loom_cuda_align((size_t)(cs.c_out * cs.c_in * cs.kh * cs.kw) * 4);
		size_t yb = loom_cuda_align((size_t)(cs.n * cs.c_out * cs.h_out * cs.w_out) * 4);
		if (xb > s->x_bytes)
			s->x_bytes = xb;
		if (wb > s->w_bytes)
			s->w_bytes = wb;
		if (yb > s->y_bytes)
			s->y_bytes = yb;
	}
}

void loom_cuda_conv_search_end(loom_cuda_ctx *c)
{
	loom_cuda_conv_search *s = &c->search;
	if (s->base) {
		(void)cudaStreamSynchronize(c->stream);
		(void)cudaFree(s->base);
		(void)cudaGetLastError();
	}
	s->base = NULL;
	s->state = 0;
}

/* The scratch, made at the first measured node: 1 when ready. Any failure
 * leaves the search to the heuristic and clears CUDA's last error. */
static int scratch_ready(loom_cuda_ctx *c)
{
	loom_cuda_conv_search *s = &c->search;
	size_t fr = 0, total = 0, ops = s->x_bytes + s->w_bytes + s->y_bytes;
	void *base = NULL;
	if (s->state)
		return s->state > 0;
	s->state = -1;
	if (cudaMemGetInfo(&fr, &total) != cudaSuccess) {
		(void)cudaGetLastError();
		return 0;
	}
	if (ops == 0 || fr < ops + SEARCH_HEADROOM)
		return 0;
	size_t ws = LOOM_CUDA_CONV_WS_MAX;
	if (ws > fr - ops - SEARCH_HEADROOM)
		ws = (fr - ops - SEARCH_HEADROOM) & ~(size_t)(LOOM_CUDA_ALIGN - 1);
	if (cudaMalloc(&base, ops + ws) != cudaSuccess) {
		(void)cudaGetLastError();
		return 0;
	}
	/* zeros: no NaN or denormal in what the algorithms are timed on */
	if (cudaMemsetAsync(base, 0, ops, c->stream) != cudaSuccess) {
		(void)cudaGetLastError();
		(void)cudaFree(base);
		return 0;
	}
	s->base = (unsigned char *)base;
	s->ws_bytes = ws;
	s->state = 1;
	return 1;
}

/* perf's deterministic answers, in their order, into det (at most 16). */
template <typename Perf>
static int deterministic_only(const Perf *perf, int count, Perf *det)
{
	int nd = 0;
	for (int i = 0; i < count && nd < 16; i++)
		if (perf[i].determinism == CUDNN_DETERMINISTIC)
			det[nd++] = perf[i];
	return nd;
}

/* From Find's results (fastest first): the fastest usable under the rules
 * of first_usable, among every algorithm (as PyTorch's cudnn.benchmark
 * searches) or, under deterministic, the deterministic ones only (so that
 * the search never makes a repeatable run unrepeatable); and the best time
 * of the heuristic's algorithm. */
template <typename Perf>
static int best_measured(const Perf *perf, int count, int f32, int tf32, int deterministic,
			 int heur_algo, cudnnMathType_t *math, float *ms, float *heur_ms)
{
	Perf det[16];
	int algo = deterministic ? first_usable(det, deterministic_only(perf, count, det), f32, tf32,
						math) :
				   first_usable(perf, count, f32, tf32, math);
	*heur_ms = 0;
	*ms = 0;
	for (int i = 0; i < count; i++) {
		if (perf[i].status != CUDNN_STATUS_SUCCESS)
			continue;
		if (algo >= 0 && (int)perf[i].algo == algo && perf[i].mathType == *math && *ms == 0)
			*ms = perf[i].time;
		cudnnMathType_t m;
		if ((int)perf[i].algo == heur_algo && *heur_ms == 0 &&
		    first_usable(&perf[i], 1, f32, tf32, &m) >= 0)
			*heur_ms = perf[i].time;
	}
	return algo;
}

/* Replaces *algo, *math (the heuristic's) by the measured choice where
 * the search is on and can run; records how in cp. */
/* The cache key of n's convolution as cp plans it on this device. */
static void conv_key_of(const loom_plan *p, const loom_cuda_ctx *c, const loom_node *n,
			const loom_cuda_conv_plan *cp, int f32, int tf32, conv_key *k)
{
	loom_conv_shape cs;
	loom_conv_shape_of(p->g, (loom_value)(n - p->g->nodes), &cs);
	memset(k, 0, sizeof(*k));
	k->op = (int)n->op;
	k->dt = f32 ? (int)CUDNN_DATA_FLOAT : (int)loom_cudnn_data_type(n->dtype);
	k->tf32 = tf32;
	k->device = c->device;
	k->fmt = cp->fmt;
	k->det = deterministic_on(p);
	k->n = cs.n;
	k->c_in = cs.c_in;
	k->h_in = cs.h_in;
	k->w_in = cs.w_in;
	k->c_out = cs.c_out;
	k->kh = cs.kh;
	k->kw = cs.kw;
	k->pad = cs.pad;
	k->stride = cs.stride;
}

/* cuDNN's Find over the search's scratch, timed into the budget: the best
 * measured algorithm (its math in *bm, its time in *ms, the heuristic
 * algo's in *hms), or -1 when Find failed. */
static int find_best(loom_cuda_ctx *c, const loom_node *n, const loom_cuda_conv_plan *cp, int f32,
		     int tf32, int det, int algo, cudnnMathType_t *bm, float *ms, float *hms)
{
	loom_cuda_conv_search *s = &c->search;
	void *x = s->base, *w = s->base + s->x_bytes, *y = s->base + s->x_bytes + s->w_bytes;
	void *ws = s->base + s->x_bytes + s->w_bytes + s->y_bytes;
	cudnnStatus_t ds;
	int count = 0, best = -1;
	double t0 = now_ms();
	switch (n->op) {
	case LOOM_OP_CONV2D: {
		cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
		ds = cudnnFindConvolutionForwardAlgorithmEx(c->dnn, cp->x, x, cp->w, w, cp->conv, cp->y, y,
							    CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perf,
							    ws, s->ws_bytes);
		if (ds == CUDNN_STATUS_SUCCESS)
			best = best_measured(perf, count, f32, tf32, det, algo, bm, ms, hms);
		break;
	}
	case LOOM_OP_CONV2D_BWD_DATA: {
		cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
		ds = cudnnFindConvolutionBackwardDataAlgorithmEx(
			c->dnn, cp->w, w, cp->y, y, cp->conv, cp->x, x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
			&count, perf, ws, s->ws_bytes);
		if (ds == CUDNN_STATUS_SUCCESS)
			best = best_measured(perf, count, f32, tf32, det, algo, bm, ms, hms);
		break;
	}
	default: {
		cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
		ds = cudnnFindConvolutionBackwardFilterAlgorithmEx(
			c->dnn, cp->x, x, cp->y, y, cp->conv, cp->w, w,
			CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, perf, ws, s->ws_bytes);
		if (ds == CUDNN_STATUS_SUCCESS)
			best = best_measured(perf, count, f32, tf32, det, algo, bm, ms, hms);
		break;
	}
	}
	s->spent_ms += now_ms() - t0;
	(void)cudaGetLastError(); /* Find's own failures are not the run's */
	return ds == CUDNN_STATUS_SUCCESS ? best : -1;
}

static void search_algo(const loom_plan *p, loom_cuda_ctx *c, const loom_node *n,
			loom_cuda_conv_plan *cp, int f32, int tf32, int *algo, cudnnMathType_t *math)
{
	loom_cuda_conv_search *s = &c->search;
	conv_key k;
	conv_choice ch;
	if (s->off)
		return;
	conv_key_of(p, c, n, cp, f32, tf32, &k);
	if (loom_memo_get(&cache, &k, &ch)) {
		*algo = ch.algo;
		*math = (cudnnMathType_t)ch.math;
		cp->ms = ch.ms;
		cp->heur_ms = ch.heur_ms;
		cp->how = LOOM_CUDA_CONV_HOW_CACHED;
		return;
	}
	if (s->spent_ms >= s->budget_ms) {
		cp->how = LOOM_CUDA_CONV_HOW_BUDGET;
		return;
	}
	if (!scratch_ready(c)) {
		cp->how = LOOM_CUDA_CONV_HOW_NO_SCRATCH;
		return;
	}
	cudnnMathType_t bm = *math;
	float ms = 0, hms = 0;
	int best = find_best(c, n, cp, f32, tf32, k.det, *algo, &bm, &ms, &hms);
	if (best < 0) {
		cp->how = LOOM_CUDA_CONV_HOW_FIND_FAILED;
		return;
	}
	/* Within the margin of the heuristic's own time: the heuristic's, so
	 * that noise does not flip a near tie between runs or ranks. */
	if (!(hms > 0 && ms > (1.0 - SEARCH_MARGIN) * hms)) {
		*algo = best;
		*math = bm;
	} else {
		ms = hms;
	}
	cp->ms = ms;
	cp->heur_ms = hms;
	cp->how = LOOM_CUDA_CONV_HOW_MEASURED;
	memset(&ch, 0, sizeof(ch));
	ch.key = k;
	ch.algo = *algo;
	ch.math = (int)*math;
	ch.heur_algo = cp->heur_algo;
	ch.ms = ms;
	ch.heur_ms = hms;
	loom_memo_put(&cache, &ch);
}

/* loom_compile_opts.deterministic, or LOOM_DETERMINISTIC=1: the
 * heuristic's and the search's answers narrowed to cuDNN's deterministic
 * algorithms, so that two programs of one plan repeat each other bit for
 * bit. */
static int deterministic_on(const loom_plan *p)
{
	const char *e = loom_opt_env(LOOM_OPT_DETERMINISTIC);
	return p->opts.deterministic || (e && !strcmp(e, "1"));
}

/* The heuristic's first usable algorithm; under deterministic_on, the
 * first usable deterministic one (-1 where it offers none). */
template <typename Perf>
static int heuristic_usable(const loom_plan *p, const Perf *perf, int count, int f32, int tf32,
			    cudnnMathType_t *math)
{
	Perf det[16];
	if (!deterministic_on(p))
		return first_usable(perf, count, f32, tf32, math);
	int nd = deterministic_only(perf, count, det);
	return first_usable(det, nd, f32, tf32, math);
}

/* cuDNN's heuristic list for one direction, picked by its Perf type. */
static cudnnStatus_t heuristic_list(loom_cuda_ctx *c, const loom_cuda_conv_plan *cp,
				    cudnnConvolutionFwdAlgoPerf_t *perf, int n, int *count)
{
	return cudnnGetConvolutionForwardAlgorithm_v7(c->dnn, cp->x, cp->w, cp->conv, cp->y, n,
						      count, perf);
}

static cudnnStatus_t heuristic_list(loom_cuda_ctx *c, const loom_cuda_conv_plan *cp,
				    cudnnConvolutionBwdDataAlgoPerf_t *perf, int n, int *count)
{
	return cudnnGetConvolutionBackwardDataAlgorithm_v7(c->dnn, cp->w, cp->y, cp->conv, cp->x,
							   n, count, perf);
}

static cudnnStatus_t heuristic_list(loom_cuda_ctx *c, const loom_cuda_conv_plan *cp,
				    cudnnConvolutionBwdFilterAlgoPerf_t *perf, int n, int *count)
{
	return cudnnGetConvolutionBackwardFilterAlgorithm_v7(c->dnn, cp->x, cp->y, cp->conv,
							     cp->w, n, count, perf);
}

/* The heuristic's list of N at most for the direction of Perf, and its
 * first usable algorithm in *algo (heuristic_usable). */
template <typename Perf, int N>
static loom_status heuristic_algo(const loom_plan *p, loom_cuda_ctx *c,
				  const loom_cuda_conv_plan *cp, int f32, int tf32, int *count,
				  int *algo, cudnnMathType_t *math)
{
	Perf perf[N];
	loom_status st = LOOM_CUDNN_CHECK(heuristic_list(c, cp, perf, N, count), c->err,
					  sizeof(c->err));
	if (st == LOOM_OK)
		*algo = heuristic_usable(p, perf, *count, f32, tf32, math);
	return st;
}

static loom_status pick_algo(const loom_plan *p, loom_cuda_ctx *c, const loom_node *n,
			     loom_cuda_conv_plan *cp, int f32)
{
	loom_status st;
	int count = 0, algo = -1;
	cudnnMathType_t math = CUDNN_DEFAULT_MATH;
	const int tf32 = f32 && loom_cuda_tf32_on(p);

	if (n->op == LOOM_OP_CONV2D)
		st = heuristic_algo<cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT>(
			p, c, cp, f32, tf32, &count, &algo, &math);
	else if (n->op == LOOM_OP_CONV2D_BWD_DATA)
		st = heuristic_algo<cudnnConvolutionBwdDataAlgoPerf_t,
				    CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT>(p, c, cp, f32, tf32,
									   &count, &algo, &math);
	else
		st = heuristic_algo<cudnnConvolutionBwdFilterAlgoPerf_t,
				    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT>(p, c, cp, f32, tf32,
									     &count, &algo, &math);
	if (st != LOOM_OK)
		return st;
	if (algo < 0) {
		char lb[96];
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_UNSUPPORTED,
				 "cuda conv: cuDNN offers no %s algorithm for %s (%d tried)",
				 f32 ? "f32" : "half", loom_node_label(p->g, (loom_value)(n - p->g->nodes),
								   lb, sizeof(lb)),
				 count);
	}
	cp->how = LOOM_CUDA_CONV_HOW_HEURISTIC;
	cp->heur_algo = algo;
	cp->ms = cp->heur_ms = 0;
	int h_algo = algo;
	cudnnMathType_t h_math = math;
	search_algo(p, c, n, cp, f32, tf32, &algo, &math);
	st = set_algo(c, n, cp, algo, math, f32 && !tf32);
	/* The measured choice's workspace over the cap (Find should not
	 * offer one): the heuristic's. */
	if (st == LOOM_OK && algo != h_algo && cp->ws > LOOM_CUDA_CONV_WS_MAX) {
		cp->how = LOOM_CUDA_CONV_HOW_FIND_FAILED;
		cp->ms = 0;
		st = set_algo(c, n, cp, h_algo, h_math, f32 && !tf32);
	}
	return st;
}

/* Sets algo and math on cp and asks its workspace size. exact: fp32
 * without TF32, which keeps FMA math even where cuDNN said DEFAULT (TF32
 * on sm_80+). */
static loom_status set_algo(loom_cuda_ctx *c, const loom_node *n, loom_cuda_conv_plan *cp, int algo,
			    cudnnMathType_t math, int exact)
{
	loom_status st;
	cp->algo = algo;
	if (exact)
		math = CUDNN_FMA_MATH;
	cp->math = (int)math;
	if ((st = LOOM_CUDNN_CHECK(cudnnSetConvolutionMathType(cp->conv, math), c->err, sizeof(c->err))) !=
	    LOOM_OK)
		return st;
	switch (n->op) {
	case LOOM_OP_CONV2D:
		return LOOM_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(
						c->dnn, cp->x, cp->w, cp->conv, cp->y,
						(cudnnConvolutionFwdAlgo_t)algo, &cp->ws),
					c->err, sizeof(c->err));
	case LOOM_OP_CONV2D_BWD_DATA:
		return LOOM_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(
						c->dnn, cp->w, cp->y, cp->conv, cp->x,
						(cudnnConvolutionBwdDataAlgo_t)algo, &cp->ws),
					c->err, sizeof(c->err));
	default:
		return LOOM_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
						c->dnn, cp->x, cp->y, cp->conv, cp->w,
						(cudnnConvolutionBwdFilterAlgo_t)algo, &cp->ws),
					c->err, sizeof(c->err));
	}
}

static void conv_operands(const loom_plan *p, loom_value v, int64_t numel[3]);

/* Whether operand i (sources 0, 1, 2 the output) of node n is its filter. */
static int is_filter(const loom_node *n, int i)
{
	return n->op == LOOM_OP_CONV2D_BWD_FILTER ? i == 2 : i == 1;
}

/* The format operand i of node n is held in. */
static loom_format held_in(const loom_plan *p, const loom_node *n, int i)
{
	return i == 2 ? n->format : p->g->nodes[n->src[i]].format;
}

/* The layout cuDNN runs node n in (the format planner's choice for its
 * result; a filter gradient, NCHW itself, follows dy), and the operands
 * that need a reorder into it or out of it: a filter always in NHWC
 * (loom keeps weights KCRS, cuDNN's NHWC kernels read KRSC). */
static void plan_layout(const loom_plan *p, const loom_node *n, loom_cuda_conv_plan *cp)
{
	loom_format f = n->op == LOOM_OP_CONV2D_BWD_FILTER ? held_in(p, n, 0) : n->format;
	cp->fmt = f == LOOM_FORMAT_NHWC ? LOOM_FORMAT_NHWC : LOOM_FORMAT_NCHW;
	for (int i = 0; i < 3; i++) {
		loom_format h = is_filter(n, i) ? LOOM_FORMAT_NCHW : held_in(p, n, i);
		cp->ro[i] = h != (loom_format)cp->fmt;
	}
}

size_t loom_cuda_conv_ro_ws(const loom_plan *p, loom_value v, loom_cuda_node_plan *np, size_t at)
{
	const loom_node *n = &p->g->nodes[v];
	int64_t numel[3];
	if (np->kind != LOOM_CUDA_PLAN_CONV)
		return at;
	conv_operands(p, v, numel);
	for (int i = 0; i < 3; i++) {
		np->conv.ro_off[i] = at;
		if (np->conv.ro[i])
			at += loom_cuda_align((size_t)numel[i] * loom_dtype_size(n->dtype));
	}
	return at;
}

/* Operand i (held as value w, shape s) from format `from` into `to`. */
static loom_status reorder_operand(loom_cuda_ctx *c, const loom_node *n, const loom_shape *s,
				   loom_format from, loom_format to, const void *x, void *y)
{
	return loom_cuda_reorder(c->err, c->stream, from, to, loom_dtype_size(n->dtype), s->dims[0],
				 s->dims[1], s->dims[2] * s->dims[3], x, y);
}

/* Descriptors and algorithm for node n in cp->fmt's layout. */
static loom_status plan_in_layout(const loom_plan *p, loom_cuda_ctx *c, const loom_node *n,
				  loom_cuda_conv_plan *cp)
{
	loom_status st;
	if ((st = set_descs(p, c, cp, n, loom_cudnn_data_type(n->dtype))) != LOOM_OK)
		return st;
	st = pick_algo(p, c, n, cp, n->dtype == LOOM_F32);
	/* A half convolution cuDNN's heuristic has no algorithm for (bf16 NCHW
	 * through the _v7 API may get none), or any half one under the test
	 * hook: the same convolution in f32 on copies (conv_f32_ws), cast
	 * back; only if f32 has none either is the node refused, by name. */
	if (n->dtype != LOOM_F32 &&
	    ((st == LOOM_ERR_UNSUPPORTED) || (st == LOOM_OK && loom_cuda_own_kernels_on))) {
		c->err[0] = 0;
		cp->f32 = 1;
		if ((st = set_descs(p, c, cp, n, CUDNN_DATA_FLOAT)) != LOOM_OK)
			return st;
		st = pick_algo(p, c, n, cp, 1);
	}
	return st;
}

loom_status loom_cuda_conv_plan_make(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
				     loom_cuda_node_plan *np)
{
	const loom_node *n = &p->g->nodes[v];
	loom_cuda_conv_plan *cp = &np->conv;
	loom_status st;

	np->kind = LOOM_CUDA_PLAN_CONV;
	plan_layout(p, n, cp);
	if ((st = LOOM_CUDNN_CHECK(cudnnCreateTensorDescriptor(&cp->x), c->err, sizeof(c->err))) != LOOM_OK)
		return st;
	if ((st = LOOM_CUDNN_CHECK(cudnnCreateTensorDescriptor(&cp->y), c->err, sizeof(c->err))) != LOOM_OK)
		return st;
	if ((st = LOOM_CUDNN_CHECK(cudnnCreateFilterDescriptor(&cp->w), c->err, sizeof(c->err))) != LOOM_OK)
		return st;
	if ((st = LOOM_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&cp->conv), c->err, sizeof(c->err))) !=
	    LOOM_OK)
		return st;
	st = plan_in_layout(p, c, n, cp);
	/* No algorithm in NHWC (the stem's 3 input channels, say): the same
	 * node in NCHW, its NHWC operands reordered in the workspace. */
	if (st == LOOM_ERR_UNSUPPORTED && cp->fmt == LOOM_FORMAT_NHWC) {
		c->err[0] = 0;
		cp->f32 = 0;
		cp->fmt = LOOM_FORMAT_NCHW;
		for (int i = 0; i < 3; i++)
			cp->ro[i] = (is_filter(n, i) ? LOOM_FORMAT_NCHW : held_in(p, n, i)) !=
				    LOOM_FORMAT_NCHW;
		st = plan_in_layout(p, c, n, cp);
	}
	if (st != LOOM_OK)
		return st;
	np->lib_ws = loom_cuda_align(cp->ws);
	return LOOM_OK;
}

/* The three operands of node v as the library sees them: sources 0 and 1
 * and the output, in numel. */
static void conv_operands(const loom_plan *p, loom_value v, int64_t numel[3])
{
	const loom_node *n = &p->g->nodes[v];
	numel[0] = loom_shape_numel(&p->g->nodes[n->src[0]].shape);
	numel[1] = loom_shape_numel(&p->g->nodes[n->src[1]].shape);
	numel[2] = loom_shape_numel(&n->shape);
}

size_t loom_cuda_conv_f32_ws(const loom_plan *p, loom_value v, loom_cuda_node_plan *np,
			     size_t at)
{
	int64_t numel[3];
	size_t off = at;

	if (np->kind != LOOM_CUDA_PLAN_CONV || !np->conv.f32)
		return at;
	conv_operands(p, v, numel);
	for (int i = 0; i < 3; i++) {
		np->conv.f32_off[i] = off;
		off += loom_cuda_align((size_t)numel[i] * sizeof(float));
	}
	return off;
}

void loom_cuda_conv_note(const loom_node *n, const loom_cuda_conv_plan *cp, char *buf, size_t len)
{
	static const char *const fwd[] = { "implicit_gemm", "implicit_precomp_gemm", "gemm", "direct",
					   "fft", "fft_tiling", "winograd", "winograd_nonfused" };
	static const char *const bwd_data[] = { "algo_0", "algo_1", "fft", "fft_tiling", "winograd",
						"winograd_nonfused" };
	static const char *const bwd_filter[] = { "algo_0", "algo_1", "fft", "algo_3", "winograd",
						  "winograd_nonfused", "fft_tiling" };
	static const char *const maths[] = { "default", "tensor_op", "tensor_op_allow_conversion",
					     "fma" };
	static const char *const how[] = {
		/* in the order of LOOM_CUDA_CONV_HOW_* */
		"heuristic: kernel search off",
		"measured",
		"measured earlier",
		"heuristic: search budget spent",
		"heuristic: no device memory for the search",
		"heuristic: cuDNN's Find gave nothing usable",
	};
	const char *const *names = n->op == LOOM_OP_CONV2D ? fwd : n->op == LOOM_OP_CONV2D_BWD_DATA ?
							       bwd_data : bwd_filter;
	int nn = n->op == LOOM_OP_CONV2D ? 8 : n->op == LOOM_OP_CONV2D_BWD_DATA ? 6 : 7;
	char name[32], hname[32];
	if (cp->algo >= 0 && cp->algo < nn)
		snprintf(name, sizeof(name), "%s", names[cp->algo]);
	else
		snprintf(name, sizeof(name), "%d", cp->algo);
	if (cp->heur_algo >= 0 && cp->heur_algo < nn)
		snprintf(hname, sizeof(hname), "%s", names[cp->heur_algo]);
	else
		snprintf(hname, sizeof(hname), "%d", cp->heur_algo);
	int nro = cp->ro[0] + cp->ro[1] + cp->ro[2];
	char lay[48] = "";
	if (cp->fmt == LOOM_FORMAT_NHWC || nro)
		snprintf(lay, sizeof(lay), " %s, %d operand%s reordered", cp->fmt == LOOM_FORMAT_NHWC ?
			 "nhwc" : "nchw", nro, nro == 1 ? "" : "s");
	int at = snprintf(buf, len, "cudnn algo %d %s%s%s, %s math, ws %.1f MiB (%s", cp->algo, name,
			  cp->f32 ? " in f32" : "", lay,
			  cp->math >= 0 && cp->math < 4 ? maths[cp->math] : "?",
			  (double)cp->ws / (1 << 20),
			  cp->how >= 0 && cp->how <= LOOM_CUDA_CONV_HOW_FIND_FAILED ? how[cp->how] : "?");
	if (at < 0 || (size_t)at >= len)
		return;
	if (cp->ms > 0)
		at += snprintf(buf + at, len - at, ": %.3f ms", (double)cp->ms);
	if ((size_t)at < len && cp->heur_ms > 0)
		at += snprintf(buf + at, len - at, "; heuristic's algo %d %s %.3f ms", cp->heur_algo,
			       hname, (double)cp->heur_ms);
	if ((size_t)at < len)
		at += snprintf(buf + at, len - at, ")");
	if ((size_t)at < len && cp->krsc_by != LOOM_NONE)
		snprintf(buf + at, len - at, ", filter KRSC kept for the step (made by %d)",
			 (int)cp->krsc_by);
}

/* Safe on a half-made plan: cuDNN destroy calls take NULL. */
void loom_cuda_conv_plan_free(loom_cuda_node_plan *np)
{
	loom_cuda_conv_plan *cp = &np->conv;
	if (cp->x)
		cudnnDestroyTensorDescriptor(cp->x);
	if (cp->y)
		cudnnDestroyTensorDescriptor(cp->y);
	if (cp->w)
		cudnnDestroyFilterDescriptor(cp->w);
	if (cp->conv)
		cudnnDestroyConvolutionDescriptor(cp->conv);
	memset(cp, 0, sizeof(*cp));
}

/* The library call of a convolution node on src (0, 1) into out. */
static loom_status conv_call(loom_cuda_ctx *c, loom_op op, const loom_cuda_conv_plan *cp,
			     void *const *src, void *out, void *ws)
{
	const float one = 1.0f, zero = 0.0f;

	switch (op) {
	case LOOM_OP_CONV2D:
		return LOOM_CUDNN_CHECK(cudnnConvolutionForward(c->dnn, &one, cp->x, src[0], cp->w,
								src[1], cp->conv,
								(cudnnConvolutionFwdAlgo_t)cp->algo,
								ws, cp->ws, &zero, cp->y, out),
					c->err, sizeof(c->err));
	case LOOM_OP_CONV2D_BWD_DATA:
		return LOOM_CUDNN_CHECK(cudnnConvolutionBackwardData(
						c->dnn, &one, cp->w, src[1], cp->y, src[0], cp->conv,
						(cudnnConvolutionBwdDataAlgo_t)cp->algo, ws, cp->ws,
						&zero, cp->x, out),
					c->err, sizeof(c->err));
	default:
		return LOOM_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
						c->dnn, &one, cp->x, src[1], cp->y, src[0], cp->conv,
						(cudnnConvolutionBwdFilterAlgo_t)cp->algo, ws, cp->ws,
						&zero, cp->w, out),
					c->err, sizeof(c->err));
	}
}

/* src: the node's sources after staging (all in the node's dtype but a
 * conv bias, which the bias kernel reads in its own). */
loom_status loom_cuda_conv_run(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
			       const loom_cuda_node_plan *np, void *const *src, void *out)
{
	const loom_node *n = &p->g->nodes[v];
	const loom_cuda_conv_plan *cp = &np->conv;
	void *ws = cp->ws ? c->arena->ws : NULL;
	void *lib_src[2] = { src[0], src[1] }, *lib_out = out;
	const loom_format lay = (loom_format)cp->fmt;
	loom_status st;

	/* Operands not in the layout cuDNN runs in: reordered copies (the
	 * filter KCRS -> KRSC in NHWC), in the node's dtype. */
	for (int i = 0; i < 2; i++) {
		if (!cp->ro[i])
			continue;
		const loom_node *s = &p->g->nodes[n->src[i]];
		void *dst = c->arena->ws + cp->ro_off[i];
		/* The filter's KRSC copy of this step (plan_conv_krsc): made
		 * by the first convolution that reads it, read by the rest. */
		if (is_filter(n, i) && cp->krsc_by != LOOM_NONE && c->saved) {
			dst = c->saved + cp->krsc_off;
			if (cp->krsc_by != v) {
				lib_src[i] = dst;
				continue;
			}
		}
		if ((st = reorder_operand(c, n, &s->shape, is_filter(n, i) ? LOOM_FORMAT_NCHW : s->format,
					  lay, lib_src[i], dst)) != LOOM_OK)
			return st;
		lib_src[i] = dst;
	}
	/* Where the library's result goes in the node's dtype: out, or the
	 * copy reordered into out after. */
	void *res = cp->ro[2] ? (void *)(c->arena->ws + cp->ro_off[2]) : out;
	lib_out = res;
	if (cp->f32) { /* the f32 fallback: copies in, the result cast back after */
		int64_t numel[3];
		conv_operands(p, v, numel);
		for (int i = 0; i < 2; i++) {
			void *dst = c->arena->ws + cp->f32_off[i];
			if ((st = loom_cuda_cast(c->err, c->stream, lib_src[i], n->dtype, dst, LOOM_F32,
						 numel[i])) != LOOM_OK)
				return st;
			lib_src[i] = dst;
		}
		lib_out = c->arena->ws + cp->f32_off[2];
	}
	st = conv_call(c, n->op, cp, lib_src, lib_out, ws);
	if (st == LOOM_OK && cp->f32)
		st = loom_cuda_cast(c->err, c->stream, lib_out, LOOM_F32, res, n->dtype,
				    loom_shape_numel(&n->shape));
	if (st == LOOM_OK && cp->ro[2])
		st = reorder_operand(c, n, &n->shape, lay,
				     is_filter(n, 2) ? LOOM_FORMAT_NCHW : n->format, res, out);
	if (st != LOOM_OK || n->op != LOOM_OP_CONV2D || n->nsrc < 3)
		return st;
	/* a bias: NCHW only (formats.c keeps such a convolution NCHW) */
	return loom_cuda_bias_add(c->err, c->stream, (int)n->shape.dims[0], (int)n->shape.dims[1],
				  n->shape.dims[2] * n->shape.dims[3], out, n->dtype, src[2],
				  p->g->nodes[n->src[2]].dtype);
}

// ----------------------------------------------------------------------------
// op entries: the three convolutions share the staging and the plan's call

loom_status loom_cuda_op_conv2d(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				const loom_cuda_io *io)
{
	return loom_cuda_run_staged(c, plan, v, io, loom_cuda_conv_run);
}

loom_status loom_cuda_op_conv2d_bwd_data(loom_cuda_ctx *c, const loom_plan *plan,
					 loom_value v, const loom_cuda_io *io)
{
	return loom_cuda_run_staged(c, plan, v, io, loom_cuda_conv_run);
}

loom_status loom_cuda_op_conv2d_bwd_filter(loom_cuda_ctx *c, const loom_plan *plan,
					   loom_value v, const loom_cuda_io *io)
{
	return loom_cuda_run_staged(c, plan, v, io, loom_cuda_conv_run);
}
