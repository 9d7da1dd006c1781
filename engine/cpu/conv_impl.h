/*
 * engine/cpu/conv_impl.h — 2-D convolution as im2col + GEMM, written once for
 * T/SFX/CBLAS_GEMM and included by conv.c for f32 and f64. Not a standalone
 * header: it has no include guard on purpose.
 *
 * Each image is its own GEMM: the im2col buffer of one image (K x P, 313 KB
 * for the 16->32 5x5 layer at 14x14) stays in the running core's L2 and is
 * consumed there, where one GEMM over the whole batch would stream a 31 MB
 * buffer through memory. loom's team (team.c) splits the batch; each BLAS
 * call inside runs single-threaded. Some GEMMs are run transposed (output [P, c_out] or
 * [K, c_out]) because OpenBLAS 0.3.21 is about twice as fast on those shapes.
 */

#include "engine/cpu/im2col_impl.h"

/* A conv kernel's arguments, for its loop over images on loom's team: thread
 * t uses scratch slot t and sums filter gradients into its own part. */
typedef struct LOOM_CPU_FN(conv_args) {
	const loom_conv_shape *s;
	const T *x, *w, *b, *dy;
	T *y;
	void *ws;
	int team; /* the threads the filter gradient ran on */
} LOOM_CPU_FN(conv_args);

static void LOOM_CPU_FN(conv_fwd_part)(void *arg, int t, int nt)
{
	const LOOM_CPU_FN(conv_args) *a = arg;
	const loom_conv_shape *s = a->s;
	const loom_conv_gemm g = loom_cpu_conv_gemm(s, sizeof(T));
	const int tposed = loom_cpu_conv_fwd_transposed(s);
	const T *x = a->x, *w = a->w, *b = a->b;
	T *y = a->y;
	T *slot_base = (T *)((char *)a->ws + g.slot * t);
	T *yt = slot_base + (int64_t)g.k * g.p;
	T *pp = g.direct ? NULL : LOOM_CPU_FN(conv_padded_plane)(s, slot_base, g.slot);
	int64_t lo, hi;
	loom_cpu_team_block(s->n, t, nt, &lo, &hi);
	for (int n = (int)lo; n < (int)hi; n++) {
		const T *xn = x + n * g.in_img;
		T *yn = y + n * g.out_img;
		T *col = slot_base;

		if (g.direct)
			col = (T *)xn;
		else if (pp)
			LOOM_CPU_FN(im2col_s1)(s, xn, col, pp);
		else
			LOOM_CPU_FN(im2col)(s, xn, col);
		if (tposed) {
			/* yt[P, c_out] = col[K, P]^T w[c_out, K]^T */
			CBLAS_GEMM(CblasRowMajor, CblasTrans, CblasTrans, g.p, s->c_out, g.k, 1,
				   col, g.p, w, g.k, 0, yt, s->c_out);
			LOOM_CPU_FN(conv_untranspose)(s->c_out, g.p, yt, b, yn);
			continue;
		}
		CBLAS_GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, s->c_out, g.p, g.k, 1, w, g.k,
			   col, g.p, 0, yn, g.p);
		LOOM_CPU_FN(conv_add_bias)(s->c_out, g.p, b, yn);
	}
}

void LOOM_CPU_FN(loom_cpu_conv2d_fwd)(const loom_conv_shape *s, const T *x,
				      const T *w, const T *b, T *y, void *ws)
{
	LOOM_CPU_FN(conv_args) a = { .s = s, .x = x, .w = w, .b = b, .y = y, .ws = ws };
	int blas_prev = loom_cpu_blas_serial_begin();
	loom_cpu_team_run(loom_cpu_slot_threads(s->n), LOOM_CPU_FN(conv_fwd_part), &a);
	loom_cpu_blas_serial_end(blas_prev);
}

static void LOOM_CPU_FN(conv_bwd_data_part)(void *arg, int t, int nt)
{
	const LOOM_CPU_FN(conv_args) *a = arg;
	const loom_conv_shape *s = a->s;
	const loom_conv_gemm g = loom_cpu_conv_gemm(s, sizeof(T));
	T *dcol = (T *)((char *)a->ws + g.slot * t);
	T *pp = g.direct ? NULL : LOOM_CPU_FN(conv_padded_plane)(s, dcol, g.slot);
	int64_t lo, hi;
	loom_cpu_team_block(s->n, t, nt, &lo, &hi);
	for (int n = (int)lo; n < (int)hi; n++) {
		T *dxn = a->y + n * g.in_img;

		/* dcol[K, P] = w^T[K, c_out] dy_n[c_out, P] */
		CBLAS_GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, g.k, g.p, s->c_out, 1, a->w,
			   g.k, a->dy + n * g.out_img, g.p, 0, g.direct ? dxn : dcol, g.p);
		if (pp)
			LOOM_CPU_FN(col2im_s1)(s, dcol, dxn, pp);
		else if (!g.direct)
			LOOM_CPU_FN(col2im)(s, dcol, dxn);
	}
}

void LOOM_CPU_FN(loom_cpu_conv2d_bwd_data)(const loom_conv_shape *s, const T *dy,
					   const T *w, T *dx, void *ws)
{
	LOOM_CPU_FN(conv_args) a = { .s = s, .dy = dy, .w = w, .y = dx, .ws = ws };
	int blas_prev = loom_cpu_blas_serial_begin();
	loom_cpu_team_run(loom_cpu_slot_threads(s->n), LOOM_CPU_FN(conv_bwd_data_part), &a);
	loom_cpu_blas_serial_end(blas_prev);
}

/* Each thread sums its images into a private dw after its im2col buffer;
 * the caller then adds the partial sums in a fixed order (deterministic). */
static void LOOM_CPU_FN(conv_bwd_filter_part)(void *arg, int t, int nt)
{
	LOOM_CPU_FN(conv_args) *a = arg;
	const loom_conv_shape *s = a->s;
	const loom_conv_gemm g = loom_cpu_conv_gemm(s, sizeof(T));
	const int64_t nw = (int64_t)s->c_out * g.k;
	T *col = (T *)((char *)a->ws + g.slot * t);
	T *part = col + (int64_t)g.k * g.p; /* [K, c_out]: see below */

	if (t == 0)
		a->team = nt;
	T *pp = g.direct ? NULL : LOOM_CPU_FN(conv_padded_plane)(s, col, g.slot);
	memset(part, 0, sizeof(T) * nw);
	int64_t lo, hi;
	loom_cpu_team_block(s->n, t, nt, &lo, &hi);
	for (int n = (int)lo; n < (int)hi; n++) {
		const T *xn = a->x + n * g.in_img;
		const T *cn = g.direct ? xn : col;

		if (pp)
			LOOM_CPU_FN(im2col_s1)(s, xn, col, pp);
		else if (!g.direct)
			LOOM_CPU_FN(im2col)(s, xn, col);
		/* part[K, c_out] += col[K, P] dy_n[c_out, P]^T: dw transposed,
		 * because OpenBLAS runs this shape twice as fast as the one
		 * with c_out rows. */
		CBLAS_GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, g.k, s->c_out, g.p, 1, cn, g.p,
			   a->dy + n * g.out_img, g.p, 1, part, s->c_out);
	}
}

void LOOM_CPU_FN(loom_cpu_conv2d_bwd_filter)(const loom_conv_shape *s, const T *dy,
					     const T *x, T *dw, void *ws)
{
	const loom_conv_gemm g = loom_cpu_conv_gemm(s, sizeof(T));
	LOOM_CPU_FN(conv_args) a = { .s = s, .dy = dy, .x = x, .ws = ws, .team = 1 };
	int blas_prev = loom_cpu_blas_serial_begin();
	loom_cpu_team_run(loom_cpu_slot_threads(s->n), LOOM_CPU_FN(conv_bwd_filter_part), &a);
	loom_cpu_blas_serial_end(blas_prev);

	LOOM_CPU_FN(conv_dw_reduce)(s->c_out, g.k,
				    (const char *)ws + (int64_t)g.k * g.p * sizeof(T), g.slot,
				    a.team, dw);
}
