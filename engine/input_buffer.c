/*
 * engine/input_buffer.c — an input's next batch written where the step
 * reads it (loom_input_buffer, loom_input_commit, loom_input_release): the
 * backend's pinned slot where it stages the input (the CUDA backend under
 * LOOM_CUDA_UPLOAD=graph: no host copy between the loader and the DMA),
 * else a buffer the program owns, uploaded at commit as loom_set_input's
 * copy would be, so one caller's code works on every backend.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/pass.h"
#include "engine/program_internal.h"

/* One input's hand-out (p->inbuf[v]). */
struct loom_input_buf {
	int out;       /* a buffer is handed out, not yet committed or released */
	int slot;      /* it is the backend's slot, not staging */
	size_t count;  /* elements handed out */
	/* The program's own buffers (the fallback), made once, handed out in
	 * turn so that a committed batch stays readable by the caller until
	 * the hand-out after next, as a backend's two slots do. */
	void *staging[2];
	size_t staging_bytes[2];
	int next;      /* the one handed out next */
};

/* The input called name, with its state (made at the first call); NULL
 * after recording the failure (what names the call). */
static loom_input_buf *input_state(loom_program *p, const char *what, const char *name,
				   loom_value *vp)
{
	if (!name) {
		loom_program_fail(p, LOOM_ERR_INVALID, "%s: name is NULL", what);
		return NULL;
	}
	loom_value v = LOOM_NONE;
	for (int i = 0; i < p->plan.n_fwd && v == LOOM_NONE; i++)
		if (p->plan.g->nodes[i].op == LOOM_OP_INPUT && !strcmp(p->plan.g->nodes[i].name, name))
			v = i;
	if (v == LOOM_NONE) {
		loom_program_fail(p, LOOM_ERR_NOT_FOUND, "%s: no input called '%s'", what, name);
		return NULL;
	}
	if (!p->inbuf && !(p->inbuf = calloc((size_t)p->plan.n_fwd, sizeof(*p->inbuf)))) {
		loom_program_fail(p, LOOM_ERR_NOMEM, "%s '%s': out of memory", what, name);
		return NULL;
	}
	*vp = v;
	return &p->inbuf[v];
}

int loom_input_buffer_out(const loom_program *p, loom_value v)
{
	return p->inbuf && p->inbuf[v].out;
}

void loom_input_buffers_free(loom_program *p)
{
	for (int v = 0; p->inbuf && v < p->plan.n_fwd; v++)
		for (int k = 0; k < 2; k++)
			free(p->inbuf[v].staging[k]);
	free(p->inbuf);
	p->inbuf = NULL;
}

/* Whether the backend's slots can take v's batch: a plan without a
 * strategy of its own over inputs (a pipeline's micro-batches), an input
 * this rank holds, a backend with slots, count the whole input. */
static int slots_can(const loom_program *p, loom_value v, size_t count)
{
	return p->be->input && !LOOM_PASS_WITH(p, set_input) && loom_plan_holds(&p->plan, v) &&
	       (int64_t)count == loom_shape_numel(&p->plan.g->nodes[v].shape);
}

loom_status loom_input_buffer(loom_program *p, const char *name, loom_dtype dt, size_t count,
			      void **ptr)
{
	if (!loom_program_usable(p))
		return LOOM_ERR_INVALID;
	if (ptr)
		*ptr = NULL;
	loom_value v;
	loom_input_buf *b = input_state(p, "input_buffer", name, &v);
	if (!b)
		return p->err.st;
	const loom_node *nd = &p->plan.g->nodes[v];
	char sb[96];
	if (!ptr)
		return loom_program_fail(p, LOOM_ERR_INVALID, "input_buffer '%s': ptr is NULL", name);
	if (b->out)
		return loom_program_fail(p, LOOM_ERR_STATE,
					 "input_buffer '%s': a buffer is handed out already; commit or "
					 "release it first",
					 name);
	if (dt != nd->dtype)
		return loom_program_fail(p, LOOM_ERR_DTYPE,
					 "input_buffer '%s': asked for %s, the input is %s", name,
					 loom_dtype_name(dt), loom_dtype_name(nd->dtype));
	/* A strategy's own inputs (a pipeline: M micro-batches at once) check
	 * count at commit; the plain plan's here. */
	if (!LOOM_PASS_WITH(p, set_input) && (int64_t)count != loom_shape_numel(&nd->shape))
		return loom_program_fail(p, LOOM_ERR_SHAPE,
					 "input_buffer '%s': %zu elements asked, shape %s holds %lld",
					 name, count, loom_shape_str(&nd->shape, sb, sizeof(sb)),
					 (long long)loom_shape_numel(&nd->shape));
	if (count == 0)
		return loom_program_fail(p, LOOM_ERR_SHAPE, "input_buffer '%s': 0 elements", name);
	size_t bytes = count * loom_dtype_size(dt);
	if (slots_can(p, v, count)) {
		loom_status st =
			p->be->input->input_slot(p->be_ctx, loom_value_ptr(p, v), bytes, ptr);
		if (st == LOOM_OK) {
			b->out = 1;
			b->slot = 1;
			b->count = count;
			return LOOM_OK;
		}
		if (st != LOOM_ERR_UNSUPPORTED)
			return loom_program_backend_fail(p, st);
	}
	int k = b->next;
	if (b->staging_bytes[k] < bytes) {
		void *s = realloc(b->staging[k], bytes);
		if (!s)
			return loom_program_fail(p, LOOM_ERR_NOMEM,
						 "input_buffer '%s': out of memory for %zu bytes", name,
						 bytes);
		b->staging[k] = s;
		b->staging_bytes[k] = bytes;
	}
	b->out = 1;
	b->slot = 0;
	b->count = count;
	*ptr = b->staging[k];
	return LOOM_OK;
}

/* The end of a hand-out: commit (the buffer's contents become name's
 * input: the backend's pinned slot, or the staging buffer set as the
 * input) or release (dropped; nothing handed out is no error). */
static loom_status input_end(loom_program *p, const char *name, int commit)
{
	const char *what = commit ? "input_commit" : "input_release";
	if (!loom_program_usable(p))
		return LOOM_ERR_INVALID;
	loom_value v;
	loom_input_buf *b = input_state(p, what, name, &v);
	if (!b)
		return p->err.st;
	if (!b->out && !commit)
		return LOOM_OK;
	if (!b->out)
		return loom_program_fail(p, LOOM_ERR_STATE,
					 "input_commit '%s': no buffer handed out (loom_input_buffer "
					 "first)",
					 name);
	b->out = 0;
	loom_dtype dt = p->plan.g->nodes[v].dtype;
	if (b->slot) {
		size_t bytes = b->count * loom_dtype_size(dt);
		loom_status (*end)(void *ctx, void *dst, size_t bytes) =
			commit ? p->be->input->input_commit : p->be->input->input_release;
		loom_status st = end(p->be_ctx, loom_value_ptr(p, v), bytes);
		return st == LOOM_OK ? LOOM_OK : loom_program_backend_fail(p, st);
	}
	if (!commit)
		return LOOM_OK;
	int k = b->next;
	b->next ^= 1;
	return loom_set_input(p, name, b->staging[k], dt, b->count);
}

loom_status loom_input_commit(loom_program *p, const char *name)
{
	return input_end(p, name, 1);
}

loom_status loom_input_release(loom_program *p, const char *name)
{
	return input_end(p, name, 0);
}
