/*
 * engine/cpu/ops_format.c — memory formats on the CPU: which formats each
 * node runs in (what the format pass, graph/formats.c, asks), and the
 * reorder node's entry. oneDNN's convolutions take NCHW or nChw8c for each
 * operand (conv_dnnl.c); batch norm, the per-channel sum and max pooling
 * have nChw8c loops (blocked.c); relu, add, casts and views are
 * elementwise, so any format serves when their operands agree.
 */
#include "engine/cpu/blocked.h"
#include "engine/cpu/cpu_path.h"
#include "engine/cpu/ops.h"

loom_status loom_cpu_op_reorder(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
				const loom_cpu_io *io)
{
	const loom_node *n = &plan->g->nodes[v];
	const loom_node *x = &plan->g->nodes[n->src[0]];
	(void)ctx;
	loom_cpu_reorder(x->format, n->format, loom_dtype_size(n->dtype), (int)n->shape.dims[0],
			 (int)n->shape.dims[1], n->shape.dims[2] * n->shape.dims[3], io->src[0],
			 io->out);
	return LOOM_OK;
}

static int has_half(const loom_plan *plan, const loom_node *n)
{
	if (n->dtype == LOOM_F16 || n->dtype == LOOM_BF16)
		return 1;
	for (int i = 0; i < n->nsrc; i++) {
		loom_dtype d = plan->g->nodes[n->src[i]].dtype;
		if (d == LOOM_F16 || d == LOOM_BF16)
			return 1;
	}
	return 0;
}

void loom_cpu_node_formats(void *ctx, const loom_plan *plan, loom_value v, loom_format_caps *caps)
{
	const loom_node *n = &plan->g->nodes[v];
	const unsigned both = 1u << LOOM_FORMAT_NCHW | 1u << LOOM_FORMAT_NCHW8C;
	(void)ctx;
	/* oneDNN is the reason for the blocked format: none on the portable
	 * path; f64 runs loom's NCHW kernels. */
	if (loom_cpu_isa_get() == LOOM_CPU_ISA_PORTABLE || loom_cpu_kernel_dtype(n) == LOOM_F64)
		return;
	switch (n->op) {
	case LOOM_OP_CONV2D:
	case LOOM_OP_CONV2D_BWD_DATA:
	case LOOM_OP_CONV2D_BWD_FILTER: {
		/* native bf16 convolutions (conv_bf16.c) read NCHW */
		if (loom_cpu_isa_get() == LOOM_CPU_ISA_AVX512_BF16 && has_half(plan, n))
			return;
		/* oneDNN's convolution takes each operand NCHW or blocked. On
		 * NCHW alone the kernel is the one it would have been (the
		 * search's or the fixed default); the result is blocked where
		 * that kernel is oneDNN's blocked one, or where the input can be
		 * blocked (C a multiple of 8): a 1x1 convolution that ran im2col
		 * on NCHW between blocked neighbours then runs oneDNN's blocked
		 * kernel with no reorder on either side. */
		loom_cpu_kern k = loom_cpu_kern_choice(plan, v);
		const loom_node *x = &plan->g->nodes[n->src[n->op == LOOM_OP_CONV2D_BWD_FILTER]];
		int c_in = (int)(n->op == LOOM_OP_CONV2D_BWD_DATA ? n->shape.dims[1] : x->shape.dims[1]);
		if (k != LOOM_CPU_KERN_DNNL_NCHW && k != LOOM_CPU_KERN_DNNL_BLOCKED &&
		    (k != LOOM_CPU_KERN_IM2COL || c_in % 8))
			return;
		caps->accept = both;
		caps->mixed = 1;
		caps->prefer = k == LOOM_CPU_KERN_DNNL_NCHW ? LOOM_FORMAT_NCHW : LOOM_FORMAT_NCHW8C;
		return;
	}
	case LOOM_OP_BATCHNORM2D:
	case LOOM_OP_BN_BWD_DATA:
	case LOOM_OP_BN_BWD_GAMMA:
		/* synchronised sums run on NCHW (ops_bn.c); parallel/ddp.c marks
		 * the nodes sync after this pass, so the option decides */
		if (!n->a.bn.sync && !plan->opts.sync_bn)
			caps->accept = both;
		return;
	case LOOM_OP_CHANNEL_SUM:
		if (plan->g->nodes[n->src[0]].shape.ndim == 4)
			caps->accept = both;
		return;
	case LOOM_OP_MAXPOOL2D:
	case LOOM_OP_MAXPOOL2D_BWD:
	case LOOM_OP_RELU:
	case LOOM_OP_RELU_BWD:
	case LOOM_OP_ADD:
	case LOOM_OP_CAST:
	case LOOM_OP_FP8_QDQ: /* elementwise; its amax is the same in any order */
		caps->accept = both;
		return;
	case LOOM_OP_RESHAPE: /* a view: only where it keeps the shape */
		if (loom_shape_eq(&n->shape, &plan->g->nodes[n->src[0]].shape))
			caps->accept = both;
		return;
	default:
		return;
	}
}
