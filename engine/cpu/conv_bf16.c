/*
 * engine/cpu/conv_bf16.c — convolution and matrix products on bf16 sources
 * with fp32 accumulation, for CPUs that multiply bf16 natively (avx512_bf16:
 * oneDNN's bf16 GEMM). Same structure as conv_impl.h: one im2col (here in
 * bf16, half the bytes) and one GEMM per image, threads split the batch.
 * The results are fp32; the backend rounds them if the node stores bf16.
 * Compiled in the x86-64-v3 copy only (BUILD); dispatch.c calls it after
 * checking the CPU has avx512_bf16.
 */
#include <string.h>

#include "engine/cpu/cpu_internal.h"
#include "engine/cpu/kernels.h"

#define T uint16_t
#define SFX bf16
#include "engine/cpu/im2col_impl.h"
#undef T
#undef SFX

#define T float
#define SFX f32
#include "engine/cpu/im2col_impl.h"
#undef T
#undef SFX

/* Rows of A and B must share one type, so a 1x1 conv's bf16 input can be
 * used in place; the others go through a bf16 im2col. */
int loom_cpu_conv2d_fwd_bf16_native(const loom_conv_shape *s, const uint16_t *x, const uint16_t *w,
			     const float *b, float *y, void *ws)
{
	const loom_conv_gemm g = loom_cpu_conv_gemm(s, 4);
	const int tposed = loom_cpu_conv_fwd_transposed(s);
	const int nt = loom_cpu_slot_threads(s->n);
	int fail = 0;

#pragma omp parallel num_threads(nt) reduction(| : fail)
	{
		char *base = (char *)ws + g.slot * omp_get_thread_num();
		uint16_t *col = (uint16_t *)base;
		float *yt = (float *)(base + (size_t)g.k * g.p * 4); /* as in the f32 slot */
		uint16_t *pp = g.direct ? NULL : conv_padded_plane_bf16(s, base, g.slot);
#pragma omp for schedule(static)
		for (int n = 0; n < s->n; n++) {
			const uint16_t *xn = x + n * g.in_img, *cn = col;
			float *yn = y + n * g.out_img;

			if (g.direct)
				cn = xn;
			else if (pp)
				im2col_s1_bf16(s, xn, col, pp);
			else
				im2col_bf16(s, xn, col);
			if (tposed) {
				fail |= loom_cpu_gemm_bf16('T', 'T', g.p, s->c_out, g.k, 1, cn, g.p,
							   w, g.k, 0, yt, s->c_out);
				conv_untranspose_f32(s->c_out, g.p, yt, b, yn);
				continue;
			}
			fail |= loom_cpu_gemm_bf16('N', 'N', s->c_out, g.p, g.k, 1, w, g.k, cn, g.p,
						   0, yn, g.p);
			conv_add_bias_f32(s->c_out, g.p, b, yn);
		}
	}
	return fail ? -1 : 0;
}

int loom_cpu_conv2d_bwd_data_bf16_native(const loom_conv_shape *s, const uint16_t *dy,
				  const uint16_t *w, float *dx, void *ws)
{
	const loom_conv_gemm g = loom_cpu_conv_gemm(s, 4);
	const int nt = loom_cpu_slot_threads(s->n);
	int fail = 0;

#pragma omp parallel num_threads(nt) reduction(| : fail)
	{
		float *dcol = (float *)((char *)ws + g.slot * omp_get_thread_num());
		float *pp = g.direct ? NULL : conv_padded_plane_f32(s, dcol, g.slot);
#pragma omp for schedule(static)
		for (int n = 0; n < s->n; n++) {
			float *dxn = dx + n * g.in_img;

			/* dcol[K, P] = w^T[K, c_out] dy_n[c_out, P], in fp32 */
			fail |= loom_cpu_gemm_bf16('T', 'N', g.k, g.p, s->c_out, 1, w, g.k,
						   dy + n * g.out_img, g.p, 0,
						   g.direct ? dxn : dcol, g.p);
			if (pp)
				col2im_s1_f32(s, dcol, dxn, pp);
			else if (!g.direct)
				col2im_f32(s, dcol, dxn);
		}
	}
	return fail ? -1 : 0;
}

int loom_cpu_conv2d_bwd_filter_bf16_native(const loom_conv_shape *s, const uint16_t *dy,
				    const uint16_t *x, float *dw, void *ws)
{
	const loom_conv_gemm g = loom_cpu_conv_gemm(s, 4);
	const int64_t nw = (int64_t)s->c_out * g.k;
	const int nt = loom_cpu_slot_threads(s->n);
	int fail = 0, team = 1;

	/* Per-thread partial dw^T in fp32, summed in a fixed order after. */
#pragma omp parallel num_threads(nt) reduction(| : fail)
	{
		char *base = (char *)ws + g.slot * omp_get_thread_num();
		uint16_t *col = (uint16_t *)base;
		float *part = (float *)(base + (size_t)g.k * g.p * 4); /* [K, c_out] */

		if (omp_get_thread_num() == 0)
			team = omp_get_num_threads();
		uint16_t *pp = g.direct ? NULL : conv_padded_plane_bf16(s, base, g.slot);
		memset(part, 0, sizeof(float) * nw);
#pragma omp for schedule(static)
		for (int n = 0; n < s->n; n++) {
			const uint16_t *xn = x + n * g.in_img, *cn = g.direct ? xn : col;

			if (pp)
				im2col_s1_bf16(s, xn, col, pp);
			else if (!g.direct)
				im2col_bf16(s, xn, col);
			fail |= loom_cpu_gemm_bf16('N', 'T', g.k, s->c_out, g.p, 1, cn, g.p,
						   dy + n * g.out_img, g.p, 1, part, s->c_out);
		}
	}
	if (fail)
		return -1;
	conv_dw_reduce_f32(s->c_out, g.k, (const char *)ws + (size_t)g.k * g.p * 4, g.slot, team,
			   dw);
	return 0;
}
