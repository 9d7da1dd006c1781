/*
 * engine/cuda/dtype.cuh — device helpers shared by the kernel files: reading
 * any float storage dtype as fp32 and writing fp32 back with round to nearest
 * even (the CPU backend's half emulation, engine/cpu/backend.c), a block-wide
 * double reduction, and the launch check every launcher ends with.
 */
#ifndef LOOM_ENGINE_CUDA_DTYPE_CUH
#define LOOM_ENGINE_CUDA_DTYPE_CUH

#include <math.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "engine/cuda/cuda_internal.h"

/* dt is uniform across a launch, so the switch does not diverge. */
static __device__ __forceinline__ float loom_ld(const void *p, int dt, int64_t i)
{
	switch (dt) {
	case LOOM_F16: return __half2float(((const __half *)p)[i]);
	case LOOM_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
	default: return ((const float *)p)[i];
	}
}

static __device__ __forceinline__ void loom_st(void *p, int dt, int64_t i, float x)
{
	switch (dt) {
	case LOOM_F16: ((__half *)p)[i] = __float2half_rn(x); break;
	case LOOM_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(x); break;
	default: ((float *)p)[i] = x; break;
	}
}

/* Sum of v over the block; every thread gets the result. blockDim.x must be
 * a multiple of 32 and at most 1024. Uses 33 doubles of shared memory. */
static __device__ __forceinline__ double loom_block_sum(double v)
{
	__shared__ double part[33];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int nwarps = blockDim.x >> 5;

	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_down_sync(0xffffffffu, v, o);
	__syncthreads(); /* part may still be read by a previous call */
	if (lane == 0)
		part[warp] = v;
	__syncthreads();
	if (warp == 0) {
		v = lane < nwarps ? part[lane] : 0.0;
		for (int o = 16; o > 0; o >>= 1)
			v += __shfl_down_sync(0xffffffffu, v, o);
		if (lane == 0)
			part[32] = v;
	}
	__syncthreads();
	return part[32];
}

/* Max of v over the block (NaN-propagating like fmax is not needed here:
 * the CPU's max scan is a plain '>' so NaN never wins it either). */
static __device__ __forceinline__ double loom_block_max(double v)
{
	__shared__ double part[33];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int nwarps = blockDim.x >> 5;

	for (int o = 16; o > 0; o >>= 1) {
		double w = __shfl_down_sync(0xffffffffu, v, o);
		v = w > v ? w : v;
	}
	__syncthreads();
	if (lane == 0)
		part[warp] = v;
	__syncthreads();
	if (warp == 0) {
		v = lane < nwarps ? part[lane] : -INFINITY;
		for (int o = 16; o > 0; o >>= 1) {
			double w = __shfl_down_sync(0xffffffffu, v, o);
			v = w > v ? w : v;
		}
		if (lane == 0)
			part[32] = v;
	}
	__syncthreads();
	return part[32];
}

/* x as loom_st stores it in dtype dt, read back: an amax taken by the
 * kernel that writes a tensor is the max of what its readers load. */
static __device__ __forceinline__ float loom_stored(int dt, float x)
{
	switch (dt) {
	case LOOM_F16: return __half2float(__float2half_rn(x));
	case LOOM_BF16: return __bfloat162float(__float2bfloat16_rn(x));
	default: return x;
	}
}

/* A producer's share of an FP8 tensor's amax (LOOM_CUDA_FP8_AMAX_PRODUCER,
 * fp8.cu): m, this thread's max |y| (NaN-blind: kept by '>'), reduced over
 * the block, then one atomicMax on the float's bits (they order as the
 * values do for non-negative floats) into *amax, zeroed before the launch.
 * Every thread of the block calls it, or none (amax uniform: NULL, none). */
static __device__ __forceinline__ void loom_amax_commit(unsigned *amax, float m)
{
	if (!amax)
		return;
	const double b = loom_block_max((double)m);
	if (threadIdx.x == 0 && b > 0)
		atomicMax(amax, __float_as_uint((float)b));
}

/*
 * Column sums of a [rows, c] matrix in two launches whose order of
 * additions depends only on the shape (elementwise.cu's bias gradient,
 * layer norm's dgamma): the rows cut into chunks of `per`; block (x, k)
 * of LOOM_COLSUM_COLS x LOOM_COLSUM_LANES threads sums chunk k for 32
 * columns (thread row y takes rows y, y + 8, ..., each warp reading 32
 * columns side by side, coalesced), its 8 sums added in y order into
 * part[k c + j]; then loom_colsum_fold_kernel, one thread per column, adds
 * the chunks in k order. term(r, j): element (r, j), in T.
 */
#define LOOM_COLSUM_COLS 32
#define LOOM_COLSUM_LANES 8

template <typename T, typename Term>
static __device__ __forceinline__ void loom_colsum_part(int64_t rows, int64_t per, int c, Term term,
							T *part)
{
	__shared__ T sh[LOOM_COLSUM_LANES][LOOM_COLSUM_COLS + 1];
	const int j = blockIdx.x * LOOM_COLSUM_COLS + threadIdx.x;
	const int64_t k = blockIdx.y, end = (k + 1) * per < rows ? (k + 1) * per : rows;
	T s = 0;
	if (j < c)
		for (int64_t r = k * per + threadIdx.y; r < end; r += LOOM_COLSUM_LANES)
			s += term(r, j);
	sh[threadIdx.y][threadIdx.x] = s;
	__syncthreads();
	if (threadIdx.y == 0 && j < c) {
		T t = 0;
		for (int y = 0; y < LOOM_COLSUM_LANES; y++)
			t += sh[y][threadIdx.x];
		part[k * c + j] = t;
	}
}

/* loom_colsum_part's chunks added in k order, column j's sum stored into
 * y (dtype ydt). */
template <typename T>
__global__ void loom_colsum_fold_kernel(int chunks, int c, const T *part, void *y, int ydt)
{
	for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < c; j += gridDim.x * blockDim.x) {
		T s = 0;
		for (int k = 0; k < chunks; k++)
			s += part[(int64_t)k * c + j];
		loom_st(y, ydt, j, (float)s);
	}
}

/* Blocks for a one-thread-per-element launch of n elements. */
static inline unsigned loom_cuda_blocks(int64_t n, int threads)
{
	int64_t b = (n + threads - 1) / threads;
	if (b < 1)
		b = 1;
	return b > 65535 * 16 ? 65535 * 16 : (unsigned)b; /* kernels grid-stride */
}

/* Checks the launch just made (configuration errors surface here; faults
 * inside the kernel surface at the next sync). */
#define LOOM_CUDA_LAUNCHED(err) LOOM_CUDA_CHECK(cudaGetLastError(), err, LOOM_ERR_MAX)

#endif /* LOOM_ENGINE_CUDA_DTYPE_CUH */
