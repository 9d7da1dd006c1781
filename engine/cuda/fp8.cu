/*
 * engine/cuda/fp8.cu — FP8 training's casts on CUDA: FP8_QDQ (the tensor's
 * amax, a reduction, then each element scaled by a power of two, rounded
 * through E4M3 or E5M2 and divided back: the same numbers as the CPU's
 * emulation, engine/cpu/fp8_qdq.c), and the cast (+ transpose) into 1-byte
 * operands for cuBLASLt's FP8 products (matmul_fp8.cu). CPU twins:
 * engine/cpu/fp8_qdq.c, base/fp8.h.
 *
 * The conversions are base/fp8.h's own, compiled for the device
 * (LOOM_FP8_HD), rather than cuda_fp8.h's __nv_cvt_float_to_fp8: ours give
 * E5M2's NaN as 0x7e and saturate infinities to the largest finite value,
 * and the CPU is the reference the test holds these to bit for bit.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fp8.h"
#include "engine/cuda/dtype.cuh"

extern "C" {
#include "graph/ops/ops.h"
}

static const int threads = 256;

static __host__ __device__ __forceinline__ int is_fp8(int fmt)
{
	return fmt == LOOM_FP8_E4M3 || fmt == LOOM_FP8_E5M2;
}

// ----------------------------------------------------------------------------
// device conversions: base/fp8.h's own (LOOM_FP8_HD), so the GPU rounds with
// the CPU's code

/* fmt is uniform across a launch, so the select does not diverge. */
static __device__ __forceinline__ uint32_t fp8_from_f32(float f, int fmt)
{
	return fmt == LOOM_FP8_E4M3 ? loom_f32_to_e4m3(f) : loom_f32_to_e5m2(f);
}

static __device__ __forceinline__ float fp8_round(float f, int fmt)
{
	return fmt == LOOM_FP8_E4M3 ? loom_e4m3_to_f32(loom_f32_to_e4m3(f)) :
				      loom_e5m2_to_f32(loom_f32_to_e5m2(f));
}

static __device__ __forceinline__ float fp8_decode(unsigned char b, int fmt)
{
	return fmt == LOOM_FP8_E4M3 ? loom_e4m3_to_f32(b) : loom_e5m2_to_f32(b);
}

/* Element i of FP8_QDQ's output from s = x * scale: the rounded value over
 * the scale in ydt, or (store: a stored value, graph/ops/ops.h's
 * loom_fp8_stored) its fp8 code, the scale after the n codes at
 * loom_fp8_scale_off(n) (qdq_put_scale; 4-byte aligned: the arena's values
 * are 64-byte aligned). Decoded (fp8_decode, times 1 / scale, into ydt)
 * the code gives the unstored value's bits. */
static __device__ __forceinline__ void qdq_put(void *y, int ydt, int64_t i, float s, float inv,
					       int fmt, int store)
{
	if (store)
		((unsigned char *)y)[i] = (unsigned char)fp8_from_f32(s, fmt);
	else
		loom_st(y, ydt, i, fp8_round(s, fmt) * inv);
}

static __device__ __forceinline__ void qdq_put_scale(void *y, int64_t n, float scale, int store)
{
	if (store)
		*(float *)((unsigned char *)y + ((n + 3) & ~(int64_t)3)) = scale;
}

// ----------------------------------------------------------------------------
// 128-bit paths (LOOM_CUDA_FP8_CAST_VEC=1: loom_cuda_fp8_vec_on, read at plan
// time): where x is f16 or bf16 and x and y are aligned (vec_groups),
// a thread reads 8 elements in one 16-byte load and writes their 8 codes in
// one 8-byte store (or 8 halves in 16 bytes), each element converted and
// rounded by the scalar path's own calls (loom_ld, fp8_from_f32, loom_st on
// registers), so both paths give the same bits; the max is order-blind and
// the saturated count an exact integer sum. The n % 8 tail runs scalar in
// the same launch: elements from nv * 8 (nv = 0: all of them, the scalar
// path as it was). Compiled, not run.

int loom_cuda_fp8_vec_on = 0;

/* Elements 8g..8g+7 of x (f16 or bf16, 16-byte aligned) as fp32. */
static __device__ __forceinline__ void ld8(const void *x, int xdt, int64_t g, float v[8])
{
	const uint4 r = ((const uint4 *)x)[g];
#pragma unroll
	for (int k = 0; k < 8; k++)
		v[k] = loom_ld(&r, xdt, k);
}

/* ld8 times s: the values a cast rounds (x * scale, as the scalar path). */
static __device__ __forceinline__ void ld8_times(const void *x, int xdt, int64_t g, float s,
						 float v[8])
{
	ld8(x, xdt, g, v);
#pragma unroll
	for (int k = 0; k < 8; k++)
		v[k] *= s;
}

/* m with the largest |v[k]| if larger (a NaN never is). */
static __device__ __forceinline__ float max8(float m, const float v[8])
{
#pragma unroll
	for (int k = 0; k < 8; k++) {
		const float a = fabsf(v[k]);
		m = a > m ? a : m;
	}
	return m;
}

/* qdq_put for elements 8g..8g+7 from s[] = x * scale, one store: codes
 * (store; 8 bytes), else the rounded values in ydt (f16 or bf16). */
static __device__ __forceinline__ void qdq_put8(void *y, int ydt, int64_t g, const float s[8],
						float inv, int fmt, int store)
{
	if (store) {
		uint2 w = make_uint2(0, 0);
#pragma unroll
		for (int k = 0; k < 4; k++) {
			w.x |= (fp8_from_f32(s[k], fmt) & 0xffu) << (8 * k);
			w.y |= (fp8_from_f32(s[k + 4], fmt) & 0xffu) << (8 * k);
		}
		((uint2 *)y)[g] = w;
		return;
	}
	uint4 w;
#pragma unroll
	for (int k = 0; k < 8; k++)
		loom_st(&w, ydt, k, fp8_round(s[k], fmt) * inv);
	((uint4 *)y)[g] = w;
}

/* Groups of 8 the 128-bit path takes: n / 8 where the switch is on, x is
 * f16 or bf16 and 16-byte aligned, y codes 8-byte aligned (ycodes) or a
 * half dtype 16-byte aligned; else 0 (the scalar loop does all). */
static int64_t vec_groups(int64_t n, const void *x, int xdt, const void *y, int ydt, int ycodes)
{
	if (!loom_cuda_fp8_vec_on || n < 8 || (xdt != LOOM_F16 && xdt != LOOM_BF16))
		return 0;
	if (!ycodes && ydt != LOOM_F16 && ydt != LOOM_BF16)
		return 0;
	return ((uintptr_t)x & 15) || ((uintptr_t)y & (ycodes ? 7 : 15)) ? 0 : n / 8;
}

// ----------------------------------------------------------------------------
// CUDA kernels

/* NaN-blind as the CPU's scan: a NaN never wins '>' and stays out of the
 * scale. The block's max goes into *amax by atomicMax on the bits, which
 * order as the values do for non-negative floats (inf included). valid
 * set (LOOM_CUDA_FP8_AMAX_OPTIM): the optimizer left x's amax in *given,
 * the max |w| of the weight as it stored it; x is that weight or its
 * cast into xdt, and a rounding to nearest is monotone and odd, so the
 * max of the rounded |w| is the rounded max: one thread writes it, no
 * pass. */
__global__ void loom_fp8_amax_kernel(const void *x, int xdt, int64_t n, int64_t nv,
				     unsigned *amax, const int *ring, const float *given,
				     const int *valid)
{
	if (ring && ring[0] > 0) /* delayed scaling with a history: the cast's own pass */
		return;
	if (valid && *valid) {
		if (blockIdx.x == 0 && threadIdx.x == 0)
			*(float *)amax = fabsf(loom_stored(xdt, *given));
		return;
	}
	const int64_t first = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
	const int64_t stride = (int64_t)gridDim.x * blockDim.x;
	float m = 0.0f;
	for (int64_t g = first; g < nv; g += stride) {
		float v[8];
		ld8(x, xdt, g, v);
		m = max8(m, v);
	}
	for (int64_t i = nv * 8 + first; i < n; i += stride) {
		float a = fabsf(loom_ld(x, xdt, i));
		m = a > m ? a : m;
	}
	double b = loom_block_max((double)m);
	if (threadIdx.x == 0 && b > 0)
		atomicMax(amax, __float_as_uint((float)b));
}

/* Every thread derives the scale from the amax (a few instructions); block
 * 0 leaves it and its inverse in the slot for the products that read it.
 * t not NULL (a training run with the per-tensor state on the device):
 * the amax (slot[0]'s, taken before the cast) and the scale into the
 * tensor's step in progress by one thread, as the CPU's record does. A
 * scale from a finite amax saturates nothing (amax * scale <= fmax), so
 * only a non-finite amax (uniform over the launch: every thread reads
 * the same slot) takes a second look at x to count what saturated; the
 * cast's own loop is the unrecorded one. */
__global__ void loom_fp8_qdq_kernel(const void *x, int xdt, void *y, int ydt, int64_t n,
				    int64_t nv, int fmt, float *slot, int store, loom_fp8_tensor *t)
{
	const float fmax = fmt == LOOM_FP8_E4M3 ? LOOM_E4M3_MAX : LOOM_E5M2_MAX;
	const float amax = slot[0];
	const float scale = loom_fp8_scale(amax, fmax);
	const float inv = 1.0f / scale; /* exact: a power of two */
	if (blockIdx.x == 0 && threadIdx.x == 0) {
		slot[1] = scale;
		slot[2] = inv;
		qdq_put_scale(y, n, scale, store);
		if (t) {
			t->cur_scale = scale;
			if (amax > 0)
				atomicMax((unsigned *)&t->amax, __float_as_uint(amax));
		}
	}
	const int64_t first = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
	const int64_t stride = (int64_t)gridDim.x * blockDim.x;
	for (int64_t g = first; g < nv; g += stride) {
		float v[8];
		ld8_times(x, xdt, g, scale, v);
		qdq_put8(y, ydt, g, v, inv, fmt, store);
	}
	for (int64_t i = nv * 8 + first; i < n; i += stride)
		qdq_put(y, ydt, i, loom_ld(x, xdt, i) * scale, inv, fmt, store);
	if (!t || amax <= 3.4028234663852886e38f)
		return;
	double sat = 0;
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x)
		sat += fabsf(loom_ld(x, xdt, i) * scale) > fmax;
	const double bs = loom_block_sum(sat);
	if (threadIdx.x == 0 && bs > 0)
		atomicAdd((unsigned long long *)&t->saturated, (unsigned long long)bs);
}

/* Delayed scaling (fp8.h): the scale is the tensor's device scale once the
 * history holds a step (ring[0], filled), else the amax's in slot[0] as
 * above; a training run (record) takes the amax and the saturated count in
 * the same pass as the cast, a block reduction and one atomic each into
 * the tensor's step in progress (atomicMax on the bits: amax >= 0);
 * given: the producer left the amax in slot[0] (LOOM_CUDA_FP8_AMAX_PRODUCER),
 * recorded from there by one thread, no reduction of it here. */
__global__ void loom_fp8_qdq_delayed_kernel(const void *x, int xdt, void *y, int ydt, int64_t n,
					    int64_t nv, int fmt, float *slot, loom_fp8_tensor *t,
					    const int *ring, int record, int given, int store)
{
	const float fmax = fmt == LOOM_FP8_E4M3 ? LOOM_E4M3_MAX : LOOM_E5M2_MAX;
	const float scale = ring[0] > 0 ? t->scale : loom_fp8_scale(slot[0], fmax);
	const float inv = 1.0f / scale;
	float m = 0.0f;
	double sat = 0;
	if (blockIdx.x == 0 && threadIdx.x == 0) {
		slot[1] = scale;
		slot[2] = inv;
		if (record)
			t->cur_scale = scale;
		if (record && given && slot[0] > 0)
			atomicMax((unsigned *)&t->amax, __float_as_uint(slot[0]));
		qdq_put_scale(y, n, scale, store);
	}
	const int64_t first = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
	const int64_t stride = (int64_t)gridDim.x * blockDim.x;
	for (int64_t g = first; g < nv; g += stride) {
		float v[8];
		ld8(x, xdt, g, v);
#pragma unroll
		for (int k = 0; k < 8; k++) {
			const float a = fabsf(v[k]);
			m = a > m ? a : m;
			v[k] *= scale;
			sat += fabsf(v[k]) > fmax;
		}
		qdq_put8(y, ydt, g, v, inv, fmt, store);
	}
	for (int64_t i = nv * 8 + first; i < n; i += stride) {
		const float v = loom_ld(x, xdt, i), a = fabsf(v), s = v * scale;
		m = a > m ? a : m;
		sat += fabsf(s) > fmax;
		qdq_put(y, ydt, i, s, inv, fmt, store);
	}
	if (!record)
		return;
	const double bm = given ? 0 : loom_block_max((double)m), bs = loom_block_sum(sat);
	if (threadIdx.x == 0 && bm > 0)
		atomicMax((unsigned *)&t->amax, __float_as_uint((float)bm));
	if (threadIdx.x == 0 && bs > 0)
		atomicAdd((unsigned long long *)&t->saturated, (unsigned long long)bs);
}

/* Every tensor's step end (amp/fp8_scaling.h's own inline update), one
 * block; then thread 0 advances the ring, after every thread has read it.
 * len 0 (current scaling): the step's counters into last_*, no history,
 * no ring. */
__global__ void loom_fp8_step_end_kernel(loom_fp8_tensor *t, float *hist, int *ring, int n,
					 int len, int margin, const float *amax, const double *sat)
{
	const int delayed = len > 0;
	const int filled = ring[0] < len ? ring[0] + 1 : ring[0], pos = ring[1];
	for (int i = threadIdx.x; i < n; i += blockDim.x) {
		if (amax) { /* reduced over the ranks (fp8_reduce_begin's buffers) */
			t[i].amax = amax[i];
			t[i].saturated = (int64_t)sat[i];
		}
		loom_fp8_tensor_step_end(&t[i], hist + (size_t)i * len, len, pos, filled, delayed,
					 margin);
	}
	__syncthreads();
	if (threadIdx.x == 0 && delayed) {
		ring[0] = filled;
		ring[1] = (pos + 1) % len;
	}
}

/* The step's amaxes and counts packed for the all-reduces. */
__global__ void loom_fp8_pack_kernel(const loom_fp8_tensor *t, int n, float *amax, double *sat)
{
	for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
		amax[i] = t[i].amax;
		sat[i] = (double)t[i].saturated;
	}
}

__global__ void loom_fp8_cast_kernel(const void *x, int xdt, int64_t n, int64_t nv, int fmt,
				     const float *scale, unsigned char *q)
{
	const float s = scale[0];
	const int64_t first = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
	const int64_t stride = (int64_t)gridDim.x * blockDim.x;
	for (int64_t g = first; g < nv; g += stride) {
		float v[8];
		ld8_times(x, xdt, g, s, v);
		qdq_put8(q, 0, g, v, 1.0f, fmt, 1);
	}
	for (int64_t i = nv * 8 + first; i < n; i += stride)
		q[i] = (unsigned char)fp8_from_f32(loom_ld(x, xdt, i) * s, fmt);
}

/* x [rows, cols] into q [cols, rows], a 32 x 32 tile per block through
 * shared memory (blockDim 32 x 8), so that both the reads and the writes
 * run along rows; the rows' tiles grid-stride over gridDim.y. xdt an fp8
 * format: x holds its codes already (a stored QDQ), moved as they are. */
#define FP8_TILE 32
__global__ void loom_fp8_cast_t_kernel(const void *x, int xdt, int64_t rows, int64_t cols,
				       int fmt, const float *scale, unsigned char *q)
{
	__shared__ unsigned char tile[FP8_TILE][FP8_TILE + 1];
	const float s = scale[0];
	const int64_t c0 = (int64_t)blockIdx.x * FP8_TILE;

	for (int64_t r0 = (int64_t)blockIdx.y * FP8_TILE; r0 < rows;
	     r0 += (int64_t)gridDim.y * FP8_TILE) {
		for (int j = threadIdx.y; j < FP8_TILE; j += blockDim.y) {
			int64_t r = r0 + j, c = c0 + threadIdx.x;
			if (r < rows && c < cols)
				tile[j][threadIdx.x] =
					is_fp8(xdt) ? ((const unsigned char *)x)[r * cols + c] :
						      (unsigned char)fp8_from_f32(
							      loom_ld(x, xdt, r * cols + c) * s, fmt);
		}
		__syncthreads();
		for (int j = threadIdx.y; j < FP8_TILE; j += blockDim.y) {
			int64_t c = c0 + j, r = r0 + threadIdx.x;
			if (r < rows && c < cols)
				q[c * rows + r] = tile[threadIdx.x][j];
		}
		__syncthreads();
	}
}

/* A stored QDQ's n codes (scale after them) decoded into y in ydt: the
 * bits the QDQ writes unstored (a reader that is not an FP8 product). */
__global__ void loom_fp8_decode_kernel(const unsigned char *q, int64_t n, int fmt, void *y, int ydt)
{
	const float inv = 1.0f / *(const float *)(q + ((n + 3) & ~(int64_t)3));
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x)
		loom_st(y, ydt, i, fp8_decode(q[i], fmt) * inv);
}

// ----------------------------------------------------------------------------
// kernel launchers

loom_status loom_cuda_fp8_amax(char *err, cudaStream_t s, const void *x, int xdt, int64_t n,
			       float *slot, const int *ring, const float *given, const int *valid)
{
	loom_status st = LOOM_CUDA_CHECK(cudaMemsetAsync(slot, 0, sizeof(float), s), err, LOOM_ERR_MAX);
	if (st != LOOM_OK || n <= 0)
		return st;
	/* A block's atomic is one of a few thousand at most. */
	const int64_t nv = vec_groups(n, x, xdt, x, xdt, 0);
	unsigned blocks = loom_cuda_blocks(nv ? n / 8 : n, threads);
	if (blocks > 2048)
		blocks = 2048;
	loom_fp8_amax_kernel<<<blocks, threads, 0, s>>>(x, xdt, n, nv, (unsigned *)slot, ring,
							 given, valid);
	return LOOM_CUDA_LAUNCHED(err);
}

loom_status loom_cuda_fp8_qdq(char *err, cudaStream_t s, const void *x, int xdt, void *y,
			      int ydt, int64_t n, int fmt, float *slot, int store,
			      loom_fp8_tensor *t)
{
	if (!is_fp8(fmt))
		return loom_cuda_cast(err, s, x, xdt, y, ydt, n);
	if (n <= 0)
		return LOOM_OK;
	const int64_t nv = vec_groups(n, x, xdt, y, ydt, store);
	loom_fp8_qdq_kernel<<<loom_cuda_blocks(nv ? n / 8 : n, threads), threads, 0, s>>>(
		x, xdt, y, ydt, n, nv, fmt, slot, store, t);
	return LOOM_CUDA_LAUNCHED(err);
}

loom_status loom_cuda_fp8_decode(char *err, cudaStream_t s, const void *q, int64_t n, int fmt,
				 void *y, int ydt)
{
	if (!is_fp8(fmt))
		return loom_errnf(err, LOOM_ERR_MAX, LOOM_ERR_DTYPE,
				  "cuda fp8 decode: format %d is not fp8", fmt);
	if (n <= 0)
		return LOOM_OK;
	loom_fp8_decode_kernel<<<loom_cuda_blocks(n, threads), threads, 0, s>>>(
		(const unsigned char *)q, n, fmt, y, ydt);
	return LOOM_CUDA_LAUNCHED(err);
}

loom_status loom_cuda_fp8_qdq_delayed(char *err, cudaStream_t s, const void *x, int xdt, void *y,
				      int ydt, int64_t n, int fmt, float *slot, loom_fp8_tensor *t,
				      const int *ring, int record, int given, int store)
{
	if (n <= 0)
		return LOOM_OK;
	const int64_t nv = vec_groups(n, x, xdt, y, ydt, store);
	unsigned blocks = loom_cuda_blocks(nv ? n / 8 : n, threads);
	if (blocks > 2048) /* grid-stride: a few thousand atomics at most */
		blocks = 2048;
	loom_fp8_qdq_delayed_kernel<<<blocks, threads, 0, s>>>(x, xdt, y, ydt, n, nv, fmt, slot, t,
								ring, record, given, store);
	return LOOM_CUDA_LAUNCHED(err);
}

loom_status loom_cuda_fp8_step_end_launch(char *err, cudaStream_t s, loom_fp8_tensor *t,
					  float *hist, int *ring, int n, int len, int margin,
					  const float *amax, const double *sat)
{
	if (n <= 0 || len < 0)
		return LOOM_OK;
	loom_fp8_step_end_kernel<<<1, threads, 0, s>>>(t, hist, ring, n, len, margin, amax, sat);
	return LOOM_CUDA_LAUNCHED(err);
}

loom_status loom_cuda_fp8_cast(char *err, cudaStream_t s, const void *x, int xdt, int64_t rows,
			       int64_t cols, int transpose, int fmt, const float *scale,
			       unsigned char *q)
{
	if (!is_fp8(fmt))
		return loom_errnf(err, LOOM_ERR_MAX, LOOM_ERR_DTYPE, "cuda fp8 cast: format %d is not fp8",
				  fmt);
	if (rows <= 0 || cols <= 0)
		return LOOM_OK;
	if (is_fp8(xdt) && !transpose) /* codes already: a copy */
		return LOOM_CUDA_CHECK(cudaMemcpyAsync(q, x, (size_t)(rows * cols),
						       cudaMemcpyDeviceToDevice, s),
				       err, LOOM_ERR_MAX);
	if (!transpose) {
		const int64_t n = rows * cols, nv = vec_groups(n, x, xdt, q, 0, 1);
		loom_fp8_cast_kernel<<<loom_cuda_blocks(nv ? n / 8 : n, threads), threads, 0, s>>>(
			x, xdt, n, nv, fmt, scale, q);
		return LOOM_CUDA_LAUNCHED(err);
	}
	int64_t gx = (cols + FP8_TILE - 1) / FP8_TILE, gy = (rows + FP8_TILE - 1) / FP8_TILE;
	if (gx > INT32_MAX)
		return loom_errnf(err, LOOM_ERR_MAX, LOOM_ERR_SHAPE,
				  "cuda fp8 cast_transpose: %lld columns", (long long)cols);
	dim3 grid((unsigned)gx, (unsigned)(gy > 65535 ? 65535 : gy)), block(FP8_TILE, 8);
	loom_fp8_cast_t_kernel<<<grid, block, 0, s>>>(x, xdt, rows, cols, fmt, scale, q);
	return LOOM_CUDA_LAUNCHED(err);
}

// ----------------------------------------------------------------------------
// plan, scale source and op entry

/* The compute capability of the device this context runs on. */
static loom_status compute_capability(loom_cuda_ctx *c, int *major, int *minor)
{
	loom_status st = LOOM_CUDA_CHECK(cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor,
								c->device),
					 c->err, sizeof(c->err));
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(cudaDeviceGetAttribute(minor, cudaDevAttrComputeCapabilityMinor,
							    c->device),
				     c->err, sizeof(c->err));
	return st;
}

loom_status loom_cuda_fp8_plan(loom_cuda_ctx *c, const loom_plan *p)
{
	int any = 0, major = 0, minor = 0;
	loom_status st;

	loom_cuda_fp8_free(c);
	for (int v = 0; v < p->g->n && !any; v++)
		any = p->g->nodes[v].op == LOOM_OP_FP8_QDQ;
	if (!any)
		return LOOM_OK;
	/* The emulation would run anywhere, but what it stands for (FP8
	 * tensor cores) starts at Ada and Hopper: an older GPU says so at
	 * start-up rather than training in a precision it cannot speed up. */
	if ((st = compute_capability(c, &major, &minor)) != LOOM_OK)
		return st;
	if (major * 10 + minor < 89)
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_UNSUPPORTED,
				  "--precision fp8 needs compute capability 8.9 or later "
				  "(Hopper/Ada); this GPU is %d.%d", major, minor);
	const size_t bytes = (size_t)p->g->n * LOOM_CUDA_FP8_SLOT * sizeof(float);
	if ((st = LOOM_CUDA_CHECK(cudaMalloc((void **)&c->fp8_slots, bytes), c->err,
				  sizeof(c->err))) != LOOM_OK) {
		c->fp8_slots = NULL;
		return st;
	}
	/* Scales of 0 until a QDQ runs: a product that read one early would
	 * give zeros, not garbage. */
	return LOOM_CUDA_CHECK(cudaMemset(c->fp8_slots, 0, bytes), c->err, sizeof(c->err));
}

void loom_cuda_fp8_free(loom_cuda_ctx *c)
{
	if (c->fp8_slots)
		(void)cudaFree(c->fp8_slots);
	c->fp8_slots = NULL;
}

float *loom_cuda_fp8_scale(const loom_cuda_ctx *c, loom_value q)
{
	return c->fp8_slots + (size_t)q * LOOM_CUDA_FP8_SLOT + 1;
}

/*
 * The amax from the kernel that writes the tensor (issue 42 item 3,
 * LOOM_CUDA_FP8_AMAX_PRODUCER): an FP8_QDQ rounding through E4M3 or E5M2
 * whose source is written by a kernel that takes the amax of what it
 * stores: in the forward a layer norm's or a GELU's output (the E4M3
 * casts of a product's input), in the backward a GELU's or a layer
 * norm's data gradient (the E5M2 casts of a product's output gradient:
 * the fc product's from the GELU, a product's that feeds a layer norm
 * from its dx, with the residual's other gradient added in where
 * LOOM_CUDA_LN_BWD_ACCUM fused the sum: the kernel's amax is then the
 * sum's), in a float dtype the producer stores itself, directly or
 * through whole views of it (no cast between: the amax must be of the
 * very values the QDQ reads). Plain rule on the graph, so that a test
 * asks it without a device; the plan adds what only the node plans know.
 */
static loom_value amax_producer_rule(const loom_graph *g, loom_value q)
{
	const loom_node *n = &g->nodes[q];
	if (n->op != LOOM_OP_FP8_QDQ || !is_fp8(n->a.fp8.fwd) || n->nsrc < 1)
		return LOOM_NONE;
	loom_value x = n->src[0];
	/* through whole views of the same dtype (a cast folded into the layer
	 * norm leaves one): the same bytes */
	while (loom_op_is_view(g->nodes[x].op) && g->nodes[x].view_off == 0 &&
	       g->nodes[x].dtype == g->nodes[g->nodes[x].src[0]].dtype &&
	       loom_shape_numel(&g->nodes[x].shape) ==
		       loom_shape_numel(&g->nodes[g->nodes[x].src[0]].shape))
		x = g->nodes[x].src[0];
	const loom_node *xn = &g->nodes[x];
	if (xn->op != LOOM_OP_LAYERNORM && xn->op != LOOM_OP_GELU &&
	    xn->op != LOOM_OP_GELU_BWD && xn->op != LOOM_OP_LAYERNORM_BWD_DATA)
		return LOOM_NONE;
	if (xn->dtype != LOOM_F32 && xn->dtype != LOOM_F16 && xn->dtype != LOOM_BF16)
		return LOOM_NONE;
	return x;
}

/*
 * plan_create's pass (fuse_plan.cu, after every node's own plan): each
 * FP8_QDQ the rule above takes gets its producer's kernel to fill its
 * amax slot, and skips its own amax pass, under current scaling (the
 * producer ran just before, on this very tensor) and delayed scaling
 * alike (the cast records the slot's amax into the tensor's step). Not a
 * GELU whose work a product's epilogue does (LOOM_CUDA_GELU_EPILOGUE:
 * cuBLASLt's AMAX_D is refused for a bf16 D, README.md), not a producer
 * already giving one, not a QDQ or producer another rank runs (a pipeline
 * stage's received value).
 */
loom_status loom_cuda_fp8_amax_plan(loom_cuda_ctx *c, const loom_plan *p)
{
	if (!c->fp8_amax_producer || !c->fp8_slots)
		return LOOM_OK;
	for (loom_value q = 0; q < p->g->n; q++) {
		const loom_value x = amax_producer_rule(p->g, q);
		if (x == LOOM_NONE || c->plans[x].fused_into != LOOM_NONE ||
		    c->plans[x].fp8_amax != LOOM_NONE || loom_step_of(p, q) < 0 ||
		    loom_step_of(p, x) < 0)
			continue;
		c->plans[x].fp8_amax = q;
		c->plans[q].fp8_amax = x;
	}
	return LOOM_OK;
}

loom_status loom_cuda_fp8_amax_begin(loom_cuda_ctx *c, loom_value v, unsigned **amax)
{
	*amax = NULL;
	if (!c->plans || v < 0 || v >= c->n_plans || c->plans[v].fp8_amax == LOOM_NONE ||
	    !c->fp8_slots)
		return LOOM_OK;
	float *slot = c->fp8_slots + (size_t)c->plans[v].fp8_amax * LOOM_CUDA_FP8_SLOT;
	*amax = (unsigned *)slot;
	return LOOM_CUDA_CHECK(cudaMemsetAsync(slot, 0, sizeof(float), c->stream), c->err,
			       LOOM_ERR_MAX);
}

int loom_cuda_fp8_amax_note(const loom_cuda_ctx *c, const loom_plan *p, loom_value v, char *buf,
			    size_t len)
{
	if (!c->plans || p->g->nodes[v].op != LOOM_OP_FP8_QDQ)
		return 0;
	const int cell = c->plans[v].fp8_wamax;
	if (cell >= 0 && cell < c->wamax.n) {
		snprintf(buf, len, "amax by the optimizer (weight %d '%s'), no amax pass",
			 (int)c->wamax.param[cell], p->g->nodes[c->wamax.param[cell]].name);
		return 1;
	}
	if (c->plans[v].fp8_amax == LOOM_NONE)
		return 0;
	const loom_value x = c->plans[v].fp8_amax;
	const int op = p->g->nodes[x].op;
	snprintf(buf, len, "amax by its producer %d (%s), no amax pass", (int)x,
		 op == LOOM_OP_LAYERNORM ? "layer norm" :
		 op == LOOM_OP_LAYERNORM_BWD_DATA ? "layer norm's dx" :
		 op == LOOM_OP_GELU_BWD ? "gelu's backward" : "gelu");
	return 1;
}

/* Whether the plan runs an optimizer step (not a forward-only plan). */
static int plan_updates(const loom_plan *p)
{
	for (int i = 0; i < p->n_steps; i++)
		if (p->steps[i].kind == LOOM_STEP_OPTIM)
			return 1;
	return 0;
}

/*
 * The amax of a weight's cast from the optimizer (LOOM_CUDA_FP8_AMAX_OPTIM):
 * the p->params slot of the weight whose FP8_QDQ q (E4M3 or E5M2) reads
 * it, directly, through whole views of the same dtype, or through one
 * float CAST (O1's bf16 copy of an f32 weight: the cast's amax is the
 * rounded max of the weight's, loom_fp8_amax_kernel), so that the amax
 * the optimizer takes of what it stores is the one of what q reads; -1:
 * none. O2: the weight is the bf16 copy the optimizer rounds from the f32
 * master, which q reads. A weight read by several casts (a tied table)
 * has one cell they all read.
 *
 * Sound only where this rank's optimizer writes the whole weight, every
 * applied step, and nothing else writes it unseen: refused under ZeRO
 * (each rank updates its shard, the others' come by all-gather; also a
 * piece that is not the whole weight, or packs it for the gather),
 * ZeRO-3's gathered weights (sharded), a pipeline (a stage may read a
 * weight another stage updates, received by a transport that writes the
 * arena directly), a plan with no optimizer step, and under delayed
 * scaling (its cast takes the amax in its own pass: nothing to save).
 * What else may write a weight clears the flags (loom_cuda_wamax). Plain
 * rule on the plan, so that a test asks it without a device.
 */
static int amax_optim_rule(const loom_plan *p, loom_value q)
{
	const loom_graph *g = p->g;
	const loom_node *n = &g->nodes[q];
	if (n->op != LOOM_OP_FP8_QDQ || !is_fp8(n->a.fp8.fwd) || n->nsrc < 1 || p->zero ||
	    p->n_gathers || p->pipe || p->opts.optim.kind == LOOM_OPTIM_NONE || !plan_updates(p) ||
	    p->opts.amp.fp8_scaling == LOOM_FP8_SCALING_DELAYED)
		return -1;
	loom_value x = n->src[0];
	for (int casts = 0;;) {
		const loom_node *xn = &g->nodes[x];
		const loom_node *sn = xn->nsrc > 0 ? &g->nodes[xn->src[0]] : NULL;
		const int whole_view = loom_op_is_view(xn->op) && xn->view_off == 0 &&
				       xn->dtype == sn->dtype &&
				       loom_shape_numel(&xn->shape) == loom_shape_numel(&sn->shape);
		const int float_cast = xn->op == LOOM_OP_CAST && !casts &&
				       loom_is_float((loom_dtype)xn->dtype) &&
				       loom_is_float((loom_dtype)sn->dtype);
		if (!whole_view && !float_cast)
			break;
		casts += float_cast;
		x = xn->src[0];
	}
	if (g->nodes[x].op != LOOM_OP_PARAM || (g->nodes[x].flags & LOOM_NODE_SHARDED))
		return -1;
	for (int s = 0; s < p->n_params; s++) {
		if (p->params[s].param != x)
			continue;
		/* the whole weight in one piece, this rank's */
		for (int k = 0; k < p->n_pieces; k++) {
			const loom_optim_piece *pc = &p->pieces[k];
			if (pc->slot == s)
				return pc->off == 0 && pc->n == p->params[s].numel && !pc->pack ? s : -1;
		}
		return -1;
	}
	return -1;
}

void loom_cuda_fp8_wamax_free(loom_cuda_ctx *c)
{
	loom_cuda_wamax *w = &c->wamax;
	if (w->amax)
		(void)cudaFree(w->amax);
	free(w->param);
	free(w->slot);
	free(w->lo);
	free(w->hi);
	memset(w, 0, sizeof(*w));
}

/* The cells of the weights the rule pairs, one per weight (by slot). */
static loom_status wamax_cells(loom_cuda_ctx *c, const loom_plan *p, int *cell_of)
{
	loom_cuda_wamax *w = &c->wamax;
	for (loom_value q = 0; q < p->g->n; q++) {
		const int s = amax_optim_rule(p, q);
		if (s < 0 || loom_step_of(p, q) < 0 || c->plans[q].fp8_amax != LOOM_NONE)
			continue;
		if (cell_of[s] < 0) {
			cell_of[s] = w->n;
			w->param[w->n] = p->params[s].param;
			w->slot[w->n++] = s;
		}
		c->plans[q].fp8_wamax = cell_of[s];
	}
	if (!w->n)
		return LOOM_OK;
	/* the cells, then the flags: all 0 (no update yet) */
	const size_t bytes = loom_cuda_align(sizeof(float) * (size_t)w->n) + sizeof(int) * w->n;
	loom_status st = LOOM_CUDA_CHECK(cudaMalloc((void **)&w->amax, bytes), c->err,
					 sizeof(c->err));
	if (st != LOOM_OK) {
		w->amax = NULL;
		return st;
	}
	w->valid = (int *)((unsigned char *)w->amax + loom_cuda_align(sizeof(float) * (size_t)w->n));
	return LOOM_CUDA_CHECK(cudaMemset(w->amax, 0, bytes), c->err, sizeof(c->err));
}

/* plan_create's pass (fuse_plan.cu, after amax_plan): each FP8_QDQ the
 * rule takes reads its weight's cell (fp8_wamax); a QDQ its producer
 * gives the amax keeps that. Host arrays sized by the plan's weights. */
loom_status loom_cuda_fp8_wamax_plan(loom_cuda_ctx *c, const loom_plan *p)
{
	loom_cuda_wamax *w = &c->wamax;
	loom_cuda_fp8_wamax_free(c);
	for (loom_value v = 0; v < c->n_plans; v++)
		c->plans[v].fp8_wamax = -1;
	if (!c->fp8_amax_optim || !c->fp8_slots || p->n_params == 0)
		return LOOM_OK;
	const size_t n = (size_t)p->n_params;
	int *cell_of = (int *)malloc(sizeof(int) * n);
	w->param = (loom_value *)calloc(n, sizeof(loom_value));
	w->slot = (int *)calloc(n, sizeof(int));
	w->lo = (uintptr_t *)calloc(2 * n, sizeof(uintptr_t));
	w->hi = (uintptr_t *)calloc(2 * n, sizeof(uintptr_t));
	loom_status st = LOOM_OK;
	if (!cell_of || !w->param || !w->slot || !w->lo || !w->hi)
		st = loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_NOMEM, "cuda: out of host memory");
	for (size_t i = 0; st == LOOM_OK && i < n; i++)
		cell_of[i] = -1;
	if (st == LOOM_OK)
		st = wamax_cells(c, p, cell_of);
	free(cell_of);
	if (st != LOOM_OK) {
		for (loom_value v = 0; v < c->n_plans; v++)
			c->plans[v].fp8_wamax = -1;
		loom_cuda_fp8_wamax_free(c);
	}
	return st;
}

/* At alloc (optim.cu's table upload, the arena carved): each cell's
 * weight and master ranges, and each piece of a weight with a cell its
 * amax pointer (the rule took whole weights only: one piece each). */
void loom_cuda_fp8_wamax_tables(loom_cuda_ctx *c, const loom_plan *p, loom_cuda_opt_slot *slots)
{
	loom_cuda_wamax *w = &c->wamax;
	for (int i = 0; i < w->n; i++) {
		const loom_param_slot *sl = &p->params[w->slot[i]];
		const loom_value v[2] = { sl->param, sl->master };
		for (int k = 0; k < 2; k++) {
			if (v[k] == LOOM_NONE)
				continue;
			w->lo[2 * i + k] = (uintptr_t)loom_arena_ptr(c->arena, p, v[k]);
			w->hi[2 * i + k] = w->lo[2 * i + k] + loom_plan_value_bytes(p, v[k]);
		}
		for (int s = 0; s < p->n_pieces; s++)
			if (p->pieces[s].slot == w->slot[i])
				slots[s].amax = (unsigned *)(w->amax + i);
	}
}

/* Bytes written into a weight or its master by anything but the
 * optimizer (the host's values, a device copy): every cell stale until
 * the next applied update, in the stream's order. */
loom_status loom_cuda_fp8_wamax_touch(loom_cuda_ctx *c, const void *dst, size_t bytes)
{
	const loom_cuda_wamax *w = &c->wamax;
	const uintptr_t a = (uintptr_t)dst, b = a + bytes;
	int hit = 0;
	for (int i = 0; i < 2 * w->n && !hit; i++)
		hit = w->lo[i] < w->hi[i] && a < w->hi[i] && w->lo[i] < b;
	if (!hit)
		return LOOM_OK;
	return LOOM_CUDA_CHECK(cudaMemsetAsync(w->valid, 0, sizeof(int) * w->n, c->stream), c->err,
			       sizeof(c->err));
}

/* Whether node v's source i is read as fp8 codes by v's own plan: the
 * FP8 product's operands. */
static int reads_codes(const loom_cuda_ctx *c, const loom_plan *p, loom_value v, int i)
{
	const loom_cuda_node_plan *np = &c->plans[v];
	const loom_op op = (loom_op)p->g->nodes[v].op;
	return (op == LOOM_OP_LINEAR || op == LOOM_OP_MATMUL) && np->kind == LOOM_CUDA_PLAN_MM &&
	       np->mm.fp8.on && i < 2 && np->mm.fp8.stored[i];
}

/* The fp8 storage pass kept some QDQs' codes (planning->reads_fp8: the
 * products LOOM_CUDA_FP8_GEMM takes, by the graph's rule); a reader whose
 * plan does not read them as codes (cuBLASLt had no algorithm) gets ws
 * after its own for the decoded copies, as the CPU's run_node does. */
loom_status loom_cuda_fp8_storage_plan(loom_cuda_ctx *c, const loom_plan *p)
{
	const loom_graph *g = p->g;
	for (loom_value v = 0; v < g->n; v++) {
		loom_cuda_node_plan *np = &c->plans[v];
		const loom_node *n = &g->nodes[v];
		np->fp8_dec = 0;
		if (loom_op_is_view(n->op))
			continue;
		size_t at = loom_cuda_align(np->ws);
		for (int i = 0; i < n->nsrc; i++) {
			if (!loom_fp8_stored_under(g, n->src[i]) || reads_codes(c, p, v, i))
				continue;
			if (!np->fp8_dec)
				np->fp8_dec_off = at;
			np->fp8_dec |= 1u << i;
			const loom_node *sn = &g->nodes[n->src[i]];
			at += loom_cuda_align(loom_dtype_size((loom_dtype)sn->dtype) *
					      (size_t)loom_shape_numel(&sn->shape));
		}
		if (np->fp8_dec)
			np->ws = at;
	}
	return LOOM_OK;
}

loom_status loom_cuda_fp8_decode_sources(loom_cuda_ctx *c, const loom_plan *p, loom_value v,
					 loom_cuda_io *io)
{
	const loom_cuda_node_plan *np = &c->plans[v];
	const loom_node *n = &p->g->nodes[v];
	unsigned char *at = c->arena->ws + np->fp8_dec_off;
	for (int i = 0; i < n->nsrc; i++) {
		if (!(np->fp8_dec & (1u << i)))
			continue;
		const loom_node *q = loom_fp8_stored_under(p->g, n->src[i]);
		const loom_node *sn = &p->g->nodes[n->src[i]];
		const int64_t cnt = loom_shape_numel(&sn->shape);
		loom_status st = loom_cuda_fp8_decode(c->err, c->stream, io->src[i], cnt, q->a.fp8.fwd,
						      at, sn->dtype);
		if (st != LOOM_OK)
			return st;
		io->src[i] = at;
		io->dt[i] = sn->dtype;
		at += loom_cuda_align(loom_dtype_size((loom_dtype)sn->dtype) * (size_t)cnt);
	}
	return LOOM_OK;
}

/* Test hook (no device: the rule alone, on any compiled plan): how many of
 * the plan's FP8_QDQ nodes a producer could give the amax, of how many. */
extern "C" void loom_cuda_test_fp8_amax_producers(const void *plan, int *given, int *qdqs)
{
	const loom_plan *p = (const loom_plan *)plan;
	*given = *qdqs = 0;
	for (loom_value v = 0; v < p->g->n; v++) {
		if (p->g->nodes[v].op != LOOM_OP_FP8_QDQ || !is_fp8(p->g->nodes[v].a.fp8.fwd))
			continue;
		*qdqs += 1;
		*given += amax_producer_rule(p->g, v) != LOOM_NONE;
	}
}

/* Test hook (no device): how many of the plan's FP8_QDQ nodes the
 * optimizer's amax rule takes, of how many. */
extern "C" void loom_cuda_test_fp8_amax_optim(const void *plan, int *given, int *qdqs)
{
	const loom_plan *p = (const loom_plan *)plan;
	*given = *qdqs = 0;
	for (loom_value v = 0; v < p->g->n; v++) {
		if (p->g->nodes[v].op != LOOM_OP_FP8_QDQ || !is_fp8(p->g->nodes[v].a.fp8.fwd))
			continue;
		*qdqs += 1;
		*given += amax_optim_rule(p, v) >= 0;
	}
}

loom_status loom_cuda_op_fp8_qdq(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				 const loom_cuda_io *io)
{
	const loom_node *n = &plan->g->nodes[v];
	const int64_t numel = loom_shape_numel(&n->shape);
	const int fmt = n->a.fp8.fwd;
	loom_status st;

	if (!is_fp8(fmt)) /* the forward of a gradient's rounding: a copy */
		return loom_cuda_cast(c->err, c->stream, io->src[0], io->dt[0], io->out, io->odt,
				      numel);
	if (!c->fp8_slots)
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_STATE,
				  "cuda fp8_qdq #%d: no scale slots (the plan has none)", (int)v);
	float *slot = c->fp8_slots + (size_t)v * LOOM_CUDA_FP8_SLOT;
	const loom_cuda_fp8_dev *d = &c->fp8_dev;
	const int slot_i = n->a.fp8.slot;
	loom_fp8_tensor *t = d->t && slot_i >= 0 && slot_i < d->n ? d->t + slot_i : NULL;
	const int delayed = t && d->delayed;
	/* The producer's kernel left the amax in slot[0] (loom_cuda_fp8_amax_plan):
	 * no amax pass. Else under delayed scaling the pass returns at once on
	 * the device once the history holds a step (the host cannot know
	 * without a wait). */
	const int given = c->plans && c->plans[v].fp8_amax != LOOM_NONE;
	/* The optimizer's cell of this weight (loom_cuda_fp8_wamax_plan),
	 * read while its flag says the weight is what the optimizer wrote;
	 * current scaling only (delayed takes the amax in the cast's pass). */
	const int cell = c->plans && !delayed ? c->plans[v].fp8_wamax : -1;
	const float *wamax = cell >= 0 ? c->wamax.amax + cell : NULL;
	const int *valid = cell >= 0 ? c->wamax.valid + cell : NULL;
	if (!given && (st = loom_cuda_fp8_amax(c->err, c->stream, io->src[0], io->dt[0], numel,
					       slot, delayed ? d->ring : NULL, wamax, valid)) !=
			      LOOM_OK)
		return st;
	if (delayed)
		return loom_cuda_fp8_qdq_delayed(c->err, c->stream, io->src[0], io->dt[0], io->out,
						 io->odt, numel, fmt, slot, t, d->ring, c->train,
						 given, n->a.fp8.store);
	/* current scaling: a training run records into the tensor's state */
	return loom_cuda_fp8_qdq(c->err, c->stream, io->src[0], io->dt[0], io->out, io->odt, numel,
				 fmt, slot, n->a.fp8.store, c->train ? t : NULL);
}

// ----------------------------------------------------------------------------
// delayed scaling's device state (loom_backend_fp8: backend.cu's table)

void loom_cuda_fp8_state_free(loom_cuda_ctx *c)
{
	if (c->fp8_dev.t)
		(void)cudaFree(c->fp8_dev.t);
	memset(&c->fp8_dev, 0, sizeof(c->fp8_dev));
}

/* One allocation: the tensors, the histories, the ring. */
static loom_status state_alloc(loom_cuda_ctx *c, const loom_fp8_state *fs)
{
	loom_cuda_fp8_dev *d = &c->fp8_dev;
	const size_t tb = loom_cuda_align(sizeof(loom_fp8_tensor) * (size_t)fs->n);
	const size_t hb = loom_cuda_align(sizeof(float) * (size_t)fs->n * fs->history_len);
	const size_t ab = loom_cuda_align(sizeof(float) * (size_t)fs->n);
	const size_t sb = loom_cuda_align(sizeof(double) * (size_t)fs->n);
	char *base = NULL;
	d->bytes = tb + hb + ab + sb + 2 * sizeof(int);
	loom_status st = LOOM_CUDA_CHECK(cudaMalloc((void **)&base, d->bytes), c->err,
					 sizeof(c->err));
	if (st != LOOM_OK)
		return st;
	d->t = (loom_fp8_tensor *)base;
	d->hist = (float *)(base + tb);
	d->amax = (float *)(base + tb + hb);
	d->sat = (double *)(base + tb + hb + ab);
	d->ring = (int *)(base + tb + hb + ab + sb);
	d->n = fs->n;
	d->len = fs->history_len;
	d->margin = fs->margin;
	d->delayed = fs->delayed;
	return LOOM_OK;
}

/* The tensors, the histories and the ring between ts.fp8 and the device's
 * copy in the compute stream's order, then a wait: the host arrays are
 * read or changed once this returns. to_device: fs is only read. */
static loom_status state_copy(loom_cuda_ctx *c, loom_fp8_state *fs, int to_device)
{
	const loom_cuda_fp8_dev *d = &c->fp8_dev;
	const cudaMemcpyKind k = to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
	int ring[2] = { fs->filled, fs->pos };
	void *host[3] = { fs->t, fs->history, ring }, *dev[3] = { d->t, d->hist, d->ring };
	const size_t bytes[3] = { sizeof(*fs->t) * (size_t)fs->n,
				  sizeof(float) * (size_t)fs->n * fs->history_len, sizeof(ring) };
	loom_status st = LOOM_OK;
	for (int i = 0; i < 3 && st == LOOM_OK; i++) {
		if (!bytes[i]) /* current scaling: no history */
			continue;
		st = LOOM_CUDA_CHECK(cudaMemcpyAsync(to_device ? dev[i] : host[i],
						     to_device ? host[i] : dev[i], bytes[i], k,
						     c->stream),
				     c->err, sizeof(c->err));
	}
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(loom_cuda_sync_stream(c, c->stream), c->err, sizeof(c->err));
	if (st == LOOM_OK && !to_device) {
		fs->filled = ring[0];
		fs->pos = ring[1];
	}
	return st;
}

/* ts.fp8 onto the device (at compile, after a checkpoint's load): the
 * state allocated the first time. Current scaling keeps the tensors
 * alone (no history, the ring unused): what its casts record for the
 * report. */
loom_status loom_cuda_fp8_state_upload(void *ctx, const loom_fp8_state *fs)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	loom_cuda_fp8_dev *d = &c->fp8_dev;
	loom_status st = loom_cuda_use_device(c);
	if (st != LOOM_OK)
		return st;
	if (d->t && (d->n != fs->n || d->len != fs->history_len || d->delayed != fs->delayed))
		loom_cuda_fp8_state_free(c);
	if (fs->n == 0 || (fs->delayed && fs->history_len <= 0))
		return LOOM_OK;
	if (!d->t && (st = state_alloc(c, fs)) != LOOM_OK)
		return st;
	d->margin = fs->margin;
	return state_copy(c, (loom_fp8_state *)fs, 1);
}

/* The device state into ts.fp8 (the host view: report, checkpoint); waits. */
loom_status loom_cuda_fp8_state_download(void *ctx, loom_fp8_state *fs)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	const loom_cuda_fp8_dev *d = &c->fp8_dev;
	loom_status st = loom_cuda_use_device(c);
	if (st != LOOM_OK || !d->t || d->n != fs->n || d->len != fs->history_len)
		return st;
	return state_copy(c, fs, 0);
}

static loom_status no_state(loom_cuda_ctx *c, const char *what)
{
	return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_STATE,
			  "cuda fp8 %s: no device state (the plan scales no tensor)", what);
}

/* The step end on the compute stream, inside the step (a captured step
 * holds it); the host's ts.fp8 is left as it was until a download. */
loom_status loom_cuda_fp8_state_step_end(void *ctx, const loom_plan *plan, int reduced)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	const loom_cuda_fp8_dev *d = &c->fp8_dev;
	(void)plan;
	if (!d->t)
		return no_state(c, "step end");
	return loom_cuda_fp8_step_end_launch(c->err, c->stream, d->t, d->hist, d->ring, d->n,
					     d->len, d->margin, reduced ? d->amax : NULL,
					     reduced ? d->sat : NULL);
}

/* The step's amaxes and counts packed for the executor's all-reduces. */
loom_status loom_cuda_fp8_state_reduce_begin(void *ctx, void **amax, void **saturated)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	const loom_cuda_fp8_dev *d = &c->fp8_dev;
	if (!d->t)
		return no_state(c, "reduction");
	loom_fp8_pack_kernel<<<loom_cuda_blocks(d->n, threads), threads, 0, c->stream>>>(
		d->t, d->n, d->amax, d->sat);
	*amax = d->amax;
	*saturated = d->sat;
	return LOOM_CUDA_LAUNCHED(c->err);
}

/* Test hook (no device): the groups of 8 the 128-bit path would take for
 * these addresses and dtypes under LOOM_CUDA_FP8_CAST_VEC=vec. */
extern "C" int64_t loom_cuda_test_fp8_vec_groups(int vec, int64_t n, uintptr_t x, int xdt,
						 uintptr_t y, int ydt, int ycodes)
{
	const int was = loom_cuda_fp8_vec_on;
	loom_cuda_fp8_vec_on = vec;
	const int64_t g = vec_groups(n, (const void *)x, xdt, (const void *)y, ydt, ycodes);
	loom_cuda_fp8_vec_on = was;
	return g;
}

/*
 * Test hook (needs a device): the casts' launchers, as
 * LOOM_CUDA_FP8_CAST_VEC=vec, on x's n bf16 values placed off elements
 * into a device buffer (off odd: x not 16-byte aligned, the scalar path;
 * a multiple of 8: the 128-bit one where vec): current scaling's amax
 * (out[0]) and QDQ, its scale (out[1]) and values into y (bf16, at the
 * same offset); the cast of x into codes q (at off bytes) with that
 * scale; the delayed cast (no history yet: the same scale; recorded)
 * stored as codes into q2 (at off rounded down to 4 bytes, the scale
 * after them), its recorded amax (out[2]) and saturated count (*sat).
 * 0, or -1 with the error in err.
 */
extern "C" int loom_cuda_test_fp8_casts(int vec, int fmt, const uint16_t *x, int64_t n,
					int64_t off, float out[3], int64_t *sat, uint16_t *y,
					unsigned char *q, unsigned char *q2, char *err, size_t errlen)
{
	char e[LOOM_ERR_MAX] = "";
	const int was = loom_cuda_fp8_vec_on;
	const int64_t off2 = off & ~(int64_t)3;
	float *slot = NULL;
	int *ring = NULL;
	loom_fp8_tensor *t = NULL, th;
	unsigned char *xd = NULL, *yd = NULL, *qd = NULL, *q2d = NULL;
	loom_status st = LOOM_OK;
	void **bufs[] = { (void **)&slot, (void **)&ring, (void **)&t, (void **)&xd,
			  (void **)&yd, (void **)&qd, (void **)&q2d };
	const size_t sizes[] = { 4 * sizeof(float), 2 * sizeof(int), sizeof(loom_fp8_tensor),
				 (size_t)(n + off) * 2, (size_t)(n + off) * 2, (size_t)(n + off),
				 (size_t)(off2 + ((n + 3) & ~(int64_t)3) + 4) };

	for (int i = 0; i < 7 && st == LOOM_OK; i++) {
		st = LOOM_CUDA_CHECK(cudaMalloc(bufs[i], sizes[i]), e, sizeof(e));
		if (st == LOOM_OK)
			st = LOOM_CUDA_CHECK(cudaMemset(*bufs[i], 0, sizes[i]), e, sizeof(e));
	}
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(cudaMemcpy(xd + off * 2, x, (size_t)n * 2, cudaMemcpyHostToDevice),
				     e, sizeof(e));
	loom_cuda_fp8_vec_on = vec;
	if (st == LOOM_OK)
		st = loom_cuda_fp8_amax(e, 0, xd + off * 2, LOOM_BF16, n, slot, NULL, NULL, NULL);
	if (st == LOOM_OK)
		st = loom_cuda_fp8_qdq(e, 0, xd + off * 2, LOOM_BF16, yd + off * 2, LOOM_BF16, n, fmt,
				       slot, 0, NULL);
	if (st == LOOM_OK)
		st = loom_cuda_fp8_cast(e, 0, xd + off * 2, LOOM_BF16, 1, n, 0, fmt, slot + 1, qd + off);
	if (st == LOOM_OK)
		st = loom_cuda_fp8_qdq_delayed(e, 0, xd + off * 2, LOOM_BF16, q2d + off2, LOOM_BF16, n,
					       fmt, slot, t, ring, 1, 0, 1);
	loom_cuda_fp8_vec_on = was;
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(cudaDeviceSynchronize(), e, sizeof(e));
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(cudaMemcpy(out, slot, 2 * sizeof(float), cudaMemcpyDeviceToHost),
				     e, sizeof(e));
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(cudaMemcpy(y, yd + off * 2, (size_t)n * 2, cudaMemcpyDeviceToHost),
				     e, sizeof(e));
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(cudaMemcpy(q, qd + off, (size_t)n, cudaMemcpyDeviceToHost), e,
				     sizeof(e));
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(cudaMemcpy(q2, q2d + off2, (size_t)n, cudaMemcpyDeviceToHost), e,
				     sizeof(e));
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(cudaMemcpy(&th, t, sizeof(th), cudaMemcpyDeviceToHost), e,
				     sizeof(e));
	if (st == LOOM_OK) {
		out[2] = th.amax;
		*sat = th.saturated;
	}
	for (int i = 0; i < 7; i++)
		if (*bufs[i])
			(void)cudaFree(*bufs[i]);
	snprintf(err, errlen, "%s", e);
	return st == LOOM_OK ? 0 : -1;
}
