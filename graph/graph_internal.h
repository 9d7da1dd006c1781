/*
 * graph/graph_internal.h — the IR behind loom_graph, shared by graph/, amp/
 * and engine/. A node is a value: one op, its sources, its dtype and shape.
 * Building a node only records it; loom_compile does the work.
 */
#ifndef LOOM_GRAPH_INTERNAL_H
#define LOOM_GRAPH_INTERNAL_H

#include <stdarg.h>
#include <stdint.h>

#include "base/errf.h"
#include "graph/unary.h"
#include "loom.h"

/*
 * Every op, one row each, in the order of their numbers (a new op goes
 * last): X(NAME, low) is the op LOOM_OP_<NAME>, whose op table entry
 * (graph/ops/ops.h) is loom_op_<low>, defined in its family's file under
 * graph/ops/ and found by graph/ops/ops.c through this list; U(NAME, low)
 * is the pair of a unary op of graph/unary.h, LOOM_OP_<NAME> (x -> y) and
 * LOOM_OP_<NAME>_BWD ((x, dy) -> dx). Adding a non-unary op: its row here,
 * its family file in graph/ops/, its builder in include/loom.h.
 */
#define LOOM_OPS(X, U)                                                                    \
	X(INPUT, input)                                                                   \
	X(PARAM, param)                                                                   \
	X(BUFFER, buffer)                                                                 \
	X(CONV2D, conv2d)                                                                 \
	X(CONV2D_BWD_DATA, conv2d_bwd_data)       /* (dy, w) -> dx */                     \
	X(CONV2D_BWD_FILTER, conv2d_bwd_filter)   /* (dy, x) -> dw */                     \
	X(CHANNEL_SUM, channel_sum)               /* [N, C, ...] -> [C] */                \
	X(BATCHNORM2D, batchnorm2d)               /* (x, gamma, beta, rmean, rvar) */     \
	X(BN_BWD_DATA, bn_bwd_data)               /* (x, gamma, dy) -> dx */              \
	X(BN_BWD_GAMMA, bn_bwd_gamma)             /* (x, dy) -> dgamma */                 \
	X(RELU, relu)                                                                     \
	X(RELU_BWD, relu_bwd)                     /* (x, dy) -> dx */                     \
	X(MAXPOOL2D, maxpool2d)                                                           \
	X(MAXPOOL2D_BWD, maxpool2d_bwd)           /* (x, dy) -> dx */                     \
	X(LINEAR, linear)                         /* (x, w[, b]) */                       \
	X(MATMUL, matmul)                         /* (a, b), attrs: which is transposed */ \
	X(ADD, add)                                                                       \
	X(RESHAPE, reshape)                                                               \
	X(SUM, sum)                               /* all elements -> [] */                \
	X(BROADCAST, broadcast)                   /* [] -> shape, times attrs.scale */    \
	X(SOFTMAX_CE, softmax_ce)                 /* (logits, labels) -> [] */            \
	X(SOFTMAX_CE_BWD, softmax_ce_bwd)         /* (logits, labels, dloss) -> dlogits */ \
	X(GRAD_SEED, grad_seed)                   /* [] holding the loss scale */         \
	X(CAST, cast)                             /* x -> dtype */                        \
	X(GLOBAL_AVGPOOL, global_avgpool)         /* [N, C, H, W] -> [N, C] */            \
	X(GLOBAL_AVGPOOL_BWD, global_avgpool_bwd) /* dy [N, C] -> dx [N, C, H, W] */      \
	LOOM_UNARY_OPS(U)                         /* graph/unary.h */                     \
	X(ALLREDUCE, allreduce)                   /* a gradient bucket summed over ranks */ \
	X(EMBEDDING, embedding)                   /* (ids i32 [...], table [V, C]) -> [..., C] */ \
	X(EMBEDDING_BWD, embedding_bwd)           /* (ids, dy) -> dtable, a scatter-add */ \
	X(LAYERNORM, layernorm)                   /* (x [..., C], gamma [C], beta [C]) */ \
	X(LAYERNORM_BWD_DATA, layernorm_bwd_data) /* (x, gamma, dy) -> dx */              \
	X(LAYERNORM_BWD_GAMMA, layernorm_bwd_gamma) /* (x, dy) -> dgamma */               \
	X(ATTN_PROBS, attn_probs)       /* qkv [B, T, 3C] -> P [B, NH, T, T], causal softmax */ \
	X(ATTN_PROBS_BWD, attn_probs_bwd)         /* (qkv, P, dP) -> dqkv (q, k parts) */ \
	X(ATTENTION, attention)                   /* (P, qkv) -> y [B, T, C]: P v */      \
	X(ATTENTION_BWD_PROBS, attention_bwd_probs) /* (qkv, dy) -> dP */                 \
	X(ATTENTION_BWD_QKV, attention_bwd_qkv)   /* (P, dy) -> dqkv (v part) */          \
	X(REORDER, reorder)                       /* x in node->format (graph/formats.c) */ \
	X(RMSNORM, rmsnorm)                       /* (x [..., C], gamma [C]) */           \
	X(RMSNORM_BWD_DATA, rmsnorm_bwd_data)     /* (x, gamma, dy) -> dx */              \
	X(RMSNORM_BWD_GAMMA, rmsnorm_bwd_gamma)   /* (x, dy) -> dgamma */             \
	X(ALLGATHER, allgather)   /* ZeRO-3: a bucket of parameters gathered (parallel/zero3.c) */ \
	X(FP8_QDQ, fp8_qdq)       /* x -> x through fp8 and back (amp/amp_pass.c, attrs.fp8) */

typedef enum loom_op {
#define LOOM_OP_ENUM(NAME, low) LOOM_OP_##NAME,
#define LOOM_OP_ENUM_PAIR(NAME, low) LOOM_OP_##NAME, LOOM_OP_##NAME##_BWD,
	LOOM_OPS(LOOM_OP_ENUM, LOOM_OP_ENUM_PAIR)
#undef LOOM_OP_ENUM
#undef LOOM_OP_ENUM_PAIR
	LOOM_OP_COUNT
} loom_op;

#define LOOM_MAX_SRC 5
#define LOOM_NAME_MAX 64

/* Node flags. */
enum {
	LOOM_NODE_OUTPUT = 1u << 0,   /* kept readable after a step */
	LOOM_NODE_BACKWARD = 1u << 1, /* appended by autodiff */
	LOOM_NODE_GRAD = 1u << 2,     /* the full gradient of a parameter */
	LOOM_NODE_AMP = 1u << 3,      /* inserted by the AMP pass */
	LOOM_NODE_STAGE_CUT = 1u << 4, /* pipeline: the last value of its stage (loom_stage_boundary) */
	/* Stored outside the memory plan, in shards (ZeRO-1's O2 masters, in
	 * the optimizer-state region: parallel/zero.c): no place in any region. */
	LOOM_NODE_SHARDED = 1u << 5,
	/* A cast folded in (graph/fuse.c, loom_fuse_casts): the node computes
	 * in fp32 and writes its half dtype, rounding once. */
	LOOM_NODE_CAST_FOLDED = 1u << 6,
	/* A reorder the format pass inserted (graph/formats.c): not a value
	 * of the user's graph. */
	LOOM_NODE_REORDER = 1u << 7,
	/* The node adds its result into its last source and makes the sum
	 * (graph/fuse.c's loom_fuse_ln_bwd_accum: a row norm's dx into the
	 * residual's other gradient; loom_fuse_emb_bwd_accum: an embedding's
	 * gradient into the tied table's other): the memory plan may write it
	 * over that source where it dies there (or, a persistent sum, lend
	 * that source its bytes), so its kernels read each element of it
	 * before writing that element. */
	LOOM_NODE_ACCUM = 1u << 8,
};

/*
 * A value's memory format, decided once by the format pass
 * (graph/formats.c) from what each backend's kernels take. NCHW is the
 * user's layout (and that of every value that is not a 4-D activation);
 * the others hold the same [N, C, H, W] values in another order: NHWC
 * (channels last), NCHW8C (oneDNN's nChw8c: [N][C/8][H][W][8], only for C
 * a multiple of 8, so that the size is the same).
 */
typedef enum loom_format {
	LOOM_FORMAT_NCHW = 0,
	LOOM_FORMAT_NHWC,
	LOOM_FORMAT_NCHW8C,
	LOOM_FORMAT_COUNT
} loom_format;

/* "nchw", "nhwc", "nChw8c". */
const char *loom_format_name(loom_format f);


typedef union loom_attrs {
	struct {
		int stride, pad;
	} conv;
	struct {
		double momentum, eps;
		int relu; /* BATCHNORM2D: a fused relu after the affine (graph/fuse.c) */
		/* Training-mode statistics and the backward's sums over every
		 * rank (loom_compile_opts.sync_bn, set by engine/ddp.c). */
		int sync;
	} bn;
	struct {
		int kernel, stride, pad;
		int relu; /* fused relu before the pool (graph/fuse.c) */
	} pool;
	struct {
		int ta, tb; /* transpose a / b */
		int relu;   /* LINEAR: a fused relu after the bias (graph/fuse.c) */
	} mm;
	struct {
		double scale;
	} bc;
	struct {
		int relu; /* ADD: a fused relu after the sum (graph/fuse.c) */
		int tanh; /* unary ops (graph/unary.h): the variant (GELU: GPT-2's tanh form) */
	} ew;
	struct {
		loom_init init;
		int64_t fan_in;
	} leaf;
	struct {
		int bucket; /* ALLREDUCE: its index in the plan's bucket table */
	} ar;
	struct {
		double eps; /* LAYERNORM, RMSNORM and their backward */
	} ln;
	struct {
		int n_head; /* ATTN_PROBS, ATTENTION and their backward */
		/* One fused flash attention (graph/fuse_attention.c): ATTN_PROBS
		 * writes the softmax's log-sum-exp [B, NH, T] f32 and makes the
		 * ATTENTION node's y (which then reads qkv alone); ATTN_PROBS_BWD reads (qkv, LSE, dy, y) and
		 * writes the whole dqkv. */
		int fused;
	} attn;
	struct {
		/* FP8_QDQ: the format the forward rounds x through (LOOM_FP8_E4M3
		 * or LOOM_FP8_E5M2; LOOM_F32: none, a copy) and the one the
		 * backward rounds dy through (LOOM_F32: none, straight through),
		 * each with a power-of-two scale from the tensor's own amax. */
		loom_dtype fwd, bwd;
		/* Its tensor in the training state's fp8 scales (ts.fp8.t[slot],
		 * amp/fp8_scaling.h), set at compile's end; -1: none (a copy). */
		int slot;
		/* The plan's recipe, set with slot: delayed scaling's history
		 * length (0: current scaling) and margin; ranks compare them. */
		int history, margin;
		/* 1: the value is stored as its fp8 codes, one byte each, with
		 * the f32 scale they were cast with after them (graph/ops/ops.h,
		 * loom_fp8_stored), where only products read it and the backend
		 * decodes them (the fp8 storage pass, engine/compile_passes.c). */
		int store;
	} fp8;
} loom_attrs;

typedef struct loom_node {
	loom_op op;
	loom_dtype dtype;
	loom_shape shape;
	int nsrc;
	loom_value src[LOOM_MAX_SRC];
	loom_attrs a;
	uint32_t flags;
	loom_value grad;   /* for params, after autodiff: the gradient value */
	loom_value master; /* for params, after AMP O2: the fp32 master (a param) */
	/* LOOM_NONE, or an earlier node whose kernel writes this value too
	 * (graph/fuse.c, loom_fuse_siblings): the value is made when that node
	 * runs, not at its own place, and the memory planner places it so. */
	loom_value made_by;
	/* Backward nodes: the forward node whose gradient rule appended it
	 * (graph/autodiff.c; the seed's is the loss), so that a pipeline
	 * stage runs the backward of its own forward nodes. Else LOOM_NONE. */
	loom_value bwd_of;
	/* The memory format of this value (graph/formats.c); NCHW unless the
	 * format pass chose another. */
	loom_format format;
	/* A view (LOOM_OPF_VIEW): where it starts inside src[0]'s storage, in
	 * bytes (a parameter inside ZeRO-3's gathered bucket); 0 for the others. */
	size_t view_off;
	/* A padded vocabulary (graph/rowpad.h; the vocab-pad compile pass):
	 * the user's dims[0] (a table and its gradients, padded rows) or last
	 * dim (the logits and dlogits, padded columns) before the pass widened
	 * the shape; 0 when not padded. What a user reads and writes, and the
	 * classes a softmax-CE counts, are the unpadded extent. */
	int64_t unpad_rows, unpad_cols;
	char name[LOOM_NAME_MAX];
} loom_node;

struct loom_graph {
	loom_node *nodes;
	int n, cap;
	loom_error err; /* the sticky first failure (base/errf.h) */
	uint64_t seed;
};

/* The op table (each op's rules) is graph/ops/ops.h. */

/* Sets the sticky error (first one wins) and returns LOOM_NONE. */
loom_value loom_graph_fail(loom_graph *g, loom_status st, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Appends a node, returns its value (LOOM_NONE on OOM, with the error set).
 * Appending may move the node array: the shape comes by value and src is
 * copied first, so callers may pass a node's own fields; but any pointer a
 * caller holds into g->nodes is stale after this call. */
loom_value loom_node_add(loom_graph *g, loom_op op, loom_dtype dt, loom_shape shape,
			 int nsrc, const loom_value *src);

static inline loom_node *loom_node_at(const loom_graph *g, loom_value v)
{
	return &g->nodes[v];
}

/* "conv2d 'conv1'" or "conv2d #12", for messages. */
const char *loom_node_label(const loom_graph *g, loom_value v, char *buf,
			    size_t len);
/* "[100, 1, 28, 28]" */
const char *loom_shape_str(const loom_shape *s, char *buf, size_t len);

int loom_shape_eq(const loom_shape *a, const loom_shape *b);

/* A shape [..., last] seen as a matrix [rows, last], as products and
 * layer norm see values of more than 2 dims. */
static inline int64_t loom_shape_last(const loom_shape *s)
{
	return s->ndim > 0 ? s->dims[s->ndim - 1] : 1;
}

/* n's shape as its user sees it: less a padded vocabulary's rows or
 * columns (loom_node.unpad_rows / unpad_cols). A padded-rows value's user
 * part is the row-major prefix of its storage. */
static inline loom_shape loom_node_user_shape(const loom_node *n)
{
	loom_shape s = n->shape;
	if (n->unpad_rows > 0 && s.ndim > 0)
		s.dims[0] = n->unpad_rows;
	if (n->unpad_cols > 0 && s.ndim > 0)
		s.dims[s.ndim - 1] = n->unpad_cols;
	return s;
}

/* Element i of n's user shape in its storage: a padded vocabulary's
 * columns (the logits) skip each row's padding; padded rows are the tail,
 * so their user part is the prefix. */
static inline size_t loom_node_stored_index(const loom_node *n, size_t i)
{
	if (n->unpad_cols <= 0)
		return i;
	size_t cols = (size_t)n->unpad_cols, pitch = (size_t)n->shape.dims[n->shape.ndim - 1];
	return i / cols * pitch + i % cols;
}

/* The classes of logits node n: its unpadded last dim. */
static inline int64_t loom_node_classes(const loom_node *n)
{
	return n->unpad_cols > 0 ? n->unpad_cols : (n->shape.ndim > 0 ? n->shape.dims[n->shape.ndim - 1] : 1);
}

static inline int64_t loom_shape_rows(const loom_shape *s)
{
	int64_t last = loom_shape_last(s);
	return last ? loom_shape_numel(s) / last : 0;
}
loom_shape loom_shape_make(int ndim, const int64_t *dims);

/* Copies a graph (for compile passes that rewrite it). */
loom_status loom_graph_clone(const loom_graph *g, loom_graph **out);

/* Autodiff: appends the backward graph of loss (a scalar) with respect to
 * every parameter; sets node->grad of each parameter reached (params not
 * reached get a zero gradient). */
loom_status loom_autodiff(loom_graph *g, loom_value loss);

/* Fuses relu -> maxpool pairs (and their backward) into relu-pools; returns
 * how many. Run after autodiff, before memory planning. */
int loom_fuse_relu_pool(loom_graph *g);
/* Turns node v into a view of src (a fusion's leftover): no kernel, no
 * storage of its own. */
void loom_fuse_make_view(loom_graph *g, loom_value v, loom_value src);

/* Fuses linear -> relu pairs: the linear applies the relu (cuBLASLt's
 * RELU_BIAS epilogue), the relu becomes a view and its backward reads the
 * linear's (now relu'd) output, which is > 0 exactly where the pre-relu
 * value was. Returns how many. Run after autodiff, before memory planning. */
int loom_fuse_linear_relu(loom_graph *g);

/* Fuses batch norm -> relu and add -> relu pairs the same way: the batch
 * norm or the add applies the relu, the relu becomes a view and its
 * backward reads the fused node's output. Run after loom_fuse_relu_pool
 * (which takes the relus that feed pools). Returns how many. */
int loom_fuse_bn_relu(loom_graph *g);
int loom_fuse_add_relu(loom_graph *g);

/* Folds casts into kernels: a narrowing cast (fp32 -> half) whose source
 * has no other reader into that source (the producer writes half, computing
 * in fp32 and rounding once, as the cast did); a widening one (half -> fp32)
 * read by one kernel into that reader (it reads the half value and widens
 * it, exactly). The cast becomes a view: the same bits, one pass and one
 * buffer fewer. For backends whose kernels read and write any float dtype
 * (LOOM_BE_FUSES_CASTS). Returns how many. Run after the relu fusions and
 * loom_fuse_siblings (a node that makes siblings keeps its dtype, but for
 * the layer-norm backward, whose kernel takes any). */
int loom_fuse_casts(loom_graph *g);
/* loom_fuse_casts for a backend whose kernels take any float dtype only
 * at some ops (LOOM_BE_FUSES_SOME_CASTS: CUDA's own kernels, not its
 * library calls): takes(op) says which. A producer folds its narrowing
 * cast only if it takes; a widening cast goes into its readers only if
 * every reader (up to 8) takes, each then reading the half value. */
int loom_fuse_casts_for(loom_graph *g, int (*takes)(loom_op op));

/* Asks a backend whether it runs the causal attention whose ATTN_PROBS
 * node is probs as one fused kernel (train: its backward too). */
typedef int (*loom_attn_fusable_fn)(const loom_graph *g, loom_value probs, int train);

/* Fuses each causal attention (ATTN_PROBS -> ATTENTION and, in training,
 * their three backward nodes and the sum of the two dqkv shares) into one
 * forward and one backward kernel that keep no T x T matrix: ATTN_PROBS
 * becomes the softmax statistics (LSE, [B, NH, T] f32) and makes the
 * ATTENTION node's y (made_by); the sum becomes ATTN_PROBS_BWD over (qkv,
 * LSE, dy, y); the other backward nodes turn into views. Only where
 * fusable says yes (half qkv, dy and dqkv of one dtype). Returns how many.
 * Run after loom_fuse_siblings, before memory planning. */
int loom_fuse_attention(loom_graph *g, loom_attn_fusable_fn fusable);

/* The nodes reading v (at most max of them, in graph order), or -1 if
 * there are more (graph/fuse.c; the fusion passes' question). */
int loom_graph_readers(const loom_graph *g, loom_value v, loom_value *out, int max);

/* Marks values one library call makes together with an earlier node's
 * (node->made_by): batch norm's dgamma and dbeta with its dx (one
 * cudnnBatchNormalizationBackward), a linear's bias gradient with its
 * weight gradient (cuBLASLt's BGRADB epilogue), layer norm's dgamma and
 * dbeta with its dx (one CUDA kernel). Returns how many. Run after
 * autodiff, before memory planning. */
int loom_fuse_siblings(loom_graph *g);

/* Asks a backend whether its kernel for the residual add a also makes the
 * layer norm ln that reads it (the dtypes and shapes it sees). */
typedef int (*loom_ln_residual_fn)(const loom_graph *g, loom_value a, loom_value ln);

/* Marks each forward residual add's layer-norm reader as made by the add
 * (node->made_by): one kernel writes the sum and the layer norm's outputs.
 * Only where fusable says yes (NULL: everywhere). Returns how many. Run
 * after loom_fuse_casts, before memory planning. */
int loom_fuse_ln_residual(loom_graph *g, loom_ln_residual_fn fusable);

/* Asks a backend whether its kernel for a row norm's data gradient d
 * (layer norm's or RMS norm's: d's op) also adds dx into the other addend
 * of the sum s that reads it, s's src[other] (the dtypes and shapes it
 * sees). */
typedef int (*loom_ln_bwd_accum_fn)(const loom_graph *g, loom_value d, loom_value s, int other);

/* Fuses each sum of a row norm's data gradient with another gradient
 * (autodiff's ADD of a residual value's two gradients) into the
 * LAYERNORM_BWD_DATA or RMSNORM_BWD_DATA node: it takes the other addend as src[3], carries
 * LOOM_NODE_ACCUM and makes the sum (dx rounded into its dtype, then
 * added as the ADD did); the ADD becomes a view of it. Only where fusable
 * says yes (NULL: everywhere). Returns how many. Run after
 * loom_fuse_casts, before memory planning. */
int loom_fuse_ln_bwd_accum(loom_graph *g, loom_ln_bwd_accum_fn fusable);

/* Fuses each sum of an embedding's gradient with another gradient (a tied
 * table's two gradients: the classifier's dW and the scatter-add) into the
 * EMBEDDING_BWD node: it takes the other addend as src[2], carries
 * LOOM_NODE_ACCUM and makes the sum (each row's scatter-add rounded into
 * its dtype, then added as the ADD did); the ADD becomes a view of it, and
 * where the ADD was the parameter's gradient the node is (node->grad, the
 * LOOM_NODE_GRAD flag). Only where fusable says yes (NULL: everywhere).
 * Returns how many. Run after loom_fuse_casts, before memory planning. */
int loom_fuse_emb_bwd_accum(loom_graph *g, loom_ln_bwd_accum_fn fusable);

/* What a backend's kernel for one node takes (the format pass asks). */
typedef struct loom_format_caps {
	unsigned accept;    /* bit f: the node runs with its 4-D operands in format f */
	/* Each operand in its own format of `accept` (the kernel converts
	 * inside, a oneDNN convolution); the result then takes `prefer`.
	 * Else all 4-D operands and the result share one format. */
	int mixed;
	loom_format prefer;
} loom_format_caps;

/* Fills *caps for node v of g (it arrives as NCHW only). */
typedef void (*loom_format_query_fn)(void *ctx, const loom_graph *g, loom_value v,
				     loom_format_caps *caps);

/*
 * The format pass: gives every value its format (node->format) from what
 * query says each node takes, keeps user-visible values (leaves, outputs,
 * gradients of parameters) NCHW, and inserts a reorder node
 * (LOOM_OP_REORDER, flagged LOOM_NODE_REORDER) before the first reader of a
 * value in a format that reader cannot take: one per value and format.
 * Renumbers the graph (n_fwd and loss follow); *n_reorders gets how many.
 * query NULL: everything stays NCHW. Run after the fusion passes, before
 * memory planning.
 */
loom_status loom_formats_pass(loom_graph *g, int *n_fwd, loom_value *loss,
			      loom_format_query_fn query, void *ctx, int *n_reorders);

/*
 * Activation recomputation (graph/recompute.c): at level 1 the activation
 * functions (GELU, SiLU), at 2 also the norms, at 3 also the attention
 * probabilities (not with keep_probs: a backend that fuses attention), each forward value of those the backward
 * reads is made again by a copy of its node placed before its first
 * backward reader (with the casts and views between it and that reader),
 * which every backward reader then reads; only where every source of the
 * copy is a leaf or alive there anyway. Renumbers the graph (n_fwd and loss
 * follow); *n_copies gets how many nodes were copied. Run after autodiff
 * and the device, before the fusions.
 */
loom_status loom_recompute_pass(loom_graph *g, int level, int keep_probs, int *n_fwd,
				loom_value *loss, int *n_copies);
/* Whether the forward [0, n_fwd) of g has any op the pass may make again
 * at level (the memory-limit retry's question). */
int loom_recompute_has_ops(const loom_graph *g, int n_fwd, int level);

/* A 64-bit fingerprint of ops, dtypes, shapes, attrs and names (used to
 * check checkpoints and, later, that all ranks compiled the same graph). */
uint64_t loom_graph_fingerprint(const loom_graph *g);

#endif /* LOOM_GRAPH_INTERNAL_H */
