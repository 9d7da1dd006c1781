/*
 * engine/cpu/matmul_dnnl.h — one matrix product as oneDNN's documented
 * matmul primitive (f32, or bf16 sources with f32 accumulation and result),
 * made once for its shape and run on loom's row-major buffers at every call.
 */
#ifndef LOOM_ENGINE_CPU_MATMUL_DNNL_H
#define LOOM_ENGINE_CPU_MATMUL_DNNL_H

#include <stddef.h>

typedef struct loom_cpu_dnnl_matmul loom_cpu_dnnl_matmul;

/*
 * C[m, n] = alpha op(A) op(B) (+ bias[n]) (+ C when accumulate), row-major
 * with leading dimensions lda, ldb, ldc (op transposes when ta / tb). bf16:
 * A and B are bf16 bit patterns, else f32; C and the bias are f32.
 * one_thread: the primitive is made for one thread (it will run inside a
 * parallel region, one product per thread); else for the process's threads.
 * NULL where oneDNN offers none (or the CPU path is the portable one).
 */
loom_cpu_dnnl_matmul *loom_cpu_dnnl_matmul_new(int ta, int tb, int m, int n, int k, int lda,
					       int ldb, int ldc, float alpha, int bf16, int bias,
					       int accumulate, int one_thread);
void loom_cpu_dnnl_matmul_free(loom_cpu_dnnl_matmul *mm);

/* Runs it on the calling thread's OpenMP threads (on that thread alone
 * inside a parallel region); several threads may run one primitive at once
 * (each run has its own memory objects and scratchpad). 0 on success, -1
 * if oneDNN failed. */
int loom_cpu_dnnl_matmul_run(const loom_cpu_dnnl_matmul *mm, const void *a, const void *b,
			     const float *bias, float *c);

/* oneDNN's name for the implementation it chose (e.g. "gemm:jit"). */
const char *loom_cpu_dnnl_matmul_impl(const loom_cpu_dnnl_matmul *mm);

#endif /* LOOM_ENGINE_CPU_MATMUL_DNNL_H */
