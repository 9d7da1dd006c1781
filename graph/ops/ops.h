/*
 * graph/ops/ops.h — the op table: everything graph/ and amp/ know about an
 * op, in one entry per op (defined in graph/ops/<family>.c, listed in
 * graph/ops/ops.c). The builder, autodiff, the AMP pass and the memory
 * planner ask the table; none of them tests for a particular op.
 */
#ifndef LOOM_GRAPH_OPS_OPS_H
#define LOOM_GRAPH_OPS_OPS_H

#include "graph/graph_internal.h"

#ifdef __cplusplus
extern "C" { /* engine/cuda reads the table too */
#endif

/* Where an op's nodes come from; says which rules the op must have
 * (tests/graph/test_op_table.c holds every op to it). */
typedef enum loom_op_kind {
	LOOM_OPK_LEAF,     /* input, param, buffer: given a value, not computed */
	LOOM_OPK_FORWARD,  /* built by users: a shape rule and a gradient rule */
	LOOM_OPK_PASS,     /* inserted by a compile pass: a gradient rule */
	LOOM_OPK_BACKWARD, /* appended by autodiff: never differentiated itself */
} loom_op_kind;

/* The member of loom_attrs an op's nodes use. */
typedef enum loom_attrs_kind {
	LOOM_ATTRS_NONE,
	LOOM_ATTRS_CONV, /* .conv */
	LOOM_ATTRS_BN,   /* .bn */
	LOOM_ATTRS_POOL, /* .pool */
	LOOM_ATTRS_MM,   /* .mm */
	LOOM_ATTRS_BC,   /* .bc */
	LOOM_ATTRS_LEAF, /* .leaf */
	LOOM_ATTRS_EW,   /* .ew */
	LOOM_ATTRS_AR,   /* .ar */
	LOOM_ATTRS_LN,   /* .ln */
	LOOM_ATTRS_ATTN, /* .attn */
	LOOM_ATTRS_FP8,  /* .fp8 */
} loom_attrs_kind;

/*
 * The op's precision under the AMP levels (apex's lists); every row names
 * one (a missing .amp is LOOM_AMP_UNSET, which the op table test refuses,
 * so that a new normalisation op cannot run in half by omission). O0 keeps the
 * model's dtypes and O3 runs everything in half; in between:
 *                       O1                    O2
 *   FOLLOW   the widest input dtype          half
 *   ALLOW    half (tensor-core ops)          half
 *   DENY     fp32 (statistics, reductions)   half (O2 casts the model)
 *   FP32     fp32 (the loss)                 fp32
 */
typedef enum loom_amp_class {
	LOOM_AMP_UNSET = 0, /* a row that forgot its class: tests/graph/test_op_table.c fails */
	LOOM_AMP_FOLLOW,
	LOOM_AMP_ALLOW,
	LOOM_AMP_DENY,
	LOOM_AMP_FP32,
} loom_amp_class;

/* A set of an op's sources: bit i stands for src[i]. */
#define LOOM_SRC(i) (1u << (i))

typedef struct loom_op_amp {
	loom_amp_class cls;
	/* Sources that keep their own dtype instead of taking the op's compute
	 * dtype (no cast inserted): batch norm's parameters and statistics,
	 * softmax-CE's labels. */
	unsigned keep;
	/* The kept sources are batch-norm parameters: O2 and O3 leave such
	 * leaves fp32 under keep_batchnorm_fp32 (as cuDNN takes them). */
	int bn_params;
	/* A tensor-core product (linear, matmul, conv) names its operands:
	 * under amp.fp8 they take E4M3 and its output gradient E5M2
	 * (amp/amp_pass.c). 0: not a product. */
	unsigned fp8_src;
} loom_op_amp;

/* Op flags. */
enum {
	LOOM_OPF_VIEW = 1u << 0,      /* aliases src[0]'s storage: no kernel, never a cast */
	LOOM_OPF_TRAINABLE = 1u << 1, /* a leaf the loss is differentiated against */
	LOOM_OPF_FED = 1u << 2,       /* a leaf the user fills each step: keeps its data's dtype */
	/* May write its output over src[0]'s storage when src[0] is read for the
	 * last time here and has the output's dtype and size (graph/memplan.c
	 * decides): its kernels on every backend must be safe for it. */
	LOOM_OPF_INPLACE = 1u << 3,
	/* May write its output over src[1]'s storage (a backward's dy) under
	 * the same conditions, where src[0] is not taken (graph/memplan.c;
	 * LOOM_INPLACE_DY=0 at plan time: never): so a product that makes
	 * the dy can write this op's output in its epilogue (cuBLASLt's DGELU,
	 * engine/cuda/matmul_cublaslt.cu). Its kernels on every backend must be
	 * safe for it (elementwise: each element's dy read before its output is
	 * written). */
	LOOM_OPF_INPLACE_DY = 1u << 4,
};

/*
 * Checks one node about to be built and sets its output. n arrives with op,
 * nsrc, src (each already a value of g), attributes and name; leaves,
 * reshape and broadcast also carry the dtype and shape asked for. The rule
 * checks them, names the op and the shapes in any error (loom_graph_fail),
 * and sets n->dtype and n->shape. Returns 0 to refuse the node.
 */
typedef int (*loom_shape_rule)(loom_graph *g, loom_node *n);

/*
 * Appends the gradient nodes of node v given dy (its output gradient): for
 * each source that loom_grad_needed() says needs one, computes its share
 * and hands it to loom_grad_accum().
 */
typedef void (*loom_grad_rule)(loom_graph *g, loom_value v, loom_value dy, void *ctx);

typedef struct loom_op_def {
	const char *name;
	loom_op_kind kind;
	loom_attrs_kind attrs;
	unsigned flags;                      /* LOOM_OPF_* */
	const char *src_names[LOOM_MAX_SRC]; /* for messages: "input", "weight", ... */
	unsigned nondiff;                    /* sources that take no gradient (labels, statistics) */
	loom_shape_rule shape;               /* NULL for ops users do not build */
	loom_grad_rule grad;                 /* NULL for leaves and backward ops */
	loom_op_amp amp;
	/* The lowest activation-recomputation level (loom_compile_opts.recompute)
	 * at which the op's output may be made again just before its first
	 * backward reader instead of kept (graph/recompute.c); 0: never. */
	int recompute;
} loom_op_def;

/* Indexed by loom_op; graph/ops/ops.c asserts it covers every op (the size
 * is left open here so that the assertion there can fail). */
extern const loom_op_def *const loom_op_defs[];

/*
 * Defines loom_op_<low>, the row of an op that autodiff (or a pass after
 * it) appends: never differentiated, so no shape or gradient rule, and it
 * runs at its inputs' precision. The sources' names follow the attributes
 * member its nodes use (LOOM_ATTRS_NONE: none).
 */
#define LOOM_BACKWARD_OP(low, op_name, attrs_kind, ...)  \
	const loom_op_def loom_op_##low = {              \
		.name = op_name,                         \
		.kind = LOOM_OPK_BACKWARD,               \
		.attrs = attrs_kind,                     \
		.src_names = { __VA_ARGS__ },            \
		.amp = { .cls = LOOM_AMP_FOLLOW },       \
	}

/*
 * Defines loom_op_<low>, the row of a forward op named "<low>" whose rules
 * are the file's shape_<low> and grad_<low>; the rest of the row (sources,
 * attributes, AMP class, flags) follows as designated initialisers.
 */
#define LOOM_FORWARD_OP(low, ...)                \
	const loom_op_def loom_op_##low = {      \
		.name = #low,                    \
		.kind = LOOM_OPK_FORWARD,        \
		.shape = shape_##low,            \
		.grad = grad_##low,              \
		__VA_ARGS__                      \
	}

static inline int loom_op_is_leaf(loom_op op)
{
	return loom_op_defs[op]->kind == LOOM_OPK_LEAF;
}

static inline int loom_op_is_view(loom_op op)
{
	return (loom_op_defs[op]->flags & LOOM_OPF_VIEW) != 0;
}

/* Builds the node n describes (see loom_shape_rule): checks that g has no
 * error and each source is a value of g, runs the op's shape rule, appends
 * the node with n's attributes and name. LOOM_NONE when refused. */
loom_value loom_op_build(loom_graph *g, loom_node *n);

/* A blank node of op op with nsrc sources, for loom_op_build. */
void loom_op_init(loom_node *n, loom_op op, int nsrc, const loom_value *src);
/* Builds a node of op from its nsrc sources alone: an op without
 * attributes (loom_op_init, then loom_op_build). */
loom_value loom_op_build_plain(loom_graph *g, loom_op op, int nsrc, const loom_value *src);
/* Shape rule of relu and the unary ops: a float input's shape and dtype. */
int loom_shape_like_input(loom_graph *g, loom_node *n);
/* Shape rule of layer norm and RMS norm (graph/ops/layernorm.c): x [..., C],
 * its 1-D parameters [C], eps > 0. */
int loom_shape_norm_rows(loom_graph *g, loom_node *n);

/* Checks shared by shape rules; each sets the graph's error naming the op
 * and the source (by its src_names entry) and returns 0 when it fails. */
int loom_check_value(loom_graph *g, loom_value v, const char *op, const char *what);
int loom_check_float(loom_graph *g, const loom_node *n, int i);
int loom_check_same_dtype(loom_graph *g, const loom_node *n, int i, int j);
int loom_check_ndim(loom_graph *g, const loom_node *n, int i, int ndim);
int loom_check_weight_bias(loom_graph *g, const loom_node *n, int ndim, const char *what);
int loom_is_float(loom_dtype dt);

/* An FP8_QDQ node (amp/amp_pass.c): x rounded through fp8 format fwd in
 * the forward, its gradient through bwd (LOOM_F32: none for either), with
 * x's dtype and shape, flagged LOOM_NODE_AMP. */
loom_value loom_fp8_qdq_node(loom_graph *g, loom_value x, loom_dtype fwd, loom_dtype bwd);

/*
 * A stored FP8_QDQ value (a.fp8.store): its numel fp8 codes (a.fp8.fwd's
 * format), then, at loom_fp8_scale_off, the f32 power-of-two scale they
 * were cast with. The scale travels with the codes, not in the training
 * state: a reader decodes what this node wrote in this run whatever ran
 * since (micro-steps, evaluation runs, a recomputed copy, a plan without
 * fp8 slots). A reader decodes code -> f32 -> times 1/scale -> the node's
 * dtype, the very steps by which an unstored FP8_QDQ writes its value.
 */
static inline int loom_fp8_stored(const loom_node *n)
{
	return n->op == LOOM_OP_FP8_QDQ && n->a.fp8.store;
}

static inline size_t loom_fp8_scale_off(int64_t numel)
{
	return ((size_t)numel + 3) & ~(size_t)3;
}

/* The bytes of a stored value of numel elements, before alignment. */
static inline size_t loom_fp8_stored_bytes(int64_t numel)
{
	return loom_fp8_scale_off(numel) + sizeof(float);
}

/* The stored FP8_QDQ node whose bytes v reads (v itself or a whole view
 * of it), or NULL. */
static inline const loom_node *loom_fp8_stored_under(const loom_graph *g, loom_value v)
{
	while (loom_op_is_view(g->nodes[v].op) && g->nodes[v].view_off == 0)
		v = g->nodes[v].src[0];
	return loom_fp8_stored(&g->nodes[v]) ? &g->nodes[v] : NULL;
}

/* Gradient rules: does source value src need a gradient; add grad to its
 * gradient (autodiff sums the shares of a value used more than once). */
int loom_grad_needed(void *ctx, loom_value src);
void loom_grad_accum(void *ctx, loom_value src, loom_value grad);

/* A backward node of op with like's dtype and shape (flagged BACKWARD). */
loom_value loom_grad_node(loom_graph *g, loom_op op, loom_value like, int nsrc,
			  const loom_value *src);
/* Where x needs a gradient: op(src) as one backward node shaped like x,
 * carrying the attributes *a (a forward node's) unless a is NULL, added to
 * x's gradient. */
void loom_grad_op(loom_graph *g, void *ctx, loom_value x, loom_op op, int nsrc,
		  const loom_value *src, const loom_attrs *a);
/* Column sums of dy (a bias gradient) shaped like the bias. */
loom_value loom_grad_channel_sum(loom_graph *g, loom_value dy, loom_value like);
/* A normalisation's dx and dgamma (batch, layer and RMS norm) where they
 * are needed: dx = data_op(x, gamma, dy), dgamma = gamma_op(x, dy), each
 * carrying the forward node's attributes. n is a copy of that node, not a
 * pointer into g (adding nodes may move them). */
void loom_grad_norm(loom_graph *g, const loom_node *n, loom_value dy, void *ctx, loom_op data_op,
		    loom_op gamma_op);
/* v [..., C] seen as [rows, C]: a view (no copy), for products and column
 * sums over every leading dim; v itself when it already has 2 dims. */
loom_value loom_grad_rows(loom_graph *g, loom_value v);
/* like-shaped x * scale, x a scalar. */
loom_value loom_grad_broadcast(loom_graph *g, loom_value x, loom_value like, double scale);
/* op(a) op(b) shaped like like. */
loom_value loom_grad_matmul(loom_graph *g, loom_value a, int ta, loom_value b, int tb,
			    loom_value like);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_GRAPH_OPS_OPS_H */
