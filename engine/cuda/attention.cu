/*
 * engine/cuda/attention.cu — causal self-attention on the GPU in two halves
 * over a fused qkv [B, T, 3C]: the probabilities P = causal softmax(q k^T /
 * sqrt(hs)) and y = P v per head, each with its backward, and the entries
 * of ATTN_PROBS, ATTENTION and their three backward ops (a fused attention
 * node goes to cuDNN's SDPA, sdpa_cudnn.cu). CPU twin:
 * engine/cpu/attention.c (same formulas, softmax sums in double).
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
 * on an H200 through the GPU suite.
 */
#include <stdint.h>

#include "engine/cuda/dtype.cuh"

static const int threads = 256;

// ----------------------------------------------------------------------------
// CUDA kernels

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

/* The unfused ATTN_PROBS' fp32 scores (none where P is f32: they are
 * made in P) and its backward's ds. */
size_t loom_cuda_attn_ws(const loom_plan *p, loom_value v)
{
	const loom_node *n = loom_cuda_node(p, v);
	switch (n->op) {
	case LOOM_OP_ATTN_PROBS:
		return n->dtype == LOOM_F32 ? 0 :
					      loom_cuda_align(sizeof(float) * (size_t)loom_shape_numel(&n->shape));
	case LOOM_OP_ATTN_PROBS_BWD:
		return loom_cuda_align(sizeof(float) * (size_t)loom_shape_numel(&loom_cuda_src(p, v, 1)->shape));
	default:
		return 0;
	}
}

/* b, t, c of the qkv source qi of node v, and its n_head. */
static void attn_dims(const loom_plan *p, loom_value v, int qi, int *b, int *t, int *c, int *nh)
{
	const loom_node *q = loom_cuda_src(p, v, qi);
	*b = (int)q->shape.dims[0];
	*t = (int)q->shape.dims[1];
	*c = (int)(q->shape.dims[2] / 3);
	*nh = loom_cuda_node(p, v)->a.attn.n_head;
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
	if (loom_cuda_node(plan, v)->a.attn.fused) /* y and the LSE in one cuDNN SDPA call */
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
	if (loom_cuda_node(plan, v)->a.attn.fused) /* the whole dqkv in one cuDNN SDPA call */
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
	if (loom_cuda_node(plan, v)->a.attn.fused) /* made by its ATTN_PROBS node's SDPA call */
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
	const loom_node *n = loom_cuda_node(plan, v);
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
