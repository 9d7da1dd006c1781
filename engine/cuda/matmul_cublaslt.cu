/*
 * engine/cuda/matmul_cublaslt.cu — LINEAR and MATMUL (all transposed forms)
 * through cuBLASLt with fp32 accumulation (CUBLAS_COMPUTE_32F) and half
 * inputs for f16 / bf16 nodes; f32 nodes on TF32 tensor cores
 * (CUBLAS_COMPUTE_32F_FAST_TF32) unless the plan is exact (no_tf32); a linear's bias rides the BIAS epilogue (a
 * fused relu, graph/fuse.c, RELU_BIAS or RELU), and
 * the bias gradient the BGRADB epilogue of the weight gradient's product
 * (its sibling, graph/fuse.c) where cuBLASLt has an algorithm for it; where
 * it has none for an epilogue, the plain product and own kernels (bias add,
 * relu) do the rest. The algorithm is chosen once by
 * cublasLtMatmulAlgoGetHeuristic and cached.
 * CPU twin: loom_cpu_gemm / loom_cpu_linear_fwd in engine/cpu/dense_impl.h.
 *
 * The RELU epilogue maps a NaN product to 0 where the CPU's relu keeps it;
 * a NaN there comes from a NaN or inf input, which the weight gradient
 * (dy^T x) carries to the overflow check all the same.
 *
 * loom is row-major, cuBLAS column-major: a row-major C[M,N] is a
 * column-major C^T[N,M], so we compute C^T = op(B)^T op(A)^T, i.e. cuBLAS's
 * "A" operand is loom's B and its "B" is loom's A.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/options.h"
#include "engine/cuda/cuda_internal.h"

size_t loom_cuda_lt_ws(void)
{
	static size_t ws;
	if (!ws) {
		const char *e = loom_opt_env(LOOM_OPT_CUDA_LT_WS_MB);
		long mb = e && *e ? strtol(e, NULL, 10) : LOOM_CUDA_LT_WS_DEFAULT_MB;
		ws = (size_t)(mb >= 1 && mb <= 1024 ? mb : LOOM_CUDA_LT_WS_DEFAULT_MB) << 20;
	}
	return ws;
}

static uint32_t common_align(const uint64_t *x, int n);

/* The operands' alignment a product's plan may promise (LOOM_CUDA_LT_ALIGN):
 * the largest power of two, at most 256, dividing the offsets of its
 * sources, its output and, with a GELU epilogue, what that writes and
 * reads; the regions' bases are allocated 256-aligned, and the run checks
 * the pointers all the same (mm_algo). */
static uint32_t plan_align(const loom_plan *p, const loom_node *nd, loom_value v,
			   const loom_cuda_mm_plan *mp)
{
	uint64_t off[LOOM_MAX_SRC + 3];
	int n = 0;
	for (int i = 0; i < nd->nsrc && i < LOOM_MAX_SRC; i++)
		off[n++] = p->mp.offset[nd->src[i]];
	off[n++] = p->mp.offset[v];
	if (mp->gelu != LOOM_NONE)
		off[n++] = p->mp.offset[mp->gelu];
	if (mp->aux != LOOM_NONE)
		off[n++] = p->mp.offset[mp->aux];
	return common_align(off, n);
}

/* The algorithm for this call: the wide one where every pointer is as
 * aligned as the plan promised, else the one for 16 bytes. */
static const cublasLtMatmulAlgo_t *mm_algo(const loom_cuda_mm_plan *mp, const void *a,
					   const void *b, const void *c, const void *d)
{
	if (!mp->wide_align)
		return &mp->algo;
	const uint64_t x[4] = { (uint64_t)(uintptr_t)a, (uint64_t)(uintptr_t)b,
				(uint64_t)(uintptr_t)c, (uint64_t)(uintptr_t)(d ? d : c) };
	return common_align(x, 4) >= mp->wide_align ? &mp->wide_algo : &mp->algo;
}

typedef struct mm_shape {
	int m, n, k; /* loom's row-major C[m,n] = op(A)[m,k] op(B)[k,n] */
	int ta, tb;
} mm_shape;

static void mm_shape_of(const loom_plan *p, const loom_node *nd, mm_shape *s)
{
	const loom_node *a = &p->g->nodes[nd->src[0]], *b = &p->g->nodes[nd->src[1]];
	/* Values of more than 2 dims are their rows: [..., last] as
	 * [numel / last, last] (a linear over GPT's [B, T, C]). */
	if (nd->op == LOOM_OP_LINEAR) { /* x[N, in] w[out, in]^T */
		s->ta = 0, s->tb = 1;
		s->m = (int)loom_shape_rows(&a->shape), s->k = (int)loom_shape_last(&a->shape);
		s->n = (int)b->shape.dims[0];
		return;
	}
	s->ta = nd->a.mm.ta, s->tb = nd->a.mm.tb;
	s->m = (int)loom_shape_rows(&nd->shape), s->n = (int)loom_shape_last(&nd->shape);
	s->k = (int)(s->ta ? loom_shape_rows(&a->shape) : loom_shape_last(&a->shape));
}

static loom_status set_attr(loom_cuda_ctx *c, cublasLtMatmulDesc_t d,
			    cublasLtMatmulDescAttributes_t attr, const void *val, size_t sz)
{
	return LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, val, sz), c->err, sizeof(c->err));
}

/* The heuristic's limits: at most ws_max bytes of workspace, operands
 * aligned to align bytes (the heuristic's default assumes 256). */
static loom_status set_prefs(loom_cuda_ctx *c, cublasLtMatmulPreference_t pref, size_t ws_max,
			     uint32_t align)
{
	loom_status st = LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
						   pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
						   &ws_max, sizeof(ws_max)),
					   c->err, sizeof(c->err));
	const cublasLtMatmulPreferenceAttributes_t aligns[] = {
		CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
		CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
	};
	for (int i = 0; i < 4 && st == LOOM_OK; i++)
		st = LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, aligns[i], &align,
									     sizeof(align)),
				       c->err, sizeof(c->err));
	return st;
}

/* Descriptors for epilogue epi and the heuristic's first algorithm; found
 * says whether there was one. */
/* The matmul descriptor: compute type, transposes, epilogue and its aux
 * matrix's leading dimension. */
static loom_status make_desc(const loom_plan *p, loom_cuda_ctx *c, const loom_node *nd,
			     const mm_shape *sp, cublasLtEpilogue_t epi, loom_cuda_mm_plan *mp)
{
	const mm_shape s = *sp;
	loom_status st;
	cublasOperation_t opa = s.tb ? CUBLAS_OP_T : CUBLAS_OP_N; /* on loom's B */
	cublasOperation_t opb = s.ta ? CUBLAS_OP_T : CUBLAS_OP_N; /* on loom's A */

	/* fp32 operands on TF32 tensor cores unless the plan says exact. */
	const cublasComputeType_t ct = nd->dtype == LOOM_F32 && loom_cuda_tf32_on(p) ?
					       CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
	if ((st = LOOM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&mp->desc, ct, CUDA_R_32F),
				    c->err, sizeof(c->err))) != LOOM_OK)
		return st;
	if ((st = set_attr(c, mp->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa))) != LOOM_OK)
		return st;
	if ((st = set_attr(c, mp->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb))) != LOOM_OK)
		return st;
	if (epi != CUBLASLT_EPILOGUE_DEFAULT &&
	    (st = set_attr(c, mp->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi))) != LOOM_OK)
		return st;
	if (mp->gelu != LOOM_NONE) { /* the aux matrix: D's layout, n a row */
		const int64_t ld = s.n;
		if ((st = set_attr(c, mp->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
				   sizeof(ld))) != LOOM_OK)
			return st;
	}
	return LOOM_OK;
}

/* Column-major shapes as stored: loom's B is [k,n] (or [n,k] if tb)
 * row-major, i.e. n x k (k x n) column-major; likewise A. */
static loom_status make_layouts(loom_cuda_ctx *c, const loom_node *nd, const mm_shape *sp,
				loom_cuda_mm_plan *mp)
{
	const mm_shape s = *sp;
	cudaDataType_t dt = loom_cuda_data_type(nd->dtype);
	loom_status st;

	/* A padded operand (LOOM_CUDA_LT_PAD) is read (written) in ws with
	 * rows of ld_pad elements. */
	const int ldb_l = mp->pad[1].ld_pad ? mp->pad[1].ld_pad : s.tb ? s.k : s.n;
	const int lda_l = mp->pad[0].ld_pad ? mp->pad[0].ld_pad : s.ta ? s.m : s.k;
	const int ldc_l = mp->pad[2].ld_pad ? mp->pad[2].ld_pad : s.n;
	st = LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&mp->a, dt, s.tb ? s.k : s.n,
							  s.tb ? s.n : s.k, ldb_l),
			       c->err, sizeof(c->err));
	if (st != LOOM_OK)
		return st;
	st = LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&mp->b, dt, s.ta ? s.m : s.k,
							  s.ta ? s.k : s.m, lda_l),
			       c->err, sizeof(c->err));
	if (st != LOOM_OK)
		return st;
	return LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&mp->c, dt, s.n, s.m, ldc_l),
				 c->err, sizeof(c->err));
}

/* The heuristic's first answer for operands aligned to align bytes. */
static loom_status ask_heuristic(loom_cuda_ctx *c, const loom_cuda_mm_plan *mp,
				 cublasLtMatmulPreference_t pref, uint32_t align,
				 cublasLtMatmulHeuristicResult_t *res, int *returned)
{
	loom_status st = set_prefs(c, pref, loom_cuda_lt_ws(), align);
	if (st == LOOM_OK)
		st = LOOM_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(c->lt, mp->desc, mp->a, mp->b,
								      mp->c, mp->c, pref, 1, res,
								      returned),
				       c->err, sizeof(c->err));
	return st;
}

/* LOOM_CUDA_LT_ALIGN: also the answer for the alignment the plan's
 * offsets promise (PyTorch tells the heuristic each pointer's; 16 rules
 * out algorithms that want more), kept where it differs from res's. A
 * failure here only loses the wide answer: the 16-byte one stands. */
static void ask_wide(loom_cuda_ctx *c, loom_cuda_mm_plan *mp, cublasLtMatmulPreference_t pref,
		     uint32_t wide, cublasLtMatmulHeuristicResult_t *res)
{
	cublasLtMatmulHeuristicResult_t wres;
	int wret = 0;
	loom_status wst = ask_heuristic(c, mp, pref, wide, &wres, &wret);
	if (wst == LOOM_OK && wret > 0 && memcmp(&wres.algo, &res->algo, sizeof(res->algo))) {
		mp->wide_algo = wres.algo;
		mp->wide_align = wide;
		if (wres.workspaceSize > res->workspaceSize)
			res->workspaceSize = wres.workspaceSize;
	}
	if (wst != LOOM_OK)
		c->err[0] = 0;
}

/* The heuristic's algorithm for the descriptor and layouts (and the wide
 * one where it differs); *returned 0 when it has none. */
static loom_status choose_algo(const loom_plan *p, loom_cuda_ctx *c, const loom_node *nd,
			       loom_cuda_mm_plan *mp, cublasLtMatmulHeuristicResult_t *res,
			       int *returned)
{
	cublasLtMatmulPreference_t pref = NULL;
	loom_status st;

	st = LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref), c->err, sizeof(c->err));
	if (st != LOOM_OK)
		return st;
	/* Arena values are 64-byte aligned (graph/memplan.c), staged copies
	 * 256; 16 is what every algorithm may rely on. */
	st = ask_heuristic(c, mp, pref, 16, res, returned);
	mp->wide_align = 0;
	const uint32_t wide = c->lt_align ? plan_align(p, nd, (loom_value)(nd - p->g->nodes), mp) : 16;
	if (st == LOOM_OK && *returned > 0 && wide > 16)
		ask_wide(c, mp, pref, wide, res);
	/* Checked too, but an earlier failure keeps its message. */
	loom_status dst = LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref),
					    st == LOOM_OK ? c->err : NULL, sizeof(c->err));
	if (st == LOOM_OK)
		st = dst;
	return st;
}

static loom_status plan_with(const loom_plan *p, loom_cuda_ctx *c, const loom_node *nd,
			     const mm_shape *sp, cublasLtEpilogue_t epi, loom_cuda_node_plan *np,
			     int *found)
{
	loom_cuda_mm_plan *mp = &np->mm;
	cublasLtMatmulHeuristicResult_t res;
	int returned = 0;
	loom_status st;

	*found = 0;
	if ((st = make_desc(p, c, nd, sp, epi, mp)) != LOOM_OK ||
	    (st = make_layouts(c, nd, sp, mp)) != LOOM_OK)
		return st;
	st = choose_algo(p, c, nd, mp, &res, &returned);
	if (st != LOOM_OK || returned < 1)
		return st;
	*found = 1;
	mp->algo = res.algo;
	mp->lt_ws = loom_cuda_align(res.workspaceSize);
	np->lib_ws = mp->lt_ws;
	/* The padded copies after cuBLASLt's part. */
	for (int i = 0; i < 3; i++)
		if (mp->pad[i].ld_pad) {
			mp->pad[i].off = np->lib_ws;
			np->lib_ws += loom_cuda_align((size_t)mp->pad[i].rows * mp->pad[i].ld_pad *
						      loom_dtype_size(nd->dtype));
		}
	return LOOM_OK;
}

/* LOOM_CUDA_LT_PAD: which of the product's operands have rows that are not
 * 16-byte aligned, each given rows of a multiple of 64 elements in ws
 * (llm.c pads the vocabulary to 50304, so that the classifier's three
 * products see aligned rows; loom's logits are rows of 50257). */
static void plan_pad(const loom_node *nd, const mm_shape *s, loom_cuda_mm_plan *mp)
{
	const size_t es = loom_dtype_size(nd->dtype);
	const int ld[3] = { s->ta ? s->m : s->k, s->tb ? s->k : s->n, s->n };
	const int rows[3] = { s->ta ? s->k : s->m, s->tb ? s->n : s->k, s->m };
	for (int i = 0; i < 3; i++) {
		mp->pad[i].ld = ld[i];
		mp->pad[i].rows = rows[i];
		mp->pad[i].ld_pad = ((size_t)ld[i] * es) % 16 ? (ld[i] + 63) / 64 * 64 : 0;
		mp->pad[i].off = 0;
	}
}

/* The padded copies of a product's sources into ws (LOOM_CUDA_LT_PAD):
 * a[0], a[1] become their copies' addresses. */
static loom_status pad_in(loom_cuda_ctx *c, const loom_node *nd, const loom_cuda_mm_plan *mp,
			  const void **a)
{
	const size_t es = loom_dtype_size(nd->dtype);
	for (int i = 0; i < 2; i++) {
		if (!mp->pad[i].ld_pad)
			continue;
		void *dst = c->arena->ws + mp->pad[i].off;
		loom_status st = LOOM_CUDA_CHECK(
			cudaMemcpy2DAsync(dst, (size_t)mp->pad[i].ld_pad * es, a[i],
					  (size_t)mp->pad[i].ld * es, (size_t)mp->pad[i].ld * es,
					  (size_t)mp->pad[i].rows, cudaMemcpyDeviceToDevice, c->stream),
			c->err, sizeof(c->err));
		if (st != LOOM_OK)
			return st;
		a[i] = dst;
	}
	return LOOM_OK;
}

/* dw = dy^T x with a bias-gradient sibling (graph/fuse.c): the column sums
 * of dy, which the BGRADB epilogue makes in the same call (the reduction of
 * cuBLAS's B operand, loom's A, over k), in the node's dtype. */
static loom_value bgrad_sibling(const loom_plan *p, loom_value v)
{
	const loom_node *nd = &p->g->nodes[v];
	if (nd->op != LOOM_OP_MATMUL || !nd->a.mm.ta || nd->a.mm.tb)
		return LOOM_NONE;
	for (loom_value w = loom_sibling_first(p, v); w != LOOM_NONE; w = loom_sibling_next(p, w)) {
		const loom_node *s = &p->g->nodes[w];
		if (s->op == LOOM_OP_CHANNEL_SUM && s->src[0] == nd->src[0] && s->dtype == nd->dtype)
			return w;
	}
	return LOOM_NONE;
}

/* The epilogues to try for a product, the most fused first; the last has
 * none, so that a product cuBLASLt can do at all always gets a plan: what
 * the chosen epilogue leaves out, own kernels do after it (the bias add,
 * the relu in place, the bias-gradient sibling's channel sum). The test
 * hook (loom_cuda_test_own_kernels) keeps only that last one. */
static int mm_tries(int bias, int relu, int bgrad, cublasLtEpilogue_t tries[3])
{
	int n = 0;
	if (!loom_cuda_own_kernels_on) {
		if (bgrad)
			tries[n++] = CUBLASLT_EPILOGUE_BGRADB;
		else if (relu)
			tries[n++] = bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
		if (bias)
			tries[n++] = CUBLASLT_EPILOGUE_BIAS;
	}
	tries[n++] = CUBLASLT_EPILOGUE_DEFAULT;
	return n;
}

/* Whether values a and b share a byte. */
static int bytes_overlap(const loom_plan *p, loom_value a, loom_value b)
{
	if (p->mp.region[a] != p->mp.region[b])
		return 0;
	size_t a0 = p->mp.offset[a], a1 = a0 + loom_plan_value_bytes(p, a);
	size_t b0 = p->mp.offset[b], b1 = b0 + loom_plan_value_bytes(p, b);
	return a0 < b1 && b0 < a1;
}

/* Whether the steps strictly between sa and sb leave value x's bytes
 * alone: the nodes computed there (and the siblings they make) neither
 * read nor write them, accumulation and collectives touch other values;
 * any other step kind (optimizer, ZeRO copies, pipeline transfers) says
 * no. */
static int quiet_between(const loom_plan *p, int sa, int sb, loom_value x)
{
	const loom_graph *g = p->g;
	for (int i = sa + 1; i < sb; i++) {
		const loom_step *st = &p->steps[i];
		if (st->kind == LOOM_STEP_ACCUM || st->kind == LOOM_STEP_COLLECTIVE) {
			if (st->v != LOOM_NONE && bytes_overlap(p, x, st->v))
				return 0;
			continue;
		}
		if (st->kind == LOOM_STEP_WAIT)
			continue;
		if (st->kind != LOOM_STEP_NODE)
			return 0;
		if (st->noop || st->v == LOOM_NONE)
			continue;
		for (loom_value u = 0; u < g->n; u++) {
			if (u != st->v && g->nodes[u].made_by != st->v)
				continue;
			if (bytes_overlap(p, x, u))
				return 0;
			for (int k = 0; k < g->nodes[u].nsrc; k++)
				if (bytes_overlap(p, x, g->nodes[u].src[k]))
					return 0;
		}
	}
	return 1;
}

/*
 * GELU in the product's epilogue (LOOM_CUDA_GELU_EPILOGUE; compiled, not
 * run). cuBLASLt's GELU epilogues are the tanh form (GPT-2's,
 * loom_gelu_tanh: attrs.ew.tanh), so only that form fuses; the exact (erf)
 * GELU keeps its own kernel. Forward: a linear v read by one GELU g (and
 * in training by g's backward, as its x) computes g's output with
 * GELU_AUX(_BIAS), its own output (the pre-activation the backward reads)
 * as the aux matrix. Backward: a product v (no bias) read only by a GELU
 * backward g as its dy computes g's output with DGELU, the
 * pre-activation g reads (aux) as the aux matrix; v's own output is never
 * written. Both where nothing run between v and g touches g's bytes, in
 * v's dtype, the aux row (n) a multiple of 8, and what the epilogue writes
 * apart from what the product reads (DGELU: or exactly on v's own output).
 * g's bias gradient stays where it is (the weight gradient's BGRADB).
 * A GELU made again in the backward (graph/recompute.c) is another reader
 * of v: the forward's GELU then keeps its own kernel too, so that the copy
 * computes the same bits as the value it stands for.
 */
loom_value loom_cuda_gelu_partner(const loom_plan *p, loom_value v, int *dgelu, loom_value *aux)
{
	const loom_graph *g = p->g;
	const loom_node *nd = &g->nodes[v];
	loom_value gn = LOOM_NONE;
	*dgelu = 0;
	*aux = LOOM_NONE;
	/* Half products only: fp32 keeps the own kernel, whose GELU is the
	 * CPU's to fp32's rounding (cuBLASLt does not document the accuracy of
	 * its epilogue's tanh). */
	if ((nd->dtype != LOOM_F16 && nd->dtype != LOOM_BF16) ||
	    (nd->op == LOOM_OP_LINEAR && nd->a.mm.relu) || loom_shape_last(&nd->shape) % 8 ||
	    (nd->flags & LOOM_NODE_OUTPUT))
		return LOOM_NONE;
	int fwd = 0, bwd = 0, other = 0, xreaders = 0;
	for (loom_value w = 0; w < g->n; w++)
		for (int i = 0; i < g->nodes[w].nsrc; i++) {
			const loom_node *u = &g->nodes[w];
			if (u->src[i] != v)
				continue;
			if (u->op == LOOM_OP_GELU && u->a.ew.tanh && i == 0 && !fwd) {
				fwd = 1;
				gn = w;
			} else if (u->op == LOOM_OP_GELU_BWD && u->a.ew.tanh && i == 0 && u->src[1] != v) {
				xreaders++; /* the forward's backward reads the pre-activation */
			} else if (u->op == LOOM_OP_GELU_BWD && u->a.ew.tanh && i == 1 && u->src[0] != v &&
				   !bwd) {
				bwd = 1;
				gn = w;
			} else {
				other = 1;
			}
		}
	if (other || fwd + bwd != 1 || (bwd && xreaders))
		return LOOM_NONE;
	const loom_node *gd = &g->nodes[gn];
	if (gd->dtype != nd->dtype || loom_shape_numel(&gd->shape) != loom_shape_numel(&nd->shape))
		return LOOM_NONE;
	if (bwd) {
		const loom_node *x = &g->nodes[gd->src[0]];
		if ((nd->op == LOOM_OP_LINEAR && nd->nsrc > 2) || x->dtype != nd->dtype ||
		    loom_shape_last(&x->shape) != loom_shape_last(&nd->shape) ||
		    loom_shape_numel(&x->shape) != loom_shape_numel(&nd->shape))
			return LOOM_NONE;
	}
	/* Nothing between v and g touches g's bytes (written early). */
	const int sv = loom_step_of(p, v), sg = loom_step_of(p, gn);
	if (sv < 0 || sg <= sv || p->pipe || !quiet_between(p, sv, sg, gn))
		return LOOM_NONE;
	/* What the epilogue writes (g's output) apart from what it reads: the
	 * product's sources and the aux; in place over v only for DGELU (v's
	 * own output is never written then). */
	for (int i = 0; i < nd->nsrc; i++)
		if (bytes_overlap(p, gn, nd->src[i]))
			return LOOM_NONE;
	if (bwd) {
		if (bytes_overlap(p, gn, gd->src[0]))
			return LOOM_NONE;
		if (bytes_overlap(p, gn, v) &&
		    !(p->mp.offset[gn] == p->mp.offset[v] &&
		      loom_plan_value_bytes(p, gn) == loom_plan_value_bytes(p, v)))
			return LOOM_NONE;
		*aux = gd->src[0];
	} else if (bytes_overlap(p, gn, v)) {
		return LOOM_NONE;
	}
	*dgelu = bwd;
	return gn;
}

/* The GELU epilogue's plan for v, where loom_cuda_gelu_partner finds one and cuBLASLt
 * has an algorithm; *done says whether it took. */
static loom_status plan_gelu(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
			     loom_cuda_node_plan *np, const mm_shape *s, int bias, int *done)
{
	loom_cuda_mm_plan *mp = &np->mm;
	int dg, found = 0;
	loom_value aux, gn = loom_cuda_gelu_partner(p, v, &dg, &aux);
	*done = 0;
	if (gn == LOOM_NONE)
		return LOOM_OK;
	np->kind = LOOM_CUDA_PLAN_MM;
	mp->bias = bias && !dg;
	mp->bias_after = 0;
	mp->bgrad = LOOM_NONE;
	mp->relu_after = 0;
	mp->gelu = gn;
	mp->dgelu = dg;
	mp->aux_same = 0;
	mp->aux = aux;
	cublasLtEpilogue_t e = dg ? CUBLASLT_EPILOGUE_DGELU :
			       bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
	loom_status st = plan_with(p, c, &p->g->nodes[v], s, e, np, &found);
	if (st == LOOM_OK && found) {
		c->plans[gn].fused_into = v;
		*done = 1;
		return LOOM_OK;
	}
	/* No algorithm (or an error building the descriptors): the plain
	 * paths below, with the GELU's own kernel. */
	loom_cuda_mm_plan_free(np);
	mp->gelu = mp->aux = LOOM_NONE;
	c->err[0] = 0;
	return LOOM_OK;
}

loom_status loom_cuda_mm_plan_make(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
				   loom_cuda_node_plan *np)
{
	const loom_node *nd = &p->g->nodes[v];
	loom_cuda_mm_plan *mp = &np->mm;
	loom_status st = LOOM_OK;
	int found = 0;
	mm_shape s;
	char lb[96];

	/* LOOM_CUDA_FP8_GEMM: FP8 tensor cores on QDQ'd operands (matmul_fp8.cu). */
	if ((st = loom_cuda_mm_fp8_plan(p, c, v, np, &found)) != LOOM_OK || found)
		return st;
	mm_shape_of(p, nd, &s);
	int bias = nd->op == LOOM_OP_LINEAR && nd->nsrc > 2;
	int relu = nd->op == LOOM_OP_LINEAR && nd->a.mm.relu; /* fused, graph/fuse.c */
	/* LOOM_CUDA_BGRAD_EPILOGUE=0: the sibling's own channel sum (llm.c's
	 * way: its bias gradient is a kernel of its own, the weight gradient a
	 * plain product). */
	loom_value sib = loom_cuda_own_kernels_on || !c->bgrad_epi ? LOOM_NONE : bgrad_sibling(p, v);
	cublasLtEpilogue_t tries[3];
	int ntries = mm_tries(bias, relu, sib != LOOM_NONE, tries);

	mp->gelu = mp->aux = LOOM_NONE;
	memset(mp->pad, 0, sizeof(mp->pad));
	if (c->gelu_epi && !loom_cuda_own_kernels_on && sib == LOOM_NONE) {
		int done;
		if ((st = plan_gelu(p, c, v, np, &s, bias, &done)) != LOOM_OK || done)
			return st;
	}
	for (int i = 0; i < ntries; i++) {
		if (i > 0) { /* no algorithm for the last try */
			loom_cuda_mm_plan_free(np);
			mp->gelu = mp->aux = LOOM_NONE;
			c->err[0] = 0;
		}
		/* The GELU epilogues keep their rows as they are (the aux's ld). */
		if (c->lt_pad)
			plan_pad(nd, &s, mp);
		cublasLtEpilogue_t e = tries[i];
		np->kind = LOOM_CUDA_PLAN_MM;
		mp->bias = e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS;
		mp->bias_after = bias && !mp->bias;
		mp->bgrad = e == CUBLASLT_EPILOGUE_BGRADB ? sib : LOOM_NONE;
		mp->relu_after = relu && e != CUBLASLT_EPILOGUE_RELU && e != CUBLASLT_EPILOGUE_RELU_BIAS;
		st = plan_with(p, c, nd, &s, e, np, &found);
		if (st == LOOM_OK && found)
			return LOOM_OK;
	}
	if (st != LOOM_OK)
		return st;
	return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_UNSUPPORTED,
			 "cuda matmul: cuBLASLt has no algorithm for %s (%d x %d x %d, %s), "
			 "even without an epilogue",
			 loom_node_label(p->g, v, lb, sizeof(lb)), s.m, s.n, s.k,
			 loom_dtype_name(nd->dtype));
}

/* A product's descriptor and its three layouts, any of them NULL (a
 * half-made plan). */
static void lt_destroy(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
		       cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c)
{
	cublasLtMatrixLayout_t layouts[3] = { a, b, c };
	for (int i = 0; i < 3; i++)
		if (layouts[i])
			cublasLtMatrixLayoutDestroy(layouts[i]);
	if (desc)
		cublasLtMatmulDescDestroy(desc);
}

void loom_cuda_mm_plan_free(loom_cuda_node_plan *np)
{
	loom_cuda_mm_plan *mp = &np->mm;
	lt_destroy(mp->desc, mp->a, mp->b, mp->c);
	memset(mp, 0, sizeof(*mp));
}

/* The product with its GELU epilogue (plan_gelu): D is the GELU (or GELU
 * backward) node's output. Under the diagnosis run mode, where that node
 * runs its own kernel: the forward still writes its aux (the product's
 * own output) and the GELU early, which the GELU then rewrites; the
 * backward's product runs plain (a strided call of one) into its own
 * output, which the GELU backward reads. */
static loom_status mm_run_gelu(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
			       const loom_cuda_node_plan *np, void *const *src, void *out)
{
	const loom_cuda_mm_plan *mp = &np->mm;
	const loom_node *nd = &p->g->nodes[v];
	const float one = 1.0f, zero = 0.0f;
	loom_status st;
	mm_shape s;
	mm_shape_of(p, nd, &s);
	if (mp->dgelu && !loom_cuda_relu_fusion_on(c)) {
		loom_cuda_gemm gm;
		int done = 0;
		memset(&gm, 0, sizeof(gm));
		gm.ta = s.ta, gm.tb = s.tb, gm.m = s.m, gm.n = s.n, gm.k = s.k, gm.batch = 1;
		gm.alpha = 1.0f, gm.beta = 0.0f;
		gm.a = src[0], gm.b = src[1], gm.c = out;
		gm.lda = s.ta ? s.m : s.k, gm.ldb = s.tb ? s.k : s.n, gm.ldc = s.n;
		gm.abt = gm.ct = loom_cuda_data_type(nd->dtype);
		if ((st = loom_cuda_gemm_strided(c, &gm, &done)) != LOOM_OK)
			return st;
		return done ? LOOM_OK :
			      loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_UNSUPPORTED,
					"cuda matmul: no plain algorithm for node %d (diagnosis run)", (int)v);
	}
	void *d = loom_arena_ptr(c->arena, p, mp->gelu);
	const void *aux = mp->dgelu ? loom_arena_ptr(c->arena, p, mp->aux) : out;
	if ((st = set_attr(c, mp->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
			   sizeof(aux))) != LOOM_OK)
		return st;
	if (mp->bias && (st = set_attr(c, mp->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &src[2],
				       sizeof(src[2]))) != LOOM_OK)
		return st;
	return LOOM_CUBLAS_CHECK(cublasLtMatmul(c->lt, mp->desc, &one, src[1], mp->a, src[0], mp->b,
						&zero, d, mp->c, d, mp->c,
						mm_algo(mp, src[0], src[1], d, aux),
						mp->lt_ws ? c->arena->ws : NULL, mp->lt_ws, c->stream),
				 c->err, sizeof(c->err));
}

/* src: loom's A, B (and bias), all in the node's dtype after staging. */
loom_status loom_cuda_mm_run(const loom_plan *p, loom_cuda_ctx *c, loom_value v,
			     const loom_cuda_node_plan *np, void *const *src, void *out)
{
	const loom_cuda_mm_plan *mp = &np->mm;
	const float one = 1.0f, zero = 0.0f;
	loom_status st;

	if (mp->fp8.on)
		return loom_cuda_mm_fp8_run(p, c, v, np, src, out);
	if (mp->gelu != LOOM_NONE)
		return mm_run_gelu(p, c, v, np, src, out);
	if (mp->bias || mp->bgrad != LOOM_NONE) {
		/* The bias to add, or where the bias gradient goes. */
		const void *bias = mp->bias ? src[2] : loom_arena_ptr(c->arena, p, mp->bgrad);
		if ((st = set_attr(c, mp->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
				   sizeof(bias))) != LOOM_OK)
			return st;
	}
	const loom_node *nd = &p->g->nodes[v];
	/* LOOM_CUDA_LT_PAD: the unaligned operands through padded copies. */
	const void *ab[2] = { src[0], src[1] };
	void *d = mp->pad[2].ld_pad ? (void *)(c->arena->ws + mp->pad[2].off) : out;
	if ((st = pad_in(c, nd, mp, ab)) != LOOM_OK)
		return st;
	st = LOOM_CUBLAS_CHECK(cublasLtMatmul(c->lt, mp->desc, &one, ab[1], mp->a, ab[0], mp->b,
					      &zero, d, mp->c, d, mp->c, mm_algo(mp, ab[0], ab[1], d, NULL),
					      mp->lt_ws ? c->arena->ws : NULL, mp->lt_ws, c->stream),
			       c->err, sizeof(c->err));
	if (st == LOOM_OK && d != out) {
		const size_t es = loom_dtype_size(nd->dtype);
		st = LOOM_CUDA_CHECK(cudaMemcpy2DAsync(out, (size_t)mp->pad[2].ld * es, d,
						       (size_t)mp->pad[2].ld_pad * es,
						       (size_t)mp->pad[2].ld * es,
						       (size_t)mp->pad[2].rows, cudaMemcpyDeviceToDevice,
						       c->stream),
				     c->err, sizeof(c->err));
	}
	/* What the epilogue left out: the bias over the rows [m, n], then the
	 * relu, both in place. */
	if (st == LOOM_OK && mp->bias_after) {
		/* Rows of a [..., out] output (a linear over GPT's [B, T, C]). */
		mm_shape s;
		mm_shape_of(p, nd, &s);
		st = loom_cuda_bias_add(c->err, c->stream, s.m, s.n, 1, out, nd->dtype, src[2],
					nd->dtype);
	}
	if (st == LOOM_OK && mp->relu_after)
		st = loom_cuda_relu_fwd(c->err, c->stream, out, nd->dtype, out, nd->dtype,
					loom_shape_numel(&nd->shape));
	return st;
}

// ----------------------------------------------------------------------------
// op entries

loom_status loom_cuda_op_linear(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				const loom_cuda_io *io)
{
	return loom_cuda_run_staged(c, plan, v, io, loom_cuda_mm_run);
}

loom_status loom_cuda_op_matmul(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				const loom_cuda_io *io)
{
	return loom_cuda_run_staged(c, plan, v, io, loom_cuda_mm_run);
}

/* --dump-graph: a product's GELU epilogue, or the llm.c switches that took
 * on it (BGRADB, the wide alignment, padded rows); nothing otherwise. */
void loom_cuda_mm_note(const loom_cuda_node_plan *np, char *buf, size_t len)
{
	if (loom_cuda_mm_fp8_note(np, buf, len))
		return;
	if (np->mm.gelu != LOOM_NONE) {
		snprintf(buf, len, "cuBLASLt %s epilogue, writes %d", np->mm.dgelu ? "DGELU" : "GELU_AUX",
			 (int)np->mm.gelu);
		return;
	}
	/* The products' llm.c switches, where they took. */
	if (np->kind == LOOM_CUDA_PLAN_MM) {
		const loom_cuda_mm_plan *mp = &np->mm;
		char pads[96] = "";
		static const char *const what[3] = { "A", "B", "out" };
		for (int i = 0, o = 0; i < 3; i++)
			if (mp->pad[i].ld_pad && o < (int)sizeof(pads))
				o += snprintf(pads + o, sizeof(pads) - (size_t)o, "%s%s rows %d -> %d",
					      o ? ", " : "", what[i], mp->pad[i].ld, mp->pad[i].ld_pad);
		if (pads[0] || mp->wide_align || mp->bgrad != LOOM_NONE)
			snprintf(buf, len, "cuBLASLt%s%s%s%s%s", mp->bgrad != LOOM_NONE ? ", BGRADB" : "",
				 mp->wide_align ? ", aligned " : "",
				 mp->wide_align ? (mp->wide_align >= 256 ? "256" :
						   mp->wide_align >= 128 ? "128" :
						   mp->wide_align >= 64 ? "64" : "32") : "",
				 pads[0] ? ", padded: " : "", pads);
		return;
	}
}

// ----------------------------------------------------------------------------
// strided-batched products (attention)

/* The largest power of two, at most 256, that divides every x[i]: the
 * alignment the heuristic may rely on (its default assumes 256). */
static uint32_t common_align(const uint64_t *x, int n)
{
	uint32_t a = 256;
	for (int i = 0; i < n; i++)
		while (a > 1 && x[i] % a)
			a >>= 1;
	return a;
}

static loom_status batched_layout(loom_cuda_ctx *c, cublasLtMatrixLayout_t *l, cudaDataType_t dt,
				  int rows, int cols, int ld, int batch, int64_t stride)
{
	loom_status st = LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(l, dt, rows, cols, ld),
					   c->err, sizeof(c->err));
	if (st != LOOM_OK || batch <= 1)
		return st;
	st = LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
								 &batch, sizeof(batch)),
			       c->err, sizeof(c->err));
	if (st == LOOM_OK)
		st = LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
					       *l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
					       sizeof(stride)),
				       c->err, sizeof(c->err));
	return st;
}

static size_t cuda_type_size(cudaDataType_t t)
{
	return t == CUDA_R_32F ? 4 : 2;
}

/* A strided-batched product's descriptors and the heuristic's answer. */
typedef struct strided_plan {
	cublasLtMatmulDesc_t desc;
	cublasLtMatrixLayout_t la, lb, lc;
	cublasLtMatmulAlgo_t algo;
	int found; /* the heuristic gave an algorithm */
} strided_plan;

/* What a strided plan depends on (compared bytewise: zeroed first). */
typedef struct strided_key {
	int device, ta, tb, m, n, k, batch, lda, ldb, ldc;
	int64_t sa, sb, sc;
	int abt, ct, compute;
	uint32_t align;
} strided_key;

static void strided_free(strided_plan *sp)
{
	lt_destroy(sp->desc, sp->la, sp->lb, sp->lc);
	memset(sp, 0, sizeof(*sp));
}

/* Descriptors and the heuristic's first algorithm for g (found 0: none). */
static loom_status strided_make(loom_cuda_ctx *c, const loom_cuda_gemm *g, uint32_t align,
				cublasComputeType_t ct, strided_plan *sp)
{
	cublasLtMatmulPreference_t pref = NULL;
	cublasLtMatmulHeuristicResult_t res;
	int returned = 0;
	loom_status st;
	/* Row-major to column-major as in plan_with: cuBLAS's A is loom's B. */
	cublasOperation_t opa = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
	cublasOperation_t opb = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;

	memset(sp, 0, sizeof(*sp));
	st = LOOM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&sp->desc, ct, CUDA_R_32F), c->err,
			       sizeof(c->err));
	if (st == LOOM_OK)
		st = set_attr(c, sp->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa));
	if (st == LOOM_OK)
		st = set_attr(c, sp->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb));
	if (st == LOOM_OK)
		st = batched_layout(c, &sp->la, g->abt, g->tb ? g->k : g->n, g->tb ? g->n : g->k,
				    g->ldb, g->batch, g->sb);
	if (st == LOOM_OK)
		st = batched_layout(c, &sp->lb, g->abt, g->ta ? g->m : g->k, g->ta ? g->k : g->m,
				    g->lda, g->batch, g->sa);
	if (st == LOOM_OK)
		st = batched_layout(c, &sp->lc, g->ct, g->n, g->m, g->ldc, g->batch, g->sc);
	if (st == LOOM_OK)
		st = LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref), c->err, sizeof(c->err));
	/* No library workspace: the node's ws holds its own scores. */
	if (st == LOOM_OK)
		st = set_prefs(c, pref, 0, align);
	if (st == LOOM_OK)
		st = LOOM_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(c->lt, sp->desc, sp->la, sp->lb,
								      sp->lc, sp->lc, pref, 1, &res,
								      &returned),
				       c->err, sizeof(c->err));
	if (pref)
		cublasLtMatmulPreferenceDestroy(pref);
	if (st != LOOM_OK) {
		strided_free(sp);
		return st;
	}
	sp->found = returned > 0;
	if (sp->found)
		sp->algo = res.algo;
	return LOOM_OK;
}

/*
 * The heuristic's answers, cached for the process per shape, dtypes,
 * layout, alignment and device. GPT-2's attention made 576 queries a
 * step, each with its descriptors; every call of a step has a shape seen
 * before. Entries live until the process ends (descriptors are host
 * objects; an algorithm is valid on its device for any handle); when the
 * table is full, a new shape is queried per call.
 */
#define LOOM_LT_CACHE_MAX 256
static struct {
	pthread_mutex_t mu;
	int n;
	strided_key key[LOOM_LT_CACHE_MAX];
	strided_plan plan[LOOM_LT_CACHE_MAX];
} lt_cache = { PTHREAD_MUTEX_INITIALIZER, 0, {}, {} };

/* The cached plan of key (made on a miss); NULL with st OK when the table
 * is full. */
static const strided_plan *strided_cached(loom_cuda_ctx *c, const loom_cuda_gemm *g,
					  const strided_key *key, cublasComputeType_t ct,
					  loom_status *st)
{
	const strided_plan *found = NULL;
	*st = LOOM_OK;
	pthread_mutex_lock(&lt_cache.mu);
	for (int i = 0; i < lt_cache.n && !found; i++)
		if (!memcmp(&lt_cache.key[i], key, sizeof(*key)))
			found = &lt_cache.plan[i];
	if (!found && lt_cache.n < LOOM_LT_CACHE_MAX) {
		*st = strided_make(c, g, key->align, ct, &lt_cache.plan[lt_cache.n]);
		if (*st == LOOM_OK) {
			lt_cache.key[lt_cache.n] = *key;
			found = &lt_cache.plan[lt_cache.n++];
		}
	}
	pthread_mutex_unlock(&lt_cache.mu);
	return found;
}

loom_status loom_cuda_gemm_strided(loom_cuda_ctx *c, const loom_cuda_gemm *g, int *done)
{
	const size_t ab = cuda_type_size(g->abt), cb = cuda_type_size(g->ct);
	const uint64_t addrs[6] = {
		(uint64_t)(uintptr_t)g->a, (uint64_t)(uintptr_t)g->b, (uint64_t)(uintptr_t)g->c,
		(uint64_t)g->sa * ab,      (uint64_t)g->sb * ab,      (uint64_t)g->sc * cb,
	};
	uint32_t align = common_align(addrs, g->batch > 1 ? 6 : 3);
	loom_status st = LOOM_OK;

	*done = 0;
	if (g->batch <= 0 || g->m <= 0 || g->n <= 0)
		return LOOM_OK;
	const cublasComputeType_t ct = g->abt == CUDA_R_32F && c->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 :
									 CUBLAS_COMPUTE_32F;
	const strided_plan *sp = NULL;
	strided_plan own;
	memset(&own, 0, sizeof(own));
	strided_key key;
	memset(&key, 0, sizeof(key));
	key.device = c->device, key.ta = g->ta, key.tb = g->tb, key.m = g->m, key.n = g->n;
	key.k = g->k, key.batch = g->batch, key.lda = g->lda, key.ldb = g->ldb;
	key.ldc = g->ldc, key.sa = g->sa, key.sb = g->sb, key.sc = g->sc;
	key.abt = (int)g->abt, key.ct = (int)g->ct, key.compute = (int)ct, key.align = align;
	sp = strided_cached(c, g, &key, ct, &st);
	if (st != LOOM_OK)
		return st;
	if (!sp) { /* the table is full */
		if ((st = strided_make(c, g, align, ct, &own)) != LOOM_OK)
			return st;
		sp = &own;
	}
	if (sp->found) {
		st = LOOM_CUBLAS_CHECK(cublasLtMatmul(c->lt, sp->desc, &g->alpha, g->b, sp->la, g->a,
						      sp->lb, &g->beta, g->c, sp->lc, g->c, sp->lc,
						      &sp->algo, NULL, 0, c->stream),
				       c->err, sizeof(c->err));
		*done = st == LOOM_OK;
	}
	strided_free(&own);
	return st;
}
