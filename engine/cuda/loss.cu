/*
 * engine/cuda/loss.cu — softmax cross-entropy forward (mean over rows of
 * logsumexp - logit[label]) and backward ((softmax - onehot) * dloss / n).
 * CPU twin: loom_cpu_softmax_ce_fwd/bwd in engine/cpu/dense_impl.h. The
 * forward is the fused classifier below (fp32 online softmax, the backward
 * done by the forward or from its saved log-sum-exp); a backward with no
 * saved log-sum-exp makes it again in double, as the CPU does.
 *
 * A label outside [0, classes) cannot fail the launch: the kernel records
 * the node and the first bad row in the control block, writes no loss, the
 * optimizer kernels skip the update, and the next sync (the loss download
 * every loom_run ends with) reports it as the CPU backend does.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "engine/cuda/dtype.cuh"

// ----------------------------------------------------------------------------
// CUDA kernels

/* logsumexp of row i (every thread of the block gets it). */
static __device__ double ce_logsumexp(int classes, const void *logits, int ldt, int64_t row)
{
	double mx = -INFINITY;
	for (int j = threadIdx.x; j < classes; j += blockDim.x) {
		double v = loom_ld(logits, ldt, row + j);
		mx = v > mx ? v : mx;
	}
	mx = loom_block_max(mx);
	double s = 0;
	for (int j = threadIdx.x; j < classes; j += blockDim.x)
		s += exp((double)loom_ld(logits, ldt, row + j) - mx);
	return mx + log(loom_block_sum(s));
}

/* A padded vocabulary's columns [classes, ld) of a dlogits row: zero
 * (engine/vocab_pad.c; none when ld == classes). */
static __device__ void ce_zero_padding(void *d, int ddt, int classes, int ld)
{
	for (int j = classes + threadIdx.x; j < ld; j += blockDim.x)
		loom_st(d, ddt, j, 0.0f);
}

/* One block: the mean over rows, unless this node saw a bad label or an
 * embedding a bad id (the failed step's loss is not written, as on the
 * CPU). */
__global__ void loom_ce_mean_kernel(int n, const double *row_ws, void *loss, int lossdt,
				    int node, const loom_cuda_ctl *ctl)
{
	double s = 0;
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		s += row_ws[i];
	s = loom_block_sum(s);
	if (threadIdx.x == 0 && ctl->ce_node != node && ctl->emb_node == -1)
		loom_st(loss, lossdt, 0, (float)(n > 0 ? s / n : 0));
}

/* One block per row. dlogits may be logits (LOOM_OPF_INPLACE): the block
 * has read its row for the logsumexp before the reduction's last barrier,
 * and each thread then reads element j before it writes it. */
__global__ void loom_ce_bwd_kernel(int n, int classes, int ld, const void *logits, int ldt,
				   const int32_t *labels, const void *dloss, int dldt,
				   void *dlogits, int dxdt)
{
	const int i = blockIdx.x;
	const int64_t row = (int64_t)i * ld;
	const double g = n > 0 ? (double)loom_ld(dloss, dldt, 0) / n : 0;
	double lse = ce_logsumexp(classes, logits, ldt, row);
	int32_t lab = labels[i];
	for (int j = threadIdx.x; j < classes; j += blockDim.x) {
		double e = exp((double)loom_ld(logits, ldt, row + j) - lse);
		/* A bad label (the forward reported it) only loses its one-hot term. */
		if (j == lab)
			e -= 1;
		loom_st(dlogits, dxdt, row + j, (float)(e * g));
	}
	ce_zero_padding((char *)dlogits + (size_t)row * (dxdt == LOOM_F32 ? 4 : 2), dxdt, classes,
			ld);
}

/*
 * The fused classifier (the forward of every softmax-CE): one
 * block per row reads the logits in their own dtype (16-byte loads where
 * the row allows), keeps a running max and sum of exponentials in fp32
 * (the online softmax: each thread its own pair, then the block's pairs
 * combined), and writes the row's loss; then, in the same launch, either
 * the row's log-sum-exp into the saved slot its backward reads (no
 * second reduction there), or the row's dlogits themselves, over the
 * logits (the backward is then done: fuse_plan.cu's plan_classifier says
 * where the memory plan allows it). llm.c's fused classifier is the model;
 * the CPU twin computes in double, so the two agree to fp32's rounding.
 */

/* One thread's running max m and sum s of exp(x - m), x added. */
static __device__ __forceinline__ void ce_online(float x, float &m, float &s)
{
	if (x > m) {
		s = s * expf(m - x) + 1.0f;
		m = x;
	} else if (!(x == -INFINITY && m == -INFINITY)) {
		s += expf(x - m);
	}
}

static __device__ __forceinline__ void ce_merge(float &m, float &s, float m2, float s2)
{
	if (m2 == -INFINITY)
		return;
	if (m == -INFINITY || m2 > m) {
		s = s2 + (m == -INFINITY ? 0.0f : s * expf(m - m2));
		m = m2;
	} else {
		s += s2 * expf(m2 - m);
	}
}

/* The block's (max, sum) (every thread gets it). */
static __device__ void ce_block_merge(float &m, float &s)
{
	__shared__ float pm[32], ps[32];
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
	for (int o = 16; o > 0; o >>= 1) {
		float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
		ce_merge(m, s, m2, s2);
	}
	if (lane == 0)
		pm[warp] = m, ps[warp] = s;
	__syncthreads();
	m = -INFINITY, s = 0.0f;
	for (int w = 0; w < nw; w++) /* the same order in every thread */
		ce_merge(m, s, pm[w], ps[w]);
}

/* 8 halves or 4 floats of one 16-byte load, as fp32. */
static __device__ __forceinline__ int ce_unpack(uint4 u, int dt, float v[8])
{
	if (dt == LOOM_F32) {
		const float *f = (const float *)&u;
		v[0] = f[0], v[1] = f[1], v[2] = f[2], v[3] = f[3];
		return 4;
	}
	if (dt == LOOM_F16) {
		const __half *h = (const __half *)&u;
#pragma unroll
		for (int k = 0; k < 8; k++)
			v[k] = __half2float(h[k]);
	} else {
		const __nv_bfloat16 *h = (const __nv_bfloat16 *)&u;
#pragma unroll
		for (int k = 0; k < 8; k++)
			v[k] = __bfloat162float(h[k]);
	}
	return 8;
}

static __device__ __forceinline__ uint4 ce_pack(const float v[8], int dt)
{
	uint4 u;
	if (dt == LOOM_F32) {
		float *f = (float *)&u;
		f[0] = v[0], f[1] = v[1], f[2] = v[2], f[3] = v[3];
	} else if (dt == LOOM_F16) {
		__half *h = (__half *)&u;
#pragma unroll
		for (int k = 0; k < 8; k++)
			h[k] = __float2half_rn(v[k]);
	} else {
		__nv_bfloat16 *h = (__nv_bfloat16 *)&u;
#pragma unroll
		for (int k = 0; k < 8; k++)
			h[k] = __float2bfloat16_rn(v[k]);
	}
	return u;
}

/* Elements before the row's first 16-byte boundary (all of them when the
 * row is not even element-aligned, which arena values never are not). */
static __device__ __forceinline__ int ce_head(const void *row, int es, int n)
{
	uintptr_t a = (uintptr_t)row;
	if (a % es)
		return n;
	int h = (int)(((16 - (a & 15)) & 15) / es);
	return h < n ? h : n;
}

/* The row's running (max, sum) of this thread: scalar head and tail,
 * 16-byte loads between. */
static __device__ void ce_row_stats(const void *row, int dt, int n, float &m, float &s)
{
	const int es = dt == LOOM_F32 ? 4 : 2, per = 16 / es;
	const int head = ce_head(row, es, n), nv = (n - head) / per;
	for (int j = threadIdx.x; j < head; j += blockDim.x)
		ce_online(loom_ld(row, dt, j), m, s);
	const uint4 *body = (const uint4 *)((const char *)row + (size_t)head * es);
	for (int k = threadIdx.x; k < nv; k += blockDim.x) {
		float v[8];
		const int got = ce_unpack(body[k], dt, v);
		for (int q = 0; q < got; q++)
			ce_online(v[q], m, s);
	}
	for (int j = head + nv * per + threadIdx.x; j < n; j += blockDim.x)
		ce_online(loom_ld(row, dt, j), m, s);
}

/* d[j] = (exp(x[j] - lse) - [j == lab]) g over the row; d may be x (each
 * element read, then written, by the same thread). 16-byte loads and
 * stores where both rows share their alignment and dtype. */
static __device__ void ce_row_grad(const void *x, int xdt, void *d, int ddt, int n, float lse,
				   int lab, float g)
{
	const int es = xdt == LOOM_F32 ? 4 : 2, per = 16 / es;
	int head = n, nv = 0;
	if (xdt == ddt && ((uintptr_t)x & 15) == ((uintptr_t)d & 15)) {
		head = ce_head(x, es, n);
		nv = (n - head) / per;
	}
	for (int j = threadIdx.x; j < head; j += blockDim.x)
		loom_st(d, ddt, j, (expf(loom_ld(x, xdt, j) - lse) - (j == lab ? 1.0f : 0.0f)) * g);
	const uint4 *xb = (const uint4 *)((const char *)x + (size_t)head * es);
	uint4 *db = (uint4 *)((char *)d + (size_t)head * es);
	for (int k = threadIdx.x; k < nv; k += blockDim.x) {
		float v[8];
		const int got = ce_unpack(xb[k], xdt, v);
		const int j0 = head + k * per;
		for (int q = 0; q < got; q++)
			v[q] = (expf(v[q] - lse) - (j0 + q == lab ? 1.0f : 0.0f)) * g;
		db[k] = ce_pack(v, ddt);
	}
	for (int j = head + nv * per + threadIdx.x; j < n; j += blockDim.x)
		loom_st(d, ddt, j, (expf(loom_ld(x, xdt, j) - lse) - (j == lab ? 1.0f : 0.0f)) * g);
}

/* The loss's gradient as the seed node holds it: the loss scale rounded
 * to the seed's dtype (loom_grad_seed_kernel), over the rows. */
static __device__ __forceinline__ float ce_seed_grad(const loom_cuda_ctl *ctl, int seed_dt, int n)
{
	float d = ctl->scaler.scale;
	if (seed_dt == LOOM_F16)
		d = __half2float(__float2half_rn(d));
	else if (seed_dt == LOOM_BF16)
		d = __bfloat162float(__float2bfloat16_rn(d));
	return n > 0 ? d / n : 0.0f;
}

/* One block per row: row_ws[i] = lse - logit[label] (a bad label: the
 * node and row flagged in the control block, row_ws[i] 0); lse_out[i] = lse when lse_out; the row's
 * dlogits into dlogits (seed_dt: the seed's dtype) when dlogits. */
__global__ void loom_ce_fused_kernel(int n, int classes, int ld, const void *logits, int ldt,
				     const int32_t *labels, double *row_ws, int node,
				     loom_cuda_ctl *ctl, float *lse_out, void *dlogits, int dxdt,
				     int seed_dt)
{
	const int i = blockIdx.x;
	const size_t es = ldt == LOOM_F32 ? 4 : 2;
	const void *row = (const char *)logits + (size_t)i * ld * es;
	const int32_t lab = labels[i];
	const int bad = lab < 0 || lab >= classes;
	/* The label's logit, read before any thread of the block writes the
	 * row (dlogits may be the logits). */
	const float xl = bad ? 0.0f : loom_ld(row, ldt, lab);
	float m = -INFINITY, s = 0.0f;
	ce_row_stats(row, ldt, classes, m, s);
	ce_block_merge(m, s);
	const float lse = m + logf(s);
	if (threadIdx.x == 0) {
		if (bad) {
			int prev = atomicCAS(&ctl->ce_node, -1, node);
			if (prev == -1 || prev == node)
				atomicMin(&ctl->ce_row, i);
			row_ws[i] = 0;
		} else {
			row_ws[i] = (double)lse - (double)xl;
		}
		if (lse_out)
			lse_out[i] = lse;
	}
	if (dlogits) {
		char *d = (char *)dlogits + (size_t)i * ld * (dxdt == LOOM_F32 ? 4 : 2);
		ce_row_grad(row, ldt, d, dxdt, classes, lse, bad ? -1 : lab,
			    ce_seed_grad(ctl, seed_dt, n));
		ce_zero_padding(d, dxdt, classes, ld);
	}
}

/* The backward from the forward's saved log-sum-exp: one pass per row. */
__global__ void loom_ce_bwd_saved_kernel(int n, int classes, int ld, const void *logits,
					 int ldt, const int32_t *labels, const float *lse,
					 const void *dloss, int dldt, void *dlogits, int dxdt)
{
	const int i = blockIdx.x;
	const size_t es = ldt == LOOM_F32 ? 4 : 2, eo = dxdt == LOOM_F32 ? 4 : 2;
	const float g = n > 0 ? loom_ld(dloss, dldt, 0) / n : 0.0f;
	const int32_t lab = labels[i];
	char *d = (char *)dlogits + (size_t)i * ld * eo;
	ce_row_grad((const char *)logits + (size_t)i * ld * es, ldt, d, dxdt, classes, lse[i],
		    lab < 0 || lab >= classes ? -1 : lab, g);
	ce_zero_padding(d, dxdt, classes, ld);
}

// ----------------------------------------------------------------------------
// kernel launchers

static const int threads = 128;

extern "C" loom_status loom_cuda_softmax_ce_bwd(char *err, cudaStream_t s, int n,
						int classes, int ld, const void *logits, int ldt,
						const int32_t *labels, const void *dloss, int dldt,
						void *dlogits, int dxdt)
{
	if (n <= 0 || classes <= 0)
		return LOOM_OK;
	loom_ce_bwd_kernel<<<n, threads, 0, s>>>(n, classes, ld, logits, ldt, labels, dloss, dldt,
						  dlogits, dxdt);
	return LOOM_CUDA_LAUNCHED(err);
}

// ----------------------------------------------------------------------------
// op entries

/* Threads per row of the fused kernels: a GPT vocabulary (50257) takes
 * 1024 (llm.c's), a small one fewer. */
static int ce_threads(int classes)
{
	return classes >= 16384 ? 1024 : classes >= 2048 ? 512 : 128;
}

/* A bad label raises a flag in the control block; synchronize reports it. */
loom_status loom_cuda_op_softmax_ce(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				    const loom_cuda_io *io)
{
	const loom_node *x = &plan->g->nodes[plan->g->nodes[v].src[0]];
	/* a padded vocabulary's logits: rows of ld, the first classes real */
	const int n = (int)x->shape.dims[0], ld = (int)x->shape.dims[1],
		  classes = (int)loom_node_classes(x);
	const loom_cuda_node_plan *np = &c->plans[v];
	/* The backward's work too, in a training run (plan_classifier). */
	const int grad = np->ce_bwd != LOOM_NONE && c->train && loom_cuda_relu_fusion_on(c);
	float *lse = (float *)loom_cuda_saved_slot(c, v, v);
	loom_status st;
	if (n > 0 && classes > 0) {
		const loom_node *w = grad ? &plan->g->nodes[np->ce_bwd] : NULL;
		loom_ce_fused_kernel<<<n, ce_threads(classes), 0, c->stream>>>(
			n, classes, ld, io->src[0], io->dt[0], (const int32_t *)io->src[1],
			(double *)c->arena->ws, v, c->ctl, lse,
			grad ? loom_arena_ptr(c->arena, plan, np->ce_bwd) : NULL,
			grad ? (int)w->dtype : 0,
			grad ? (int)plan->g->nodes[w->src[2]].dtype : 0);
		if ((st = LOOM_CUDA_LAUNCHED(c->err)) != LOOM_OK)
			return st;
	}
	loom_ce_mean_kernel<<<1, 1024, 0, c->stream>>>(classes > 0 ? n : 0, (double *)c->arena->ws,
							io->out, io->odt, v, c->ctl);
	return LOOM_CUDA_LAUNCHED(c->err);
}

loom_status loom_cuda_op_softmax_ce_bwd(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
					const loom_cuda_io *io)
{
	const loom_node *x = &plan->g->nodes[plan->g->nodes[v].src[0]];
	const int n = (int)x->shape.dims[0], ld = (int)x->shape.dims[1],
		  classes = (int)loom_node_classes(x);
	const float *lse = (const float *)loom_cuda_saved_slot(c, v, LOOM_NONE);
	if (!lse)
		return loom_cuda_softmax_ce_bwd(c->err, c->stream, n, classes, ld, io->src[0], io->dt[0],
						(const int32_t *)io->src[1], io->src[2], io->dt[2],
						io->out, io->odt);
	if (n <= 0 || classes <= 0)
		return LOOM_OK;
	loom_ce_bwd_saved_kernel<<<n, ce_threads(classes), 0, c->stream>>>(
		n, classes, ld, io->src[0], io->dt[0], (const int32_t *)io->src[1], lse, io->src[2],
		io->dt[2], io->out, io->odt);
	return LOOM_CUDA_LAUNCHED(c->err);
}

/* --dump-graph: which path softmax-CE took. */
void loom_cuda_ce_note(const loom_cuda_ctx *c, const loom_plan *p, loom_value v, char *buf,
		       size_t len)
{
	const loom_cuda_node_plan *np = &c->plans[v];
	const int saves = np->saved_by == v, reads = np->saved_by != LOOM_NONE && np->saved_by != v;
	switch (loom_cuda_node(p, v)->op) {
	case LOOM_OP_SOFTMAX_CE:
		if (np->ce_bwd != LOOM_NONE)
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
	default: /* SOFTMAX_CE_BWD */
		snprintf(buf, len, "%s", reads ? "one pass from the saved log-sum-exp" :
					       "recomputes the log-sum-exp");
		break;
	}
}

/* A bad label seen on the device, reported in the CPU backend's words
 * (loom_bad_label); the flags are cleared for the next step. An error
 * path: it may wait. */
loom_status loom_cuda_report_bad_label(loom_cuda_ctx *c, const loom_plan *p,
				       const loom_cuda_ctl *h)
{
	const loom_node *n = &p->g->nodes[h->ce_node];
	const int32_t *labels = (const int32_t *)loom_arena_ptr(c->arena, p, n->src[1]);
	int32_t lab = -1;
	loom_status st = loom_cuda_fault_read(c, labels + h->ce_row, &lab);
	if (st != LOOM_OK)
		return st;
	return loom_bad_label(c->err, p, h->ce_node, lab, h->ce_row);
}
