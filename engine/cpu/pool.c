/*
 * engine/cpu/pool.c — CPU 2-D max pooling (forward, backward) for f32 and
 * f64 from pool_impl.h.
 */
#include <math.h>
#include <string.h>

#include "engine/cpu/cpu_internal.h"
#include "engine/cpu/kernels.h"

#ifdef __AVX2__
#include <immintrin.h>

/* Row pair (r0, r1) from input column 2 ow: the four windows left of
 * w_out at most, masked (m8 for the eight inputs, m4 for the four outputs). */
static inline void pool2_load_avx2(const float *r0, const float *r1, int ow, int w_out,
				   __m256 *v0, __m256 *v1, __m256i *m8, __m128i *m4)
{
	int left = w_out - ow < 4 ? w_out - ow : 4;
	*m8 = _mm256_cmpgt_epi32(_mm256_set1_epi32(2 * left),
				 _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
	*m4 = _mm_cmpgt_epi32(_mm_set1_epi32(left), _mm_setr_epi32(0, 1, 2, 3));
	*v0 = _mm256_maskload_ps(r0 + 2 * ow, *m8);
	*v1 = _mm256_maskload_ps(r1 + 2 * ow, *m8);
}

/*
 * One row pair of the NaN-free 2x2 backward (pool_impl.h's pool2_plane_bwd)
 * in AVX2, for the x86-64-v3 copy: the scalar loop's interleaved loads and
 * stores (r0[2 ow], r0[2 ow + 1]) kept GCC from vectorizing it, and it was
 * the largest loop of the ConvNet's step outside oneDNN. Eight inputs are
 * four windows; each lane gets its window's a/b (c/d) by swapping within
 * pairs, and dy is repeated per pair. Every lane makes the scalar loop's
 * compares, so the result is the same bits. Row tails use masked loads and
 * stores (ConvNet rows are 28 and 14 wide). Returns whether the rows held a
 * NaN (then the caller redoes the plane on the NaN path), which spares the
 * separate pass over the plane that looked for one first.
 */
static int pool2_rows_bwd_avx2(const float *r0, const float *r1, const float *dr, float *g0,
				float *g1, int w_out, int relu)
{
	const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
	const __m256 even = _mm256_castsi256_ps(_mm256_setr_epi32(-1, 0, -1, 0, -1, 0, -1, 0));
	const __m256 zero = _mm256_setzero_ps();
	__m256 nan = zero;
	for (int ow = 0; ow < w_out; ow += 4) {
		__m256 v0, v1;
		__m256i m8;
		__m128i m4;
		pool2_load_avx2(r0, r1, ow, w_out, &v0, &v1, &m8, &m4);
		nan = _mm256_or_ps(nan, _mm256_cmp_ps(v0, v1, _CMP_UNORD_Q));
		__m256 s0 = _mm256_permute_ps(v0, 0xb1), s1 = _mm256_permute_ps(v1, 0xb1);
		__m256 a = _mm256_blendv_ps(s0, v0, even), b = _mm256_blendv_ps(v0, s0, even);
		__m256 c = _mm256_blendv_ps(s1, v1, even), d = _mm256_blendv_ps(v1, s1, even);
		__m256 dy = _mm256_permutevar8x32_ps(
			_mm256_castps128_ps256(_mm_maskload_ps(dr + ow, m4)), dup);
		__m256 b_gt_a = _mm256_cmp_ps(b, a, _CMP_GT_OQ);
		__m256 d_gt_c = _mm256_cmp_ps(d, c, _CMP_GT_OQ);
		__m256 top = _mm256_blendv_ps(a, b, b_gt_a), bot = _mm256_blendv_ps(c, d, d_gt_c);
		__m256 bot_gt_top = _mm256_cmp_ps(bot, top, _CMP_GT_OQ);
		__m256 mx = _mm256_blendv_ps(top, bot, bot_gt_top);
		__m256 g = relu ? _mm256_and_ps(_mm256_cmp_ps(mx, zero, _CMP_GT_OQ), dy) : dy;
		__m256 gt = _mm256_andnot_ps(bot_gt_top, g), gb = _mm256_and_ps(bot_gt_top, g);
		/* The even lane (a, c) takes its row's share unless the odd one won. */
		__m256 o0 = _mm256_and_ps(_mm256_xor_ps(b_gt_a, even), gt);
		__m256 o1 = _mm256_and_ps(_mm256_xor_ps(d_gt_c, even), gb);
		_mm256_maskstore_ps(g0 + 2 * ow, m8, o0);
		_mm256_maskstore_ps(g1 + 2 * ow, m8, o1);
	}
	return _mm256_movemask_ps(nan) != 0;
}

/* pool_pick (pool_impl.h) per lane: v replaces m if greater, or the first NaN. */
static inline __m256 pool2_pick_avx2(__m256 m, __m256 v)
{
	__m256 nan_first = _mm256_and_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q),
					 _mm256_cmp_ps(m, m, _CMP_ORD_Q));
	return _mm256_blendv_ps(m, v, _mm256_or_ps(_mm256_cmp_ps(v, m, _CMP_GT_OQ), nan_first));
}

/* One output row of the 2x2 forward, the same picks in the same order as
 * pool2_plane_fwd's scalar loop (a, b, c, d), four windows at a time: the
 * even lanes hold the windows, the odd ones are dropped when packing. */
static void pool2_row_fwd_avx2(const float *r0, const float *r1, float *y, int w_out)
{
	const __m256i pack = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
	for (int ow = 0; ow < w_out; ow += 4) {
		__m256 v0, v1;
		__m256i m8;
		__m128i m4;
		pool2_load_avx2(r0, r1, ow, w_out, &v0, &v1, &m8, &m4);
		__m256 m = pool2_pick_avx2(v0, _mm256_permute_ps(v0, 0xb1));
		m = pool2_pick_avx2(m, v1);
		m = pool2_pick_avx2(m, _mm256_permute_ps(v1, 0xb1));
		_mm_maskstore_ps(y + ow, m4,
				 _mm256_castps256_ps128(_mm256_permutevar8x32_ps(m, pack)));
	}
}
#define LOOM_POOL2_ROWS_BWD_F32 pool2_rows_bwd_avx2
#define LOOM_POOL2_ROW_FWD_F32 pool2_row_fwd_avx2
#endif

#define T float
#define SFX LOOM_CPU_F32
#include "engine/cpu/pool_impl.h"
#undef T
#undef SFX
#undef LOOM_POOL2_ROWS_BWD_F32
#undef LOOM_POOL2_ROW_FWD_F32

/* f64 (gradient checks) only in the baseline copy. */
#define LOOM_CPU_TEMPLATE_FILE "engine/cpu/pool_impl.h"
#include "engine/cpu/f64_base.h"
