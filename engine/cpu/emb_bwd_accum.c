/*
 * engine/cpu/emb_bwd_accum.c — the embedding's gradient added into the
 * tied table's other gradient (graph/fuse.c's loom_fuse_emb_bwd_accum;
 * llm.c's encoder_backward scatter-adds into the classifier's dW): one
 * pass over the rows the ids touch, the same bits as EMBEDDING_BWD then
 * autodiff's ADD.
 *
 * The same arithmetic in the same order: the embedding's backward sums
 * each row in f32 from zero, dy's rows (widened) in position order
 * (embedding.c, every dtype path), and rounds the sum once into its dtype;
 * the add widens that stored row and the addend to f32, adds and rounds
 * once into the sum's dtype (ops_elementwise.c). Here the positions are
 * grouped by id first (a stable counting sort), then each touched row is
 * summed, rounded and widened back, and added to the addend's row. A row
 * no id touches is the addend's plus zero: written as such where the sum
 * has bytes of its own; left as it is where the sum is written over the
 * addend (the memory plan's in-place write, or the addend placed in the
 * gradient's bytes), which differs from the add only in that a -0 stays
 * -0 where the add gave +0 (equal values: squares, sums and the
 * optimizer's moments see no difference). f64 (gradient checks) is never
 * fused.
 */
#include <string.h>

#include "base/options.h"
#include "engine/cpu/cpu_internal.h"
#include "engine/cpu/ops.h"

#define COLS LOOM_CPU_BF16_ROWS

typedef struct emb_accum_args {
	int64_t n; /* positions */
	int v, c;  /* the table's rows (padded ones included) and columns */
	const int32_t *ids;
	const void *dy, *acc;
	void *out;
	loom_dtype tdy, tacc, tout;
	int32_t *start; /* [v + 2]: row r's positions are order[start[r] .. start[r + 1]) */
	int32_t *order; /* [n] */
} emb_accum_args;

/* The positions grouped by id, each group in position order (a stable
 * counting sort; ids outside [0, v) dropped, as the scatter-add drops them). */
static void group_ids(const emb_accum_args *g)
{
	int32_t *start = g->start;
	memset(start, 0, sizeof(int32_t) * ((size_t)g->v + 2));
	for (int64_t i = 0; i < g->n; i++)
		if (g->ids[i] >= 0 && g->ids[i] < g->v)
			start[g->ids[i] + 2]++;
	for (int r = 0; r < g->v; r++)
		start[r + 2] += start[r + 1];
	for (int64_t i = 0; i < g->n; i++)
		if (g->ids[i] >= 0 && g->ids[i] < g->v)
			g->order[start[g->ids[i] + 1]++] = (int32_t)i;
}

/* Row r: the scatter-add's sum (zero where no id occurs) rounded into the
 * sum's dtype and widened back, plus the addend's row, stored. */
static void row(const emb_accum_args *g, int r, float *sum, float *buf, float *ab, uint16_t *hb)
{
	const int c = g->c;
	const int64_t off = (int64_t)r * c;
	for (int j = 0; j < c; j++)
		sum[j] = 0.0f;
	for (int32_t k = g->start[r]; k < g->start[r + 1]; k++) {
		const float *d = loom_cpu_half_in(g->tdy, g->dy, (int64_t)g->order[k] * c, c, buf);
		for (int j = 0; j < c; j++)
			sum[j] += d[j];
	}
	/* the row as the unfused node stored it (zero stays zero) */
	loom_cpu_accum_store(g->tout, g->out, g->tacc, g->acc, off, c, sum, ab, hb,
			     g->start[r] < g->start[r + 1]);
}

static void emb_accum_rows(const emb_accum_args *g)
{
	/* Over the addend's own bytes an untouched row is already the sum. */
	const int in_place = g->out == g->acc;
	group_ids(g);
#pragma omp parallel if (g->n * g->c >= LOOM_CPU_PAR_MIN)
	{
		float sum[COLS] __attribute__((aligned(64))), buf[COLS] __attribute__((aligned(64)));
		float ab[COLS] __attribute__((aligned(64)));
		uint16_t hb[COLS] __attribute__((aligned(64)));
#pragma omp for schedule(dynamic, 16)
		for (int r = 0; r < g->v; r++)
			if (!in_place || g->start[r] < g->start[r + 1])
				row(g, r, sum, buf, ab, hb);
	}
}

/* ---------------------------------------------------------- planning */

int loom_cpu_emb_bwd_accum_fusable(const loom_graph *g, loom_value d, loom_value s, int other)
{
	const loom_node *dn = &g->nodes[d], *sn = &g->nodes[s];
	if (!loom_opt_bool(LOOM_OPT_FUSE_EMB_BWD_ACCUM) || dn->shape.ndim != 2 ||
	    dn->shape.dims[1] <= 0 || dn->shape.dims[1] > COLS || dn->shape.dims[0] >= INT32_MAX - 2 ||
	    loom_shape_numel(&g->nodes[dn->src[0]].shape) >= INT32_MAX)
		return 0;
	return loom_cpu_half_storable(dn->dtype) && loom_cpu_half_storable(sn->dtype) &&
	       loom_cpu_half_storable(g->nodes[sn->src[other]].dtype) &&
	       loom_cpu_half_storable(g->nodes[dn->src[1]].dtype);
}

size_t loom_cpu_emb_bwd_accum_ws(const loom_plan *plan, loom_value v)
{
	const loom_node *n = &plan->g->nodes[v];
	if (n->op != LOOM_OP_EMBEDDING_BWD || !(n->flags & LOOM_NODE_ACCUM))
		return 0;
	size_t rows = ((size_t)n->shape.dims[0] + 2) * sizeof(int32_t);
	return ((rows + 63) & ~(size_t)63) +
	       sizeof(int32_t) * (size_t)loom_shape_numel(&plan->g->nodes[n->src[0]].shape);
}

/* ---------------------------------------------------------- entry */

int loom_cpu_emb_bwd_accum(const loom_plan *plan, const loom_arena *arena, loom_value v)
{
	const loom_graph *gr = plan->g;
	const loom_node *n = &gr->nodes[v];
	if (n->op != LOOM_OP_EMBEDDING_BWD || !(n->flags & LOOM_NODE_ACCUM))
		return 0;
	size_t rows = (((size_t)n->shape.dims[0] + 2) * sizeof(int32_t) + 63) & ~(size_t)63;
	emb_accum_args g = {
		.n = loom_shape_numel(&gr->nodes[n->src[0]].shape),
		.v = (int)n->shape.dims[0],
		.c = (int)n->shape.dims[1],
		.ids = loom_arena_ptr(arena, plan, n->src[0]),
		.dy = loom_arena_ptr(arena, plan, n->src[1]),
		.acc = loom_arena_ptr(arena, plan, n->src[2]),
		.out = loom_arena_ptr(arena, plan, v),
		.tdy = gr->nodes[n->src[1]].dtype,
		.tacc = gr->nodes[n->src[2]].dtype,
		.tout = n->dtype,
		.start = (int32_t *)arena->ws,
		.order = (int32_t *)((char *)arena->ws + rows),
	};
	if (g.v > 0 && g.c > 0)
		emb_accum_rows(&g);
	return 1;
}
