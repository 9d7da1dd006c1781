/*
 * graph/fuse.c — the planner's fusion passes, run by loom_compile after
 * autodiff and before memory planning: relu into max-pool, linear, batch
 * norm and the residual add, the sibling outputs of one library call, the
 * residual add into its layer norm, a row norm's dx (layer norm, RMS
 * norm) into the residual's gradient and the embedding's gradient into
 * the tied table's.
 *
 * Relu + max-pool: maxpool(relu(x)) equals
 * relu(maxpool(x)) exactly (max and relu commute, ties and NaN included), so
 * the pool can read x and apply relu to its 4x smaller output; its backward
 * routes dy only where the window's max is > 0, which is relu's backward
 * too. The relu and its backward turn into views: two full-size passes and
 * their buffers disappear from every ConvNet/ResNet block that ends in
 * relu -> pool.
 */
#include <stdlib.h>

#include "graph/graph_internal.h"
#include "graph/ops/ops.h"

int loom_graph_readers(const loom_graph *g, loom_value v, loom_value *out, int max)
{
	int n = 0;
	for (int u = v + 1; u < g->n; u++) {
		const loom_node *nd = &g->nodes[u];
		for (int i = 0; i < nd->nsrc; i++) {
			if (nd->src[i] != v)
				continue;
			if (n == max)
				return -1;
			out[n++] = u;
			break;
		}
	}
	return n;
}

void loom_fuse_make_view(loom_graph *g, loom_value v, loom_value src)
{
	loom_node *n = &g->nodes[v];
	n->op = LOOM_OP_RESHAPE;
	n->nsrc = 1;
	n->src[0] = src;
	for (int i = 1; i < LOOM_MAX_SRC; i++)
		n->src[i] = LOOM_NONE;
}

int loom_fuse_relu_pool(loom_graph *g)
{
	int fused = 0;
	for (int r = 0; r < g->n; r++) {
		loom_node *rn = &g->nodes[r];
		if (rn->op != LOOM_OP_RELU || (rn->flags & (LOOM_NODE_OUTPUT | LOOM_NODE_GRAD)))
			continue;
		loom_value x = rn->src[0];
		/* The relu must feed exactly one pool and that pool's backward. */
		loom_value rd[3];
		int nr = loom_graph_readers(g, r, rd, 2);
		loom_value pool = LOOM_NONE, pool_bwd = LOOM_NONE;
		for (int i = 0; i < nr; i++) {
			const loom_node *u = &g->nodes[rd[i]];
			if (u->op == LOOM_OP_MAXPOOL2D && u->src[0] == r && pool == LOOM_NONE)
				pool = rd[i];
			else if (u->op == LOOM_OP_MAXPOOL2D_BWD && u->src[0] == r && pool_bwd == LOOM_NONE)
				pool_bwd = rd[i];
			else
				pool = pool_bwd = LOOM_NONE, nr = -1;
		}
		if (nr < 1 || pool == LOOM_NONE)
			continue;
		/* In training the pool's backward feeds only relu's backward. */
		loom_value relu_bwd = LOOM_NONE;
		if (pool_bwd != LOOM_NONE) {
			loom_value pr[2];
			if (loom_graph_readers(g, pool_bwd, pr, 1) != 1)
				continue;
			const loom_node *u = &g->nodes[pr[0]];
			if (u->op != LOOM_OP_RELU_BWD || u->src[0] != x || u->src[1] != pool_bwd ||
			    (g->nodes[pool_bwd].flags & (LOOM_NODE_OUTPUT | LOOM_NODE_GRAD)))
				continue;
			relu_bwd = pr[0];
		}
		g->nodes[pool].src[0] = x;
		g->nodes[pool].a.pool.relu = 1;
		if (pool_bwd != LOOM_NONE) {
			g->nodes[pool_bwd].src[0] = x;
			g->nodes[pool_bwd].a.pool.relu = 1;
			loom_fuse_make_view(g, relu_bwd, pool_bwd);
		}
		loom_fuse_make_view(g, r, x);
		fused++;
	}
	return fused;
}

/*
 * Linear + relu. relu(x w^T + b) is what cuBLASLt's RELU_BIAS epilogue
 * makes in the product's own pass; on the CPU the relu runs in place on the
 * product's output before any rounding to half: rounding keeps signs, so
 * the result is the unfused one's (in fp32 bit for bit; in half a tiny
 * negative that rounds to -0 now gives +0, an equal value).
 * relu's backward dx = dy * (x > 0) may read relu(x) instead of x: the two
 * are > 0 at the same elements. So the linear carries the relu, the relu
 * turns into a view, and the relu's backward reads the linear's output.
 */
/* The relu that is, with its backward, the only reader of v; else LOOM_NONE.
 * Then relu(v) may be computed in v's place: nothing else sees v's
 * negative values. */
static loom_value sole_relu(const loom_graph *g, loom_value v)
{
	if (g->nodes[v].flags & (LOOM_NODE_OUTPUT | LOOM_NODE_GRAD))
		return LOOM_NONE;
	/* Read by one relu, and in training by that relu's backward. */
	loom_value rd[2];
	int nr = loom_graph_readers(g, v, rd, 2);
	loom_value relu = LOOM_NONE;
	if (nr < 1)
		return LOOM_NONE;
	for (int i = 0; i < nr; i++) {
		const loom_node *u = &g->nodes[rd[i]];
		if (u->op == LOOM_OP_RELU && relu == LOOM_NONE)
			relu = rd[i];
		else if (u->op != LOOM_OP_RELU_BWD || u->src[0] != v || u->src[1] == v)
			return LOOM_NONE;
	}
	return relu;
}

/* The field by which a node of op carries its fused relu. */
static int *relu_flag(loom_node *n)
{
	return n->op == LOOM_OP_LINEAR ? &n->a.mm.relu :
	       n->op == LOOM_OP_BATCHNORM2D ? &n->a.bn.relu :
					      &n->a.ew.relu;
}

/* Each node of op that is the sole input of a relu takes the relu in: its
 * flag set, the relu a view of it. */
static int fuse_relu_into(loom_graph *g, loom_op op)
{
	int fused = 0;
	for (int v = 0; v < g->n; v++) {
		loom_node *n = &g->nodes[v];
		/* Backward's gradient sums are adds too; only forward ones
		 * have a relu after them. */
		if (n->op != op || *relu_flag(n) ||
		    (op == LOOM_OP_ADD && (n->flags & LOOM_NODE_BACKWARD)))
			continue;
		loom_value relu = sole_relu(g, v);
		if (relu == LOOM_NONE)
			continue;
		*relu_flag(n) = 1;
		loom_fuse_make_view(g, relu, v);
		fused++;
	}
	return fused;
}

int loom_fuse_linear_relu(loom_graph *g)
{
	return fuse_relu_into(g, LOOM_OP_LINEAR);
}

/*
 * Batch norm + relu and the residual add + relu, the two relus of every
 * ResNet block, on the linear's pattern: the op applies the relu in place
 * on its output before any rounding to half, the relu becomes a view, and
 * the relu's backward reads the op's (relu'd) output. Neither op's backward
 * reads its output (batch norm's reads x; add's passes dy on), so the
 * pre-relu value is not needed once the relu is applied. A relu that feeds
 * a pool belongs to loom_fuse_relu_pool, which runs first: after it the
 * batch norm is read by the pool and a view, never by a relu, and is left
 * alone here.
 */
int loom_fuse_bn_relu(loom_graph *g)
{
	return fuse_relu_into(g, LOOM_OP_BATCHNORM2D);
}

int loom_fuse_add_relu(loom_graph *g)
{
	return fuse_relu_into(g, LOOM_OP_ADD);
}

/*
 * Sibling outputs. Some libraries make several of the graph's values in one
 * call: cudnnBatchNormalizationBackward gives dx, dgamma and dbeta, and
 * cuBLASLt's BGRADB epilogue gives a linear's bias gradient (the column sums
 * of dy) with its weight gradient dy^T x, and the CUDA layer-norm backward
 * makes dgamma and dbeta in the pass that makes dx. Autodiff emits those as separate
 * nodes, producer first. This pass marks each sibling with made_by = the
 * producer: backends run the sibling when the producer runs (one library
 * call where they can, the sibling's own kernel right after otherwise), and
 * the memory planner gives the sibling its storage from the producer on.
 * A sibling is marked only when everything it reads exists by then.
 */

/* Does every source of node s exist before node at runs? */
static int sources_ready(const loom_graph *g, loom_value s, loom_value at)
{
	const loom_node *n = &g->nodes[s];
	for (int i = 0; i < n->nsrc; i++)
		if (n->src[i] >= at)
			return 0;
	return 1;
}

static int mark(loom_graph *g, loom_value sib, loom_value producer)
{
	loom_node *n = &g->nodes[sib];
	if (sib <= producer || n->made_by != LOOM_NONE || !sources_ready(g, sib, producer))
		return 0;
	n->made_by = producer;
	return 1;
}

/* The channel sum of dy over a [N, C, ...] or [N, C] gradient, after v. */
static loom_value channel_sum_of(const loom_graph *g, loom_value dy, loom_value after,
				 loom_dtype dt)
{
	for (int u = after + 1; u < g->n; u++) {
		const loom_node *n = &g->nodes[u];
		if (n->op == LOOM_OP_CHANNEL_SUM && n->src[0] == dy && n->dtype == dt &&
		    n->made_by == LOOM_NONE)
			return u;
	}
	return LOOM_NONE;
}

/* The column sums of dy seen as rows [N, C] (dy itself when 2-D, else a
 * reshape of it), after v: a layer norm's beta gradient. */
static loom_value rows_sum_of(const loom_graph *g, loom_value dy, loom_value after)
{
	for (int u = after + 1; u < g->n; u++) {
		const loom_node *n = &g->nodes[u];
		if (n->op != LOOM_OP_CHANNEL_SUM || n->made_by != LOOM_NONE)
			continue;
		loom_value s = n->src[0];
		const loom_node *r = &g->nodes[s];
		if (s == dy || (r->op == LOOM_OP_RESHAPE && r->src[0] == dy && r->shape.ndim == 2))
			return u;
	}
	return LOOM_NONE;
}

int loom_fuse_siblings(loom_graph *g)
{
	int marked = 0;
	for (int v = 0; v < g->n; v++) {
		const loom_node *n = &g->nodes[v];
		if (n->op == LOOM_OP_BN_BWD_DATA) {
			/* (x, gamma, dy) -> dx; dgamma = bn_bwd_gamma(x, dy) in
			 * gamma's dtype, dbeta = channel_sum(dy) in beta's
			 * (both the parameters' dtype: cuDNN writes them so). */
			loom_value x = n->src[0], gamma = n->src[1], dy = n->src[2];
			loom_dtype pdt = g->nodes[gamma].dtype;
			for (int u = v + 1; u < g->n; u++) {
				const loom_node *m = &g->nodes[u];
				if (m->op == LOOM_OP_BN_BWD_GAMMA && m->src[0] == x && m->src[1] == dy &&
				    m->dtype == pdt && m->made_by == LOOM_NONE) {
					marked += mark(g, u, v);
					break;
				}
			}
			loom_value s = channel_sum_of(g, dy, v, pdt);
			if (s != LOOM_NONE)
				marked += mark(g, s, v);
		} else if (n->op == LOOM_OP_LAYERNORM_BWD_DATA) {
			/* (x, gamma, dy) -> dx; dgamma = layernorm_bwd_gamma(x,
			 * dy), dbeta = channel_sum of dy's rows (any dtypes: one
			 * own kernel writes all three, engine/cuda/layernorm.cu). */
			loom_value x = n->src[0], dy = n->src[2];
			for (int u = v + 1; u < g->n; u++) {
				const loom_node *m = &g->nodes[u];
				if (m->op == LOOM_OP_LAYERNORM_BWD_GAMMA && m->src[0] == x &&
				    m->src[1] == dy && m->a.ln.eps == n->a.ln.eps &&
				    m->made_by == LOOM_NONE) {
					marked += mark(g, u, v);
					break;
				}
			}
			loom_value s = rows_sum_of(g, dy, v);
			if (s != LOOM_NONE)
				marked += mark(g, s, v);
		} else if (n->op == LOOM_OP_MATMUL && n->a.mm.ta && !n->a.mm.tb &&
			   g->nodes[n->src[0]].shape.ndim == 2) {
			/* dw = dy^T x: its bias gradient is the column sums of
			 * dy, in the same dtype (what BGRADB writes). */
			loom_value s = channel_sum_of(g, n->src[0], v, n->dtype);
			if (s != LOOM_NONE)
				marked += mark(g, s, v);
		}
	}
	return marked;
}

/*
 * Casts into producers. The AMP pass casts an op's fp32 result to half
 * where a half op reads it (layer norm -> the qkv product, the loss's
 * gradient -> the products' backward): a pass over the activation and a
 * buffer of its own. When the cast is the producer's only reader, the
 * producer writes half itself: its kernel still computes in fp32 and the
 * result is rounded once on the way out, the same rounding the cast made,
 * so the values are the same bits. The cast becomes a view of the producer.
 * Only narrowing casts: folding a widening one would skip a rounding the
 * unfused plan makes.
 */
/* A node that makes siblings keeps its dtype: the one-pass library calls
 * (batch norm's dx with dgamma and dbeta, a product with its bias
 * gradient) want all of theirs alike. The layer-norm backward's kernel
 * reads and writes each in its own dtype. */
static int keeps_dtype(const loom_graph *g, loom_value x)
{
	if (g->nodes[x].op == LOOM_OP_LAYERNORM_BWD_DATA)
		return 0;
	for (loom_value u = x + 1; u < g->n; u++)
		if (g->nodes[u].made_by == x)
			return 1;
	return 0;
}

static int foldable_producer(const loom_graph *g, loom_value x, loom_dtype to)
{
	const loom_node *n = &g->nodes[x];
	const loom_op_def *def = loom_op_defs[n->op];
	if (def->kind == LOOM_OPK_LEAF || (def->flags & LOOM_OPF_VIEW) || n->op == LOOM_OP_CAST ||
	    n->made_by != LOOM_NONE)
		return 0;
	if (n->flags & (LOOM_NODE_OUTPUT | LOOM_NODE_GRAD | LOOM_NODE_STAGE_CUT | LOOM_NODE_SHARDED))
		return 0;
	if (n->dtype != LOOM_F32 || (to != LOOM_BF16 && to != LOOM_F16))
		return 0;
	if (keeps_dtype(g, x))
		return 0;
	loom_value rd[2];
	return loom_graph_readers(g, x, rd, 1) == 1;
}

/*
 * A widening cast (half -> fp32) read by one kernel instead goes into that
 * kernel: the reader takes the half value itself and widens it as it
 * reads, exactly (a widening is exact), with no pass and no buffer of its
 * own. The cast, read by nobody now, becomes a view of its source in the
 * source's dtype. Not when the reader is a view or a cast (no kernel to
 * widen in) or reads the cast twice.
 */
static loom_value sole_kernel_reader(const loom_graph *g, loom_value c)
{
	loom_value rd[2];
	if (loom_graph_readers(g, c, rd, 1) != 1)
		return LOOM_NONE;
	const loom_node *r = &g->nodes[rd[0]];
	const loom_op_def *def = loom_op_defs[r->op];
	if (def->kind == LOOM_OPK_LEAF || (def->flags & LOOM_OPF_VIEW) || r->op == LOOM_OP_CAST ||
	    r->made_by != LOOM_NONE)
		return LOOM_NONE;
	if (keeps_dtype(g, rd[0]))
		return LOOM_NONE;
	int uses = 0;
	for (int i = 0; i < r->nsrc; i++)
		uses += r->src[i] == c;
	return uses == 1 ? rd[0] : LOOM_NONE;
}

/*
 * The readers of widening cast c when every one of them takes any dtype
 * (takes): kernels (no view, cast, sibling, node that keeps its dtype),
 * each reading c once. How many, up to max; 0 if any is not such a reader.
 */
static int taking_readers(const loom_graph *g, loom_value c, int (*takes)(loom_op),
			  loom_value *rd, int max)
{
	int n = loom_graph_readers(g, c, rd, max);
	if (n <= 0)
		return 0;
	for (int k = 0; k < n; k++) {
		const loom_node *r = &g->nodes[rd[k]];
		const loom_op_def *def = loom_op_defs[r->op];
		if (def->kind == LOOM_OPK_LEAF || (def->flags & LOOM_OPF_VIEW) ||
		    r->op == LOOM_OP_CAST || r->made_by != LOOM_NONE || !takes((loom_op)r->op) ||
		    keeps_dtype(g, rd[k]))
			return 0;
		int uses = 0;
		for (int i = 0; i < r->nsrc; i++)
			uses += r->src[i] == c;
		if (uses != 1)
			return 0;
	}
	return n;
}

int loom_fuse_casts(loom_graph *g)
{
	return loom_fuse_casts_for(g, NULL);
}

#define LOOM_FUSE_MAX_READERS 8

int loom_fuse_casts_for(loom_graph *g, int (*takes)(loom_op op))
{
	int fused = 0;
	for (int c = 0; c < g->n; c++) {
		loom_node *cn = &g->nodes[c];
		if (cn->op != LOOM_OP_CAST || (cn->flags & (LOOM_NODE_OUTPUT | LOOM_NODE_GRAD)))
			continue;
		loom_value x = cn->src[0];
		loom_dtype from = g->nodes[x].dtype;
		/* Through views (a reshape between the pool and the product)
		 * that the cast alone reads: they take the new dtype too. */
		loom_value p = x, rd[2];
		while ((loom_op_defs[g->nodes[p].op]->flags & LOOM_OPF_VIEW) &&
		       g->nodes[p].op == LOOM_OP_RESHAPE && loom_graph_readers(g, p, rd, 1) == 1 &&
		       !(g->nodes[p].flags & (LOOM_NODE_OUTPUT | LOOM_NODE_GRAD)))
			p = g->nodes[p].src[0];
		if ((!takes || takes((loom_op)g->nodes[p].op)) && foldable_producer(g, p, cn->dtype)) {
			for (loom_value q = x; q != p; q = g->nodes[q].src[0])
				g->nodes[q].dtype = cn->dtype;
			g->nodes[p].dtype = cn->dtype;
			g->nodes[p].flags |= LOOM_NODE_CAST_FOLDED;
			loom_fuse_make_view(g, c, x);
			fused++;
			continue;
		}
		if (cn->dtype != LOOM_F32 || (from != LOOM_BF16 && from != LOOM_F16))
			continue;
		/* The CPU's: one reader. A backend that names its ops: every
		 * reader of the cast, each taking the half value. */
		loom_value rds[LOOM_FUSE_MAX_READERS];
		int nr;
		if (takes)
			nr = taking_readers(g, c, takes, rds, LOOM_FUSE_MAX_READERS);
		else
			nr = (rds[0] = sole_kernel_reader(g, c)) == LOOM_NONE ? 0 : 1;
		if (nr == 0)
			continue;
		for (int k = 0; k < nr; k++) {
			loom_node *rn = &g->nodes[rds[k]];
			for (int i = 0; i < rn->nsrc; i++)
				if (rn->src[i] == c)
					rn->src[i] = x;
		}
		cn->dtype = from;
		loom_fuse_make_view(g, c, x);
		fused++;
	}
	return fused;
}

/*
 * The residual add into the layer norm that reads it (llm.c's
 * fused_residual_forward): in a pre-norm transformer each block's
 * h = h + f(ln(h)) is read by the next layer norm, so ADD writes the sum
 * and LAYERNORM reads it back, two passes over the rows. Marked here as a
 * sibling, the layer norm made by the add (made_by): the backend's add
 * kernel writes the sum (still a value of the graph: the next residual
 * and the backward read it) and the layer norm's outputs in one pass per
 * row. A sibling made with its maker may read it (the memory plan allows
 * that one read where a value is made). Only forward adds without a relu,
 * a layer norm that is the add's first layer-norm reader (a recomputed
 * copy in the backward stays apart), whose gamma and beta exist before
 * the add, and never across a pipeline stage's cut or a sharded value.
 * Run after the cast folding: the dtypes are then the plan's.
 */
/* Does v exist before node a runs: a leaf (a parameter made lazily after
 * a by the builder is still there from the start) or an earlier node? */
static int exists_before(const loom_graph *g, loom_value v, loom_value a)
{
	return v < a || loom_op_is_leaf(g->nodes[v].op);
}

static loom_value ln_reader(const loom_graph *g, loom_value a)
{
	for (loom_value u = a + 1; u < g->n; u++) {
		const loom_node *n = &g->nodes[u];
		if (n->op != LOOM_OP_LAYERNORM || n->src[0] != a)
			continue;
		if (n->made_by != LOOM_NONE || (n->flags & (LOOM_NODE_BACKWARD | LOOM_NODE_SHARDED)) ||
		    !exists_before(g, n->src[1], a) || !exists_before(g, n->src[2], a))
			return LOOM_NONE;
		return u;
	}
	return LOOM_NONE;
}

int loom_fuse_ln_residual(loom_graph *g, loom_ln_residual_fn fusable)
{
	const unsigned apart = LOOM_NODE_BACKWARD | LOOM_NODE_STAGE_CUT | LOOM_NODE_SHARDED;
	int fused = 0;
	for (loom_value a = 0; a < g->n; a++) {
		const loom_node *an = &g->nodes[a];
		if (an->op != LOOM_OP_ADD || an->a.ew.relu || (an->flags & apart) ||
		    an->made_by != LOOM_NONE || keeps_dtype(g, a))
			continue;
		loom_value ln = ln_reader(g, a);
		if (ln == LOOM_NONE || (fusable && !fusable(g, a, ln)))
			continue;
		g->nodes[ln].made_by = a;
		fused++;
	}
	return fused;
}

/*
 * Layer norm's dx added into the residual's gradient (llm.c's
 * layernorm_backward, which adds into dresidual): in a pre-norm
 * transformer each residual value h is read by a norm (layer norm, or RMS
 * norm as LLaMA's) and by the next residual add, so autodiff sums h's two
 * gradients in an ADD, the add's (passed through from the block's output)
 * and the norm's dx: dx written, then read back beside the other addend.
 * Here the norm's data gradient node d (LAYERNORM_BWD_DATA or
 * RMSNORM_BWD_DATA, both (x, gamma, dy) -> dx) takes that addend as
 * src[3] and makes the sum
 * (LOOM_NODE_ACCUM): dx rounded into its dtype, as d wrote it, then added
 * to the addend as the ADD did (two addends: the order does not matter),
 * the same bits. The ADD becomes a view of d. The memory plan writes the
 * sum over the addend where the addend dies at d (graph/memplan.c), as
 * llm.c's += does. Only where the ADD is dx's one reader, the addend
 * exists before d runs, dx and the sum share a dtype and a shape, and
 * neither is a kept value (an output, a parameter's gradient, a stage's
 * cut, a sharded value).
 */
/* The row norms' data gradients fuse alike: op LAYERNORM_BWD_DATA stands
 * for RMS norm's too. */
static int op_matches(loom_op have, loom_op op)
{
	return have == op ||
	       (op == LOOM_OP_LAYERNORM_BWD_DATA && have == LOOM_OP_RMSNORM_BWD_DATA);
}

static int accum_fits(const loom_graph *g, loom_value d, loom_value s, loom_value o, loom_op op,
		      int nsrc)
{
	const unsigned kept = LOOM_NODE_OUTPUT | LOOM_NODE_GRAD | LOOM_NODE_STAGE_CUT |
			      LOOM_NODE_SHARDED | LOOM_NODE_ACCUM;
	const loom_node *dn = &g->nodes[d], *sn = &g->nodes[s];
	loom_value rd[2];
	if (!op_matches(dn->op, op) || dn->nsrc != nsrc || (dn->flags & kept) ||
	    dn->made_by != LOOM_NONE || o == d || !exists_before(g, o, d))
		return 0;
	if (dn->dtype != sn->dtype || !loom_shape_eq(&dn->shape, &sn->shape) ||
	    !loom_shape_eq(&g->nodes[o].shape, &sn->shape))
		return 0;
	return loom_graph_readers(g, d, rd, 1) == 1 && rd[0] == s;
}

/* The sum s of a parameter's two gradients was the parameter's gradient:
 * d, which now makes it, is (s a view of d with no reader). */
static void grad_moves(loom_graph *g, loom_value s, loom_value d)
{
	if (!(g->nodes[s].flags & LOOM_NODE_GRAD))
		return;
	g->nodes[s].flags &= ~LOOM_NODE_GRAD;
	g->nodes[d].flags |= LOOM_NODE_GRAD;
	for (loom_value p = 0; p < g->n; p++)
		if (g->nodes[p].grad == s)
			g->nodes[p].grad = d;
}

/* Each backward ADD one of whose addends is an op node of nsrc sources
 * read by nothing else: that node takes the other addend as its last
 * source and makes the sum. grad: the sum may be a parameter's gradient. */
static int fuse_accum(loom_graph *g, loom_op op, int nsrc, int grad, loom_ln_bwd_accum_fn fusable)
{
	const unsigned kept = LOOM_NODE_OUTPUT | LOOM_NODE_STAGE_CUT | LOOM_NODE_SHARDED |
			      (grad ? 0 : LOOM_NODE_GRAD);
	int fused = 0;
	for (loom_value s = 0; s < g->n; s++) {
		loom_node *sn = &g->nodes[s];
		if (sn->op != LOOM_OP_ADD || sn->nsrc != 2 || sn->a.ew.relu ||
		    !(sn->flags & LOOM_NODE_BACKWARD) || (sn->flags & kept) ||
		    sn->made_by != LOOM_NONE)
			continue;
		for (int k = 0; k < 2; k++) {
			loom_value d = sn->src[k], o = sn->src[1 - k];
			if (!accum_fits(g, d, s, o, op, nsrc) || (fusable && !fusable(g, d, s, 1 - k)))
				continue;
			loom_node *dn = &g->nodes[d];
			dn->src[nsrc] = o;
			dn->nsrc = nsrc + 1;
			dn->flags |= LOOM_NODE_ACCUM;
			loom_fuse_make_view(g, s, d);
			grad_moves(g, s, d);
			fused++;
			break;
		}
	}
	return fused;
}

int loom_fuse_ln_bwd_accum(loom_graph *g, loom_ln_bwd_accum_fn fusable)
{
	return fuse_accum(g, LOOM_OP_LAYERNORM_BWD_DATA, 3, 0, fusable);
}

/*
 * The embedding's gradient added into the tied table's other gradient
 * (llm.c's encoder_backward, which scatter-adds into the classifier's dW):
 * a table read by an embedding and by the classifier (GPT-2's wte) gets
 * both gradients summed by autodiff's ADD, the scatter-add's [V, C]
 * written, zeroed where no id occurs, then read back beside dW. Here the
 * EMBEDDING_BWD node d takes dW as src[2] and makes the sum
 * (LOOM_NODE_ACCUM): each row's scatter-add in the same order, rounded
 * into d's dtype as d wrote it, then added to dW's row as the ADD did; the
 * ADD becomes a view of d. The sum is usually the table's gradient: then
 * d is (the parameter's grad, LOOM_NODE_GRAD), and the memory plan lends
 * dW the gradient's bytes where dW dies at d (graph/memplan.c), so the
 * product writes the gradient and d adds only the rows its ids touch.
 * Where the ADD is d's one reader, dW exists before d runs, and the sum
 * is no output, stage cut or sharded value.
 */
int loom_fuse_emb_bwd_accum(loom_graph *g, loom_ln_bwd_accum_fn fusable)
{
	return fuse_accum(g, LOOM_OP_EMBEDDING_BWD, 2, 1, fusable);
}
