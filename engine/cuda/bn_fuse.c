/*
 * engine/cuda/bn_fuse.c — the plan-level rules of cuDNN's fused batch-norm
 * calls on CUDA (bn_fuse.h): which add runs its batch norm, which
 * backward does its relu's (or its add + relu's) backward, and where the
 * forward's reserve lives. Plain C, no CUDA: fuse_plan.cu asks it, and so
 * does a CPU test.
 */
#include <stdlib.h>

#include "engine/cuda/bn_fuse.h"
#include "graph/ops/ops.h"

#define ALIGN 256 /* LOOM_CUDA_ALIGN */

static size_t align_up(size_t x)
{
	return (x + ALIGN - 1) & ~(size_t)(ALIGN - 1);
}

int *loom_cuda_first_steps(const loom_plan *p)
{
	const loom_graph *g = p->g;
	int *step_of = malloc(sizeof(int) * (size_t)(g->n ? g->n : 1));
	if (!step_of)
		return NULL;
	for (loom_value v = 0; v < g->n; v++)
		step_of[v] = -1;
	for (int i = 0; i < p->n_steps; i++)
		if (p->steps[i].kind == LOOM_STEP_NODE && p->steps[i].v != LOOM_NONE &&
		    step_of[p->steps[i].v] < 0)
			step_of[p->steps[i].v] = i;
	return step_of;
}

int loom_cuda_bytes_meet(const loom_plan *p, loom_value a, loom_value b, int *same)
{
	*same = 0;
	if (p->mp.region[a] != p->mp.region[b])
		return 0;
	size_t a0 = p->mp.offset[a], a1 = a0 + loom_plan_value_bytes(p, a);
	size_t b0 = p->mp.offset[b], b1 = b0 + loom_plan_value_bytes(p, b);
	*same = a0 == b0 && a1 == b1;
	return a0 < b1 && b0 < a1;
}

int loom_cuda_read_after(const loom_plan *p, loom_value v, const int *step_of, int after)
{
	const loom_graph *g = p->g;
	for (loom_value w = 0; w < g->n; w++)
		for (int i = 0; i < g->nodes[w].nsrc; i++)
			if (g->nodes[w].src[i] == v && step_of[w] > after)
				return 1;
	return 0;
}

/* Whether node w reads value v. */
static int reads(const loom_graph *g, loom_value w, loom_value v)
{
	for (int i = 0; i < g->nodes[w].nsrc; i++)
		if (g->nodes[w].src[i] == v)
			return 1;
	return 0;
}

loom_value loom_cuda_bn_add_match(const loom_plan *p, const int *step_of, loom_value a,
				  const unsigned char *cudnn_nhwc, const loom_value *taken,
				  loom_value *z)
{
	const loom_graph *g = p->g;
	const loom_node *an = &g->nodes[a];
	*z = LOOM_NONE;
	if (an->op != LOOM_OP_ADD || !an->a.ew.relu || an->nsrc != 2 ||
	    an->format != LOOM_FORMAT_NHWC || step_of[a] < 0)
		return LOOM_NONE;
	for (int k = 0; k < 2; k++) {
		loom_value b = an->src[k], zz = an->src[1 - k];
		const loom_node *bn = &g->nodes[b];
		if (bn->op != LOOM_OP_BATCHNORM2D || bn->a.bn.relu || bn->a.bn.sync ||
		    (bn->flags & LOOM_NODE_OUTPUT) || !cudnn_nhwc[b] || taken[b] != LOOM_NONE ||
		    b == zz)
			continue;
		if (bn->dtype != an->dtype || g->nodes[zz].dtype != an->dtype ||
		    g->nodes[bn->src[0]].dtype != an->dtype || !loom_shape_eq(&bn->shape, &an->shape) ||
		    !loom_shape_eq(&g->nodes[zz].shape, &an->shape))
			continue;
		if (step_of[b] < 0 || step_of[zz] < 0 || step_of[b] > step_of[a] ||
		    step_of[zz] > step_of[a])
			continue;
		/* b read by a alone */
		int others = 0;
		for (loom_value w = 0; w < g->n && !others; w++)
			others = w != a && reads(g, w, b);
		if (others)
			continue;
		loom_value x = bn->src[0];
		int same;
		if (!loom_cuda_read_after(p, x, step_of, step_of[a]) ||
		    loom_cuda_bytes_meet(p, a, x, &same) || loom_cuda_bytes_meet(p, a, zz, &same))
			continue;
		*z = zz;
		return b;
	}
	return LOOM_NONE;
}

/* Whether value v is in the arena's memory plan (bytes_meet can ask). */
static int planned(const loom_plan *p, loom_value v)
{
	return v != LOOM_NONE && loom_plan_value_bytes(p, v) > 0;
}

/* Which call b may make: LOOM_CUDA_BN_EX_ACT when its dy comes from the
 * relu backward r of its forward f's output, ADD_ACT when r is that of
 * the add f's output feeds; r runs before b and is no graph output. 0 for
 * neither. */
static int bwd_ops(const loom_graph *g, const int *step_of, loom_value b, loom_value f,
		   const loom_value *add_by)
{
	const loom_node *bn = &g->nodes[b], *fn = &g->nodes[f];
	loom_value r = bn->src[2];
	const loom_node *rn = &g->nodes[r];
	if (rn->op != LOOM_OP_RELU_BWD || (rn->flags & LOOM_NODE_OUTPUT) || step_of[r] < 0 ||
	    step_of[b] <= step_of[r])
		return 0;
	loom_value y = rn->src[0];
	if (fn->a.bn.relu && y == f)
		return LOOM_CUDA_BN_EX_ACT;
	if (!fn->a.bn.relu && add_by[f] != LOOM_NONE && y == add_by[f])
		return LOOM_CUDA_BN_EX_ADD_ACT;
	return 0;
}

/* One dtype and shape through: cuDNN's y, dy, dz and dx descriptors are
 * the one x descriptor. */
static int one_x_desc(const loom_graph *g, const loom_node *bn, const loom_node *rn)
{
	loom_value y = rn->src[0], dy = rn->src[1];
	return rn->dtype == bn->dtype && g->nodes[y].dtype == bn->dtype &&
	       g->nodes[dy].dtype == bn->dtype && loom_shape_eq(&g->nodes[y].shape, &bn->shape) &&
	       loom_shape_eq(&g->nodes[dy].shape, &bn->shape) &&
	       loom_shape_eq(&rn->shape, &bn->shape);
}

/* r's readers: b and what b's call makes; under ADD_ACT, where the call
 * writes r's output, also nodes run after b. */
static int readers_ok(const loom_graph *g, const int *step_of, loom_value b, loom_value r,
		      const unsigned char *makes, int ops)
{
	for (loom_value w = 0; w < g->n; w++) {
		if (w == b || !reads(g, w, r) || makes[w])
			continue;
		if (ops == LOOM_CUDA_BN_EX_ACT || step_of[w] <= step_of[b])
			return 0;
	}
	return 1;
}

/* Between r and b: nothing reads r (not yet written) or writes over what
 * b reads (reads_b, 5 values). */
static int between_ok(const loom_plan *p, const int *step_of, loom_value b, loom_value r,
		      const loom_value *reads_b)
{
	const loom_graph *g = p->g;
	for (int i = step_of[r] + 1; i < step_of[b]; i++) {
		if (p->steps[i].kind != LOOM_STEP_NODE || p->steps[i].noop ||
		    p->steps[i].v == LOOM_NONE)
			continue;
		loom_value w = p->steps[i].v;
		if (reads(g, w, r))
			return 0;
		for (int k = 0; k < 5; k++) {
			int same;
			if (planned(p, w) && planned(p, reads_b[k]) &&
			    loom_cuda_bytes_meet(p, w, reads_b[k], &same))
				return 0;
		}
	}
	return 1;
}

/* What b writes, apart from what it reads (reads_b, 5 values) and from
 * each other. */
static int writes_ok(const loom_plan *p, loom_value b, loom_value r, int ops,
		     const unsigned char *makes, const loom_value *reads_b)
{
	const loom_graph *g = p->g;
	loom_value writes[8];
	int nw = 0;
	writes[nw++] = b;
	if (ops == LOOM_CUDA_BN_EX_ADD_ACT)
		writes[nw++] = r;
	for (loom_value w = 0; w < g->n && nw < 8; w++)
		if (makes[w])
			writes[nw++] = w;
	for (int i = 0; i < nw; i++) {
		int same;
		if (!planned(p, writes[i]))
			return 0;
		/* dx exactly on y or dy is allowed (the memory plan puts it
		 * there: both are dead after r for the plan), as cuDNN's last
		 * pass reads each element of y and dy before it writes that
		 * element of dx: an assumption of this rule, which the GPU rows
		 * (test_cuda_ops, poisoned) check; never partly over them. */
		for (int k = 0; k < 5; k++)
			if (planned(p, reads_b[k]) &&
			    loom_cuda_bytes_meet(p, writes[i], reads_b[k], &same) &&
			    !(i == 0 && (k == 2 || k == 3) && same))
				return 0;
		for (int j = i + 1; j < nw; j++)
			if (loom_cuda_bytes_meet(p, writes[i], writes[j], &same))
				return 0;
	}
	return 1;
}

int loom_cuda_bn_bwd_match(const loom_plan *p, const int *step_of, loom_value b, loom_value f,
			   const loom_value *add_by, const unsigned char *makes,
			   loom_cuda_bn_bwd_fusion *out)
{
	const loom_graph *g = p->g;
	const loom_node *bn = &g->nodes[b], *fn = &g->nodes[f];
	out->ops = LOOM_CUDA_BN_EX_NONE;
	out->relu_bwd = out->y = out->dy = out->beta = LOOM_NONE;
	if (bn->op != LOOM_OP_BN_BWD_DATA || fn->op != LOOM_OP_BATCHNORM2D || step_of[b] < 0)
		return 0;
	int ops = bwd_ops(g, step_of, b, f, add_by);
	loom_value r = bn->src[2];
	const loom_node *rn = &g->nodes[r];
	if (!ops || !one_x_desc(g, bn, rn) || !readers_ok(g, step_of, b, r, makes, ops))
		return 0;
	loom_value y = rn->src[0], dy = rn->src[1];
	const loom_value reads_b[5] = { bn->src[0], bn->src[1], y, dy, fn->src[2] };
	if (!between_ok(p, step_of, b, r, reads_b) || !writes_ok(p, b, r, ops, makes, reads_b))
		return 0;
	out->ops = ops;
	out->relu_bwd = r;
	out->y = y;
	out->dy = dy;
	out->beta = fn->src[2];
	return ops;
}

size_t loom_cuda_bn_reserve_off(int64_t c)
{
	/* room for either family's statistics (f32 or f64 pairs) */
	return align_up(2 * sizeof(double) * (size_t)c);
}

size_t loom_cuda_bn_slot_bytes(int64_t c, size_t reserve)
{
	return reserve ? loom_cuda_bn_reserve_off(c) + reserve : 2 * sizeof(double) * (size_t)c;
}
