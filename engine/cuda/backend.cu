/*
 * engine/cuda/backend.cu — the CUDA backend: one cudaMalloc'd arena with the
 * CPU backend's layout (persist, act, ws, state) plus a small control block,
 * one stream, per-node plans (cuBLASLt, cuDNN, staged casts) made when the
 * executor asks for workspace sizes, and a dispatch from each node to its
 * library call or kernel. CPU twin: engine/cpu/backend.c.
 *
 * Host and device meet only at upload (pinned staging, no wait) and download
 * (the one sync per step: reading the loss). The loss scaler and step counter
 * live on the device; each download brings them back into p->scaler and
 * p->step, and a host-side change (loom_load) is pushed before the next
 * launch, so program.c and checkpoint.c need no CUDA-specific hook.
 *
 * Written and compiled on a machine without a GPU: none of it has run yet.
 */
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_internal.h"

extern "C" {
#include "engine/cuda/device.h"
}

int loom_cuda_poison_on;
int loom_cuda_own_kernels_on;

extern "C" void loom_cuda_test_poison(int on)
{
	loom_cuda_poison_on = on;
}

extern "C" void loom_cuda_test_own_kernels(int on)
{
	loom_cuda_own_kernels_on = on;
}

static loom_cuda_ctx *ctx_of(const loom_program *p)
{
	return (loom_cuda_ctx *)p->be_ctx;
}

extern "C" void loom_cuda_test_library_use(const struct loom_program *p, int *bn_cudnn,
					   int *bgrad_epilogue)
{
	*bn_cudnn = *bgrad_epilogue = 0;
	if (!p || !p->be || strcmp(p->be->name, "cuda") != 0 || !p->be_ctx)
		return;
	const loom_cuda_ctx *c = ctx_of(p);
	for (int v = 0; v < c->n_plans; v++) {
		*bn_cudnn += c->plans[v].kind == LOOM_CUDA_PLAN_BN;
		*bgrad_epilogue += c->plans[v].kind == LOOM_CUDA_PLAN_MM &&
				   c->plans[v].mm.bgrad != LOOM_NONE;
	}
}

static int is_leaf(const loom_node *n)
{
	return n->op == LOOM_OP_INPUT || n->op == LOOM_OP_PARAM || n->op == LOOM_OP_BUFFER;
}

static loom_value first_f64(const loom_program *p)
{
	for (int v = 0; v < p->g->n; v++)
		if (p->g->nodes[v].dtype == LOOM_F64)
			return v;
	return LOOM_NONE;
}

/* Handles, stream and the plan table; made on the first workspace query. */
static loom_status ctx_create(loom_program *p)
{
	loom_cuda_ctx *c = (loom_cuda_ctx *)calloc(1, sizeof(*c));
	loom_status st;

	if (!c)
		return loom_program_fail(p, LOOM_ERR_NOMEM, "cuda: out of host memory");
	p->be_ctx = c;
	c->plans = (loom_cuda_node_plan *)calloc(p->g->n ? p->g->n : 1, sizeof(*c->plans));
	if (!c->plans)
		return c->status = loom_program_fail(p, LOOM_ERR_NOMEM, "cuda: out of host memory");
	c->n_plans = p->g->n;
	for (int v = 0; v < p->g->n; v++) {
		for (int i = 0; i < LOOM_MAX_SRC; i++)
			c->plans[v].stage[i].src = -1;
		c->plans[v].mm.bgrad = LOOM_NONE;
		c->plans[v].bn.dgamma = c->plans[v].bn.dbeta = LOOM_NONE;
	}
	if ((st = LOOM_CUDA_CHECK(cudaGetDevice(&c->device), p->err, sizeof(p->err))) != LOOM_OK)
		return c->status = st;
	st = LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking),
			     p->err, sizeof(p->err));
	if (st != LOOM_OK)
		return c->status = st;
	if ((st = LOOM_CUBLAS_CHECK(cublasLtCreate(&c->lt), p->err, sizeof(p->err))) != LOOM_OK)
		return c->status = st;
	if ((st = LOOM_CUDNN_CHECK(cudnnCreate(&c->dnn), p->err, sizeof(p->err))) != LOOM_OK)
		return c->status = st;
	if ((st = LOOM_CUDNN_CHECK(cudnnSetStream(c->dnn, c->stream), p->err, sizeof(p->err))) != LOOM_OK)
		return c->status = st;
	return LOOM_OK;
}

static loom_cuda_ctx *ctx_get(loom_program *p)
{
	if (!p->be_ctx)
		ctx_create(p);
	return ctx_of(p);
}

/* ------------------------------------------------------------ planning */

/* Library calls take every operand in the node's dtype: a source of another
 * dtype is cast into ws first (nsrc_lib: how many sources the library reads). */
static size_t plan_stages(const loom_program *p, const loom_node *n, loom_cuda_node_plan *np,
			  int nsrc_lib)
{
	size_t off = np->lib_ws;
	for (int i = 0; i < nsrc_lib && i < n->nsrc; i++) {
		const loom_node *s = &p->g->nodes[n->src[i]];
		if (s->dtype == n->dtype)
			continue;
		np->stage[i].src = i;
		np->stage[i].ws_off = off;
		off += loom_cuda_align((size_t)loom_shape_numel(&s->shape) * loom_dtype_size(n->dtype));
	}
	return off;
}

static size_t cuda_workspace(loom_program *p, loom_value v)
{
	loom_cuda_ctx *c = ctx_get(p);
	if (!c || c->status != LOOM_OK || first_f64(p) != LOOM_NONE || v >= c->n_plans)
		return 0;
	const loom_node *n = &p->g->nodes[v];
	loom_cuda_node_plan *np = &c->plans[v];
	loom_status st = LOOM_OK;

	switch (n->op) {
	case LOOM_OP_CONV2D:
	case LOOM_OP_CONV2D_BWD_DATA:
	case LOOM_OP_CONV2D_BWD_FILTER:
		st = loom_cuda_conv_plan_make(p, c, v, np);
		np->ws = plan_stages(p, n, np, 2); /* a conv bias is read as it is */
		break;
	case LOOM_OP_LINEAR:
	case LOOM_OP_MATMUL:
		st = loom_cuda_mm_plan_make(p, c, v, np);
		np->ws = plan_stages(p, n, np, 3);
		break;
	case LOOM_OP_BATCHNORM2D:
	case LOOM_OP_BN_BWD_DATA:
		st = loom_cuda_bn_plan_make(p, c, v, np);
		np->ws = np->lib_ws; /* cuDNN's path needs its dtypes as they are */
		break;
	case LOOM_OP_SOFTMAX_CE:
		np->ws = loom_cuda_align(sizeof(double) * (size_t)p->g->nodes[n->src[0]].shape.dims[0]);
		break;
	default:
		break;
	}
	if (st != LOOM_OK) {
		c->status = st;
		return 0;
	}
	return np->ws;
}

static int supported(loom_op op)
{
	switch (op) {
	case LOOM_OP_INPUT: case LOOM_OP_PARAM: case LOOM_OP_BUFFER:
	case LOOM_OP_CONV2D: case LOOM_OP_CONV2D_BWD_DATA: case LOOM_OP_CONV2D_BWD_FILTER:
	case LOOM_OP_CHANNEL_SUM: case LOOM_OP_BATCHNORM2D: case LOOM_OP_BN_BWD_DATA:
	case LOOM_OP_BN_BWD_GAMMA: case LOOM_OP_RELU: case LOOM_OP_RELU_BWD:
	case LOOM_OP_MAXPOOL2D: case LOOM_OP_MAXPOOL2D_BWD: case LOOM_OP_LINEAR:
	case LOOM_OP_MATMUL: case LOOM_OP_ADD: case LOOM_OP_RESHAPE: case LOOM_OP_SUM:
	case LOOM_OP_BROADCAST: case LOOM_OP_SOFTMAX_CE: case LOOM_OP_SOFTMAX_CE_BWD:
	case LOOM_OP_GRAD_SEED: case LOOM_OP_CAST: case LOOM_OP_GLOBAL_AVGPOOL:
	case LOOM_OP_GLOBAL_AVGPOOL_BWD:
		return 1;
	default:
		return 0;
	}
}

/* The optimizer's slot and chunk tables, uploaded once into the arena. */
static loom_status upload_opt_tables(loom_program *p, loom_cuda_ctx *c)
{
	loom_cuda_opt_slot *slots =
		(loom_cuda_opt_slot *)calloc(p->n_params ? p->n_params : 1, sizeof(*slots));
	loom_cuda_opt_chunk *chunks =
		(loom_cuda_opt_chunk *)calloc(c->n_chunks ? c->n_chunks : 1, sizeof(*chunks));
	int nstate = p->opts.optim.kind == LOOM_OPTIM_ADAMW ? 2 :
		     (p->opts.optim.kind == LOOM_OPTIM_SGD && p->opts.optim.momentum > 0) ? 1 : 0;
	loom_status st = LOOM_OK;
	int k = 0;

	if (!slots || !chunks) {
		st = loom_program_fail(p, LOOM_ERR_NOMEM, "cuda: out of host memory");
		goto out_free;
	}
	for (int s = 0; s < p->n_params; s++) {
		const loom_param_slot *sl = &p->params[s];
		slots[s].param = loom_value_ptr(p, sl->param);
		slots[s].grad = loom_value_ptr(p, sl->grad);
		slots[s].master = sl->master != LOOM_NONE ? loom_value_ptr(p, sl->master) : NULL;
		slots[s].st0 = nstate > 0 ? p->state + sl->state_off[0] : NULL;
		slots[s].st1 = nstate > 1 ? p->state + sl->state_off[1] : NULL;
		slots[s].numel = sl->numel;
		slots[s].param_dt = p->g->nodes[sl->param].dtype;
		slots[s].grad_dt = p->g->nodes[sl->grad].dtype;
		slots[s].state_dt = sl->state_dtype;
		for (int64_t off = 0; off < sl->numel; off += LOOM_CUDA_OPT_CHUNK) {
			chunks[k].slot = s;
			chunks[k].off = off;
			k++;
		}
	}
	st = LOOM_CUDA_CHECK(cudaMemcpyAsync(c->d_slots, slots, sizeof(*slots) * p->n_params,
					     cudaMemcpyHostToDevice, c->stream),
			     p->err, sizeof(p->err));
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(cudaMemcpyAsync(c->d_chunks, chunks, sizeof(*chunks) * c->n_chunks,
						     cudaMemcpyHostToDevice, c->stream),
				     p->err, sizeof(p->err));
	/* The host tables are freed below: wait for the copies. */
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(cudaStreamSynchronize(c->stream), p->err, sizeof(p->err));
out_free:
	free(chunks);
	free(slots);
	return st;
}

static loom_status cuda_prepare(loom_program *p)
{
	loom_cuda_ctx *c = ctx_get(p);
	loom_status st;
	char lb[96], dev[96];

	if (!c)
		return LOOM_ERR_NOMEM;
	if (c->status != LOOM_OK)
		return c->status; /* the planning failure's message is in p->err */
	loom_value bad = first_f64(p);
	if (bad != LOOM_NONE)
		return loom_program_fail(p, LOOM_ERR_UNSUPPORTED,
					 "cuda: %s is f64; f64 graphs run on the CPU backend only",
					 loom_node_label(p->g, bad, lb, sizeof(lb)));
	for (int v = 0; v < p->g->n; v++)
		if (!supported(p->g->nodes[v].op))
			return loom_program_fail(p, LOOM_ERR_UNSUPPORTED, "cuda: no kernel for %s",
						 loom_node_label(p->g, v, lb, sizeof(lb)));

	c->n_chunks = 0;
	for (int s = 0; s < p->n_params; s++)
		c->n_chunks += (int)((p->params[s].numel + LOOM_CUDA_OPT_CHUNK - 1) / LOOM_CUDA_OPT_CHUNK);

	/* One allocation: persist | act | ws | state | ctl | slots | chunks. */
	size_t o_act = loom_cuda_align(p->mp.persist_bytes);
	size_t o_ws = o_act + loom_cuda_align(p->mp.act_bytes);
	size_t o_state = o_ws + loom_cuda_align(p->ws_bytes);
	size_t o_ctl = o_state + loom_cuda_align(p->state_bytes);
	size_t o_slots = o_ctl + loom_cuda_align(sizeof(loom_cuda_ctl));
	size_t o_chunks = o_slots + loom_cuda_align(sizeof(loom_cuda_opt_slot) * p->n_params);
	size_t total = o_chunks + loom_cuda_align(sizeof(loom_cuda_opt_chunk) * c->n_chunks);

	st = LOOM_CUDA_CHECK(cudaMalloc((void **)&c->arena, total), p->err, sizeof(p->err));
	if (st != LOOM_OK)
		return st;
	c->arena_bytes = total;
	p->persist = c->arena;
	p->act = c->arena + o_act;
	p->ws = c->arena + o_ws;
	p->state = c->arena + o_state;
	c->ctl = (loom_cuda_ctl *)(c->arena + o_ctl);
	c->d_slots = (loom_cuda_opt_slot *)(c->arena + o_slots);
	c->d_chunks = (loom_cuda_opt_chunk *)(c->arena + o_chunks);

	/* Zeros as the CPU arena, or (test hook) all-ones bytes: NaN in f32,
	 * f16 and bf16, so an element no kernel writes cannot pass a test. The
	 * hook is the program's from here on: every run of it poisons too. */
	c->poison = loom_cuda_poison_on;
	st = LOOM_CUDA_CHECK(cudaMemsetAsync(c->arena, c->poison ? 0xff : 0, o_ctl,
					     c->stream),
			     p->err, sizeof(p->err));
	if (st != LOOM_OK)
		return st;

	c->pinned_half = (size_t)4 << 20;
	st = LOOM_CUDA_CHECK(cudaMallocHost((void **)&c->pinned, 2 * c->pinned_half),
			     p->err, sizeof(p->err));
	for (int i = 0; i < 2 && st == LOOM_OK; i++)
		st = LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&c->pinned_ev[i],
							      cudaEventDisableTiming),
				     p->err, sizeof(p->err));
	if (st != LOOM_OK)
		return st;

	loom_cuda_ctl ctl;
	memset(&ctl, 0, sizeof(ctl));
	ctl.scaler = p->scaler;
	ctl.step = p->step;
	ctl.ce_node = -1;
	ctl.ce_row = INT32_MAX;
	ctl.first_nonfinite = -1;
	st = LOOM_CUDA_CHECK(cudaMemcpyAsync(c->ctl, &ctl, sizeof(ctl), cudaMemcpyHostToDevice,
					     c->stream),
			     p->err, sizeof(p->err));
	if (st != LOOM_OK)
		return st;
	c->host_scaler = p->scaler;
	c->host_step = p->step;
	if ((st = upload_opt_tables(p, c)) != LOOM_OK)
		return st;

	if (loom_cuda_device_name(c->device, dev, sizeof(dev)) != LOOM_OK)
		snprintf(dev, sizeof(dev), "device %d", c->device);
	snprintf(p->backend_name, sizeof(p->backend_name), "cuda: %s", dev);
	return LOOM_CUDA_CHECK(cudaStreamSynchronize(c->stream), p->err, sizeof(p->err));
}

static void cuda_release(loom_program *p)
{
	loom_cuda_ctx *c = ctx_of(p);
	if (!c)
		return;
	/* Teardown: errors here have nowhere to go and nothing to undo. */
	if (c->stream)
		(void)cudaStreamSynchronize(c->stream);
	for (int v = 0; v < c->n_plans; v++) {
		if (c->plans[v].kind == LOOM_CUDA_PLAN_CONV)
			loom_cuda_conv_plan_free(&c->plans[v]);
		else if (c->plans[v].kind == LOOM_CUDA_PLAN_MM)
			loom_cuda_mm_plan_free(&c->plans[v]);
		else if (c->plans[v].kind == LOOM_CUDA_PLAN_BN)
			loom_cuda_bn_plan_free(&c->plans[v]);
	}
	free(c->plans);
	if (c->arena)
		(void)cudaFree(c->arena);
	if (c->pinned)
		(void)cudaFreeHost(c->pinned);
	for (int i = 0; i < 2; i++)
		if (c->pinned_ev[i])
			(void)cudaEventDestroy(c->pinned_ev[i]);
	if (c->dnn)
		(void)cudnnDestroy(c->dnn);
	if (c->lt)
		(void)cublasLtDestroy(c->lt);
	if (c->stream)
		(void)cudaStreamDestroy(c->stream);
	(void)cudaGetLastError();
	free(c);
	p->be_ctx = NULL;
	p->persist = p->act = p->ws = p->state = NULL;
}

/* ------------------------------------------------------------ host <-> device */

/* Copies through the two pinned halves: the host copies into one half while
 * the DMA of the other may still run; it waits only when it comes back to a
 * half whose copy has not finished. No stream sync. */
static loom_status cuda_upload(loom_program *p, void *dst, const void *src, size_t bytes)
{
	loom_cuda_ctx *c = ctx_of(p);
	const unsigned char *s = (const unsigned char *)src;
	unsigned char *d = (unsigned char *)dst;
	loom_status st = LOOM_OK;

	while (bytes > 0 && st == LOOM_OK) {
		size_t n = bytes < c->pinned_half ? bytes : c->pinned_half;
		int k = c->pinned_next;
		unsigned char *stage = c->pinned + (size_t)k * c->pinned_half;
		st = LOOM_CUDA_CHECK(cudaEventSynchronize(c->pinned_ev[k]), p->err, sizeof(p->err));
		if (st != LOOM_OK)
			break;
		memcpy(stage, s, n);
		st = LOOM_CUDA_CHECK(cudaMemcpyAsync(d, stage, n, cudaMemcpyHostToDevice, c->stream),
				     p->err, sizeof(p->err));
		if (st == LOOM_OK)
			st = LOOM_CUDA_CHECK(cudaEventRecord(c->pinned_ev[k], c->stream),
					     p->err, sizeof(p->err));
		c->pinned_next = k ^ 1;
		s += n;
		d += n;
		bytes -= n;
	}
	return st;
}

/* A host-side change of the scaler or step (loom_load) since the last sync
 * goes to the device before anything reads it there. Async. */
static loom_status push_host_state(loom_program *p, loom_cuda_ctx *c)
{
	if (memcmp(&p->scaler, &c->host_scaler, sizeof(p->scaler)) == 0 && p->step == c->host_step)
		return LOOM_OK;
	loom_cuda_ctl h;
	memset(&h, 0, sizeof(h));
	h.scaler = p->scaler;
	h.step = p->step;
	/* scaler and step lead the struct: one copy, the flags untouched. A
	 * pageable source is copied out before cudaMemcpyAsync returns. */
	loom_status st = LOOM_CUDA_CHECK(cudaMemcpyAsync(c->ctl, &h, offsetof(loom_cuda_ctl, t),
							 cudaMemcpyHostToDevice, c->stream),
					 p->err, sizeof(p->err));
	if (st == LOOM_OK) {
		c->host_scaler = p->scaler;
		c->host_step = p->step;
	}
	return st;
}

/* A bad label seen on the device, reported as the CPU backend words it;
 * the flags are cleared for the next step. */
static loom_status report_bad_label(loom_program *p, loom_cuda_ctx *c, const loom_cuda_ctl *h)
{
	const loom_node *n = &p->g->nodes[h->ce_node];
	const int32_t *labels = (const int32_t *)loom_value_ptr(p, n->src[1]);
	int32_t lab = -1, clear[2] = { -1, INT32_MAX };
	char lb[96];
	loom_status st;

	st = LOOM_CUDA_CHECK(cudaMemcpyAsync(&lab, labels + h->ce_row, sizeof(lab),
					     cudaMemcpyDeviceToHost, c->stream),
			     p->err, sizeof(p->err));
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(cudaMemcpyAsync(&c->ctl->ce_node, clear, sizeof(clear),
						     cudaMemcpyHostToDevice, c->stream),
				     p->err, sizeof(p->err));
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(cudaStreamSynchronize(c->stream), p->err, sizeof(p->err));
	if (st != LOOM_OK)
		return st;
	return loom_program_fail(p, LOOM_ERR_INVALID, "%s: label %d of row %d is outside [0, %lld)",
				 loom_node_label(p->g, h->ce_node, lb, sizeof(lb)), lab, h->ce_row,
				 (long long)p->g->nodes[n->src[0]].shape.dims[1]);
}

/* The one sync: the data, and with it the control block, which brings the
 * device's scaler, step and error flags back to the host. */
static loom_status cuda_download(loom_program *p, void *dst, const void *src, size_t bytes)
{
	loom_cuda_ctx *c = ctx_of(p);
	loom_cuda_ctl h;
	loom_status st;

	if ((st = push_host_state(p, c)) != LOOM_OK)
		return st;
	if (bytes > 0) {
		st = LOOM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream),
				     p->err, sizeof(p->err));
		if (st != LOOM_OK)
			return st;
	}
	st = LOOM_CUDA_CHECK(cudaMemcpyAsync(&h, c->ctl, sizeof(h), cudaMemcpyDeviceToHost, c->stream),
			     p->err, sizeof(p->err));
	if (st == LOOM_OK)
		st = LOOM_CUDA_CHECK(cudaStreamSynchronize(c->stream), p->err, sizeof(p->err));
	if (st != LOOM_OK)
		return st;
	p->scaler = c->host_scaler = h.scaler;
	p->step = c->host_step = h.step;
	if (p->diagnose && p->first_nonfinite == LOOM_NONE && h.first_nonfinite >= 0)
		p->first_nonfinite = h.first_nonfinite;
	/* As engine/cpu/optim.c: a collapsed scale turns on the per-node watch. */
	if (loom_scaler_collapsed(&p->scaler) && !p->amp_report[0])
		p->diagnose = 1;
	if (h.ce_node >= 0 && h.ce_node < p->g->n)
		return report_bad_label(p, c, &h);
	return LOOM_OK;
}

/* ------------------------------------------------------------ dispatch */

static loom_status run_library(loom_program *p, loom_cuda_ctx *c, loom_value v, void **src,
			       void *out)
{
	const loom_node *n = &p->g->nodes[v];
	const loom_cuda_node_plan *np = &c->plans[v];
	loom_status st;

	for (int i = 0; i < n->nsrc; i++) {
		if (np->stage[i].src < 0)
			continue;
		const loom_node *s = &p->g->nodes[n->src[i]];
		void *dst = p->ws + np->stage[i].ws_off;
		st = loom_cuda_cast(p, c->stream, src[i], s->dtype, dst, n->dtype,
				    loom_shape_numel(&s->shape));
		if (st != LOOM_OK)
			return st;
		src[i] = dst;
	}
	if (np->kind == LOOM_CUDA_PLAN_CONV)
		return loom_cuda_conv_run(p, c, v, np, src, out);
	return loom_cuda_mm_run(p, c, v, np, src, out);
}

static loom_status run_node(loom_program *p, loom_cuda_ctx *c, loom_value v, int train)
{
	const loom_node *n = &p->g->nodes[v];
	const loom_node *x = n->nsrc ? &p->g->nodes[n->src[0]] : NULL;
	cudaStream_t s = c->stream;
	int64_t numel = loom_shape_numel(&n->shape);
	void *src[LOOM_MAX_SRC] = { NULL };
	int dt[LOOM_MAX_SRC] = { 0 };
	void *out = loom_value_ptr(p, v);
	int odt = n->dtype;
	char lb[96];

	for (int i = 0; i < n->nsrc; i++) {
		src[i] = loom_value_ptr(p, n->src[i]);
		dt[i] = p->g->nodes[n->src[i]].dtype;
	}
	switch (n->op) {
	case LOOM_OP_INPUT:
	case LOOM_OP_PARAM:
	case LOOM_OP_BUFFER:
	case LOOM_OP_RESHAPE: /* a view: the memory planner gave it its source's storage */
		return LOOM_OK;
	case LOOM_OP_CAST:
		return loom_cuda_cast(p, s, src[0], dt[0], out, odt, numel);
	case LOOM_OP_CONV2D:
	case LOOM_OP_CONV2D_BWD_DATA:
	case LOOM_OP_CONV2D_BWD_FILTER:
	case LOOM_OP_LINEAR:
	case LOOM_OP_MATMUL:
		return run_library(p, c, v, src, out);
	case LOOM_OP_CHANNEL_SUM: {
		int64_t hw = 1;
		for (int i = 2; i < x->shape.ndim; i++)
			hw *= x->shape.dims[i];
		return loom_cuda_channel_sum(p, s, (int)x->shape.dims[0], (int)x->shape.dims[1], hw,
					     src[0], dt[0], out, odt);
	}
	case LOOM_OP_BATCHNORM2D:
		if (c->plans[v].kind == LOOM_CUDA_PLAN_BN)
			return loom_cuda_bn_run(p, c, v, &c->plans[v], train, src, out);
		return loom_cuda_bn_fwd(p, s, train, (int)x->shape.dims[0], (int)x->shape.dims[1],
					x->shape.dims[2] * x->shape.dims[3], src[0], dt[0], src[1],
					dt[1], src[2], dt[2], src[3], dt[3], src[4], dt[4],
					n->a.bn.momentum, n->a.bn.eps, out, odt);
	case LOOM_OP_BN_BWD_DATA:
		if (c->plans[v].kind == LOOM_CUDA_PLAN_BN)
			return loom_cuda_bn_run(p, c, v, &c->plans[v], train, src, out);
		return loom_cuda_bn_bwd_data(p, s, (int)x->shape.dims[0], (int)x->shape.dims[1],
					     x->shape.dims[2] * x->shape.dims[3], src[0], dt[0],
					     src[1], dt[1], src[2], dt[2], n->a.bn.eps, out, odt);
	case LOOM_OP_BN_BWD_GAMMA:
		return loom_cuda_bn_bwd_gamma(p, s, (int)x->shape.dims[0], (int)x->shape.dims[1],
					      x->shape.dims[2] * x->shape.dims[3], src[0], dt[0],
					      src[1], dt[1], n->a.bn.eps, out, odt);
	case LOOM_OP_RELU:
		return loom_cuda_relu_fwd(p, s, src[0], dt[0], out, odt, numel);
	case LOOM_OP_RELU_BWD:
		return loom_cuda_relu_bwd(p, s, src[0], dt[0], src[1], dt[1], out, odt, numel);
	case LOOM_OP_MAXPOOL2D:
	case LOOM_OP_MAXPOOL2D_BWD: {
		loom_pool_shape ps;
		loom_pool_shape_of(p->g, v, &ps);
		if (n->op == LOOM_OP_MAXPOOL2D)
			return loom_cuda_maxpool_fwd(p, s, ps, src[0], dt[0], out, odt);
		return loom_cuda_maxpool_bwd(p, s, ps, src[0], dt[0], src[1], dt[1], out, odt);
	}
	case LOOM_OP_GLOBAL_AVGPOOL: /* x [N, C, H, W] -> [N, C] */
		return loom_cuda_global_avgpool_fwd(p, s, src[0], dt[0], out, odt, numel,
						    x->shape.dims[2] * x->shape.dims[3]);
	case LOOM_OP_GLOBAL_AVGPOOL_BWD: /* dy [N, C] -> dx [N, C, H, W] */
		return loom_cuda_global_avgpool_bwd(p, s, src[0], dt[0], out, odt,
						    loom_shape_numel(&x->shape),
						    n->shape.dims[2] * n->shape.dims[3]);
	case LOOM_OP_ADD:
		return loom_cuda_add(p, s, src[0], dt[0], src[1], dt[1], out, odt, numel);
	case LOOM_OP_SUM:
		return loom_cuda_sum(p, s, src[0], dt[0], loom_shape_numel(&x->shape), out, odt);
	case LOOM_OP_BROADCAST:
		return loom_cuda_broadcast_scalar(p, s, src[0], dt[0], n->a.bc.scale, out, odt, numel);
	case LOOM_OP_SOFTMAX_CE:
		return loom_cuda_softmax_ce_fwd(p, s, (int)x->shape.dims[0], (int)x->shape.dims[1],
						src[0], dt[0], (const int32_t *)src[1], out, odt,
						(double *)p->ws, v, c->ctl);
	case LOOM_OP_SOFTMAX_CE_BWD:
		return loom_cuda_softmax_ce_bwd(p, s, (int)x->shape.dims[0], (int)x->shape.dims[1],
						src[0], dt[0], (const int32_t *)src[1], src[2], dt[2],
						out, odt);
	case LOOM_OP_GRAD_SEED:
		return loom_cuda_grad_seed(p, s, c->ctl, out, odt);
	default:
		return loom_program_fail(p, LOOM_ERR_UNSUPPORTED, "cuda: no kernel for %s",
					 loom_node_label(p->g, v, lb, sizeof(lb)));
	}
}

/* Test hook: NaN into every value nodes [first, last) write, and into ws. */
static loom_status poison_outputs(loom_program *p, loom_cuda_ctx *c, int first, int last)
{
	loom_status st = LOOM_CUDA_CHECK(cudaMemsetAsync(p->ws, 0xff, p->ws_bytes, c->stream),
					 p->err, sizeof(p->err));
	for (int v = first; v < last && st == LOOM_OK; v++) {
		const loom_node *n = &p->g->nodes[v];
		if (is_leaf(n) || n->op == LOOM_OP_RESHAPE || p->mp.root[v] != v)
			continue;
		st = LOOM_CUDA_CHECK(cudaMemsetAsync(loom_value_ptr(p, v), 0xff,
						     loom_value_bytes(p, v), c->stream),
				     p->err, sizeof(p->err));
	}
	return st;
}

static loom_status cuda_run_nodes(loom_program *p, int first, int last, int train)
{
	loom_cuda_ctx *c = ctx_of(p);
	loom_status st;

	if ((st = push_host_state(p, c)) != LOOM_OK)
		return st;
	if (c->poison && (st = poison_outputs(p, c, first, last)) != LOOM_OK)
		return st;
	for (int v = first; v < last; v++) {
		if (loom_made_earlier(p, v))
			continue; /* made with its maker */
		/* The node, then its siblings (graph/fuse.c): those its library
		 * call wrote already, the others by their own kernels now. */
		for (loom_value w = v; w != LOOM_NONE;
		     w = w == v ? loom_sibling_first(p, v) : loom_sibling_next(p, w)) {
			if (w == v || !loom_cuda_plan_makes(&c->plans[v], w))
				if ((st = run_node(p, c, w, train)) != LOOM_OK)
					return st;
			if (p->diagnose && p->first_nonfinite == LOOM_NONE) {
				const loom_node *n = &p->g->nodes[w];
				st = loom_cuda_mark_nonfinite(p, c->stream, loom_value_ptr(p, w),
							      n->dtype, loom_shape_numel(&n->shape),
							      w, c->ctl);
				if (st != LOOM_OK)
					return st;
			}
		}
	}
	/* While diagnosing (a collapsed scale, rare), wait for the verdict so
	 * that loom_run reports it after this run, as on the CPU, rather than
	 * one run later when the loss download brings it back. */
	if (p->diagnose && p->first_nonfinite == LOOM_NONE) {
		int32_t first = -1;
		st = LOOM_CUDA_CHECK(cudaMemcpyAsync(&first, &c->ctl->first_nonfinite, sizeof(first),
						     cudaMemcpyDeviceToHost, c->stream),
				     p->err, sizeof(p->err));
		if (st == LOOM_OK)
			st = LOOM_CUDA_CHECK(cudaStreamSynchronize(c->stream), p->err, sizeof(p->err));
		if (st != LOOM_OK)
			return st;
		if (first >= 0)
			p->first_nonfinite = first;
	}
	return LOOM_OK;
}

static loom_status cuda_optim_step(loom_program *p)
{
	loom_cuda_ctx *c = ctx_of(p);
	loom_status st = push_host_state(p, c);
	return st != LOOM_OK ? st : loom_cuda_optim_launch(p, c->stream, c);
}

static const loom_backend loom_cuda_backend = {
	/* .name = */ "cuda",
	/* .prepare = */ cuda_prepare,
	/* .release = */ cuda_release,
	/* .run_nodes = */ cuda_run_nodes,
	/* .optim_step = */ cuda_optim_step,
	/* .upload = */ cuda_upload,
	/* .download = */ cuda_download,
	/* .workspace = */ cuda_workspace,
	/* .fuses_relu_pool = */ 1,
	/* .fuses_siblings = */ 1,
	/* .fuses_linear_relu = */ 1,
};

extern "C" const loom_backend *loom_cuda_backend_get(void)
{
	return &loom_cuda_backend;
}
