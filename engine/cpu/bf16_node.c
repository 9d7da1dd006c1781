/*
 * engine/cpu/bf16_node.c — the CPU backend's one hook for native bf16: a
 * conv, linear or matmul node whose two matrix sources are bf16 runs on the
 * bf16 kernels of conv_bf16.c (fp32 accumulation) instead of being widened
 * to f32 first, when the CPU multiplies bf16 itself (avx512_bf16).
 *
 * On where cpu_path.c chose native bf16 at start-up (loom_cpu_bf16_use_native:
 * the core's measured vdpbf16ps rate at 1.5x its fp32 FMA rate or more, or
 * LOOM_CPU_BF16=native). With Debian's oneDNN 2.6 the bf16 GEMM
 * (dnnl_gemm_bf16bf16f32, and the bf16 matmul primitive alike) ran at about
 * half the fp32 GEMM's rate on the ConvNet's and ResNet-50's shapes on an
 * avx512_bf16 machine whose core issues vdpbf16ps at half its FMA rate
 * (bench/bf16_peak; bench/RESULTS.md): there bf16 keeps the exact
 * emulation, which is faster.
 */

#include "base/half.h"
#include "engine/cpu/bf16_node.h"
#include "engine/cpu/cpu_path.h"
#include "engine/cpu/kernels.h"

static size_t align64(size_t x)
{
	return (x + 63) & ~(size_t)63;
}

static const loom_node *src_of(const loom_plan *p, const loom_node *n, int i)
{
	return &p->g->nodes[n->src[i]];
}

int loom_cpu_bf16_node(const loom_plan *p, loom_value v, void *const *src, void *out, void *ws)
{
	const loom_node *n = &p->g->nodes[v];
	int conv = n->op == LOOM_OP_CONV2D || n->op == LOOM_OP_CONV2D_BWD_DATA ||
		   n->op == LOOM_OP_CONV2D_BWD_FILTER;

	if (!conv && n->op != LOOM_OP_LINEAR && n->op != LOOM_OP_MATMUL)
		return 0;
	if (!loom_cpu_bf16_use_native())
		return 0;
	if (n->nsrc < 2 || src_of(p, n, 0)->dtype != LOOM_BF16 ||
	    src_of(p, n, 1)->dtype != LOOM_BF16 ||
	    (n->dtype != LOOM_F32 && n->dtype != LOOM_BF16) || !loom_cpu_bf16_native())
		return 0;
	const loom_node *bn = n->nsrc > 2 ? src_of(p, n, 2) : NULL;
	if (bn && bn->dtype != LOOM_F32 && bn->dtype != LOOM_BF16)
		return 0;

	/* The scratch the backend reserved for the emulation (conv workspace,
	 * then f32 copies of the half sources and of the result) holds the
	 * f32 result and an f32 bias with room to spare. */
	loom_conv_shape cs;
	char *scratch = ws;
	if (conv) {
		loom_conv_shape_of(p->g, v, &cs);
		scratch += align64(loom_cpu_conv2d_workspace(&cs, 4));
	}
	int64_t numel = loom_shape_numel(&n->shape);
	float *y = n->dtype == LOOM_F32 ? out : (float *)scratch;
	if (n->dtype != LOOM_F32)
		scratch += align64(4 * (size_t)numel);
	const float *b = NULL;
	if (bn && bn->dtype == LOOM_BF16) {
		loom_bf16_to_f32_array(src[2], (float *)scratch, loom_shape_numel(&bn->shape));
		b = (const float *)scratch;
	} else if (bn) {
		b = src[2];
	}

	const loom_node *x = src_of(p, n, 0);
	int rc;
	switch (n->op) {
	case LOOM_OP_CONV2D:
		rc = loom_cpu_conv2d_fwd_bf16(&cs, src[0], src[1], b, y, ws);
		break;
	case LOOM_OP_CONV2D_BWD_DATA:
		rc = loom_cpu_conv2d_bwd_data_bf16(&cs, src[0], src[1], y, ws);
		break;
	case LOOM_OP_CONV2D_BWD_FILTER:
		rc = loom_cpu_conv2d_bwd_filter_bf16(&cs, src[0], src[1], y, ws);
		break;
	case LOOM_OP_LINEAR: {
		int rows = (int)loom_shape_rows(&x->shape), out_f = (int)loom_shape_last(&n->shape);
		for (int i = 0; b && i < rows; i++)
			for (int j = 0; j < out_f; j++)
				y[(int64_t)i * out_f + j] = b[j];
		rc = loom_cpu_gemm_bf16f32(0, 1, rows, out_f, (int)loom_shape_last(&x->shape), 1, src[0],
					   src[1], b ? 1 : 0, y);
		if (rc == 0 && n->a.mm.relu) /* fused (graph/fuse.c), before rounding */
			loom_cpu_relu_fwd_f32(numel, y, y);
		break;
	}
	default: { /* MATMUL */
		int ta = n->a.mm.ta, tb = n->a.mm.tb;
		int k = (int)(ta ? loom_shape_rows(&x->shape) : loom_shape_last(&x->shape));
		rc = loom_cpu_gemm_bf16f32(ta, tb, (int)loom_shape_rows(&n->shape),
					   (int)loom_shape_last(&n->shape), k,
					   1, src[0], src[1], 0, y);
		break;
	}
	}
	if (rc != 0)
		return 0; /* nothing written that the emulation does not rewrite */
	if (n->dtype == LOOM_BF16)
		loom_f32_to_bf16_array(y, out, numel);
	return 1;
}
