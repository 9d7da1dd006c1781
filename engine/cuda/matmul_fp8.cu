/*
 * engine/cuda/matmul_fp8.cu — the FP8 product (LOOM_CUDA_FP8_GEMM=1): a
 * LINEAR or MATMUL whose two operands are FP8_QDQ outputs, directly or
 * through reshapes (E4M3 forward; an E5M2 gradient against an E4M3
 * operand backward) runs on cuBLASLt's FP8 tensor cores: each operand
 * cast into a 1-byte copy in ws with its QDQ's own scale (exact: the
 * QDQ's values are fp8 values over that scale), cuBLASLt told the
 * inverse scales (A_SCALE_POINTER, B_SCALE_POINTER), fp32 accumulation,
 * bf16 D. The numbers are the emulation's but for the order of the fp32
 * sums (and, under LOOM_CUDA_FP8_FAST_ACCUM, their precision: below).
 * Anything else — a
 * source that is not a QDQ, a dimension not a multiple of 16, no
 * algorithm, a backward product of a forward QDQ under pipeline stages —
 * is left to the plain product (matmul_cublaslt.cu), which
 * computes the emulation on the QDQ'd bf16 values.
 *
 * FP8 wants the "TN" layout (cuBLAS's A transposed, B not): in loom's
 * row-major terms A [m, k] and B [n, k], i.e. a linear's forward as it
 * is; a backward's operands stored the other way round are cast
 * transposed (fp8.cu's cast_transpose), as Transformer Engine does.
 *
 * Fast accumulation (LOOM_CUDA_FP8_FAST_ACCUM, off unless fwd or all):
 * by default cuBLASLt's FP8 kernels on Hopper promote the tensor cores'
 * partial sums into fp32 registers every few k-steps, since the cores'
 * own accumulator keeps fewer bits; CUBLASLT_MATMUL_DESC_FAST_ACCUM
 * skips the promotion, faster and less exact. Transformer Engine's
 * default recipe turns it on for the forward's products and off for the
 * data and weight gradients (split accumulation); fwd does the same by
 * the node's backward flag, all everywhere.
 *
 * FP8 storage: under the switch the backend's reads_fp8 says yes to these
 * products' operands (loom_cuda_mm_fp8_reads, the rule on the graph), so
 * the fp8 storage pass keeps a QDQ only they read as its 1-byte codes; the
 * product reads them where they are when the layout fits (no cast), and
 * transposes the codes into ws when it does not.
 */
#include <stdio.h>
#include <string.h>

#include "base/options.h"
#include "engine/cuda/cuda_internal.h"

extern "C" {
#include "graph/ops/ops.h"
}

typedef struct fp8_shape {
	int64_t m, n, k; /* C[m, n] = op(A)[m, k] op(B)[k, n], loom's row-major */
	int ta, tb;
} fp8_shape;

/* As matmul_cublaslt.cu's mm_shape_of: values of more than 2 dims are
 * their rows. */
static void shape_of(const loom_graph *g, const loom_node *nd, fp8_shape *s)
{
	const loom_node *a = &g->nodes[nd->src[0]], *b = &g->nodes[nd->src[1]];
	if (nd->op == LOOM_OP_LINEAR) { /* x[N, in] w[out, in]^T */
		s->ta = 0, s->tb = 1;
		s->m = loom_shape_rows(&a->shape), s->k = loom_shape_last(&a->shape);
		s->n = b->shape.dims[0];
		return;
	}
	s->ta = nd->a.mm.ta, s->tb = nd->a.mm.tb;
	s->m = loom_shape_rows(&nd->shape), s->n = loom_shape_last(&nd->shape);
	s->k = s->ta ? loom_shape_rows(&a->shape) : loom_shape_last(&a->shape);
}

/* The FP8_QDQ node whose bytes value x is, through reshapes (the
 * backward's products read a QDQ output as [rows, last]: the same bytes,
 * row-major), LOOM_NONE if none; its fp8 format in *fmt. */
static loom_value qdq_of(const loom_graph *g, loom_value x, int *fmt)
{
	while (g->nodes[x].op == LOOM_OP_RESHAPE)
		x = g->nodes[x].src[0];
	const loom_node *q = &g->nodes[x];
	*fmt = q->op == LOOM_OP_FP8_QDQ &&
			       (q->a.fp8.fwd == LOOM_FP8_E4M3 || q->a.fp8.fwd == LOOM_FP8_E5M2) ?
		       q->a.fp8.fwd : 0;
	return *fmt ? x : LOOM_NONE;
}

/* Whether node q is a step of this rank's plan: its kernel writes the
 * scale the cast and cuBLASLt read (a pipeline stage may receive a
 * value whose QDQ ran on another). */
static int runs_here(const loom_plan *p, loom_value q)
{
	return loom_step_of(p, q) >= 0;
}

/* The rule on the graph alone (the fp8 storage pass asks it before a
 * plan exists): a bf16 product of two bf16 QDQ outputs (q[], formats
 * fmt[]), not both E5M2 (cuBLASLt has no E5M2 x E5M2), every dimension a
 * multiple of 16 (FP8's 16-byte leading dimensions, with room to spare). */
static int fp8_takes_graph(const loom_graph *g, loom_value v, fp8_shape *s, int fmt[2],
			   loom_value q[2])
{
	const loom_node *nd = &g->nodes[v];
	if ((nd->op != LOOM_OP_LINEAR && nd->op != LOOM_OP_MATMUL) || nd->dtype != LOOM_BF16)
		return 0;
	for (int i = 0; i < 2; i++)
		if ((q[i] = qdq_of(g, nd->src[i], &fmt[i])) == LOOM_NONE ||
		    g->nodes[nd->src[i]].dtype != LOOM_BF16)
			return 0;
	if (fmt[0] == LOOM_FP8_E5M2 && fmt[1] == LOOM_FP8_E5M2)
		return 0;
	shape_of(g, nd, s);
	return s->m > 0 && s->n > 0 && s->k > 0 && s->m % 16 == 0 && s->n % 16 == 0 &&
	       s->k % 16 == 0 && s->m <= INT32_MAX && s->n <= INT32_MAX && s->k <= INT32_MAX;
}

/* Whether backward product v reads a forward QDQ's scale under pipeline
 * stages: the slot is the node's, not the micro-batch's, and a stage
 * runs later micro-batches' forwards (GPipe, 1F1B) before an earlier
 * one's backward, so the cast and cuBLASLt would take another
 * micro-batch's scale to that one's values (re-rounded, or saturated
 * where the later scale is larger); as the saved region and the GELU
 * epilogue, left to the plain product there. */
static int scale_outlived(const loom_plan *p, loom_value v, const loom_value q[2])
{
	const loom_node *n = p->g->nodes;
	return p->pipe && (n[v].flags & LOOM_NODE_BACKWARD) &&
	       (!(n[q[0]].flags & LOOM_NODE_BACKWARD) || !(n[q[1]].flags & LOOM_NODE_BACKWARD));
}

/* Whether node v can run in FP8 here: the rule above, both QDQs steps of
 * this rank's plan whose scales are still this micro-batch's. */
static int fp8_takes(const loom_plan *p, loom_value v, fp8_shape *s, int fmt[2], loom_value q[2])
{
	return fp8_takes_graph(p->g, v, s, fmt, q) && runs_here(p, q[0]) && runs_here(p, q[1]) &&
	       !scale_outlived(p, v, q);
}

int loom_cuda_mm_fp8_reads(const loom_graph *g, loom_value v, int i)
{
	fp8_shape s;
	int fmt[2];
	loom_value q[2];
	return i >= 0 && i < 2 && fp8_takes_graph(g, v, &s, fmt, q);
}

static cudaDataType_t fp8_type(int fmt)
{
	return fmt == LOOM_FP8_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

int loom_cuda_fp8_fast_accum_mode(void)
{
	const int m = loom_opt_choice(LOOM_OPT_CUDA_FP8_FAST_ACCUM);
	return m > 0 ? m : 0;
}

/* Whether product nd accumulates fast under mode (0 off, 1 fwd, 2 all).
 * The backward flag tells the forward's products: recompute makes no
 * product again (graph/recompute.c's copies are flagged backward). */
static int fast_accum_for(int mode, const loom_node *nd)
{
	return mode == 2 || (mode == 1 && !(nd->flags & LOOM_NODE_BACKWARD));
}

static loom_status set_attr(loom_cuda_ctx *c, cublasLtMatmulDesc_t d,
			    cublasLtMatmulDescAttributes_t attr, const void *val, size_t sz)
{
	return LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, val, sz), c->err, sizeof(c->err));
}

/* The descriptor: TN, fp32 compute and scale, each operand's inverse
 * scale (cuBLAS's A is loom's B, its B loom's A: matmul_cublaslt.cu);
 * fast accumulation set only where on (unset is cuBLASLt's default, 0). */
static loom_status make_desc(loom_cuda_ctx *c, loom_cuda_mm_plan *mp)
{
	const cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
	const float *inv_a = loom_cuda_fp8_scale(c, mp->fp8.q[1]) + 1;
	const float *inv_b = loom_cuda_fp8_scale(c, mp->fp8.q[0]) + 1;
	loom_status st = LOOM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&mp->desc, CUBLAS_COMPUTE_32F,
								    CUDA_R_32F),
					   c->err, sizeof(c->err));
	if (st == LOOM_OK)
		st = set_attr(c, mp->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa));
	if (st == LOOM_OK)
		st = set_attr(c, mp->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb));
	if (st == LOOM_OK)
		st = set_attr(c, mp->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &inv_a, sizeof(inv_a));
	if (st == LOOM_OK)
		st = set_attr(c, mp->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &inv_b, sizeof(inv_b));
	if (st == LOOM_OK && mp->fp8.fast) {
		const int8_t fast = 1; /* cublasLt.h: int8_t */
		st = set_attr(c, mp->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast));
	}
	return st;
}

/* Column-major, as cuBLAS sees loom's row-major: A = loom's B [n, k] is
 * k x n, B = loom's A [m, k] is k x m, C = D [m, n] is n x m. */
static loom_status make_layouts(loom_cuda_ctx *c, loom_cuda_mm_plan *mp, const fp8_shape *s)
{
	loom_status st = LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&mp->a, fp8_type(mp->fp8.fmt[1]),
								      s->k, s->n, s->k),
					   c->err, sizeof(c->err));
	if (st == LOOM_OK)
		st = LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&mp->b, fp8_type(mp->fp8.fmt[0]), s->k,
								  s->m, s->k),
				       c->err, sizeof(c->err));
	if (st == LOOM_OK)
		st = LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&mp->c, CUDA_R_16BF, s->n, s->m, s->n),
				       c->err, sizeof(c->err));
	return st;
}

/* The heuristic's first algorithm within cuBLASLt's workspace cap, for
 * operands aligned to 16 bytes (the arena's values are 64, ws 256). */
static loom_status first_algo(loom_cuda_ctx *c, loom_cuda_mm_plan *mp, int *found)
{
	cublasLtMatmulPreference_t pref = NULL;
	cublasLtMatmulHeuristicResult_t res;
	const size_t ws_max = loom_cuda_lt_ws();
	const uint32_t align = 16;
	const cublasLtMatmulPreferenceAttributes_t aligns[] = {
		CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
		CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
	};
	int returned = 0;

	*found = 0;
	loom_status st = LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref), c->err, sizeof(c->err));
	if (st != LOOM_OK)
		return st;
	st = LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
				       pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_max,
				       sizeof(ws_max)),
			       c->err, sizeof(c->err));
	for (int i = 0; i < 4 && st == LOOM_OK; i++)
		st = LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, aligns[i], &align,
									     sizeof(align)),
				       c->err, sizeof(c->err));
	if (st == LOOM_OK)
		st = LOOM_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(c->lt, mp->desc, mp->a, mp->b,
								      mp->c, mp->c, pref, 1, &res,
								      &returned),
				       c->err, sizeof(c->err));
	loom_status dst = LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref),
					    st == LOOM_OK ? c->err : NULL, sizeof(c->err));
	if (st == LOOM_OK)
		st = dst;
	if (st == LOOM_OK && returned > 0) {
		mp->algo = res.algo;
		mp->lt_ws = loom_cuda_align(res.workspaceSize);
		*found = 1;
	}
	return st;
}

loom_status loom_cuda_mm_fp8_plan(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
				  loom_cuda_node_plan *np, int *done)
{
	const loom_node *nd = &p->g->nodes[v];
	loom_cuda_mm_plan *mp = &np->mm;
	int fmt[2], found = 0;
	loom_value q[2];
	fp8_shape s;

	*done = 0;
	if (!c->fp8_gemm || loom_cuda_own_kernels_on || !c->fp8_slots ||
	    !fp8_takes(p, v, &s, fmt, q))
		return LOOM_OK;
	memset(mp, 0, sizeof(*mp));
	for (int i = 0; i < 2; i++) {
		mp->fp8.fmt[i] = fmt[i];
		mp->fp8.q[i] = q[i];
	}
	/* loom's A as [m, k]: stored [k, m] when ta; its B as [n, k]:
	 * stored [k, n] unless tb. */
	mp->fp8.trans[0] = s.ta;
	mp->fp8.trans[1] = !s.tb;
	mp->fp8.fast = fast_accum_for(c->fp8_fast_accum, nd);
	loom_status st = make_desc(c, mp);
	if (st == LOOM_OK)
		st = make_layouts(c, mp, &s);
	if (st == LOOM_OK)
		st = first_algo(c, mp, &found);
	if (st != LOOM_OK || !found) {
		/* cuBLASLt declined this one (an old library, an odd shape):
		 * the plain product computes the same emulation. */
		loom_cuda_mm_plan_free(np);
		c->err[0] = 0;
		return LOOM_OK;
	}
	mp->fp8.on = 1;
	/* The 1-byte operands in ws after cuBLASLt's part: a cast, or a
	 * stored QDQ's codes transposed; a stored QDQ whose layout fits is
	 * read where it is, and takes none. */
	const int64_t rows[2] = { s.m, s.n };
	size_t at = mp->lt_ws;
	for (int i = 0; i < 2; i++) {
		mp->fp8.stored[i] = loom_fp8_stored(&p->g->nodes[q[i]]);
		mp->fp8.off[i] = at;
		if (!mp->fp8.stored[i] || mp->fp8.trans[i])
			at += loom_cuda_align((size_t)(rows[i] * s.k));
	}
	np->lib_ws = at;
	np->kind = LOOM_CUDA_PLAN_MM;
	mp->bgrad = mp->gelu = mp->aux = LOOM_NONE;
	/* The bias and a fused relu by own kernels after the call. */
	mp->bias_after = nd->op == LOOM_OP_LINEAR && nd->nsrc > 2;
	mp->relu_after = nd->op == LOOM_OP_LINEAR && nd->a.mm.relu;
	*done = 1;
	return LOOM_OK;
}

/* The dtype source i arrives in: the node's after staging, else its own. */
static int src_dtype(const loom_plan *p, const loom_node *nd, const loom_cuda_node_plan *np, int i)
{
	return np->stage[i].src >= 0 ? nd->dtype : p->g->nodes[nd->src[i]].dtype;
}

loom_status loom_cuda_mm_fp8_run(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
				 const loom_cuda_node_plan *np, void *const *src, void *out)
{
	const loom_cuda_mm_plan *mp = &np->mm;
	const loom_node *nd = &p->g->nodes[v];
	const float one = 1.0f, zero = 0.0f;
	unsigned char *q[2] = { c->arena->ws + mp->fp8.off[0], c->arena->ws + mp->fp8.off[1] };
	/* loom's A [m, k] (from [k, m] if transposed), its B [n, k] (from [k, n]) */
	fp8_shape s;
	loom_status st = LOOM_OK;

	shape_of(p->g, nd, &s);
	const int64_t want_rows[2] = { s.m, s.n };
	for (int i = 0; i < 2 && st == LOOM_OK; i++) {
		const int64_t r = mp->fp8.trans[i] ? s.k : want_rows[i];
		const int64_t cols = mp->fp8.trans[i] ? want_rows[i] : s.k;
		if (mp->fp8.stored[i] && !mp->fp8.trans[i]) { /* the QDQ's own codes */
			q[i] = (unsigned char *)src[i];
			continue;
		}
		/* A stored QDQ's codes transposed as they are (xdt: their format),
		 * else the bf16 values cast with the QDQ's scale. */
		st = loom_cuda_fp8_cast(c->err, c->stream, src[i],
					mp->fp8.stored[i] ? mp->fp8.fmt[i] : src_dtype(p, nd, np, i),
					r, cols, mp->fp8.trans[i], mp->fp8.fmt[i],
					loom_cuda_fp8_scale(c, mp->fp8.q[i]), q[i]);
	}
	if (st == LOOM_OK)
		st = LOOM_CUBLAS_CHECK(cublasLtMatmul(c->lt, mp->desc, &one, q[1], mp->a, q[0], mp->b,
						      &zero, out, mp->c, out, mp->c, &mp->algo,
						      mp->lt_ws ? c->arena->ws : NULL, mp->lt_ws,
						      c->stream),
				       c->err, sizeof(c->err));
	if (st == LOOM_OK && mp->bias_after)
		st = loom_cuda_bias_add(c->err, c->stream, (int)s.m, (int)s.n, 1, out, nd->dtype,
					src[2], src_dtype(p, nd, np, 2));
	if (st == LOOM_OK && mp->relu_after)
		st = loom_cuda_relu_fwd(c->err, c->stream, out, nd->dtype, out, nd->dtype,
					loom_shape_numel(&nd->shape));
	return st;
}

int loom_cuda_mm_fp8_note(const loom_cuda_node_plan *np, char *buf, size_t len)
{
	if (np->kind != LOOM_CUDA_PLAN_MM || !np->mm.fp8.on)
		return 0;
	snprintf(buf, len, "cuBLASLt FP8 %s x %s%s%s%s",
		 np->mm.fp8.fmt[0] == LOOM_FP8_E4M3 ? "E4M3" : "E5M2",
		 np->mm.fp8.fmt[1] == LOOM_FP8_E4M3 ? "E4M3" : "E5M2",
		 np->mm.fp8.trans[0] || np->mm.fp8.trans[1] ? ", cast transposed" : "",
		 np->mm.fp8.stored[0] || np->mm.fp8.stored[1] ? ", stored fp8 operands" : "",
		 np->mm.fp8.fast ? ", fast accumulation" : "");
	return 1;
}

/* Test hook (no device: the rule alone, on any compiled plan): how many
 * of the plan's products the FP8 product would take, of how many. */
extern "C" void loom_cuda_test_fp8_products(const void *plan, int *fp8, int *products)
{
	const loom_plan *p = (const loom_plan *)plan;
	*fp8 = *products = 0;
	for (loom_value v = 0; v < p->g->n; v++) {
		const loom_op op = (loom_op)p->g->nodes[v].op;
		if (op != LOOM_OP_LINEAR && op != LOOM_OP_MATMUL)
			continue;
		fp8_shape s;
		int fmt[2];
		loom_value q[2];
		*products += 1;
		*fp8 += fp8_takes(p, v, &s, fmt, q);
	}
}

/* Test hook (no device): of the products the FP8 product would take,
 * how many LOOM_CUDA_FP8_FAST_ACCUM, as plan_create reads it now, would
 * give fast accumulation (the choice loom_cuda_mm_fp8_plan makes). */
extern "C" void loom_cuda_test_fp8_fast_products(const void *plan, int *fast, int *fp8)
{
	const loom_plan *p = (const loom_plan *)plan;
	const int mode = loom_cuda_fp8_fast_accum_mode();
	*fast = *fp8 = 0;
	for (loom_value v = 0; v < p->g->n; v++) {
		fp8_shape s;
		int fmt[2];
		loom_value q[2];
		if (!fp8_takes(p, v, &s, fmt, q))
			continue;
		*fp8 += 1;
		*fast += fast_accum_for(mode, &p->g->nodes[v]);
	}
}
