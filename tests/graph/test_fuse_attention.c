/*
 * tests/graph/test_fuse_attention.c — the attention fusion pass
 * (graph/fuse_attention.c), on the CPU: which attentions it fuses (half
 * q, k, v, the two-node pattern, the backend's yes), what the graph looks
 * like after it (the LSE in ATTN_PROBS's slot, y made by it, one backward
 * node over qkv, LSE, dy and y, the other backward nodes dead views), and
 * that the memory plan then holds no T x T value and less memory. The
 * fused kernels themselves (cuDNN's SDPA) are tested against the CPU in
 * tests/engine/cuda/test_cuda_ops.c on a GPU.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "amp/amp_pass.h"
#include "graph/graph_internal.h"
#include "graph/memplan.h"
#include "loom.h"

enum { B = 2, T = 100, NH = 2, HS = 64, C = NH * HS };

static int asked, asked_train;

static int say_yes(const loom_graph *g, loom_value probs, int train)
{
	(void)g;
	(void)probs;
	asked++;
	asked_train = train;
	return 1;
}

static int say_no(const loom_graph *g, loom_value probs, int train)
{
	(void)g;
	(void)probs;
	(void)train;
	asked++;
	return 0;
}

/* qkv [B, T, 3C] of dtype dt -> causal attention -> a product with a
 * parameter -> sum; with its backward when train. *y: the attention,
 * *pr its probabilities, *qv its qkv. */
static loom_value pr, qv;

static loom_graph *attention_graph(loom_dtype dt, int train, int reuse_probs, loom_value *y)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t qd[3] = { B, T, 3 * C }, rd[2] = { (int64_t)B * T * C, 1 }, flat[2] = { 1, (int64_t)B * T * C };
	loom_value qkv = loom_param(g, "qkv", dt, 3, qd, LOOM_INIT_ZEROS, 1);
	loom_value probs = loom_attention_probs(g, qkv, NH);
	*y = loom_attention_apply(g, probs, qkv, NH);
	pr = probs;
	qv = qkv;
	loom_value r = loom_param(g, "r", dt, 2, rd, LOOM_INIT_ZEROS, 1);
	loom_value loss = loom_sum(g, loom_matmul(g, loom_reshape(g, *y, 2, flat), r));
	if (reuse_probs) /* a second reader of the probabilities */
		loss = loom_add(g, loss, loom_sum(g, probs));
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	if (train)
		cr_assert_eq(loom_autodiff(g, loss), LOOM_OK, "%s", g->err.msg);
	return g;
}

static int count_op(const loom_graph *g, loom_op op)
{
	int n = 0;
	for (int v = 0; v < g->n; v++)
		n += g->nodes[v].op == op;
	return n;
}

/* Values of B * NH * T * T elements that own storage in the plan. */
static int tt_values(const loom_graph *g, const loom_memplan *mp)
{
	int n = 0;
	for (int v = 0; v < g->n; v++)
		n += mp->root[v] == v && loom_shape_numel(&g->nodes[v].shape) == (int64_t)B * NH * T * T;
	return n;
}

Test(fuse_attention, training_graph_becomes_one_forward_and_one_backward)
{
	loom_value y;
	loom_graph *g = attention_graph(LOOM_BF16, 1, 0, &y), *ref;
	cr_assert_eq(loom_graph_clone(g, &ref), LOOM_OK);
	int n_before = g->n;
	asked = 0;
	cr_assert_eq(loom_fuse_attention(g, say_yes), 1);
	cr_expect_eq(asked, 1);
	cr_expect_eq(asked_train, 1);
	cr_expect_eq(g->n, n_before, "the pass adds no node");

	loom_value probs = pr, qkv = qv;
	const loom_node *p = &g->nodes[probs];
	cr_expect(p->op == LOOM_OP_ATTN_PROBS && p->a.attn.fused);
	cr_expect_eq(p->dtype, LOOM_F32, "the LSE is f32");
	cr_expect(p->shape.ndim == 3 && p->shape.dims[0] == B && p->shape.dims[1] == NH &&
		  p->shape.dims[2] == T, "the LSE is [B, NH, T]");
	cr_expect(g->nodes[y].a.attn.fused && g->nodes[y].made_by == probs, "y is made by ATTN_PROBS");
	cr_expect(g->nodes[y].nsrc == 1 && g->nodes[y].src[0] == qkv, "y reads qkv alone");
	cr_expect_eq(g->nodes[y].dtype, LOOM_BF16);

	/* One backward node: the former sum, now qkv's whole gradient. */
	loom_value dq = g->nodes[qkv].grad;
	const loom_node *bw = &g->nodes[dq];
	cr_expect(bw->op == LOOM_OP_ATTN_PROBS_BWD && bw->a.attn.fused && bw->nsrc == 4,
		  "qkv's gradient is the fused backward (op %d)", (int)bw->op);
	cr_expect(bw->src[0] == qkv && bw->src[1] == probs && bw->src[3] == y,
		  "it reads qkv, the LSE, dy and y");
	cr_expect_eq(bw->a.attn.n_head, NH);
	cr_expect_eq(bw->dtype, LOOM_BF16);
	cr_expect_eq(count_op(g, LOOM_OP_ATTENTION_BWD_PROBS), 0);
	cr_expect_eq(count_op(g, LOOM_OP_ATTENTION_BWD_QKV), 0);
	cr_expect_eq(count_op(g, LOOM_OP_ATTN_PROBS_BWD), 1);
	cr_expect_eq(count_op(g, LOOM_OP_ADD), count_op(ref, LOOM_OP_ADD) - 1);

	/* The memory plan: y read after it is made (made_by), no T x T value,
	 * less memory than the unfused plan. */
	loom_memplan mp, mref;
	cr_assert_eq(loom_memplan_build(g, &mp), LOOM_OK, "the fused graph plans");
	cr_assert_eq(loom_memplan_build(ref, &mref), LOOM_OK);
	cr_expect_eq(tt_values(g, &mp), 0, "no T x T value in the fused plan");
	cr_expect(tt_values(ref, &mref) >= 2, "the unfused plan holds P and dP");
	cr_expect(mp.act_bytes + (size_t)B * NH * T * T * 2 <= mref.act_bytes,
		  "activations: fused %zu, unfused %zu bytes", mp.act_bytes, mref.act_bytes);
	cr_expect(mp.sibling[probs] == y, "y is ATTN_PROBS's sibling");
	loom_memplan_free(&mp);
	loom_memplan_free(&mref);
	loom_graph_free(ref);
	loom_graph_free(g);
}

Test(fuse_attention, forward_only_graph)
{
	loom_value y;
	loom_graph *g = attention_graph(LOOM_F16, 0, 0, &y);
	asked = 0;
	cr_assert_eq(loom_fuse_attention(g, say_yes), 1);
	cr_expect_eq(asked_train, 0, "asked for the forward alone");
	cr_expect(g->nodes[pr].a.attn.fused);
	cr_expect_eq(g->nodes[y].made_by, pr);
	loom_memplan mp;
	cr_assert_eq(loom_memplan_build(g, &mp), LOOM_OK);
	cr_expect_eq(tt_values(g, &mp), 0);
	loom_memplan_free(&mp);
	loom_graph_free(g);
}

Test(fuse_attention, left_alone_where_the_backend_says_no)
{
	loom_value y;
	loom_graph *g = attention_graph(LOOM_BF16, 1, 0, &y), *ref;
	cr_assert_eq(loom_graph_clone(g, &ref), LOOM_OK);
	asked = 0;
	cr_expect_eq(loom_fuse_attention(g, say_no), 0);
	cr_expect_eq(asked, 1);
	cr_expect_eq(loom_fuse_attention(g, NULL), 0, "no answer: no fusion");
	cr_expect_eq(memcmp(g->nodes, ref->nodes, sizeof(loom_node) * (size_t)g->n), 0,
		     "the graph is untouched");
	loom_graph_free(ref);
	loom_graph_free(g);
}

Test(fuse_attention, f32_and_shared_probabilities_stay_unfused)
{
	loom_value y;
	loom_graph *g = attention_graph(LOOM_F32, 1, 0, &y);
	asked = 0;
	cr_expect_eq(loom_fuse_attention(g, say_yes), 0, "f32 q, k, v: no half kernel");
	cr_expect_eq(asked, 0, "the backend is not asked");
	loom_graph_free(g);
	g = attention_graph(LOOM_BF16, 1, 1, &y);
	cr_expect_eq(loom_fuse_attention(g, say_yes), 0, "P has a reader of its own");
	cr_expect_eq(asked, 0);
	loom_graph_free(g);
}

/* A GPT block (embedding, layer norm, qkv, attention, projection, a
 * residual, tied logits) under O1 bf16 as loom_compile prepares it (the
 * AMP pass, then autodiff): the attention takes bf16 q, k, v, so the pass
 * finds its pattern there and fuses it. */
Test(fuse_attention, gpt_block_under_o1_bf16)
{
	loom_graph *g;
	enum { V = 64, BT = B * T };
	int64_t bt[2] = { B, T }, flat[1] = { BT }, td[2] = { V, C }, lg[2] = { BT, V };
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value ids = loom_input(g, "ids", LOOM_I32, 2, bt);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, flat);
	loom_value wte = loom_param(g, "wte", LOOM_F32, 2, td, LOOM_INIT_KAIMING_UNIFORM, 8);
	loom_value x = loom_layer_layernorm(g, "ln", loom_embedding(g, ids, wte));
	loom_value a = loom_causal_self_attention(g, loom_layer_linear(g, "qkv", x, 3 * C, 1), NH);
	x = loom_add(g, x, loom_layer_linear(g, "proj", a, C, 1));
	loom_value logits = loom_reshape(g, loom_linear(g, x, wte, LOOM_NONE), 2, lg);
	loom_value loss = loom_softmax_cross_entropy(g, logits, y);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	loom_amp_opts o;
	memset(&o, 0, sizeof(o));
	o.level = LOOM_O1;
	o.half = LOOM_BF16;
	o.keep_batchnorm_fp32 = -1;
	char err[256] = "";
	cr_assert_eq(loom_amp_pass(g, &loss, &o, 1, err, sizeof(err)), LOOM_OK, "%s", err);
	cr_assert_eq(loom_autodiff(g, loss), LOOM_OK, "%s", g->err.msg);
	asked = 0;
	cr_expect_eq(loom_fuse_attention(g, say_yes), 1, "O1 bf16 attention fused");
	cr_expect_eq(asked_train, 1);
	loom_memplan mp;
	cr_assert_eq(loom_memplan_build(g, &mp), LOOM_OK);
	cr_expect_eq(tt_values(g, &mp), 0, "no T x T value");
	loom_memplan_free(&mp);
	loom_graph_free(g);
}
