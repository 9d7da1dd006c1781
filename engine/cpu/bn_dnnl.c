/*
 * engine/cpu/bn_dnnl.c — batch norm on nChw8c as oneDNN's batch
 * normalization primitives (bn_dnnl.h), one forward and one backward per
 * node, run on oneDNN's own threads.
 */
#include <stdlib.h>

#include <oneapi/dnnl/dnnl.h>

#include "engine/cpu/bn_dnnl.h"
#include "engine/cpu/dnnl_engine.h"

enum { M_X, M_Y, M_DY, M_DX, M_GAMMA, M_BETA, M_MEAN, M_VAR, M_DGAMMA, M_DBETA, M_COUNT };

struct loom_cpu_dnnl_bn {
	dnnl_stream_t stream;
	dnnl_primitive_desc_t fpd, bpd;
	dnnl_primitive_t fwd, bwd;
	dnnl_memory_t m[M_COUNT]; /* handles set at each run */
};

void loom_cpu_dnnl_bn_free(loom_cpu_dnnl_bn *b)
{
	if (!b)
		return;
	loom_cpu_dnnl_release(b->stream, M_COUNT, b->m, 2, (dnnl_primitive_t[]){ b->fwd, b->bwd }, 2,
			      (dnnl_primitive_desc_t[]){ b->fpd, b->bpd });
	free(b);
}

loom_cpu_dnnl_bn *loom_cpu_dnnl_bn_new(int n, int c, int h, int w, double eps)
{
	if (c % 8)
		return NULL;
	loom_cpu_dnnl_bn *b = loom_cpu_dnnl_calloc(sizeof(*b));
	if (!b)
		return NULL;
	const dnnl_dims_t dd = { n, c, h, w }, vd = { c };
	const unsigned flags = dnnl_use_scale | dnnl_use_shift;
	dnnl_memory_desc_t dmd, vmd;
	dnnl_batch_normalization_desc_t fd, bd;
	if (dnnl_memory_desc_init_by_tag(&dmd, 4, dd, dnnl_f32, dnnl_nChw8c) != dnnl_success ||
	    dnnl_memory_desc_init_by_tag(&vmd, 1, vd, dnnl_f32, dnnl_a) != dnnl_success ||
	    dnnl_stream_create(&b->stream, loom_cpu_dnnl_engine(), dnnl_stream_default_flags) !=
		    dnnl_success ||
	    dnnl_batch_normalization_forward_desc_init(&fd, dnnl_forward_training, &dmd, (float)eps,
						       flags) != dnnl_success ||
	    dnnl_primitive_desc_create(&b->fpd, &fd, NULL, loom_cpu_dnnl_engine(), NULL) !=
		    dnnl_success ||
	    dnnl_batch_normalization_backward_desc_init(&bd, dnnl_backward, &dmd, &dmd, (float)eps,
							flags) != dnnl_success ||
	    dnnl_primitive_desc_create(&b->bpd, &bd, NULL, loom_cpu_dnnl_engine(), b->fpd) !=
		    dnnl_success ||
	    dnnl_primitive_create(&b->fwd, b->fpd) != dnnl_success ||
	    dnnl_primitive_create(&b->bwd, b->bpd) != dnnl_success)
		goto fail;
	/* Neither needs a workspace: no fused relu (loom's runs after it). */
	for (int i = 0; i < M_COUNT; i++)
		if (dnnl_memory_create(&b->m[i], i <= M_DX ? &dmd : &vmd, loom_cpu_dnnl_engine(),
				       DNNL_MEMORY_NONE) != dnnl_success)
			goto fail;
	return b;
fail:
	loom_cpu_dnnl_bn_free(b);
	return NULL;
}

static int run(loom_cpu_dnnl_bn *b, dnnl_primitive_t p, const void *const ptr[M_COUNT],
	       const int *args, const int *which, int na)
{
	dnnl_exec_arg_t a[M_COUNT];
	for (int i = 0; i < na; i++) {
		if (dnnl_memory_set_data_handle(b->m[which[i]], (void *)ptr[which[i]]) !=
		    dnnl_success)
			return -1;
		a[i] = (dnnl_exec_arg_t){ args[i], b->m[which[i]] };
	}
	if (dnnl_primitive_execute(p, b->stream, na, a) != dnnl_success)
		return -1;
	return dnnl_stream_wait(b->stream) == dnnl_success ? 0 : -1;
}

int loom_cpu_dnnl_bn_fwd(loom_cpu_dnnl_bn *b, const float *x, const float *gamma,
			 const float *beta, float *y, float *mean, float *var)
{
	const void *ptr[M_COUNT] = { [M_X] = x, [M_Y] = y, [M_GAMMA] = gamma, [M_BETA] = beta,
				     [M_MEAN] = mean, [M_VAR] = var };
	static const int args[] = { DNNL_ARG_SRC, DNNL_ARG_DST, DNNL_ARG_SCALE, DNNL_ARG_SHIFT,
				    DNNL_ARG_MEAN, DNNL_ARG_VARIANCE };
	static const int which[] = { M_X, M_Y, M_GAMMA, M_BETA, M_MEAN, M_VAR };
	return run(b, b->fwd, ptr, args, which, 6);
}

int loom_cpu_dnnl_bn_bwd(loom_cpu_dnnl_bn *b, const float *x, const float *gamma,
			 const float *dy, const float *mean, const float *var, float *dx,
			 float *dgamma, float *dbeta)
{
	/* oneDNN asks for the shift too, which the backward does not read
	 * (the gradients do not depend on beta): the mean stands in. */
	const void *ptr[M_COUNT] = { [M_X] = x, [M_DY] = dy, [M_DX] = dx, [M_GAMMA] = gamma,
				     [M_BETA] = mean, [M_MEAN] = mean, [M_VAR] = var,
				     [M_DGAMMA] = dgamma, [M_DBETA] = dbeta };
	static const int args[] = { DNNL_ARG_SRC,	  DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_SRC,
				    DNNL_ARG_SCALE,	  DNNL_ARG_SHIFT,    DNNL_ARG_MEAN,
				    DNNL_ARG_VARIANCE,	  DNNL_ARG_DIFF_SCALE, DNNL_ARG_DIFF_SHIFT };
	static const int which[] = { M_X,    M_DY,  M_DX,	M_GAMMA, M_BETA,
				     M_MEAN, M_VAR, M_DGAMMA, M_DBETA };
	return run(b, b->bwd, ptr, args, which, 9);
}

const char *loom_cpu_dnnl_bn_impl(const loom_cpu_dnnl_bn *b)
{
	const char *s = NULL;
	if (dnnl_primitive_desc_query(b->fpd, dnnl_query_impl_info_str, 0, &s) != dnnl_success)
		return "?";
	return s;
}
