/*
 * engine/cpu/matmul_dnnl.c — matrix products as oneDNN's matmul primitive
 * (its documented API, in place of the undeclared dnnl_gemm_bf16bf16f32),
 * made once per shape. Each run wraps the caller's buffers in memory
 * objects of its own and brings its own scratchpad, so one primitive serves
 * several threads at once (conv_bf16.c runs one product per image and
 * thread).
 */
#include <stdlib.h>

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include "engine/cpu/dnnl_engine.h"
#include "engine/cpu/matmul_dnnl.h"

struct loom_cpu_dnnl_matmul {
	dnnl_primitive_desc_t pd;
	dnnl_primitive_t prim;
	dnnl_memory_desc_t a_md, b_md, c_md, bias_md, scratch_md;
	int bias;
	size_t scratch_bytes;
};

/* A row-major [rows, cols] operand with leading dimension ld, or its
 * transpose stored that way (t): the strides say which. */
static int md_mat(dnnl_memory_desc_t *md, int t, int rows, int cols, int ld,
		  dnnl_data_type_t dt)
{
	const dnnl_dims_t dims = { rows, cols };
	const dnnl_dims_t strides = { t ? 1 : ld, t ? ld : 1 };
	return dnnl_memory_desc_init_by_strides(md, 2, dims, dt, strides) == dnnl_success ? 0 : -1;
}

void loom_cpu_dnnl_matmul_free(loom_cpu_dnnl_matmul *mm)
{
	if (!mm)
		return;
	loom_cpu_dnnl_release(NULL, 0, NULL, 1, &mm->prim, 1, &mm->pd);
	free(mm);
}

loom_cpu_dnnl_matmul *loom_cpu_dnnl_matmul_new(int ta, int tb, int m, int n, int k, int lda,
					       int ldb, int ldc, float alpha, int bf16, int bias,
					       int accumulate, int one_thread)
{
	if (m <= 0 || n <= 0 || k <= 0)
		return NULL;
	loom_cpu_dnnl_matmul *mm = loom_cpu_dnnl_calloc(sizeof(*mm));
	dnnl_primitive_attr_t attr = NULL;
	dnnl_post_ops_t po = NULL;
	dnnl_matmul_desc_t d;
	int prev = 0;
	if (!mm)
		return NULL;
	const dnnl_data_type_t in_t = bf16 ? dnnl_bf16 : dnnl_f32;
	const dnnl_dims_t bias_dims = { 1, n };
	if (md_mat(&mm->a_md, ta, m, k, lda, in_t) || md_mat(&mm->b_md, tb, k, n, ldb, in_t) ||
	    md_mat(&mm->c_md, 0, m, n, ldc, dnnl_f32) ||
	    dnnl_memory_desc_init_by_tag(&mm->bias_md, 2, bias_dims, dnnl_f32, dnnl_ab) !=
		    dnnl_success)
		goto fail;
	mm->bias = bias;
	/* The scratchpad is the caller's (run): no allocation shared between
	 * concurrent runs. */
	if (dnnl_primitive_attr_create(&attr) != dnnl_success ||
	    dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) != dnnl_success)
		goto fail;
	if (alpha != 1.0f && dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha) != dnnl_success)
		goto fail;
	if (accumulate) {
		if (dnnl_post_ops_create(&po) != dnnl_success ||
		    dnnl_post_ops_append_sum(po, 1.0f) != dnnl_success ||
		    dnnl_primitive_attr_set_post_ops(attr, po) != dnnl_success)
			goto fail;
	}
	if (dnnl_matmul_desc_init(&d, &mm->a_md, &mm->b_md, bias ? &mm->bias_md : NULL,
				  &mm->c_md) != dnnl_success)
		goto fail;
	/* oneDNN sizes its split by the threads it sees when the primitive is
	 * made. */
	if (one_thread) {
		prev = omp_get_max_threads();
		omp_set_num_threads(1);
	}
	dnnl_status_t st =
		dnnl_primitive_desc_create(&mm->pd, &d, attr, loom_cpu_dnnl_engine(), NULL);
	if (st == dnnl_success)
		st = dnnl_primitive_create(&mm->prim, mm->pd);
	if (one_thread)
		omp_set_num_threads(prev);
	if (st != dnnl_success)
		goto fail;
	const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(mm->pd, dnnl_query_scratchpad_md, 0);
	if (sp) {
		mm->scratch_md = *sp;
		mm->scratch_bytes = dnnl_memory_desc_get_size(sp);
	}
	if (po)
		dnnl_post_ops_destroy(po);
	dnnl_primitive_attr_destroy(attr);
	return mm;
fail:
	if (po)
		dnnl_post_ops_destroy(po);
	if (attr)
		dnnl_primitive_attr_destroy(attr);
	loom_cpu_dnnl_matmul_free(mm);
	return NULL;
}

/* Each thread's scratchpad, grown to the largest a run on it asked for;
 * it lives as long as the thread. */
static __thread void *scratch_buf;
static __thread size_t scratch_size;

static void *scratch_get(size_t bytes)
{
	if (bytes <= scratch_size)
		return scratch_buf;
	void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
	if (!p)
		return NULL;
	free(scratch_buf);
	scratch_buf = p;
	scratch_size = bytes;
	return p;
}

int loom_cpu_dnnl_matmul_run(const loom_cpu_dnnl_matmul *mm, const void *a, const void *b,
			     const float *bias, float *c)
{
	dnnl_memory_t mem[5] = { NULL };
	dnnl_exec_arg_t args[5];
	dnnl_stream_t stream = NULL;
	int nargs = 0, rc = -1;
	void *sp = NULL;
	if (mm->scratch_bytes && !(sp = scratch_get(mm->scratch_bytes)))
		return -1;
	struct {
		int arg;
		const dnnl_memory_desc_t *md;
		const void *ptr;
	} want[5] = {
		{ DNNL_ARG_SRC, &mm->a_md, a },
		{ DNNL_ARG_WEIGHTS, &mm->b_md, b },
		{ DNNL_ARG_DST, &mm->c_md, c },
		{ DNNL_ARG_BIAS, &mm->bias_md, mm->bias ? bias : NULL },
		{ DNNL_ARG_SCRATCHPAD, &mm->scratch_md, sp },
	};
	for (int i = 0; i < 5; i++) {
		if (!want[i].ptr)
			continue;
		if (dnnl_memory_create(&mem[nargs], want[i].md, loom_cpu_dnnl_engine(),
				       (void *)want[i].ptr) != dnnl_success)
			goto out;
		args[nargs].arg = want[i].arg;
		args[nargs].memory = mem[nargs];
		nargs++;
	}
	if (dnnl_stream_create(&stream, loom_cpu_dnnl_engine(), dnnl_stream_default_flags) !=
	    dnnl_success)
		goto out;
	if (dnnl_primitive_execute(mm->prim, stream, nargs, args) == dnnl_success &&
	    dnnl_stream_wait(stream) == dnnl_success)
		rc = 0;
out:
	loom_cpu_dnnl_release(stream, nargs, mem, 0, NULL, 0, NULL);
	return rc;
}

const char *loom_cpu_dnnl_matmul_impl(const loom_cpu_dnnl_matmul *mm)
{
	const char *s = NULL;
	if (dnnl_primitive_desc_query(mm->pd, dnnl_query_impl_info_str, 0, &s) != dnnl_success || !s)
		return "?";
	return s;
}
