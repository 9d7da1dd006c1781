/*
 * loom.h — the public API of loom, a mixed-precision training engine.
 *
 * A model is described once as a static graph (loom_graph), compiled into a
 * fixed plan (loom_program: autodiff, AMP casts, memory arena, optimizer) and
 * then run step after step on the CPU or CUDA backend. This header is the
 * contract: each function says what it promises.
 *
 * Errors: everything that can fail returns a loom_status, and the message
 * goes to one place: the error object of the handle the call was made on
 * (loom_graph_error, loom_program_error, loom_pg_error, loom_loader_error,
 * loom_sampler_error, loom_prefetch_error: the message of its last
 * failure), or for a call without a handle (loom_compile refusing its
 * arguments, a data set's load, a constructor) the thread's, loom_last_error.
 * Graph-building calls return LOOM_NONE on bad input and leave a sticky
 * error on the graph; loom_compile refuses a graph in error and reports its
 * first message. The library never aborts or exits on a user's mistake.
 *
 * Returned strings belong to loom; never free them. loom_status_string and
 * loom_dtype_name return constants. loom_graph_error lives as long as the
 * graph; loom_last_error until the next call without a handle in the same
 * thread (loom_compile and the data constructors and loads clear it as they
 * start);
 * loom_program_error until the next call on that program; the strings of
 * loom_program_info (backend, amp_report) until loom_program_free.
 *
 * The library prints (a notice, a verbose compile summary, the launcher's
 * messages) only through the log callback set with loom_set_log; by
 * default, to stderr.
 */
#ifndef LOOM_H
#define LOOM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- status */

typedef enum loom_status {
	LOOM_OK = 0,
	LOOM_ERR_INVALID,     /* a bad argument: null, out of range, bad flag */
	LOOM_ERR_SHAPE,       /* shapes that do not fit together */
	LOOM_ERR_DTYPE,       /* a dtype the op does not take */
	LOOM_ERR_NOT_FOUND,   /* an unknown name, a missing file */
	LOOM_ERR_IO,          /* a read or write that failed */
	LOOM_ERR_FORMAT,      /* a malformed file */
	LOOM_ERR_CORRUPT,     /* a checksum that does not match */
	LOOM_ERR_MISMATCH,    /* a checkpoint or peer that does not fit this program */
	LOOM_ERR_NOMEM,       /* an allocation that failed */
	LOOM_ERR_UNSUPPORTED, /* valid, but not implemented on this backend */
	LOOM_ERR_STATE,       /* a call out of order (graph in error, ...) */
	LOOM_ERR_BACKEND,     /* a CUDA, cuBLASLt, cuDNN, NCCL or MPI failure */
	LOOM_STATUS_COUNT
} loom_status;

/* A constant English name for a status ("shape mismatch"). */
const char *loom_status_string(loom_status s);

/* ---------------------------------------------------------------- dtypes */

typedef enum loom_dtype {
	LOOM_F32 = 0,
	LOOM_F64,
	LOOM_F16,  /* IEEE binary16 storage, fp32 arithmetic */
	LOOM_BF16, /* bfloat16 storage, fp32 arithmetic */
	LOOM_I32,  /* class labels */
	/* FP8 storage (base/fp8.h), 1 byte; no graph op takes them yet, and a
	 * leaf of either is refused (LOOM_ERR_DTYPE) */
	LOOM_FP8_E4M3, /* e4m3fn: bias 7, max 448, no inf, NaN 0x7f/0xff */
	LOOM_FP8_E5M2, /* bias 15, max 57344, inf and NaN */
	LOOM_DTYPE_COUNT
} loom_dtype;

const char *loom_dtype_name(loom_dtype dt); /* "f32", ... */
size_t loom_dtype_size(loom_dtype dt);      /* bytes per element, 0 if unknown */

#define LOOM_MAX_DIMS 6

typedef struct loom_shape {
	int ndim;
	int64_t dims[LOOM_MAX_DIMS];
} loom_shape;

int64_t loom_shape_numel(const loom_shape *s);

/* ---------------------------------------------------------------- graph */

typedef struct loom_graph loom_graph;

/* A value in a graph: an index, LOOM_NONE when building failed. */
typedef int32_t loom_value;
#define LOOM_NONE ((loom_value)-1)

/* Creates an empty graph. *out is set even on LOOM_ERR_NOMEM (to NULL). */
loom_status loom_graph_new(loom_graph **out);
void loom_graph_free(loom_graph *g);

/* The sticky error: LOOM_OK and "" while the graph is sound. */
loom_status loom_graph_status(const loom_graph *g);
const char *loom_graph_error(const loom_graph *g);

/* Seed for parameter initialisers (default 0). */
void loom_graph_set_seed(loom_graph *g, uint64_t seed);

/* Gives a value a name, used in messages, dumps and checkpoints. Returns v. */
loom_value loom_set_name(loom_graph *g, loom_value v, const char *name);

/* The dtype and shape of value v. A value that is not one of g's (LOOM_NONE
 * from a failed call, another graph's, or g NULL) has dtype
 * LOOM_DTYPE_COUNT, which is no dtype, and shape { .ndim = 0 }, which is
 * also a scalar's: check loom_graph_status, or v, before trusting a shape.
 * Neither call sets the graph's error. */
loom_dtype loom_value_dtype(const loom_graph *g, loom_value v);
loom_shape loom_value_shape(const loom_graph *g, loom_value v);

/* Writes one line per node: index, op, name, dtype, shape, sources. */
void loom_graph_dump(const loom_graph *g, FILE *out);

/* Leaves. Names must be unique among inputs, parameters and buffers. */
typedef enum loom_init {
	LOOM_INIT_ZEROS = 0,
	LOOM_INIT_ONES,
	LOOM_INIT_KAIMING_UNIFORM, /* PyTorch conv/linear weight: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) */
	LOOM_INIT_UNIFORM_FAN_IN,  /* PyTorch conv/linear bias: same bound */
	LOOM_INIT_COUNT
} loom_init;

/* A tensor fed each step with loom_set_input (images, labels). */
loom_value loom_input(loom_graph *g, const char *name, loom_dtype dt, int ndim,
		      const int64_t *dims);
/* A trainable tensor; fan_in is used by the uniform initialisers. */
loom_value loom_param(loom_graph *g, const char *name, loom_dtype dt, int ndim,
		      const int64_t *dims, loom_init init, int64_t fan_in);
/* Non-trainable state kept across steps (batch-norm running statistics). */
loom_value loom_buffer(loom_graph *g, const char *name, loom_dtype dt, int ndim,
		       const int64_t *dims, loom_init init);

/* Ops. Layout is NCHW; conv weights are [out, in, kh, kw]. b may be LOOM_NONE. */
loom_value loom_conv2d(loom_graph *g, loom_value x, loom_value w, loom_value b,
		       int stride, int pad);
/* Training mode: batch statistics, running stats updated with momentum
 * (unbiased variance, as PyTorch). Eval mode: running statistics. */
loom_value loom_batchnorm2d(loom_graph *g, loom_value x, loom_value gamma,
			    loom_value beta, loom_value running_mean,
			    loom_value running_var, double momentum, double eps);
loom_value loom_relu(loom_graph *g, loom_value x);
/* x * Phi(x) with Phi the normal CDF (torch.nn.GELU(), the exact erf form). */
loom_value loom_gelu(loom_graph *g, loom_value x);
/* GELU's tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 * (torch.nn.GELU(approximate='tanh'): GPT-2's and llm.c's). */
loom_value loom_gelu_tanh(loom_graph *g, loom_value x);
/* x * sigmoid(x) (torch.nn.SiLU()). */
loom_value loom_silu(loom_graph *g, loom_value x);
loom_value loom_maxpool2d(loom_graph *g, loom_value x, int kernel, int stride,
			  int pad);
/* [N, C, H, W] -> [N, C]: the mean of each channel plane (ResNet's head). */
loom_value loom_global_avgpool(loom_graph *g, loom_value x);
/* y = x w^T + b, x [N, in] or [..., in] (any leading dims, e.g. a GPT's
 * [B, T, C]: y is then [..., out]), w [out, in], b [out] or LOOM_NONE. */
loom_value loom_linear(loom_graph *g, loom_value x, loom_value w, loom_value b);
/* [M, K] x [K, N] -> [M, N] */
loom_value loom_matmul(loom_graph *g, loom_value a, loom_value b);
/* Elementwise, same shape and dtype. */
loom_value loom_add(loom_graph *g, loom_value a, loom_value b);
/* One dim may be -1; element counts must agree. */
loom_value loom_reshape(loom_graph *g, loom_value x, int ndim, const int64_t *dims);
/* [N, ...] -> [N, rest] */
loom_value loom_flatten(loom_graph *g, loom_value x);
/* Reductions of every element to a scalar ([] shape). */
loom_value loom_sum(loom_graph *g, loom_value x);
loom_value loom_mean(loom_graph *g, loom_value x);
/* Mean over the batch of -log softmax(logits)[label]; logits [N, C], labels
 * [N] of LOOM_I32 in [0, C). A label out of range makes the step fail. */
loom_value loom_softmax_cross_entropy(loom_graph *g, loom_value logits,
				      loom_value labels);

/* Transformer ops (a GPT-2 block: examples/gpt_ddp.c). */
/* Rows of table [V, C] gathered by ids (LOOM_I32, any shape): [..., C]
 * (torch.nn.Embedding). An id outside [0, V) makes the step fail on the
 * CPU; the CUDA backend writes zeros for it. A table used by two ops (tied
 * embedding and output projection) gets the sum of both gradients. */
loom_value loom_embedding(loom_graph *g, loom_value ids, loom_value table);
/* Layer norm over the last dim of x [..., C] (torch.nn.LayerNorm(C)):
 * gamma and beta [C], biased variance, statistics in fp32 (f64 for f64
 * graphs) at every opt level. */
loom_value loom_layernorm(loom_graph *g, loom_value x, loom_value gamma,
			  loom_value beta, double eps);
/* RMS norm over the last dim of x [..., C] (torch.nn.RMSNorm(C)):
 * y = x / sqrt(mean(x^2) + eps) * gamma, gamma [C], no bias; statistics in
 * fp32 (f64 for f64 graphs) at every opt level. CPU only for now (a CUDA
 * program refuses it when compiled). */
loom_value loom_rms_norm(loom_graph *g, loom_value x, loom_value gamma, double eps);
/* Causal multi-head self-attention over a fused qkv [B, T, 3C] (q, k, v
 * side by side, each C = n_head * hs wide, head h at columns h*hs):
 * y [B, T, C] = softmax(q k^T / sqrt(hs), masked to j <= i) v per head,
 * no dropout (GPT-2's attention before c_proj). Built as the two nodes
 * below; the probabilities [B, n_head, T, T] are kept for backward as
 * llm.c keeps them. */
loom_value loom_causal_self_attention(loom_graph *g, loom_value qkv, int n_head);
/* Its two halves: P = the masked softmax [B, n_head, T, T] of qkv, and
 * y = P v with v from qkv (P any [B, n_head, T, T] value). */
loom_value loom_attention_probs(loom_graph *g, loom_value qkv, int n_head);
loom_value loom_attention_apply(loom_graph *g, loom_value probs, loom_value qkv,
				int n_head);

/* Layers: create named parameters with PyTorch's default initialisers
 * ("name.weight", "name.bias", "name.running_mean", ...) and the op. */
loom_value loom_layer_conv2d(loom_graph *g, const char *name, loom_value x,
			     int out_channels, int kernel, int stride, int pad,
			     int bias);
loom_value loom_layer_batchnorm2d(loom_graph *g, const char *name, loom_value x);
loom_value loom_layer_linear(loom_graph *g, const char *name, loom_value x,
			     int out_features, int bias);
/* "name.weight" (ones) and "name.bias" (zeros) over x's last dim, eps 1e-5. */
loom_value loom_layer_layernorm(loom_graph *g, const char *name, loom_value x);

/* Keeps v readable after a step (loss is always kept). */
loom_status loom_mark_output(loom_graph *g, loom_value v);

/*
 * Pipeline parallelism: v is the last value of its stage; the next stage
 * starts after it (in the order the graph was built). With
 * loom_compile_opts.pipeline_stages = S, either no value is marked (the
 * compiler cuts as loom_compile_opts.pipeline_balance says) or exactly
 * S - 1 are.
 */
loom_status loom_stage_boundary(loom_graph *g, loom_value v);

/* ---------------------------------------------------------------- compile */

typedef enum loom_device {
	LOOM_DEVICE_AUTO = 0, /* CUDA when a device exists, else CPU (one notice) */
	LOOM_DEVICE_CPU,
	LOOM_DEVICE_CUDA,
	LOOM_DEVICE_COUNT
} loom_device;

typedef enum loom_optim_kind {
	LOOM_OPTIM_NONE = 0, /* gradients only (gradient checks) */
	LOOM_OPTIM_SGD,      /* torch.optim.SGD semantics */
	LOOM_OPTIM_ADAMW,    /* torch.optim.AdamW semantics */
	LOOM_OPTIM_COUNT
} loom_optim_kind;

typedef struct loom_optim_opts {
	loom_optim_kind kind;
	double lr;
	double momentum;  /* SGD */
	double dampening; /* SGD */
	int nesterov;     /* SGD */
	double weight_decay;
	double beta1, beta2, eps; /* AdamW */
	/* Gradient clipping by global norm before every update, as
	 * torch.nn.utils.clip_grad_norm_(params, clip_grad): the L2 norm of
	 * all gradients together (unscaled, averaged over the ranks and
	 * micro-steps, i.e. the gradient the optimizer applies) and, when it
	 * exceeds clip_grad, every gradient times clip_grad / (norm + 1e-6).
	 * Every rank computes the same norm (ZeRO: the shards' sums of
	 * squares added over the ranks in rank order). A step skipped for an
	 * inf/NaN (loss scaling) is skipped before the norm is taken. 0: off
	 * (the default). loom_program_info.grad_norm reports the last norm.
	 * CPU and CUDA backends (loom_compile refuses it on one without
	 * LOOM_BE_CLIPS_GRAD, and with pipeline stages). */
	double clip_grad;
	/* Weight decay only on matrices: parameters of 2 or more dims that no
	 * embedding reads as its table (not embeddings, even one tied to an
	 * output projection, nor biases or norms), as the GPT issue asks;
	 * 0 (the default): on all. CPU and CUDA backends. */
	int decay_matrices_only;
} loom_optim_opts;

typedef enum loom_opt_level {
	LOOM_O0 = 0, /* fp32 everywhere */
	LOOM_O1,     /* allow list in half, deny list in fp32, dynamic scaling */
	LOOM_O2,     /* half model, fp32 batch norm and master weights */
	LOOM_O3,     /* pure half, no master weights, no scaling */
	LOOM_OPT_LEVEL_COUNT
} loom_opt_level;

typedef struct loom_amp_opts {
	loom_opt_level level;
	loom_dtype half;          /* LOOM_F16 or LOOM_BF16 */
	double init_scale;        /* dynamic scaling start, default 65536 */
	int growth_interval;      /* clean steps before doubling, default 2000 */
	double static_scale;      /* > 0: fixed scale instead of dynamic */
	int keep_batchnorm_fp32;  /* -1: the level's default, 0 or 1 override */
	/* O1 only: batch norm runs in its input's dtype (half after a half
	 * convolution) with its parameters and statistics fp32, as
	 * torch.autocast runs batch_norm (on none of its lists) and cuDNN
	 * takes it: no casts around it, and what reads it (relu, add) stays
	 * half. 0 (the default): apex's O1, batch norm in fp32 with casts on
	 * both sides. Refused at other levels (O2 and O3 have
	 * keep_batchnorm_fp32). */
	int bn_half;
	/* FP8 training (the "hybrid" recipe), with half = LOOM_BF16, at O1 and
	 * O2 (bf16 at O3): every product (linear, matmul, conv2d) takes E4M3
	 * inputs and an E5M2 output gradient, per-tensor power-of-two scales
	 * (fp8_scaling below), fp32 accumulation,
	 * bf16 results; but the first and last products (one reading a model
	 * input, and the classifier, the one the loss reads), unless
	 * fp8_all_products. Emulated exactly on the CPU (the FP8_QDQ op), and
	 * on CUDA at compute capability 8.9 or later (refused below). 0: off. */
	int fp8;
	int fp8_all_products;
	/* fp8's scaling recipe (loom_fp8_scaling): LOOM_FP8_SCALING_DEFAULT
	 * (0) is delayed scaling, measured faster on the CPU with the same
	 * loss gaps (bench/RESULTS.md). Delayed scaling
	 * keeps, per scaled tensor, the amaxes of the last fp8_history steps
	 * (0: 16) and casts with 2^(floor(log2(fmax / max of them)) -
	 * fp8_margin), updated at each training step's end; a step with an
	 * empty history (the first) casts by current scaling. Scales and
	 * histories are checkpointed and the same on every rank (amaxes
	 * max-reduced across data-parallel ranks); ranks must agree on all
	 * three. On CUDA the default is current scaling; either recipe keeps
	 * its per-tensor state on the device (reduced across ranks on NCCL),
	 * under current scaling for loom_amp_report alone. */
	int fp8_scaling;
	int fp8_history;
	int fp8_margin;
} loom_amp_opts;

/* amp.fp8_scaling */
typedef enum loom_fp8_scaling {
	LOOM_FP8_SCALING_DEFAULT = 0,
	LOOM_FP8_SCALING_CURRENT, /* each cast from its tensor's own amax (an extra pass) */
	LOOM_FP8_SCALING_DELAYED, /* from an amax history of past steps */
	LOOM_FP8_SCALING_COUNT
} loom_fp8_scaling;

/* A process group (comm/comm.h: loom_pg_init); opaque here. */
struct loom_pg;

typedef struct loom_compile_opts {
	loom_device device;
	loom_optim_opts optim;
	loom_amp_opts amp;
	int verbose;   /* print the plan summary at compile time */
	int no_fusion; /* skip the planner's fusion passes (debugging: the
			* unfused plan computes the same values, slower) */
	/* fp32 convolutions and matrix products on a GPU use TF32 tensor
	 * cores by default (10-bit mantissa inputs, fp32 accumulation), as
	 * PyTorch does for cuDNN convolutions; no_tf32 = 1 keeps them exact
	 * fp32 (the CPU-parity tests; `--tf32 off`). Half products are not
	 * affected; the CPU backend has no TF32 and ignores it. Ranks must
	 * agree (the start-up check). */
	int no_tf32;
	/* The training step as one CUDA graph, default 1 (on where it can
	 * be; loom_compile_opts_default): on a backend that records graphs,
	 * the first LOOM_RUN_TRAIN runs eagerly, the second is captured and
	 * every later one is replayed with one launch; inputs set before a
	 * run, the learning rate (loom_set_lr), the loss scaler and the step
	 * reach the replayed step. Refused, with one line through the log at
	 * the first run, where the step cannot be one graph (pipeline stages,
	 * a trace, collectives that end on the host (MPI), a communicator
	 * without device progress marks, ZeRO with clipping whose norm
	 * crosses the host). Over several ranks on NCCL the collectives are
	 * captured with the step and the watchdog follows each replay
	 * through marks the device writes (compiled, not yet run on GPUs;
	 * LOOM_CUDA_GRAPH_RANKS=0 keeps steps with collectives eager);
	 * diagnosis runs, accumulation runs and other modes run
	 * eagerly. 0 (`--no-cuda-graph`, or LOOM_CUDA_GRAPH=0 in the
	 * environment): every step eager. The CPU backend ignores it. */
	int cuda_graph;
	/* Run-to-run repeatable results on a GPU, default 0: cuDNN's
	 * convolution algorithms come only from its deterministic ones (no
	 * atomically accumulated filter or data gradients), whether picked
	 * by its heuristic or by the search, so that two programs of one
	 * plan, or a captured and an eager step, give the same bits; the
	 * cost is whatever the faster non-deterministic algorithms would
	 * have saved (as torch.backends.cudnn.deterministic).
	 * `--deterministic`, or LOOM_DETERMINISTIC=1 in the environment. The
	 * CPU backend is deterministic already and ignores it. */
	int deterministic;
	/* Data-parallel training: the group this program is one rank of.
	 * NULL, or a group of world 1: one process, nothing changes. With
	 * world > 1, loom_compile is collective (every rank calls it with the
	 * same graph and options): rank 0's parameters and buffers are
	 * broadcast, the compiled plans are compared (a difference is an error
	 * on every rank naming it), and each step sums the gradients over the
	 * ranks in buckets while backward runs; the optimizer averages them.
	 * Buffers (batch-norm running statistics) are each rank's own while it
	 * trains; the first LOOM_RUN_EVAL after training broadcasts rank 0's
	 * first, as DDP's broadcast_buffers does, so that every rank evaluates
	 * the model rank 0 saves (every rank must make that run).
	 * The group must outlive the program. */
	struct loom_pg *pg;
	double bucket_cap_mb;    /* gradient bucket size (DDP's bucket_cap_mb), default 25 */
	double first_bucket_mb;  /* the first bucket's, small so that the first
				  * all-reduce starts early; default 1 */
	/* Synchronised batch norm (torch.nn.SyncBatchNorm), default 0. With a
	 * group of world > 1, every batch norm in training mode (TRAIN, GRAD
	 * and FORWARD runs) normalises with the mean and variance of the
	 * global batch: forward sums each channel's count, sum and sum of
	 * squares over the ranks, and backward also the sums of dy and
	 * dy * xhat, so the input gradient is exact for the global batch.
	 * The running statistics take the global mean and the global
	 * unbiased variance. EVAL runs use the running statistics and
	 * communicate nothing. Each training-mode batch norm then is a
	 * blocking all-reduce (f64, 2C+1 or 4C+1 values) that every rank
	 * must reach: all ranks run the same modes in the same order. Ranks
	 * must agree (the start-up check names a batch norm that differs).
	 * CUDA: split kernels and an NCCL all-reduce in the compute stream's
	 * order, no host wait (compiled, never yet run on a GPU); a group
	 * without a device communicator is refused at compile.
	 * World 1: nothing changes. */
	int sync_bn;
	/* ZeRO stage (DeepSpeed's), 0, 1 or 2, default 0. With a group of world
	 * > 1, stage 1 shards the optimizer: each gradient bucket is
	 * reduce-scattered instead of all-reduced, each rank keeps optimizer
	 * state (SGD momentum, AdamW moments) and, under O2, the fp32 master
	 * weights for its shard only and updates only its shard, and the
	 * updated parameters are all-gathered at the end of the step. The loss-scale overflow verdict is reduced over the
	 * shards, so every rank skips the same steps. Parameters end each step
	 * as plain data parallelism leaves them. loom_save and
	 * loom_export_safetensors are then collective (every rank calls them;
	 * rank 0 writes the same file as without ZeRO), and a checkpoint resumes with or without ZeRO at any world
	 * size. CUDA: the fused optimizer updates the shard's pieces and NCCL
	 * reduce-scatters and all-gathers (compiled, never yet run on a GPU).
	 * World 1: nothing changes.
	 * Stage 2 also shards the gradients: each bucket is whole only from
	 * its first gradient to the end of its reduce-scatter (one in flight
	 * at a time), then this rank keeps its shard and later buckets reuse
	 * the rest of its bytes (the bucket region, planned per rank before
	 * step 1, holds the shards and the buckets in flight); the updated
	 * parameters are gathered one bucket at a time. Same update, same
	 * bits as plain data parallelism; checkpoints as stage 1. Stage 3
	 * also shards the parameters: a rank stores its shard of every
	 * bucket of parameters (the f32 shard, under O2 also the half one),
	 * and each bucket's parameters are all-gathered just before their
	 * first forward reader and again before their first backward reader,
	 * into buffers the memory plan places as activations (freed after
	 * their last reader, so the peak is known before step 1); the
	 * gradients are stage 2's. Buckets are the gathering unit: a smaller
	 * bucket_cap_mb gathers less at a time. The same bits as plain data
	 * parallelism; loom_read, loom_write_f64, checkpoints and safetensors
	 * of a parameter gather or scatter its shards (collective). O3 (half
	 * parameters without masters) is refused under stage 3. */
	int zero_stage;
	/* ZeRO-3: how many gathers ahead of its first reader each bucket's
	 * all-gather is issued, so that it overlaps the layers before (0: the
	 * default, 1; -1: none, each gathered right before its use). A
	 * deeper prefetch holds more gathered buckets at once (planned). */
	int zero_prefetch;
	/* A forward-only plan (default 0), for inference: no autodiff, no
	 * gradients, no optimizer state (optim is ignored), so its own,
	 * smaller memory plan; batch norm uses its running statistics. Only
	 * LOOM_RUN_EVAL runs (others answer LOOM_ERR_STATE); its outputs equal
	 * a training program's EVAL outputs on the same weights bit for bit.
	 * The loss is still a scalar value of g (the forward computes it; a
	 * classifier's cross-entropy gives the test loss). The AMP level
	 * applies as in training (O2/O3: half weights), without O2's fp32
	 * masters (no optimizer owns them; loom_import_safetensors rounds
	 * the file's values into the half weights). Not with a process
	 * group of world > 1. loom_load takes only checkpoints of the same
	 * kind: move weights between the two with safetensors (loom_io.h). */
	int inference;
	/* Pipeline parallelism (model parallel), default 0 (off). With a
	 * group of world W, pipeline_stages = S > 1 cuts the graph into S
	 * stages (see pipeline_balance, or at loom_stage_boundary marks), rank r
	 * runs stage r % S; the W / S ranks of a stage are its data-parallel
	 * replicas. Each batch is micro_batches (M, default S) micro-batches:
	 * the graph is built at the micro-batch size, loom_set_input takes M
	 * micro-batches at once (M times the input's elements, in order),
	 * and a TRAIN run forwards and backwards each of them through the
	 * stages (activations sent forward, their gradients backward),
	 * accumulates the gradients and updates once: the update of one
	 * process running LOOM_RUN_ACCUMULATE over the same micro-batches.
	 * loom_loss is the mean over the micro-batches, on every rank.
	 * loom_read / loom_read_f64 are then collective (every rank calls
	 * them): a parameter or buffer comes from the stage that updates it,
	 * a marked output of every micro-batch (M times its elements) from
	 * the stage that makes it. loom_save is collective too (rank 0
	 * writes the one file of a plain run). The
	 * overflow verdict under loss scaling is every stage's. schedule:
	 * LOOM_SCHEDULE_1F1B (default) or LOOM_SCHEDULE_GPIPE. Batch norm
	 * normalises each micro-batch with its own statistics. CPU only for
	 * now; see parallel/README.md for what is not done. */
	int pipeline_stages;
	int micro_batches;
	int schedule;
	/* How the compiler cuts the stages when no value is marked with
	 * loom_stage_boundary (marks win over either): LOOM_BALANCE_TIME
	 * (default) balances their estimated time; LOOM_BALANCE_MEMORY picks
	 * the cut whose largest stage plans the smallest peak (parameters,
	 * gradients, masters, optimizer state, accumulation sums, and the
	 * activations of the micro-batches the schedule keeps in flight on
	 * that stage), evaluated with each stage's own memory plan. With
	 * memory_limit_mb set, a time-balanced cut that leaves some stage over
	 * the limit is replaced by the memory-balanced cut before the compile
	 * is refused (one line says so); a refusal names the stage and the
	 * largest planned peak of each cut tried. */
	int pipeline_balance;
	/* Print each rank's planned peak memory (parameters, gradients,
	 * optimizer state, activations for the micro-batches in flight) at
	 * compile time. */
	int memory_report;
	/* A per-rank memory budget in MiB, default 0 (none): a plan whose
	 * planned peak (the arena, plus a pipeline's accumulation sums) is
	 * larger is refused at compile with LOOM_ERR_NOMEM, the message giving
	 * the planned peak, before anything is allocated. Under pipeline
	 * stages every rank checks every stage's plan (so all refuse alike)
	 * and may change the cut first: see pipeline_balance; without, a plan
	 * with a backward is first compiled again with its activations made
	 * again (recompute 3; see recompute). */
	double memory_limit_mb;
	/* How the CPU backend picks each convolution's and matrix product's
	 * kernel. LOOM_KERNEL_SEARCH_ON: it times the candidates
	 * (loom's im2col + GEMM, oneDNN's convolution on NCHW or in its blocked
	 * layouts; loom's split sgemm or oneDNN's matmul) on the node's shape
	 * when the plan is made and keeps the fastest, remembered per shape and
	 * thread count for the process; --dump-graph names each choice and its
	 * times. LOOM_KERNEL_SEARCH_OFF (default, until the search is measured
	 * no slower on a quiet machine: bench/RESULTS.md): a fixed default per
	 * shape, the kernels measured best before, bit for bit repeatable (the
	 * environment variable LOOM_KERNEL_SEARCH=off or =on decides instead,
	 * for every compile of the process;
	 * LOOM_CPU_CONV=im2col|dnnl_nchw|dnnl_blocked and
	 * LOOM_CPU_PRODUCT=sgemm|matmul force one kernel). kernel_search_ms:
	 * the most time one compile spends measuring, default 0 (5000 ms);
	 * nodes left when it is spent take the fixed default. On the CUDA
	 * backend the same switch and budget (default 10000 ms there) drive
	 * cuDNN's measured choice of each convolution's algorithm
	 * (cudnnFind*AlgorithmEx; off: the heuristic's first choice). */
	int kernel_search;
	double kernel_search_ms;
	/* Memory formats of the activations (loom_formats_mode).
	 * LOOM_FORMATS_AUTO (default): the planner gives each 4-D activation
	 * the format its kernels take (on the CPU, oneDNN's blocked nChw8c
	 * through runs of blocked convolutions, batch norm, relu, add and max
	 * pooling), with a reorder node only where a producer and a consumer
	 * disagree; inputs, outputs, parameters and their gradients stay NCHW
	 * (--dump-graph shows each value's format). LOOM_FORMATS_NCHW: every
	 * value NCHW (each oneDNN convolution reorders inside). The environment
	 * variable LOOM_FORMATS=nchw or =auto decides instead. */
	int formats;
	/* A classifier over a padded vocabulary (llm.c's 50257 -> 50304): N > 0
	 * lays out a tied classifier's table, its half copies, gradients and
	 * optimizer state with its row count rounded up to a multiple of N
	 * (the extra rows zero, and kept zero), and the logits and dlogits with
	 * as many columns, softmax-CE counting the real classes only, so that
	 * the classifier's products run at aligned shapes. Everything a user
	 * sees keeps the real vocabulary: loom_read/loom_write, checkpoints
	 * (a padded program's loads into an unpadded one and back), safetensors.
	 * -1 (default): the backend's multiple, the row alignment its
	 * products want: 128 on CUDA (GPT-2's 50257 -> 50304, as llm.c; not
	 * yet measured on a GPU), none on the CPU (its products gain nothing);
	 * only where it adds at most an eighth of the classes (not a
	 * 10-class head). 0: no padding. The environment variable LOOM_VOCAB_PAD=N decides
	 * instead (0: off). A graph with no such classifier, or an aligned
	 * vocabulary, is left as it is. */
	int vocab_pad;
	/* Activation recomputation (llm.c's -r, Megatron's selective
	 * recompute), for less memory at the cost of a little compute: a
	 * forward value the backward reads is made again just before its
	 * first backward reader, and the plan no longer holds it through the
	 * step's middle. 0 (default): none; 1: the activation functions
	 * (GELU, SiLU; not relu, which a CNN fuses into the op before it);
	 * 2: those and the norms (layer norm, RMS norm); 3: those and the
	 * attention probabilities ([B, NH, T, T]; not on a backend that runs
	 * attention as one fused kernel, which keeps none), each
	 * with the casts and views that carry them to the backward. Only
	 * where no source is kept longer for it (each is a parameter or kept
	 * by the plan anyway), so the live bytes never grow (and the
	 * planner's offline placement finds the copies their holes);
	 * --memory-report says before step 1. The same kernels on the same
	 * inputs: a step's results are the same bits. Not with pipeline
	 * stages yet (a line through the log; nothing made again). The
	 * environment variable LOOM_RECOMPUTE=N decides instead. A plan over
	 * memory_limit_mb is compiled again at level 3 (a line through the
	 * log) before it is refused (not under LOOM_RECOMPUTE or stages).
	 * loom_program_info.n_recomputed says how many values it made again. */
	int recompute;
} loom_compile_opts;

/* loom_compile_opts.formats. */
typedef enum loom_formats_mode {
	LOOM_FORMATS_AUTO = 0,
	LOOM_FORMATS_NCHW,
	LOOM_FORMATS_COUNT
} loom_formats_mode;

/* loom_compile_opts.kernel_search. */
typedef enum loom_kernel_search {
	LOOM_KERNEL_SEARCH_OFF = 0,
	LOOM_KERNEL_SEARCH_ON,
	LOOM_KERNEL_SEARCH_COUNT
} loom_kernel_search;

/* Pipeline schedules (loom_compile_opts.schedule). */
typedef enum loom_schedule {
	LOOM_SCHEDULE_1F1B = 0, /* warm-up forwards, then one forward one backward */
	LOOM_SCHEDULE_GPIPE,    /* every forward, then every backward */
	LOOM_SCHEDULE_COUNT
} loom_schedule;

/* How pipeline stages are cut (loom_compile_opts.pipeline_balance). */
typedef enum loom_pipeline_balance {
	LOOM_BALANCE_TIME = 0, /* equal estimated time per stage */
	LOOM_BALANCE_MEMORY,   /* the smallest largest planned peak per stage */
	LOOM_BALANCE_COUNT
} loom_pipeline_balance;

/* Fills o with defaults: AUTO device, SGD lr 0.01, O0, fp16, scale 2^16,
 * no process group, buckets of 25 MiB (the first 1 MiB). */
void loom_compile_opts_default(loom_compile_opts *o);

typedef struct loom_program loom_program;

/*
 * Compiles g for training `loss` (a scalar): autodiff over every parameter,
 * the AMP pass, memory planning, backend lowering. The graph is not consumed
 * and may be freed after.
 * On failure the message is in loom_last_error(), and, as sqlite3_open does,
 * *out holds the failed program where one was made, so that
 * loom_program_error() can explain it; such a handle takes only
 * loom_program_error and loom_program_free (other calls return
 * LOOM_ERR_INVALID). *out is NULL when the arguments were refused before a
 * program existed: out or g NULL, a graph in error, a loss that is not a
 * scalar value, an unknown device or invalid optimizer options, or no
 * memory.
 */
loom_status loom_compile(loom_graph *g, loom_value loss,
			 const loom_compile_opts *o, loom_program **out);
void loom_program_free(loom_program *p);

/* The message of the last failure in this thread of a call without a
 * handle: loom_compile (also a failed compile's, which loom_program_error
 * of the returned handle repeats), a data set's load, a constructor of
 * include/loom_data.h. */
const char *loom_last_error(void);

/* Where the library's messages go: fn(user, message) with message one
 * line ending in a newline. fn NULL restores the default (stderr). Set it
 * before compiling; it is one setting for the process, not per thread. */
typedef void (*loom_log_fn)(void *user, const char *message);
void loom_set_log(loom_log_fn fn, void *user);

/* ---------------------------------------------------------------- run */

typedef enum loom_run_mode {
	LOOM_RUN_TRAIN = 0, /* forward, backward, optimizer update */
	LOOM_RUN_GRAD,      /* forward and backward, no update */
	LOOM_RUN_FORWARD,   /* forward in training mode (batch statistics) */
	LOOM_RUN_EVAL,      /* forward in eval mode (running statistics); data
			     * parallel: the first after training is
			     * collective (rank 0's buffers are broadcast) */
	LOOM_RUN_ACCUMULATE, /* forward and backward; gradients kept for the next TRAIN */
	LOOM_RUN_MODE_COUNT
} loom_run_mode;

/*
 * Gradient accumulation (DDP's no_sync, `--accumulate N`): N-1 runs in
 * LOOM_RUN_ACCUMULATE, then one in LOOM_RUN_TRAIN, take one optimizer step
 * on the gradient of the N micro-batches together:
 * - ACCUMULATE runs forward and backward and adds this micro-step's
 *   gradients into the program's accumulated gradients (fp32 sums, the
 *   bucket layout under a process group); no all-reduce, no optimizer
 *   update, the step count and the loss scale stay as they are.
 * - The TRAIN that follows adds its own micro-step's gradients, sums the
 *   total over the ranks once (the usual buckets, overlapped with
 *   backward), and updates with the gradient averaged over micro-steps x
 *   world size: N micro-steps of batch B on each of W ranks make the same
 *   step as one step of batch N*W*B with the mean loss. The sums are then
 *   empty again.
 * - Under loss scaling, an inf/NaN in any micro-step on any rank makes the
 *   whole accumulated step skip on every rank (the scale halves once).
 * - GRAD, FORWARD and EVAL runs leave the accumulated gradients alone;
 *   loom_save does not keep them (save between steps) and loom_load drops
 *   them.
 * The sums take 4 bytes per gradient element, allocated by the first
 * ACCUMULATE (loom_program_memory_report shows them); a backend without
 * them answers LOOM_ERR_UNSUPPORTED.
 */

/* Copies count elements of dtype dt into the input called name.
 * LOOM_ERR_STATE while that input's buffer is handed out (below). */
loom_status loom_set_input(loom_program *p, const char *name, const void *data,
			   loom_dtype dt, size_t count);

/*
 * The next batch written where the step reads it, with no copy of the
 * caller's own: loom_input_buffer hands out *ptr, host memory for count
 * elements of dt (dt the input's dtype, count its element count, or for a
 * pipeline program what loom_set_input takes, checked at commit); the
 * caller writes the batch there (a loader converts straight into it,
 * loom_loader_get), on any thread, while the program runs steps on the
 * batch committed before; loom_input_commit makes it the input of the next
 * run, as loom_set_input of it would; loom_input_release gives the buffer
 * back unused (an abandoned epoch). One buffer per input is out at a time;
 * a committed buffer stays readable (its labels, say) until the hand-out
 * after next, and no buffer outlives loom_program_free. The three calls
 * themselves are the program's, on its thread, like loom_run; only the
 * writes into the buffer may happen elsewhere. Where it comes from:
 * - the CUDA backend staging inputs for the captured step
 *   (LOOM_CUDA_UPLOAD=graph): the input's free pinned slot, which the
 *   step's copy node reads itself (no host copy); it waits, here, only
 *   while a queued step still reads that slot;
 * - elsewhere (the CPU, CUDA without staging, a pipeline): a buffer the
 *   program owns, copied at commit as loom_set_input copies
 *   (loom_program_info.input_upload_bytes counts those copies).
 * Errors name the input: LOOM_ERR_NOT_FOUND (no such input), LOOM_ERR_DTYPE,
 * LOOM_ERR_SHAPE (count), LOOM_ERR_STATE (a buffer asked while one is out,
 * a commit without one); loom_set_input of an input whose buffer is out is
 * LOOM_ERR_STATE too. Release without a buffer out does nothing.
 */
loom_status loom_input_buffer(loom_program *p, const char *name, loom_dtype dt,
			      size_t count, void **ptr);
loom_status loom_input_commit(loom_program *p, const char *name);
loom_status loom_input_release(loom_program *p, const char *name);
loom_status loom_run(loom_program *p, loom_run_mode mode);

/* Reads a kept value (an output, a parameter, a buffer) as f32 or in its
 * own dtype (loom_read_raw). count must equal the element count. */
loom_status loom_read(loom_program *p, loom_value v, float *dst, size_t count);
loom_status loom_read_f64(loom_program *p, loom_value v, double *dst, size_t count);
/* The gradient of parameter v from the last TRAIN or GRAD run, as the
 * backward pass left it: under loss scaling still multiplied by the scale
 * (loom_program_info.loss_scale); the optimizer unscales it. With a process
 * group (loom_compile_opts.pg) it is the sum over the ranks; the optimizer
 * divides by the world size. After a TRAIN that ended an accumulation, it
 * is the sum over the micro-steps too; after an ACCUMULATE, that
 * micro-step's own (not summed over ranks). */
loom_status loom_read_grad_f64(loom_program *p, loom_value v, double *dst,
			       size_t count);
/* Overwrites a parameter or buffer (tests, custom initialisation). */
loom_status loom_write_f64(loom_program *p, loom_value v, const double *src,
			   size_t count);

/*
 * A Chrome trace (the JSON "traceEvents" format: chrome://tracing and
 * ui.perfetto.dev open it) of the runs between loom_trace_start and
 * loom_trace_stop: a span per run, per phase (forward, backward, optimizer),
 * per node that computes (a fused node once, under its op and node id, with
 * its shape and dtype), per wait for the all-reduces, and, on a second track
 * "comm", each bucket's all-reduce from its start to when the executor first
 * saw it complete. Times are CLOCK_MONOTONIC, in microseconds from the
 * start on rank 0.
 * With a process group both calls are collective (every rank calls them,
 * between the same runs): rank 0 gathers every rank's spans at stop and
 * writes ONE file at its path, one track (pid) per rank; the other ranks'
 * path is not used (may be NULL). Ranks on other hosts are not aligned in
 * time. Off, recording costs a pointer test per node.
 * The CPU backend only: on CUDA, start returns LOOM_ERR_UNSUPPORTED. Start
 * fails on every rank when rank 0 cannot create path (LOOM_ERR_IO), stop
 * when the spans cannot be gathered or written.
 */
loom_status loom_trace_start(loom_program *p, const char *path);
loom_status loom_trace_stop(loom_program *p);

/* The loss of the last run, as f64. Under LOOM_ASYNC_LOSS=1 in the
 * environment (CUDA, one process; engine/cuda/README.md) loom_run does not
 * wait for its step, and this is the loss of the run before the last. */
double loom_loss(loom_program *p);

loom_status loom_set_lr(loom_program *p, double lr);
double loom_get_lr(const loom_program *p);
/* Optimizer steps taken (skipped AMP steps do not count). */
int64_t loom_step_count(const loom_program *p);

typedef struct loom_program_info {
	const char *backend;        /* "cpu" or "cuda: <device name>" */
	size_t arena_bytes;         /* everything one step touches */
	size_t param_bytes;         /* model weights, in their dtypes */
	size_t master_bytes;        /* fp32 master weights (O2) */
	size_t grad_bytes;
	size_t optim_state_bytes;
	size_t activation_bytes;    /* the planned, reused activation region */
	size_t activation_naive_bytes; /* the same without reuse */
	/* amp.fp8's roundings kept as fp8 codes, one byte an element, where
	 * only products read them (LOOM_FP8_STORAGE; the CPU): how many, the
	 * bytes they take, and the bytes their dtype would have taken more
	 * (each value aligned as the memory plan places it). */
	int n_fp8_stored;
	size_t fp8_stored_bytes, fp8_saved_bytes;
	int n_nodes;
	int n_recomputed; /* values made again in the backward (loom_compile_opts.recompute) */
	int n_params;
	int64_t n_param_elems;
	/* Floating-point operations of one step's products (conv2d and its two
	 * backward directions, linear, matmul: 2 per multiply-add), counted
	 * from the plan, so a layer whose input needs no gradient counts no
	 * data-gradient product. Element-wise work (batch norm, relu, pooling,
	 * the optimizer) is not counted: it is a few percent of the products'
	 * FLOPs in a CNN. A padded vocabulary's products (vocab_pad) count
	 * at their padded extent: the work the step does, as llm.c counts
	 * its padded table. Divided by a step's time: the achieved FLOP/s. */
	double flops_fwd, flops_bwd;
	double loss_scale;          /* 1 without dynamic scaling */
	int64_t skipped_steps;      /* AMP steps skipped on overflow */
	double grad_norm;           /* the last update's global gradient norm (before clipping;
				     * taken only while clipping is on, else 0) */
	/* When the loss scale collapsed (below 1): which op first produced a
	 * non-finite value, e.g. "conv2d 'conv1' (node 7)"; else "". */
	const char *amp_report;
	/* How training steps are launched (loom_compile_opts.cuda_graph):
	 * graph_note, why they run eagerly ("" while captured, or before the
	 * first training step decides); graph_captures and graph_replays,
	 * steps recorded as one CUDA graph and launches of it after its
	 * capture; host_syncs, every wait of the host for the device, and
	 * syncs_in_step, those inside a step (0 for a replayed one). All 0 on
	 * a backend that counts nothing (the CPU). */
	const char *graph_note;
	long graph_captures, graph_replays, host_syncs, syncs_in_step;
	/* Input bytes the host copied on their way to the step (loom_set_input,
	 * and a commit of the program's own buffer); a commit of a backend's
	 * staging slot copies none (loom_input_buffer). */
	uint64_t input_upload_bytes;
} loom_program_info;

void loom_program_info_get(const loom_program *p, loom_program_info *info);

/* One tensor amp.fp8 scales (an operand of a product, or a product's
 * output gradient), as the last finished training step left it. */
typedef struct loom_fp8_tensor_info {
	const char *name;   /* its rounding's node, e.g. "h0.c_fc.e4m3" (valid
			     * until loom_program_free) */
	int node;           /* that node in loom_program_dump */
	loom_dtype format;  /* LOOM_FP8_E4M3 or LOOM_FP8_E5M2 */
	double scale;       /* what the step multiplied the tensor by before the cast */
	double amax;        /* the step's max |x| (max over the ranks and micro-steps) */
	double next_scale;  /* delayed scaling: what the next step casts with; else
			     * 0 (it takes the tensor's own amax) */
	int64_t saturated;  /* values clamped to the format's largest finite value
			     * in that step (summed over micro-steps and ranks) */
} loom_fp8_tensor_info;

/* Tensors amp.fp8 scales (0 without fp8). */
int loom_fp8_tensor_count(const loom_program *p);
/* Tensor i of them: LOOM_ERR_INVALID (with a message) for an i out of range. */
loom_status loom_fp8_tensor_get(const loom_program *p, int i, loom_fp8_tensor_info *out);
/* `--amp-report`: the loss scale and, per scaled tensor, a line with its
 * name, format, scale, amax and saturated count. Nothing for a program
 * that did not compile. */
void loom_amp_report(const loom_program *p, FILE *out);

/* Writes the compiled plan, one line per node in execution order: the op,
 * its dtype after the AMP pass (casts included), shape, sources, and where
 * its buffer lives in the arena ("P+offset" persistent, "A+offset" reused
 * activations). */
void loom_program_dump(const loom_program *p, FILE *out);

/* Writes the compiled plan as a Graphviz digraph: one box per node labelled
 * with its op, dtype, shape and arena place, filled by precision (fp32 blue,
 * fp16 orange, bf16 gold), fused nodes outlined in red, AMP casts dashed,
 * edges labelled with the shape they carry. `dot -Tsvg` renders it. */
void loom_program_dump_dot(const loom_program *p, FILE *out);

/* Writes where the program's memory goes, decided before step 1: parameters,
 * master weights, gradients, optimizer state, activations (planned, and the
 * naive one-buffer-each total beside them), workspace, and the peak. */
void loom_program_memory_report(const loom_program *p, FILE *out);

/* The message of the last failure on p ("" if none). */
const char *loom_program_error(const loom_program *p);

/* ---------------------------------------------------------------- CPU path */

/*
 * One line naming the CPU kernels' path, chosen once from the CPU's features,
 * and their thread count, e.g. "cpu: 2 threads, avx512_bf16 kernels (onednn)",
 * written to buf; returns buf. For a program's start-up output.
 */
const char *loom_cpu_describe(char *buf, size_t size);
/* Threads the CPU kernels use from now on (n < 1: one per core). */
void loom_cpu_set_threads(int n);

/* ---------------------------------------------------------------- checkpoints */

/*
 * Saves parameters, buffers, optimizer state, step counter, learning rate and
 * loss-scaler state to path: written to path.tmp, synced, then renamed, so a
 * crash never leaves a half-written file under the real name.
 */
loom_status loom_save(loom_program *p, const char *path);
/*
 * Restores what loom_save wrote. A corrupted file (checksum), a file of
 * another format version, or one whose tensors do not match this program is
 * refused with a message naming the file and the fault; p is then unchanged.
 */
loom_status loom_load(loom_program *p, const char *path);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_H */
