/*
 * engine/cuda/pool.cu — 2-D max pooling forward and backward, and global
 * average pooling. CPU twins: engine/cpu/pool_impl.h for the max pool, with
 * the same rules: windows clipped to the image (padding never wins),
 * row-major scan with a strict '>' so ties go to the first element, the
 * first NaN wins, and a fused relu (attrs.pool.relu, graph/fuse.c) gives
 * y = relu(max) with NaN kept and routes dy only where the window's max is
 * > 0; loom_cpu_global_avgpool_fwd/bwd in engine/cpu/elementwise_impl.h for
 * the average (a double sum per plane, as there).
 *
 * Both formats the planner gives a CUDA value, NCHW and NHWC (the node's
 * format: x, y, dy and dx alike), one thread per element in memory order.
 *
 * The forward saves each output's argmax (a byte: its place in the window)
 * in the slot the backend's plan gives it (fuse_plan.cu, plan_saved), and the
 * backward gathers dy through it without reading x (where the plan gave no
 * slot, the backward finds the argmax again from x).
 *
 * Own kernels rather than cudnnPoolingForward/Backward: cuDNN's backward
 * needs the forward output y, which the graph's MAXPOOL2D_BWD (x, dy) does
 * not have, and its choice among tied maxima is unspecified, so half inputs
 * (where ties are common) would route gradients differently from the CPU.
 */
#include "engine/cuda/dtype.cuh"

// ----------------------------------------------------------------------------
// CUDA kernels

/* Where element i (h * w + w) of plane pl (n * c + ch) of a [n, c, hw]
 * value lies: NCHW, or NHWC (the planner's format, engine/cuda/formats.c). */
template <bool NHWC>
static __device__ __forceinline__ int64_t plane_at(int c, int64_t hw, int64_t pl, int64_t i)
{
	if (NHWC)
		return ((pl / c) * hw + i) * c + pl % c;
	return pl * hw + i;
}

/* An element's plane (n * c + ch) and place (h, w) in the plane. */
struct pool_elem {
	int64_t pl;
	int h, w;
};

/* Element e of a [n, c, h, w] value in its memory order -> its plane and
 * place in the plane; threads next to each other take elements next to
 * each other in memory (coalesced) in either format. */
template <bool NHWC>
static __device__ __forceinline__ pool_elem elem_of(int c, int h, int w, int64_t e)
{
	if (NHWC) {
		int ch = (int)(e % c);
		int64_t r = e / c;
		return { (r / ((int64_t)w * h)) * c + ch, (int)((r / w) % h), (int)(r % w) };
	}
	return { e / ((int64_t)w * h), (int)((e / w) % h), (int)(e % w) };
}

/* Flat index in the plane of the max of window (oh, ow), or -1. */
template <bool NHWC>
static __device__ int64_t pool_argmax(const loom_pool_shape &s, const void *x, int xdt,
				      int64_t pl, int oh, int ow)
{
	const int64_t hw = (int64_t)s.h_in * s.w_in;
	int h0 = oh * s.stride - s.pad, w0 = ow * s.stride - s.pad;
	int hlo = h0 < 0 ? 0 : h0, hhi = h0 + s.k < s.h_in ? h0 + s.k : s.h_in;
	int wlo = w0 < 0 ? 0 : w0, whi = w0 + s.k < s.w_in ? w0 + s.k : s.w_in;
	if (hlo >= hhi || wlo >= whi)
		return -1;
	int64_t best = (int64_t)hlo * s.w_in + wlo;
	float bv = loom_ld(x, xdt, plane_at<NHWC>(s.c, hw, pl, best));
	for (int ih = hlo; ih < hhi; ih++) {
		for (int iw = wlo; iw < whi; iw++) {
			int64_t i = (int64_t)ih * s.w_in + iw;
			float v = loom_ld(x, xdt, plane_at<NHWC>(s.c, hw, pl, i));
			if (v > bv || (v != v && bv == bv)) {
				bv = v;
				best = i;
			}
		}
	}
	return best;
}

/* One thread per output element (o: its place in y's memory). SAVE: the
 * forward saving each output's argmax, idx[o] the max's place in its
 * window, (ih - h0) k + (iw - w0), or 255 where no gradient goes (an empty
 * window, or under the fused relu a max that is not > 0). */
template <bool NHWC, bool SAVE>
__global__ void loom_maxpool_fwd_kernel(loom_pool_shape s, const void *x, int xdt,
					void *y, int ydt, unsigned char *idx, int64_t total)
{
	const int64_t hw = (int64_t)s.h_in * s.w_in;
	for (int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; o < total;
	     o += (int64_t)gridDim.x * blockDim.x) {
		const auto [pl, oh, ow] = elem_of<NHWC>(s.c, s.h_out, s.w_out, o);
		int64_t i = pool_argmax<NHWC>(s, x, xdt, pl, oh, ow);
		float v = i < 0 ? -INFINITY : loom_ld(x, xdt, plane_at<NHWC>(s.c, hw, pl, i));
		int route = i >= 0 && (!s.relu || v > 0.0f);
		/* relu(max) = max(relu), on the smaller output; NaN stays. */
		if (s.relu && !(v > 0.0f || v != v))
			v = 0.0f;
		loom_st(y, ydt, o, v);
		if (SAVE) {
			int h0 = oh * s.stride - s.pad, w0 = ow * s.stride - s.pad;
			idx[o] = route ? (unsigned char)(((int)(i / s.w_in) - h0) * s.k +
							 ((int)(i % s.w_in) - w0)) :
					 (unsigned char)255;
		}
	}
}

/* The windows (oh, ow) that hold input element (ih, iw): oh*stride - pad
 * <= ih < oh*stride - pad + k, within the output (likewise ow). */
__device__ static void pool_windows(loom_pool_shape s, int ih, int iw, int *oh_lo, int *oh_hi,
				    int *ow_lo, int *ow_hi)
{
	int th = ih + s.pad - s.k, tw = iw + s.pad - s.k;
	*oh_lo = th < 0 ? 0 : th / s.stride + 1;
	*ow_lo = tw < 0 ? 0 : tw / s.stride + 1;
	*oh_hi = min((ih + s.pad) / s.stride, s.h_out - 1);
	*ow_hi = min((iw + s.pad) / s.stride, s.w_out - 1);
}

/* Whether input element (ih, iw) of plane pl is the max of window (oh, ow)
 * that its gradient goes to: SAVED, by the forward's idx (x is not read;
 * the fused relu is in idx, 255); else found again from x. */
template <bool NHWC, bool SAVED>
static __device__ __forceinline__ bool pool_is_max(const loom_pool_shape &s, const void *x,
						   int xdt, const unsigned char *idx, int64_t pl,
						   int ih, int iw, int oh, int ow)
{
	if (SAVED) {
		int64_t o = plane_at<NHWC>(s.c, (int64_t)s.h_out * s.w_out, pl,
					   (int64_t)oh * s.w_out + ow);
		return idx[o] == (ih - (oh * s.stride - s.pad)) * s.k + (iw - (ow * s.stride - s.pad));
	}
	return pool_argmax<NHWC>(s, x, xdt, pl, oh, ow) == (int64_t)ih * s.w_in + iw;
}

/* One thread per input element (e: its place in dx's memory): it gathers
 * dy from every window whose max it is, in the CPU's (oh, ow) order so
 * that fp32 sums match exactly; SAVED: through the forward's idx. */
template <bool NHWC, bool SAVED>
__global__ void loom_maxpool_bwd_kernel(loom_pool_shape s, const void *x, int xdt,
					const unsigned char *idx, const void *dy, int dydt,
					void *dx, int dxdt, int64_t total)
{
	const int64_t ohw = (int64_t)s.h_out * s.w_out;
	for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
	     e += (int64_t)gridDim.x * blockDim.x) {
		const auto [pl, ih, iw] = elem_of<NHWC>(s.c, s.h_in, s.w_in, e);
		/* Fused relu, found again: dy reaches a window's max only if it
		 * is > 0, and this element is the max of every window it
		 * gathers from. */
		if (!SAVED && s.relu && !(loom_ld(x, xdt, e) > 0.0f)) {
			loom_st(dx, dxdt, e, 0.0f);
			continue;
		}
		int oh_lo, oh_hi, ow_lo, ow_hi;
		pool_windows(s, ih, iw, &oh_lo, &oh_hi, &ow_lo, &ow_hi);
		float g = 0.0f;
		for (int oh = oh_lo; oh <= oh_hi; oh++)
			for (int ow = ow_lo; ow <= ow_hi; ow++)
				if (pool_is_max<NHWC, SAVED>(s, x, xdt, idx, pl, ih, iw, oh, ow))
					g += loom_ld(dy, dydt,
						     plane_at<NHWC>(s.c, ohw, pl, (int64_t)oh * s.w_out + ow));
		loom_st(dx, dxdt, e, g);
	}
}

/* One warp per (n, c) plane, grid-stride over planes: lanes stride over the
 * plane with a double accumulator, then a shuffle sum. The plane index is
 * uniform across a warp, so every lane takes part in the shuffle. */
__global__ void loom_global_avgpool_fwd_kernel(const void *x, int xdt, void *y, int ydt,
					       int64_t nc, int64_t hw)
{
	const int lane = threadIdx.x & 31;
	const int64_t wpb = blockDim.x >> 5;
	for (int64_t pl = blockIdx.x * wpb + (threadIdx.x >> 5); pl < nc;
	     pl += (int64_t)gridDim.x * wpb) {
		double s = 0;
		for (int64_t i = lane; i < hw; i += 32)
			s += loom_ld(x, xdt, pl * hw + i);
		for (int o = 16; o > 0; o >>= 1)
			s += __shfl_down_sync(0xffffffffu, s, o);
		if (lane == 0)
			loom_st(y, ydt, pl, (float)(s / (double)hw));
	}
}

/* NHWC (LOOM_CUDA_POOL_NHWC): one thread per (n, c), adjacent threads on
 * adjacent channels (coalesced), each summing its hw values c apart in a
 * double, as the NCHW kernel does. */
__global__ void loom_global_avgpool_nhwc_fwd_kernel(const void *x, int xdt, void *y, int ydt,
						    int64_t nc, int64_t c, int64_t hw)
{
	for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < nc;
	     e += (int64_t)gridDim.x * blockDim.x) {
		const int64_t img = e / c, ch = e % c, base = img * hw * c + ch;
		double s = 0;
		for (int64_t i = 0; i < hw; i++)
			s += loom_ld(x, xdt, base + i * c);
		loom_st(y, ydt, e, (float)(s / (double)hw));
	}
}

/* NHWC backward: dx[n, i, c] = dy[n, c] / hw, one thread per element. */
__global__ void loom_global_avgpool_nhwc_bwd_kernel(const void *dy, int dydt, void *dx, int dxdt,
						    int64_t total, int64_t c, int64_t hw)
{
	for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
	     e += (int64_t)gridDim.x * blockDim.x) {
		const int64_t nc = e / (hw * c) * c + e % c;
		loom_st(dx, dxdt, e, (float)((double)loom_ld(dy, dydt, nc) / (double)hw));
	}
}

/* One thread per input element: dx = dy of its plane / hw. */
__global__ void loom_global_avgpool_bwd_kernel(const void *dy, int dydt, void *dx, int dxdt,
					       int64_t total, int64_t hw)
{
	for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
	     e += (int64_t)gridDim.x * blockDim.x)
		loom_st(dx, dxdt, e, (float)((double)loom_ld(dy, dydt, e / hw) / (double)hw));
}

// ----------------------------------------------------------------------------
// kernel launchers

static const int threads = 256;

/* KERNEL<nhwc, WITH_IDX> on TOTAL threads' worth of blocks. */
#define POOL_LAUNCH(KERNEL, WITH_IDX, TOTAL, ...)                                             \
	do {                                                                                   \
		if (nhwc)                                                                      \
			KERNEL<true, WITH_IDX><<<loom_cuda_blocks(TOTAL, threads), threads, 0, s>>>( \
				__VA_ARGS__);                                                  \
		else                                                                           \
			KERNEL<false, WITH_IDX><<<loom_cuda_blocks(TOTAL, threads), threads, 0, s>>>( \
				__VA_ARGS__);                                                  \
	} while (0)

extern "C" loom_status loom_cuda_maxpool_fwd(char *err, cudaStream_t s,
					     loom_pool_shape ps, const void *x, int xdt,
					     void *y, int ydt, unsigned char *idx, int nhwc)
{
	int64_t total = (int64_t)ps.n * ps.c * ps.h_out * ps.w_out;
	if (total <= 0)
		return LOOM_OK;
	if (idx)
		POOL_LAUNCH(loom_maxpool_fwd_kernel, true, total, ps, x, xdt, y, ydt, idx, total);
	else
		POOL_LAUNCH(loom_maxpool_fwd_kernel, false, total, ps, x, xdt, y, ydt, idx, total);
	return LOOM_CUDA_LAUNCHED(err);
}

extern "C" loom_status loom_cuda_maxpool_bwd(char *err, cudaStream_t s,
					     loom_pool_shape ps, const void *x, int xdt,
					     const unsigned char *idx, const void *dy, int dydt,
					     void *dx, int dxdt, int nhwc)
{
	int64_t total = (int64_t)ps.n * ps.c * ps.h_in * ps.w_in;
	if (total <= 0)
		return LOOM_OK;
	if (idx)
		POOL_LAUNCH(loom_maxpool_bwd_kernel, true, total, ps, x, xdt, idx, dy, dydt, dx,
			    dxdt, total);
	else
		POOL_LAUNCH(loom_maxpool_bwd_kernel, false, total, ps, x, xdt, idx, dy, dydt, dx,
			    dxdt, total);
	return LOOM_CUDA_LAUNCHED(err);
}

extern "C" loom_status loom_cuda_global_avgpool(char *err, cudaStream_t s, int fwd, int nhwc,
						const void *x, int xdt, void *y, int ydt,
						int64_t n, int64_t c, int64_t hw)
{
	const int64_t nc = n * c, total = nc * hw;
	if (fwd ? nc <= 0 : total <= 0)
		return LOOM_OK;
	if (fwd && nhwc)
		loom_global_avgpool_nhwc_fwd_kernel<<<loom_cuda_blocks(nc, threads), threads, 0, s>>>(
			x, xdt, y, ydt, nc, c, hw);
	else if (fwd)
		loom_global_avgpool_fwd_kernel<<<loom_cuda_blocks(nc, threads / 32), threads, 0, s>>>(
			x, xdt, y, ydt, nc, hw);
	else if (nhwc)
		loom_global_avgpool_nhwc_bwd_kernel<<<loom_cuda_blocks(total, threads), threads, 0,
						      s>>>(x, xdt, y, ydt, total, c, hw);
	else
		loom_global_avgpool_bwd_kernel<<<loom_cuda_blocks(total, threads), threads, 0, s>>>(
			x, xdt, y, ydt, total, hw);
	return LOOM_CUDA_LAUNCHED(err);
}

// ----------------------------------------------------------------------------
// op entries

loom_status loom_cuda_op_maxpool2d(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				   const loom_cuda_io *io)
{
	loom_pool_shape ps;
	loom_pool_shape_of(plan->g, v, &ps);
	int nhwc = plan->g->nodes[v].format == LOOM_FORMAT_NHWC;
	unsigned char *idx = (unsigned char *)loom_cuda_saved_slot(c, v, v);
	return loom_cuda_maxpool_fwd(c->err, c->stream, ps, io->src[0], io->dt[0], io->out, io->odt,
				     idx, nhwc);
}

loom_status loom_cuda_op_maxpool2d_bwd(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				       const loom_cuda_io *io)
{
	loom_pool_shape ps;
	loom_pool_shape_of(plan->g, v, &ps);
	/* The forward's argmax, saved in this (training) run; else found
	 * again from x. */
	const unsigned char *idx =
		c->train ? (const unsigned char *)loom_cuda_saved_slot(c, v, LOOM_NONE) : NULL;
	/* x, dy and dx share the node's format (formats.c) */
	int nhwc = plan->g->nodes[v].format == LOOM_FORMAT_NHWC;
	return loom_cuda_maxpool_bwd(c->err, c->stream, ps, io->src[0], io->dt[0], idx, io->src[1],
				     io->dt[1], io->out, io->odt, nhwc);
}

/* Global average pooling, forward or backward, of the [N, C, H, W] value
 * img (x, or dx) in its format: NCHW or NHWC (formats.c,
 * LOOM_CUDA_POOL_NHWC); the other side is [N, C]. */
static loom_status global_avgpool(loom_cuda_ctx *c, const loom_cuda_io *io, const loom_node *img,
				  int fwd)
{
	const int64_t *d = img->shape.dims;
	return loom_cuda_global_avgpool(c->err, c->stream, fwd, img->format == LOOM_FORMAT_NHWC,
					io->src[0], io->dt[0], io->out, io->odt, d[0], d[1],
					d[2] * d[3]);
}

/* x [N, C, H, W] -> [N, C] */
loom_status loom_cuda_op_global_avgpool(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
					const loom_cuda_io *io)
{
	return global_avgpool(c, io, &plan->g->nodes[plan->g->nodes[v].src[0]], 1);
}

/* dy [N, C] -> dx [N, C, H, W] */
loom_status loom_cuda_op_global_avgpool_bwd(loom_cuda_ctx *c, const loom_plan *plan,
					    loom_value v, const loom_cuda_io *io)
{
	return global_avgpool(c, io, &plan->g->nodes[v], 0);
}
