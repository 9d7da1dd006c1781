/*
 * engine/cuda/fuse_plan.cu — the CUDA backend's passes over a whole plan,
 * run by plan_create after each node's own plan (backend.cu): the fused
 * classifier (a softmax-CE forward writing its backward's dlogits), the
 * saved region (batch norm's statistics, max pool's argmax, layer norm's
 * mean and rstd, softmax-CE's log-sum-exp, kept from a forward for its
 * backward), NHWC filters kept KRSC for the step, the relu backward done
 * by the split batch-norm backward, batch norm + add + relu as one cuDNN
 * call, cuDNN's Ex batch-norm backward with its relu fusions, then
 * fp8.cu's two: an FP8 cast's amax from the kernel writing its source,
 * and the decoded copies of stored fp8 sources. The
 * plan-level rules the CPU tests ask without a GPU are plain C in
 * bn_fuse.c; this file holds what reads the backend's node plans (a .cu:
 * cuda_internal.h is CUDA C++). No kernels. CPU twin: none (the CPU
 * backend fuses in graph/fuse.c alone).
 */
#include <stdlib.h>

#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_internal.h"

extern "C" {
#include "graph/ops/ops.h"
}

/* Which statistics batch-norm node v writes or reads in a saved slot: 1
 * cuDNN's (f32 mean and inverse std), 2 the split kernels' (f64 mean and
 * biased variance), 0 none. A forward and its backward share a slot only
 * when they agree. */
static int bn_family(const loom_cuda_ctx *c, const loom_plan *p, loom_value v)
{
	const loom_node *n = &p->g->nodes[v];
	if (c->plans[v].kind == LOOM_CUDA_PLAN_BN)
		return 1;
	return n->a.bn.sync ? 0 : 2;
}

/* Whether backward node w is the backward of forward node f: same x, the
 * same attributes where they matter. */
static int bn_pair(const loom_plan *p, loom_value f, loom_value w)
{
	const loom_node *a = &p->g->nodes[f], *b = &p->g->nodes[w];
	return (b->op == LOOM_OP_BN_BWD_DATA || b->op == LOOM_OP_BN_BWD_GAMMA) &&
	       b->src[0] == a->src[0] && b->a.bn.eps == a->a.bn.eps && b->a.bn.sync == a->a.bn.sync;
}

static int pool_pair(const loom_plan *p, loom_value f, loom_value w)
{
	const loom_node *a = &p->g->nodes[f], *b = &p->g->nodes[w];
	if (b->op != LOOM_OP_MAXPOOL2D_BWD || b->src[0] != a->src[0])
		return 0;
	loom_pool_shape sa, sb;
	loom_pool_shape_of(p->g, f, &sa);
	loom_pool_shape_of(p->g, w, &sb);
	return sa.k == sb.k && sa.stride == sb.stride && sa.pad == sb.pad && sa.relu == sb.relu &&
	       sa.h_out == sb.h_out && sa.w_out == sb.w_out;
}

/* Whether w is the backward that reads GPT forward f's saved slot: layer
 * norm's one-pass backward of the same x and eps; the softmax-CE backward
 * of the same logits and labels. */
static int gpt_pair(const loom_cuda_ctx *c, const loom_plan *p, loom_value f, loom_value w)
{
	const loom_node *a = &p->g->nodes[f], *b = &p->g->nodes[w];
	if (a->op == LOOM_OP_LAYERNORM)
		return b->op == LOOM_OP_LAYERNORM_BWD_DATA && b->src[0] == a->src[0] &&
		       b->a.ln.eps == a->a.ln.eps && c->plans[w].kind == LOOM_CUDA_PLAN_LN;
	return b->op == LOOM_OP_SOFTMAX_CE_BWD && b->src[0] == a->src[0] && b->src[1] == a->src[1];
}

/* A saved slot for layer norm (ln) or softmax-CE forward f, shared with
 * its backward: only where one forward reads that source and a backward
 * reads the slot. */
static void plan_saved_gpt(loom_cuda_ctx *c, const loom_plan *p, loom_value f, int ln)
{
	const loom_graph *g = p->g;
	const loom_node *n = &g->nodes[f];
	int readers = 0, twins = 0;
	for (loom_value w = 0; w < g->n; w++) {
		if (w != f && g->nodes[w].op == n->op && g->nodes[w].src[0] == n->src[0])
			twins++;
		readers += gpt_pair(c, p, f, w);
	}
	if (!readers || twins)
		return;
	const loom_node *x = &g->nodes[n->src[0]];
	size_t bytes = ln ? 2 * sizeof(double) * (size_t)loom_shape_rows(&x->shape) :
			    sizeof(float) * (size_t)x->shape.dims[0];
	for (loom_value w = 0; w < g->n; w++)
		if (w == f || gpt_pair(c, p, f, w)) {
			c->plans[w].saved_by = f;
			c->plans[w].saved_off = c->saved_bytes;
		}
	c->saved_bytes += loom_cuda_align(bytes);
}

/*
 * The saved region: a slot per batch-norm forward (its statistics) and per
 * max-pool forward (its argmax, one byte per output) whose backward the
 * graph has, shared by that backward. Outside the graph's memory plan: the
 * graph has no value for them (a node has one output), and they are small
 * (ResNet-50 b64: 12.8 MB of pool indices, 0.4 MB of statistics). Left
 * empty under pipeline stages, where a micro-batch's forward would
 * overwrite the slot before the previous one's backward read it, and
 * where a forward's x has more than one forward reading it.
 */
static void plan_saved(loom_cuda_ctx *c, const loom_plan *p)
{
	const loom_graph *g = p->g;
	c->saved_bytes = 0;
	if (p->pipe)
		return;
	for (loom_value f = 0; f < g->n; f++) {
		const loom_node *n = &g->nodes[f];
		int bn = n->op == LOOM_OP_BATCHNORM2D && bn_family(c, p, f);
		int pool = n->op == LOOM_OP_MAXPOOL2D;
		/* Layer norm's rows' mean and rstd (f64), the softmax-CE's rows'
		 * log-sum-exp (f32) when its forward does not do the backward. */
		int ln = n->op == LOOM_OP_LAYERNORM;
		int ce = n->op == LOOM_OP_SOFTMAX_CE && c->plans[f].ce_bwd == LOOM_NONE;
		if (ln || ce) {
			plan_saved_gpt(c, p, f, ln);
			continue;
		}
		if (!bn && !pool)
			continue;
		loom_pool_shape ps;
		if (pool) {
			loom_pool_shape_of(g, f, &ps);
			if (ps.k * ps.k >= 255) /* the index must fit a byte (255: none) */
				continue;
		}
		int readers = 0, twins = 0;
		for (loom_value w = 0; w < g->n; w++) {
			if (w != f && g->nodes[w].op == n->op && g->nodes[w].src[0] == n->src[0])
				twins++;
			if (bn ? bn_pair(p, f, w) && bn_family(c, p, w) == bn_family(c, p, f) :
				 pool_pair(p, f, w))
				readers++;
		}
		if (!readers || twins)
			continue;
		const int64_t ch = g->nodes[n->src[0]].shape.dims[1];
		/* An NHWC forward through the Ex call keeps its reserve here for
		 * the Ex backward (LOOM_CUDA_BN_BWD_EX), after the statistics. */
		loom_cuda_bn_plan *fb = &c->plans[f].bn;
		fb->reserve_slot = bn && c->bn_bwd_ex && bn_family(c, p, f) == 1 && fb->nhwc &&
				   fb->ex && fb->reserve_max > 0;
		size_t bytes = bn ? loom_cuda_bn_slot_bytes(ch, fb->reserve_slot ? fb->reserve_max : 0) :
				    (size_t)loom_shape_numel(&n->shape);
		for (loom_value w = 0; w < g->n; w++)
			if (w == f || (bn ? bn_pair(p, f, w) && bn_family(c, p, w) == bn_family(c, p, f) :
					    pool_pair(p, f, w))) {
				c->plans[w].saved_by = f;
				c->plans[w].saved_off = c->saved_bytes;
			}
		c->saved_bytes += loom_cuda_align(bytes);
	}
}

/* Every reader of value x is one of the n nodes in ok. */
static int read_only_by(const loom_graph *g, loom_value x, const loom_value *ok, int n)
{
	for (loom_value w = 0; w < g->n; w++)
		for (int i = 0; i < g->nodes[w].nsrc; i++) {
			if (g->nodes[w].src[i] != x)
				continue;
			int fine = 0;
			for (int k = 0; k < n; k++)
				fine |= w == ok[k];
			if (!fine)
				return 0;
		}
	return 1;
}

/* Whether the bytes of x (its storage and every view of it: GPT's
 * logits are a reshape of the product's output) are read by ok[0] and
 * ok[1] alone, through x, and none of them is an output. */
static int logits_private(const loom_plan *p, loom_value x, const loom_value *ok)
{
	const loom_graph *g = p->g;
	const loom_value root = p->mp.root[x];
	for (loom_value a = 0; a < g->n; a++) {
		if (p->mp.root[a] != root)
			continue;
		if (g->nodes[a].flags & LOOM_NODE_OUTPUT)
			return 0;
		if (a == x) {
			if (!read_only_by(g, a, ok, 2))
				return 0;
			continue;
		}
		/* Another alias: read only by views on the way to x. */
		for (loom_value w = 0; w < g->n; w++)
			for (int i = 0; i < g->nodes[w].nsrc; i++)
				if (g->nodes[w].src[i] == a && p->mp.root[w] != root)
					return 0;
	}
	return 1;
}

/*
 * The fused classifier: a softmax-CE forward f
 * writes its backward w's dlogits itself, in the same launch, where
 * - w is the one backward of f's logits and labels, and its dloss is the
 *   graph's seed (the loss scale, which the control block holds when the
 *   forward runs);
 * - the memory plan put dlogits exactly on the logits (the backward's
 *   in-place slot), and nothing else reads the logits (no output, no view):
 *   from f on, the logits' bytes are then nobody's but w's.
 * Without pipeline stages (a later micro-batch's forward would overwrite
 * the gradient of the one before). w is then skipped in a training run.
 */
static loom_value classifier_bwd(const loom_plan *p, loom_value f)
{
	const loom_graph *g = p->g;
	const loom_node *n = &g->nodes[f];
	if (n->op != LOOM_OP_SOFTMAX_CE || p->pipe)
		return LOOM_NONE;
	loom_value bwd = LOOM_NONE;
	int pairs = 0;
	for (loom_value w = 0; w < g->n; w++) {
		const loom_node *b = &g->nodes[w];
		if (b->op == LOOM_OP_SOFTMAX_CE_BWD && b->src[0] == n->src[0] && b->src[1] == n->src[1]) {
			bwd = w;
			pairs++;
		}
	}
	loom_value x = n->src[0];
	if (pairs != 1 || g->nodes[g->nodes[bwd].src[2]].op != LOOM_OP_GRAD_SEED)
		return LOOM_NONE;
	const loom_value ok[2] = { f, bwd };
	int same;
	if (!logits_private(p, x, ok) || !loom_cuda_bytes_meet(p, bwd, x, &same) || !same)
		return LOOM_NONE;
	return bwd;
}

static void plan_classifier(loom_cuda_ctx *c, const loom_plan *p)
{
	for (loom_value f = 0; f < p->g->n; f++) {
		loom_value bwd = classifier_bwd(p, f);
		if (bwd == LOOM_NONE)
			continue;
		c->plans[f].ce_bwd = bwd;
		c->plans[bwd].fused_into = f;
	}
}

/* Test hook: the plan-level choices above and matmul_cublaslt.cu's
 * loom_cuda_gelu_partner on any compiled plan, with no device. */
extern "C" void loom_cuda_test_gpt_fusions(const void *plan, int *ce_fused, int *gelu_aux,
					   int *dgelu)
{
	const loom_plan *p = (const loom_plan *)plan;
	*ce_fused = *gelu_aux = *dgelu = 0;
	for (loom_value v = 0; v < p->g->n; v++) {
		*ce_fused += classifier_bwd(p, v) != LOOM_NONE;
		const loom_op op = (loom_op)p->g->nodes[v].op;
		if (op != LOOM_OP_LINEAR && op != LOOM_OP_MATMUL)
			continue;
		int dg;
		loom_value aux;
		if (loom_cuda_gelu_partner(p, v, &dg, &aux) != LOOM_NONE)
			(dg ? *dgelu : *gelu_aux) += 1;
	}
}

/* Can the split backward b read relu backward r's sources (y, dy) in
 * r's place: r read by b and the siblings b writes alone, the same dtype
 * through (dr = dy or 0 exactly), no node computed between the two (so
 * y and dy still hold their values: their bytes may only have been given
 * to r's own output, which is never written, or to what b writes), and
 * every value b writes either apart from everything it reads or exactly
 * on it (each element read before it is written, by one thread). */
static int relu_bwd_fusable(const loom_cuda_ctx *c, const loom_plan *p, loom_value b,
			    loom_value r, const int *step_of)
{
	const loom_graph *g = p->g;
	const loom_node *bn = &g->nodes[b], *rn = &g->nodes[r];
	const loom_cuda_bn_plan *bp = &c->plans[b].bn;
	if (rn->op != LOOM_OP_RELU_BWD || (rn->flags & LOOM_NODE_OUTPUT) || step_of[r] < 0 ||
	    step_of[b] <= step_of[r])
		return 0;
	loom_value y = rn->src[0], dy = rn->src[1];
	if (rn->dtype != g->nodes[dy].dtype ||
	    loom_shape_numel(&g->nodes[y].shape) != loom_shape_numel(&rn->shape))
		return 0;
	for (loom_value w = 0; w < g->n; w++)
		for (int i = 0; i < g->nodes[w].nsrc; i++)
			if (g->nodes[w].src[i] == r && w != b &&
			    !(bp->own_makes && (w == bp->dgamma || w == bp->dbeta)))
				return 0;
	for (int i = step_of[r] + 1; i < step_of[b]; i++)
		if (p->steps[i].kind == LOOM_STEP_NODE && !p->steps[i].noop)
			return 0;
	const loom_value reads[4] = { bn->src[0], bn->src[1], y, dy };
	const loom_value writes[3] = { b, bp->own_makes ? bp->dgamma : LOOM_NONE,
				       bp->own_makes ? bp->dbeta : LOOM_NONE };
	for (int wi = 0; wi < 3; wi++)
		for (int ri = 0; writes[wi] != LOOM_NONE && ri < 4; ri++) {
			int same;
			if (loom_cuda_bytes_meet(p, writes[wi], reads[ri], &same) && !(wi == 0 && same))
				return 0;
		}
	return 1;
}

/*
 * Filters kept KRSC for the step (LOOM_CUDA_CONV_KRSC, on by default;
 * compiled, not run): loom holds weights KCRS, cuDNN's NHWC kernels read
 * KRSC, and each NHWC convolution reordered its filter into ws at every
 * call. A filter that two or more NHWC convolutions read (the forward and
 * the data gradient) gets a slot of the saved region, written by the first
 * of them in the steps (a step's value never changes within a run, and
 * every run that runs a later reader runs the first) and read by the rest.
 * ResNet-50 fp16: about 50 MB of copies.
 */
/* Whether node v is an NHWC convolution on cuDNN, run in the step, that
 * reads w as its filter (the forward or the data gradient) unchanged. */
static int krsc_reader(const loom_cuda_ctx *c, const loom_graph *g, const int *step_of,
		       loom_value v, loom_value w)
{
	const loom_node *n = &g->nodes[v];
	const loom_cuda_conv_plan *cp = &c->plans[v].conv;
	return c->plans[v].kind == LOOM_CUDA_PLAN_CONV && n->op != LOOM_OP_CONV2D_BWD_FILTER &&
	       n->src[1] == w && cp->ro[1] && cp->fmt == LOOM_FORMAT_NHWC && !cp->f32 &&
	       step_of[v] >= 0;
}

static void plan_conv_krsc(loom_cuda_ctx *c, const loom_plan *p, const int *step_of)
{
	const loom_graph *g = p->g;
	for (loom_value w = 0; w < g->n; w++) {
		loom_value first = LOOM_NONE;
		int readers = 0;
		for (loom_value v = 0; v < g->n; v++)
			if (krsc_reader(c, g, step_of, v, w) &&
			    (first == LOOM_NONE || step_of[v] < step_of[first]))
				first = v;
		for (loom_value v = 0; first != LOOM_NONE && v < g->n; v++)
			readers += krsc_reader(c, g, step_of, v, w) &&
				   g->nodes[v].dtype == g->nodes[first].dtype;
		if (readers < 2)
			continue;
		const size_t off = c->saved_bytes;
		for (loom_value v = 0; v < g->n; v++)
			if (krsc_reader(c, g, step_of, v, w) &&
			    g->nodes[v].dtype == g->nodes[first].dtype) {
				c->plans[v].conv.krsc_by = first;
				c->plans[v].conv.krsc_off = off;
			}
		c->saved_bytes += loom_cuda_align((size_t)loom_shape_numel(&g->nodes[w].shape) *
						  loom_dtype_size(g->nodes[first].dtype));
	}
}

/* The relu backwards the split batch-norm backward takes over
 * (LOOM_CUDA_BN_RELU_BWD): ResNet's bn -> relu pairs, whose forward
 * graph/fuse.c already fused. */
static void plan_relu_bwd(loom_cuda_ctx *c, const loom_plan *p, const int *step_of)
{
	const loom_graph *g = p->g;
	for (loom_value b = 0; b < g->n; b++) {
		const loom_node *bn = &g->nodes[b];
		if (bn->op != LOOM_OP_BN_BWD_DATA || bn->a.bn.sync ||
		    c->plans[b].kind != LOOM_CUDA_PLAN_NONE)
			continue;
		loom_value r = bn->src[2];
		if (!relu_bwd_fusable(c, p, b, r, step_of))
			continue;
		c->plans[b].bn.relu_bwd = r;
		c->plans[b].bn.relu_y = g->nodes[r].src[0];
		c->plans[b].bn.relu_dy = g->nodes[r].src[1];
		c->plans[r].fused_into = b;
	}
}

/*
 * Batch norm + residual add + relu as one cuDNN call (LOOM_CUDA_BN_ADD,
 * on by default; NHWC only, where cuDNN has it): ResNet's bn3 -> add ->
 * relu. The ADD node a (relu fused, NHWC) runs cudnnBatchNormalization-
 * ForwardTrainingEx with BN_ADD_ACTIVATION in place of batch norm b, its
 * one reader, writing relu(bn(x) + z) into a's output; b's own output is
 * never written (nothing else reads it) and b's step does nothing. At a's
 * step b's input x must still hold (something after a reads it: the
 * backward does), z is made, and a's output meets neither x nor z
 * (bn_fuse.c's loom_cuda_bn_add_match). The backward reads a's output in
 * the relu's backward, or in cuDNN's Ex backward with BN_ADD_ACTIVATION
 * (plan_bn_bwd_ex). Eval runs, and the diagnosis, run the two nodes as
 * they are.
 */
static void plan_bn_add(loom_cuda_ctx *c, const loom_plan *p, const int *step_of,
			unsigned char *nhwc, loom_value *taken)
{
	const loom_graph *g = p->g;
	for (loom_value v = 0; v < g->n; v++) {
		nhwc[v] = c->plans[v].kind == LOOM_CUDA_PLAN_BN && c->plans[v].bn.nhwc;
		taken[v] = LOOM_NONE;
	}
	for (loom_value a = 0; a < g->n; a++) {
		loom_value z, b = loom_cuda_bn_add_match(p, step_of, a, nhwc, taken, &z);
		if (b == LOOM_NONE)
			continue;
		size_t ws = 0, reserve = 0;
		if (loom_cuda_bn_add_sizes(c, &c->plans[b], &ws, &reserve) != LOOM_OK)
			continue;
		loom_cuda_node_plan *ap = &c->plans[a];
		ap->bn_add = b;
		ap->bn_add_z = z;
		ap->bn_add_ws = ws;
		ap->bn_add_reserve = reserve;
		/* the reserve in ws unless the saved slot holds it (plan_saved) */
		size_t need = loom_cuda_align(ws) +
			      (c->plans[b].bn.reserve_slot ? 0 : loom_cuda_align(reserve));
		if (ap->ws < need)
			ap->ws = need;
		c->plans[b].bn_add_by = a;
		taken[b] = a;
	}
	c->err[0] = 0;
}

/*
 * cuDNN's Ex backward for NHWC batch norm (LOOM_CUDA_BN_BWD_EX, on by
 * default; compiled, not run): backward b reads the statistics and the
 * reserve its forward's Ex call left in their saved slot (plan_saved), in
 * cudnnBatchNormalizationBackwardEx (CUDNN_BATCHNORM_SPATIAL_PERSISTENT),
 * its workspace after the dgamma/dbeta scratch. Where bn_fuse.c's rules
 * hold (LOOM_CUDA_BN_BWD_FUSE), the same call does the relu's backward
 * (the forward's fused relu: BN_ACTIVATION) or the add + relu's
 * (plan_bn_add's: BN_ADD_ACTIVATION, writing the relu backward's output as
 * dz, the residual branch's gradient); that relu backward then does
 * nothing. At run time the backward matches what its forward ran
 * (bn.ran_ex), else it runs the relu backward itself and the call that
 * fits (bn_cudnn.cu).
 */
static void plan_bn_bwd_ex(loom_cuda_ctx *c, const loom_plan *p, const int *step_of,
			   unsigned char *makes, loom_value *add_by)
{
	const loom_graph *g = p->g;
	for (loom_value v = 0; v < g->n; v++)
		add_by[v] = c->plans[v].bn_add_by;
	for (loom_value b = 0; b < g->n; b++) {
		loom_cuda_node_plan *np = &c->plans[b];
		loom_value f = np->saved_by;
		if (g->nodes[b].op != LOOM_OP_BN_BWD_DATA || np->kind != LOOM_CUDA_PLAN_BN ||
		    !np->bn.nhwc || f == LOOM_NONE || f == b || !c->plans[f].bn.reserve_slot)
			continue;
		size_t ws = 0;
		if (loom_cuda_bn_bwd_ex_ws(c, np, &ws) != LOOM_OK)
			continue;
		np->bn.bwd_ex = 1;
		np->bn.bwd_ws = ws;
		size_t need = loom_cuda_align(2 * sizeof(float) *
					      (size_t)g->nodes[g->nodes[b].src[0]].shape.dims[1]) +
			      loom_cuda_align(ws);
		if (np->lib_ws < need)
			np->lib_ws = need;
		if (np->ws < need)
			np->ws = need;
		if (!c->bn_bwd_fuse)
			continue;
		for (loom_value w = 0; w < g->n; w++)
			makes[w] = w != b && loom_cuda_plan_makes(np, w);
		loom_cuda_bn_bwd_fusion fu;
		if (!loom_cuda_bn_bwd_match(p, step_of, b, f, add_by, makes, &fu) ||
		    c->plans[fu.relu_bwd].fused_into != LOOM_NONE)
			continue;
		np->bn.fuse = fu;
		c->plans[fu.relu_bwd].fused_into = b;
	}
	c->err[0] = 0;
}

/* The passes that follow the steps' order, each behind its switch, with
 * the tables they share; a pipeline stage's plan keeps to the plain paths. */
static loom_status plan_step_ordered(loom_cuda_ctx *c, const loom_plan *p)
{
	if (p->pipe || !(c->conv_krsc || c->bn_relu_bwd || c->bn_add || c->bn_bwd_ex))
		return LOOM_OK;
	/* Each value's first step, and two scratch tables of a value each
	 * that a pass fills before it reads them. */
	const size_t n = p->g->n ? (size_t)p->g->n : 1;
	int *step_of = loom_cuda_first_steps(p);
	unsigned char *bytes = (unsigned char *)calloc(n, 1);
	loom_value *values = (loom_value *)malloc(sizeof(loom_value) * n);
	loom_status st = LOOM_OK;
	if (!step_of || !bytes || !values) {
		st = loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_NOMEM, "cuda: out of host memory");
		goto out_free;
	}
	if (c->conv_krsc)
		plan_conv_krsc(c, p, step_of);
	if (c->bn_relu_bwd)
		plan_relu_bwd(c, p, step_of);
	if (c->bn_add)
		plan_bn_add(c, p, step_of, bytes, values);
	if (c->bn_bwd_ex)
		plan_bn_bwd_ex(c, p, step_of, bytes, values);
out_free:
	free(step_of);
	free(bytes);
	free(values);
	return st;
}

loom_status loom_cuda_fuse_plan(loom_cuda_ctx *c, const loom_plan *p)
{
	plan_classifier(c, p);
	plan_saved(c, p);
	loom_status st = plan_step_ordered(c, p);
	/* After the GELU epilogue's choice (each product's plan): an FP8
	 * cast's amax from its producer's kernel (fp8.cu). */
	if (st == LOOM_OK)
		st = loom_cuda_fp8_amax_plan(c, p);
	/* A weight's cast's amax from the optimizer (fp8.cu); after the
	 * producers', which a cast keeps. */
	if (st == LOOM_OK)
		st = loom_cuda_fp8_wamax_plan(c, p);
	/* Last, after every pass that widens a node's ws: the decoded copies
	 * of stored fp8 sources a reader does not read as codes (fp8.cu). */
	if (st == LOOM_OK)
		st = loom_cuda_fp8_storage_plan(c, p);
	return st;
}
