/*
 * engine/cuda/embedding.cu — embedding on the GPU: the gather of table rows
 * by id and its backward scatter-add, bucketed by token (the ids sorted,
 * one block per run of equal ids, no atomics; one thread per column over
 * every token where cub cannot size the sort); the entries of EMBEDDING and
 * EMBEDDING_BWD. An EMBEDDING_BWD carrying LOOM_NODE_ACCUM (graph/fuse.c's
 * loom_fuse_emb_bwd_accum: a tied table's two gradients) adds each row's
 * sum, rounded into its dtype as the unfused node stored it, into the
 * classifier's dW (its last source) as autodiff's add did, the same bits;
 * where it writes over dW's bytes, a row no id touches is left as it is
 * (LOOM_CUDA_EMB_BWD_ACCUM, read at compile; off until run on a GPU).
 * An id outside the table's real rows fails the step as on the CPU: the
 * forward flags it in the control block (a zero row in its place), the
 * update is skipped on the device, the next sync reports it in the CPU's
 * words (compiled, not yet run); every kernel here guards its ids, so
 * none reads or writes outside the table or its gradient. CPU twin:
 * engine/cpu/embedding.c (the scatter-add in row order). Status as the
 * rest of engine/cuda (README.md): run on an H200 through the GPU suite.
 */
#include <stdint.h>

#include <cub/device/device_radix_sort.cuh>

#include "base/options.h"
#include "engine/cuda/dtype.cuh"

static const int threads = 256;

// ----------------------------------------------------------------------------
// CUDA kernels

/* Position i of node's ids holds an id outside its table: recorded for
 * the next sync's report (loom_cuda_report_bad_id). The first node to
 * flag owns the record (kernels run in step order on one stream, so it is
 * the node the CPU would stop at), its first bad position by atomicMin. */
static __device__ void emb_flag_bad(loom_cuda_ctl *ctl, int node, int64_t i)
{
	const int prev = atomicCAS(&ctl->emb_node, -1, node);
	if (prev == -1 || prev == node)
		atomicMin((long long *)&ctl->emb_pos, (long long)i);
}

/* y[i, j] = table[ids[i], j]; an id outside [0, v) gives a zero row (the
 * table is never read there) and is flagged in ctl for node, which fails
 * the step: the decision skips the update, the next sync reports it. */
__global__ void loom_embedding_fwd_kernel(int64_t n, int v, int c, const int32_t *ids,
					  const void *table, int tdt, void *y, int ydt, int node,
					  loom_cuda_ctl *ctl)
{
	for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n * c;
	     e += (int64_t)gridDim.x * blockDim.x) {
		int64_t i = e / c;
		int j = (int)(e % c), id = ids[i];
		const bool ok = id >= 0 && id < v;
		if (!ok && j == 0)
			emb_flag_bad(ctl, node, i);
		loom_st(y, ydt, e, ok ? loom_ld(table, tdt, (int64_t)id * c + j) : 0.0f);
	}
}

/* One thread per column: rows added in order into fp32 acc [v, c] (zeroed
 * first), as the CPU does, so the sums are the CPU's bit for bit. */
__global__ void loom_embedding_bwd_kernel(int64_t n, int v, int c, const int32_t *ids,
					  const void *dy, int dydt, float *acc)
{
	for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < c; j += gridDim.x * blockDim.x)
		for (int64_t i = 0; i < n; i++) {
			int id = ids[i];
			if (id >= 0 && id < v)
				acc[(int64_t)id * c + j] += loom_ld(dy, dydt, i * c + j);
		}
}

/* The bucketed embedding backward: key[i] = the
 * id of position i (v for an id outside [0, v): no row), val[i] = i; a
 * stable radix sort by key then puts each token's positions together, in
 * position order. */
__global__ void loom_embedding_keys_kernel(int64_t n, int v, const int32_t *ids, int32_t *key,
					   int32_t *val)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		int id = ids[i];
		key[i] = id >= 0 && id < v ? id : v;
		val[i] = (int32_t)i;
	}
}

/* One block per sorted position s; the block whose s starts a run of equal
 * ids adds that run's rows of dy, in position order, into row id of dw
 * (zeroed first for the ids that never occur), one thread per column: the
 * additions of the CPU's row-order scatter-add, in fp32, rounded once to
 * dw's dtype. Each row of dw is written by one block only, so no atomics
 * and the same bits every run. add (may be NULL, may be dw itself): the
 * other gradient the rounded sum is added to, element by element read
 * before written (the rows no id touches already hold it). */
__global__ void loom_embedding_bwd_bucket_kernel(int64_t n, int v, int c, const int32_t *key,
						 const int32_t *val, const void *dy, int dydt,
						 const void *add, int adt, void *dw, int dwdt)
{
	for (int64_t s = blockIdx.x; s < n; s += gridDim.x) {
		const int id = key[s];
		if (id >= v || (s > 0 && key[s - 1] == id))
			continue;
		int64_t end = s + 1;
		while (end < n && key[end] == id)
			end++;
		for (int j = threadIdx.x; j < c; j += blockDim.x) {
			float acc = 0;
			for (int64_t r = s; r < end; r++)
				acc += loom_ld(dy, dydt, (int64_t)val[r] * c + j);
			const int64_t e = (int64_t)id * c + j;
			loom_st(dw, dwdt, e, add ? loom_stored(dwdt, acc) + loom_ld(add, adt, e) : acc);
		}
	}
}

/* The column kernel's fp32 sums acc rounded into dw's dtype, as the
 * unfused node stored them, and added to the other gradient add (may be
 * dw itself: element by element). */
__global__ void loom_embedding_bwd_add_kernel(int64_t total, const float *acc, const void *add,
					      int adt, void *dw, int dwdt)
{
	for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
	     e += (int64_t)gridDim.x * blockDim.x)
		loom_st(dw, dwdt, e, loom_stored(dwdt, acc[e]) + loom_ld(add, adt, e));
}

// ----------------------------------------------------------------------------
// kernel launchers and op entries

int loom_cuda_emb_bwd_accum_fusable(const loom_graph *g, loom_value d, loom_value s, int other)
{
	const loom_node *dn = &g->nodes[d];
	if (!loom_opt_bool(LOOM_OPT_CUDA_EMB_BWD_ACCUM) || dn->shape.ndim != 2)
		return 0;
	const loom_value v[4] = { d, dn->src[1], s, g->nodes[s].src[other] };
	for (int i = 0; i < 4; i++) {
		const loom_dtype dt = (loom_dtype)g->nodes[v[i]].dtype;
		if (dt != LOOM_F32 && dt != LOOM_BF16 && dt != LOOM_F16)
			return 0;
	}
	return 1;
}

/* The bits a key in [0, v] needs. */
static int key_bits(int v)
{
	int b = 1;
	while (b < 31 && ((int64_t)1 << b) <= v)
		b++;
	return b;
}

/* The bucketed backward's workspace for n ids: keys and values, sorted and
 * not, then cub's own; 0 when cub cannot size it (the old kernel runs). */
static size_t emb_bucket_ws(int64_t n, int v, size_t *cub_bytes)
{
	size_t tmp = 0;
	*cub_bytes = 0;
	if (n <= 0 || n > INT32_MAX || v <= 0 || v == INT32_MAX)
		return 0;
	if (cub::DeviceRadixSort::SortPairs(NULL, tmp, (const int32_t *)NULL, (int32_t *)NULL,
					    (const int32_t *)NULL, (int32_t *)NULL, (int)n, 0,
					    key_bits(v)) != cudaSuccess) {
		cudaGetLastError();
		return 0;
	}
	*cub_bytes = tmp;
	return 4 * loom_cuda_align(sizeof(int32_t) * (size_t)n) + loom_cuda_align(tmp);
}

/* An embedding backward whose gradient is half sums in fp32 workspace;
 * the bucketed one writes any dtype itself and needs its sort's (the
 * larger of the two). */
size_t loom_cuda_embedding_bwd_ws(const loom_plan *p, loom_value v)
{
	const loom_node *n = loom_cuda_node(p, v);
	size_t cub_bytes;
	/* fp32 sums apart from the result: a half result, or a sum added
	 * into the other gradient (the result may be its bytes) */
	size_t old = n->dtype == LOOM_F32 && !(n->flags & LOOM_NODE_ACCUM) ?
			     0 : loom_cuda_align(sizeof(float) * (size_t)loom_shape_numel(&n->shape));
	size_t b = emb_bucket_ws(loom_shape_numel(&loom_cuda_src(p, v, 0)->shape),
				 (int)n->shape.dims[0], &cub_bytes);
	/* The old kernel runs where cub cannot size the sort (b is 0). */
	return b > old ? b : old;
}

/* The bucketed embedding backward: sort, zero dw, add the runs. done is 0
 * when it did not run (no workspace of its own was planned). */
static loom_status embedding_bwd_bucket(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
					const loom_cuda_io *io, int *done)
{
	const loom_node *n = loom_cuda_node(plan, v);
	int64_t cnt = loom_shape_numel(&loom_cuda_src(plan, v, 0)->shape), total = loom_shape_numel(&n->shape);
	int vocab = (int)n->shape.dims[0], cc = (int)n->shape.dims[1];
	size_t cub_bytes, ws = emb_bucket_ws(cnt, vocab, &cub_bytes);
	*done = 0;
	if (!ws || ws > c->plans[v].ws)
		return LOOM_OK;
	const size_t part = loom_cuda_align(sizeof(int32_t) * (size_t)cnt);
	char *base = (char *)c->arena->ws;
	int32_t *key = (int32_t *)base, *val = (int32_t *)(base + part);
	int32_t *skey = (int32_t *)(base + 2 * part), *sval = (int32_t *)(base + 3 * part);
	int adt = 0;
	const void *add = loom_cuda_addend(plan, v, io, &adt);
	/* The rows no id touches: zero, or the other gradient's (nothing to
	 * do where the result is its bytes). */
	loom_status st = !add ? LOOM_CUDA_CHECK(cudaMemsetAsync(io->out, 0,
								loom_dtype_size(n->dtype) * (size_t)total,
								c->stream),
						c->err, sizeof(c->err)) :
		add != io->out ? loom_cuda_cast(c->err, c->stream, add, adt, io->out, io->odt, total) :
				 LOOM_OK;
	if (st != LOOM_OK)
		return st;
	loom_embedding_keys_kernel<<<loom_cuda_blocks(cnt, threads), threads, 0, c->stream>>>(
		cnt, vocab, (const int32_t *)io->src[0], key, val);
	if ((st = LOOM_CUDA_LAUNCHED(c->err)) != LOOM_OK)
		return st;
	st = LOOM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + 4 * part, cub_bytes, key, skey,
							     val, sval, (int)cnt, 0,
							     key_bits(vocab), c->stream),
			     c->err, sizeof(c->err));
	if (st != LOOM_OK || cc <= 0)
		return st;
	unsigned blocks = cnt < 65535 * 16 ? (unsigned)cnt : 65535u * 16;
	loom_embedding_bwd_bucket_kernel<<<blocks, threads, 0, c->stream>>>(
		cnt, vocab, cc, skey, sval, io->src[1], io->dt[1], add, adt, io->out, io->odt);
	if ((st = LOOM_CUDA_LAUNCHED(c->err)) == LOOM_OK)
		*done = 1;
	return st;
}

loom_status loom_cuda_op_embedding(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				   const loom_cuda_io *io)
{
	const loom_node *w = loom_cuda_src(plan, v, 1);
	int64_t n = loom_shape_numel(&loom_cuda_src(plan, v, 0)->shape);
	int cc = (int)w->shape.dims[1];
	if (n * cc <= 0)
		return LOOM_OK;
	loom_embedding_fwd_kernel<<<loom_cuda_blocks(n * cc, threads), threads, 0, c->stream>>>(
		n, (int)loom_node_user_shape(w).dims[0] /* a padded table: the real rows */, cc,
		(const int32_t *)io->src[0], io->src[1], io->dt[1], io->out, io->odt, (int)v,
		c->ctl);
	return LOOM_CUDA_LAUNCHED(c->err);
}

/* The id at the flagged position read back, in the CPU backend's words
 * (loom_bad_id); the flags cleared for the next step. An error path: it
 * waits. */
loom_status loom_cuda_report_bad_id(loom_cuda_ctx *c, const loom_plan *p, const loom_cuda_ctl *h)
{
	const loom_node *n = &p->g->nodes[h->emb_node];
	const int32_t *ids = (const int32_t *)loom_arena_ptr(c->arena, p, n->src[0]);
	int32_t id = -1;
	loom_status st = loom_cuda_fault_read(c, ids + h->emb_pos, &id);
	if (st != LOOM_OK)
		return st;
	return loom_bad_id(c->err, p, h->emb_node, id, h->emb_pos);
}

loom_status loom_cuda_op_embedding_bwd(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				       const loom_cuda_io *io)
{
	const loom_node *n = loom_cuda_node(plan, v);
	int64_t cnt = loom_shape_numel(&loom_cuda_src(plan, v, 0)->shape), total = loom_shape_numel(&n->shape);
	int cc = (int)n->shape.dims[1], done = 0;
	loom_status st;
	if ((st = embedding_bwd_bucket(c, plan, v, io, &done)) != LOOM_OK || done)
		return st;
	int adt = 0;
	const void *add = loom_cuda_addend(plan, v, io, &adt);
	float *acc = n->dtype == LOOM_F32 && !add ? (float *)io->out : (float *)c->arena->ws;
	st = LOOM_CUDA_CHECK(cudaMemsetAsync(acc, 0, sizeof(float) * total, c->stream),
					 c->err, sizeof(c->err));
	if (st != LOOM_OK || cc <= 0)
		return st;
	loom_embedding_bwd_kernel<<<loom_cuda_blocks(cc, threads), threads, 0, c->stream>>>(
		cnt, (int)n->shape.dims[0], cc, (const int32_t *)io->src[0], io->src[1], io->dt[1],
		acc);
	if ((st = LOOM_CUDA_LAUNCHED(c->err)) != LOOM_OK)
		return st;
	if (add) {
		loom_embedding_bwd_add_kernel<<<loom_cuda_blocks(total, threads), threads, 0,
						c->stream>>>(total, acc, add, adt, io->out, io->odt);
		return LOOM_CUDA_LAUNCHED(c->err);
	}
	if (n->dtype == LOOM_F32)
		return st;
	return loom_cuda_cast(c->err, c->stream, acc, LOOM_F32, io->out, io->odt, total);
}
