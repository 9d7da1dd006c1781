/*
 * engine/cuda/cuda_backend.h — what the CUDA backend shows outside engine/:
 * a test hook. The backend itself is reached through loom_cuda_backend_get()
 * (engine/program_internal.h), NULL in a build without the toolkit.
 */
#ifndef LOOM_ENGINE_CUDA_BACKEND_H
#define LOOM_ENGINE_CUDA_BACKEND_H

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

#ifdef __cplusplus
}
#endif

#endif /* LOOM_ENGINE_CUDA_BACKEND_H */
