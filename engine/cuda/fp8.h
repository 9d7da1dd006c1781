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
 * FP8 scaling's state on the device (loom_cuda_fp8_dev, the backend's
 * loom_backend_fp8 group): upload puts ts.fp8 there (allocating it the
 * first time; under current scaling the tensors alone, which the casts
 * record into for the report) and waits; download brings it
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

/*
 * The amax from the producer (LOOM_CUDA_FP8_AMAX_PRODUCER, fp8.cu): the
 * plan pass that pairs an FP8_QDQ with the layer norm or GELU kernel,
 * forward or backward, writing its source (loom_cuda_node_plan.fp8_amax
 * on both); a producer's
 * entry asks amax_begin for the slot its kernel fills (NULL: none; the
 * slot zeroed on the compute stream first), and --dump-graph's note on
 * the QDQ says so (0: nothing to say).
 */
loom_status loom_cuda_fp8_amax_plan(loom_cuda_ctx *c, const loom_plan *p);
loom_status loom_cuda_fp8_amax_begin(loom_cuda_ctx *c, loom_value v, unsigned **amax);
int loom_cuda_fp8_amax_note(const loom_cuda_ctx *c, const loom_plan *p, loom_value v, char *buf,
			    size_t len);

/*
 * The amax of a weight's cast from the optimizer (LOOM_CUDA_FP8_AMAX_OPTIM,
 * fp8.cu; loom_cuda_wamax in cuda_internal.h): wamax_plan (plan_create,
 * after amax_plan) gives each weight that FP8_QDQs read a cell (their
 * fp8_wamax), allocated with its flags cleared; wamax_tables (at alloc,
 * from the optimizer's table upload) records the weights' and masters'
 * arena ranges and gives each piece its cell; wamax_touch (every upload
 * and device copy) clears every flag when [dst, dst + bytes) meets one
 * of those ranges; wamax_free with the plan. The optimizer's kernels
 * (optim.cu) fill the cells; the cast reads one while its flag is set
 * (loom_cuda_fp8_amax's given/valid), else takes its own pass.
 */
loom_status loom_cuda_fp8_wamax_plan(loom_cuda_ctx *c, const loom_plan *p);
void loom_cuda_fp8_wamax_tables(loom_cuda_ctx *c, const loom_plan *p, loom_cuda_opt_slot *slots);
loom_status loom_cuda_fp8_wamax_touch(loom_cuda_ctx *c, const void *dst, size_t bytes);
void loom_cuda_fp8_wamax_free(loom_cuda_ctx *c);

/*
 * FP8 storage on CUDA (the fp8 storage pass, engine/compile_passes.c, with
 * planning->reads_fp8 yes under LOOM_CUDA_FP8_GEMM=1): the FP8 product
 * reads a stored QDQ's codes itself; any other reader of one (a product
 * cuBLASLt declined at plan time) has the codes decoded into its ws before
 * it runs. storage_plan (fuse_plan.cu, last) reserves that ws (fp8_dec,
 * fp8_dec_off on the reader); decode_sources does it (run_node).
 */
loom_status loom_cuda_fp8_storage_plan(loom_cuda_ctx *c, const loom_plan *p);
loom_status loom_cuda_fp8_decode_sources(loom_cuda_ctx *c, const loom_plan *p, loom_value v,
					 loom_cuda_io *io);

/* The FP8_QDQ node (fp8.cu). */
loom_status loom_cuda_op_fp8_qdq(loom_cuda_ctx *ctx, const loom_plan *plan, loom_value v,
				 const loom_cuda_io *io);

/* Launchers (fp8.cu). fmt: LOOM_FP8_E4M3 or LOOM_FP8_E5M2. */
/* slot[0] = max |x| over n elements, NaN-blind (zeroed first); ring not
 * NULL and ring[0] > 0 (delayed scaling with a history): nothing read;
 * valid not NULL and *valid (the optimizer's cell holds x's amax): slot[0]
 * = *given as x's dtype stores it, no pass. */
loom_status loom_cuda_fp8_amax(char *err, cudaStream_t s, const void *x, int xdt, int64_t n,
			       float *slot, const int *ring, const float *given, const int *valid);
/* Delayed scaling's cast: with t->scale once ring[0] > 0, else slot[0]'s
 * amax's scale; the scale used into slot[1], slot[2] (the products read
 * it there); record: the amax and the saturated count taken in the same
 * pass into t->amax (max) and t->saturated (sum), t->cur_scale set;
 * given: the amax recorded is slot[0]'s, the producer's; store: y takes
 * the codes and the scale (a stored value, graph/ops/ops.h's
 * loom_fp8_stored), not the rounded values. */
loom_status loom_cuda_fp8_qdq_delayed(char *err, cudaStream_t s, const void *x, int xdt, void *y,
				      int ydt, int64_t n, int fmt, float *slot, loom_fp8_tensor *t,
				      const int *ring, int record, int given, int store);
/* amp/fp8_scaling.h's loom_fp8_tensor_step_end for n tensors, the ring
 * ({filled, pos}) advanced, one block on s; amax, sat not NULL: each
 * tensor's amax and saturated count taken from them first (reduced over
 * the ranks). */
loom_status loom_cuda_fp8_step_end_launch(char *err, cudaStream_t s, loom_fp8_tensor *t,
					  float *hist, int *ring, int n, int len, int margin,
					  const float *amax, const double *sat);
/* y = fp8(x * scale) / scale with the scale from slot[0] (written to
 * slot[1], slot[2]); store: y the codes fp8(x * scale) and the scale
 * after them; fmt anything else: a copy (cast). t not NULL (current
 * scaling's training run): slot[0]'s amax (max), the scale and the
 * saturated count (sum) into the tensor's step in progress, in the
 * launch, with no wait; y is the same either way. */
loom_status loom_cuda_fp8_qdq(char *err, cudaStream_t s, const void *x, int xdt, void *y,
			      int ydt, int64_t n, int fmt, float *slot, int store,
			      loom_fp8_tensor *t);
/* A stored QDQ's n codes in format fmt (and the scale after them) into y
 * in ydt: the values the QDQ writes unstored. */
loom_status loom_cuda_fp8_decode(char *err, cudaStream_t s, const void *q, int64_t n, int fmt,
				 void *y, int ydt);
/* q = fp8(x * scale[0]), x [rows, cols] row-major; transpose: q is
 * [cols, rows] (Transformer Engine's cast_transpose). xdt an fp8 format:
 * x holds codes of that format already (a stored QDQ's), moved as they
 * are (scale unused). */
loom_status loom_cuda_fp8_cast(char *err, cudaStream_t s, const void *x, int xdt, int64_t rows,
			       int64_t cols, int transpose, int fmt, const float *scale,
			       unsigned char *q);

/* The FP8 product (matmul_fp8.cu), LOOM_CUDA_FP8_GEMM=1: a product whose
 * operands are FP8_QDQ outputs through cuBLASLt in FP8. plan: done says
 * whether it took node v (else the plain product plans it). reads: the
 * rule on the graph alone, whether product v's source i would be read as
 * fp8 codes (the backend's planning->reads_fp8 under the switch). */
int loom_cuda_mm_fp8_reads(const loom_graph *g, loom_value v, int i);
loom_status loom_cuda_mm_fp8_plan(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
				  loom_cuda_node_plan *np, int *done);
loom_status loom_cuda_mm_fp8_run(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
				 const loom_cuda_node_plan *np, void *const *src, void *out);
/* LOOM_CUDA_FP8_FAST_ACCUM read: 0 off (unset, or a word not its own),
 * 1 fwd (the forward's products), 2 all. */
int loom_cuda_fp8_fast_accum_mode(void);
/* --dump-graph: "cuBLASLt FP8 E4M3 x E5M2" (loom's A x B), ", fast
 * accumulation" where it is on, or nothing. */
int loom_cuda_mm_fp8_note(const loom_cuda_node_plan *np, char *buf, size_t len);

#endif /* LOOM_ENGINE_CUDA_FP8_H */
