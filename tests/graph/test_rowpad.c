/*
 * tests/graph/test_rowpad.c — the padded vocabulary's plan part
 * (graph/rowpad.h) on a GPT's tail compiled on the CPU: a tied table
 * (embedding and classifier), the logits to softmax-CE; which values take
 * padded rows or columns, and none where the vocabulary is aligned
 * already.
 */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "engine/program_internal.h"
#include "graph/graph_internal.h"
#include "graph/ops/ops.h"
#include "graph/rowpad.h"
#include "loom.h"

/* ids -> embedding(wte) + x -> linear(., wte) -> [32, vocab] -> softmax-CE;
 * at level (O0 f32, O1/O2 bf16); fuse: the table's two gradients summed by
 * the embedding's backward (LOOM_FUSE_EMB_BWD_ACCUM), else by an ADD. */
static loom_program *tail_fused(int64_t vocab, loom_opt_level level, int fuse, loom_graph **gp)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	*gp = g;
	int64_t dw[2] = { vocab, 64 }, dx[3] = { 2, 16, 64 }, di[2] = { 2, 16 }, nl = 32;
	int64_t rows[2] = { 32, vocab };
	loom_value wte = loom_param(g, "wte", LOOM_F32, 2, dw, LOOM_INIT_ZEROS, 1);
	loom_value x = loom_param(g, "x", LOOM_F32, 3, dx, LOOM_INIT_ZEROS, 1);
	loom_value h = loom_add(g, loom_embedding(g, loom_input(g, "ids", LOOM_I32, 2, di), wte), x);
	loom_value logits = loom_linear(g, h, wte, LOOM_NONE);
	loom_value loss = loom_softmax_cross_entropy(g, loom_reshape(g, logits, 2, rows),
						     loom_input(g, "labels", LOOM_I32, 1, &nl));
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	loom_compile_opts o;
	loom_program *p;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim.kind = LOOM_OPTIM_NONE;
	o.amp.level = level;
	if (level != LOOM_O0)
		o.amp.half = LOOM_BF16;
	setenv("LOOM_FUSE_EMB_BWD_ACCUM", fuse ? "1" : "0", 1);
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	unsetenv("LOOM_FUSE_EMB_BWD_ACCUM");
	return p;
}

static loom_program *tail(int64_t vocab, loom_opt_level level, loom_graph **gp)
{
	return tail_fused(vocab, level, 0, gp);
}

static void expect_marks(loom_opt_level level)
{
	loom_graph *user;
	loom_program *p = tail(97, level, &user);
	const loom_graph *g = p->plan.g;
	unsigned char *mark = malloc((size_t)g->n);
	int64_t padded = -1;
	cr_assert_eq(loom_rowpad_find(g, 64, mark, &padded), 97);
	cr_assert_eq(padded, 128);
	int lin = 0, ce_bwd = 0, dw = 0, emb_bwd = 0, sum = 0, table = 0;
	for (loom_value v = 0; v < g->n; v++) {
		const loom_node *n = &g->nodes[v];
		if (n->op == LOOM_OP_LINEAR)
			lin += mark[v] == LOOM_ROWPAD_COLS;
		if (n->op == LOOM_OP_SOFTMAX_CE_BWD)
			ce_bwd += mark[v] == LOOM_ROWPAD_COLS;
		if (n->op == LOOM_OP_MATMUL && n->shape.dims[0] == 97)
			dw += mark[v] == LOOM_ROWPAD_ROWS;
		if (n->op == LOOM_OP_MATMUL && n->shape.dims[0] != 97)
			cr_expect_eq(mark[v], LOOM_ROWPAD_NONE, "dx keeps its rows (node %d)", v);
		if (n->op == LOOM_OP_EMBEDDING_BWD)
			emb_bwd += mark[v] == LOOM_ROWPAD_ROWS;
		if (n->op == LOOM_OP_ADD && n->shape.ndim == 2 && n->shape.dims[0] == 97)
			sum += mark[v] == LOOM_ROWPAD_ROWS;
		if (n->op == LOOM_OP_PARAM && n->shape.dims[0] == 97)
			table += mark[v] == LOOM_ROWPAD_ROWS;
		if (n->op == LOOM_OP_EMBEDDING || n->op == LOOM_OP_SOFTMAX_CE)
			cr_expect_eq(mark[v], LOOM_ROWPAD_NONE, "node %d (%s) keeps its layout", v,
				     loom_op_defs[n->op]->name);
	}
	cr_expect(lin == 1 && ce_bwd == 1 && dw == 1 && emb_bwd == 1 && sum == 1 && table == 1,
		  "level %d: logits %d, dlogits %d, dW %d, embedding's dW %d, their sum %d, table %d",
		  (int)level, lin, ce_bwd, dw, emb_bwd, sum, table);
	/* A multiple of one: aligned already; a multiple of zero: refused. */
	cr_assert_eq(loom_rowpad_find(g, 1, mark, &padded), 0);
	for (loom_value v = 0; v < g->n; v++)
		cr_assert_eq(mark[v], LOOM_ROWPAD_NONE);
	cr_assert_eq(loom_rowpad_find(g, 0, mark, &padded), -1);
	free(mark);
	loom_program_free(p);
	loom_graph_free(user);
}

Test(rowpad, a_tied_classifier_pads_its_table_logits_and_gradients)
{
	expect_marks(LOOM_O0);
	expect_marks(LOOM_O2);
}

/* The sum made by the embedding's backward (graph/fuse.c's
 * loom_fuse_emb_bwd_accum): that node, the table's gradient now, and the
 * ADD's view of it take padded rows; no [97, C] ADD is left. */
static void expect_marks_fused(loom_opt_level level)
{
	loom_graph *user;
	loom_program *p = tail_fused(97, level, 1, &user);
	const loom_graph *g = p->plan.g;
	unsigned char *mark = malloc((size_t)g->n);
	int64_t padded = -1;
	cr_assert_eq(loom_rowpad_find(g, 64, mark, &padded), 97);
	int emb_bwd = 0, view = 0, adds = 0;
	for (loom_value v = 0; v < g->n; v++) {
		const loom_node *n = &g->nodes[v];
		if (n->op == LOOM_OP_EMBEDDING_BWD && (n->flags & LOOM_NODE_ACCUM)) {
			emb_bwd += mark[v] == LOOM_ROWPAD_ROWS && (n->flags & LOOM_NODE_GRAD);
			for (loom_value u = v + 1; u < g->n; u++)
				view += g->nodes[u].op == LOOM_OP_RESHAPE && g->nodes[u].src[0] == v &&
					mark[u] == LOOM_ROWPAD_ROWS;
		}
		adds += n->op == LOOM_OP_ADD && n->shape.ndim == 2 && n->shape.dims[0] == 97;
	}
	cr_expect(emb_bwd == 1 && view == 1 && adds == 0,
		  "level %d: the fused gradient %d, its view %d, sums left %d", (int)level, emb_bwd,
		  view, adds);
	free(mark);
	loom_program_free(p);
	loom_graph_free(user);
}

Test(rowpad, the_sum_the_embeddings_backward_makes_pads_too)
{
	expect_marks_fused(LOOM_O0);
	expect_marks_fused(LOOM_O2);
}

Test(rowpad, an_aligned_vocabulary_pads_nothing)
{
	loom_graph *user;
	loom_program *p = tail(128, LOOM_O0, &user);
	unsigned char *mark = malloc((size_t)p->plan.g->n);
	int64_t padded = -1;
	cr_assert_eq(loom_rowpad_find(p->plan.g, 64, mark, &padded), 0);
	cr_assert_eq(padded, 0);
	free(mark);
	loom_program_free(p);
	loom_graph_free(user);
}
