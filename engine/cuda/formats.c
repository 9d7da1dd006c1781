/*
 * engine/cuda/formats.c — the CUDA backend's memory formats (formats.h):
 * NHWC for the activations of cuDNN's convolutions and batch norm and the
 * elementwise ops between them, behind LOOM_CUDA_NHWC. Plain C: the
 * plugin's node_formats calls it, and a CPU test asks it without a GPU.
 */
#include <stdlib.h>
#include <string.h>

#include "base/options.h"
#include "engine/cuda/formats.h"
#include "graph/ops/ops.h"

loom_cuda_nhwc_mode loom_cuda_nhwc_mode_get(void)
{
	const char *e = loom_opt_env(LOOM_OPT_CUDA_NHWC);
	/* Off unless asked: NHWC measured 3-4x slower than NCHW for
	 * ResNet-50 on an H100 (bench/RESULTS.md, the fourth GPU run). */
	if (!e || !*e || !strcmp(e, "0") || !strcmp(e, "off"))
		return LOOM_CUDA_NHWC_OFF;
	if (!strcmp(e, "all") || !strcmp(e, "f32"))
		return LOOM_CUDA_NHWC_ALL;
	return LOOM_CUDA_NHWC_HALF;
}

int loom_cuda_bn_bf16_cudnn_on(void)
{
	const char *e = loom_opt_env(LOOM_OPT_CUDA_BN_BF16_CUDNN);
	return e && *e ? strcmp(e, "0") != 0 : loom_opt_bool(LOOM_OPT_CUDA_BN_BF16_CUDNN);
}

int loom_cuda_bn_cudnn_takes(const loom_plan *p, const loom_node *n)
{
	const loom_graph *g = p->g;
	const loom_node *x = &g->nodes[n->src[0]];
	/* bf16 data with f32 parameters is cuDNN's PSEUDO_BFLOAT16 config;
	 * behind its switch until a lease has run it. */
	const int bf16 = x->dtype == LOOM_BF16 && loom_cuda_bn_bf16_cudnn_on();
	if (x->shape.ndim != 4 || (x->dtype != LOOM_F32 && x->dtype != LOOM_F16 && !bf16))
		return 0;
	if (n->dtype != x->dtype)
		return 0;
	/* cuDNN 9's CUDNN_BN_MIN_EPSILON is 0 */
	if (n->op == LOOM_OP_BATCHNORM2D) {
		for (int i = 1; i < 5; i++)
			if (g->nodes[n->src[i]].dtype != LOOM_F32)
				return 0;
		return n->a.bn.eps >= 0.0;
	}
	/* BN_BWD_DATA (x, gamma, dy) -> dx */
	return g->nodes[n->src[1]].dtype == LOOM_F32 && g->nodes[n->src[2]].dtype == x->dtype &&
	       n->a.bn.eps >= 0.0;
}

static int is_half(loom_dtype d)
{
	return d == LOOM_F16 || d == LOOM_BF16;
}

/* Whether node n qualifies under mode: every node under "all"; under
 * "half", every node of a mixed-precision plan (O1's fp32 batch norm sits
 * between half convolutions) and any node with a half operand. */
static int wanted(const loom_plan *p, const loom_node *n, loom_cuda_nhwc_mode mode)
{
	if (mode == LOOM_CUDA_NHWC_OFF)
		return 0;
	if (mode == LOOM_CUDA_NHWC_ALL || p->opts.amp.level != LOOM_O0 || is_half(n->dtype))
		return 1;
	for (int i = 0; i < n->nsrc; i++)
		if (is_half(p->g->nodes[n->src[i]].dtype))
			return 1;
	return 0;
}

/* Elementwise: every source has the result's shape (no broadcast, whose
 * index arithmetic is NCHW's). */
static int same_shapes(const loom_graph *g, const loom_node *n)
{
	if (n->shape.ndim != 4)
		return 0;
	for (int i = 0; i < n->nsrc; i++)
		if (!loom_shape_eq(&g->nodes[n->src[i]].shape, &n->shape))
			return 0;
	return 1;
}

/* LOOM_CUDA_POOL_NHWC (1): global average pooling takes NHWC. */
static int pool_nhwc_on(void)
{
	return loom_opt_bool(LOOM_OPT_CUDA_POOL_NHWC);
}

/* Batch norm on cuDNN (forward or dx): the own kernels are NCHW. */
static int bn_on_cudnn(const loom_plan *p, const loom_node *n, int own_bn)
{
	return !own_bn && !n->a.bn.sync && !p->opts.sync_bn && loom_cuda_bn_cudnn_takes(p, n);
}

/* Each operand in NCHW or NHWC, the kernel reading them as they come;
 * the result NHWC. */
static void mixed_nhwc(loom_format_caps *caps)
{
	caps->accept = 1u << LOOM_FORMAT_NCHW | 1u << LOOM_FORMAT_NHWC;
	caps->mixed = 1;
	caps->prefer = LOOM_FORMAT_NHWC;
}

void loom_cuda_formats_query(const loom_plan *p, loom_value v, loom_format_caps *caps,
			     loom_cuda_nhwc_mode mode, int own_bn)
{
	const loom_graph *g = p->g;
	const loom_node *n = &g->nodes[v];
	const unsigned both = 1u << LOOM_FORMAT_NCHW | 1u << LOOM_FORMAT_NHWC;
	if (!wanted(p, n, mode))
		return;
	switch (n->op) {
	case LOOM_OP_CONV2D:
		/* the bias kernel and its gradient's channel sum are NCHW */
		if (n->nsrc > 2)
			return;
		/* fallthrough */
	case LOOM_OP_CONV2D_BWD_DATA:
	case LOOM_OP_CONV2D_BWD_FILTER:
		mixed_nhwc(caps);
		return;
	case LOOM_OP_BATCHNORM2D:
	case LOOM_OP_BN_BWD_DATA:
		if (bn_on_cudnn(p, n, own_bn))
			caps->accept = both;
		return;
	case LOOM_OP_BN_BWD_GAMMA:
	case LOOM_OP_CHANNEL_SUM: {
		/* Only as the siblings cuDNN's backward call writes (f32),
		 * which read nothing themselves. */
		loom_value m = n->made_by;
		if (m == LOOM_NONE || n->dtype != LOOM_F32 || g->nodes[m].op != LOOM_OP_BN_BWD_DATA ||
		    !bn_on_cudnn(p, &g->nodes[m], own_bn))
			return;
		caps->accept = both;
		return;
	}
	case LOOM_OP_MAXPOOL2D:
	case LOOM_OP_MAXPOOL2D_BWD:
		/* pool.cu's kernels take either; x, y, dy and dx share it */
		if (n->shape.ndim == 4)
			caps->accept = both;
		return;
	case LOOM_OP_GLOBAL_AVGPOOL:
	case LOOM_OP_GLOBAL_AVGPOOL_BWD:
		/* pool.cu reads x (writes dx) in either; y and dy are [N, C].
		 * LOOM_CUDA_POOL_NHWC=0: NCHW, a reorder before it (the old
		 * path). */
		if (pool_nhwc_on())
			mixed_nhwc(caps);
		return;
	case LOOM_OP_RELU:
	case LOOM_OP_RELU_BWD:
	case LOOM_OP_ADD:
	case LOOM_OP_CAST:
#define UNARY_CASE(NAME, low) case LOOM_OP_##NAME: case LOOM_OP_##NAME##_BWD:
		LOOM_UNARY_OPS(UNARY_CASE)
#undef UNARY_CASE
		if (same_shapes(g, n))
			caps->accept = both;
		return;
	case LOOM_OP_RESHAPE: /* a view: only where it keeps the shape */
		if (loom_shape_eq(&n->shape, &g->nodes[n->src[0]].shape))
			caps->accept = both;
		return;
	default:
		return;
	}
}
