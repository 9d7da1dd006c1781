/*
 * engine/cpu/pool_impl.h — 2-D max pooling forward and backward, written
 * once for T/SFX and included by pool.c for f32 and f64 (no include guard on
 * purpose). Windows are clipped to the image, so padding never wins; the scan
 * is row-major with a strict '>', so ties go to the first element, and a NaN
 * wins as in PyTorch.
 */

/* Whether v replaces the running max m: a strictly greater value, or the
 * first NaN. */
static inline int LOOM_CPU_FN(pool_takes)(T m, T v)
{
	return v > m || (v != v && m == m);
}

static inline int LOOM_CPU_FN(pool_same)(T v, T m)
{
	return v == m || (v != v && m != m);
}

static inline T LOOM_CPU_FN(pool_pick)(T m, T v)
{
	return LOOM_CPU_FN(pool_takes)(m, v) ? v : m;
}

/* Flat index in the plane of the max of window (oh, ow), or -1 if the window
 * lies wholly in padding (not reachable with PyTorch's pad <= k / 2). */
static inline int64_t LOOM_CPU_FN(pool_argmax)(const loom_pool_shape *s, const T *x,
					       int oh, int ow)
{
	int h0 = oh * s->stride - s->pad, w0 = ow * s->stride - s->pad;
	int hlo = h0 < 0 ? 0 : h0, hhi = h0 + s->k < s->h_in ? h0 + s->k : s->h_in;
	int wlo = w0 < 0 ? 0 : w0, whi = w0 + s->k < s->w_in ? w0 + s->k : s->w_in;
	if (hlo >= hhi || wlo >= whi)
		return -1;

	int64_t best = (int64_t)hlo * s->w_in + wlo;
	T bv = x[best];
	for (int ih = hlo; ih < hhi; ih++) {
		const T *row = x + (int64_t)ih * s->w_in;
		for (int iw = wlo; iw < whi; iw++) {
			T v = row[iw];
			if (LOOM_CPU_FN(pool_takes)(bv, v)) {
				bv = v;
				best = (int64_t)ih * s->w_in + iw;
			}
		}
	}
	return best;
}

/* The ConvNet's 2x2 stride-2 unpadded pool, without the general clipping. */
static void LOOM_CPU_FN(pool2_plane_fwd)(const loom_pool_shape *s, const T *x, T *y)
{
#ifdef LOOM_POOL2_ROW_FWD_F32 /* f32 in the AVX2 copy only (pool.c) */
	for (int oh = 0; oh < s->h_out; oh++)
		LOOM_POOL2_ROW_FWD_F32(x + (int64_t)(2 * oh) * s->w_in,
				       x + (int64_t)(2 * oh + 1) * s->w_in, y + (int64_t)oh * s->w_out,
				       s->w_out);
	return;
#endif
	for (int oh = 0; oh < s->h_out; oh++) {
		const T *r0 = x + (int64_t)(2 * oh) * s->w_in, *r1 = r0 + s->w_in;
		T *yr = y + (int64_t)oh * s->w_out;
#pragma omp simd
		for (int ow = 0; ow < s->w_out; ow++) {
			T a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];
			T m = LOOM_CPU_FN(pool_pick)(a, b);
			m = LOOM_CPU_FN(pool_pick)(m, c);
			yr[ow] = LOOM_CPU_FN(pool_pick)(m, d);
		}
	}
}

/* Backward of the 2x2 pool: the windows tile the plane, so each input is
 * written exactly once (dy at the window's max, else 0) with no memset, except
 * for the odd last row/column no window reads. */
static void LOOM_CPU_FN(pool2_plane_bwd_nan)(const loom_pool_shape *s, const T *x,
					 const T *dy, T *dx)
{
	if (s->h_in != 2 * s->h_out || s->w_in != 2 * s->w_out)
		memset(dx, 0, sizeof(T) * s->h_in * s->w_in);
	for (int oh = 0; oh < s->h_out; oh++) {
		const T *r0 = x + (int64_t)(2 * oh) * s->w_in, *r1 = r0 + s->w_in;
		T *g0 = dx + (int64_t)(2 * oh) * s->w_in, *g1 = g0 + s->w_in;
		const T *dr = dy + (int64_t)oh * s->w_out;
		for (int ow = 0; ow < s->w_out; ow++) {
			T a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];
			T m = LOOM_CPU_FN(pool_pick)(a, b), g = dr[ow];
			m = LOOM_CPU_FN(pool_pick)(m, c);
			m = LOOM_CPU_FN(pool_pick)(m, d);
			if (s->relu && !(m > 0))
				g = 0; /* relu's backward: a NaN or non-positive max */
			/* Branch-free "first element equal to the max" (NaN equal
			 * to NaN), so the loop vectorizes. */
			int ia = LOOM_CPU_FN(pool_same)(a, m);
			int ib = !ia && LOOM_CPU_FN(pool_same)(b, m);
			int ic = !ia && !ib && LOOM_CPU_FN(pool_same)(c, m);
			int id = !ia && !ib && !ic;
			g0[2 * ow] = ia ? g : 0;
			g0[2 * ow + 1] = ib ? g : 0;
			g1[2 * ow] = ic ? g : 0;
			g1[2 * ow + 1] = id ? g : 0;
		}
	}
}

/* Whether a plane holds a NaN: the fast backward below assumes none. */
static int LOOM_CPU_FN(plane_has_nan)(const T *x, int64_t n)
{
	int nan = 0;
#pragma omp simd reduction(| : nan)
	for (int64_t i = 0; i < n; i++)
		nan |= x[i] != x[i];
	return nan;
}

/*
 * The same backward for a NaN-free plane, in plain compares that vectorize:
 * the first max of each row pair by a strict '>', then the top pair wins
 * ties, which is the row-major first-max rule of pool_argmax. A plane with a
 * NaN takes the general path above (a NaN must win there).
 */
static void LOOM_CPU_FN(pool2_plane_bwd)(const loom_pool_shape *s, const T *x,
					 const T *dy, T *dx)
{
	const int relu = s->relu;
#ifdef LOOM_POOL2_ROWS_BWD_F32 /* f32 in the AVX2 copy only (pool.c) */
	/* NaN looked for on the way, in the values the windows read (a NaN in
	 * an odd last row or column no window reads changes nothing). */
	int nan = 0;
	if (s->h_in != 2 * s->h_out || s->w_in != 2 * s->w_out)
		memset(dx, 0, sizeof(T) * s->h_in * s->w_in);
	for (int oh = 0; oh < s->h_out; oh++)
		nan |= LOOM_POOL2_ROWS_BWD_F32(x + (int64_t)(2 * oh) * s->w_in,
					       x + (int64_t)(2 * oh + 1) * s->w_in,
					       dy + (int64_t)oh * s->w_out,
					       dx + (int64_t)(2 * oh) * s->w_in,
					       dx + (int64_t)(2 * oh + 1) * s->w_in, s->w_out, relu);
	if (nan)
		LOOM_CPU_FN(pool2_plane_bwd_nan)(s, x, dy, dx);
	return;
#endif
	if (LOOM_CPU_FN(plane_has_nan)(x, (int64_t)s->h_in * s->w_in)) {
		LOOM_CPU_FN(pool2_plane_bwd_nan)(s, x, dy, dx);
		return;
	}
	if (s->h_in != 2 * s->h_out || s->w_in != 2 * s->w_out)
		memset(dx, 0, sizeof(T) * s->h_in * s->w_in);
	for (int oh = 0; oh < s->h_out; oh++) {
		/* restrict and selects only (no '&&'): the loop vectorizes. */
		const T *restrict r0 = x + (int64_t)(2 * oh) * s->w_in;
		const T *restrict r1 = r0 + s->w_in;
		T *restrict g0 = dx + (int64_t)(2 * oh) * s->w_in;
		T *restrict g1 = g0 + s->w_in;
		const T *restrict dr = dy + (int64_t)oh * s->w_out;
		for (int ow = 0; ow < s->w_out; ow++) {
			T a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];
			T top = b > a ? b : a, bot = d > c ? d : c;
			T mx = bot > top ? bot : top;
			T g = (relu & !(mx > 0)) ? 0 : dr[ow];
			T gt = bot > top ? 0 : g, gb = bot > top ? g : 0;
			g0[2 * ow] = b > a ? 0 : gt;
			g0[2 * ow + 1] = b > a ? gt : 0;
			g1[2 * ow] = d > c ? 0 : gb;
			g1[2 * ow + 1] = d > c ? gb : 0;
		}
	}
}

static int LOOM_CPU_FN(pool_is_2x2)(const loom_pool_shape *s)
{
	return s->k == 2 && s->stride == 2 && s->pad == 0 && s->h_in >= 2 * s->h_out &&
	       s->w_in >= 2 * s->w_out;
}

/* A pooling kernel's arguments, for its loop over planes on loom's team. */
typedef struct LOOM_CPU_FN(pool_args) {
	const loom_pool_shape *s;
	const T *x, *dy;
	T *y;
} LOOM_CPU_FN(pool_args);

static void LOOM_CPU_FN(pool_run)(LOOM_CPU_FN(pool_args) *a, loom_cpu_team_range_fn body)
{
	const loom_pool_shape *s = a->s;
	const int64_t planes = (int64_t)s->n * s->c;
	const int64_t in_plane = (int64_t)s->h_in * s->w_in;
	loom_cpu_team_for(planes, planes * in_plane >= LOOM_CPU_PAR_MIN ? loom_cpu_team_threads() : 1,
			  body, a);
}

static void LOOM_CPU_FN(maxpool_fwd_part)(void *arg, int64_t lo, int64_t hi)
{
	const LOOM_CPU_FN(pool_args) *a = arg;
	const loom_pool_shape *s = a->s;
	const T *x = a->x;
	T *y = a->y;
	const int64_t in_plane = (int64_t)s->h_in * s->w_in;
	const int64_t out_plane = (int64_t)s->h_out * s->w_out;
	const int fast = LOOM_CPU_FN(pool_is_2x2)(s);

	for (int64_t pl = lo; pl < hi; pl++) {
		const T *xp = x + pl * in_plane;
		T *yp = y + pl * out_plane;
		if (fast) {
			LOOM_CPU_FN(pool2_plane_fwd)(s, xp, yp);
		} else {
			for (int oh = 0; oh < s->h_out; oh++) {
				for (int ow = 0; ow < s->w_out; ow++) {
					int64_t i = LOOM_CPU_FN(pool_argmax)(s, xp, oh, ow);
					yp[(int64_t)oh * s->w_out + ow] = i < 0 ? (T)-INFINITY : xp[i];
				}
			}
		}
		/* relu(max) = max(relu): on the 4x smaller output; NaN stays. */
		if (s->relu)
			for (int64_t i = 0; i < out_plane; i++)
				yp[i] = yp[i] > 0 || yp[i] != yp[i] ? yp[i] : 0;
	}
}

void LOOM_CPU_FN(loom_cpu_maxpool2d_fwd)(const loom_pool_shape *s, const T *x, T *y)
{
	LOOM_CPU_FN(pool_args) a = { .s = s, .x = x, .y = y };
	LOOM_CPU_FN(pool_run)(&a, LOOM_CPU_FN(maxpool_fwd_part));
}

static void LOOM_CPU_FN(maxpool_bwd_part)(void *arg, int64_t lo, int64_t hi)
{
	const LOOM_CPU_FN(pool_args) *a = arg;
	const loom_pool_shape *s = a->s;
	const T *x = a->x, *dy = a->dy;
	T *dx = a->y;
	const int64_t in_plane = (int64_t)s->h_in * s->w_in;
	const int64_t out_plane = (int64_t)s->h_out * s->w_out;
	const int fast = LOOM_CPU_FN(pool_is_2x2)(s);

	for (int64_t pl = lo; pl < hi; pl++) {
		const T *xp = x + pl * in_plane, *dp = dy + pl * out_plane;
		T *gp = dx + pl * in_plane;
		if (fast) {
			LOOM_CPU_FN(pool2_plane_bwd)(s, xp, dp, gp);
			continue;
		}
		memset(gp, 0, sizeof(T) * in_plane);
		for (int oh = 0; oh < s->h_out; oh++) {
			for (int ow = 0; ow < s->w_out; ow++) {
				int64_t i = LOOM_CPU_FN(pool_argmax)(s, xp, oh, ow);
				if (i >= 0 && (!s->relu || xp[i] > 0))
					gp[i] += dp[(int64_t)oh * s->w_out + ow];
			}
		}
	}
}

void LOOM_CPU_FN(loom_cpu_maxpool2d_bwd)(const loom_pool_shape *s, const T *x,
					 const T *dy, T *dx)
{
	LOOM_CPU_FN(pool_args) a = { .s = s, .x = x, .dy = dy, .y = dx };
	LOOM_CPU_FN(pool_run)(&a, LOOM_CPU_FN(maxpool_bwd_part));
}
