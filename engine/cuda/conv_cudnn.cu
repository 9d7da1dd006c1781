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
 */
#include <stdio.h>
#include <string.h>

#include "engine/cuda/cuda_internal.h"

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

	if ((st = LOOM_CUDNN_CHECK(cudnnSetTensor4dDescriptor(cp->x, CUDNN_TENSOR_NCHW, dt,
							      (int)xd[0], (int)xd[1], (int)xd[2],
							      (int)xd[3]),
				   c->err, sizeof(c->err))) != LOOM_OK)
		return st;
	if ((st = LOOM_CUDNN_CHECK(cudnnSetTensor4dDescriptor(cp->y, CUDNN_TENSOR_NCHW, dt,
							      (int)yd[0], (int)yd[1], (int)yd[2],
							      (int)yd[3]),
				   c->err, sizeof(c->err))) != LOOM_OK)
		return st;
	if ((st = LOOM_CUDNN_CHECK(cudnnSetFilter4dDescriptor(cp->w, dt, CUDNN_TENSOR_NCHW,
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
		return loom_errf(c->err, LOOM_ERR_SHAPE,
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

static loom_status pick_algo(const loom_plan *p, loom_cuda_ctx *c, const loom_node *n,
			     loom_cuda_conv_plan *cp, int f32)
{
	loom_status st;
	int count = 0, algo = -1;
	cudnnMathType_t math = CUDNN_DEFAULT_MATH;
	const int tf32 = f32 && loom_cuda_tf32_on(p);

	switch (n->op) {
	case LOOM_OP_CONV2D: {
		cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
		st = LOOM_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(
					      c->dnn, cp->x, cp->w, cp->conv, cp->y,
					      CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perf),
				      c->err, sizeof(c->err));
		if (st != LOOM_OK)
			return st;
		algo = first_usable(perf, count, f32, tf32, &math);
		break;
	}
	case LOOM_OP_CONV2D_BWD_DATA: {
		cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
		st = LOOM_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
					      c->dnn, cp->w, cp->y, cp->conv, cp->x,
					      CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, perf),
				      c->err, sizeof(c->err));
		if (st != LOOM_OK)
			return st;
		algo = first_usable(perf, count, f32, tf32, &math);
		break;
	}
	default: {
		cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
		st = LOOM_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
					      c->dnn, cp->x, cp->y, cp->conv, cp->w,
					      CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, perf),
				      c->err, sizeof(c->err));
		if (st != LOOM_OK)
			return st;
		algo = first_usable(perf, count, f32, tf32, &math);
		break;
	}
	}
	if (algo < 0) {
		char lb[96];
		return loom_errf(c->err, LOOM_ERR_UNSUPPORTED,
				 "cuda conv: cuDNN offers no %s algorithm for %s (%d tried)",
				 f32 ? "f32" : "half", loom_node_label(p->g, (loom_value)(n - p->g->nodes),
								   lb, sizeof(lb)),
				 count);
	}
	cp->algo = algo;
	/* Exact fp32 keeps FMA math even where the heuristic said DEFAULT,
	 * which may mean TF32 on sm_80+. */
	if (f32 && !tf32)
		math = CUDNN_FMA_MATH;
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

loom_status loom_cuda_conv_plan_make(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
				     loom_cuda_node_plan *np)
{
	const loom_node *n = &p->g->nodes[v];
	loom_cuda_conv_plan *cp = &np->conv;
	loom_status st;

	np->kind = LOOM_CUDA_PLAN_CONV;
	if ((st = LOOM_CUDNN_CHECK(cudnnCreateTensorDescriptor(&cp->x), c->err, sizeof(c->err))) != LOOM_OK)
		return st;
	if ((st = LOOM_CUDNN_CHECK(cudnnCreateTensorDescriptor(&cp->y), c->err, sizeof(c->err))) != LOOM_OK)
		return st;
	if ((st = LOOM_CUDNN_CHECK(cudnnCreateFilterDescriptor(&cp->w), c->err, sizeof(c->err))) != LOOM_OK)
		return st;
	if ((st = LOOM_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&cp->conv), c->err, sizeof(c->err))) !=
	    LOOM_OK)
		return st;
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
		if ((st = set_descs(p, c, cp, n, CUDNN_DATA_FLOAT)) != LOOM_OK ||
		    (st = pick_algo(p, c, n, cp, 1)) != LOOM_OK)
			return st;
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
	loom_status st;

	if (cp->f32) { /* the f32 fallback: copies in, the result cast back after */
		int64_t numel[3];
		conv_operands(p, v, numel);
		for (int i = 0; i < 2; i++) {
			lib_src[i] = c->arena->ws + cp->f32_off[i];
			if ((st = loom_cuda_cast(c->err, c->stream, src[i], n->dtype, lib_src[i],
						 LOOM_F32, numel[i])) != LOOM_OK)
				return st;
		}
		lib_out = c->arena->ws + cp->f32_off[2];
	}
	st = conv_call(c, n->op, cp, lib_src, lib_out, ws);
	if (st == LOOM_OK && cp->f32)
		st = loom_cuda_cast(c->err, c->stream, lib_out, LOOM_F32, out, n->dtype,
				    loom_shape_numel(&n->shape));
	if (st != LOOM_OK || n->op != LOOM_OP_CONV2D || n->nsrc < 3)
		return st;
	return loom_cuda_bias_add(c->err, c->stream, (int)n->shape.dims[0], (int)n->shape.dims[1],
				  n->shape.dims[2] * n->shape.dims[3], out, n->dtype, src[2],
				  p->g->nodes[n->src[2]].dtype);
}

// ----------------------------------------------------------------------------
// op entries: the three convolutions share the staging and the plan's call

static loom_status conv_entry(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
			      const loom_cuda_io *io)
{
	void *src[LOOM_MAX_SRC];
	memcpy(src, io->src, sizeof(src));
	loom_status st = loom_cuda_stage_sources(c, plan, v, src);
	return st != LOOM_OK ? st : loom_cuda_conv_run(plan, c, v, &c->plans[v], src, io->out);
}

loom_status loom_cuda_op_conv2d(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				const loom_cuda_io *io)
{
	return conv_entry(c, plan, v, io);
}

loom_status loom_cuda_op_conv2d_bwd_data(loom_cuda_ctx *c, const loom_plan *plan,
					 loom_value v, const loom_cuda_io *io)
{
	return conv_entry(c, plan, v, io);
}

loom_status loom_cuda_op_conv2d_bwd_filter(loom_cuda_ctx *c, const loom_plan *plan,
					   loom_value v, const loom_cuda_io *io)
{
	return conv_entry(c, plan, v, io);
}
