/*
 * engine/cpu/im2col_impl.h — im2col and its adjoint col2im for one image,
 * and the unpacking of the conv kernels' transposed GEMM results, written
 * once for T/SFX: conv_impl.h instantiates them for f32 and f64, and
 * conv_bf16.c for f32 and for bf16 bit patterns (im2col only: copies, no
 * arithmetic on T). No include guard on purpose. static inline: an instance
 * may leave some unused.
 */

/*
 * im2col's index map, walked once for both directions: column row
 * (c, ki, kj, oh) of col[c_in*kh*kw, ho*wo] holds image row
 * ih = oh st - pad + ki of channel c at columns ow st + off, ow in [lo, hi)
 * (loom_cpu_valid_range), padding elsewhere. adj 0 (im2col): img read
 * into col, padding 0; adj 1 (col2im): col added into img, padding
 * dropped. Both callers pass adj as a constant and it is inlined into
 * each, so each gets its own loops.
 */
static inline __attribute__((always_inline)) void
LOOM_CPU_FN(im2col_map)(const loom_conv_shape *s, T *img, T *col, int adj)
{
	const int ho = s->h_out, wo = s->w_out, st = s->stride, pad = s->pad;
	const int64_t plane = (int64_t)s->h_in * s->w_in;

	for (int c = 0; c < s->c_in; c++) {
		T *ch = img + c * plane;
		for (int ki = 0; ki < s->kh; ki++) {
			for (int kj = 0; kj < s->kw; kj++) {
				int off = kj - pad, lo, hi;
				loom_cpu_valid_range(off, st, s->w_in, wo, &lo, &hi);
				for (int oh = 0; oh < ho; oh++, col += wo) {
					int ih = oh * st - pad + ki;
					if (adj) {
						if (ih < 0 || ih >= s->h_in)
							continue;
						T *row = ch + (int64_t)ih * s->w_in + off;
						if (st == 1) {
							for (int ow = lo; ow < hi; ow++)
								row[ow] += col[ow];
						} else {
							for (int ow = lo; ow < hi; ow++)
								row[ow * st] += col[ow];
						}
						continue;
					}
					if (ih < 0 || ih >= s->h_in) {
						memset(col, 0, sizeof(T) * wo);
						continue;
					}
					const T *row = ch + (int64_t)ih * s->w_in;
					for (int ow = 0; ow < lo; ow++)
						col[ow] = 0;
					/* Rows are short (14 for conv2): an inline loop
					 * beats a memcpy call. */
					if (st == 1)
						for (int ow = lo; ow < hi; ow++)
							col[ow] = row[ow + off];
					else
						for (int ow = lo; ow < hi; ow++)
							col[ow] = row[ow * st + off];
					for (int ow = hi; ow < wo; ow++)
						col[ow] = 0;
				}
			}
		}
	}
}

/* One image x[c_in, h_in, w_in] to col[c_in*kh*kw, ho*wo]; padding reads 0.
 * (im2col_map only reads x here.) */
static inline void LOOM_CPU_FN(im2col)(const loom_conv_shape *s, const T *x, T *col)
{
	LOOM_CPU_FN(im2col_map)(s, (T *)x, col, 0);
}

/*
 * im2col for stride 1 through a zero-bordered copy of each channel plane
 * (pp, (h_in + 2 pad) x (w_in + 2 pad), its border zeroed by the caller once
 * per slot): every column row is then a plain copy of w_out elements with no
 * bounds to test, which vectorizes; the general version above spends most
 * of its time on the bounds of 14- and 28-wide rows.
 */
static inline void LOOM_CPU_FN(im2col_s1)(const loom_conv_shape *s, const T *x, T *col, T *pp)
{
	const int ho = s->h_out, wo = s->w_out, pad = s->pad;
	const int wp = s->w_in + 2 * pad;
	const int64_t plane = (int64_t)s->h_in * s->w_in;

	for (int c = 0; c < s->c_in; c++) {
		const T *src = x + c * plane;
		for (int ih = 0; ih < s->h_in; ih++)
			memcpy(pp + (int64_t)(ih + pad) * wp + pad, src + (int64_t)ih * s->w_in,
			       sizeof(T) * s->w_in);
		for (int ki = 0; ki < s->kh; ki++) {
			for (int kj = 0; kj < s->kw; kj++) {
				const T *base = pp + (int64_t)ki * wp + kj;
				for (int oh = 0; oh < ho; oh++, col += wo) {
					const T *restrict r = base + (int64_t)oh * wp;
					T *restrict d = col;
					for (int ow = 0; ow < wo; ow++)
						d[ow] = r[ow];
				}
			}
		}
	}
}

/* The padded plane at the end of a slot, border zeroed (NULL: not used). */
static inline T *LOOM_CPU_FN(conv_padded_plane)(const loom_conv_shape *s, void *slot_base,
					 size_t slot)
{
	size_t padded = (size_t)(s->h_in + 2 * s->pad) * (s->w_in + 2 * s->pad);
	if (s->stride != 1)
		return NULL;
	T *pp = (T *)((char *)slot_base + slot) - padded;
	memset(pp, 0, sizeof(T) * padded);
	return pp;
}

/* Adjoint of im2col: dx[c_in, h_in, w_in] = sum of col entries that read each
 * pixel. Overwrites dx (one image). */
static inline void LOOM_CPU_FN(col2im)(const loom_conv_shape *s, const T *col, T *dx)
{
	const int64_t plane = (int64_t)s->h_in * s->w_in;

	memset(dx, 0, sizeof(T) * plane * s->c_in);
	LOOM_CPU_FN(im2col_map)(s, dx, (T *)col, 1); /* only reads col */
}

/*
 * col2im for stride 1, the adjoint of im2col_s1: column rows are added into
 * a zeroed padded plane with no bounds to test, then its interior is copied
 * out to dx (pp as in im2col_s1; its border is rewritten here each channel).
 */
static inline void LOOM_CPU_FN(col2im_s1)(const loom_conv_shape *s, const T *col, T *dx, T *pp)
{
	const int ho = s->h_out, wo = s->w_out, pad = s->pad;
	const int wp = s->w_in + 2 * pad;
	const int64_t plane = (int64_t)s->h_in * s->w_in;
	const size_t padded = (size_t)(s->h_in + 2 * pad) * wp;

	for (int c = 0; c < s->c_in; c++) {
		memset(pp, 0, sizeof(T) * padded);
		for (int ki = 0; ki < s->kh; ki++) {
			for (int kj = 0; kj < s->kw; kj++) {
				T *base = pp + (int64_t)ki * wp + kj;
				for (int oh = 0; oh < ho; oh++, col += wo) {
					T *restrict r = base + (int64_t)oh * wp;
					const T *restrict d = col;
					for (int ow = 0; ow < wo; ow++)
						r[ow] += d[ow];
				}
			}
		}
		T *dst = dx + c * plane;
		for (int ih = 0; ih < s->h_in; ih++)
			memcpy(dst + (int64_t)ih * s->w_in, pp + (int64_t)(ih + pad) * wp + pad,
			       sizeof(T) * s->w_in);
	}
}


/* y_n[c_out, P] = yt[P, c_out]^T + b: a transposed GEMM result put back in
 * NCHW, with the bias (may be NULL) added on the way (both in L1). */
static inline void LOOM_CPU_FN(conv_untranspose)(int c_out, int p, const T *yt, const T *b,
						 T *yn)
{
	for (int co = 0; co < c_out; co++) {
		T bias = b ? b[co] : 0, *yr = yn + (int64_t)co * p;
		for (int i = 0; i < p; i++)
			yr[i] = yt[(int64_t)i * c_out + co] + bias;
	}
}

/* y_n[c_out, P] += b[c_out] */
static inline void LOOM_CPU_FN(conv_add_bias)(int c_out, int p, const T *b, T *yn)
{
	for (int co = 0; b && co < c_out; co++) {
		T bias = b[co], *yr = yn + (int64_t)co * p;
		for (int i = 0; i < p; i++)
			yr[i] += bias;
	}
}

/* dw[c_out, k] = the sum over `team` thread slots (slot bytes apart, from
 * part0) of each one's partial dw^T [k, c_out], in a fixed order, so that
 * the filter gradient is the same from run to run. */
static inline void LOOM_CPU_FN(conv_dw_reduce)(int c_out, int k, const char *part0, size_t slot,
					       int team, T *dw)
{
	for (int co = 0; co < c_out; co++) {
		for (int j = 0; j < k; j++) {
			T acc = 0;
			for (int t = 0; t < team; t++)
				acc += ((const T *)(part0 + slot * t))[(int64_t)j * c_out + co];
			dw[(int64_t)co * k + j] = acc;
		}
	}
}
