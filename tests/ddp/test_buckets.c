/*
 * tests/ddp/test_buckets.c — the bucket pass and the memory plan that lays
 * the buckets out, without MPI: which gradient lands in which bucket, in
 * what order, how big the buckets are, and that every gradient is a view
 * inside its bucket and every all-reduce runs after its last gradient.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/bucket_pass.h"
#include "graph/graph_internal.h"
#include "graph/memplan.h"

typedef struct net {
	loom_graph *g;
	loom_value loss;
	loom_value params[16];
	loom_value grads[16];
	int np;
} net;

/* Three linear layers of the given widths (width[0] in, width[3] out) and
 * their biases. */
static void build_widths(net *n, loom_dtype dt, const int64_t width[4])
{
	memset(n, 0, sizeof(*n));
	cr_assert_eq(loom_graph_new(&n->g), LOOM_OK);
	int64_t xd[2] = { 8, width[0] }, yd[1] = { 8 };
	loom_value h = loom_input(n->g, "x", dt, 2, xd);
	for (int l = 0; l < 3; l++) {
		char nm[32];
		int64_t wd[2] = { width[l + 1], width[l] }, bd[1] = { width[l + 1] };
		snprintf(nm, sizeof(nm), "l%d.weight", l);
		loom_value w = loom_param(n->g, nm, dt, 2, wd, LOOM_INIT_KAIMING_UNIFORM, width[l]);
		snprintf(nm, sizeof(nm), "l%d.bias", l);
		loom_value b = loom_param(n->g, nm, dt, 1, bd, LOOM_INIT_UNIFORM_FAN_IN, width[l]);
		n->params[n->np++] = w;
		n->params[n->np++] = b;
		h = loom_relu(n->g, loom_linear(n->g, h, w, b));
	}
	loom_value y = loom_input(n->g, "y", LOOM_I32, 1, yd);
	n->loss = loom_softmax_cross_entropy(n->g, h, y);
	cr_assert_eq(loom_autodiff(n->g, n->loss), LOOM_OK, "%s", n->g->err.msg);
	for (int i = 0; i < n->np; i++)
		n->grads[i] = n->g->nodes[n->params[i]].grad;
}

/* 64x64 weights (16 KiB in f32): sizes that are all multiples of 64 bytes. */
static void build(net *n, loom_dtype dt)
{
	static const int64_t w[4] = { 64, 64, 64, 64 };

	build_widths(n, dt, w);
}

static size_t bytes_of(const loom_graph *g, loom_value v)
{
	return (size_t)loom_shape_numel(&g->nodes[v].shape) * loom_dtype_size(g->nodes[v].dtype);
}

/* Caps of 20 KiB (first 4 KiB): the first bucket takes the last bias
 * alone, then the weights come one per bucket with the bias before them. */
Test(buckets, sizes_and_reverse_order)
{
	net n;
	loom_buckets b;
	build(&n, LOOM_F32);
	cr_assert_eq(loom_bucket_pass(n.g, n.grads, n.np, 20 << 10, 4 << 10, &b), LOOM_OK);
	cr_assert_eq(b.ngrad, n.np, "every gradient in a bucket");
	/* Reverse parameter order over the buckets and inside each. */
	for (int i = 0; i < b.ngrad; i++)
		cr_assert_eq(b.grad[i], n.grads[n.np - 1 - i], "entry %d", i);
	cr_assert_eq(b.b[0].n, 1, "the first bucket is small: only l2.bias");
	cr_assert_leq(b.b[0].bytes, (size_t)4 << 10);
	for (int k = 1; k < b.n; k++) {
		cr_assert_leq(b.b[k].bytes, (size_t)20 << 10, "bucket %d", k);
		cr_assert_eq(b.b[k].dtype, LOOM_F32);
		cr_assert_eq(b.b[k].count * 4, (int64_t)b.b[k].bytes);
	}
	cr_assert_eq(b.n, 4, "l2.b | l2.w l1.b | l1.w l0.b | l0.w");
	cr_assert_eq(b.b[3].n, 1);
	loom_buckets_free(&b);
	loom_graph_free(n.g);
}

/* The default 25 MiB cap holds the whole model after the first bucket. */
Test(buckets, big_cap_two_buckets)
{
	net n;
	loom_buckets b;
	build(&n, LOOM_F32);
	cr_assert_eq(loom_bucket_pass(n.g, n.grads, n.np, 25 << 20, 1 << 20, &b), LOOM_OK);
	cr_assert_eq(b.n, 1, "%d buckets: the model (49 KiB) fits the first", b.n);
	loom_buckets_free(&b);
	loom_graph_free(n.g);
}

/* Every gradient lies inside its bucket, no two overlap, each all-reduce
 * is scheduled after all of its gradients and owns its bucket's bytes. */
Test(buckets, views_inside_buckets)
{
	net n;
	loom_buckets b;
	loom_memplan mp;
	build(&n, LOOM_F32);
	cr_assert_eq(loom_bucket_pass(n.g, n.grads, n.np, 20 << 10, 4 << 10, &b), LOOM_OK);
	cr_assert_eq(loom_memplan_build_buckets(n.g, b.order, &b, &mp), LOOM_OK);
	cr_assert_eq(mp.regions[LOOM_REGION_BUCKET].bytes, b.bytes);
	cr_assert_gt(b.bytes, 0);
	int *pos = malloc(sizeof(int) * n.g->n);
	for (int i = 0; i < mp.nschedule; i++)
		pos[mp.schedule[i]] = i;
	for (int k = 0; k < b.n; k++) {
		const loom_bucket *bk = &b.b[k];
		cr_assert_eq(mp.region[bk->node], LOOM_REGION_BUCKET);
		cr_assert_eq(mp.offset[bk->node], bk->base);
		cr_assert_eq(n.g->nodes[bk->node].op, LOOM_OP_ALLREDUCE);
		for (int i = bk->first; i < bk->first + bk->n; i++) {
			loom_value v = b.grad[i];
			cr_assert_eq(mp.region[v], LOOM_REGION_BUCKET, "gradient %d", v);
			cr_assert_geq(mp.offset[v], bk->base);
			cr_assert_leq(mp.offset[v] + bytes_of(n.g, v), bk->base + bk->bytes,
				      "gradient %d outside bucket %d", v, k);
			cr_assert_lt(pos[v], pos[bk->node], "all-reduce %d before gradient %d", k, v);
		}
	}
	/* No two gradients share a byte. */
	for (int i = 0; i < b.ngrad; i++)
		for (int j = i + 1; j < b.ngrad; j++) {
			size_t a0 = mp.offset[b.grad[i]], a1 = a0 + bytes_of(n.g, b.grad[i]);
			size_t b0 = mp.offset[b.grad[j]], b1 = b0 + bytes_of(n.g, b.grad[j]);
			cr_assert(a1 <= b0 || b1 <= a0, "gradients %d and %d overlap", b.grad[i], b.grad[j]);
		}
	/* Buckets do not overlap either, and the first all-reduce starts
	 * before backward ends (the point of the small first bucket). */
	for (int k = 1; k < b.n; k++)
		cr_assert_geq(b.b[k].base, b.b[k - 1].base + b.b[k - 1].bytes);
	cr_assert_lt(pos[b.b[0].node], mp.nschedule - 1);
	free(pos);
	loom_memplan_free(&mp);
	loom_buckets_free(&b);
	loom_graph_free(n.g);
}

/* Half gradients (O2's) fill half the bytes: a bucket per dtype. */
Test(buckets, half_gradients)
{
	net n;
	loom_buckets b;
	build(&n, LOOM_F16);
	cr_assert_eq(loom_bucket_pass(n.g, n.grads, n.np, 25 << 20, 1 << 20, &b), LOOM_OK);
	cr_assert_eq(b.n, 1);
	cr_assert_eq(b.b[0].dtype, LOOM_F16);
	cr_assert_lt(b.b[0].bytes, (size_t)30 << 10, "%zu bytes", b.b[0].bytes);
	cr_assert_eq(b.b[0].count * 2, (int64_t)b.b[0].bytes);
	loom_buckets_free(&b);
	loom_graph_free(n.g);
}

/* Odd sizes (7x13 weights, 13-element biases: 364 and 52 bytes in f32, 26
 * in f16): each gradient starts on the bucket alignment, lies inside its
 * bucket with its whole size, overlaps no other, and each bucket's count
 * covers its gradients' bytes. Sizes that are all multiples of 64 bytes
 * (the tests above) would pass a packing that forgot the alignment. */
static void check_odd(loom_dtype dt)
{
	static const int64_t w[4] = { 7, 13, 5, 3 };
	net n;
	loom_buckets b;
	loom_memplan mp;
	size_t es = loom_dtype_size(dt);

	build_widths(&n, dt, w);
	cr_assert_eq(loom_bucket_pass(n.g, n.grads, n.np, 200, 40, &b), LOOM_OK);
	cr_assert_eq(loom_memplan_build_buckets(n.g, b.order, &b, &mp), LOOM_OK);
	cr_assert_gt(b.n, 2, "small caps make several buckets (%d)", b.n);
	for (int k = 0; k < b.n; k++) {
		const loom_bucket *bk = &b.b[k];
		cr_assert_eq(bk->base % LOOM_BUCKET_ALIGN, 0, "bucket %d at %zu", k, bk->base);
		cr_assert_eq(mp.offset[bk->node], bk->base);
		cr_assert_eq((size_t)bk->count * es, bk->bytes, "bucket %d", k);
		for (int i = bk->first; i < bk->first + bk->n; i++) {
			loom_value v = b.grad[i];
			size_t off = mp.offset[v];
			cr_assert_eq(off % LOOM_BUCKET_ALIGN, 0, "gradient %d at %zu", v, off);
			cr_assert_eq(off, bk->base + b.offset[i], "gradient %d: plan and pass agree", v);
			cr_assert_geq(off, bk->base);
			cr_assert_leq(off + bytes_of(n.g, v), bk->base + bk->bytes,
				      "gradient %d (%zu bytes at %zu) outside bucket %d [%zu, %zu)", v,
				      bytes_of(n.g, v), off, k, bk->base, bk->base + bk->bytes);
		}
	}
	for (int i = 0; i < b.ngrad; i++)
		for (int j = i + 1; j < b.ngrad; j++) {
			size_t a0 = mp.offset[b.grad[i]], a1 = a0 + bytes_of(n.g, b.grad[i]);
			size_t b0 = mp.offset[b.grad[j]], b1 = b0 + bytes_of(n.g, b.grad[j]);
			cr_assert(a1 <= b0 || b1 <= a0, "gradients %d and %d overlap", b.grad[i],
				  b.grad[j]);
		}
	loom_memplan_free(&mp);
	loom_buckets_free(&b);
	loom_graph_free(n.g);
}

Test(buckets, odd_sizes_f32)
{
	check_odd(LOOM_F32);
}

Test(buckets, odd_sizes_f16)
{
	check_odd(LOOM_F16);
}

/* The 64-wide net's gradients in bucket order (reverse parameter order):
 * l2.bias 256 B, l2.weight 16 KiB, l1.bias, l1.weight, l0.bias, l0.weight.
 * A cap the bias and its weight exactly reach holds both, in the first
 * (small) bucket and in the later ones; a cap one element (4 bytes) short
 * of that sends the weight to a bucket of its own. */
Test(buckets, a_bucket_holds_exactly_its_cap)
{
	net n;
	loom_buckets b;
	const size_t pair = 256 + (64 * 64) * 4;
	build(&n, LOOM_F32);
	cr_assert_eq(loom_bucket_pass(n.g, n.grads, n.np, pair, pair, &b), LOOM_OK);
	cr_assert_eq(b.n, 3, "%d buckets: each bias with its weight, the cap reached exactly", b.n);
	for (int k = 0; k < 3; k++) {
		cr_assert_eq(b.b[k].n, 2, "bucket %d: %d gradients", k, b.b[k].n);
		cr_assert_eq(b.b[k].bytes, pair, "bucket %d: %zu bytes", k, b.b[k].bytes);
	}
	loom_buckets_free(&b);
	loom_graph_free(n.g);
}

Test(buckets, one_element_over_the_cap_starts_a_bucket)
{
	net n;
	loom_buckets b;
	const size_t pair = 256 + (64 * 64) * 4;
	/* The first bucket's cap one element short, the others exact: the
	 * first holds l2.bias alone, then each weight is followed by the
	 * next bias (exactly the cap), l0.weight alone last. */
	build(&n, LOOM_F32);
	cr_assert_eq(loom_bucket_pass(n.g, n.grads, n.np, pair, pair - 4, &b), LOOM_OK);
	cr_assert_eq(b.n, 4, "%d buckets", b.n);
	static const int members[4] = { 1, 2, 2, 1 };
	for (int k = 0; k < 4; k++)
		cr_assert_eq(b.b[k].n, members[k], "bucket %d: %d gradients", k, b.b[k].n);
	cr_assert_eq(b.grad[0], n.grads[5], "the first bucket: l2.bias");
	loom_buckets_free(&b);
	loom_graph_free(n.g);
	/* The later buckets' cap one element short: every gradient alone. */
	build(&n, LOOM_F32);
	cr_assert_eq(loom_bucket_pass(n.g, n.grads, n.np, pair - 4, pair, &b), LOOM_OK);
	cr_assert_eq(b.n, 5, "%d buckets: l2.b l2.w | l1.b | l1.w | l0.b | l0.w", b.n);
	cr_assert_eq(b.b[0].n, 2);
	for (int k = 1; k < 5; k++)
		cr_assert_eq(b.b[k].n, 1, "bucket %d: %d gradients", k, b.b[k].n);
	loom_buckets_free(&b);
	loom_graph_free(n.g);
}
