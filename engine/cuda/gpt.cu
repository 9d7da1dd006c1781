/*
 * engine/cuda/gpt.cu — the transformer ops on the GPU: embedding gather and
 * scatter-add, layer norm over the last dim (and its dx, dgamma), and the
 * two halves of causal attention with their backward nodes. CPU twins:
 * engine/cpu/gpt_impl.h (same formulas, statistics and softmax sums in
 * double, the scatter-add in row order).
 *
 * The attention products go through cuBLASLt strided-batched calls (one
 * per sequence of the batch, its heads the batch: a head's q, k, v are
 * columns h * hs of the fused qkv, so the per-head operands lie hs apart
 * with row stride 3C, and no permuted copy is made), the causal softmax
 * and its backward through own kernels, as llm.c's attention (the scores
 * in fp32 whatever the dtypes). A product node whose sources and output
 * differ in dtype, or a shape cuBLASLt has no algorithm for, takes the own
 * product kernels below (one thread per output element,
 * correctness first). Status as the rest of engine/cuda (README.md): run
 * on an H200 through the GPU suite, except the chunked gamma gradient,
 * written after that run.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cub/device/device_radix_sort.cuh>

#include "engine/cuda/dtype.cuh"
#include "graph/unary.h"

static const int threads = 256;

// ----------------------------------------------------------------------------
// CUDA kernels

/* y[i, j] = table[ids[i], j]; an id outside [0, v) gives a zero row. */
__global__ void loom_embedding_fwd_kernel(int64_t n, int v, int c, const int32_t *ids,
					  const void *table, int tdt, void *y, int ydt)
{
	for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n * c;
	     e += (int64_t)gridDim.x * blockDim.x) {
		int64_t i = e / c;
		int j = (int)(e % c), id = ids[i];
		loom_st(y, ydt, e, id >= 0 && id < v ? loom_ld(table, tdt, (int64_t)id * c + j) : 0.0f);
	}
}

/* One thread per column: rows added in order into fp32 acc [v, c] (zeroed
 * first), as the CPU does, so the sums are the CPU's bit for bit. */
__global__ void loom_embedding_bwd_kernel(int64_t n, int v, int c, const int32_t *ids,
					  const void *dy, int dydt, float *acc)
{
	for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < c; j += gridDim.x * blockDim.x)
		for (int64_t i = 0; i < n; i++) {
			int id = ids[i];
			if (id >= 0 && id < v)
				acc[(int64_t)id * c + j] += loom_ld(dy, dydt, i * c + j);
		}
}

/* The bucketed embedding backward (loom_cuda_emb_bucket_on): key[i] = the
 * id of position i (v for an id outside [0, v): no row), val[i] = i; a
 * stable radix sort by key then puts each token's positions together, in
 * position order. */
__global__ void loom_embedding_keys_kernel(int64_t n, int v, const int32_t *ids, int32_t *key,
					   int32_t *val)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		int id = ids[i];
		key[i] = id >= 0 && id < v ? id : v;
		val[i] = (int32_t)i;
	}
}

/* One block per sorted position s; the block whose s starts a run of equal
 * ids adds that run's rows of dy, in position order, into row id of dw
 * (zeroed first for the ids that never occur), one thread per column: the
 * additions of the CPU's row-order scatter-add, in fp32, rounded once to
 * dw's dtype. Each row of dw is written by one block only, so no atomics
 * and the same bits every run. */
__global__ void loom_embedding_bwd_bucket_kernel(int64_t n, int v, int c, const int32_t *key,
						 const int32_t *val, const void *dy, int dydt,
						 void *dw, int dwdt)
{
	for (int64_t s = blockIdx.x; s < n; s += gridDim.x) {
		const int id = key[s];
		if (id >= v || (s > 0 && key[s - 1] == id))
			continue;
		int64_t end = s + 1;
		while (end < n && key[end] == id)
			end++;
		for (int j = threadIdx.x; j < c; j += blockDim.x) {
			float acc = 0;
			for (int64_t r = s; r < end; r++)
				acc += loom_ld(dy, dydt, (int64_t)val[r] * c + j);
			loom_st(dw, dwdt, (int64_t)id * c + j, acc);
		}
	}
}

/* Mean and 1 / sqrt(var + eps) of row r (every thread of the block). */
static __device__ void ln_stats(const void *x, int xdt, int64_t r, int c, double eps,
				double *mean, double *rstd)
{
	double s = 0;
	for (int j = threadIdx.x; j < c; j += blockDim.x)
		s += loom_ld(x, xdt, r * c + j);
	double m = loom_block_sum(s) / c, ss = 0;
	for (int j = threadIdx.x; j < c; j += blockDim.x) {
		double d = loom_ld(x, xdt, r * c + j) - m;
		ss += d * d;
	}
	*mean = m;
	*rstd = 1.0 / sqrt(loom_block_sum(ss) / c + eps);
}

/* One block per row. */
__global__ void loom_layernorm_fwd_kernel(int c, const void *x, int xdt, const void *g, int gdt,
					  const void *b, int bdt, double eps, void *y, int ydt)
{
	const int64_t r = blockIdx.x;
	double m, rs;
	ln_stats(x, xdt, r, c, eps, &m, &rs);
	for (int j = threadIdx.x; j < c; j += blockDim.x)
		loom_st(y, ydt, r * c + j,
			(float)((loom_ld(x, xdt, r * c + j) - m) * rs * loom_ld(g, gdt, j) +
				loom_ld(b, bdt, j)));
}

/* One block per row: dx = rstd (g dy - mean(g dy) - xhat mean(g dy xhat)). */
__global__ void loom_layernorm_bwd_data_kernel(int c, const void *x, int xdt, const void *g,
					       int gdt, const void *dy, int dydt, double eps,
					       void *dx, int dxdt)
{
	const int64_t r = blockIdx.x;
	double m, rs, a = 0, b = 0;
	ln_stats(x, xdt, r, c, eps, &m, &rs);
	for (int j = threadIdx.x; j < c; j += blockDim.x) {
		double gd = (double)loom_ld(g, gdt, j) * loom_ld(dy, dydt, r * c + j);
		a += gd;
		b += gd * (loom_ld(x, xdt, r * c + j) - m) * rs;
	}
	a = loom_block_sum(a) / c;
	b = loom_block_sum(b) / c;
	for (int j = threadIdx.x; j < c; j += blockDim.x) {
		double xh = (loom_ld(x, xdt, r * c + j) - m) * rs;
		double gd = (double)loom_ld(g, gdt, j) * loom_ld(dy, dydt, r * c + j);
		loom_st(dx, dxdt, r * c + j, (float)(rs * (gd - a - xh * b)));
	}
}

/* One block per row: its mean and rstd into stats[2r], stats[2r + 1]. */
__global__ void loom_layernorm_stats_kernel(int c, const void *x, int xdt, double eps,
					    double *stats)
{
	const int64_t r = blockIdx.x;
	double m, rs;
	ln_stats(x, xdt, r, c, eps, &m, &rs);
	if (threadIdx.x == 0) {
		stats[2 * r] = m;
		stats[2 * r + 1] = rs;
	}
}

/* dgamma[j] = sum over rows of dy xhat, in two launches whose order of
 * additions depends only on the shape (deterministic, as the CPU's is):
 * the rows are cut into chunks of `per` rows; block (x, k) of 32 x 8
 * threads sums chunk k for 32 columns (thread row y takes rows y, y + 8,
 * ..., the warp's 32 columns side by side, so each load is coalesced), its
 * 8 partial sums added in y order into part[k * c + j]; then one thread
 * per column adds the chunks' parts in k order. One thread per column over
 * all rows (the first version) ran 768 threads for GPT-2: 75 of 166 ms of
 * its step on an H200. */
static const int ln_cols = 32, ln_lanes = 8;

__global__ void loom_layernorm_bwd_gamma_part_kernel(int64_t rows, int64_t per, int c,
						     const void *x, int xdt, const void *dy,
						     int dydt, const double *stats, double *part)
{
	__shared__ double sh[ln_lanes][ln_cols + 1];
	const int j = blockIdx.x * ln_cols + threadIdx.x;
	const int64_t k = blockIdx.y, end = (k + 1) * per < rows ? (k + 1) * per : rows;
	double s = 0;
	if (j < c)
		for (int64_t r = k * per + threadIdx.y; r < end; r += ln_lanes)
			s += (double)loom_ld(dy, dydt, r * c + j) *
			     (loom_ld(x, xdt, r * c + j) - stats[2 * r]) * stats[2 * r + 1];
	sh[threadIdx.y][threadIdx.x] = s;
	__syncthreads();
	if (threadIdx.y == 0 && j < c) {
		double t = 0;
		for (int y = 0; y < ln_lanes; y++)
			t += sh[y][threadIdx.x];
		part[k * c + j] = t;
	}
}

__global__ void loom_layernorm_bwd_gamma_fold_kernel(int chunks, int c, const double *part,
						     void *dg, int dgdt)
{
	for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < c; j += gridDim.x * blockDim.x) {
		double s = 0;
		for (int k = 0; k < chunks; k++)
			s += part[(int64_t)k * c + j];
		loom_st(dg, dgdt, j, (float)s);
	}
}

/* The chunking of loom_layernorm_bwd_gamma_part_kernel: at most
 * LOOM_LN_CHUNKS chunks of at least 32 rows (4 per thread row). */
#define LOOM_LN_CHUNKS 256
static void ln_chunks(int64_t rows, int64_t *per, int *chunks)
{
	int64_t p = (rows + LOOM_LN_CHUNKS - 1) / LOOM_LN_CHUNKS;
	if (p < 32)
		p = 32;
	*per = p;
	*chunks = (int)((rows + p - 1) / p);
}

/*
 * Layer norm, one pass per row each way (loom_cuda_ln_fused_on,
 * LOOM_CUDA_LN_FUSED=0: the kernels above). Rows are read W elements at a
 * time: W = 8 (128-bit loads of f16/bf16, two float4 of f32) where the
 * last dim is a multiple of 8 and every pointer 16-byte aligned, else 1.
 * Statistics and sums in double, as above and on the CPU.
 */
template <int W>
static __device__ __forceinline__ void ln_ldv(const void *p, int dt, int64_t i, float v[W])
{
	if constexpr (W == 8) {
		if (dt == LOOM_F32) {
			const float4 a = *(const float4 *)((const float *)p + i);
			const float4 b = *(const float4 *)((const float *)p + i + 4);
			v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
			v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
		} else if (dt == LOOM_F16) {
			const uint4 u = *(const uint4 *)((const __half *)p + i);
			const __half *h = (const __half *)&u;
#pragma unroll
			for (int k = 0; k < 8; k++)
				v[k] = __half2float(h[k]);
		} else {
			const uint4 u = *(const uint4 *)((const __nv_bfloat16 *)p + i);
			const __nv_bfloat16 *h = (const __nv_bfloat16 *)&u;
#pragma unroll
			for (int k = 0; k < 8; k++)
				v[k] = __bfloat162float(h[k]);
		}
	} else {
#pragma unroll
		for (int k = 0; k < W; k++)
			v[k] = loom_ld(p, dt, i + k);
	}
}

template <int W>
static __device__ __forceinline__ void ln_stv(void *p, int dt, int64_t i, const float v[W])
{
	if constexpr (W == 8) {
		if (dt == LOOM_F32) {
			*(float4 *)((float *)p + i) = make_float4(v[0], v[1], v[2], v[3]);
			*(float4 *)((float *)p + i + 4) = make_float4(v[4], v[5], v[6], v[7]);
		} else if (dt == LOOM_F16) {
			uint4 u;
			__half *h = (__half *)&u;
#pragma unroll
			for (int k = 0; k < 8; k++)
				h[k] = __float2half_rn(v[k]);
			*(uint4 *)((__half *)p + i) = u;
		} else {
			uint4 u;
			__nv_bfloat16 *h = (__nv_bfloat16 *)&u;
#pragma unroll
			for (int k = 0; k < 8; k++)
				h[k] = __float2bfloat16_rn(v[k]);
			*(uint4 *)((__nv_bfloat16 *)p + i) = u;
		}
	} else {
#pragma unroll
		for (int k = 0; k < W; k++)
			loom_st(p, dt, i + k, v[k]);
	}
}

static __device__ __forceinline__ double warp_sum(double v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

/* One warp per row: mean and rstd of the row (two passes, the second from
 * L1), then y = (x - mean) rstd gamma + beta. */
template <int W>
__global__ void loom_layernorm_fwd_warp_kernel(int64_t rows, int c, const void *x, int xdt,
					       const void *g, int gdt, const void *b, int bdt,
					       double eps, void *y, int ydt, double *stats)
{
	const int lane = threadIdx.x & 31;
	const int64_t r = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
	if (r >= rows)
		return;
	const int64_t o = r * c;
	float v[W], gv[W], bv[W];
	double s = 0;
	for (int j = lane * W; j < c; j += 32 * W) {
		ln_ldv<W>(x, xdt, o + j, v);
#pragma unroll
		for (int k = 0; k < W; k++)
			s += v[k];
	}
	const double m = warp_sum(s) / c;
	double ss = 0;
	for (int j = lane * W; j < c; j += 32 * W) {
		ln_ldv<W>(x, xdt, o + j, v);
#pragma unroll
		for (int k = 0; k < W; k++)
			ss += (v[k] - m) * (v[k] - m);
	}
	const double rs = 1.0 / sqrt(warp_sum(ss) / c + eps);
	if (stats && lane == 0) { /* LOOM_CUDA_LN_SAVE: for the backward */
		stats[2 * r] = m;
		stats[2 * r + 1] = rs;
	}
	for (int j = lane * W; j < c; j += 32 * W) {
		ln_ldv<W>(x, xdt, o + j, v);
		ln_ldv<W>(g, gdt, j, gv);
		ln_ldv<W>(b, bdt, j, bv);
#pragma unroll
		for (int k = 0; k < W; k++)
			v[k] = (float)((v[k] - m) * rs * gv[k] + bv[k]);
		ln_stv<W>(y, ydt, o + j, v);
	}
}

/*
 * dx, dgamma and dbeta in one pass over x and dy: block k takes the rows
 * of chunk k (ln_chunks) one after the other, all its threads on a row;
 * each thread owns the same columns in every row, so it adds the chunk's
 * dy xhat and dy into its own columns of shared memory (acc: 2c doubles)
 * with no atomics, in row order; the chunks' parts go to part_g, part_b
 * ([chunks, c]) and loom_layernorm_bwd_gamma_fold_kernel adds them in
 * chunk order. Every sum's order depends only on the shape: the same bits
 * every run. The row's statistics are recomputed from the row the block
 * reads anyway (no saved mean/rstd to keep alive between the passes); the
 * passes after the first over a row are meant to hit the cache.
 */
static const int ln_bwd_threads = 128;
/* 2c doubles of shared memory (32 KiB), with the block sums' own under the
 * 48 KiB a launch gets without opting in. */
#define LOOM_LN_FUSED_MAX_C 2048

template <int W>
__global__ void loom_layernorm_bwd_fused_kernel(int64_t rows, int64_t per, int c, const void *x,
						int xdt, const void *g, int gdt, const void *dy,
						int dydt, double eps, void *dx, int dxdt,
						double *part_g, double *part_b, const double *stats)
{
	extern __shared__ double acc[];
	const int64_t k = blockIdx.x, r0 = k * per, r1 = r0 + per < rows ? r0 + per : rows;
	const int step = blockDim.x * W;
	float xv[W], dv[W], gv[W];
	for (int j = threadIdx.x * W; j < c; j += step)
#pragma unroll
		for (int q = 0; q < W; q++)
			acc[j + q] = acc[c + j + q] = 0;
	for (int64_t r = r0; r < r1; r++) {
		const int64_t o = r * c;
		double s = 0, ss = 0, a = 0, b = 0, m, rs;
		if (stats) { /* saved by the forward (LOOM_CUDA_LN_SAVE) */
			m = stats[2 * r];
			rs = stats[2 * r + 1];
		} else {
			for (int j = threadIdx.x * W; j < c; j += step) {
				ln_ldv<W>(x, xdt, o + j, xv);
#pragma unroll
				for (int q = 0; q < W; q++)
					s += xv[q];
			}
			m = loom_block_sum(s) / c;
			for (int j = threadIdx.x * W; j < c; j += step) {
				ln_ldv<W>(x, xdt, o + j, xv);
#pragma unroll
				for (int q = 0; q < W; q++)
					ss += (xv[q] - m) * (xv[q] - m);
			}
			rs = 1.0 / sqrt(loom_block_sum(ss) / c + eps);
		}
		for (int j = threadIdx.x * W; j < c; j += step) {
			ln_ldv<W>(x, xdt, o + j, xv);
			ln_ldv<W>(dy, dydt, o + j, dv);
			ln_ldv<W>(g, gdt, j, gv);
#pragma unroll
			for (int q = 0; q < W; q++) {
				const double xh = (xv[q] - m) * rs, gd = (double)gv[q] * dv[q];
				a += gd;
				b += gd * xh;
				acc[j + q] += (double)dv[q] * xh;
				acc[c + j + q] += dv[q];
			}
		}
		a = loom_block_sum(a) / c;
		b = loom_block_sum(b) / c;
		for (int j = threadIdx.x * W; j < c; j += step) {
			ln_ldv<W>(x, xdt, o + j, xv);
			ln_ldv<W>(dy, dydt, o + j, dv);
			ln_ldv<W>(g, gdt, j, gv);
#pragma unroll
			for (int q = 0; q < W; q++) {
				const double xh = (xv[q] - m) * rs, gd = (double)gv[q] * dv[q];
				xv[q] = (float)(rs * (gd - a - xh * b));
			}
			ln_stv<W>(dx, dxdt, o + j, xv);
		}
	}
	for (int j = threadIdx.x * W; j < c; j += step)
#pragma unroll
		for (int q = 0; q < W; q++) {
			part_g[k * c + j + q] = acc[j + q];
			part_b[k * c + j + q] = acc[c + j + q];
		}
}

/* Row `row` (position i) of p from its fp32 scores, the block's max mx of
 * them given: the causal softmax, 0 above the diagonal. Every thread reads
 * sc[j] for its own j before writing p[j], so p may be sc (fp32). */
static __device__ void causal_softmax_row(int t, int i, int64_t row, const float *sc, double mx,
					  void *p, int pdt)
{
	double sum = 0;
	for (int j = threadIdx.x; j <= i; j += blockDim.x)
		sum += exp((double)sc[row * t + j] - mx);
	sum = loom_block_sum(sum);
	for (int j = threadIdx.x; j < t; j += blockDim.x)
		loom_st(p, pdt, row * t + j,
			j <= i ? (float)(exp((double)sc[row * t + j] - mx) / sum) : 0.0f);
}

/* One block per row (b, h, i) of p: the causal softmax of q_i k_j scale;
 * the scores wait in fp32 sc (p itself when p is fp32), so a half p is
 * rounded once, as on the CPU. */
__global__ void loom_attn_probs_kernel(int t, int c, int nh, const void *qkv, int qdt, void *p,
				       int pdt, float *sc)
{
	const int64_t row = blockIdx.x;
	const int i = (int)(row % t), h = (int)(row / t % nh), b = (int)(row / t / nh);
	const int hs = c / nh;
	const int64_t c3 = 3 * (int64_t)c, q0 = ((int64_t)b * t + i) * c3 + h * hs;
	const double scale = 1.0 / sqrt((double)hs);
	double mx = -INFINITY;
	for (int j = threadIdx.x; j <= i; j += blockDim.x) {
		const int64_t k0 = ((int64_t)b * t + j) * c3 + c + h * hs;
		float s = 0;
		for (int d = 0; d < hs; d++)
			s += loom_ld(qkv, qdt, q0 + d) * loom_ld(qkv, qdt, k0 + d);
		s = (float)(s * scale);
		sc[row * t + j] = s; /* each thread reads back only its own */
		mx = s > mx ? s : mx;
	}
	causal_softmax_row(t, i, row, sc, loom_block_max(mx), p, pdt);
}

/* One block per row (b, h, i) of the scores sc (fp32, made by cuBLASLt):
 * p = their causal softmax; p may be sc (fp32). */
__global__ void loom_attn_softmax_kernel(int t, const float *sc, void *p, int pdt)
{
	const int64_t row = blockIdx.x;
	const int i = (int)(row % t);
	double mx = -INFINITY;
	for (int j = threadIdx.x; j <= i; j += blockDim.x) {
		double s = sc[row * t + j];
		mx = s > mx ? s : mx;
	}
	causal_softmax_row(t, i, row, sc, loom_block_max(mx), p, pdt);
}

/* One block per row (b, h, i): ds = p (dp - sum_j p dp) into ws, in dsdt
 * (fp32 for the own kernels, the products' dtype for cuBLASLt). */
__global__ void loom_attn_softmax_bwd_kernel(int t, const void *p, int pdt, const void *dp,
					     int dpdt, void *ds, int dsdt)
{
	const int64_t row = blockIdx.x;
	const int i = (int)(row % t);
	double dot = 0;
	for (int j = threadIdx.x; j <= i; j += blockDim.x)
		dot += (double)loom_ld(p, pdt, row * t + j) * loom_ld(dp, dpdt, row * t + j);
	dot = loom_block_sum(dot);
	for (int j = threadIdx.x; j < t; j += blockDim.x)
		loom_st(ds, dsdt, row * t + j,
			j <= i ? (float)(loom_ld(p, pdt, row * t + j) *
					 (loom_ld(dp, dpdt, row * t + j) - dot)) :
				 0.0f);
}

/* One thread per element of dqkv [b, t, 3c]: q part sum_j ds_ij k_j scale,
 * k part sum_i ds_ij q_i scale, v part 0. */
__global__ void loom_attn_qk_grad_kernel(int b_, int t, int c, int nh, const void *qkv, int qdt,
					 const float *ds, void *dqkv, int odt)
{
	const int hs = c / nh;
	const int64_t c3 = 3 * (int64_t)c, total = (int64_t)b_ * t * c3;
	const float scale = (float)(1.0 / sqrt((double)hs));
	for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
	     e += (int64_t)gridDim.x * blockDim.x) {
		int col = (int)(e % c3), pos = (int)(e / c3 % t), b = (int)(e / c3 / t);
		int part = col / c, h = col % c / hs, d = col % hs;
		float s = 0;
		if (part == 0) { /* dq_pos = sum_j ds[pos, j] k_j */
			const float *dr = ds + (((int64_t)b * nh + h) * t + pos) * t;
			for (int j = 0; j <= pos; j++)
				s += dr[j] * loom_ld(qkv, qdt, ((int64_t)b * t + j) * c3 + c + h * hs + d);
		} else if (part == 1) { /* dk_pos = sum_i ds[i, pos] q_i */
			const float *dcol = ds + ((int64_t)b * nh + h) * t * t + pos;
			for (int i = pos; i < t; i++)
				s += dcol[(int64_t)i * t] *
				     loom_ld(qkv, qdt, ((int64_t)b * t + i) * c3 + h * hs + d);
		}
		loom_st(dqkv, odt, e, s * scale);
	}
}

/* One thread per element of y [b, t, c]: y_i = sum_j p_ij v_j (all j). */
__global__ void loom_attention_fwd_kernel(int b_, int t, int c, int nh, const void *p, int pdt,
					  const void *qkv, int qdt, void *y, int ydt)
{
	const int hs = c / nh;
	const int64_t c3 = 3 * (int64_t)c, total = (int64_t)b_ * t * c;
	for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
	     e += (int64_t)gridDim.x * blockDim.x) {
		int col = (int)(e % c), i = (int)(e / c % t), b = (int)(e / c / t);
		int h = col / hs;
		const int64_t pr = (((int64_t)b * nh + h) * t + i) * t;
		float s = 0;
		for (int j = 0; j < t; j++)
			s += loom_ld(p, pdt, pr + j) *
			     loom_ld(qkv, qdt, ((int64_t)b * t + j) * c3 + 2 * c + col);
		loom_st(y, ydt, e, s);
	}
}

/* One thread per element of dp [b, nh, t, t]: dy_i . v_j. */
__global__ void loom_attention_bwd_probs_kernel(int b_, int t, int c, int nh, const void *qkv,
						int qdt, const void *dy, int dydt, void *dp,
						int dpdt)
{
	const int hs = c / nh;
	const int64_t c3 = 3 * (int64_t)c, total = (int64_t)b_ * nh * t * t;
	for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
	     e += (int64_t)gridDim.x * blockDim.x) {
		int j = (int)(e % t), i = (int)(e / t % t), h = (int)(e / t / t % nh);
		int b = (int)(e / t / t / nh);
		float s = 0;
		for (int d = 0; d < hs; d++)
			s += loom_ld(dy, dydt, ((int64_t)b * t + i) * c + h * hs + d) *
			     loom_ld(qkv, qdt, ((int64_t)b * t + j) * c3 + 2 * c + h * hs + d);
		loom_st(dp, dpdt, e, s);
	}
}

/* One thread per element of dqkv: v part sum_i p_ij dy_i, q and k parts 0. */
__global__ void loom_attention_bwd_qkv_kernel(int b_, int t, int c, int nh, const void *p,
					      int pdt, const void *dy, int dydt, void *dqkv,
					      int odt)
{
	const int hs = c / nh;
	const int64_t c3 = 3 * (int64_t)c, total = (int64_t)b_ * t * c3;
	for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
	     e += (int64_t)gridDim.x * blockDim.x) {
		int col = (int)(e % c3), j = (int)(e / c3 % t), b = (int)(e / c3 / t);
		float s = 0;
		if (col >= 2 * c) {
			int vc = col - 2 * c, h = vc / hs;
			const int64_t p0 = ((int64_t)b * nh + h) * t * t + j;
			for (int i = 0; i < t; i++)
				s += loom_ld(p, pdt, p0 + (int64_t)i * t) *
				     loom_ld(dy, dydt, ((int64_t)b * t + i) * c + vc);
		}
		loom_st(dqkv, odt, e, s);
	}
}

// ----------------------------------------------------------------------------
// kernel launchers and op entries

static const loom_node *nd(const loom_plan *p, loom_value v)
{
	return &p->g->nodes[v];
}

static const loom_node *src_of(const loom_plan *p, loom_value v, int i)
{
	return &p->g->nodes[p->g->nodes[v].src[i]];
}

/* The switches of this file's new kernels, each against the old one it
 * replaces, read when a plan is made (plan_create): LOOM_CUDA_LN_FUSED=0
 * layer norm's block-per-row forward and separate backward kernels (dx;
 * dgamma; dbeta as a channel sum), LOOM_CUDA_EMB_BUCKET=0
 * the embedding backward's one thread per column over every token,
 * LOOM_CUDA_LT_CACHE=0 a heuristic query per strided product
 * (matmul_cublaslt.cu). */
int loom_cuda_emb_bucket_on = 1;
int loom_cuda_ln_fused_on = 1;

static int switch_on(const char *name)
{
	const char *e = getenv(name);
	return !(e && !strcmp(e, "0"));
}

void loom_cuda_gpt_switches(void)
{
	loom_cuda_emb_bucket_on = switch_on("LOOM_CUDA_EMB_BUCKET");
	loom_cuda_ln_fused_on = switch_on("LOOM_CUDA_LN_FUSED");
	loom_cuda_lt_cache_on = switch_on("LOOM_CUDA_LT_CACHE");
}

/*
 * The ops whose CUDA entries are own kernels that read each source in its
 * dtype and write theirs in its own (loom_ld / loom_st, fp32 inside, one
 * rounding on the way out): a narrowing cast after one of them folds into
 * it, a widening cast before them goes into its readers (graph/fuse.c).
 * Not the library calls (products, convolutions, cuDNN's batch norm: one
 * dtype for all operands), nor the attention (its cuBLASLt products want
 * their sources alike), nor pooling and batch norm's own kernels (not
 * checked for it).
 */
int loom_cuda_takes_any_dtype(loom_op op)
{
	const char *e = getenv("LOOM_CUDA_FOLD_CASTS");
	if (e && !strcmp(e, "0"))
		return 0;
	switch (op) {
	case LOOM_OP_ADD:
	case LOOM_OP_RELU:
	case LOOM_OP_RELU_BWD:
	case LOOM_OP_CHANNEL_SUM:
	case LOOM_OP_SOFTMAX_CE:
	case LOOM_OP_SOFTMAX_CE_BWD:
	case LOOM_OP_EMBEDDING:
	case LOOM_OP_EMBEDDING_BWD:
	case LOOM_OP_LAYERNORM:
	case LOOM_OP_LAYERNORM_BWD_DATA:
	case LOOM_OP_LAYERNORM_BWD_GAMMA:
#define UNARY_CASE(NAME, low) case LOOM_OP_##NAME: case LOOM_OP_##NAME##_BWD:
	LOOM_UNARY_OPS(UNARY_CASE)
#undef UNARY_CASE
		return 1;
	default:
		return 0;
	}
}

/* The bits a key in [0, v] needs. */
static int key_bits(int v)
{
	int b = 1;
	while (b < 31 && ((int64_t)1 << b) <= v)
		b++;
	return b;
}

/* The bucketed backward's workspace for n ids: keys and values, sorted and
 * not, then cub's own; 0 when cub cannot size it (the old kernel runs). */
static size_t emb_bucket_ws(int64_t n, int v, size_t *cub_bytes)
{
	size_t tmp = 0;
	*cub_bytes = 0;
	if (n <= 0 || n > INT32_MAX || v <= 0 || v == INT32_MAX)
		return 0;
	if (cub::DeviceRadixSort::SortPairs(NULL, tmp, (const int32_t *)NULL, (int32_t *)NULL,
					    (const int32_t *)NULL, (int32_t *)NULL, (int)n, 0,
					    key_bits(v)) != cudaSuccess) {
		cudaGetLastError();
		return 0;
	}
	*cub_bytes = tmp;
	return 4 * loom_cuda_align(sizeof(int32_t) * (size_t)n) + loom_cuda_align(tmp);
}

/* An embedding backward whose gradient is half sums in fp32 workspace;
 * the bucketed one writes any dtype itself and needs its sort's (the
 * larger of the two). */
static size_t embedding_bwd_ws(const loom_plan *p, loom_value v)
{
	const loom_node *n = nd(p, v);
	size_t cub_bytes, b = 0;
	size_t old = n->dtype == LOOM_F32 ?
			     0 : loom_cuda_align(sizeof(float) * (size_t)loom_shape_numel(&n->shape));
	if (loom_cuda_emb_bucket_on)
		b = emb_bucket_ws(loom_shape_numel(&src_of(p, v, 0)->shape), (int)n->shape.dims[0],
				  &cub_bytes);
	/* Both: the switch is global, and another plan may turn it off. */
	return b > old ? b : old;
}

/* The bucketed embedding backward: sort, zero dw, add the runs. done is 0
 * when it did not run (no workspace of its own was planned). */
static loom_status embedding_bwd_bucket(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
					const loom_cuda_io *io, int *done)
{
	const loom_node *n = nd(plan, v);
	int64_t cnt = loom_shape_numel(&src_of(plan, v, 0)->shape), total = loom_shape_numel(&n->shape);
	int vocab = (int)n->shape.dims[0], cc = (int)n->shape.dims[1];
	size_t cub_bytes, ws = emb_bucket_ws(cnt, vocab, &cub_bytes);
	*done = 0;
	if (!ws || ws > c->plans[v].ws)
		return LOOM_OK;
	const size_t part = loom_cuda_align(sizeof(int32_t) * (size_t)cnt);
	char *base = (char *)c->arena->ws;
	int32_t *key = (int32_t *)base, *val = (int32_t *)(base + part);
	int32_t *skey = (int32_t *)(base + 2 * part), *sval = (int32_t *)(base + 3 * part);
	loom_status st = LOOM_CUDA_CHECK(
		cudaMemsetAsync(io->out, 0, loom_dtype_size(n->dtype) * (size_t)total, c->stream),
		c->err, sizeof(c->err));
	if (st != LOOM_OK)
		return st;
	loom_embedding_keys_kernel<<<loom_cuda_blocks(cnt, threads), threads, 0, c->stream>>>(
		cnt, vocab, (const int32_t *)io->src[0], key, val);
	if ((st = LOOM_CUDA_LAUNCHED(c->err)) != LOOM_OK)
		return st;
	st = LOOM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + 4 * part, cub_bytes, key, skey,
							     val, sval, (int)cnt, 0,
							     key_bits(vocab), c->stream),
			     c->err, sizeof(c->err));
	if (st != LOOM_OK || cc <= 0)
		return st;
	unsigned blocks = cnt < 65535 * 16 ? (unsigned)cnt : 65535u * 16;
	loom_embedding_bwd_bucket_kernel<<<blocks, threads, 0, c->stream>>>(
		cnt, vocab, cc, skey, sval, io->src[1], io->dt[1], io->out, io->odt);
	if ((st = LOOM_CUDA_LAUNCHED(c->err)) == LOOM_OK)
		*done = 1;
	return st;
}

size_t loom_cuda_gpt_ws(const loom_plan *p, loom_value v)
{
	const loom_node *n = nd(p, v);
	switch (n->op) {
	case LOOM_OP_EMBEDDING_BWD:
		return embedding_bwd_ws(p, v);
	case LOOM_OP_LAYERNORM_BWD_GAMMA: { /* the rows' statistics, then the chunks' parts */
		const loom_shape *xs = &src_of(p, v, 0)->shape;
		int64_t rows = loom_shape_rows(xs), per;
		int chunks;
		ln_chunks(rows, &per, &chunks);
		return loom_cuda_align(2 * sizeof(double) * (size_t)rows) +
		       sizeof(double) * (size_t)chunks * (size_t)loom_shape_last(xs);
	}
	case LOOM_OP_ATTN_PROBS:
		return n->dtype == LOOM_F32 ? 0 :
					      loom_cuda_align(sizeof(float) * (size_t)loom_shape_numel(&n->shape));
	case LOOM_OP_ATTN_PROBS_BWD:
		return loom_cuda_align(sizeof(float) * (size_t)loom_shape_numel(&src_of(p, v, 1)->shape));
	default:
		return 0;
	}
}

loom_status loom_cuda_op_embedding(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				   const loom_cuda_io *io)
{
	const loom_node *w = src_of(plan, v, 1);
	int64_t n = loom_shape_numel(&src_of(plan, v, 0)->shape);
	int cc = (int)w->shape.dims[1];
	if (n * cc <= 0)
		return LOOM_OK;
	loom_embedding_fwd_kernel<<<loom_cuda_blocks(n * cc, threads), threads, 0, c->stream>>>(
		n, (int)loom_node_user_shape(w).dims[0] /* a padded table: the real rows */, cc,
		(const int32_t *)io->src[0], io->src[1], io->dt[1], io->out, io->odt);
	return LOOM_CUDA_LAUNCHED(c->err);
}

loom_status loom_cuda_op_embedding_bwd(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				       const loom_cuda_io *io)
{
	const loom_node *n = nd(plan, v);
	int64_t cnt = loom_shape_numel(&src_of(plan, v, 0)->shape), total = loom_shape_numel(&n->shape);
	int cc = (int)n->shape.dims[1], done = 0;
	loom_status st;
	if (loom_cuda_emb_bucket_on &&
	    ((st = embedding_bwd_bucket(c, plan, v, io, &done)) != LOOM_OK || done))
		return st;
	float *acc = n->dtype == LOOM_F32 ? (float *)io->out : (float *)c->arena->ws;
	st = LOOM_CUDA_CHECK(cudaMemsetAsync(acc, 0, sizeof(float) * total, c->stream),
					 c->err, sizeof(c->err));
	if (st != LOOM_OK || cc <= 0)
		return st;
	loom_embedding_bwd_kernel<<<loom_cuda_blocks(cc, threads), threads, 0, c->stream>>>(
		cnt, (int)n->shape.dims[0], cc, (const int32_t *)io->src[0], io->src[1], io->dt[1],
		acc);
	if ((st = LOOM_CUDA_LAUNCHED(c->err)) != LOOM_OK || n->dtype == LOOM_F32)
		return st;
	return loom_cuda_cast(c->err, c->stream, acc, LOOM_F32, io->out, io->odt, total);
}

/* 128-bit loads fit: the last dim a multiple of 8, every pointer aligned. */
static int ln_vec8(int cc, const void *const *p, int np)
{
	if (cc % 8)
		return 0;
	for (int i = 0; i < np; i++)
		if ((uintptr_t)p[i] % 16)
			return 0;
	return 1;
}

static loom_status layernorm_fwd_warp(loom_cuda_ctx *c, int64_t rows, int cc, double eps,
				      const loom_cuda_io *io, double *stats)
{
	const void *ptrs[4] = { io->src[0], io->src[1], io->src[2], io->out };
	const int per_block = threads / 32;
	const unsigned blocks = (unsigned)((rows + per_block - 1) / per_block);
	if (ln_vec8(cc, ptrs, 4))
		loom_layernorm_fwd_warp_kernel<8><<<blocks, threads, 0, c->stream>>>(
			rows, cc, io->src[0], io->dt[0], io->src[1], io->dt[1], io->src[2],
			io->dt[2], eps, io->out, io->odt, stats);
	else
		loom_layernorm_fwd_warp_kernel<1><<<blocks, threads, 0, c->stream>>>(
			rows, cc, io->src[0], io->dt[0], io->src[1], io->dt[1], io->src[2],
			io->dt[2], eps, io->out, io->odt, stats);
	return LOOM_CUDA_LAUNCHED(c->err);
}

loom_status loom_cuda_op_layernorm(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				   const loom_cuda_io *io)
{
	const loom_node *n = nd(plan, v);
	int64_t rows = loom_shape_rows(&n->shape);
	if (rows <= 0)
		return LOOM_OK;
	/* A grid of rows / 8 blocks: within the launch limit up to 2^34 rows. */
	if (loom_cuda_ln_fused_on && rows / (threads / 32) < 2147483647LL)
		return layernorm_fwd_warp(c, rows, (int)loom_shape_last(&n->shape), n->a.ln.eps, io,
					  (double *)loom_cuda_saved_slot(c, v, v));
	loom_layernorm_fwd_kernel<<<(unsigned)rows, threads, 0, c->stream>>>(
		(int)loom_shape_last(&n->shape), io->src[0], io->dt[0], io->src[1], io->dt[1],
		io->src[2], io->dt[2], n->a.ln.eps, io->out, io->odt);
	return LOOM_CUDA_LAUNCHED(c->err);
}

/* The fused backward's chunk parts: dgamma's, then dbeta's. */
static size_t ln_fused_ws(int64_t rows, int cc)
{
	int64_t per;
	int chunks;
	ln_chunks(rows, &per, &chunks);
	return 2 * loom_cuda_align(sizeof(double) * (size_t)chunks * (size_t)cc);
}

loom_status loom_cuda_ln_plan_make(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
				   loom_cuda_node_plan *np)
{
	const loom_node *n = nd(p, v);
	const int64_t rows = loom_shape_rows(&n->shape), cc = loom_shape_last(&n->shape);
	(void)c;
	np->ln.dgamma = np->ln.dbeta = LOOM_NONE;
	np->ws = 0;
	if (!loom_cuda_ln_fused_on || rows <= 0 || cc <= 0 || cc > LOOM_LN_FUSED_MAX_C)
		return LOOM_OK; /* the separate kernels */
	/* dgamma and dbeta, where graph/fuse.c made them this node's siblings. */
	for (loom_value w = loom_sibling_first(p, v); w != LOOM_NONE; w = loom_sibling_next(p, w)) {
		const loom_node *s = nd(p, w);
		if (s->op == LOOM_OP_LAYERNORM_BWD_GAMMA)
			np->ln.dgamma = w;
		else if (s->op == LOOM_OP_CHANNEL_SUM)
			np->ln.dbeta = w;
	}
	np->kind = LOOM_CUDA_PLAN_LN;
	np->ws = ln_fused_ws(rows, (int)cc);
	return LOOM_OK;
}

/* dx with its siblings dgamma and dbeta (those the plan found), in one
 * pass; then each sibling's chunk parts folded in order. */
static loom_status layernorm_bwd_fused(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				       const loom_cuda_io *io)
{
	const loom_node *n = nd(plan, v);
	const loom_cuda_ln_plan *lp = &c->plans[v].ln;
	const int64_t rows = loom_shape_rows(&n->shape);
	const int cc = (int)loom_shape_last(&n->shape);
	int64_t per;
	int chunks;
	ln_chunks(rows, &per, &chunks);
	double *part_g = (double *)c->arena->ws;
	double *part_b = (double *)((char *)c->arena->ws +
				    loom_cuda_align(sizeof(double) * (size_t)chunks * (size_t)cc));
	const void *ptrs[4] = { io->src[0], io->src[1], io->src[2], io->out };
	const size_t shm = 2 * sizeof(double) * (size_t)cc;
	const double *stats = (const double *)loom_cuda_saved_slot(c, v, LOOM_NONE);
	if (ln_vec8(cc, ptrs, 4))
		loom_layernorm_bwd_fused_kernel<8><<<(unsigned)chunks, ln_bwd_threads, shm, c->stream>>>(
			rows, per, cc, io->src[0], io->dt[0], io->src[1], io->dt[1], io->src[2],
			io->dt[2], n->a.ln.eps, io->out, io->odt, part_g, part_b, stats);
	else
		loom_layernorm_bwd_fused_kernel<1><<<(unsigned)chunks, ln_bwd_threads, shm, c->stream>>>(
			rows, per, cc, io->src[0], io->dt[0], io->src[1], io->dt[1], io->src[2],
			io->dt[2], n->a.ln.eps, io->out, io->odt, part_g, part_b, stats);
	loom_status st = LOOM_CUDA_LAUNCHED(c->err);
	const loom_value sib[2] = { lp->dgamma, lp->dbeta };
	const double *part[2] = { part_g, part_b };
	for (int i = 0; i < 2 && st == LOOM_OK; i++) {
		if (sib[i] == LOOM_NONE)
			continue;
		loom_layernorm_bwd_gamma_fold_kernel<<<loom_cuda_blocks(cc, threads), threads, 0,
						       c->stream>>>(
			chunks, cc, part[i], loom_arena_ptr(c->arena, plan, sib[i]), nd(plan, sib[i])->dtype);
		st = LOOM_CUDA_LAUNCHED(c->err);
	}
	return st;
}

loom_status loom_cuda_op_layernorm_bwd_data(loom_cuda_ctx *c, const loom_plan *plan,
					    loom_value v, const loom_cuda_io *io)
{
	const loom_node *n = nd(plan, v);
	int64_t rows = loom_shape_rows(&n->shape);
	if (rows <= 0)
		return LOOM_OK;
	if (c->plans[v].kind == LOOM_CUDA_PLAN_LN)
		return layernorm_bwd_fused(c, plan, v, io);
	loom_layernorm_bwd_data_kernel<<<(unsigned)rows, threads, 0, c->stream>>>(
		(int)loom_shape_last(&n->shape), io->src[0], io->dt[0], io->src[1], io->dt[1],
		io->src[2], io->dt[2], n->a.ln.eps, io->out, io->odt);
	return LOOM_CUDA_LAUNCHED(c->err);
}

loom_status loom_cuda_op_layernorm_bwd_gamma(loom_cuda_ctx *c, const loom_plan *plan,
					     loom_value v, const loom_cuda_io *io)
{
	const loom_node *n = nd(plan, v), *x = src_of(plan, v, 0);
	int64_t rows = loom_shape_rows(&x->shape);
	int cc = (int)loom_shape_last(&x->shape);
	double *stats = (double *)c->arena->ws;
	if (rows <= 0)
		return LOOM_OK;
	loom_layernorm_stats_kernel<<<(unsigned)rows, threads, 0, c->stream>>>(
		cc, io->src[0], io->dt[0], n->a.ln.eps, stats);
	loom_status st = LOOM_CUDA_LAUNCHED(c->err);
	if (st != LOOM_OK)
		return st;
	int64_t per;
	int chunks;
	ln_chunks(rows, &per, &chunks);
	double *part = (double *)((char *)c->arena->ws + loom_cuda_align(2 * sizeof(double) * (size_t)rows));
	if (cc <= 0)
		return LOOM_OK;
	dim3 grid((unsigned)((cc + ln_cols - 1) / ln_cols), (unsigned)chunks), block(ln_cols, ln_lanes);
	loom_layernorm_bwd_gamma_part_kernel<<<grid, block, 0, c->stream>>>(
		rows, per, cc, io->src[0], io->dt[0], io->src[1], io->dt[1], stats, part);
	if ((st = LOOM_CUDA_LAUNCHED(c->err)) != LOOM_OK)
		return st;
	loom_layernorm_bwd_gamma_fold_kernel<<<loom_cuda_blocks(cc, threads), threads, 0, c->stream>>>(
		chunks, cc, part, io->out, io->odt);
	return LOOM_CUDA_LAUNCHED(c->err);
}

/* b, t, c of the qkv source qi of node v, and its n_head. */
static void attn_dims(const loom_plan *p, loom_value v, int qi, int *b, int *t, int *c, int *nh)
{
	const loom_node *q = src_of(p, v, qi);
	*b = (int)q->shape.dims[0];
	*t = (int)q->shape.dims[1];
	*c = (int)(q->shape.dims[2] / 3);
	*nh = nd(p, v)->a.attn.n_head;
}

/* The heads of one sequence as one strided batch: g's pointers are those
 * of sequence 0 and each operand moves by its per-sequence step (elements)
 * from one sequence to the next. done is 0 when cuBLASLt had no algorithm
 * for some sequence (the caller then redoes the whole node its own way). */
static loom_status per_sequence(loom_cuda_ctx *c, loom_cuda_gemm g, int nseq, int64_t step_a,
				int64_t step_b, int64_t step_c, int *done)
{
	/* The test hook (loom_cuda_test_own_kernels): the own kernels only. */
	if (loom_cuda_own_kernels_on) {
		*done = 0;
		return LOOM_OK;
	}
	const size_t ab = g.abt == CUDA_R_32F ? 4 : 2, cb = g.ct == CUDA_R_32F ? 4 : 2;
	const char *a0 = (const char *)g.a, *b0 = (const char *)g.b;
	char *c0 = (char *)g.c;
	loom_status st = LOOM_OK;
	*done = 1;
	for (int s = 0; s < nseq && st == LOOM_OK && *done; s++) {
		g.a = a0 + (size_t)(s * step_a) * ab;
		g.b = b0 + (size_t)(s * step_b) * ab;
		g.c = c0 + (size_t)(s * step_c) * cb;
		st = loom_cuda_gemm_strided(c, &g, done);
	}
	return st;
}

/* Zeroes columns [col, col + width) of rows [rows, c3] (a part of dqkv). */
static loom_status zero_columns(loom_cuda_ctx *c, void *x, loom_dtype dt, int64_t rows, int c3,
				int col, int width)
{
	const size_t e = loom_dtype_size(dt);
	return LOOM_CUDA_CHECK(cudaMemset2DAsync((char *)x + (size_t)col * e, (size_t)c3 * e, 0,
						 (size_t)width * e, (size_t)rows, c->stream),
			       c->err, sizeof(c->err));
}

loom_status loom_cuda_op_attn_probs(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				    const loom_cuda_io *io)
{
	if (nd(plan, v)->a.attn.fused) /* y and the LSE in one cuDNN SDPA call */
		return loom_cuda_sdpa_fwd(c, plan, v, &c->plans[v], io);
	int b, t, cc, nh, done = 0;
	attn_dims(plan, v, 0, &b, &t, &cc, &nh);
	unsigned rows = (unsigned)((int64_t)b * nh * t);
	if (rows == 0)
		return LOOM_OK;
	const int hs = cc / nh;
	float *sc = io->odt == LOOM_F32 ? (float *)io->out : (float *)c->arena->ws;
	loom_status st = LOOM_OK;
	{
		/* S = q k^T / sqrt(hs), every (i, j), in fp32 whatever qkv's and
		 * P's dtypes (O1: half qkv, fp32 P); the softmax masks j > i. */
		loom_cuda_gemm g = {
			.ta = 0, .tb = 1, .m = t, .n = t, .k = hs, .batch = nh,
			.alpha = (float)(1.0 / sqrt((double)hs)), .beta = 0,
			.a = io->src[0], .b = (const char *)io->src[0] + (size_t)cc * loom_dtype_size((loom_dtype)io->dt[0]),
			.c = sc, .lda = 3 * cc, .ldb = 3 * cc, .ldc = t,
			.sa = hs, .sb = hs, .sc = (int64_t)t * t,
			.abt = loom_cuda_data_type((loom_dtype)io->dt[0]), .ct = CUDA_R_32F,
		};
		st = per_sequence(c, g, b, (int64_t)t * 3 * cc, (int64_t)t * 3 * cc,
				  (int64_t)nh * t * t, &done);
		if (st != LOOM_OK)
			return st;
	}
	if (done)
		loom_attn_softmax_kernel<<<rows, threads, 0, c->stream>>>(t, sc, io->out, io->odt);
	else
		loom_attn_probs_kernel<<<rows, threads, 0, c->stream>>>(t, cc, nh, io->src[0],
									 io->dt[0], io->out, io->odt,
									 sc);
	return LOOM_CUDA_LAUNCHED(c->err);
}

/* (qkv, P, dP) -> the q and k parts of dqkv: ds = P (dP - rowsum(dP P)),
 * dq = ds k / sqrt(hs), dk = ds^T q / sqrt(hs), the v part 0. */
loom_status loom_cuda_op_attn_probs_bwd(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
					const loom_cuda_io *io)
{
	if (nd(plan, v)->a.attn.fused) /* the whole dqkv in one cuDNN SDPA call */
		return loom_cuda_sdpa_bwd(c, plan, v, &c->plans[v], io);
	int b, t, cc, nh, done = 0;
	attn_dims(plan, v, 0, &b, &t, &cc, &nh);
	unsigned rows = (unsigned)((int64_t)b * nh * t);
	void *ds = c->arena->ws;
	if (rows == 0)
		return LOOM_OK;
	const int hs = cc / nh;
	const int64_t c3 = 3 * (int64_t)cc;
	loom_status st;
	if (io->dt[0] == io->odt) {
		loom_attn_softmax_bwd_kernel<<<rows, threads, 0, c->stream>>>(
			t, io->src[1], io->dt[1], io->src[2], io->dt[2], ds, io->dt[0]);
		if ((st = LOOM_CUDA_LAUNCHED(c->err)) != LOOM_OK)
			return st;
		const size_t e = loom_dtype_size((loom_dtype)io->dt[0]);
		const char *q = (const char *)io->src[0];
		char *out = (char *)io->out;
		loom_cuda_gemm g = {
			.ta = 0, .tb = 0, .m = t, .n = hs, .k = t, .batch = nh,
			.alpha = (float)(1.0 / sqrt((double)hs)), .beta = 0,
			.a = ds, .b = q + (size_t)cc * e, .c = out, /* dq = ds k */
			.lda = t, .ldb = (int)c3, .ldc = (int)c3,
			.sa = (int64_t)t * t, .sb = hs, .sc = hs,
			.abt = loom_cuda_data_type((loom_dtype)io->dt[0]), .ct = loom_cuda_data_type((loom_dtype)io->odt),
		};
		st = per_sequence(c, g, b, (int64_t)nh * t * t, t * c3, t * c3, &done);
		if (st == LOOM_OK && done) { /* dk = ds^T q */
			g.ta = 1, g.b = q, g.c = out + (size_t)cc * e;
			st = per_sequence(c, g, b, (int64_t)nh * t * t, t * c3, t * c3, &done);
		}
		if (st == LOOM_OK && done)
			st = zero_columns(c, io->out, (loom_dtype)io->odt, (int64_t)b * t, (int)c3, 2 * cc, cc);
		if (st != LOOM_OK || done)
			return st;
	}
	loom_attn_softmax_bwd_kernel<<<rows, threads, 0, c->stream>>>(
		t, io->src[1], io->dt[1], io->src[2], io->dt[2], ds, LOOM_F32);
	if ((st = LOOM_CUDA_LAUNCHED(c->err)) != LOOM_OK)
		return st;
	int64_t total = (int64_t)b * t * c3;
	loom_attn_qk_grad_kernel<<<loom_cuda_blocks(total, threads), threads, 0, c->stream>>>(
		b, t, cc, nh, io->src[0], io->dt[0], (const float *)ds, io->out, io->odt);
	return LOOM_CUDA_LAUNCHED(c->err);
}

/* (P, qkv) -> y: y_h = P_h v_h per head, into columns h * hs of y. */
loom_status loom_cuda_op_attention(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				   const loom_cuda_io *io)
{
	if (nd(plan, v)->a.attn.fused) /* made by its ATTN_PROBS node's SDPA call */
		return LOOM_OK;
	int b, t, cc, nh, done = 0;
	attn_dims(plan, v, 1, &b, &t, &cc, &nh);
	int64_t total = (int64_t)b * t * cc;
	if (total <= 0)
		return LOOM_OK;
	const int hs = cc / nh;
	if (io->dt[0] == io->odt && io->dt[1] == io->odt) {
		loom_cuda_gemm g = {
			.ta = 0, .tb = 0, .m = t, .n = hs, .k = t, .batch = nh, .alpha = 1, .beta = 0,
			.a = io->src[0],
			.b = (const char *)io->src[1] + (size_t)2 * cc * loom_dtype_size((loom_dtype)io->dt[1]),
			.c = io->out, .lda = t, .ldb = 3 * cc, .ldc = cc,
			.sa = (int64_t)t * t, .sb = hs, .sc = hs,
			.abt = loom_cuda_data_type((loom_dtype)io->odt), .ct = loom_cuda_data_type((loom_dtype)io->odt),
		};
		loom_status st = per_sequence(c, g, b, (int64_t)nh * t * t, (int64_t)t * 3 * cc,
					      (int64_t)t * cc, &done);
		if (st != LOOM_OK || done)
			return st;
	}
	loom_attention_fwd_kernel<<<loom_cuda_blocks(total, threads), threads, 0, c->stream>>>(
		b, t, cc, nh, io->src[0], io->dt[0], io->src[1], io->dt[1], io->out, io->odt);
	return LOOM_CUDA_LAUNCHED(c->err);
}

/* (qkv, dy) -> dP: dP_h = dy_h v_h^T per head. */
loom_status loom_cuda_op_attention_bwd_probs(loom_cuda_ctx *c, const loom_plan *plan,
					     loom_value v, const loom_cuda_io *io)
{
	int b, t, cc, nh, done = 0;
	attn_dims(plan, v, 0, &b, &t, &cc, &nh);
	int64_t total = (int64_t)b * nh * t * t;
	if (total <= 0)
		return LOOM_OK;
	const int hs = cc / nh;
	if (io->dt[0] == io->odt && io->dt[1] == io->odt) {
		loom_cuda_gemm g = {
			.ta = 0, .tb = 1, .m = t, .n = t, .k = hs, .batch = nh, .alpha = 1, .beta = 0,
			.a = io->src[1],
			.b = (const char *)io->src[0] + (size_t)2 * cc * loom_dtype_size((loom_dtype)io->dt[0]),
			.c = io->out, .lda = cc, .ldb = 3 * cc, .ldc = t,
			.sa = hs, .sb = hs, .sc = (int64_t)t * t,
			.abt = loom_cuda_data_type((loom_dtype)io->odt), .ct = loom_cuda_data_type((loom_dtype)io->odt),
		};
		loom_status st = per_sequence(c, g, b, (int64_t)t * cc, (int64_t)t * 3 * cc,
					      (int64_t)nh * t * t, &done);
		if (st != LOOM_OK || done)
			return st;
	}
	loom_attention_bwd_probs_kernel<<<loom_cuda_blocks(total, threads), threads, 0,
					  c->stream>>>(b, t, cc, nh, io->src[0], io->dt[0],
						       io->src[1], io->dt[1], io->out, io->odt);
	return LOOM_CUDA_LAUNCHED(c->err);
}

/* (P, dy) -> the v part of dqkv: dv_h = P_h^T dy_h per head; q, k parts 0. */
loom_status loom_cuda_op_attention_bwd_qkv(loom_cuda_ctx *c, const loom_plan *plan,
					   loom_value v, const loom_cuda_io *io)
{
	const loom_node *n = nd(plan, v);
	int b = (int)n->shape.dims[0], t = (int)n->shape.dims[1], cc = (int)(n->shape.dims[2] / 3);
	int nh = n->a.attn.n_head, done = 0;
	int64_t total = (int64_t)b * t * 3 * cc;
	if (total <= 0)
		return LOOM_OK;
	const int hs = cc / nh;
	if (io->dt[0] == io->odt && io->dt[1] == io->odt) {
		loom_cuda_gemm g = {
			.ta = 1, .tb = 0, .m = t, .n = hs, .k = t, .batch = nh, .alpha = 1, .beta = 0,
			.a = io->src[0], .b = io->src[1],
			.c = (char *)io->out + (size_t)2 * cc * loom_dtype_size((loom_dtype)io->odt),
			.lda = t, .ldb = cc, .ldc = 3 * cc,
			.sa = (int64_t)t * t, .sb = hs, .sc = hs,
			.abt = loom_cuda_data_type((loom_dtype)io->odt), .ct = loom_cuda_data_type((loom_dtype)io->odt),
		};
		loom_status st = per_sequence(c, g, b, (int64_t)nh * t * t, (int64_t)t * cc,
					      (int64_t)t * 3 * cc, &done);
		if (st == LOOM_OK && done)
			st = zero_columns(c, io->out, (loom_dtype)io->odt, (int64_t)b * t, 3 * cc, 0, 2 * cc);
		if (st != LOOM_OK || done)
			return st;
	}
	loom_attention_bwd_qkv_kernel<<<loom_cuda_blocks(total, threads), threads, 0, c->stream>>>(
		b, t, cc, nh, io->src[0], io->dt[0], io->src[1], io->dt[1], io->out, io->odt);
	return LOOM_CUDA_LAUNCHED(c->err);
}

/* --dump-graph: which path softmax-CE and layer norm took. */
void loom_cuda_gpt_note(const loom_cuda_ctx *c, const loom_plan *p, loom_value v, char *buf,
			size_t len)
{
	const loom_cuda_node_plan *np = &c->plans[v];
	const int saves = np->saved_by == v, reads = np->saved_by != LOOM_NONE && np->saved_by != v;
	switch (nd(p, v)->op) {
	case LOOM_OP_SOFTMAX_CE:
		if (!c->classifier)
			snprintf(buf, len, "two passes per row in double (LOOM_CUDA_CLASSIFIER=0)");
		else if (np->ce_bwd != LOOM_NONE)
			snprintf(buf, len, "fused classifier: one online pass, writes %d's dlogits over "
				 "the logits in training", (int)np->ce_bwd);
		else
			snprintf(buf, len, "one online pass%s", saves ? ", saves its log-sum-exp" : "");
		if (p->vocab_padded > 0) { /* engine/vocab_pad.c */
			size_t at = strlen(buf);
			snprintf(buf + at, len > at ? len - at : 0, "; %lld of %lld columns (padded)",
				 (long long)p->vocab, (long long)p->vocab_padded);
		}
		break;
	case LOOM_OP_SOFTMAX_CE_BWD:
		snprintf(buf, len, "%s", reads ? "one pass from the saved log-sum-exp" :
					       "recomputes the log-sum-exp");
		break;
	case LOOM_OP_LAYERNORM:
		snprintf(buf, len, "%s%s", loom_cuda_ln_fused_on ? "warp per row" : "block per row",
			 saves ? ", saves mean and rstd" : "");
		break;
	default: /* LAYERNORM_BWD_DATA */
		snprintf(buf, len, "%s%s", np->kind == LOOM_CUDA_PLAN_LN ? "one pass with dgamma, dbeta" :
									   "separate kernels",
			 reads ? ", reads the saved mean and rstd" : ", recomputes mean and rstd");
		break;
	}
}
