/*
 * engine/cuda/elementwise.cu — casts, relu, add (with a fused relu), sum,
 * scalar broadcast, per-channel sums, the conv bias add, the gradient seed
 * and the diagnose check. CPU twins: engine/cpu/elementwise_impl.h, loom_cpu_channel_sum in
 * engine/cpu/bn_impl.h, run_cast and GRAD_SEED in engine/cpu/backend.c.
 * Every kernel reads any float dtype as fp32 and rounds its result once.
 */
#include "engine/cuda/dtype.cuh"

// ----------------------------------------------------------------------------
// CUDA kernels

__global__ void loom_cast_kernel(const void *x, int xdt, void *y, int ydt, int64_t n)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x)
		loom_st(y, ydt, i, loom_ld(x, xdt, i));
}

__global__ void loom_relu_fwd_kernel(const void *x, int xdt, void *y, int ydt, int64_t n)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		float v = loom_ld(x, xdt, i);
		loom_st(y, ydt, i, v < 0.0f ? 0.0f : v); /* NaN passes through */
	}
}

__global__ void loom_relu_bwd_kernel(const void *x, int xdt, const void *dy, int dydt,
				     void *dx, int dxdt, int64_t n)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x)
		loom_st(dx, dxdt, i, loom_ld(x, xdt, i) > 0.0f ? loom_ld(dy, dydt, i) : 0.0f);
}

/* Every unary op of graph/unary.h: one kernel per row (its function
 * inlined), forward (dy NULL) or backward; amax not NULL: the max |y|
 * stored, into it (loom_amax_commit: an FP8 cast's amax, fp8.cu). */
#define UNARY_KERNEL(NAME, low)                                                              \
	__global__ void loom_unary_##low##_kernel(const void *x, int xdt, const void *dy,    \
						  int dydt, void *y, int ydt, int64_t n,      \
						  int attr, unsigned *amax)                   \
	{                                                                                     \
		float ym = 0.0f;                                                              \
		for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;      \
		     i += (int64_t)gridDim.x * blockDim.x) {                                  \
			float g = dy ? loom_ld(dy, dydt, i) : 0.0f, v = loom_ld(x, xdt, i);   \
			const float r = loom_unary_##low##_f32(v, g, dy != NULL, attr);       \
			const float a = fabsf(loom_stored(ydt, r));                           \
			ym = a > ym ? a : ym;                                                 \
			loom_st(y, ydt, i, r);                                                \
		}                                                                             \
		loom_amax_commit(amax, ym);                                                   \
	}
LOOM_UNARY_OPS(UNARY_KERNEL)
#undef UNARY_KERNEL

/* relu: a fused relu (attrs.ew.relu, graph/fuse.c), applied in fp32 before
 * the one rounding, as the CPU applies it before rounding to half. */
__global__ void loom_add_kernel(const void *a, int adt, const void *b, int bdt, void *y,
				int ydt, int64_t n, int relu)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		float v = loom_ld(a, adt, i) + loom_ld(b, bdt, i);
		loom_st(y, ydt, i, relu && v < 0.0f ? 0.0f : v); /* NaN passes through */
	}
}

// ----------------------------------------------------------------------------
// 128-bit paths (issue 30 item 5): where every operand is the same half
// dtype (f16 or bf16) and 16-byte aligned, each thread loads and stores 8
// elements at once (uint4), the conversions and the arithmetic the same as
// the scalar kernels' per element (fp32, one rounding to nearest even), so
// both paths give the same bits; the n % 8 tail runs scalar in the same
// launch. loom_cuda_vec_on (LOOM_CUDA_VEC=0 at plan time: the scalar
// kernels alone) chooses. Compiled, not yet run.

int loom_cuda_vec_on = 1;
static const int threads = 256;

template <typename H> static __device__ __forceinline__ float vec_ld(H h);
template <> __device__ __forceinline__ float vec_ld<__half>(__half h)
{
	return __half2float(h);
}
template <> __device__ __forceinline__ float vec_ld<__nv_bfloat16>(__nv_bfloat16 h)
{
	return __bfloat162float(h);
}
template <typename H> static __device__ __forceinline__ H vec_st(float x);
template <> __device__ __forceinline__ __half vec_st<__half>(float x)
{
	return __float2half_rn(x);
}
template <> __device__ __forceinline__ __nv_bfloat16 vec_st<__nv_bfloat16>(float x)
{
	return __float2bfloat16_rn(x);
}

/* y[i] = op(a[i], b[i]) (b NULL: op(a[i], 0)), 8 at a time; amax not
 * NULL: the max |y| stored, into it (loom_amax_commit). */
template <typename H, typename Op>
__global__ void loom_vec8_kernel(const H *a, const H *b, H *y, int64_t n, Op op, unsigned *amax)
{
	const int64_t nv = n / 8, stride = (int64_t)gridDim.x * blockDim.x;
	const int64_t first = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
	float ym = 0.0f;
	for (int64_t i = first; i < nv; i += stride) {
		uint4 ra = ((const uint4 *)a)[i], rb = make_uint4(0, 0, 0, 0), ry;
		if (b)
			rb = ((const uint4 *)b)[i];
		const H *ha = (const H *)&ra, *hb = (const H *)&rb;
		H *hy = (H *)&ry;
#pragma unroll
		for (int k = 0; k < 8; k++) {
			hy[k] = vec_st<H>(op(vec_ld<H>(ha[k]), b ? vec_ld<H>(hb[k]) : 0.0f));
			const float m = fabsf(vec_ld<H>(hy[k]));
			ym = m > ym ? m : ym;
		}
		((uint4 *)y)[i] = ry;
	}
	for (int64_t i = nv * 8 + first; i < n; i += stride) {
		y[i] = vec_st<H>(op(vec_ld<H>(a[i]), b ? vec_ld<H>(b[i]) : 0.0f));
		const float m = fabsf(vec_ld<H>(y[i]));
		ym = m > ym ? m : ym;
	}
	loom_amax_commit(amax, ym);
}

struct vec_relu_fwd {
	__device__ float operator()(float v, float) const
	{
		return v < 0.0f ? 0.0f : v; /* NaN passes through */
	}
};
struct vec_relu_bwd { /* (x, dy) */
	__device__ float operator()(float x, float dy) const
	{
		return x > 0.0f ? dy : 0.0f;
	}
};
struct vec_add {
	int relu;
	__device__ float operator()(float a, float b) const
	{
		float v = a + b;
		return relu && v < 0.0f ? 0.0f : v;
	}
};
#define UNARY_VEC_OP(NAME, low)                                                   \
	struct vec_unary_##low {                                                   \
		int bwd, attr;                                                     \
		__device__ float operator()(float v, float g) const                \
		{                                                                  \
			return loom_unary_##low##_f32(v, g, bwd, attr);            \
		}                                                                  \
	};
LOOM_UNARY_OPS(UNARY_VEC_OP)
#undef UNARY_VEC_OP

/* Whether the 128-bit path takes these operands: switch on, one half
 * dtype throughout, 16-byte aligned, at least 8 elements. */
static int vec_takes(int64_t n, int dt, const void *a, int adt, const void *b, int bdt,
		     const void *y, int ydt)
{
	if (!loom_cuda_vec_on || n < 8 || (dt != LOOM_F16 && dt != LOOM_BF16))
		return 0;
	if (adt != dt || ydt != dt || (b && bdt != dt))
		return 0;
	return (((uintptr_t)a | (uintptr_t)b | (uintptr_t)y) & 15) == 0;
}

template <typename Op>
static loom_status vec_launch(char *err, cudaStream_t s, int dt, const void *a, const void *b,
			      void *y, int64_t n, Op op, unsigned *amax = NULL)
{
	const unsigned blocks = loom_cuda_blocks((n + 7) / 8, threads);
	if (dt == LOOM_F16)
		loom_vec8_kernel<__half><<<blocks, threads, 0, s>>>(
			(const __half *)a, (const __half *)b, (__half *)y, n, op, amax);
	else
		loom_vec8_kernel<__nv_bfloat16><<<blocks, threads, 0, s>>>(
			(const __nv_bfloat16 *)a, (const __nv_bfloat16 *)b, (__nv_bfloat16 *)y, n, op,
			amax);
	return LOOM_CUDA_LAUNCHED(err);
}

/* The sum in two launches: each of `blocks` blocks sums a fixed grid-stride
 * share of x in double into part[block], then one block folds the parts in
 * order. The partition depends on n alone, so the result is the same bits
 * every run (the CPU sums in double too: the fp32 results agree to the last
 * ulp or so). One block over all of x read 67M elements at about 20 GB/s on
 * an H200 (13 ms: half of gpt_ddp's measured matmul "peak"). */
__global__ void loom_sum_part_kernel(const void *x, int xdt, int64_t n, double *part)
{
	double s = 0;
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x)
		s += loom_ld(x, xdt, i);
	s = loom_block_sum(s);
	if (threadIdx.x == 0)
		part[blockIdx.x] = s;
}

__global__ void loom_sum_fold_kernel(const double *part, int nparts, void *y, int ydt)
{
	double s = 0;
	for (int i = threadIdx.x; i < nparts; i += blockDim.x)
		s += part[i];
	s = loom_block_sum(s);
	if (threadIdx.x == 0)
		loom_st(y, ydt, 0, (float)s);
}

/* y may alias x: every thread reads *x before the block's first write, and
 * only one block is launched when they alias (see the launcher). */
__global__ void loom_broadcast_kernel(const void *x, int xdt, double scale, void *y, int ydt,
				      int64_t n)
{
	const float v = (float)((double)loom_ld(x, xdt, 0) * scale);
	__syncthreads();
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x)
		loom_st(y, ydt, i, v);
}

/* One block per channel. */
__global__ void loom_channel_sum_kernel(int n, int c, int64_t hw, const void *x, int xdt,
					void *y, int ydt)
{
	const int ch = blockIdx.x;
	const int64_t m = (int64_t)n * hw;
	double s = 0;
	for (int64_t k = threadIdx.x; k < m; k += blockDim.x) {
		int64_t i = k / hw, j = k - i * hw;
		s += loom_ld(x, xdt, (i * c + ch) * hw + j);
	}
	s = loom_block_sum(s);
	if (threadIdx.x == 0)
		loom_st(y, ydt, ch, (float)s);
}

/*
 * LOOM_CUDA_BGRAD=kernel: the column sums of a [rows, c] matrix (a
 * linear's bias gradient, outside the weight gradient's product, as
 * llm.c computes it), in fp32 through loom_colsum_part (dtype.cuh: each
 * warp reads 32 columns side by side, coalesced, where the
 * one-block-per-channel kernel above reads one column down the rows) and
 * loom_colsum_fold_kernel.
 */
__global__ void loom_colsum_part_kernel(int64_t rows, int64_t per, int c, const void *x, int xdt,
					float *part)
{
	loom_colsum_part<float>(
		rows, per, c, [=](int64_t r, int j) { return loom_ld(x, xdt, r * c + j); }, part);
}

__global__ void loom_bias_add_kernel(int c, int64_t hw, int64_t total, void *y, int ydt,
				     const void *b, int bdt)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
	     i += (int64_t)gridDim.x * blockDim.x) {
		int ch = (int)((i / hw) % c);
		loom_st(y, ydt, i, loom_ld(y, ydt, i) + loom_ld(b, bdt, ch));
	}
}

__global__ void loom_grad_seed_kernel(const loom_cuda_ctl *ctl, void *y, int ydt)
{
	loom_st(y, ydt, 0, ctl->scaler.scale);
}

__global__ void loom_mark_nonfinite_kernel(const void *x, int xdt, int64_t n, int node,
					   loom_cuda_ctl *ctl)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		if (!isfinite(loom_ld(x, xdt, i))) {
			atomicCAS(&ctl->first_nonfinite, -1, node);
			return;
		}
	}
}

// ----------------------------------------------------------------------------
// kernel launchers


extern "C" loom_status loom_cuda_cast(char *err, cudaStream_t s, const void *x, int xdt,
				      void *y, int ydt, int64_t n)
{
	if (n <= 0)
		return LOOM_OK;
	loom_cast_kernel<<<loom_cuda_blocks(n, threads), threads, 0, s>>>(x, xdt, y, ydt, n);
	return LOOM_CUDA_LAUNCHED(err);
}

extern "C" loom_status loom_cuda_relu_fwd(char *err, cudaStream_t s, const void *x,
					  int xdt, void *y, int ydt, int64_t n)
{
	if (n <= 0)
		return LOOM_OK;
	if (vec_takes(n, ydt, x, xdt, NULL, 0, y, ydt))
		return vec_launch(err, s, ydt, x, NULL, y, n, vec_relu_fwd());
	loom_relu_fwd_kernel<<<loom_cuda_blocks(n, threads), threads, 0, s>>>(x, xdt, y, ydt, n);
	return LOOM_CUDA_LAUNCHED(err);
}

extern "C" loom_status loom_cuda_relu_bwd(char *err, cudaStream_t s, const void *x,
					  int xdt, const void *dy, int dydt, void *dx, int dxdt,
					  int64_t n)
{
	if (n <= 0)
		return LOOM_OK;
	if (vec_takes(n, dxdt, x, xdt, dy, dydt, dx, dxdt))
		return vec_launch(err, s, dxdt, x, dy, dx, n, vec_relu_bwd());
	loom_relu_bwd_kernel<<<loom_cuda_blocks(n, threads), threads, 0, s>>>(x, xdt, dy, dydt,
									       dx, dxdt, n);
	return LOOM_CUDA_LAUNCHED(err);
}

extern "C" loom_status loom_cuda_add(char *err, cudaStream_t s, const void *a, int adt,
				     const void *b, int bdt, void *y, int ydt, int64_t n, int relu)
{
	if (n <= 0)
		return LOOM_OK;
	if (vec_takes(n, ydt, a, adt, b, bdt, y, ydt)) {
		vec_add op;
		op.relu = relu;
		return vec_launch(err, s, ydt, a, b, y, n, op);
	}
	loom_add_kernel<<<loom_cuda_blocks(n, threads), threads, 0, s>>>(a, adt, b, bdt, y, ydt,
									  n, relu);
	return LOOM_CUDA_LAUNCHED(err);
}

/* The parts' count for n elements: one per 16K elements, at most
 * LOOM_CUDA_SUM_PARTS, at least 1. */
static int sum_parts(int64_t n)
{
	int64_t b = (n + 16383) / 16384;
	return b < 1 ? 1 : b > LOOM_CUDA_SUM_PARTS ? LOOM_CUDA_SUM_PARTS : (int)b;
}

extern "C" loom_status loom_cuda_sum(char *err, cudaStream_t s, const void *x, int xdt,
				     int64_t n, void *y, int ydt, double *part)
{
	const int nb = sum_parts(n);
	loom_status st;
	loom_sum_part_kernel<<<nb, 1024, 0, s>>>(x, xdt, n, part);
	if ((st = LOOM_CUDA_LAUNCHED(err)) != LOOM_OK)
		return st;
	loom_sum_fold_kernel<<<1, 256, 0, s>>>(part, nb, y, ydt);
	return LOOM_CUDA_LAUNCHED(err);
}

extern "C" loom_status loom_cuda_broadcast_scalar(char *err, cudaStream_t s,
						  const void *x, int xdt, double scale, void *y,
						  int ydt, int64_t n)
{
	if (n <= 0)
		return LOOM_OK;
	/* In place (y == x, n == 1) one block keeps the read before the write. */
	unsigned blocks = x == y ? 1 : loom_cuda_blocks(n, threads);
	loom_broadcast_kernel<<<blocks, threads, 0, s>>>(x, xdt, scale, y, ydt, n);
	return LOOM_CUDA_LAUNCHED(err);
}

extern "C" loom_status loom_cuda_channel_sum(char *err, cudaStream_t s, int n, int c,
					     int64_t hw, const void *x, int xdt, void *y, int ydt)
{
	if (c <= 0)
		return LOOM_OK;
	loom_channel_sum_kernel<<<c, threads, 0, s>>>(n, c, hw, x, xdt, y, ydt);
	return LOOM_CUDA_LAUNCHED(err);
}

/* LOOM_CUDA_BGRAD=kernel, read when a plan is made (default 0: the
 * bias gradient in the product's BGRADB epilogue). Compiled, not yet run
 * on a GPU. */
int loom_cuda_bgrad_kernel_on;

/* The column sums' chunking: at most LOOM_COLSUM_CHUNKS chunks of at
 * least 64 rows. */
#define LOOM_COLSUM_CHUNKS 64
static void colsum_chunks(int64_t rows, int64_t *per, int *chunks)
{
	int64_t p = (rows + LOOM_COLSUM_CHUNKS - 1) / LOOM_COLSUM_CHUNKS;
	if (p < 64)
		p = 64;
	*per = p;
	*chunks = (int)((rows + p - 1) / p);
}

/* Whether channel-sum node v takes the column kernel: the switch on, a
 * 2-D source ([rows, c]: a linear's dy seen as rows). */
static int colsum_takes(const loom_plan *p, loom_value v)
{
	const loom_node *x = &p->g->nodes[p->g->nodes[v].src[0]];
	return loom_cuda_bgrad_kernel_on && x->shape.ndim == 2 && x->shape.dims[0] > 0 &&
	       x->shape.dims[1] > 0;
}

/* The plan's choice (np->colsum) and its parts' workspace: the run takes
 * the path its ws was sized for, whatever a later plan set the switch to. */
void loom_cuda_colsum_plan(const loom_plan *p, loom_value v, loom_cuda_node_plan *np)
{
	np->colsum = colsum_takes(p, v);
	np->ws = 0;
	if (!np->colsum)
		return;
	const loom_node *x = &p->g->nodes[p->g->nodes[v].src[0]];
	int64_t per;
	int chunks;
	colsum_chunks(x->shape.dims[0], &per, &chunks);
	np->ws = loom_cuda_align(sizeof(float) * (size_t)chunks * (size_t)x->shape.dims[1]);
}

static loom_status colsum(loom_cuda_ctx *c, int64_t rows, int cc, const loom_cuda_io *io)
{
	int64_t per;
	int chunks;
	colsum_chunks(rows, &per, &chunks);
	float *part = (float *)c->arena->ws;
	dim3 grid((unsigned)((cc + LOOM_COLSUM_COLS - 1) / LOOM_COLSUM_COLS), (unsigned)chunks);
	dim3 block(LOOM_COLSUM_COLS, LOOM_COLSUM_LANES);
	loom_colsum_part_kernel<<<grid, block, 0, c->stream>>>(rows, per, cc, io->src[0], io->dt[0],
							       part);
	loom_status st = LOOM_CUDA_LAUNCHED(c->err);
	if (st != LOOM_OK)
		return st;
	loom_colsum_fold_kernel<<<loom_cuda_blocks(cc, threads), threads, 0, c->stream>>>(
		chunks, cc, part, io->out, io->odt);
	return LOOM_CUDA_LAUNCHED(c->err);
}

extern "C" loom_status loom_cuda_bias_add(char *err, cudaStream_t s, int n, int c,
					  int64_t hw, void *y, int ydt, const void *b, int bdt)
{
	int64_t total = (int64_t)n * c * hw;
	if (total <= 0)
		return LOOM_OK;
	loom_bias_add_kernel<<<loom_cuda_blocks(total, threads), threads, 0, s>>>(c, hw, total, y,
										   ydt, b, bdt);
	return LOOM_CUDA_LAUNCHED(err);
}

extern "C" loom_status loom_cuda_grad_seed(char *err, cudaStream_t s,
					   const loom_cuda_ctl *ctl, void *y, int ydt)
{
	loom_grad_seed_kernel<<<1, 1, 0, s>>>(ctl, y, ydt);
	return LOOM_CUDA_LAUNCHED(err);
}

extern "C" loom_status loom_cuda_mark_nonfinite(char *err, cudaStream_t s, const void *x,
						int xdt, int64_t n, int node, loom_cuda_ctl *ctl)
{
	if (n <= 0 || (xdt != LOOM_F32 && xdt != LOOM_F16 && xdt != LOOM_BF16))
		return LOOM_OK;
	loom_mark_nonfinite_kernel<<<loom_cuda_blocks(n, threads), threads, 0, s>>>(x, xdt, n,
										     node, ctl);
	return LOOM_CUDA_LAUNCHED(err);
}

// ----------------------------------------------------------------------------
// op entries

static int64_t numel_of(const loom_plan *plan, loom_value v)
{
	return loom_shape_numel(&plan->g->nodes[v].shape);
}

loom_status loom_cuda_op_cast(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
			      const loom_cuda_io *io)
{
	return loom_cuda_cast(c->err, c->stream, io->src[0], io->dt[0], io->out, io->odt,
			      numel_of(plan, v));
}

loom_status loom_cuda_op_relu(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
			      const loom_cuda_io *io)
{
	return loom_cuda_relu_fwd(c->err, c->stream, io->src[0], io->dt[0], io->out, io->odt,
				  numel_of(plan, v));
}

/* Every unary op (graph/unary.h), forward or (two sources) backward. */
loom_status loom_cuda_op_unary(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
			       const loom_cuda_io *io)
{
	const loom_node *nd = &plan->g->nodes[v];
	int64_t n = numel_of(plan, v);
	int bwd = nd->nsrc > 1;
	unsigned *amax = NULL; /* an FP8 cast's amax this kernel gives (fp8.cu) */
	loom_status st = loom_cuda_fp8_amax_begin(c, v, &amax);
	if (st != LOOM_OK || n <= 0)
		return st;
	if (vec_takes(n, io->odt, io->src[0], io->dt[0], bwd ? io->src[1] : NULL,
		      bwd ? io->dt[1] : 0, io->out, io->odt)) {
		switch (nd->op) {
#define UNARY_VEC_LAUNCH(NAME, low)                                                        \
	case LOOM_OP_##NAME:                                                                \
	case LOOM_OP_##NAME##_BWD: {                                                        \
		vec_unary_##low op;                                                         \
		op.bwd = bwd;                                                               \
		op.attr = nd->a.ew.tanh;                                                    \
		return vec_launch(c->err, c->stream, io->odt, io->src[0],                   \
				  bwd ? io->src[1] : NULL, io->out, n, op, amax);           \
	}
			LOOM_UNARY_OPS(UNARY_VEC_LAUNCH)
#undef UNARY_VEC_LAUNCH
		default:
			break;
		}
	}
	switch (nd->op) {
#define UNARY_LAUNCH(NAME, low)                                                              \
	case LOOM_OP_##NAME:                                                                  \
	case LOOM_OP_##NAME##_BWD:                                                            \
		loom_unary_##low##_kernel<<<loom_cuda_blocks(n, threads), threads, 0, c->stream>>>( \
			io->src[0], io->dt[0], bwd ? io->src[1] : NULL, bwd ? io->dt[1] : 0,   \
			io->out, io->odt, n, nd->a.ew.tanh, amax);                            \
		break;
		LOOM_UNARY_OPS(UNARY_LAUNCH)
#undef UNARY_LAUNCH
	default:
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_UNSUPPORTED, "cuda: op %d is not a unary op",
				 (int)nd->op);
	}
	return LOOM_CUDA_LAUNCHED(c->err);
}

loom_status loom_cuda_op_relu_bwd(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				  const loom_cuda_io *io)
{
	return loom_cuda_relu_bwd(c->err, c->stream, io->src[0], io->dt[0], io->src[1], io->dt[1],
				  io->out, io->odt, numel_of(plan, v));
}

loom_status loom_cuda_op_add(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
			     const loom_cuda_io *io)
{
	loom_status st;
	if (loom_cuda_ln_residual(c, plan, v, io, &st)) /* with its layer norm (layernorm.cu) */
		return st;
	return loom_cuda_add(c->err, c->stream, io->src[0], io->dt[0], io->src[1], io->dt[1],
			     io->out, io->odt, numel_of(plan, v), plan->g->nodes[v].a.ew.relu);
}

loom_status loom_cuda_op_sum(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
			     const loom_cuda_io *io)
{
	return loom_cuda_sum(c->err, c->stream, io->src[0], io->dt[0],
			     numel_of(plan, plan->g->nodes[v].src[0]), io->out, io->odt,
			     (double *)c->arena->ws);
}

loom_status loom_cuda_op_broadcast(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				   const loom_cuda_io *io)
{
	return loom_cuda_broadcast_scalar(c->err, c->stream, io->src[0], io->dt[0],
					  plan->g->nodes[v].a.bc.scale, io->out, io->odt,
					  numel_of(plan, v));
}

loom_status loom_cuda_op_channel_sum(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				     const loom_cuda_io *io)
{
	const loom_node *x = &plan->g->nodes[plan->g->nodes[v].src[0]];
	int64_t hw = 1;
	if (c->plans[v].colsum)
		return colsum(c, x->shape.dims[0], (int)x->shape.dims[1], io);
	for (int i = 2; i < x->shape.ndim; i++)
		hw *= x->shape.dims[i];
	return loom_cuda_channel_sum(c->err, c->stream, (int)x->shape.dims[0],
				     (int)x->shape.dims[1], hw, io->src[0], io->dt[0], io->out,
				     io->odt);
}

/* The loss scale comes from the device's scaler, never from the host. */
loom_status loom_cuda_op_grad_seed(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				   const loom_cuda_io *io)
{
	(void)plan;
	(void)v;
	return loom_cuda_grad_seed(c->err, c->stream, c->ctl, io->out, io->odt);
}
