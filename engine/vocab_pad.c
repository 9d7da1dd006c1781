/*
 * engine/vocab_pad.c — the vocab-pad compile pass: a classifier over a
 * padded vocabulary (loom_compile_opts.vocab_pad, LOOM_VOCAB_PAD; where
 * neither is given, the backend's multiple: CUDA's 128, so GPT-2's 50257
 * becomes llm.c's 50304, and none on the CPU). After
 * the fusions, before the parameter slots and the memory plan: the values
 * graph/rowpad.c marks take their padded shapes in the plan's graph (the
 * table [V, C] and its half copies, gradients and their sum, an O2 master:
 * [Vp, C]; the logits and dlogits: [..., Vp]), each keeping its user's
 * extent (loom_node.unpad_rows / unpad_cols). Everything sized after it
 * (slots, optimizer state, ZeRO's shards, the memory plan, the backend's
 * product plans) sees the padded shapes; softmax-CE counts the real
 * classes (loom_node_classes of its logits) and writes zero gradient in
 * the padding columns, so the padding rows' gradient is zero and Adam or
 * weight decay keep them zero; the initialiser draws the user's rows as
 * unpadded and zeroes the rest; reads, writes, checkpoints and safetensors
 * see the user's shape (the padded rows are the storage's tail).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errf.h"
#include "base/options.h"
#include "engine/backend.h" /* the planning group's vocab_pad */
#include "engine/pass.h"
#include "graph/ops/ops.h"
#include "graph/rowpad.h"

/* -1: left to the backend (the option's default, LOOM_VOCAB_PAD unset). */
int64_t loom_vocab_pad_multiple(const loom_compile_opts *o)
{
	long v;
	if (loom_opt_int(LOOM_OPT_VOCAB_PAD, &v)) /* 0 to 2^20 */
		return v;
	return o->vocab_pad >= 0 ? o->vocab_pad : -1;
}

/* The plan's multiple: the one asked for, else the backend's (its
 * products' row alignment: CUDA's 128, the CPU none; applied only where
 * it adds at most an eighth of the classes), 0 for none. */
static int64_t multiple_of(const loom_program *p)
{
	int64_t m = loom_vocab_pad_multiple(&p->plan.opts);
	if (m >= 0)
		return m;
	return p->be && p->be->planning && p->be->planning->vocab_pad > 0 ?
		       p->be->planning->vocab_pad :
		       0;
}

static int wanted(const loom_program *p)
{
	return multiple_of(p) > 0;
}

/* Whether a node of op may be marked (its kernel takes the padded shape
 * as it is), or read a marked value while unmarked itself: softmax-CE
 * (the classes from its logits), a product that contracts over the padded
 * dimension (dx = dlogits W), an embedding (ids below the real
 * vocabulary). */
static int may_be_marked(const loom_node *n)
{
	switch (n->op) {
	case LOOM_OP_PARAM:
	case LOOM_OP_RESHAPE:
	case LOOM_OP_CAST:
	case LOOM_OP_SOFTMAX_CE_BWD:
	case LOOM_OP_MATMUL:
	case LOOM_OP_EMBEDDING_BWD:
	case LOOM_OP_ADD:
		return 1;
	case LOOM_OP_LINEAR: /* the classifier: no bias (its [V] is not padded) */
		return n->nsrc < 3 || n->src[2] == LOOM_NONE;
	default:
		return 0;
	}
}

static int may_read_marked(const loom_graph *g, const loom_node *n, const unsigned char *mark)
{
	switch (n->op) {
	case LOOM_OP_SOFTMAX_CE:
	case LOOM_OP_EMBEDDING:
		return 1;
	case LOOM_OP_MATMUL: /* contracting over the padded dim: dlogits [N,Vp] x W [Vp,C] */
		return n->nsrc == 2 && mark[n->src[0]] == LOOM_ROWPAD_COLS &&
		       mark[n->src[1]] == LOOM_ROWPAD_ROWS && !n->a.mm.ta && !n->a.mm.tb &&
		       g->nodes[n->src[1]].shape.ndim == 2;
	default:
		return 0;
	}
}

/* The first node that keeps the plan from padding (a reader the pass does
 * not know to take padded rows or columns), else LOOM_NONE. */
static loom_value refusal(const loom_graph *g, const unsigned char *mark)
{
	for (loom_value v = 0; v < g->n; v++) {
		const loom_node *n = &g->nodes[v];
		if (mark[v] != LOOM_ROWPAD_NONE) {
			if (!may_be_marked(n))
				return v;
			continue;
		}
		for (int i = 0; i < n->nsrc; i++)
			if (n->src[i] != LOOM_NONE && mark[n->src[i]] != LOOM_ROWPAD_NONE &&
			    !may_read_marked(g, n, mark))
				return v;
	}
	return LOOM_NONE;
}

static void pad_rows(loom_node *n, int64_t padded)
{
	n->unpad_rows = n->shape.dims[0];
	n->shape.dims[0] = padded;
}

static loom_status run(loom_program *p, loom_pass_ctx *c)
{
	(void)c;
	loom_graph *g = p->plan.g;
	const int64_t multiple = multiple_of(p);
	/* Left to the backend, a plan it cannot pad is no news: only a
	 * multiple asked for says why it was not applied. */
	const int asked = loom_vocab_pad_multiple(&p->plan.opts) > 0;
	char lb[128];
	if (p->plan.opts.pipeline_stages > 1) {
		if (asked)
			loom_log("loom: vocab_pad: not with pipeline stages yet; the vocabulary is "
				 "left unpadded\n");
		return LOOM_OK;
	}
	unsigned char *mark = malloc((size_t)g->n ? (size_t)g->n : 1);
	if (!mark)
		return loom_program_fail(p, LOOM_ERR_NOMEM, "vocab_pad: out of memory");
	int64_t padded = 0;
	int64_t vocab = loom_rowpad_find(g, multiple, mark, &padded);
	/* The backend's multiple only where it costs little: a small
	 * classifier (ten classes to 128) would multiply its products' work
	 * for nothing they gain. */
	if (!asked && vocab > 0 && (padded - vocab) * 8 > vocab)
		vocab = 0;
	loom_value why = vocab > 0 ? refusal(g, mark) : LOOM_NONE;
	if (why != LOOM_NONE) {
		if (asked)
			loom_log("loom: vocab_pad: %s reads the classifier's values; the "
				 "vocabulary of %lld is left unpadded\n",
				 loom_node_label(g, why, lb, sizeof(lb)), (long long)vocab);
		vocab = 0;
	}
	for (loom_value v = 0; vocab > 0 && v < g->n; v++) {
		loom_node *n = &g->nodes[v];
		if (mark[v] == LOOM_ROWPAD_ROWS) {
			pad_rows(n, padded);
			/* O2: the fp32 master the optimizer updates and copies over it */
			if (n->op == LOOM_OP_PARAM && n->master != LOOM_NONE &&
			    g->nodes[n->master].unpad_rows == 0)
				pad_rows(&g->nodes[n->master], padded);
		} else if (mark[v] == LOOM_ROWPAD_COLS) {
			n->unpad_cols = n->shape.dims[n->shape.ndim - 1];
			n->shape.dims[n->shape.ndim - 1] = padded;
		}
	}
	if (vocab > 0)
		loom_log("loom: vocab_pad: the classifier's %lld classes laid out as %lld (a "
			 "multiple of %lld)\n", (long long)vocab, (long long)padded,
			 (long long)multiple);
	p->plan.vocab = vocab > 0 ? vocab : 0;
	p->plan.vocab_padded = vocab > 0 ? padded : 0;
	free(mark);
	return LOOM_OK;
}

const loom_pass loom_pass_vocab_pad = { .name = "vocab pad", .wanted = wanted, .run = run };
