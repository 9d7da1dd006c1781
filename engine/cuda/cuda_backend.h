/*
 * engine/cuda/cuda_backend.h — what the CUDA backend shows outside engine/:
 * a test hook. The backend itself is reached through loom_cuda_backend_get()
 * (engine/backend.h), NULL in a build without the toolkit.
 */
#ifndef LOOM_ENGINE_CUDA_BACKEND_H
#define LOOM_ENGINE_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Tests only: with on != 0, programs prepared afterwards fill their arena
 * with all-ones bytes (NaN in f32, f16 and bf16) instead of zeros, and every
 * run fills the values it is about to compute (and the workspace) the same
 * way, so an element no kernel writes shows up as NaN. Not thread-safe; no
 * effect in a build without CUDA.
 */
void loom_cuda_test_poison(int on);

/*
 * Tests only: with on != 0, programs compiled afterwards take every
 * fallback path, so that both paths can be checked against the CPU: batch
 * norm on the own kernels (bn.cu) rather than cuDNN's batch-norm calls;
 * matrix products without a cuBLASLt epilogue (bias, relu and bias
 * gradient by own kernels after the plain product); half convolutions in
 * f32 on copies (what runs when cuDNN has no half algorithm).
 */
void loom_cuda_test_own_kernels(int on);

/*
 * Tests only: of the nodes of the program whose CUDA backend context is
 * be_ctx, how many run batch norm through cuDNN (forward and backward
 * nodes), and how many matrix products make a bias gradient with the
 * BGRADB epilogue. Zeros for be_ctx NULL (the caller passes NULL for a
 * program of another backend).
 */
void loom_cuda_test_library_use(const void *be_ctx, int *bn_cudnn, int *bgrad_epilogue);

/*
 * Tests only: of the nodes of the program whose CUDA backend context is
 * be_ctx, how many half convolutions run in f32 (no half algorithm, or the
 * own-kernels hook), and how many linears leave their bias or relu to own
 * kernels after a plain product. Zeros for be_ctx NULL.
 */
void loom_cuda_test_fallbacks(const void *be_ctx, int *conv_f32, int *mm_unfused);
/* The GPT fusions' plan-level choices on plan (a const loom_plan *, of any
 * backend; fuse_plan.cu): see loom_cuda_plugin.test_gpt_fusions. */
void loom_cuda_test_gpt_fusions(const void *plan, int *ce_fused, int *gelu_aux, int *dgelu);

/*
 * Tests only: builds the tensor and operation descriptors of cuDNN's SDPA
 * forward (bwd 0) or backward (bwd 1) graph for qkv [b, t, 3 nh hs] in
 * bf16 (else f16) and finalizes each, which needs no device (the operation
 * graph and its plan do: they are not built here). 1 when all finalize,
 * else 0 with the first failure in why.
 */
int loom_cuda_test_sdpa_descriptors(int64_t b, int64_t t, int64_t nh, int64_t hs, int bf16,
				    int bwd, char *why, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_ENGINE_CUDA_BACKEND_H */
