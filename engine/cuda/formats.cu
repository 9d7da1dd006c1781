/*
 * engine/cuda/formats.cu — memory formats on the CUDA backend: the
 * REORDER node's entry and the NCHW <-> NHWC kernel it and the
 * convolutions (their filters, and operands not in the layout cuDNN runs
 * in) use; which formats each node takes is formats.c (plain C), and
 * loom_cuda_formats_ok checks the node plans made against it. CPU twin:
 * engine/cpu/ops_format.c, loom_cpu_reorder in engine/cpu/blocked.c.
 * Compiled, not yet run.
 */

#include "engine/cuda/dtype.cuh"
#include "graph/unary.h"

extern "C" {
#include "graph/ops/ops.h"
}

#define TILE 32
#define ROWS 8

/* Per image b (blockIdx.z): out[b][j][i] = in[b][i][j], in being rows x
 * cols: NCHW -> NHWC with rows = C, cols = H*W, and back with the two
 * swapped. A 32x32 tile through shared memory, so that reads and writes
 * are both coalesced; a column of padding against bank conflicts. */
template <typename T>
__global__ void loom_transpose_kernel(const T *__restrict__ in, T *__restrict__ out, int64_t rows,
				      int64_t cols)
{
	__shared__ T tile[TILE][TILE + 1];
	const int64_t img = (int64_t)blockIdx.z * rows * cols;
	int64_t r0 = (int64_t)blockIdx.y * TILE, c0 = (int64_t)blockIdx.x * TILE;
	for (int k = threadIdx.y; k < TILE; k += ROWS) {
		int64_t r = r0 + k, c = c0 + threadIdx.x;
		if (r < rows && c < cols)
			tile[k][threadIdx.x] = in[img + r * cols + c];
	}
	__syncthreads();
	for (int k = threadIdx.y; k < TILE; k += ROWS) {
		int64_t c = c0 + k, r = r0 + threadIdx.x; /* out is cols x rows */
		if (r < rows && c < cols)
			out[img + c * rows + r] = tile[threadIdx.x][k];
	}
}

template <typename T>
static loom_status transpose(char *err, cudaStream_t s, const void *in, void *out, int64_t n,
			     int64_t rows, int64_t cols)
{
	/* grid y is at most 65535 tiles of rows; z (images) 65535 */
	dim3 grid((unsigned)((cols + TILE - 1) / TILE), (unsigned)((rows + TILE - 1) / TILE),
		  (unsigned)n);
	loom_transpose_kernel<T><<<grid, dim3(TILE, ROWS), 0, s>>>((const T *)in, (T *)out, rows,
								 cols);
	return LOOM_CUDA_LAUNCHED(err);
}

extern "C" loom_status loom_cuda_reorder(char *err, cudaStream_t s, int from, int to, size_t esz,
					 int64_t n, int64_t c, int64_t hw, const void *x, void *y)
{
	if (n <= 0 || c <= 0 || hw <= 0)
		return LOOM_OK;
	if (from == to)
		return LOOM_CUDA_CHECK(cudaMemcpyAsync(y, x, (size_t)(n * c * hw) * esz,
						       cudaMemcpyDeviceToDevice, s),
				       err, LOOM_ERR_MAX);
	int64_t rows, cols;
	if (from == LOOM_FORMAT_NCHW && to == LOOM_FORMAT_NHWC) {
		rows = c;
		cols = hw;
	} else if (from == LOOM_FORMAT_NHWC && to == LOOM_FORMAT_NCHW) {
		rows = hw;
		cols = c;
	} else {
		return loom_errnf(err, LOOM_ERR_MAX, LOOM_ERR_UNSUPPORTED, "cuda reorder: %s -> %s is not supported",
				 loom_format_name((loom_format)from), loom_format_name((loom_format)to));
	}
	if (n > 65535 || (rows + TILE - 1) / TILE > 65535)
		return loom_errnf(err, LOOM_ERR_MAX, LOOM_ERR_UNSUPPORTED,
				 "cuda reorder: %lld images of %lld x %lld is past the grid",
				 (long long)n, (long long)rows, (long long)cols);
	switch (esz) {
	case 2: return transpose<unsigned short>(err, s, x, y, n, rows, cols);
	case 4: return transpose<unsigned int>(err, s, x, y, n, rows, cols);
	case 8: return transpose<unsigned long long>(err, s, x, y, n, rows, cols);
	default:
		return loom_errnf(err, LOOM_ERR_MAX, LOOM_ERR_UNSUPPORTED, "cuda reorder: %zu-byte elements", esz);
	}
}

/* REORDER: its source in the source's format into the node's. */
loom_status loom_cuda_op_reorder(loom_cuda_ctx *c, const loom_plan *plan, loom_value v,
				 const loom_cuda_io *io)
{
	const loom_node *n = &plan->g->nodes[v];
	const loom_node *x = &plan->g->nodes[n->src[0]];
	if (x->dtype != n->dtype || n->shape.ndim != 4) {
		char lb[96];
		return loom_errnf(c->err, LOOM_ERR_MAX, LOOM_ERR_UNSUPPORTED,
				 "cuda reorder %s: wants a 4-D value of its own dtype",
				 loom_node_label(plan->g, v, lb, sizeof(lb)));
	}
	return loom_cuda_reorder(c->err, c->stream, x->format, n->format, loom_dtype_size(n->dtype),
				 n->shape.dims[0], n->shape.dims[1],
				 n->shape.dims[2] * n->shape.dims[3], io->src[0], io->out);
}

/* The backend's node_formats (ctx may be NULL): formats.c's rules under
 * LOOM_CUDA_NHWC, the own batch-norm kernels (NCHW) where the test hook
 * asks for them. */
extern "C" void loom_cuda_node_formats(void *ctx, const loom_plan *plan, loom_value v,
				       loom_format_caps *caps)
{
	(void)ctx;
	loom_cuda_formats_query(plan, v, caps, loom_cuda_nhwc_mode_get(),
				loom_cuda_own_kernels_on);
}

/* Whether node v's kernel takes its operands in the formats the planner
 * gave them (formats.c decides; this checks that the plans made agree, so
 * that a mismatch is a compile error naming the node, never NHWC bytes
 * read as NCHW). */
int loom_cuda_formats_ok(const loom_cuda_ctx *c, const loom_plan *p, loom_value v)
{
	const loom_node *n = &p->g->nodes[v];
	int nhwc = n->format == LOOM_FORMAT_NHWC;
	for (int i = 0; i < n->nsrc; i++)
		nhwc |= p->g->nodes[n->src[i]].format == LOOM_FORMAT_NHWC;
	if (!nhwc || loom_op_is_leaf(n->op))
		return 1;
	switch (n->op) {
	case LOOM_OP_CONV2D:
	case LOOM_OP_CONV2D_BWD_DATA:
	case LOOM_OP_CONV2D_BWD_FILTER:
	case LOOM_OP_REORDER:
	case LOOM_OP_RESHAPE:
	case LOOM_OP_RELU:
	case LOOM_OP_RELU_BWD:
	case LOOM_OP_ADD:
	case LOOM_OP_CAST:
	case LOOM_OP_MAXPOOL2D:
	case LOOM_OP_MAXPOOL2D_BWD:
	case LOOM_OP_GLOBAL_AVGPOOL:
	case LOOM_OP_GLOBAL_AVGPOOL_BWD:
#define UNARY_CASE(NAME, low) case LOOM_OP_##NAME: case LOOM_OP_##NAME##_BWD:
		LOOM_UNARY_OPS(UNARY_CASE)
#undef UNARY_CASE
		return 1;
	case LOOM_OP_BATCHNORM2D:
	case LOOM_OP_BN_BWD_DATA:
		return c->plans[v].kind == LOOM_CUDA_PLAN_BN;
	case LOOM_OP_BN_BWD_GAMMA:
	case LOOM_OP_CHANNEL_SUM:
		return n->made_by != LOOM_NONE && loom_cuda_plan_makes(&c->plans[n->made_by], v);
	default:
		return 0;
	}
}
