/*
 * parallel/bucket_pass.c — the gradient buckets of data-parallel training:
 * which gradient goes in which bucket and where, the all-reduce node of
 * each bucket, and the schedule that starts each all-reduce as soon as the
 * last of its gradients is made, so communication overlaps the rest of
 * backward (PyTorch DDP's Reducer, decided once at compile time).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/bucket_pass.h"
#include "graph/ops/ops.h"

static size_t align_up(size_t x)
{
	return (x + LOOM_BUCKET_ALIGN - 1) & ~(size_t)(LOOM_BUCKET_ALIGN - 1);
}

/* Where v is written: a value made by an earlier node (graph/fuse.c) is
 * written when that node runs. */
static loom_value made_at(const loom_graph *g, loom_value v)
{
	loom_value u = g->nodes[v].made_by;
	return u != LOOM_NONE && u < v ? u : v;
}

/* Which bucket each gradient joins (in[i] for grads[i]); fills out->b with
 * the buckets' dtypes, sizes and member counts. */
static loom_status assign(loom_graph *g, const loom_value *grads, int n, size_t cap,
			  size_t first_cap, loom_buckets *out, int *in)
{
	int open[LOOM_DTYPE_COUNT];
	char lb[96];
	for (int d = 0; d < LOOM_DTYPE_COUNT; d++)
		open[d] = -1;
	for (int i = n - 1; i >= 0; i--) {
		const loom_node *nd = &g->nodes[grads[i]];
		if (loom_op_is_view(nd->op)) {
			loom_graph_fail(g, LOOM_ERR_UNSUPPORTED,
					"buckets: the gradient %s is a view of another value",
					loom_node_label(g, grads[i], lb, sizeof(lb)));
			return LOOM_ERR_UNSUPPORTED;
		}
		size_t sz = align_up((size_t)loom_shape_numel(&nd->shape) * loom_dtype_size(nd->dtype));
		int k = open[nd->dtype];
		if (k >= 0 && out->b[k].bytes > 0 &&
		    out->b[k].bytes + sz > (k == 0 ? first_cap : cap))
			k = -1;
		if (k < 0) {
			k = open[nd->dtype] = out->n++;
			out->b[k] = (loom_bucket){ .dtype = nd->dtype, .node = LOOM_NONE };
		}
		in[i] = k;
		out->b[k].bytes += sz;
		out->b[k].n++;
	}
	return LOOM_OK;
}

/* Appends bucket k's ALLREDUCE node: its sources are its last-made
 * gradients (at most LOOM_MAX_SRC), the rest are in the bucket table. */
static loom_status add_node(loom_graph *g, loom_buckets *out, int k)
{
	loom_bucket *b = &out->b[k];
	loom_value src[LOOM_MAX_SRC];
	int nsrc = 0;
	char *taken = calloc((size_t)b->n, 1);
	if (!taken)
		return LOOM_ERR_NOMEM;
	while (nsrc < LOOM_MAX_SRC && nsrc < b->n) {
		int best = -1;
		for (int i = 0; i < b->n; i++) {
			loom_value v = out->grad[b->first + i];
			if (!taken[i] && (best < 0 || made_at(g, v) > made_at(g, out->grad[b->first + best])))
				best = i;
		}
		taken[best] = 1;
		src[nsrc++] = out->grad[b->first + best];
	}
	free(taken);
	int64_t dims[1] = { b->count };
	loom_value v = loom_node_add(g, LOOM_OP_ALLREDUCE, b->dtype, loom_shape_make(1, dims), nsrc, src);
	if (v == LOOM_NONE)
		return LOOM_ERR_NOMEM;
	g->nodes[v].a.ar.bucket = k;
	g->nodes[v].flags |= LOOM_NODE_BACKWARD;
	snprintf(g->nodes[v].name, sizeof(g->nodes[v].name), "bucket%d", k);
	b->node = v;
	return LOOM_OK;
}

/* Node order, each all-reduce moved right after the last-made of its
 * gradients (buckets made at the same node in bucket order). */
static loom_status make_order(loom_graph *g, loom_buckets *out, int n_before)
{
	loom_value *after = malloc(sizeof(loom_value) * (out->n ? out->n : 1));
	out->order = malloc(sizeof(loom_value) * (size_t)g->n);
	if (!after || !out->order) {
		free(after);
		return LOOM_ERR_NOMEM;
	}
	for (int k = 0; k < out->n; k++) {
		/* A gradient's own slot comes after its maker's (made_by is an
		 * earlier node): once it has passed, the value is written. */
		after[k] = 0;
		for (int i = 0; i < out->b[k].n; i++)
			if (out->grad[out->b[k].first + i] > after[k])
				after[k] = out->grad[out->b[k].first + i];
	}
	int o = 0;
	for (loom_value u = 0; u < n_before; u++) {
		out->order[o++] = u;
		for (int k = 0; k < out->n; k++)
			if (after[k] == u)
				out->order[o++] = out->b[k].node;
	}
	free(after);
	return o == g->n ? LOOM_OK : LOOM_ERR_INVALID;
}

loom_status loom_bucket_pass(loom_graph *g, const loom_value *grads, int n, size_t cap,
			     size_t first_cap, loom_buckets *out)
{
	return loom_bucket_pass_sharded(g, grads, n, cap, first_cap, 1, out);
}

loom_status loom_bucket_pass_sharded(loom_graph *g, const loom_value *grads, int n, size_t cap,
				     size_t first_cap, int shards, loom_buckets *out)
{
	loom_status st;
	int n_before = g->n;
	memset(out, 0, sizeof(*out));
	int *in = malloc(sizeof(int) * (n ? n : 1));
	out->b = calloc(n ? n : 1, sizeof(*out->b));
	out->grad = malloc(sizeof(loom_value) * (n ? n : 1));
	out->offset = malloc(sizeof(size_t) * (n ? n : 1));
	if (!in || !out->b || !out->grad || !out->offset) {
		st = LOOM_ERR_NOMEM;
		goto fail;
	}
	if ((st = assign(g, grads, n, cap, first_cap, out, in)) != LOOM_OK)
		goto fail;
	/* Members bucket by bucket, each bucket in the order it was filled
	 * (reverse parameter order); buckets one after the other. */
	int at = 0;
	size_t base = 0;
	for (int k = 0; k < out->n; k++) {
		loom_bucket *b = &out->b[k];
		size_t off = 0;
		b->first = at;
		b->base = base;
		for (int i = n - 1; i >= 0; i--) {
			if (in[i] != k)
				continue;
			const loom_node *nd = &g->nodes[grads[i]];
			out->grad[at] = grads[i];
			out->offset[at++] = off;
			off += align_up((size_t)loom_shape_numel(&nd->shape) * loom_dtype_size(nd->dtype));
		}
		b->count = (int64_t)(b->bytes / loom_dtype_size(b->dtype));
		if (shards > 1 && b->count % shards) {
			b->count += shards - b->count % shards;
			b->bytes = (size_t)b->count * loom_dtype_size(b->dtype);
		}
		base += align_up(b->bytes);
	}
	out->ngrad = at;
	out->bytes = base;
	for (int k = 0; k < out->n; k++)
		if ((st = add_node(g, out, k)) != LOOM_OK)
			goto fail;
	if ((st = make_order(g, out, n_before)) != LOOM_OK)
		goto fail;
	free(in);
	return LOOM_OK;

fail:
	free(in);
	loom_buckets_free(out);
	return st;
}
