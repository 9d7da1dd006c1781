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
	const int k = s->c_in * s->kh * s->kw;
	const int p = s->h_out * s->w_out;
	const int64_t in_img = (int64_t)s->c_in * s->h_in * s->w_in;
	const int64_t out_img = (int64_t)s->c_out * p;
	const size_t slot = loom_cpu_conv_slot_bytes(s, sizeof(T));
	const int direct = loom_cpu_conv_is_pointwise(s);
	const int tposed = loom_cpu_conv_fwd_transposed(s);
	const T *x = a->x, *w = a->w, *b = a->b;
	T *y = a->y;
	T *slot_base = (T *)((char *)a->ws + slot * t);
	T *yt = slot_base + (int64_t)k * p;
	T *pp = direct ? NULL : LOOM_CPU_FN(conv_padded_plane)(s, slot_base, slot);
	int64_t lo, hi;
	loom_cpu_team_block(s->n, t, nt, &lo, &hi);
	for (int n = (int)lo; n < (int)hi; n++) {
		const T *xn = x + n * in_img;
		T *yn = y + n * out_img;
		T *col = slot_base;

		if (direct)
			col = (T *)xn;
		else if (pp)
			LOOM_CPU_FN(im2col_s1)(s, xn, col, pp);
		else
			LOOM_CPU_FN(im2col)(s, xn, col);
		if (tposed) {
			/* yt[P, c_out] = col[K, P]^T w[c_out, K]^T */
			CBLAS_GEMM(CblasRowMajor, CblasTrans, CblasTrans, p, s->c_out, k, 1, col,
				   p, w, k, 0, yt, s->c_out);
			LOOM_CPU_FN(conv_untranspose)(s->c_out, p, yt, b, yn);
			continue;
		}
		CBLAS_GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, s->c_out, p, k, 1, w, k,
			   col, p, 0, yn, p);
		LOOM_CPU_FN(conv_add_bias)(s->c_out, p, b, yn);
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
	const int k = s->c_in * s->kh * s->kw;
	const int p = s->h_out * s->w_out;
	const int64_t in_img = (int64_t)s->c_in * s->h_in * s->w_in;
	const int64_t out_img = (int64_t)s->c_out * p;
	const size_t slot = loom_cpu_conv_slot_bytes(s, sizeof(T));
	const int direct = loom_cpu_conv_is_pointwise(s);
	T *dcol = (T *)((char *)a->ws + slot * t);
	T *pp = direct ? NULL : LOOM_CPU_FN(conv_padded_plane)(s, dcol, slot);
	int64_t lo, hi;
	loom_cpu_team_block(s->n, t, nt, &lo, &hi);
	for (int n = (int)lo; n < (int)hi; n++) {
		T *dxn = a->y + n * in_img;

		/* dcol[K, P] = w^T[K, c_out] dy_n[c_out, P] */
		CBLAS_GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, k, p, s->c_out, 1, a->w, k,
			   a->dy + n * out_img, p, 0, direct ? dxn : dcol, p);
		if (pp)
			LOOM_CPU_FN(col2im_s1)(s, dcol, dxn, pp);
		else if (!direct)
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
	const int k = s->c_in * s->kh * s->kw;
	const int p = s->h_out * s->w_out;
	const int64_t in_img = (int64_t)s->c_in * s->h_in * s->w_in;
	const int64_t out_img = (int64_t)s->c_out * p;
	const int64_t nw = (int64_t)s->c_out * k;
	const size_t slot = loom_cpu_conv_slot_bytes(s, sizeof(T));
	const int direct = loom_cpu_conv_is_pointwise(s);
	T *col = (T *)((char *)a->ws + slot * t);
	T *part = col + (int64_t)k * p; /* [K, c_out]: see below */

	if (t == 0)
		a->team = nt;
	T *pp = direct ? NULL : LOOM_CPU_FN(conv_padded_plane)(s, col, slot);
	memset(part, 0, sizeof(T) * nw);
	int64_t lo, hi;
	loom_cpu_team_block(s->n, t, nt, &lo, &hi);
	for (int n = (int)lo; n < (int)hi; n++) {
		const T *xn = a->x + n * in_img;
		const T *cn = direct ? xn : col;

		if (pp)
			LOOM_CPU_FN(im2col_s1)(s, xn, col, pp);
		else if (!direct)
			LOOM_CPU_FN(im2col)(s, xn, col);
		/* part[K, c_out] += col[K, P] dy_n[c_out, P]^T: dw transposed,
		 * because OpenBLAS runs this shape twice as fast as the one
		 * with c_out rows. */
		CBLAS_GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, k, s->c_out, p, 1, cn, p,
			   a->dy + n * out_img, p, 1, part, s->c_out);
	}
}

void LOOM_CPU_FN(loom_cpu_conv2d_bwd_filter)(const loom_conv_shape *s, const T *dy,
					     const T *x, T *dw, void *ws)
{
	const int k = s->c_in * s->kh * s->kw;
	const int p = s->h_out * s->w_out;
	const size_t slot = loom_cpu_conv_slot_bytes(s, sizeof(T));
	LOOM_CPU_FN(conv_args) a = { .s = s, .dy = dy, .x = x, .ws = ws, .team = 1 };
	int blas_prev = loom_cpu_blas_serial_begin();
	loom_cpu_team_run(loom_cpu_slot_threads(s->n), LOOM_CPU_FN(conv_bwd_filter_part), &a);
	loom_cpu_blas_serial_end(blas_prev);

	LOOM_CPU_FN(conv_dw_reduce)(s->c_out, k, (const char *)ws + (int64_t)k * p * sizeof(T),
				    slot, a.team, dw);
}
