/*
 * amp/amp_pass.c — the cast-insertion pass (apex O0..O3, fp16 or bf16).
 * Rewrites the forward graph before autodiff: decides each op's compute
 * dtype from the level's policy, inserts explicit CAST nodes where a source
 * has another dtype, turns parameters into half (O2: with an fp32 master
 * kept as a buffer; O3: without), and under amp.fp8 rounds each product's
 * operands and output gradient through fp8 (FP8_QDQ nodes). Nothing else in
 * loom knows about precision: autodiff differentiates the casts and the
 * roundings like any op.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amp/amp_pass.h"
#include "amp/fp8_scaling.h"
#include "graph/ops/ops.h"

static int is_half(loom_dtype dt)
{
	return dt == LOOM_F16 || dt == LOOM_BF16;
}

int loom_amp_uses_scaling(const loom_amp_opts *o)
{
	if (o->static_scale > 0)
		return 1;
	return (o->level == LOOM_O1 || o->level == LOOM_O2) && o->half == LOOM_F16;
}

/* The recipe of LOOM_FP8_SCALING_DEFAULT: the faster one that held the
 * loss gaps on the CPU (bench/RESULTS.md, "FP8 scaling recipes": delayed
 * casts in one pass, current takes the amax in a pass of its own). */
#define FP8_DEFAULT_RECIPE LOOM_FP8_SCALING_DELAYED

loom_fp8_scaling loom_fp8_recipe(const loom_amp_opts *o)
{
	return o->fp8_scaling == LOOM_FP8_SCALING_DEFAULT ? FP8_DEFAULT_RECIPE :
							   (loom_fp8_scaling)o->fp8_scaling;
}

int loom_fp8_history(const loom_amp_opts *o)
{
	return o->fp8_history > 0 ? o->fp8_history : LOOM_FP8_HISTORY_DEFAULT;
}

/* The recipe's settings: in range, and only where they mean something. */
static int check_fp8_scaling(const loom_amp_opts *o, char *err, size_t errlen)
{
	if (o->fp8_scaling < 0 || o->fp8_scaling >= LOOM_FP8_SCALING_COUNT) {
		snprintf(err, errlen, "amp: unknown fp8_scaling %d", o->fp8_scaling);
		return 1;
	}
	if (o->fp8_history < 0 || o->fp8_history > LOOM_FP8_HISTORY_MAX ||
	    o->fp8_margin < 0 || o->fp8_margin > LOOM_FP8_MARGIN_MAX) {
		snprintf(err, errlen, "amp: fp8_history %d must be in [0, %d] and fp8_margin %d "
				      "in [0, %d]", o->fp8_history, LOOM_FP8_HISTORY_MAX,
			 o->fp8_margin, LOOM_FP8_MARGIN_MAX);
		return 1;
	}
	if (!o->fp8 && (o->fp8_scaling || o->fp8_history || o->fp8_margin)) {
		snprintf(err, errlen, "amp: fp8_scaling, fp8_history or fp8_margin without fp8");
		return 1;
	}
	if (o->fp8 && loom_fp8_recipe(o) != LOOM_FP8_SCALING_DELAYED &&
	    (o->fp8_history || o->fp8_margin)) {
		snprintf(err, errlen, "amp: fp8_history and fp8_margin are delayed scaling's; "
				      "this plan scales by current scaling");
		return 1;
	}
	return 0;
}

static int keep_bn_fp32(const loom_amp_opts *o)
{
	if (o->keep_batchnorm_fp32 >= 0)
		return o->keep_batchnorm_fp32;
	return o->level != LOOM_O3;
}

loom_status loom_amp_check(const loom_amp_opts *o, char *err, size_t errlen)
{
	if ((unsigned)o->level >= LOOM_OPT_LEVEL_COUNT) {
		snprintf(err, errlen, "amp: unknown opt level %d", (int)o->level);
		return LOOM_ERR_INVALID;
	}
	if (o->half != LOOM_F16 && o->half != LOOM_BF16) {
		snprintf(err, errlen, "amp: precision must be fp16 or bf16, got %s",
			 loom_dtype_name(o->half));
		return LOOM_ERR_INVALID;
	}
	if (o->level == LOOM_O0 && (o->static_scale > 0 || o->keep_batchnorm_fp32 == 0)) {
		snprintf(err, errlen, "amp: O0 is fp32 everywhere: a loss scale or "
				      "keep_batchnorm_fp32=0 makes no sense with it");
		return LOOM_ERR_INVALID;
	}
	if (o->level == LOOM_O1 && o->keep_batchnorm_fp32 >= 0) {
		snprintf(err, errlen, "amp: O1 keeps weights fp32 and patches ops; "
				      "keep_batchnorm_fp32 applies to O2 and O3 only (as apex)");
		return LOOM_ERR_INVALID;
	}
	if (o->bn_half && o->level != LOOM_O1) {
		snprintf(err, errlen, "amp: bn_half applies to O1 only (O2 and O3 choose batch "
				      "norm's precision by keep_batchnorm_fp32)");
		return LOOM_ERR_INVALID;
	}
	if (o->fp8 && o->half != LOOM_BF16) {
		snprintf(err, errlen, "amp: fp8 runs everything but the products in bf16: "
				      "half must be bf16, got %s", loom_dtype_name(o->half));
		return LOOM_ERR_INVALID;
	}
	if (o->fp8_all_products && !o->fp8) {
		snprintf(err, errlen, "amp: fp8_all_products without fp8");
		return LOOM_ERR_INVALID;
	}
	if (check_fp8_scaling(o, err, errlen))
		return LOOM_ERR_INVALID;
	if (o->half == LOOM_BF16 && o->static_scale > 0) {
		snprintf(err, errlen, "amp: bf16 has fp32's range and needs no loss scale");
		return LOOM_ERR_INVALID;
	}
	if (o->static_scale < 0 || (o->static_scale == 0 && loom_amp_uses_scaling(o) &&
				    !(o->init_scale > 0))) {
		snprintf(err, errlen, "amp: loss scale %g must be positive",
			 o->static_scale < 0 ? o->static_scale : o->init_scale);
		return LOOM_ERR_INVALID;
	}
	return LOOM_OK;
}

typedef struct pass {
	loom_graph *src;  /* the graph before the pass */
	loom_graph *dst;  /* the graph being written */
	loom_value *map;  /* src value -> dst value */
	loom_value *cast; /* per dst value and dtype: its cast, memoised */
	int cast_cap;
	const loom_amp_opts *o;
	int masters; /* O2: give half parameters an fp32 master */
	loom_dtype half;
	int fp8;            /* products through fp8 (O1, O2 with amp.fp8) */
	char *classifier;   /* per src value: the first or last product, kept bf16 */
	loom_value *qdq;    /* per dst value: its E4M3 rounding, memoised */
	int qdq_cap;
} pass;

static loom_value *cast_slot(pass *ps, loom_value v, loom_dtype dt)
{
	if (v >= ps->cast_cap) {
		int cap = ps->cast_cap ? ps->cast_cap : 64;
		while (cap <= v)
			cap *= 2;
		loom_value *c = realloc(ps->cast, sizeof(loom_value) * cap * LOOM_DTYPE_COUNT);
		if (!c)
			return NULL;
		for (int i = ps->cast_cap * LOOM_DTYPE_COUNT; i < cap * LOOM_DTYPE_COUNT; i++)
			c[i] = LOOM_NONE;
		ps->cast = c;
		ps->cast_cap = cap;
	}
	return &ps->cast[v * LOOM_DTYPE_COUNT + dt];
}

/* v (a dst value) in dtype dt: itself, or its one CAST node. */
static loom_value as_dtype(pass *ps, loom_value v, loom_dtype dt)
{
	loom_graph *g = ps->dst;
	if (v == LOOM_NONE || g->nodes[v].dtype == dt || !loom_is_float(g->nodes[v].dtype))
		return v;
	loom_value *slot = cast_slot(ps, v, dt);
	if (!slot)
		return loom_graph_fail(g, LOOM_ERR_NOMEM, "amp: out of memory");
	if (*slot == LOOM_NONE) {
		loom_shape s = g->nodes[v].shape;
		*slot = loom_node_add(g, LOOM_OP_CAST, dt, s, 1, &v);
		if (*slot != LOOM_NONE)
			g->nodes[*slot].flags |= LOOM_NODE_AMP;
	}
	return *slot;
}

/* v (a dst value) rounded through E4M3: its one FP8_QDQ node, shared by
 * every product that reads it (a weight read twice is rounded once). */
static loom_value as_e4m3(pass *ps, loom_value v)
{
	loom_graph *g = ps->dst;
	if (v >= ps->qdq_cap) {
		int cap = ps->qdq_cap ? ps->qdq_cap : 64;
		while (cap <= v)
			cap *= 2;
		loom_value *q = realloc(ps->qdq, sizeof(loom_value) * cap);
		if (!q)
			return loom_graph_fail(g, LOOM_ERR_NOMEM, "amp: out of memory");
		for (int i = ps->qdq_cap; i < cap; i++)
			q[i] = LOOM_NONE;
		ps->qdq = q;
		ps->qdq_cap = cap;
	}
	if (ps->qdq[v] == LOOM_NONE)
		ps->qdq[v] = loom_fp8_qdq_node(g, v, LOOM_FP8_E4M3, LOOM_F32);
	return ps->qdq[v];
}

static loom_value through_views(const loom_graph *s, loom_value w)
{
	while (loom_op_is_view(s->nodes[w].op))
		w = s->nodes[w].src[0];
	return w;
}

/* The first and last products, which FP8 keeps in bf16 (as Transformer
 * Engine's recipes do): each product that reads a model input (a fed
 * leaf, through views: an MLP's first layer; a GPT's first product reads
 * the embedding, a gather, and is not one), and the classifier, each
 * product whose output a loss-class op (FP32: the softmax cross-entropy,
 * the loss's reductions) reads through views (its logits' small
 * differences decide the loss). */
static int mark_classifiers(pass *ps)
{
	const loom_graph *s = ps->src;
	ps->classifier = calloc((size_t)(s->n ? s->n : 1), 1);
	if (!ps->classifier)
		return -1;
	for (int u = 0; u < s->n; u++) {
		const loom_node *n = &s->nodes[u];
		const loom_op_def *def = loom_op_defs[n->op];
		if (def->amp.fp8_src)
			for (int i = 0; i < n->nsrc; i++)
				if (loom_op_defs[s->nodes[through_views(s, n->src[i])].op]->flags &
				    LOOM_OPF_FED)
					ps->classifier[u] = 1;
		if (def->kind == LOOM_OPK_LEAF || def->amp.cls != LOOM_AMP_FP32)
			continue;
		for (int i = 0; i < n->nsrc; i++) {
			if (def->amp.keep & LOOM_SRC(i))
				continue;
			loom_value w = through_views(s, n->src[i]);
			if (loom_op_defs[s->nodes[w].op]->amp.fp8_src)
				ps->classifier[w] = 1;
		}
	}
	return 0;
}

/* Under fp8, product node v (in src) with its cast sources: E4M3 operands
 * (but the first and last products'). Returns whether it rounded them. */
static int fp8_sources(pass *ps, loom_value v, loom_value *srcs)
{
	const loom_node *n = &ps->src->nodes[v];
	const loom_op_amp *amp = &loom_op_defs[n->op]->amp;
	if (!ps->fp8 || !amp->fp8_src || (ps->classifier[v] && !ps->o->fp8_all_products))
		return 0;
	for (int i = 0; i < n->nsrc; i++)
		if (amp->fp8_src & LOOM_SRC(i))
			srcs[i] = as_e4m3(ps, srcs[i]);
	return 1;
}

/* Is leaf v a batch-norm parameter or statistic of some later node (the
 * op table's amp.bn_params: one of the sources that op keeps uncast)? */
static int is_bn_operand(const loom_graph *g, loom_value v)
{
	for (int u = v + 1; u < g->n; u++) {
		const loom_node *n = &g->nodes[u];
		const loom_op_amp *amp = &loom_op_defs[n->op]->amp;
		if (!amp->bn_params)
			continue;
		for (int i = 0; i < n->nsrc; i++)
			if (n->src[i] == v && (amp->keep & LOOM_SRC(i)))
				return 1;
	}
	return 0;
}

/* The dtype a leaf gets at this level. */
static loom_dtype leaf_dtype(pass *ps, loom_value v)
{
	const loom_node *n = &ps->src->nodes[v];
	if ((loom_op_defs[n->op]->flags & LOOM_OPF_FED) || n->dtype != LOOM_F32)
		return n->dtype;
	switch (ps->o->level) {
	case LOOM_O2:
	case LOOM_O3:
		if (is_bn_operand(ps->src, v) && keep_bn_fp32(ps->o))
			return LOOM_F32;
		return ps->half;
	default:
		return LOOM_F32;
	}
}

/* The compute dtype of op node n (in src), given its mapped sources: the
 * op table's AMP class at this level (see loom_amp_class). */
static loom_dtype op_dtype(pass *ps, const loom_node *n, const loom_value *srcs)
{
	loom_graph *g = ps->dst;
	const loom_op_def *def = loom_op_defs[n->op];
	int any_f32 = 0;
	if (def->flags & LOOM_OPF_VIEW)
		return g->nodes[srcs[0]].dtype; /* a view: never a cast */
	for (int i = 0; i < n->nsrc; i++)
		if (g->nodes[srcs[i]].dtype == LOOM_F32)
			any_f32 = 1;
	switch (ps->o->level) {
	case LOOM_O1:
		/* bn_half: batch norm in its input's dtype, as autocast; its
		 * kept (fp32) parameters do not widen it. */
		if (def->amp.bn_params && ps->o->bn_half)
			return g->nodes[srcs[0]].dtype;
		switch (def->amp.cls) {
		case LOOM_AMP_ALLOW:
			return ps->half;
		case LOOM_AMP_DENY:
		case LOOM_AMP_FP32:
			return LOOM_F32;
		case LOOM_AMP_FOLLOW:
		default:
			return any_f32 ? LOOM_F32 : ps->half; /* the widest input */
		}
	case LOOM_O2:
		return def->amp.cls == LOOM_AMP_FP32 ? LOOM_F32 : ps->half;
	case LOOM_O3:
		return ps->half;
	default:
		return n->dtype;
	}
}

static loom_status run_pass(pass *ps, loom_value *loss)
{
	loom_graph *s = ps->src, *g = ps->dst;
	for (int v = 0; v < s->n && g->err.st == LOOM_OK; v++) {
		const loom_node *n = &s->nodes[v];
		loom_value srcs[LOOM_MAX_SRC];
		for (int i = 0; i < n->nsrc; i++)
			srcs[i] = ps->map[n->src[i]];
		const loom_op_def *def = loom_op_defs[n->op];
		if (def->kind == LOOM_OPK_LEAF) {
			loom_node copy = *n;
			copy.dtype = leaf_dtype(ps, v);
			loom_value nv = loom_node_add(g, n->op, copy.dtype, copy.shape, 0, NULL);
			if (nv == LOOM_NONE)
				break;
			g->nodes[nv] = copy;
			ps->map[v] = nv;
			/* O2: the fp32 master of a half parameter, a buffer the
			 * optimizer owns (it has no readers in the graph). */
			if ((def->flags & LOOM_OPF_TRAINABLE) && ps->o->level == LOOM_O2 &&
			    ps->masters && is_half(copy.dtype)) {
				loom_value m = loom_node_add(g, LOOM_OP_BUFFER, LOOM_F32, copy.shape, 0, NULL);
				if (m == LOOM_NONE)
					break;
				g->nodes[m].a = copy.a;
				g->nodes[m].flags |= LOOM_NODE_AMP;
				snprintf(g->nodes[m].name, LOOM_NAME_MAX, "%.56s.master", copy.name);
				g->nodes[nv].master = m;
			}
			continue;
		}
		/* Sources take the compute dtype, but for those the op keeps
		 * (batch norm's parameters and statistics, the labels). A
		 * view's compute dtype is its source's: nothing to cast. */
		loom_dtype dt = op_dtype(ps, n, srcs);
		for (int i = 0; i < n->nsrc; i++)
			if (!(def->amp.keep & LOOM_SRC(i)))
				srcs[i] = as_dtype(ps, srcs[i], dt);
		int fp8 = fp8_sources(ps, v, srcs);
		if (g->err.st != LOOM_OK)
			break;
		loom_value nv = loom_node_add(g, n->op, dt, n->shape, n->nsrc, srcs);
		if (nv == LOOM_NONE)
			break;
		g->nodes[nv].a = n->a;
		g->nodes[nv].flags = n->flags;
		memcpy(g->nodes[nv].name, n->name, LOOM_NAME_MAX);
		ps->map[v] = nv;
		/* Its readers read it through an identity whose backward
		 * rounds their gradient through E5M2: the product's backward
		 * takes an E5M2 dy. */
		if (fp8 && (ps->map[v] = loom_fp8_qdq_node(g, nv, LOOM_F32, LOOM_FP8_E5M2)) == LOOM_NONE)
			break;
	}
	if (g->err.st != LOOM_OK)
		return g->err.st;
	*loss = ps->map[*loss];
	/* The loss is read in fp32. */
	if (g->nodes[*loss].dtype != LOOM_F32 && g->nodes[*loss].dtype != LOOM_F64) {
		loom_value l = as_dtype(ps, *loss, LOOM_F32);
		if (l == LOOM_NONE)
			return g->err.st;
		g->nodes[l].flags |= LOOM_NODE_OUTPUT;
		*loss = l;
	}
	return LOOM_OK;
}

loom_status loom_amp_pass(loom_graph *g, loom_value *loss, const loom_amp_opts *o, int masters,
			  char *err, size_t errlen)
{
	loom_status st = loom_amp_check(o, err, errlen);
	if (st != LOOM_OK || o->level == LOOM_O0)
		return st;
	for (int v = 0; v < g->n; v++)
		if (g->nodes[v].dtype == LOOM_F64) {
			snprintf(err, errlen, "amp: %s is f64; mixed precision starts from an f32 model",
				 g->nodes[v].name[0] ? g->nodes[v].name : "a value");
			return LOOM_ERR_DTYPE;
		}
	pass ps = { 0 };
	ps.o = o;
	ps.masters = masters;
	ps.half = o->half;
	ps.fp8 = o->fp8 && (o->level == LOOM_O1 || o->level == LOOM_O2);
	ps.map = malloc(sizeof(loom_value) * (g->n ? g->n : 1));
	loom_graph *src;
	st = loom_graph_clone(g, &src);
	if (st == LOOM_OK)
		ps.src = src;
	if (st != LOOM_OK || !ps.map || (ps.fp8 && mark_classifiers(&ps) != 0)) {
		free(ps.map);
		free(ps.classifier);
		if (st == LOOM_OK)
			loom_graph_free(src);
		snprintf(err, errlen, "amp: out of memory");
		return LOOM_ERR_NOMEM;
	}
	ps.dst = g;
	g->n = 0; /* rewrite in place: g is refilled from the copy */
	st = run_pass(&ps, loss);
	if (st != LOOM_OK)
		snprintf(err, errlen, "%s", g->err.msg);
	free(ps.map);
	free(ps.cast);
	free(ps.qdq);
	free(ps.classifier);
	loom_graph_free(src);
	return st;
}
