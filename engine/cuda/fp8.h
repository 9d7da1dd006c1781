/*
 * engine/cuda/fp8.h — FP8 training on the CUDA backend (issue 42 item 5):
 * FP8_QDQ's kernels and the cast (+ transpose) kernels that feed cuBLASLt's
 * FP8 products (fp8.cu), the FP8 product's plan and run (matmul_fp8.cu).
 * CUDA C++ only, included by cuda_internal.h.
 */
#ifndef LOOM_ENGINE_CUDA_FP8_H
#define LOOM_ENGINE_CUDA_FP8_H

/*
 * Floats per node in loom_cuda_ctx.fp8_slots, indexed by node: [0] the
 * tensor's amax (its bits, for atomicMax), [1] the scale x is multiplied
 * by before the rounding, [2] 1 / scale (cuBLASLt's dequantisation
 * factor), [3] spare. Only FP8_QDQ nodes' slots are written.
 */
#define LOOM_CUDA_FP8_SLOT 4

/* plan_create: the capability check (sm_89 or later when the plan has an
 * FP8_QDQ node) and the slots; nothing when it has none. */
loom_status loom_cuda_fp8_plan(loom_cuda_ctx *c, const loom_plan *p);
void loom_cuda_fp8_free(loom_cuda_ctx *c);

/*
 * The scale source: the device address of FP8_QDQ node q's {scale,
 * 1/scale} pair, which q's own kernel writes in the same step: under
 * current scaling from the tensor's amax, under delayed scaling the
 * tensor's device scale (loom_cuda_fp8_dev) it cast with, so the products
 * that read it quantise with the very value the QDQ used.
 */
float *loom_cuda_fp8_scale(const loom_cuda_ctx *c, loom_value q);

/*
 * Delayed scaling's state on the device (loom_cuda_fp8_dev, the backend's
 * loom_backend_fp8 group): upload puts ts.fp8 there (allocating it the
 * first time; nothing under current scaling) and waits; download brings it
 * back into ts.fp8 and waits (the host view, never per step); reduce_begin
 * packs the step's amaxes (f32) and counts (f64) for the executor's
 * all-reduces over the ranks; step_end queues every tensor's update on the
 * compute stream (reduced: from those buffers). free at the context's end.
 */
loom_status loom_cuda_fp8_state_upload(void *ctx, const loom_fp8_state *fs);
loom_status loom_cuda_fp8_state_download(void *ctx, loom_fp8_state *fs);
loom_status loom_cuda_fp8_state_step_end(void *ctx, const loom_plan *plan, int reduced);
loom_status loom_cuda_fp8_state_reduce_begin(void *ctx, void **amax, void **saturated);
void loom_cuda_fp8_state_free(loom_cuda_ctx *c);

/* The FP8_QDQ node (fp8.cu). */
loom_status loom_cuda_op_fp8_qdq(loom_cuda_ctx *ctx, const loom_plan *plan, loom_value v,
				 const loom_cuda_io *io);

/* Launchers (fp8.cu). fmt: LOOM_FP8_E4M3 or LOOM_FP8_E5M2. */
/* slot[0] = max |x| over n elements, NaN-blind (zeroed first); ring not
 * NULL and ring[0] > 0 (delayed scaling with a history): nothing read. */
loom_status loom_cuda_fp8_amax(char *err, cudaStream_t s, const void *x, int xdt, int64_t n,
			       float *slot, const int *ring);
/* Delayed scaling's cast: with t->scale once ring[0] > 0, else slot[0]'s
 * amax's scale; the scale used into slot[1], slot[2] (the products read
 * it there); record: the amax and the saturated count taken in the same
 * pass into t->amax (max) and t->saturated (sum), t->cur_scale set. */
loom_status loom_cuda_fp8_qdq_delayed(char *err, cudaStream_t s, const void *x, int xdt, void *y,
				      int ydt, int64_t n, int fmt, float *slot, loom_fp8_tensor *t,
				      const int *ring, int record);
/* amp/fp8_scaling.h's loom_fp8_tensor_step_end for n tensors, the ring
 * ({filled, pos}) advanced, one block on s; amax, sat not NULL: each
 * tensor's amax and saturated count taken from them first (reduced over
 * the ranks). */
loom_status loom_cuda_fp8_step_end_launch(char *err, cudaStream_t s, loom_fp8_tensor *t,
					  float *hist, int *ring, int n, int len, int margin,
					  const float *amax, const double *sat);
/* y = fp8(x * scale) / scale with the scale from slot[0] (written to
 * slot[1], slot[2]); fmt anything else: a copy (cast). */
loom_status loom_cuda_fp8_qdq(char *err, cudaStream_t s, const void *x, int xdt, void *y,
			      int ydt, int64_t n, int fmt, float *slot);
/* q = fp8(x * scale[0]), x [rows, cols] row-major; transpose: q is
 * [cols, rows] (Transformer Engine's cast_transpose). */
loom_status loom_cuda_fp8_cast(char *err, cudaStream_t s, const void *x, int xdt, int64_t rows,
			       int64_t cols, int transpose, int fmt, const float *scale,
			       unsigned char *q);

/* The FP8 product (matmul_fp8.cu), LOOM_CUDA_FP8_GEMM=1: a product whose
 * operands are FP8_QDQ outputs through cuBLASLt in FP8. plan: done says
 * whether it took node v (else the plain product plans it). */
loom_status loom_cuda_mm_fp8_plan(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
				  loom_cuda_node_plan *np, int *done);
loom_status loom_cuda_mm_fp8_run(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
				 const loom_cuda_node_plan *np, void *const *src, void *out);
/* --dump-graph: "cuBLASLt FP8 E4M3 x E5M2" (loom's A x B), or nothing. */
int loom_cuda_mm_fp8_note(const loom_cuda_node_plan *np, char *buf, size_t len);

#endif /* LOOM_ENGINE_CUDA_FP8_H */
