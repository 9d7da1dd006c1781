/*
 * engine/cuda/bn_cudnn.cu — batch norm through cuDNN's batch-norm calls
 * (CUDNN_BATCHNORM_SPATIAL, NCHW): training forward with the running
 * statistics updated in place (exponentialAverageFactor = momentum, the
 * running variance unbiased, as PyTorch, which calls the same function),
 * eval forward from the running statistics, and one backward call that
 * makes dx, dgamma and dbeta together. The graph has the backward as three
 * nodes (BN_BWD_DATA, BN_BWD_GAMMA, a CHANNEL_SUM for dbeta); graph/fuse.c
 * marks the last two as siblings of the first (made_by), so the one call
 * writes all three where the memory plan put them. An unmarked gradient
 * goes to scratch in ws and its own node computes it later. The forward
 * saves its mean and inverse std into the slot fuse_plan.cu's plan_saved
 * gave it, and the backward passes them back; a forward with a fused relu
 * asks for the Ex call with the activation where cuDNN takes NCHW. A node the format pass put in
 * NHWC (formats.c, LOOM_CUDA_NHWC) runs with NHWC descriptors in
 * CUDNN_BATCHNORM_SPATIAL_PERSISTENT mode, its training forward through
 * the Ex call (with or without the relu), its backward the legacy call in
 * the same mode with the saved statistics; eval in SPATIAL mode. Under
 * LOOM_CUDA_BN_BWD_EX (on by default) the forward leaves its Ex reserve in
 * the saved slot after the statistics and the backward is
 * cudnnBatchNormalizationBackwardEx with it, doing the relu's backward
 * (BN_ACTIVATION) or the add + relu's (BN_ADD_ACTIVATION, dz) where
 * fuse_plan.cu's plan_bn_bwd_ex fused them (LOOM_CUDA_BN_BWD_FUSE): the
 * legacy NHWC backward took 93 of 113 ms of an H100 ResNet-50 O2 step.
 * Compiled, not yet run.
 *
 * cuDNN takes x, y, dy and dx in one dtype (f32 or f16 here) with gamma,
 * beta and the statistics in f32: the O0, O1 and O2 (keep_batchnorm_fp32)
 * graphs. bf16 data with f32 parameters (cuDNN's PSEUDO_BFLOAT16 config:
 * O2 bf16, O1 bf16 under amp.bn_half) comes here too under
 * LOOM_CUDA_BN_BF16_CUDNN=1 (formats.c's loom_cuda_bn_cudnn_takes; the same
 * calls and descriptors, CUDNN_DATA_BFLOAT16; compiled, not yet run), else
 * it stays on the own kernels. Anything else (O3's half statistics, f64)
 * keeps the own kernels of bn.cu, which follow the CPU formula for formula.
 * So does every node under the loom_cuda_test_own_kernels hook, which lets
 * the tests check both paths against the CPU. CPU twin:
 * engine/cpu/bn_impl.h.
 */
#include <stdio.h>
#include <string.h>

#include "engine/cuda/cuda_internal.h"

/* Can cuDNN run node v? (x and the data tensors f32 or f16, bf16 under
 * LOOM_CUDA_BN_BF16_CUDNN, the parameter tensors f32: formats.c's
 * loom_cuda_bn_cudnn_takes, which the format pass asks too.) */
static int cudnn_takes(const loom_plan *p, const loom_node *n)
{
	return loom_cuda_bn_cudnn_takes(p, n);
}

/* The dgamma (BN_BWD_GAMMA) and dbeta (CHANNEL_SUM) siblings graph/fuse.c
 * marked on backward node v, f32 only for cuDNN; whether it found one. */
static int find_siblings(const loom_plan *p, loom_value v, loom_cuda_bn_plan *bp, int f32_only)
{
	for (loom_value w = loom_sibling_first(p, v); w != LOOM_NONE; w = loom_sibling_next(p, w)) {
		const loom_node *s = &p->g->nodes[w];
		if (f32_only && s->dtype != LOOM_F32)
			continue;
		if (s->op == LOOM_OP_BN_BWD_GAMMA)
			bp->dgamma = w;
		else if (s->op == LOOM_OP_CHANNEL_SUM)
			bp->dbeta = w;
	}
	return bp->dgamma != LOOM_NONE || bp->dbeta != LOOM_NONE;
}

/* The forward through the Ex call: with the relu inside (BN_ACTIVATION)
 * for a fused relu, where cuDNN takes the descriptors; in NHWC
 * (CUDNN_BATCHNORM_SPATIAL_PERSISTENT) the plain one too (OPS_BN), cuDNN's
 * fast NHWC kernels. Its workspace sizes are asked here and a refusal keeps
 * the legacy call (and the relu kernel after it), not an error. */
static loom_status plan_ex(loom_cuda_ctx *c, loom_cuda_node_plan *np, int relu)
{
	loom_cuda_bn_plan *bp = &np->bn;
	cudnnBatchNormOps_t ops = relu ? CUDNN_BATCHNORM_OPS_BN_ACTIVATION : CUDNN_BATCHNORM_OPS_BN;
	loom_status st = LOOM_CUDNN_CHECK(cudnnCreateActivationDescriptor(&bp->act), c->err,
					  sizeof(c->err));
	if (st != LOOM_OK)
		return st;
	st = LOOM_CUDNN_CHECK(cudnnSetActivationDescriptor(bp->act, CUDNN_ACTIVATION_RELU,
							   CUDNN_PROPAGATE_NAN, 0.0),
			      c->err, sizeof(c->err));
	if (st != LOOM_OK)
		return st;
	size_t ws = 0, reserve = 0;
	cudnnActivationDescriptor_t act = relu ? bp->act : NULL;
	if (cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
		    c->dnn, (cudnnBatchNormMode_t)bp->mode, ops, bp->x, NULL, bp->x, bp->param, act,
		    &ws) != CUDNN_STATUS_SUCCESS ||
	    cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
		    c->dnn, (cudnnBatchNormMode_t)bp->mode, ops, act, bp->x, &reserve) !=
		    CUDNN_STATUS_SUCCESS)
		return LOOM_OK; /* ex stays 0 */
	bp->ex = 1;
	bp->ex_ops = (int)ops;
	bp->ex_ws = ws;
	bp->ex_reserve = reserve;
	np->lib_ws = loom_cuda_align(ws) + loom_cuda_align(reserve);
	/* The saved slot's reserve (LOOM_CUDA_BN_BWD_EX) takes what any of
	 * the forward's Ex calls may leave: with the add (plan_bn_add) and,
	 * under the diagnosis, without it. */
	bp->reserve_max = reserve;
	const cudnnBatchNormOps_t all[3] = { CUDNN_BATCHNORM_OPS_BN, CUDNN_BATCHNORM_OPS_BN_ACTIVATION,
					     CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION };
	for (int i = 0; bp->nhwc && i < 3; i++) {
		size_t r = 0;
		if (cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
			    c->dnn, (cudnnBatchNormMode_t)bp->mode, all[i],
			    all[i] == CUDNN_BATCHNORM_OPS_BN ? NULL : bp->act, bp->x, &r) ==
			    CUDNN_STATUS_SUCCESS &&
		    r > bp->reserve_max)
			bp->reserve_max = r;
	}
	return LOOM_OK;
}

static cudnnBatchNormOps_t ex_ops(int ops)
{
	return ops == LOOM_CUDA_BN_EX_ADD_ACT ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION :
	       ops == LOOM_CUDA_BN_EX_ACT     ? CUDNN_BATCHNORM_OPS_BN_ACTIVATION :
						CUDNN_BATCHNORM_OPS_BN;
}

loom_status loom_cuda_bn_bwd_ex_ws(loom_cuda_ctx *c, loom_cuda_node_plan *np, size_t *ws)
{
	loom_cuda_bn_plan *bp = &np->bn;
	*ws = 0;
	if (np->kind != LOOM_CUDA_PLAN_BN || !bp->nhwc)
		return LOOM_ERR_UNSUPPORTED;
	if (!bp->act) {
		if (cudnnCreateActivationDescriptor(&bp->act) != CUDNN_STATUS_SUCCESS)
			return LOOM_ERR_UNSUPPORTED;
		if (cudnnSetActivationDescriptor(bp->act, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN,
						 0.0) != CUDNN_STATUS_SUCCESS)
			return LOOM_ERR_UNSUPPORTED;
	}
	int any = 0;
	for (int ops = LOOM_CUDA_BN_EX_BN; ops <= LOOM_CUDA_BN_EX_ADD_ACT; ops++) {
		size_t w = 0;
		const int act = ops != LOOM_CUDA_BN_EX_BN, add = ops == LOOM_CUDA_BN_EX_ADD_ACT;
		if (cudnnGetBatchNormalizationBackwardExWorkspaceSize(
			    c->dnn, (cudnnBatchNormMode_t)bp->mode, ex_ops(ops), bp->x,
			    act ? bp->x : NULL, bp->x, add ? bp->x : NULL, bp->x, bp->param,
			    act ? bp->act : NULL, &w) != CUDNN_STATUS_SUCCESS) {
			if (ops == LOOM_CUDA_BN_EX_BN)
				return LOOM_ERR_UNSUPPORTED; /* the plain one at least */
			continue;
		}
		any = 1;
		if (w > *ws)
			*ws = w;
	}
	return any ? LOOM_OK : LOOM_ERR_UNSUPPORTED;
}

loom_status loom_cuda_bn_plan_make(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
				   loom_cuda_node_plan *np)
{
	const loom_node *n = &p->g->nodes[v];
	const loom_node *x = &p->g->nodes[n->src[0]];
	loom_cuda_bn_plan *bp = &np->bn;
	loom_status st;
	(void)c;

	bp->dgamma = bp->dbeta = LOOM_NONE;
	bp->own_makes = 0;
	/* Synchronised batch norm needs its statistics between two kernels;
	 * cuDNN computes and applies them in one call. */
	if (loom_cuda_own_kernels_on || n->a.bn.sync || !cudnn_takes(p, n)) {
		/* kind stays NONE: the own kernels run it; the split backward
		 * writes dgamma and dbeta with dx, in their dtypes. */
		if (n->op == LOOM_OP_BN_BWD_DATA && !n->a.bn.sync)
			bp->own_makes = find_siblings(p, v, bp, 0);
		return LOOM_OK;
	}
	np->kind = LOOM_CUDA_PLAN_BN;
	if ((st = LOOM_CUDNN_CHECK(cudnnCreateTensorDescriptor(&bp->x), c->err, sizeof(c->err))) !=
	    LOOM_OK)
		return st;
	if ((st = LOOM_CUDNN_CHECK(cudnnCreateTensorDescriptor(&bp->param), c->err,
				   sizeof(c->err))) != LOOM_OK)
		return st;
	const int64_t *d = x->shape.dims;
	/* NHWC where the format pass put the node there (formats.c): cuDNN's
	 * persistent NHWC kernels, the statistics the same as SPATIAL's. */
	bp->nhwc = n->format == LOOM_FORMAT_NHWC;
	bp->mode = bp->nhwc ? (int)CUDNN_BATCHNORM_SPATIAL_PERSISTENT : (int)CUDNN_BATCHNORM_SPATIAL;
	const cudnnTensorFormat_t tf = bp->nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
	st = LOOM_CUDNN_CHECK(cudnnSetTensor4dDescriptor(bp->x, tf,
							 loom_cudnn_data_type(x->dtype), (int)d[0],
							 (int)d[1], (int)d[2], (int)d[3]),
			      c->err, sizeof(c->err));
	if (st != LOOM_OK)
		return st;
	st = LOOM_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(bp->param, bp->x,
							    CUDNN_BATCHNORM_SPATIAL),
			      c->err, sizeof(c->err));
	if (st != LOOM_OK)
		return st;
	if (n->op == LOOM_OP_BATCHNORM2D && (n->a.bn.relu || bp->nhwc))
		return plan_ex(c, np, n->a.bn.relu);
	if (n->op != LOOM_OP_BN_BWD_DATA)
		return LOOM_OK;

	/* The backward call writes dgamma and dbeta too: into the siblings
	 * graph/fuse.c marked, else into scratch at the start of ws. */
	find_siblings(p, v, bp, 1);
	np->lib_ws = loom_cuda_align(2 * sizeof(float) * (size_t)d[1]);
	return LOOM_OK;
}

void loom_cuda_bn_plan_free(loom_cuda_node_plan *np)
{
	loom_cuda_bn_plan *bp = &np->bn;
	if (bp->x)
		cudnnDestroyTensorDescriptor(bp->x);
	if (bp->param)
		cudnnDestroyTensorDescriptor(bp->param);
	if (bp->act)
		cudnnDestroyActivationDescriptor(bp->act);
	bp->x = bp->param = NULL;
	bp->act = NULL;
}

/* cuDNN's one-pass forward (Ex), the relu inside it; the reserve in the
 * saved slot where the Ex backward reads it, else scratch (the backward is
 * the legacy call). *done is 0 when cuDNN refused the call at run time. */
static loom_status bn_fwd_ex(loom_cuda_ctx *c, const loom_node *n, loom_cuda_bn_plan *bp,
			     void *const *src, void *out, float *save_mean, float *save_istd,
			     int64_t ch, int *done)
{
	const float one = 1.0f, zero = 0.0f;
	unsigned char *ws = (unsigned char *)c->arena->ws;
	const int in_slot = bp->reserve_slot && save_mean;
	void *reserve = in_slot ? (void *)((unsigned char *)save_mean +
					   loom_cuda_bn_reserve_off(ch)) :
				  (void *)(ws + loom_cuda_align(bp->ex_ws));
	const int with_relu = bp->ex_ops == (int)CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
	cudnnStatus_t cs = cudnnBatchNormalizationForwardTrainingEx(
		c->dnn, (cudnnBatchNormMode_t)bp->mode, (cudnnBatchNormOps_t)bp->ex_ops,
		&one, &zero, bp->x, src[0], NULL, NULL, bp->x, out, bp->param, src[1],
		src[2], n->a.bn.momentum, src[3], src[4], n->a.bn.eps, save_mean,
		save_istd, with_relu ? bp->act : NULL, ws, bp->ex_ws, reserve,
		in_slot ? bp->reserve_max : bp->ex_reserve);

	*done = 1;
	if (cs == CUDNN_STATUS_SUCCESS && in_slot)
		bp->ran_ex = with_relu ? LOOM_CUDA_BN_EX_ACT : LOOM_CUDA_BN_EX_BN;
	if (cs == CUDNN_STATUS_SUCCESS)
		return with_relu || !n->a.bn.relu ?
			       LOOM_OK :
			       loom_cuda_relu_fwd(c->err, c->stream, out, n->dtype, out,
						  n->dtype, loom_shape_numel(&n->shape));
	if (cs != CUDNN_STATUS_NOT_SUPPORTED)
		return LOOM_CUDNN_CHECK(cs, c->err, sizeof(c->err));
	*done = 0;
	return LOOM_OK;
}

/* The legacy forward calls, inference or training. */
static loom_status bn_fwd_legacy(loom_cuda_ctx *c, const loom_node *n,
				 const loom_cuda_bn_plan *bp, int train, void *const *src,
				 void *out, float *save_mean, float *save_istd)
{
	const float one = 1.0f, zero = 0.0f;
	loom_status st;

	if (!train)
		st = LOOM_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(
					      c->dnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero,
					      bp->x, src[0], bp->x, out, bp->param, src[1],
					      src[2], src[3], src[4], n->a.bn.eps),
				      c->err, sizeof(c->err));
	else
		st = LOOM_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
					      c->dnn, (cudnnBatchNormMode_t)bp->mode, &one, &zero,
					      bp->x, src[0], bp->x, out, bp->param, src[1],
					      src[2], n->a.bn.momentum, src[3], src[4],
					      n->a.bn.eps, save_mean, save_istd),
				      c->err, sizeof(c->err));
	/* A fused relu (graph/fuse.c): the legacy API has no relu
	 * epilogue, so the relu kernel runs in place after it, on the
	 * rounded output (a half -0 stays -0: an equal value). */
	if (st == LOOM_OK && n->a.bn.relu)
		st = loom_cuda_relu_fwd(c->err, c->stream, out, n->dtype, out, n->dtype,
					loom_shape_numel(&n->shape));
	return st;
}

/* BATCHNORM2D (x, gamma, beta, running mean, running var); the mean and
 * inverse std saved for the backward where the plan gave the node a slot. */
static loom_status bn_fwd(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
			  const loom_cuda_bn_plan *bp, int train, void *const *src, void *out)
{
	const loom_node *n = &p->g->nodes[v];
	const int64_t ch = p->g->nodes[n->src[0]].shape.dims[1];
	float *save_mean = (float *)loom_cuda_saved_slot(c, v, v);
	float *save_istd = save_mean ? save_mean + ch : NULL;
	loom_cuda_bn_plan *mp = (loom_cuda_bn_plan *)bp; /* what this run called */
	loom_status st;
	int done;

	if (train)
		mp->ran_ex = LOOM_CUDA_BN_EX_NONE;
	if (train && bp->ex) {
		st = bn_fwd_ex(c, n, mp, src, out, save_mean, save_istd, ch, &done);
		if (done)
			return st;
		/* Refused at run time: the legacy call from now on. */
		mp->ex = 0;
	}
	return bn_fwd_legacy(c, n, bp, train, src, out, save_mean, save_istd);
}

/* Which Ex call the backward makes: its fusion's ops, or OPS_BN, as far as
 * the forward ran the matching Ex call in this (training) run; else NONE,
 * the legacy call. */
static int bn_bwd_ex_ops(loom_cuda_ctx *c, const loom_cuda_node_plan *np, int train,
			 const float *sm, int fused)
{
	const loom_cuda_bn_plan *bp = &np->bn;
	const loom_cuda_bn_bwd_fusion *fu = &bp->fuse;
	int ops = LOOM_CUDA_BN_EX_NONE;
	if (train && bp->bwd_ex && sm) {
		const int ran = c->plans[np->saved_by].bn.ran_ex;
		ops = fused && ran == fu->ops	    ? fu->ops :
		      !fused && ran == LOOM_CUDA_BN_EX_BN ? ran :
							    LOOM_CUDA_BN_EX_NONE;
		/* a relu backward run by this call's fallback, then OPS_BN */
		if (fused && ops == LOOM_CUDA_BN_EX_NONE && ran == LOOM_CUDA_BN_EX_BN)
			ops = LOOM_CUDA_BN_EX_BN;
	}
	return ops;
}

/* A relu backward the call was to do (plan_bn_bwd_ex) and does not: run
 * here, into its own output, which *dy then names. */
static loom_status bn_relu_bwd(const loom_plan *p, loom_cuda_ctx *c, const loom_node *n,
			       const loom_cuda_bn_bwd_fusion *fu, const void **dy)
{
	void *r = loom_arena_ptr(c->arena, p, fu->relu_bwd);
	const int rdt = p->g->nodes[fu->relu_bwd].dtype;
	loom_status st = loom_cuda_relu_bwd(
		c->err, c->stream, loom_arena_ptr(c->arena, p, fu->y), p->g->nodes[fu->y].dtype,
		loom_arena_ptr(c->arena, p, fu->dy), p->g->nodes[fu->dy].dtype, r, rdt,
		loom_shape_numel(&n->shape));
	if (st != LOOM_OK)
		return st;
	*dy = r;
	return LOOM_OK;
}

/* The backward Ex call with ops, the forward's reserve after its
 * statistics (plan_saved). *done is 0 when cuDNN refused it at run time:
 * the legacy call from now on, the relu backward (if this call was to do
 * it) first. */
static loom_status bn_bwd_ex(const loom_plan *p, loom_cuda_ctx *c, const loom_cuda_node_plan *np,
			     const loom_node *n, int ops, void *const *src, void *out, void *dg,
			     void *db, const float *sm, int64_t ch, const void **dy, int *done)
{
	const float one = 1.0f, zero = 0.0f;
	const loom_cuda_bn_plan *bp = &np->bn;
	const loom_cuda_bn_bwd_fusion *fu = &bp->fuse;
	const loom_cuda_bn_plan *fp = &c->plans[np->saved_by].bn;
	unsigned char *ws = (unsigned char *)c->arena->ws + loom_cuda_align(2 * sizeof(float) * (size_t)ch);
	void *reserve = (unsigned char *)sm + loom_cuda_bn_reserve_off(ch);
	const int act = ops != LOOM_CUDA_BN_EX_BN, add = ops == LOOM_CUDA_BN_EX_ADD_ACT;
	if (act)
		*dy = loom_arena_ptr(c->arena, p, fu->dy);
	cudnnStatus_t cs = cudnnBatchNormalizationBackwardEx(
		c->dnn, (cudnnBatchNormMode_t)bp->mode, ex_ops(ops), &one, &zero, &one, &zero,
		bp->x, src[0], act ? bp->x : NULL, act ? loom_arena_ptr(c->arena, p, fu->y) : NULL,
		bp->x, *dy, add ? bp->x : NULL,
		add ? loom_arena_ptr(c->arena, p, fu->relu_bwd) : NULL, bp->x, out, bp->param,
		src[1], act ? loom_arena_ptr(c->arena, p, fu->beta) : NULL, dg, db, n->a.bn.eps,
		sm, sm + ch, act ? bp->act : NULL, ws, bp->bwd_ws, reserve, fp->reserve_max);
	*done = 1;
	if (cs != CUDNN_STATUS_NOT_SUPPORTED)
		return LOOM_CUDNN_CHECK(cs, c->err, sizeof(c->err));
	((loom_cuda_bn_plan *)bp)->bwd_ex = 0;
	if (act) {
		loom_status st = bn_relu_bwd(p, c, n, fu, dy);
		if (st != LOOM_OK)
			return st;
	}
	*done = 0;
	return LOOM_OK;
}

/* BN_BWD_DATA (x, gamma, dy) -> dx, with dgamma and dbeta. */
static loom_status bn_bwd(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
			  const loom_cuda_node_plan *np, int train, void *const *src, void *out)
{
	const loom_node *n = &p->g->nodes[v];
	const loom_cuda_bn_plan *bp = &np->bn;
	const float one = 1.0f, zero = 0.0f;
	int64_t ch = p->g->nodes[n->src[0]].shape.dims[1];
	float *scratch = (float *)c->arena->ws;
	void *dg = bp->dgamma != LOOM_NONE ? loom_arena_ptr(c->arena, p, bp->dgamma) : (void *)scratch;
	void *db = bp->dbeta != LOOM_NONE ? loom_arena_ptr(c->arena, p, bp->dbeta) : (void *)(scratch + ch);
	/* The forward's saved mean and inverse std, when it ran in this
	 * (training) run; else cuDNN recomputes them from x. */
	const float *sm = train ? (const float *)loom_cuda_saved_slot(c, v, LOOM_NONE) : NULL;
	const void *dy = src[2];
	const loom_cuda_bn_bwd_fusion *fu = &bp->fuse;
	const int fused = fu->ops != LOOM_CUDA_BN_EX_NONE && loom_cuda_relu_fusion_on(c);
	int ops = bn_bwd_ex_ops(c, np, train, sm, fused);
	loom_status st;
	int done;
	/* A relu backward this call was to do and does not: run it here, and
	 * read its output. */
	if (fused && ops != fu->ops && (st = bn_relu_bwd(p, c, n, fu, &dy)) != LOOM_OK)
		return st;
	if (ops != LOOM_CUDA_BN_EX_NONE) {
		st = bn_bwd_ex(p, c, np, n, ops, src, out, dg, db, sm, ch, &dy, &done);
		if (done)
			return st;
	}
	return LOOM_CUDNN_CHECK(cudnnBatchNormalizationBackward(
					c->dnn, (cudnnBatchNormMode_t)bp->mode, &one, &zero, &one, &zero,
					bp->x, src[0], bp->x, dy, bp->x, out, bp->param, src[1],
					dg, db, n->a.bn.eps, sm, sm ? sm + ch : NULL),
				c->err, sizeof(c->err));
}

loom_status loom_cuda_bn_run(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
			     const loom_cuda_node_plan *np, int train, void *const *src, void *out)
{
	if (p->g->nodes[v].op == LOOM_OP_BATCHNORM2D)
		return bn_fwd(p, c, v, &np->bn, train, src, out);
	return bn_bwd(p, c, v, np, train, src, out);
}

/* ------------------------------------------------------------ bn + add + relu */

loom_status loom_cuda_bn_add_sizes(loom_cuda_ctx *c, const loom_cuda_node_plan *bnp, size_t *ws,
				   size_t *reserve)
{
	const loom_cuda_bn_plan *bp = &bnp->bn;
	*ws = *reserve = 0;
	if (bnp->kind != LOOM_CUDA_PLAN_BN || !bp->nhwc || !bp->act)
		return LOOM_ERR_UNSUPPORTED;
	if (cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
		    c->dnn, (cudnnBatchNormMode_t)bp->mode, CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION,
		    bp->x, bp->x, bp->x, bp->param, bp->act, ws) != CUDNN_STATUS_SUCCESS ||
	    cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
		    c->dnn, (cudnnBatchNormMode_t)bp->mode, CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION,
		    bp->act, bp->x, reserve) != CUDNN_STATUS_SUCCESS)
		return LOOM_ERR_UNSUPPORTED;
	return LOOM_OK;
}

loom_status loom_cuda_bn_add_run(const loom_plan *p, loom_cuda_ctx *c, loom_value a)
{
	const loom_cuda_node_plan *ap = &c->plans[a];
	loom_value b = ap->bn_add;
	const loom_node *n = &p->g->nodes[b];
	const loom_cuda_bn_plan *bp = &c->plans[b].bn;
	const float one = 1.0f, zero = 0.0f;
	void *src[5];
	for (int i = 0; i < 5; i++)
		src[i] = loom_arena_ptr(c->arena, p, n->src[i]);
	void *z = loom_arena_ptr(c->arena, p, ap->bn_add_z);
	void *out = loom_arena_ptr(c->arena, p, a);
	float *save_mean = (float *)loom_cuda_saved_slot(c, b, b);
	float *save_istd = save_mean ? save_mean + p->g->nodes[n->src[0]].shape.dims[1] : NULL;
	unsigned char *ws = (unsigned char *)c->arena->ws;
	/* The reserve in the saved slot for the Ex backward (plan_saved). */
	const int in_slot = bp->reserve_slot && save_mean;
	void *reserve = in_slot ? (void *)((unsigned char *)save_mean +
					   loom_cuda_bn_reserve_off(p->g->nodes[n->src[0]].shape.dims[1])) :
				  (void *)(ws + loom_cuda_align(ap->bn_add_ws));
	loom_cuda_bn_plan *mp = &c->plans[b].bn;
	mp->ran_ex = LOOM_CUDA_BN_EX_NONE;
	cudnnStatus_t cs = cudnnBatchNormalizationForwardTrainingEx(
		c->dnn, (cudnnBatchNormMode_t)bp->mode, CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION, &one,
		&zero, bp->x, src[0], bp->x, z, bp->x, out, bp->param, src[1], src[2],
		n->a.bn.momentum, src[3], src[4], n->a.bn.eps, save_mean, save_istd, bp->act, ws,
		ap->bn_add_ws, reserve, in_slot ? bp->reserve_max : ap->bn_add_reserve);
	if (cs == CUDNN_STATUS_NOT_SUPPORTED)
		return LOOM_ERR_UNSUPPORTED;
	if (cs == CUDNN_STATUS_SUCCESS && in_slot)
		mp->ran_ex = LOOM_CUDA_BN_EX_ADD_ACT;
	return LOOM_CUDNN_CHECK(cs, c->err, sizeof(c->err));
}
