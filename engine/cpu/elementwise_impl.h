/*
 * engine/cpu/elementwise_impl.h — relu, add, sum, scalar broadcast and global
 * average pooling,
 * written once for T/SFX and included by elementwise.c for f32 and f64 (no
 * include guard on purpose). Large arrays are split over threads.
 */

void LOOM_CPU_FN(loom_cpu_relu_fwd)(int64_t n, const T *x, T *y)
{
	/* x < 0 ? 0 : x rather than x > 0 ? x : 0, so that NaN passes through. */
#pragma omp parallel for simd if (n >= LOOM_CPU_PAR_MIN) schedule(static)
	for (int64_t i = 0; i < n; i++)
		y[i] = x[i] < 0 ? 0 : x[i];
}

void LOOM_CPU_FN(loom_cpu_relu_bwd)(int64_t n, const T *x, const T *dy, T *dx)
{
#pragma omp parallel for simd if (n >= LOOM_CPU_PAR_MIN) schedule(static)
	for (int64_t i = 0; i < n; i++)
		dx[i] = x[i] > 0 ? dy[i] : 0;
}

void LOOM_CPU_FN(loom_cpu_add)(int64_t n, const T *a, const T *b, T *y)
{
#pragma omp parallel for simd if (n >= LOOM_CPU_PAR_MIN) schedule(static)
	for (int64_t i = 0; i < n; i++)
		y[i] = a[i] + b[i];
}

void LOOM_CPU_FN(loom_cpu_sum)(int64_t n, const T *x, T *y)
{
	/* Blocked: each block sums in double across SIMD lanes, then the block
	 * sums are added in double. For f32 this is exact to well under an ulp
	 * of the result; for f64 the error grows with n / block + block / lanes
	 * instead of n. */
	double total = 0;
#pragma omp parallel for reduction(+ : total) if (n >= LOOM_CPU_PAR_MIN) schedule(static)
	for (int64_t b0 = 0; b0 < n; b0 += LOOM_CPU_SUM_BLOCK) {
		int64_t e = b0 + LOOM_CPU_SUM_BLOCK < n ? b0 + LOOM_CPU_SUM_BLOCK : n;
		double s = 0;
#pragma omp simd reduction(+ : s)
		for (int64_t i = b0; i < e; i++)
			s += x[i];
		total += s;
	}
	*y = (T)total;
}

void LOOM_CPU_FN(loom_cpu_broadcast_scalar)(int64_t n, const T *x, double scale, T *y)
{
	/* Read once up front: y may alias x. */
	const T v = (T)(*x * scale);
#pragma omp parallel for simd if (n >= LOOM_CPU_PAR_MIN) schedule(static)
	for (int64_t i = 0; i < n; i++)
		y[i] = v;
}

void LOOM_CPU_FN(loom_cpu_global_avgpool_fwd)(int64_t nc, int64_t hw, const T *x, T *y)
{
#pragma omp parallel for if (nc * hw >= LOOM_CPU_PAR_MIN) schedule(static)
	for (int64_t p = 0; p < nc; p++) {
		const T *xp = x + p * hw;
		double s = 0;
#pragma omp simd reduction(+ : s)
		for (int64_t i = 0; i < hw; i++)
			s += xp[i];
		y[p] = (T)(s / (double)hw);
	}
}

void LOOM_CPU_FN(loom_cpu_global_avgpool_bwd)(int64_t nc, int64_t hw, const T *dy, T *dx)
{
#pragma omp parallel for if (nc * hw >= LOOM_CPU_PAR_MIN) schedule(static)
	for (int64_t p = 0; p < nc; p++) {
		const T g = (T)(dy[p] / (double)hw);
		T *dp = dx + p * hw;
#pragma omp simd
		for (int64_t i = 0; i < hw; i++)
			dp[i] = g;
	}
}
