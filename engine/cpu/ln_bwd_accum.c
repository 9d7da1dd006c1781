/*
 * engine/cpu/ln_bwd_accum.c — a row norm's data gradient (layer norm's or
 * RMS norm's) added into the residual's other gradient (graph/fuse.c's
 * loom_fuse_ln_bwd_accum; llm.c's layernorm_backward adds into
 * dresidual): one pass per block of rows makes dx and writes dx + the
 * addend, the same bits as LAYERNORM_BWD_DATA (or RMSNORM_BWD_DATA) then
 * autodiff's ADD.
 *
 * The same arithmetic in the same order: the norm's backward widens x,
 * gamma and dy to f32, runs its f32 row kernel (layernorm.c's or
 * rmsnorm.c's, the one norm_bf16.c's entries pick) and rounds dx
 * once into its dtype (norm_bf16.c and backend.c's emulation both do);
 * the add widens that stored dx and the addend to f32, adds and rounds
 * once into the sum's dtype (ops_elementwise.c's paths all do). Here the
 * rows go a block at a time through the stack, dx rounded and widened
 * back before the add reads it. The sum may be written over the addend
 * (the memory plan's in-place write): each element of the addend is read
 * before that element is written. f64 (gradient checks) is never fused.
 */
#include "base/half.h"
#include "base/options.h"
#include "engine/cpu/cpu_internal.h"
#include "engine/cpu/ops.h"

#define ROWS LOOM_CPU_BF16_ROWS

typedef struct ln_bwd_accum_args {
	int64_t rows;
	int c;
	double eps;
	loom_cpu_norm_bwd_data_f32 kernel; /* the norm's f32 rows */
	loom_cpu_arr x, gamma, dy, acc, out;
} ln_bwd_accum_args;

/* Rows [r0, r0 + nr) (loom_cpu_row_blocks' block; s->in: x, dy): dx
 * into f[0], rounded into the output's dtype and read back as the unfused
 * add reads it, then the addend added and the sum stored. */
static void block(const void *arg, int64_t r0, int64_t nr, loom_cpu_row_scratch *s)
{
	const ln_bwd_accum_args *g = arg;
	const int64_t off = r0 * g->c, n = nr * g->c;
	g->kernel(nr, g->c, s->in[0], s->par[0], s->in[1], g->eps, s->f[0]);
	loom_cpu_accum_store(g->out.t, g->out.p, g->acc.t, g->acc.p, off, n, s->f[0], s->f[1],
			     s->hb, 1);
}

/* ---------------------------------------------------------- planning */

int loom_cpu_ln_bwd_accum_fusable(const loom_graph *g, loom_value d, loom_value s, int other)
{
	const loom_node *dn = &g->nodes[d], *sn = &g->nodes[s];
	const int64_t c = loom_shape_last(&dn->shape);
	if (!loom_opt_bool(LOOM_OPT_FUSE_LN_BWD_ACCUM) || c <= 0 || c > ROWS)
		return 0;
	if (!loom_cpu_half_storable(dn->dtype) || !loom_cpu_half_storable(sn->dtype) ||
	    !loom_cpu_half_storable(g->nodes[sn->src[other]].dtype))
		return 0;
	for (int i = 0; i < dn->nsrc; i++)
		if (!loom_cpu_half_storable(g->nodes[dn->src[i]].dtype))
			return 0;
	return 1;
}

int loom_cpu_bwd_accum_fusable(const loom_graph *g, loom_value d, loom_value s, int other)
{
	switch (g->nodes[d].op) {
	case LOOM_OP_LAYERNORM_BWD_DATA:
	case LOOM_OP_RMSNORM_BWD_DATA:
		return loom_cpu_ln_bwd_accum_fusable(g, d, s, other);
	case LOOM_OP_EMBEDDING_BWD:
		return loom_cpu_emb_bwd_accum_fusable(g, d, s, other);
	default:
		return 0;
	}
}

/* ---------------------------------------------------------- entry */

int loom_cpu_ln_bwd_accum(const loom_plan *plan, const loom_arena *arena, loom_value v)
{
	const loom_node *n = &plan->g->nodes[v];
	if ((n->op != LOOM_OP_LAYERNORM_BWD_DATA && n->op != LOOM_OP_RMSNORM_BWD_DATA) ||
	    !(n->flags & LOOM_NODE_ACCUM))
		return 0;
	ln_bwd_accum_args g = {
		.rows = loom_shape_rows(&n->shape),
		.c = (int)loom_shape_last(&n->shape),
		.eps = n->a.ln.eps,
		.kernel = loom_cpu_norm_bwd_data_kernel(n),
		.x = loom_cpu_arr_of(plan, arena, n->src[0]),
		.gamma = loom_cpu_arr_of(plan, arena, n->src[1]),
		.dy = loom_cpu_arr_of(plan, arena, n->src[2]),
		.acc = loom_cpu_arr_of(plan, arena, n->src[3]),
		.out = loom_cpu_arr_of(plan, arena, v),
	};
	const loom_cpu_arr in[2] = { g.x, g.dy };
	if (g.rows > 0)
		loom_cpu_row_blocks(&g, g.rows, g.c, &g.gamma, 1, in, block);
	return 1;
}
