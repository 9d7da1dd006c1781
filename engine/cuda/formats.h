/*
 * engine/cuda/formats.h — which memory formats the CUDA backend's kernels
 * take, node by node (its node_formats), in plain C with no CUDA header, so
 * that a CPU test can ask the same rules without a GPU or the toolkit
 * (tests/engine/cuda:test_cuda_formats).
 */
#ifndef LOOM_ENGINE_CUDA_FORMATS_H
#define LOOM_ENGINE_CUDA_FORMATS_H

#include "engine/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* LOOM_CUDA_NHWC: which plans put their activations in NHWC. */
typedef enum loom_cuda_nhwc_mode {
	LOOM_CUDA_NHWC_OFF = 0, /* "0": every value NCHW, as before */
	LOOM_CUDA_NHWC_HALF,    /* unset, "1" or "half": mixed-precision plans and half nodes */
	LOOM_CUDA_NHWC_ALL,     /* "all": fp32 (TF32) plans too */
} loom_cuda_nhwc_mode;

/* The mode the environment asks for (read at each compile). */
loom_cuda_nhwc_mode loom_cuda_nhwc_mode_get(void);

/* LOOM_CUDA_BN_BF16_CUDNN (off unless "1"; read at each call): bf16 batch
 * norm with f32 parameters goes to cuDNN too. */
int loom_cuda_bn_bf16_cudnn_on(void);

/* Whether cuDNN's batch-norm calls run batch-norm node n (BATCHNORM2D or
 * BN_BWD_DATA) as its dtypes are: x and the data tensors f32 or f16 (bf16
 * under LOOM_CUDA_BN_BF16_CUDNN), the parameters f32 (bn_cudnn.cu's rule;
 * the own kernels, NCHW, run the rest). */
int loom_cuda_bn_cudnn_takes(const loom_plan *p, const loom_node *n);

/*
 * Node v's formats on CUDA, for the format pass (graph/formats.c). own_bn:
 * batch norm runs on the own kernels (the test hook, loom_cuda_test_own_kernels), which
 * are NCHW. In NHWC: convolutions (mixed: each operand in its format, the
 * kernel reorders what cuDNN's one layout needs into its workspace), batch
 * norm on cuDNN with its dgamma/dbeta siblings, relu, add, casts and the
 * unary ops where every 4-D operand has the result's shape, views that keep
 * the shape, max pooling, global average pooling (its x and dx; off with
 * LOOM_CUDA_POOL_NHWC=0). Everything else NCHW (convolutions with a bias,
 * the own batch-norm kernels), with reorders at the edges.
 */
void loom_cuda_formats_query(const loom_plan *p, loom_value v, loom_format_caps *caps,
			     loom_cuda_nhwc_mode mode, int own_bn);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_ENGINE_CUDA_FORMATS_H */
