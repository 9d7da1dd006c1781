/*
 * engine/cuda/bn_fuse.h — which batch-norm nodes the CUDA backend runs as
 * cuDNN's fused Ex calls (forward: batch norm + add + relu; backward: the
 * Ex backward with the forward's reserve, the relu's or the add + relu's
 * backward inside it), decided from the plan alone, in plain C, so that a
 * CPU test asks the same rules without a GPU (tests/engine/cuda:
 * test_cuda_formats). fuse_plan.cu asks these and adds what only cuDNN can
 * say (workspace and reserve sizes, a refusal).
 */
#ifndef LOOM_ENGINE_CUDA_BN_FUSE_H
#define LOOM_ENGINE_CUDA_BN_FUSE_H

#include <stddef.h>

#include "engine/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Each node's first step in p (-1: none), malloc'ed for the caller to
 * free; NULL: out of memory. */
int *loom_cuda_first_steps(const loom_plan *p);

/* Whether values a and b share bytes; *same: exactly the same bytes. */
int loom_cuda_bytes_meet(const loom_plan *p, loom_value a, loom_value b, int *same);

/* Whether value v is read by a node run after step `after`. */
int loom_cuda_read_after(const loom_plan *p, loom_value v, const int *step_of, int after);

/* What the backward Ex call runs (cudnnBatchNormOps_t + 1; 0: the legacy
 * call, no reserve). */
enum {
	LOOM_CUDA_BN_EX_NONE = 0,
	LOOM_CUDA_BN_EX_BN,      /* CUDNN_BATCHNORM_OPS_BN */
	LOOM_CUDA_BN_EX_ACT,     /* CUDNN_BATCHNORM_OPS_BN_ACTIVATION (relu) */
	LOOM_CUDA_BN_EX_ADD_ACT, /* CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION (add + relu) */
};

/*
 * ADD node a as batch norm + add + relu in one call: the batch norm it
 * runs (returned, LOOM_NONE if none) and the add's other source (*z).
 * cudnn_nhwc[v]: batch-norm node v runs on cuDNN in NHWC; taken[v]: v is
 * already fused into another add. The add: relu fused, NHWC, 2 sources;
 * the batch norm: no relu, not synchronised, not an output, read by a
 * alone, the dtypes and shapes alike, run before a; its x still read
 * after a (the backward), and a's output apart from x and z.
 */
loom_value loom_cuda_bn_add_match(const loom_plan *p, const int *step_of, loom_value a,
				  const unsigned char *cudnn_nhwc, const loom_value *taken,
				  loom_value *z);

/* A backward Ex plan (loom_cuda_bn_bwd_match's answer). */
typedef struct loom_cuda_bn_bwd_fusion {
	int ops;             /* LOOM_CUDA_BN_EX_ACT or _ADD_ACT; NONE: plain (BN) */
	loom_value relu_bwd; /* the RELU_BWD node whose work the call does */
	loom_value y;        /* the relu's output the call reads (the forward's, or the add's) */
	loom_value dy;       /* the gradient coming into the relu */
	loom_value beta;     /* the forward's beta (cuDNN reads it with an activation) */
} loom_cuda_bn_bwd_fusion;

/*
 * Whether cuDNN backward b (BN_BWD_DATA, whose forward is f) can do the
 * relu backward that makes its dy: f carries a fused relu (ACT), or the
 * add + relu that runs f (add_by[f], ADD_ACT) made the relu's input; the
 * relu backward r = b's src[2] is then skipped, and for ADD_ACT the call
 * writes r's output (dz, the residual branch's gradient). makes[w]: w is
 * a sibling b's call writes (dgamma, dbeta). The rules: r not an output,
 * r's readers b, its siblings and (ADD_ACT) nodes after b; no node run
 * between r and b reads r or writes over y or dy; what b writes (dx, the
 * siblings, dz) apart from what it reads (x, gamma, y, dy, beta) and from
 * each other, except dx exactly on y or dy (cuDNN reading each element
 * before writing it: assumed, checked by the GPU rows); y, dy, dx one
 * dtype. *out gets the fusion; returns its ops
 * (NONE: b runs with ops BN, reading its own dy).
 */
int loom_cuda_bn_bwd_match(const loom_plan *p, const int *step_of, loom_value b, loom_value f,
			   const loom_value *add_by, const unsigned char *makes,
			   loom_cuda_bn_bwd_fusion *out);

/* The saved slot of a batch-norm forward on cuDNN with c channels: its
 * mean and inverse std, then (reserve > 0) the Ex call's reserve from
 * offset loom_cuda_bn_reserve_off(c), aligned; the slot's bytes. */
size_t loom_cuda_bn_reserve_off(int64_t c);
size_t loom_cuda_bn_slot_bytes(int64_t c, size_t reserve);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_ENGINE_CUDA_BN_FUSE_H */
