/*
 * engine/cpu/ops_conv.c — the CPU entries of the convolution ops: forward,
 * and the data and filter gradients, on the geometry graph/ops/geometry.h
 * derives once for both backends. Each f32 conv node runs either oneDNN's
 * convolution primitive (conv_dnnl.c, made once when the plan is) or loom's
 * im2col + GEMM kernels (conv_impl.h), whichever measured faster for its
 * shape (bench/RESULTS.md, bench_conv).
 */
#include <stdlib.h>
#include <string.h>

#include "engine/cpu/cpu_path.h"
#include "engine/cpu/ops.h"

static size_t align64(size_t x)
{
	return (x + 63) & ~(size_t)63;
}

size_t loom_cpu_conv_workspace(const loom_plan *plan, loom_value v, size_t elem)
{
	loom_conv_shape s;
	loom_conv_shape_of(plan->g, v, &s);
	return align64(loom_cpu_conv2d_workspace(&s, elem));
}

size_t loom_cpu_conv_node_ws(const loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			     size_t elem)
{
	size_t ws = loom_cpu_conv_workspace(plan, v, elem);
	if (ctx->conv && ctx->conv[v]) {
		size_t d = align64(loom_cpu_dnnl_conv_ws(ctx->conv[v]));
		if (d > ws)
			ws = d;
	}
	return ws;
}

static int conv_kind(loom_op op, loom_cpu_conv_kind *kind)
{
	switch (op) {
	case LOOM_OP_CONV2D:
		*kind = LOOM_CPU_CONV_FWD;
		return 1;
	case LOOM_OP_CONV2D_BWD_DATA:
		*kind = LOOM_CPU_CONV_BWD_DATA;
		return 1;
	case LOOM_OP_CONV2D_BWD_FILTER:
		*kind = LOOM_CPU_CONV_BWD_FILTER;
		return 1;
	default:
		return 0;
	}
}

/*
 * Where oneDNN's direct convolution (its blocked layouts, with the reorders
 * from and to NCHW inside the node) beat im2col + GEMM in bench_conv
 * (bench/RESULTS.md) on the ConvNet's and the CIFAR ResNet-18's layers:
 * every spatial kernel with 8 or more input channels, and on AVX-512 also
 * the filter gradient of a layer with a few (the ConvNet's conv1, a ResNet
 * stem). For a few input channels the im2col matrix is small and the
 * reorders dominate; on AVX2 oneDNN's filter gradient there was 2-5x slower.
 * On AVX2 (bench_conv --set resnet50 and resnet50-1x1, AMD EPYC family 25,
 * one thread) two more go to oneDNN's blocked primitives: ResNet's 224 stem
 * forward (3 channels, 7x7, stride 2), where im2col makes a matrix 49 times
 * the image and oneDNN ran 2-3x faster (its filter gradient did not, and its
 * data gradient is never needed: the image has none); and the data gradient
 * of a 1x1 layer with 1024 or more input channels (ResNet-50's stages 3 and
 * 4), which on loom's path is one GEMM per image with a short side of 49 to
 * 196 and ran 2-3.5x slower than oneDNN's blocked kernel (18-21 against
 * 39-67 ms at batch 8). Neither was measured on AVX-512: there they stay.
 * Other 1x1 layers are a plain GEMM on loom's path already, as fast as
 * oneDNN's or faster. LOOM_CPU_CONV=im2col keeps every node on loom's
 * kernels, to measure the two side by side.
 */
static int conv_wants_dnnl(loom_cpu_conv_kind kind, const loom_conv_shape *s)
{
	const char *e = getenv("LOOM_CPU_CONV");
	if (e && !strcmp(e, "im2col"))
		return 0;
	int avx2 = loom_cpu_isa_get() == LOOM_CPU_ISA_AVX2;
	if (s->kh == 1 && s->kw == 1)
		return avx2 && kind == LOOM_CPU_CONV_BWD_DATA && s->c_in >= 1024;
	return s->c_in >= 8 ||
	       (kind == LOOM_CPU_CONV_BWD_FILTER && loom_cpu_isa_get() >= LOOM_CPU_ISA_AVX512) ||
	       (avx2 && kind == LOOM_CPU_CONV_FWD && s->kh >= 7 && s->h_out >= 56);
}

loom_status loom_cpu_conv_plan(loom_cpu_ctx *ctx, const loom_plan *plan)
{
	const loom_graph *g = plan->g;
	loom_cpu_conv_unplan(ctx);
	for (int v = 0; v < g->n; v++) {
		const loom_node *n = &g->nodes[v];
		loom_cpu_conv_kind kind;
		loom_conv_shape s;
		if (!conv_kind(n->op, &kind) || loom_cpu_kernel_dtype(n) != LOOM_F32)
			continue;
		loom_conv_shape_of(g, v, &s);
		if (!conv_wants_dnnl(kind, &s))
			continue;
		if (!ctx->conv) {
			ctx->conv = calloc((size_t)g->n, sizeof(*ctx->conv));
			if (!ctx->conv)
				return loom_errf(ctx->err, LOOM_ERR_NOMEM,
						 "out of memory for %d conv primitives", g->n);
			ctx->n_conv = g->n;
		}
		/* NULL where oneDNN has no primitive (or the path is the
		 * portable one): the node keeps the im2col kernels. */
		ctx->conv[v] = loom_cpu_dnnl_conv_new(kind, &s, 0,
						      kind == LOOM_CPU_CONV_FWD && n->nsrc > 2, 1);
	}
	return LOOM_OK;
}

void loom_cpu_conv_unplan(loom_cpu_ctx *ctx)
{
	for (int v = 0; ctx->conv && v < ctx->n_conv; v++)
		loom_cpu_dnnl_conv_free(ctx->conv[v]);
	free(ctx->conv);
	ctx->conv = NULL;
	ctx->n_conv = 0;
}

/* Runs node v on its primitive if it has one; 0 if it did. */
static int run_dnnl(loom_cpu_ctx *ctx, loom_value v, const loom_cpu_io *io, const void *bias)
{
	if (!ctx->conv || !ctx->conv[v])
		return -1;
	return loom_cpu_dnnl_conv_run(ctx->conv[v], io->src[0], io->src[1], bias, io->out,
				      io->ws);
}

loom_status loom_cpu_op_conv2d(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
			       const loom_cpu_io *io)
{
	const loom_node *n = &plan->g->nodes[v];
	const void *bias = n->nsrc > 2 ? io->src[2] : NULL;
	loom_conv_shape cs;
	if (run_dnnl(ctx, v, io, bias) == 0)
		return LOOM_OK;
	loom_conv_shape_of(plan->g, v, &cs);
	if (loom_cpu_kernel_dtype(n) == LOOM_F64)
		loom_cpu_conv2d_fwd_f64(&cs, io->src[0], io->src[1], bias, io->out, io->ws);
	else
		loom_cpu_conv2d_fwd_f32(&cs, io->src[0], io->src[1], bias, io->out, io->ws);
	return LOOM_OK;
}

loom_status loom_cpu_op_conv2d_bwd_data(loom_cpu_ctx *ctx, const loom_plan *plan, loom_value v,
					const loom_cpu_io *io)
{
	loom_conv_shape cs;
	if (run_dnnl(ctx, v, io, NULL) == 0)
		return LOOM_OK;
	loom_conv_shape_of(plan->g, v, &cs);
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(&plan->g->nodes[v]), loom_cpu_conv2d_bwd_data, &cs,
			  io->src[0], io->src[1], io->out, io->ws);
	return LOOM_OK;
}

loom_status loom_cpu_op_conv2d_bwd_filter(loom_cpu_ctx *ctx, const loom_plan *plan,
					  loom_value v, const loom_cpu_io *io)
{
	loom_conv_shape cs;
	if (run_dnnl(ctx, v, io, NULL) == 0)
		return LOOM_OK;
	loom_conv_shape_of(plan->g, v, &cs);
	LOOM_CPU_DISPATCH(loom_cpu_kernel_dtype(&plan->g->nodes[v]), loom_cpu_conv2d_bwd_filter,
			  &cs, io->src[0], io->src[1], io->out, io->ws);
	return LOOM_OK;
}
