/*
 * engine/cuda/sdpa_cudnn.cu — causal self-attention as one fused flash
 * attention: cuDNN's scaled dot-product attention (SDPA), its forward and
 * backward built as operation graphs through the cuDNN 9 backend API (C),
 * as the cuDNN frontend's SDPA node lowers them. CPU twin: the two-node
 * attention of engine/cpu/gpt.c (ATTN_PROBS then ATTENTION).
 *
 * Half q, k, v (f16 or bf16) straight from the fused qkv [B, T, 3C]; the
 * scores, softmax and its statistics in fp32 inside the kernel; no T x T
 * matrix in memory. The forward writes y and the softmax's log-sum-exp
 * (LSE, [B, NH, T] f32, the slot the memory plan places for the fused
 * ATTN_PROBS node); the backward reads qkv, y, the LSE and dy and writes
 * dq, dk, dv into dqkv. graph/fuse_attention.c rewrites the graph; this
 * file answers whether cuDNN takes a shape (loom_cuda_attn_fusable, before
 * the rewrite), builds the per-node plans (plan_create) and runs them.
 * Compiled, not run: no GPU in the session that wrote it.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cfloat>

#include "base/options.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_internal.h"

/* Unique ids of the graphs' tensors (variant pack). */
enum {
	UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEGINF, UID_DO, UID_DQ,
	UID_DK, UID_DV, UID_ONE, UID_SUM, UID_DQACC, UID_VIRTUAL = 100,
};

#define SDPA_MAX_DESC 160
#define SDPA_MAX_OPS 40
#define SDPA_MAX_CFG 8

/* One built graph: every descriptor stays alive with the execution plan. */
struct loom_sdpa_graph {
	cudnnBackendDescriptor_t d[SDPA_MAX_DESC];
	int n;
	cudnnBackendDescriptor_t ops[SDPA_MAX_OPS];
	int nops;
	cudnnBackendDescriptor_t plan; /* one of d[] */
	int64_t ws;                    /* the plan's workspace */
	int64_t next_uid;
	cudnnStatus_t st; /* the first failure, and what failed */
	const char *what;
};

/* ------------------------------------------------------------ builder */

static int bad(const loom_sdpa_graph *b)
{
	return b->st != CUDNN_STATUS_SUCCESS;
}

static void note(loom_sdpa_graph *b, cudnnStatus_t s, const char *what)
{
	if (s != CUDNN_STATUS_SUCCESS && !bad(b)) {
		b->st = s;
		b->what = what;
	}
}

static cudnnBackendDescriptor_t make(loom_sdpa_graph *b, cudnnBackendDescriptorType_t t,
				     const char *what)
{
	cudnnBackendDescriptor_t d = NULL;
	if (bad(b))
		return NULL;
	if (b->n == SDPA_MAX_DESC) {
		note(b, CUDNN_STATUS_ALLOC_FAILED, "too many descriptors");
		return NULL;
	}
	note(b, cudnnBackendCreateDescriptor(t, &d), what);
	if (!bad(b))
		b->d[b->n++] = d;
	return d;
}

static void set(loom_sdpa_graph *b, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a,
		cudnnBackendAttributeType_t t, int64_t n, const void *v, const char *what)
{
	if (!bad(b))
		note(b, cudnnBackendSetAttribute(d, a, t, n, v), what);
}

static void fin(loom_sdpa_graph *b, cudnnBackendDescriptor_t d, const char *what)
{
	if (!bad(b))
		note(b, cudnnBackendFinalize(d), what);
}

static void push_op(loom_sdpa_graph *b, cudnnBackendDescriptor_t op)
{
	if (bad(b))
		return;
	if (b->nops == SDPA_MAX_OPS) {
		note(b, CUDNN_STATUS_ALLOC_FAILED, "too many operations");
		return;
	}
	b->ops[b->nops++] = op;
}

/* One input or output of an operation: the attribute that names it, the
 * tensor or descriptor, and what an error calls it. */
typedef struct {
	cudnnBackendAttributeName_t attr;
	cudnnBackendDescriptor_t d;
	const char *what;
} sdpa_link;

/* An operation of type t over its n links (a NULL one is an input the
 * operation goes without: pointwise's b and t), finalized and appended to
 * the graph's operations. */
static void add_op(loom_sdpa_graph *b, cudnnBackendDescriptorType_t t, const char *what,
		   const sdpa_link *l, int n)
{
	cudnnBackendDescriptor_t op = make(b, t, what);
	for (int i = 0; i < n; i++)
		if (l[i].d)
			set(b, op, l[i].attr, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &l[i].d, l[i].what);
	fin(b, op, what);
	push_op(b, op);
}

/* A tensor: uid 0 takes the next virtual id. */
static cudnnBackendDescriptor_t tensor(loom_sdpa_graph *b, int64_t uid, cudnnDataType_t dt,
				       const int64_t dim[4], const int64_t str[4], int virt,
				       int by_value)
{
	cudnnBackendDescriptor_t t = make(b, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor");
	int64_t align = 16;
	bool v = virt != 0, bv = by_value != 0;
	if (uid == 0)
		uid = b->next_uid++;
	set(b, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor dtype");
	set(b, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim, "tensor dims");
	set(b, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str, "tensor strides");
	set(b, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
	set(b, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
	set(b, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v, "tensor virtual");
	if (by_value)
		set(b, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &bv, "tensor by value");
	fin(b, t, "tensor");
	return t;
}

static cudnnBackendDescriptor_t scalar(loom_sdpa_graph *b, int64_t uid)
{
	static const int64_t one[4] = { 1, 1, 1, 1 };
	return tensor(b, uid, CUDNN_DATA_FLOAT, one, one, 0, 1);
}

/* y = mode(x[, b2][, t]) (t: BINARY_SELECT's mask); axis >= 0: GEN_INDEX. */
static void pw(loom_sdpa_graph *b, cudnnPointwiseMode_t mode, cudnnDataType_t prec,
	       cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b2, cudnnBackendDescriptor_t t,
	       cudnnBackendDescriptor_t y, int64_t axis)
{
	cudnnBackendDescriptor_t d = make(b, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise");
	set(b, d, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
	set(b, d, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise precision");
	if (axis >= 0)
		set(b, d, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
	fin(b, d, "pointwise");
	const sdpa_link l[] = {
		{ CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, d, "pointwise op desc" },
		{ CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pointwise x" },
		{ CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b2, "pointwise b" },
		{ CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, "pointwise t" },
		{ CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pointwise y" },
	};
	add_op(b, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise op", l, 5);
}

/* c = a b, fp32 accumulation. */
static void mm(loom_sdpa_graph *b, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t bb,
	       cudnnBackendDescriptor_t c)
{
	cudnnDataType_t f = CUDNN_DATA_FLOAT;
	cudnnBackendDescriptor_t d = make(b, CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul");
	set(b, d, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f, "matmul compute type");
	fin(b, d, "matmul");
	const sdpa_link l[] = {
		{ CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "matmul a" },
		{ CUDNN_ATTR_OPERATION_MATMUL_BDESC, bb, "matmul b" },
		{ CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "matmul c" },
		{ CUDNN_ATTR_OPERATION_MATMUL_DESC, d, "matmul op desc" },
	};
	add_op(b, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul op", l, 4);
}

/* y = the reduction of x over the dims where y is 1. */
static void red(loom_sdpa_graph *b, cudnnReduceTensorOp_t o, cudnnBackendDescriptor_t x,
		cudnnBackendDescriptor_t y)
{
	cudnnDataType_t f = CUDNN_DATA_FLOAT;
	cudnnBackendDescriptor_t d = make(b, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction");
	set(b, d, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &o,
	    "reduction operator");
	set(b, d, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f, "reduction compute type");
	fin(b, d, "reduction");
	const sdpa_link l[] = {
		{ CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "reduction x" },
		{ CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "reduction y" },
		{ CUDNN_ATTR_OPERATION_REDUCTION_DESC, d, "reduction op desc" },
	};
	add_op(b, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction op", l, 3);
}

/* y = x seen with y's dims and strides (a transpose). */
static void reshape(loom_sdpa_graph *b, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y)
{
	const sdpa_link l[] = {
		{ CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, "reshape x" },
		{ CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, "reshape y" },
	};
	add_op(b, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape op", l, 2);
}

/* The operation graph, the heuristic's engine configurations (mode A),
 * and the first whose execution plan finalizes; its workspace size. */
static void finish(loom_sdpa_graph *b, cudnnHandle_t h)
{
	cudnnBackendDescriptor_t g = make(b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
	set(b, g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h, "graph handle");
	set(b, g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, b->nops, b->ops,
	    "graph operations");
	fin(b, g, "operation graph");
	cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
	cudnnBackendDescriptor_t heur = make(b, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristic");
	set(b, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g,
	    "heuristic graph");
	set(b, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristic mode");
	fin(b, heur, "heuristic");
	if (bad(b))
		return;
	int64_t count = 0;
	note(b, cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
					 CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL),
	     "heuristic results");
	if (bad(b))
		return;
	if (count <= 0) {
		note(b, CUDNN_STATUS_NOT_SUPPORTED, "heuristic: no engine configuration");
		return;
	}
	if (count > SDPA_MAX_CFG)
		count = SDPA_MAX_CFG;
	cudnnBackendDescriptor_t cfg[SDPA_MAX_CFG];
	for (int64_t i = 0; i < count; i++)
		cfg[i] = make(b, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine configuration");
	if (bad(b))
		return;
	int64_t got = 0;
	note(b, cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
					 CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfg),
	     "heuristic results");
	cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;
	for (int64_t i = 0; i < got && !bad(b); i++) {
		cudnnBackendDescriptor_t p = make(b, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan");
		set(b, p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h, "plan handle");
		set(b, p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
		    &cfg[i], "plan engine configuration");
		if (bad(b))
			return;
		/* An engine that refuses this graph: try the next one. */
		if ((last = cudnnBackendFinalize(p)) != CUDNN_STATUS_SUCCESS)
			continue;
		int64_t n = 0;
		note(b, cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
						 CUDNN_TYPE_INT64, 1, &n, &b->ws),
		     "plan workspace size");
		if (!bad(b))
			b->plan = p;
		return;
	}
	note(b, last, "execution plan: no engine configuration finalized");
}

/* ------------------------------------------------------------ graphs */

/* The geometry: qkv [B, T, 3C] as q, k, v [B, NH, T, hs] at columns 0, C
 * and 2C; y, dy [B, T, C]. */
typedef struct sdpa_shape {
	int64_t b, t, nh, hs, c;
	cudnnDataType_t dt;
} sdpa_shape;

static void strides_qkv(const sdpa_shape *s, int64_t dim[4], int64_t str[4], int trans)
{
	const int64_t c3 = 3 * s->c;
	dim[0] = s->b, dim[1] = s->nh, dim[2] = trans ? s->hs : s->t, dim[3] = trans ? s->t : s->hs;
	str[0] = s->t * c3, str[1] = s->hs, str[2] = trans ? 1 : c3, str[3] = trans ? c3 : 1;
}

static void strides_y(const sdpa_shape *s, int64_t dim[4], int64_t str[4])
{
	dim[0] = s->b, dim[1] = s->nh, dim[2] = s->t, dim[3] = s->hs;
	str[0] = s->t * s->c, str[1] = s->hs, str[2] = s->c, str[3] = 1;
}

/* [B, NH, T, T] (transposed: the last two swapped in memory order). */
static void strides_tt(const sdpa_shape *s, int64_t dim[4], int64_t str[4], int trans)
{
	dim[0] = s->b, dim[1] = s->nh, dim[2] = s->t, dim[3] = s->t;
	str[0] = s->nh * s->t * s->t, str[1] = s->t * s->t, str[2] = trans ? 1 : s->t,
	str[3] = trans ? s->t : 1;
}

/* [B, NH, T, 1]: the row statistics. */
static void strides_row(const sdpa_shape *s, int64_t dim[4], int64_t str[4])
{
	dim[0] = s->b, dim[1] = s->nh, dim[2] = s->t, dim[3] = 1;
	str[0] = s->nh * s->t, str[1] = s->t, str[2] = 1, str[3] = 1;
}

/* S = scale q k^T with j > i set to -inf: the causal scores, fp32. scale:
 * the graph's one tensor of that uid (the backward reads it again). */
static cudnnBackendDescriptor_t causal_scores(loom_sdpa_graph *b, const sdpa_shape *s,
					      cudnnBackendDescriptor_t q, cudnnBackendDescriptor_t kt,
					      cudnnBackendDescriptor_t scale)
{
	int64_t dim[4], str[4];
	strides_tt(s, dim, str, 0);
	cudnnBackendDescriptor_t sc = tensor(b, 0, CUDNN_DATA_FLOAT, dim, str, 1, 0);
	mm(b, q, kt, sc);
	cudnnBackendDescriptor_t s1 = tensor(b, 0, CUDNN_DATA_FLOAT, dim, str, 1, 0);
	pw(b, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, sc, scale, NULL, s1, -1);
	cudnnBackendDescriptor_t row = tensor(b, 0, CUDNN_DATA_INT32, dim, str, 1, 0);
	cudnnBackendDescriptor_t col = tensor(b, 0, CUDNN_DATA_INT32, dim, str, 1, 0);
	pw(b, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, s1, NULL, NULL, row, 2);
	pw(b, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, s1, NULL, NULL, col, 3);
	cudnnBackendDescriptor_t keep = tensor(b, 0, CUDNN_DATA_BOOLEAN, dim, str, 1, 0);
	pw(b, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, NULL, keep, -1);
	cudnnBackendDescriptor_t neginf = scalar(b, UID_NEGINF);
	cudnnBackendDescriptor_t s2 = tensor(b, 0, CUDNN_DATA_FLOAT, dim, str, 1, 0);
	pw(b, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s1, neginf, keep, s2, -1);
	return s2;
}

/* Forward: y = softmax(S) v and the LSE = max + log(sum exp(S - max)). */
static void build_fwd(loom_sdpa_graph *b, const sdpa_shape *s)
{
	int64_t dim[4], str[4], rdim[4], rstr[4];
	strides_qkv(s, dim, str, 0);
	cudnnBackendDescriptor_t q = tensor(b, UID_Q, s->dt, dim, str, 0, 0);
	cudnnBackendDescriptor_t v = tensor(b, UID_V, s->dt, dim, str, 0, 0);
	strides_qkv(s, dim, str, 1);
	cudnnBackendDescriptor_t kt = tensor(b, UID_K, s->dt, dim, str, 0, 0);
	strides_y(s, dim, str);
	cudnnBackendDescriptor_t o = tensor(b, UID_O, s->dt, dim, str, 0, 0);
	strides_row(s, rdim, rstr);
	cudnnBackendDescriptor_t stats = tensor(b, UID_STATS, CUDNN_DATA_FLOAT, rdim, rstr, 0, 0);

	cudnnBackendDescriptor_t sc = causal_scores(b, s, q, kt, scalar(b, UID_SCALE));
	strides_tt(s, dim, str, 0);
	cudnnBackendDescriptor_t mx = tensor(b, 0, CUDNN_DATA_FLOAT, rdim, rstr, 1, 0);
	red(b, CUDNN_REDUCE_TENSOR_MAX, sc, mx);
	cudnnBackendDescriptor_t sub = tensor(b, 0, CUDNN_DATA_FLOAT, dim, str, 1, 0);
	pw(b, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, sc, mx, NULL, sub, -1);
	cudnnBackendDescriptor_t ex = tensor(b, 0, CUDNN_DATA_FLOAT, dim, str, 1, 0);
	pw(b, CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, sub, NULL, NULL, ex, -1);
	cudnnBackendDescriptor_t sum = tensor(b, 0, CUDNN_DATA_FLOAT, rdim, rstr, 1, 0);
	red(b, CUDNN_REDUCE_TENSOR_ADD, ex, sum);
	cudnnBackendDescriptor_t lg = tensor(b, 0, CUDNN_DATA_FLOAT, rdim, rstr, 1, 0);
	pw(b, CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, sum, NULL, NULL, lg, -1);
	pw(b, CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, mx, lg, NULL, stats, -1);
	/* P in the io dtype: the second product's A operand (as cuDNN asks). */
	cudnnBackendDescriptor_t p = tensor(b, 0, s->dt, dim, str, 1, 0);
	pw(b, CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, ex, sum, NULL, p, -1);
	mm(b, p, v, o);
}

/* Backward: P = exp(S - LSE); dv = P^T dy; dS = scale P (dy v^T - rowsum(dy o));
 * dk = dS^T q; dq = dS k (fp32 accumulator, then dq). */
static void build_bwd(loom_sdpa_graph *b, const sdpa_shape *s)
{
	int64_t dim[4], str[4], rdim[4], rstr[4];
	strides_qkv(s, dim, str, 0);
	cudnnBackendDescriptor_t q = tensor(b, UID_Q, s->dt, dim, str, 0, 0);
	cudnnBackendDescriptor_t dq = tensor(b, UID_DQ, s->dt, dim, str, 0, 0);
	cudnnBackendDescriptor_t dk = tensor(b, UID_DK, s->dt, dim, str, 0, 0);
	cudnnBackendDescriptor_t dv = tensor(b, UID_DV, s->dt, dim, str, 0, 0);
	int64_t kdim[4], kstr[4];
	strides_qkv(s, kdim, kstr, 1);
	cudnnBackendDescriptor_t kt = tensor(b, UID_K, s->dt, kdim, kstr, 0, 0);
	cudnnBackendDescriptor_t vt = tensor(b, UID_V, s->dt, kdim, kstr, 0, 0);
	int64_t ydim[4], ystr[4];
	strides_y(s, ydim, ystr);
	cudnnBackendDescriptor_t o = tensor(b, UID_O, s->dt, ydim, ystr, 0, 0);
	cudnnBackendDescriptor_t dout = tensor(b, UID_DO, s->dt, ydim, ystr, 0, 0);
	strides_row(s, rdim, rstr);
	cudnnBackendDescriptor_t stats = tensor(b, UID_STATS, CUDNN_DATA_FLOAT, rdim, rstr, 0, 0);

	/* rowsum(dy o), through workspace as the frontend keeps it. */
	int64_t hdim[4] = { s->b, s->nh, s->t, s->hs };
	int64_t hstr[4] = { s->nh * s->t * s->hs, s->t * s->hs, s->nh * s->hs, 1 };
	cudnnBackendDescriptor_t doo = tensor(b, 0, CUDNN_DATA_FLOAT, hdim, hstr, 1, 0);
	pw(b, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dout, o, NULL, doo, -1);
	cudnnBackendDescriptor_t rs = tensor(b, 0, CUDNN_DATA_FLOAT, rdim, rstr, 1, 0);
	red(b, CUDNN_REDUCE_TENSOR_ADD, doo, rs);
	cudnnBackendDescriptor_t one = scalar(b, UID_ONE);
	cudnnBackendDescriptor_t ssum = tensor(b, UID_SUM, CUDNN_DATA_FLOAT, rdim, rstr, 0, 0);
	pw(b, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, rs, one, NULL, ssum, -1);

	/* P = exp(S - LSE), dv = P^T dy. */
	cudnnBackendDescriptor_t scale = scalar(b, UID_SCALE);
	cudnnBackendDescriptor_t sc = causal_scores(b, s, q, kt, scale);
	strides_tt(s, dim, str, 0);
	cudnnBackendDescriptor_t sub = tensor(b, 0, CUDNN_DATA_FLOAT, dim, str, 1, 0);
	pw(b, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, sc, stats, NULL, sub, -1);
	cudnnBackendDescriptor_t p = tensor(b, 0, CUDNN_DATA_FLOAT, dim, str, 1, 0);
	pw(b, CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, sub, NULL, NULL, p, -1);
	int64_t tdim[4], tstr[4];
	strides_tt(s, tdim, tstr, 1);
	cudnnBackendDescriptor_t pt = tensor(b, 0, s->dt, tdim, tstr, 1, 0);
	reshape(b, p, pt);
	mm(b, pt, dout, dv);

	/* dS = scale P (dP - rowsum), dP = dy v^T. */
	cudnnBackendDescriptor_t dp = tensor(b, 0, CUDNN_DATA_FLOAT, dim, str, 1, 0);
	mm(b, dout, vt, dp);
	cudnnBackendDescriptor_t dp1 = tensor(b, 0, CUDNN_DATA_FLOAT, dim, str, 1, 0);
	pw(b, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, dp, ssum, NULL, dp1, -1);
	cudnnBackendDescriptor_t dp2 = tensor(b, 0, CUDNN_DATA_FLOAT, dim, str, 1, 0);
	pw(b, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dp1, p, NULL, dp2, -1);
	cudnnBackendDescriptor_t ds = tensor(b, 0, CUDNN_DATA_FLOAT, dim, str, 1, 0);
	pw(b, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dp2, scale, NULL, ds, -1);

	/* dk = dS^T q. */
	cudnnBackendDescriptor_t dst = tensor(b, 0, s->dt, tdim, tstr, 1, 0);
	reshape(b, ds, dst);
	mm(b, dst, q, dk);

	/* dq = dS k into an fp32 accumulator (workspace, zeroed), then dq. k
	 * is k^T seen back (a view); the frontend leaves its virtual dtype
	 * the graph's intermediate one, fp32, and so does this. */
	strides_qkv(s, dim, str, 0);
	cudnnBackendDescriptor_t k = tensor(b, 0, CUDNN_DATA_FLOAT, dim, str, 1, 0);
	reshape(b, kt, k);
	int64_t adim[4] = { s->b, s->nh, s->t, s->hs };
	int64_t astr[4] = { s->nh * s->t * s->hs, s->t * s->hs, s->hs, 1 };
	cudnnBackendDescriptor_t acc = tensor(b, UID_DQACC, CUDNN_DATA_FLOAT, adim, astr, 0, 0);
	mm(b, ds, k, acc);
	pw(b, CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, acc, NULL, NULL, dq, -1);
}

static void graph_free(loom_sdpa_graph *b)
{
	if (!b)
		return;
	for (int i = b->n - 1; i >= 0; i--)
		(void)cudnnBackendDestroyDescriptor(b->d[i]);
	free(b);
}

/* Builds the forward or backward graph of shape s on handle h. NULL with
 * why filled when cuDNN refuses it (or memory runs out). */
static loom_sdpa_graph *graph_make(cudnnHandle_t h, const sdpa_shape *s, int bwd, char *why,
				   size_t len)
{
	loom_sdpa_graph *b = (loom_sdpa_graph *)calloc(1, sizeof(*b));
	if (!b) {
		snprintf(why, len, "out of host memory");
		return NULL;
	}
	b->next_uid = UID_VIRTUAL;
	if (bwd)
		build_bwd(b, s);
	else
		build_fwd(b, s);
	if (!bad(b))
		finish(b, h);
	if (bad(b) || !b->plan) {
		char last[256] = "";
		cudnnGetLastErrorString(last, sizeof(last));
		snprintf(why, len, "cuDNN refused the %s graph: %s: %s%s%s", bwd ? "backward" : "forward",
			 b->what ? b->what : "execution plan", cudnnGetErrorString(b->st),
			 last[0] ? ": " : "", last);
		graph_free(b);
		return NULL;
	}
	return b;
}

extern "C" int loom_cuda_test_sdpa_descriptors(int64_t b, int64_t t, int64_t nh, int64_t hs,
					       int bf16, int bwd, char *why, size_t len)
{
	sdpa_shape s = { b, t, nh, hs, nh * hs, bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF };
	loom_sdpa_graph *g = (loom_sdpa_graph *)calloc(1, sizeof(*g));
	if (!g) {
		snprintf(why, len, "out of host memory");
		return 0;
	}
	g->next_uid = UID_VIRTUAL;
	if (bwd)
		build_bwd(g, &s);
	else
		build_fwd(g, &s);
	int ok = !bad(g);
	if (!ok) {
		char last[256] = "";
		cudnnGetLastErrorString(last, sizeof(last));
		snprintf(why, len, "%s: %s%s%s", g->what, cudnnGetErrorString(g->st), last[0] ? ": " : "",
			 last);
	}
	graph_free(g);
	return ok;
}

/* ------------------------------------------------------------ the switch and the check */

/* LOOM_CUDA_ATTN: "sdpa" (default) or "unfused", a row for tests and
 * debugging: the unfused path, the fallback where SDPA cannot run, forced
 * where it could (measured 1.37x slower on GPT-2). */
static int attn_unfused(void)
{
	return loom_opt_choice(LOOM_OPT_CUDA_ATTN) == 1; /* sdpa|unfused */
}

static int sdpa_shape_of(const loom_graph *g, loom_value probs, sdpa_shape *s)
{
	const loom_node *p = &g->nodes[probs], *q = &g->nodes[p->src[0]];
	s->b = q->shape.dims[0];
	s->t = q->shape.dims[1];
	s->c = q->shape.dims[2] / 3;
	s->nh = p->a.attn.n_head;
	s->hs = s->nh ? s->c / s->nh : 0;
	s->dt = loom_cudnn_data_type(q->dtype);
	return q->dtype == LOOM_F16 || q->dtype == LOOM_BF16;
}

/* What the check found per shape, for this process (the pass asks before
 * the backend's context exists; --dump-graph says why a node was left
 * unfused). */
typedef struct sdpa_verdict {
	sdpa_shape s;
	int train, ok;
	char why[320];
} sdpa_verdict;

#define SDPA_VERDICTS 32
static sdpa_verdict verdicts[SDPA_VERDICTS];
static int n_verdicts;
static pthread_mutex_t verdict_lock = PTHREAD_MUTEX_INITIALIZER;

static const sdpa_verdict *verdict_find(const sdpa_shape *s, int train)
{
	for (int i = 0; i < n_verdicts; i++)
		if (!memcmp(&verdicts[i].s, s, sizeof(*s)) && verdicts[i].train == train)
			return &verdicts[i];
	return NULL;
}

/* Builds (and frees) the graphs on a handle of its own, once per shape. */
static void check_shape(const sdpa_shape *s, int train, int *ok, char *why, size_t len)
{
	cudnnHandle_t h = NULL;
	cudnnStatus_t st;
	*ok = 0;
	if (s->hs % 8 != 0) {
		snprintf(why, len, "head size %lld is not a multiple of 8", (long long)s->hs);
		return;
	}
	if ((st = cudnnCreate(&h)) != CUDNN_STATUS_SUCCESS) {
		snprintf(why, len, "cudnnCreate: %s", cudnnGetErrorString(st));
		return;
	}
	loom_sdpa_graph *f = graph_make(h, s, 0, why, len), *b = NULL;
	if (f && train)
		b = graph_make(h, s, 1, why, len);
	*ok = f && (!train || b);
	graph_free(f);
	graph_free(b);
	(void)cudnnDestroy(h);
}

extern "C" int loom_cuda_attn_fusable(const loom_graph *g, loom_value probs, int train)
{
	sdpa_shape s;
	memset(&s, 0, sizeof(s));
	/* The switch, and the test hook that takes every fallback. */
	if (attn_unfused() || loom_cuda_own_kernels_on || !sdpa_shape_of(g, probs, &s))
		return 0;
	pthread_mutex_lock(&verdict_lock);
	const sdpa_verdict *v = verdict_find(&s, train);
	int ok;
	if (v) {
		ok = v->ok;
	} else {
		sdpa_verdict nv;
		memset(&nv, 0, sizeof(nv));
		nv.s = s;
		nv.train = train;
		check_shape(&s, train, &nv.ok, nv.why, sizeof(nv.why));
		ok = nv.ok;
		if (n_verdicts < SDPA_VERDICTS)
			verdicts[n_verdicts++] = nv;
	}
	pthread_mutex_unlock(&verdict_lock);
	return ok;
}

int loom_cuda_sdpa_off(void)
{
	return attn_unfused() ? 1 : loom_cuda_own_kernels_on ? 2 : 0;
}

void loom_cuda_sdpa_note(const loom_plan *p, loom_value v, const loom_cuda_node_plan *np, int off,
			 char *buf, size_t len)
{
	const loom_node *n = &p->g->nodes[v];
	buf[0] = 0;
	if (n->op != LOOM_OP_ATTN_PROBS && n->op != LOOM_OP_ATTN_PROBS_BWD)
		return;
	if (n->a.attn.fused) {
		if (np->kind == LOOM_CUDA_PLAN_SDPA)
			snprintf(buf, len, "cuDNN SDPA (flash, causal) %s, workspace %.2f MiB%s",
				 n->op == LOOM_OP_ATTN_PROBS ? "forward: y and the LSE" : "backward: dq, dk, dv",
				 np->ws / 1048576.0,
				 n->op == LOOM_OP_ATTN_PROBS ? "; this value is the LSE [B, NH, T] f32" : "");
		return;
	}
	if (n->op != LOOM_OP_ATTN_PROBS)
		return;
	if (off) {
		snprintf(buf, len, "unfused attention: %s",
			 off == 1 ? "LOOM_CUDA_ATTN=unfused" : "the own-kernels test hook");
		return;
	}
	sdpa_shape s;
	memset(&s, 0, sizeof(s));
	if (!sdpa_shape_of(p->g, v, &s)) {
		snprintf(buf, len, "unfused attention: cuDNN's SDPA takes f16 or bf16 q, k, v, not %s",
			 loom_dtype_name(p->g->nodes[n->src[0]].dtype));
		return;
	}
	pthread_mutex_lock(&verdict_lock);
	const sdpa_verdict *vd = verdict_find(&s, 1);
	if (!vd)
		vd = verdict_find(&s, 0);
	if (vd && !vd->ok)
		snprintf(buf, len, "unfused attention: %s", vd->why);
	else
		snprintf(buf, len, "unfused attention: the graph around it is not the fused pattern");
	pthread_mutex_unlock(&verdict_lock);
}

/* ------------------------------------------------------------ plans and runs */

static size_t row_bytes(const sdpa_shape *s)
{
	return loom_cuda_align(sizeof(float) * (size_t)(s->b * s->nh * s->t));
}

static size_t acc_bytes(const sdpa_shape *s)
{
	return loom_cuda_align(sizeof(float) * (size_t)(s->b * s->nh * s->t * s->hs));
}

loom_status loom_cuda_sdpa_plan_make(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
				     loom_cuda_node_plan *np)
{
	const loom_graph *g = p->g;
	const loom_node *n = &g->nodes[v];
	const int bwd = n->op == LOOM_OP_ATTN_PROBS_BWD;
	loom_value probs = bwd ? n->src[1] : v;
	char why[320], lb[96];
	sdpa_shape s;
	memset(&s, 0, sizeof(s));
	if (!sdpa_shape_of(g, probs, &s))
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_UNSUPPORTED, "%s: fused attention needs f16 or bf16 qkv",
				 loom_node_label(g, v, lb, sizeof(lb)));
	loom_sdpa_graph *gr = graph_make(c->dnn, &s, bwd, why, sizeof(why));
	if (!gr)
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_UNSUPPORTED,
				 "%s: %s (it was accepted when the graph was fused; "
				 "LOOM_CUDA_ATTN=unfused keeps the unfused attention)",
				 loom_node_label(g, v, lb, sizeof(lb)), why);
	np->kind = LOOM_CUDA_PLAN_SDPA;
	np->sdpa.g = gr;
	np->sdpa.y = LOOM_NONE;
	np->lib_ws = loom_cuda_align((size_t)gr->ws);
	np->ws = np->lib_ws;
	if (bwd) {
		np->ws += row_bytes(&s) + acc_bytes(&s);
	} else {
		for (loom_value u = v + 1; u < g->n; u++)
			if (g->nodes[u].op == LOOM_OP_ATTENTION && g->nodes[u].made_by == v)
				np->sdpa.y = u;
		if (np->sdpa.y == LOOM_NONE)
			return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_INVALID, "%s: fused, but no attention node made by it",
					 loom_node_label(g, v, lb, sizeof(lb)));
	}
	return LOOM_OK;
}

void loom_cuda_sdpa_plan_free(loom_cuda_node_plan *np)
{
	graph_free(np->sdpa.g);
	np->sdpa.g = NULL;
}

static loom_status execute(loom_cuda_ctx *c, const loom_sdpa_graph *gr, int n, const int64_t *uids,
			   void *const *ptrs, void *ws)
{
	cudnnBackendDescriptor_t vp = NULL;
	loom_status st = LOOM_CUDNN_CHECK(cudnnBackendCreateDescriptor(
						  CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp),
					  c->err, sizeof(c->err));
	if (st != LOOM_OK)
		return st;
	if ((st = LOOM_CUDNN_CHECK(cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
							    CUDNN_TYPE_INT64, n, uids),
				   c->err, sizeof(c->err))) == LOOM_OK &&
	    (st = LOOM_CUDNN_CHECK(cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
							    CUDNN_TYPE_VOID_PTR, n, ptrs),
				   c->err, sizeof(c->err))) == LOOM_OK &&
	    (st = LOOM_CUDNN_CHECK(cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
							    CUDNN_TYPE_VOID_PTR, 1, &ws),
				   c->err, sizeof(c->err))) == LOOM_OK &&
	    (st = LOOM_CUDNN_CHECK(cudnnBackendFinalize(vp), c->err, sizeof(c->err))) == LOOM_OK)
		st = LOOM_CUDNN_CHECK(cudnnBackendExecute(c->dnn, gr->plan, vp), c->err, sizeof(c->err));
	(void)cudnnBackendDestroyDescriptor(vp);
	return st;
}

/* The masked scores' fill: -inf from cuDNN 9.1, the lowest float before. */
static float neg_inf(void)
{
	return cudnnGetVersion() >= 90100 ? -INFINITY : -FLT_MAX;
}

/* Fused ATTN_PROBS: src[0] qkv; out the LSE; y (the ATTENTION node it
 * makes) at its own place. */
loom_status loom_cuda_sdpa_fwd(loom_cuda_ctx *c, const loom_plan *p, loom_value v,
			       const loom_cuda_node_plan *np, const loom_cuda_io *io)
{
	sdpa_shape s;
	memset(&s, 0, sizeof(s));
	sdpa_shape_of(p->g, v, &s);
	if (s.b * s.t * s.c == 0)
		return LOOM_OK;
	const size_t e = loom_dtype_size((loom_dtype)io->dt[0]);
	char *qkv = (char *)io->src[0];
	float scale = (float)(1.0 / sqrt((double)s.hs)), ninf = neg_inf();
	int64_t uids[7] = { UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEGINF };
	void *ptrs[7] = { qkv, qkv + (size_t)s.c * e, qkv + (size_t)2 * s.c * e,
			  loom_arena_ptr(c->arena, p, np->sdpa.y), io->out, &scale, &ninf };
	return execute(c, np->sdpa.g, 7, uids, ptrs, c->arena->ws);
}

/* Fused ATTN_PROBS_BWD: src (qkv, LSE, dy, y); out dqkv. */
loom_status loom_cuda_sdpa_bwd(loom_cuda_ctx *c, const loom_plan *p, loom_value v,
			       const loom_cuda_node_plan *np, const loom_cuda_io *io)
{
	sdpa_shape s;
	memset(&s, 0, sizeof(s));
	sdpa_shape_of(p->g, p->g->nodes[v].src[1], &s);
	if (s.b * s.t * s.c == 0)
		return LOOM_OK;
	const size_t e = loom_dtype_size((loom_dtype)io->dt[0]);
	char *qkv = (char *)io->src[0], *d = (char *)io->out;
	char *ws = (char *)c->arena->ws;
	void *sum = ws + np->lib_ws, *acc = ws + np->lib_ws + row_bytes(&s);
	loom_status st = LOOM_CUDA_CHECK(cudaMemsetAsync(acc, 0, acc_bytes(&s), c->stream), c->err,
					 sizeof(c->err));
	if (st != LOOM_OK)
		return st;
	float scale = (float)(1.0 / sqrt((double)s.hs)), ninf = neg_inf(), one = 1.0f;
	int64_t uids[14] = { UID_Q,  UID_K,  UID_V,     UID_O,      UID_DO,  UID_STATS, UID_DQ,
			     UID_DK, UID_DV, UID_SCALE, UID_NEGINF, UID_ONE, UID_SUM,   UID_DQACC };
	void *ptrs[14] = { qkv, qkv + (size_t)s.c * e, qkv + (size_t)2 * s.c * e, io->src[3],
			   io->src[2], io->src[1], d, d + (size_t)s.c * e, d + (size_t)2 * s.c * e,
			   &scale, &ninf, &one, sum, acc };
	return execute(c, np->sdpa.g, 14, uids, ptrs, ws);
}
