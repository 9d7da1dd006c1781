/*
 * engine/cpu/ln_residual.c — the residual add with the layer norm that
 * reads it (graph/fuse.c's loom_fuse_ln_residual; llm.c's
 * fused_residual_forward): one pass per block of rows writes the sum and
 * the layer norm's y, the same bits as ADD then LAYERNORM.
 *
 * The same arithmetic in the same order: the add widens its sources to
 * f32, adds and rounds once into the sum's dtype (ops_elementwise.c's
 * paths all do); the layer norm widens that stored sum, gamma and beta to
 * f32, runs layernorm.c's f32 row kernel and rounds y once (norm_bf16.c
 * and backend.c's emulation both do). Here the rows go a block at a time
 * through the stack, the rounded sum widened back before the layer norm
 * reads it. f64 (gradient checks) is never fused.
 */
#include <string.h>

#include "base/half.h"
#include "base/options.h"
#include "engine/cpu/cpu_internal.h"
#include "engine/cpu/ops.h"

#define ROWS LOOM_CPU_BF16_ROWS

typedef struct ln_residual_args {
	int64_t rows;
	int c;
	double eps;
	loom_cpu_arr a, b, gamma, beta, sum, y;
} ln_residual_args;

/* Where f32 results for [off, ...) of a go: a itself when f32, else buf. */
static float *out_of(loom_cpu_arr a, int64_t off, float *buf)
{
	return a.t == LOOM_F32 ? (float *)a.p + off : buf;
}

/* Rows [r0, r0 + nr) (loom_cpu_row_blocks' block; t->in: a, b, t->par:
 * gamma, beta): the sum, rounded into its dtype and read back as the
 * layer norm will read it, then the layer norm of each row. */
static void block(const void *arg, int64_t r0, int64_t nr, loom_cpu_row_scratch *t)
{
	const ln_residual_args *g = arg;
	const int64_t off = r0 * g->c, n = nr * g->c;
	const float *pa = t->in[0], *pb = t->in[1];
	float *s = out_of(g->sum, off, t->f[0]);
#pragma omp simd
	for (int64_t i = 0; i < n; i++)
		s[i] = pa[i] + pb[i];
	if (g->sum.t != LOOM_F32) {
		loom_cpu_half_done(g->sum.t, g->sum.p, off, n, s);
		s = (float *)loom_cpu_half_in(g->sum.t, g->sum.p, off, n, t->f[0]);
	}
	float *y = out_of(g->y, off, t->f[1]);
	loom_cpu_layernorm_fwd_f32(nr, g->c, s, t->par[0], t->par[1], g->eps, y);
	loom_cpu_half_done(g->y.t, g->y.p, off, n, y);
}

void loom_cpu_row_blocks(const void *g, int64_t rows, int c, const loom_cpu_arr *par, int npar,
			 const loom_cpu_arr in[2],
			 void (*block)(const void *g, int64_t r0, int64_t nr,
				       loom_cpu_row_scratch *s))
{
	const int64_t per = ROWS / c, nb = (rows + per - 1) / per;
#pragma omp parallel if (rows * c >= LOOM_CPU_PAR_MIN)
	{
		loom_cpu_row_scratch s;
		for (int i = 0; i < npar; i++)
			s.par[i] = loom_cpu_half_in(par[i].t, par[i].p, 0, c, s.f[4 + i]);
#pragma omp for schedule(static)
		for (int64_t k = 0; k < nb; k++) {
			int64_t r0 = k * per, nr = rows - r0 < per ? rows - r0 : per;
			const int64_t off = r0 * c, n = nr * c;
			for (int i = 0; i < 2; i++)
				s.in[i] = loom_cpu_half_in(in[i].t, in[i].p, off, n, s.f[2 + i]);
			block(g, r0, nr, &s);
		}
	}
}

/* ---------------------------------------------------------- planning */

int loom_cpu_ln_residual_fusable(const loom_graph *g, loom_value a, loom_value ln)
{
	const loom_node *an = &g->nodes[a], *l = &g->nodes[ln];
	const int64_t c = loom_shape_last(&l->shape);
	if (!loom_opt_bool(LOOM_OPT_FUSE_LN_RESIDUAL) || c <= 0 || c > ROWS)
		return 0;
	if (!loom_cpu_half_storable(an->dtype) || !loom_cpu_half_storable(l->dtype))
		return 0;
	for (int i = 0; i < an->nsrc; i++)
		if (!loom_cpu_half_storable(g->nodes[an->src[i]].dtype))
			return 0;
	for (int i = 1; i < l->nsrc; i++)
		if (!loom_cpu_half_storable(g->nodes[l->src[i]].dtype))
			return 0;
	return 1;
}

/* The layer norm that add node v makes (graph/fuse.c), else LOOM_NONE. */
static loom_value made_ln(const loom_plan *plan, loom_value v)
{
	if (plan->g->nodes[v].op != LOOM_OP_ADD)
		return LOOM_NONE;
	for (loom_value w = loom_sibling_first(plan, v); w != LOOM_NONE;
	     w = loom_sibling_next(plan, w))
		if (plan->g->nodes[w].op == LOOM_OP_LAYERNORM)
			return w;
	return LOOM_NONE;
}

int loom_cpu_makes_sibling(void *ctx, const loom_plan *plan, loom_value v, loom_value w)
{
	(void)ctx;
	return w != LOOM_NONE && made_ln(plan, v) == w;
}

/* ---------------------------------------------------------- entry */

int loom_cpu_ln_residual(const loom_plan *plan, const loom_arena *arena, loom_value v)
{
	loom_value w = made_ln(plan, v);
	if (w == LOOM_NONE)
		return 0;
	const loom_node *an = &plan->g->nodes[v], *l = &plan->g->nodes[w];
	ln_residual_args g = {
		.rows = loom_shape_rows(&l->shape),
		.c = (int)loom_shape_last(&l->shape),
		.eps = l->a.ln.eps,
		.a = loom_cpu_arr_of(plan, arena, an->src[0]),
		.b = loom_cpu_arr_of(plan, arena, an->src[1]),
		.gamma = loom_cpu_arr_of(plan, arena, l->src[1]),
		.beta = loom_cpu_arr_of(plan, arena, l->src[2]),
		.sum = loom_cpu_arr_of(plan, arena, v),
		.y = loom_cpu_arr_of(plan, arena, w),
	};
	const loom_cpu_arr in[2] = { g.a, g.b }, par[2] = { g.gamma, g.beta };
	loom_cpu_row_blocks(&g, g.rows, g.c, par, 2, in, block);
	return 1;
}
