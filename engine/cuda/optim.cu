/*
 * engine/cuda/optim.cu — the optimizer step on the device, fused with mixed
 * precision's bookkeeping, in three launches over the plan's optimizer
 * pieces (whole parameters, or under ZeRO this rank's shard): (1) check
 * every gradient for inf/NaN, (2) one thread runs the loss-scale update on
 * the device copy of the scaler and decides whether to apply, (3) unscale
 * each gradient as it updates the fp32 value (the O2 master, or the
 * parameter) with SGD or AdamW and rounds half copies; clipping by global
 * norm adds two launches before the update (each chunk's sum of squares,
 * then one block sums them in chunk order and folds the coefficient into
 * the unscale; under ZeRO, each rank's shard summed before the decision
 * into the control block, which the executor all-reduces on the device,
 * or the host's norm); decay on matrices only reads each slot's matrix flag. The
 * host never waits: the decision stays on the device. CPU twins: engine/cpu/optim.c (the
 * update, in double as there) and amp/scaler.h (loom_scaler_update_inline,
 * the same function on both sides).
 *
 * Last, the backend's optimizer entries (backend.cu's table): the slot and
 * chunk tables uploaded at alloc, the update over every piece, and ZeRO's
 * gradient norm and overflow check, on the device or read back.
 */
#include <stdlib.h>

#include "engine/cuda/dtype.cuh"

// ----------------------------------------------------------------------------
// CUDA kernels

/* One block per chunk (grid-stride over chunks). */
__global__ void loom_opt_check_kernel(const loom_cuda_opt_slot *slots,
				      const loom_cuda_opt_chunk *chunks, int n_chunks,
				      loom_cuda_ctl *ctl)
{
	for (int ci = blockIdx.x; ci < n_chunks; ci += gridDim.x) {
		const loom_cuda_opt_slot sl = slots[chunks[ci].slot];
		int64_t end = chunks[ci].off + LOOM_CUDA_OPT_CHUNK;
		if (end > sl.numel)
			end = sl.numel;
		int bad = 0;
		for (int64_t i = chunks[ci].off + threadIdx.x; i < end; i += blockDim.x)
			bad |= !isfinite(loom_ld(sl.grad, sl.grad_dt, i));
		if (__syncthreads_or(bad) && threadIdx.x == 0)
			ctl->found_inf = 1;
	}
}

/*
 * The decision, as loom_optim_step_host takes it. A step whose forward
 * failed (a bad label, an embedding's bad id) changes nothing: the CPU
 * returns before the optimizer. The inverse scale is the one the gradients were scaled by,
 * taken before the update may grow or shrink it (as the CPU does).
 */
__global__ void loom_opt_decide_kernel(loom_cuda_ctl *ctl, int scaling, int world, int micro,
				       int verdict, unsigned *wamax, int *wvalid, int n_w)
{
	int apply = 1;
	/* ZeRO: every rank checked its shard, the executor summed them. */
	if (verdict >= 0)
		ctl->found_inf = !verdict;
	/* Data parallel: the buckets hold the sum over the ranks; gradient
	 * accumulation: over micro + 1 micro-steps (engine/cpu/optim.c). */
	double inv = 1.0 / ((double)ctl->scaler.scale * world * (micro + 1));
	if (ctl->ce_node != -1 || ctl->emb_node != -1) {
		ctl->found_inf = 0;
		ctl->apply = 0;
		return;
	}
	if (scaling)
		apply = loom_scaler_update_inline(&ctl->scaler, ctl->found_inf);
	ctl->found_inf = 0;
	ctl->inv_scale = inv;
	ctl->t = ctl->step + 1;
	if (apply)
		ctl->step++;
	ctl->apply = apply;
	/* LOOM_CUDA_FP8_AMAX_OPTIM: an applied step's update refills the
	 * weights' amax cells; stale until it has run (it sets the flags). A
	 * skipped step leaves the weights, so their cells and flags, as they
	 * were. */
	for (int i = 0; apply && i < n_w; i++) {
		wamax[i] = 0;
		wvalid[i] = 0;
	}
}

/* Each chunk's sum of squares of its gradients times inv into parts[ci],
 * one block per chunk (grid-stride); the order fixed by the shape. */
static __device__ void loom_opt_chunks_sumsq(const loom_cuda_opt_slot *slots,
					     const loom_cuda_opt_chunk *chunks, int n_chunks,
					     double *parts, double inv)
{
	for (int ci = blockIdx.x; ci < n_chunks; ci += gridDim.x) {
		const loom_cuda_opt_slot sl = slots[chunks[ci].slot];
		int64_t end = chunks[ci].off + LOOM_CUDA_OPT_CHUNK;
		if (end > sl.numel)
			end = sl.numel;
		double s = 0;
		for (int64_t i = chunks[ci].off + threadIdx.x; i < end; i += blockDim.x) {
			double g = (double)loom_ld(sl.grad, sl.grad_dt, i) * inv;
			s += g * g;
		}
		s = loom_block_sum(s);
		if (threadIdx.x == 0)
			parts[ci] = s;
	}
}

/* Clipping, one block per chunk (grid-stride): the chunk's sum of squares
 * of its unscaled gradients into parts[ci]. Nothing on a skipped step. */
__global__ void loom_opt_sumsq_kernel(const loom_cuda_opt_slot *slots,
				      const loom_cuda_opt_chunk *chunks, int n_chunks,
				      double *parts, const loom_cuda_ctl *ctl)
{
	if (!ctl->apply)
		return;
	loom_opt_chunks_sumsq(slots, chunks, n_chunks, parts, ctl->inv_scale);
}

/* ZeRO's clipping, before the decision, one block per chunk (grid-stride):
 * the chunk's sum of squares of its gradients unscaled as the decision
 * will unscale them (the scale before its update) into parts[ci]. Taken
 * on every step: a skipped one ignores it. */
__global__ void loom_opt_shard_sumsq_kernel(const loom_cuda_opt_slot *slots,
					    const loom_cuda_opt_chunk *chunks, int n_chunks,
					    double *parts, const loom_cuda_ctl *ctl, int world,
					    int micro)
{
	loom_opt_chunks_sumsq(slots, chunks, n_chunks, parts,
			      1.0 / ((double)ctl->scaler.scale * world * (micro + 1)));
}

/* One block: the parts summed in the clip kernel's order into ctl->sumsq
 * (0 for a rank with no chunk). */
__global__ void loom_opt_parts_sum_kernel(int n_chunks, const double *parts, loom_cuda_ctl *ctl)
{
	double s = 0;
	for (int i = threadIdx.x; i < n_chunks; i += blockDim.x)
		s += parts[i];
	s = loom_block_sum(s);
	if (threadIdx.x == 0)
		ctl->sumsq = s;
}

/* Clipping, one block: the global norm (from the parts, summed in a fixed
 * order, the same every step; or ZeRO's, from ctl->sumsq or the host),
 * torch's clip_grad_norm_ coefficient folded into the unscale as
 * engine/cpu/optim.c does. */
__global__ void loom_opt_clip_kernel(int n_chunks, const double *parts, double max_norm,
				     loom_cuda_ctl *ctl, int from, double host_norm)
{
	if (!ctl->apply)
		return;
	double s = 0;
	for (int i = threadIdx.x; from == LOOM_CUDA_NORM_PARTS && i < n_chunks; i += blockDim.x)
		s += parts[i];
	s = loom_block_sum(s);
	if (threadIdx.x == 0) {
		double norm = from == LOOM_CUDA_NORM_PARTS ? sqrt(s) :
			      from == LOOM_CUDA_NORM_DEVICE ? sqrt(ctl->sumsq) : host_norm;
		double coef = max_norm / (norm + 1e-6);
		ctl->grad_norm = norm;
		if (coef < 1)
			ctl->inv_scale *= coef;
	}
}

/* A skipped step: the all-gather still needs this shard's parameters
 * where the gradients were (ZeRO). */
static __device__ void opt_skip_copy(const loom_cuda_opt_slot *slots,
				     const loom_cuda_opt_chunk *chunks, int n_chunks)
{
	for (int ci = blockIdx.x; ci < n_chunks; ci += gridDim.x) {
		const loom_cuda_opt_slot sl = slots[chunks[ci].slot];
		int64_t end = chunks[ci].off + LOOM_CUDA_OPT_CHUNK;
		if (end > sl.numel)
			end = sl.numel;
		for (int64_t i = chunks[ci].off + threadIdx.x; sl.pack && sl.param && i < end;
		     i += blockDim.x)
			loom_st(sl.pack, sl.param_dt, i, loom_ld(sl.param, sl.param_dt, i));
	}
}

/* Both update kernels' start: a step the decision skips copies the shard
 * (opt_skip_copy) and the kernel returns. */
static __device__ __forceinline__ bool opt_skipped(const loom_cuda_opt_slot *slots,
						   const loom_cuda_opt_chunk *chunks, int n_chunks,
						   const loom_cuda_ctl *ctl)
{
	if (ctl->apply)
		return false;
	opt_skip_copy(slots, chunks, n_chunks);
	return true;
}

/* LOOM_CUDA_FP8_AMAX_OPTIM: an update that runs writes every element of
 * every weight with a cell (whole pieces, no ZeRO), so their cells hold
 * the max |w| stored once it has run: the flags set, in its launch. */
static __device__ __forceinline__ void opt_amax_valid(int *wvalid, int n_w)
{
	if (blockIdx.x == 0)
		for (int i = threadIdx.x; i < n_w; i += blockDim.x)
			wvalid[i] = 1;
}

/* The step's rate: NaN, the control block's (a captured step's). */
static __device__ __forceinline__ double opt_rate(double lr, const loom_cuda_ctl *ctl)
{
	return isnan(lr) ? ctl->lr : lr;
}

/* update_chunk of engine/cpu/optim.c for one element, in double. */
__global__ void loom_opt_update_kernel(const loom_cuda_opt_slot *slots,
				       const loom_cuda_opt_chunk *chunks, int n_chunks,
				       loom_optim_opts o, double lr, int matrices_only,
				       const loom_cuda_ctl *ctl, int *wvalid, int n_w)
{
	if (opt_skipped(slots, chunks, n_chunks, ctl))
		return;
	opt_amax_valid(wvalid, n_w);
	const double inv = ctl->inv_scale;
	const int64_t t = ctl->t;
	lr = opt_rate(lr, ctl);
	double bc1 = 1, bc2 = 1;
	if (o.kind == LOOM_OPTIM_ADAMW) {
		bc1 = 1 - pow(o.beta1, (double)t);
		bc2 = 1 - pow(o.beta2, (double)t);
	}
	for (int ci = blockIdx.x; ci < n_chunks; ci += gridDim.x) {
		const loom_cuda_opt_slot sl = slots[chunks[ci].slot];
		int64_t end = chunks[ci].off + LOOM_CUDA_OPT_CHUNK;
		if (end > sl.numel)
			end = sl.numel;
		void *wp = sl.master ? sl.master : sl.param;
		const double wd = matrices_only && !sl.matrix ? 0 : o.weight_decay;
		const int wdt = sl.master ? LOOM_F32 : sl.param_dt;
		float m = 0; /* max |w| as param stores it (sl.amax), NaN-blind */
		for (int64_t i = chunks[ci].off + threadIdx.x; i < end; i += blockDim.x) {
			double w = loom_ld(wp, wdt, i);
			double g = (double)loom_ld(sl.grad, sl.grad_dt, i) * inv;
			if (o.kind == LOOM_OPTIM_SGD) {
				double d = g + wd * w;
				if (o.momentum > 0) {
					double s0 = t == 1 ? d :
						    o.momentum * loom_ld(sl.st0, sl.state_dt, i) +
							    (1 - o.dampening) * d;
					loom_st(sl.st0, sl.state_dt, i, (float)s0);
					d = o.nesterov ? d + o.momentum * s0 : s0;
				}
				w -= lr * d;
			} else {
				w *= 1 - lr * wd;
				double s0 = o.beta1 * loom_ld(sl.st0, sl.state_dt, i) + (1 - o.beta1) * g;
				double s1 = o.beta2 * loom_ld(sl.st1, sl.state_dt, i) +
					    (1 - o.beta2) * g * g;
				double denom = sqrt(s1) / sqrt(bc2) + o.eps;
				w -= lr / bc1 * s0 / denom;
				loom_st(sl.st0, sl.state_dt, i, (float)s0);
				loom_st(sl.st1, sl.state_dt, i, (float)s1);
			}
			loom_st(wp, wdt, i, (float)w);
			if (sl.master && sl.param) /* ZeRO-3: no whole parameter */
				loom_st(sl.param, sl.param_dt, i, (float)w);
			if (sl.pack)
				loom_st(sl.pack, sl.param_dt, i, (float)w);
			if (sl.amax) {
				const float a = fabsf(loom_stored(sl.param_dt, (float)w));
				m = a > m ? a : m;
			}
		}
		loom_amax_commit(sl.amax, m); /* uniform over the block: sl is the chunk's */
	}
}

/*
 * LOOM_CUDA_ADAMW=f32: AdamW in fp32 (llm.c's adamw_kernel3 computes so;
 * this is our own). The bias corrections once per block in double, then
 * per element: w *= 1 - lr wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2)
 * g^2; w -= (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps), the CPU's
 * formula (engine/cpu/optim.c) with each operation rounded to fp32. A
 * chunk is updated by a function templated on its gradient's and its
 * parameter's storage (one switch per chunk, not per element), 8 elements
 * a thread with 128-bit loads where the chunk's pointers are 16-byte
 * aligned and the state fp32, the rest one element at a time.
 */
typedef struct adamw_f32_k {
	float decay, b1, nb1, b2, nb2, step, isbc2, eps, inv;
} adamw_f32_k;

static __device__ __forceinline__ float opt_f(float x) { return x; }
static __device__ __forceinline__ float opt_f(__half x) { return __half2float(x); }
static __device__ __forceinline__ float opt_f(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> static __device__ __forceinline__ T opt_to(float x);
template <> __device__ __forceinline__ float opt_to<float>(float x) { return x; }
template <> __device__ __forceinline__ __half opt_to<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 opt_to<__nv_bfloat16>(float x)
{
	return __float2bfloat16_rn(x);
}

/* 8 elements of p + i (16-byte aligned) as fp32, and back. */
template <typename T>
static __device__ __forceinline__ void opt_ld8(const T *p, int64_t i, float v[8])
{
	if constexpr (sizeof(T) == 4) {
		const float4 a = *(const float4 *)(p + i), b = *(const float4 *)(p + i + 4);
		v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
		v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
	} else {
		const uint4 u = *(const uint4 *)(p + i);
		const T *h = (const T *)&u;
#pragma unroll
		for (int k = 0; k < 8; k++)
			v[k] = opt_f(h[k]);
	}
}

template <typename T>
static __device__ __forceinline__ void opt_st8(T *p, int64_t i, const float v[8])
{
	if constexpr (sizeof(T) == 4) {
		*(float4 *)(p + i) = make_float4(v[0], v[1], v[2], v[3]);
		*(float4 *)(p + i + 4) = make_float4(v[4], v[5], v[6], v[7]);
	} else {
		uint4 u;
		T *h = (T *)&u;
#pragma unroll
		for (int k = 0; k < 8; k++)
			h[k] = opt_to<T>(v[k]);
		*(uint4 *)(p + i) = u;
	}
}

static __device__ __forceinline__ void adamw_f32_elem(const adamw_f32_k &k, float wd, float g,
						       float &w, float &m, float &v)
{
	w *= wd;
	m = k.b1 * m + k.nb1 * g;
	v = k.b2 * v + k.nb2 * (g * g);
	w -= k.step * m / (sqrtf(v) * k.isbc2 + k.eps);
}

/* m with |x| if it is larger (a NaN never is, as the cast's amax). */
static __device__ __forceinline__ float opt_amax(float m, float x)
{
	const float a = fabsf(x);
	return a > m ? a : m;
}

static __device__ __forceinline__ int opt_al16(const void *p)
{
	return !p || (uintptr_t)p % 16 == 0;
}

/* Elements [off, end) of slot sl; TG the gradient's storage, TP the
 * parameter's (and the bucket copy's). w is the fp32 master where there
 * is one, else the parameter itself. */
template <typename TG, typename TP>
static __device__ void adamw_f32_chunk(const loom_cuda_opt_slot &sl, int64_t off, int64_t end,
				       const adamw_f32_k &k, float decay)
{
	const TG *gp = (const TG *)sl.grad;
	float *mp = (float *)sl.master;
	TP *pp = (TP *)sl.param, *kp = (TP *)sl.pack;
	int64_t i = off;
	float am = 0; /* max |w| as pp stores it (sl.amax), NaN-blind */
	if (sl.state_dt == LOOM_F32 && opt_al16(gp + off) && opt_al16(mp ? mp + off : NULL) &&
	    opt_al16(pp ? pp + off : NULL) && opt_al16(kp ? kp + off : NULL) &&
	    opt_al16((float *)sl.st0 + off) && opt_al16((float *)sl.st1 + off)) {
		float *s0 = (float *)sl.st0, *s1 = (float *)sl.st1;
		const int64_t vend = off + (end - off) / 8 * 8;
		for (int64_t b = off + threadIdx.x * 8; b < vend; b += blockDim.x * 8) {
			float w[8], g[8], m[8], v[8];
			if (mp)
				opt_ld8(mp, b, w);
			else
				opt_ld8(pp, b, w);
			opt_ld8(gp, b, g);
			opt_ld8(s0, b, m);
			opt_ld8(s1, b, v);
#pragma unroll
			for (int q = 0; q < 8; q++)
				adamw_f32_elem(k, decay, g[q] * k.inv, w[q], m[q], v[q]);
			opt_st8(s0, b, m);
			opt_st8(s1, b, v);
			if (mp)
				opt_st8(mp, b, w);
			if (pp)
				opt_st8(pp, b, w);
			if (kp)
				opt_st8(kp, b, w);
#pragma unroll
			for (int q = 0; q < 8 && sl.amax; q++)
				am = opt_amax(am, opt_f(opt_to<TP>(w[q])));
		}
		i = vend;
	}
	for (int64_t e = i + threadIdx.x; e < end; e += blockDim.x) {
		float w = mp ? mp[e] : opt_f(pp[e]);
		float m = loom_ld(sl.st0, sl.state_dt, e), v = loom_ld(sl.st1, sl.state_dt, e);
		adamw_f32_elem(k, decay, opt_f(gp[e]) * k.inv, w, m, v);
		loom_st(sl.st0, sl.state_dt, e, m);
		loom_st(sl.st1, sl.state_dt, e, v);
		if (mp)
			mp[e] = w;
		if (pp)
			pp[e] = opt_to<TP>(w);
		if (kp)
			kp[e] = opt_to<TP>(w);
		if (sl.amax)
			am = opt_amax(am, opt_f(opt_to<TP>(w)));
	}
	loom_amax_commit(sl.amax, am); /* uniform over the block: sl is the chunk's */
}

template <typename TG>
static __device__ void adamw_f32_by_param(const loom_cuda_opt_slot &sl, int64_t off, int64_t end,
					  const adamw_f32_k &k, float decay)
{
	switch (sl.param_dt) {
	case LOOM_F16: adamw_f32_chunk<TG, __half>(sl, off, end, k, decay); break;
	case LOOM_BF16: adamw_f32_chunk<TG, __nv_bfloat16>(sl, off, end, k, decay); break;
	default: adamw_f32_chunk<TG, float>(sl, off, end, k, decay); break;
	}
}

/* loom_opt_update_kernel's AdamW in fp32, the skipped step as there. */
__global__ void loom_opt_adamw_f32_kernel(const loom_cuda_opt_slot *slots,
					  const loom_cuda_opt_chunk *chunks, int n_chunks,
					  loom_optim_opts o, double lr, int matrices_only,
					  const loom_cuda_ctl *ctl, int *wvalid, int n_w)
{
	if (opt_skipped(slots, chunks, n_chunks, ctl))
		return;
	opt_amax_valid(wvalid, n_w);
	lr = opt_rate(lr, ctl);
	/* The step's constants once per block (two pow in double). */
	__shared__ adamw_f32_k k;
	if (threadIdx.x == 0) {
		const double t = (double)ctl->t;
		k.b1 = (float)o.beta1;
		k.nb1 = (float)(1 - o.beta1);
		k.b2 = (float)o.beta2;
		k.nb2 = (float)(1 - o.beta2);
		k.step = (float)(lr / (1 - pow(o.beta1, t)));
		k.isbc2 = (float)(1 / sqrt(1 - pow(o.beta2, t)));
		k.eps = (float)o.eps;
		k.inv = (float)ctl->inv_scale;
		k.decay = (float)(1 - lr * o.weight_decay);
	}
	__syncthreads();
	for (int ci = blockIdx.x; ci < n_chunks; ci += gridDim.x) {
		const loom_cuda_opt_slot sl = slots[chunks[ci].slot];
		const int64_t off = chunks[ci].off;
		const int64_t end = off + LOOM_CUDA_OPT_CHUNK < sl.numel ? off + LOOM_CUDA_OPT_CHUNK : sl.numel;
		const float d = matrices_only && !sl.matrix ? 1.0f : k.decay;
		switch (sl.grad_dt) {
		case LOOM_F16: adamw_f32_by_param<__half>(sl, off, end, k, d); break;
		case LOOM_BF16: adamw_f32_by_param<__nv_bfloat16>(sl, off, end, k, d); break;
		default: adamw_f32_by_param<float>(sl, off, end, k, d); break;
		}
	}
}

/* The schedule's rate for the updates that follow, in the control block. */
__global__ void loom_opt_set_lr_kernel(loom_cuda_ctl *ctl, double lr)
{
	ctl->lr = lr;
}

// ----------------------------------------------------------------------------
// kernel launchers

extern "C" loom_status loom_cuda_set_lr(loom_cuda_ctx *c, double lr, cudaStream_t s)
{
	loom_opt_set_lr_kernel<<<1, 1, 0, s>>>(c->ctl, lr);
	return LOOM_CUDA_LAUNCHED(c->err);
}

static const int threads = 256;

/* LOOM_CUDA_ADAMW=f32 (default the double kernel), read when a plan is
 * made: AdamW through loom_opt_adamw_f32_kernel. Compiled, not yet run on
 * a GPU. */
int loom_cuda_adamw_f32_on;

static unsigned opt_blocks(const loom_cuda_ctx *c)
{
	return c->n_chunks < 65535 ? (unsigned)(c->n_chunks > 0 ? c->n_chunks : 1) : 65535;
}

extern "C" loom_status loom_cuda_optim_check(loom_cuda_ctx *c, const loom_plan *p, cudaStream_t s)
{
	(void)p;
	if (c->n_chunks == 0)
		return LOOM_OK;
	loom_opt_check_kernel<<<opt_blocks(c), threads, 0, s>>>(c->d_slots, c->d_chunks, c->n_chunks,
								 c->ctl);
	return LOOM_CUDA_LAUNCHED(c->err);
}

extern "C" loom_status loom_cuda_shard_sumsq(loom_cuda_ctx *c, const loom_plan *p, int micro,
					       cudaStream_t s)
{
	loom_status st;
	if (c->n_chunks > 0) {
		loom_opt_shard_sumsq_kernel<<<opt_blocks(c), threads, 0, s>>>(
			c->d_slots, c->d_chunks, c->n_chunks, c->d_norm_parts, c->ctl, p->world,
			micro);
		if ((st = LOOM_CUDA_LAUNCHED(c->err)) != LOOM_OK)
			return st;
	}
	loom_opt_parts_sum_kernel<<<1, 1024, 0, s>>>(c->n_chunks, c->d_norm_parts, c->ctl);
	return LOOM_CUDA_LAUNCHED(c->err);
}

extern "C" loom_status loom_cuda_optim_launch(loom_cuda_ctx *c, const loom_plan *p, double lr,
						 int micro, int verdict, double clip, int matrices_only,
						 int norm_from, double host_norm, cudaStream_t s)
{
	loom_status st;
	unsigned blocks = opt_blocks(c);

	/* -1: check here; LOOM_FINITE_ON_DEVICE (-2): ctl->found_inf holds
	 * the ranks' summed check already; 0 or 1: the host's verdict. */
	if (p->scaling && verdict == -1 && (st = loom_cuda_optim_check(c, p, s)) != LOOM_OK)
		return st;
	const loom_cuda_wamax *w = &c->wamax;
	loom_opt_decide_kernel<<<1, 1, 0, s>>>(c->ctl, p->scaling, p->world, micro, verdict,
					       (unsigned *)w->amax, w->valid, w->n);
	if ((st = LOOM_CUDA_LAUNCHED(c->err)) != LOOM_OK)
		return st;
	if (c->n_chunks == 0)
		return LOOM_OK;
	if (clip > 0) {
		if (norm_from == LOOM_CUDA_NORM_PARTS) {
			loom_opt_sumsq_kernel<<<blocks, threads, 0, s>>>(c->d_slots, c->d_chunks,
									  c->n_chunks,
									  c->d_norm_parts, c->ctl);
			if ((st = LOOM_CUDA_LAUNCHED(c->err)) != LOOM_OK)
				return st;
		}
		loom_opt_clip_kernel<<<1, 1024, 0, s>>>(c->n_chunks, c->d_norm_parts, clip, c->ctl,
							norm_from, host_norm);
		if ((st = LOOM_CUDA_LAUNCHED(c->err)) != LOOM_OK)
			return st;
	}
	if (loom_cuda_adamw_f32_on && p->opts.optim.kind == LOOM_OPTIM_ADAMW)
		loom_opt_adamw_f32_kernel<<<blocks, threads, 0, s>>>(c->d_slots, c->d_chunks,
								      c->n_chunks, p->opts.optim, lr,
								      matrices_only, c->ctl, w->valid,
								      w->n);
	else
		loom_opt_update_kernel<<<blocks, threads, 0, s>>>(c->d_slots, c->d_chunks,
								   c->n_chunks, p->opts.optim, lr,
								   matrices_only, c->ctl, w->valid, w->n);
	return LOOM_CUDA_LAUNCHED(c->err);
}

// ----------------------------------------------------------------------------
// backend entries: the tables at alloc, the update and ZeRO's checks

/* The optimizer's slot and chunk tables, uploaded once into the arena. */
loom_status loom_cuda_opt_tables_upload(loom_cuda_ctx *c, const loom_plan *p)
{
	loom_cuda_opt_slot *slots =
		(loom_cuda_opt_slot *)calloc(p->n_pieces ? p->n_pieces : 1, sizeof(*slots));
	loom_cuda_opt_chunk *chunks =
		(loom_cuda_opt_chunk *)calloc(c->n_chunks ? c->n_chunks : 1, sizeof(*chunks));
	loom_status st = LOOM_OK;
	int k = 0;

	if (!slots || !chunks) {
		st = loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_NOMEM, "cuda: out of host memory");
		goto out_free;
	}
	/* One table row per optimizer piece, its addresses at its element 0. */
	for (int s = 0; s < p->n_pieces; s++) {
		const loom_optim_piece *pc = &p->pieces[s];
		const loom_param_slot *sl = &p->params[pc->slot];
		size_t psz = loom_dtype_size(p->g->nodes[sl->param].dtype);
		size_t gsz = loom_dtype_size(p->g->nodes[sl->grad].dtype);
		/* ZeRO-3: the parameter is its shards (whole only while gathered) */
		slots[s].param = (p->g->nodes[sl->param].flags & LOOM_NODE_SHARDED) ? NULL :
				 (unsigned char *)loom_arena_ptr(c->arena, p, sl->param) + pc->off * psz;
		slots[s].grad = (unsigned char *)loom_arena_ptr(c->arena, p, sl->grad) + pc->off * gsz;
		slots[s].master = pc->shard_master ? (void *)(c->arena->state + pc->master_off) :
				  sl->master != LOOM_NONE ?
					  (void *)((unsigned char *)loom_arena_ptr(c->arena, p, sl->master) +
						   pc->off * sizeof(float)) :
					  NULL;
		slots[s].st0 = p->n_state > 0 ? c->arena->state + pc->state_off[0] : NULL;
		slots[s].st1 = p->n_state > 1 ? c->arena->state + pc->state_off[1] : NULL;
		slots[s].pack = pc->pack ? c->arena->bucket + pc->pack_off : NULL;
		slots[s].numel = pc->n;
		slots[s].param_dt = p->g->nodes[sl->param].dtype;
		slots[s].grad_dt = p->g->nodes[sl->grad].dtype;
		slots[s].state_dt = sl->state_dtype;
		slots[s].matrix = sl->matrix;
		for (int64_t off = 0; off < pc->n; off += LOOM_CUDA_OPT_CHUNK) {
			chunks[k].slot = s;
			chunks[k].off = off;
			k++;
		}
	}
	/* LOOM_CUDA_FP8_AMAX_OPTIM: the weights' cells (NULL elsewhere) */
	loom_cuda_fp8_wamax_tables(c, p, slots);
	st = LOOM_CUDA_CHECK(cudaMemcpyAsync(c->d_slots, slots, sizeof(*slots) * p->n_pieces,
					     cudaMemcpyHostToDevice, c->stream),
			     c->err, sizeof(c->err));
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(cudaMemcpyAsync(c->d_chunks, chunks, sizeof(*chunks) * c->n_chunks,
						     cudaMemcpyHostToDevice, c->stream),
				     c->err, sizeof(c->err));
	/* The host tables are freed below: wait for the copies. */
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(loom_cuda_sync_stream(c, c->stream), c->err, sizeof(c->err));
out_free:
	free(chunks);
	free(slots);
	return st;
}

/* The fused optimizer runs over every piece at once (its chunk table, made
 * at alloc: whole slots, or under ZeRO this rank's shard). The overflow
 * check and the skip stay on the device; under ZeRO the verdict is the
 * executor's (finite), summed over the ranks. */
loom_status loom_cuda_optim(void *ctx, const loom_plan *p, const loom_arena *arena,
			    loom_train_state *ts, int first, int last, int finite)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	loom_status st;
	(void)arena;
	if ((st = loom_cuda_use_device(c)) != LOOM_OK)
		return st;
	if (first != 0 || last != p->n_pieces)
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_UNSUPPORTED,
				 "cuda: the optimizer updates all its pieces at once, not pieces "
				 "[%d, %d) of %d", first, last, p->n_pieces);
	if ((st = loom_cuda_push_host_state(c, ts)) != LOOM_OK)
		return st;
	/* ZeRO's clipping: the norm over the ranks, which the executor took
	 * before (none on a step it knows is skipped). */
	int norm_from = LOOM_CUDA_NORM_PARTS;
	if (p->zero && p->opts.optim.clip_grad > 0) {
		if (!c->zero_norm && finite != 0)
			return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_STATE,
					 "cuda: ZeRO's clipping needs the gradient norm over the "
					 "ranks before the update (grad_sumsq or grad_sumsq_device)");
		norm_from = c->zero_norm ? c->zero_norm : LOOM_CUDA_NORM_HOST;
		c->zero_norm = 0;
	}
	/* NaN: the control block's rate (captured steps); else by value. */
	return loom_cuda_optim_launch(c, p, c->lr_device ? NAN : ts->lr, ts->micro, finite,
				      p->opts.optim.clip_grad,
				      p->opts.optim.decay_matrices_only, norm_from, ts->grad_norm,
				      c->stream);
}

/* The device, and all of the plan's pieces at once (what ZeRO's checks
 * on this backend take): else why not, naming the check. */
static loom_status all_pieces(loom_cuda_ctx *c, const loom_plan *p, int first, int last,
			      const char *what)
{
	loom_status st = loom_cuda_use_device(c);
	if (st != LOOM_OK)
		return st;
	if (first != 0 || last != p->n_pieces)
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_UNSUPPORTED,
				 "cuda: the %s covers all pieces at once, not [%d, %d) of %d", what,
				 first, last, p->n_pieces);
	return LOOM_OK;
}

/* ZeRO's clipping on the device: this rank's sum of squares into
 * ctl->sumsq, in the compute stream's order, for the executor's
 * all-reduce; the next optim clips by it. No wait. */
loom_status loom_cuda_grad_sumsq_device(void *ctx, const loom_plan *p, const loom_arena *arena,
					const loom_train_state *ts, int first, int last,
					void **sumsq)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	loom_status st;
	(void)arena;
	if ((st = all_pieces(c, p, first, last, "gradient norm")) != LOOM_OK ||
	    (st = loom_cuda_push_host_state(c, ts)) != LOOM_OK ||
	    (st = loom_cuda_shard_sumsq(c, p, ts->micro, c->stream)) != LOOM_OK)
		return st;
	c->zero_norm = LOOM_CUDA_NORM_DEVICE;
	*sumsq = &c->ctl->sumsq;
	return LOOM_OK;
}

/* ZeRO's clipping through the host (LOOM_ZERO_DEVICE_NORM=0, or a
 * transport that is not stream-ordered): the same sum, read back (waits);
 * the next optim clips by the executor's ts->grad_norm. */
loom_status loom_cuda_grad_sumsq(void *ctx, const loom_plan *p, const loom_arena *arena,
				 const loom_train_state *ts, int first, int last, double *sumsq)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	void *d = NULL;
	loom_status st = loom_cuda_grad_sumsq_device(ctx, p, arena, ts, first, last, &d);
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(cudaMemcpyAsync(sumsq, d, sizeof(double),
						     cudaMemcpyDeviceToHost, c->stream),
				     c->err, sizeof(c->err));
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(loom_cuda_sync_stream(c, c->stream), c->err, sizeof(c->err));
	c->zero_norm = LOOM_CUDA_NORM_HOST;
	return st;
}

/* ZeRO, on the device: this rank's pieces checked into ctl->found_inf,
 * which the executor sums over the ranks (NCCL, in the stream's order)
 * and the decision then reads; no wait. */
loom_status loom_cuda_grads_finite_device(void *ctx, const loom_plan *p,
					  const loom_arena *arena, int first, int last,
					  void **flag)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	loom_status st;
	(void)arena;
	if ((st = all_pieces(c, p, first, last, "overflow check")) != LOOM_OK ||
	    (st = LOOM_CUDA_CHECK(cudaMemsetAsync(&c->ctl->found_inf, 0, sizeof(int32_t), c->stream),
				  c->err, sizeof(c->err))) != LOOM_OK ||
	    (st = loom_cuda_optim_check(c, p, c->stream)) != LOOM_OK)
		return st;
	*flag = &c->ctl->found_inf;
	return LOOM_OK;
}

/* ZeRO through the host: the same check, the verdict read back (waits);
 * the decision takes the executor's verdict. */
loom_status loom_cuda_grads_finite(void *ctx, const loom_plan *p, const loom_arena *arena,
				   int first, int last, int *finite)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)ctx;
	int32_t bad = 0;
	void *flag = NULL;
	loom_status st = loom_cuda_grads_finite_device(ctx, p, arena, first, last, &flag);
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(cudaMemcpyAsync(&bad, flag, sizeof(bad),
						     cudaMemcpyDeviceToHost, c->stream),
				     c->err, sizeof(c->err));
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(loom_cuda_sync_stream(c, c->stream), c->err, sizeof(c->err));
	if (st == LOOM_OK)
		*finite = !bad;
	return st;
}
