/*
 * engine/cpu/elementwise_impl.h — relu, add, sum, scalar broadcast and global
 * average pooling,
 * written once for T/SFX and included by elementwise.c for f32 and f64 (no
 * include guard on purpose). Large arrays are split over loom's team
 * (team.c).
 */

/* The kernels' arguments, for their loops on loom's team (team.c). */
typedef struct LOOM_CPU_FN(ew_args) {
	const T *a, *b;
	T *y;
	T v;
	int64_t n, hw;
	int tanh_form; /* GELU's form (elementwise.c) */
	double part[LOOM_CPU_MAX_SLOTS]; /* sum: one partial per block of blocks */
} LOOM_CPU_FN(ew_args);

static int LOOM_CPU_FN(ew_threads)(int64_t n)
{
	return n >= LOOM_CPU_PAR_MIN ? loom_cpu_team_threads() : 1;
}

/* An elementwise kernel's loop: y[i] = EXPR of a[i] (and b[i]). */
#ifndef LOOM_CPU_EW_MAP
#define LOOM_CPU_EW_MAP(NAME, EXPR)                                                   \
	static void LOOM_CPU_FN(NAME)(void *arg, int64_t lo, int64_t hi)              \
	{                                                                             \
		const LOOM_CPU_FN(ew_args) *g = arg;                                  \
		const T *a = g->a, *b = g->b;                                         \
		T *y = g->y;                                                          \
		(void)b;                                                              \
		_Pragma("omp simd") for (int64_t i = lo; i < hi; i++) y[i] = (EXPR); \
	}
#endif

/* Runs an elementwise loop over n elements on loom's team. */
static void LOOM_CPU_FN(ew_map)(int64_t n, const T *a, const T *b, T *y,
				loom_cpu_team_range_fn part)
{
	LOOM_CPU_FN(ew_args) g = { .a = a, .b = b, .y = y };
	loom_cpu_team_for(n, LOOM_CPU_FN(ew_threads)(n), part, &g);
}

/* a < 0 ? 0 : a rather than a > 0 ? a : 0, so that NaN passes through. */
LOOM_CPU_EW_MAP(relu_fwd_part, a[i] < 0 ? 0 : a[i])
/* relu's gradient: a is x, b is dy. */
LOOM_CPU_EW_MAP(relu_bwd_part, a[i] > 0 ? b[i] : 0)
LOOM_CPU_EW_MAP(add_part, a[i] + b[i])

void LOOM_CPU_FN(loom_cpu_relu_fwd)(int64_t n, const T *x, T *y)
{
	LOOM_CPU_FN(ew_map)(n, x, NULL, y, LOOM_CPU_FN(relu_fwd_part));
}

void LOOM_CPU_FN(loom_cpu_relu_bwd)(int64_t n, const T *x, const T *dy, T *dx)
{
	LOOM_CPU_FN(ew_map)(n, x, dy, dx, LOOM_CPU_FN(relu_bwd_part));
}

void LOOM_CPU_FN(loom_cpu_add)(int64_t n, const T *a, const T *b, T *y)
{
	LOOM_CPU_FN(ew_map)(n, a, b, y, LOOM_CPU_FN(add_part));
}

/* Thread t's blocks of the sum, into part[t]. */
static void LOOM_CPU_FN(sum_part)(void *arg, int t, int nt)
{
	LOOM_CPU_FN(ew_args) *g = arg;
	const T *x = g->a;
	const int64_t n = g->n, nb = (n + LOOM_CPU_SUM_BLOCK - 1) / LOOM_CPU_SUM_BLOCK;
	int64_t lo, hi;
	loom_cpu_team_block(nb, t, nt, &lo, &hi);
	double total = 0;
	for (int64_t bi = lo; bi < hi; bi++) {
		int64_t b0 = bi * LOOM_CPU_SUM_BLOCK;
		int64_t e = b0 + LOOM_CPU_SUM_BLOCK < n ? b0 + LOOM_CPU_SUM_BLOCK : n;
		double s = 0;
#pragma omp simd reduction(+ : s)
		for (int64_t i = b0; i < e; i++)
			s += x[i];
		total += s;
	}
	g->part[t] = total;
}

void LOOM_CPU_FN(loom_cpu_sum)(int64_t n, const T *x, T *y)
{
	/* Blocked: each block sums in double across SIMD lanes, then the block
	 * sums are added in double, per thread and then the threads' in order.
	 * For f32 this is exact to well under an ulp of the result; for f64 the
	 * error grows with n / block + block / lanes instead of n. */
	LOOM_CPU_FN(ew_args) g = { .a = x, .n = n };
	int nt = LOOM_CPU_FN(ew_threads)(n);
	if (nt > LOOM_CPU_MAX_SLOTS)
		nt = LOOM_CPU_MAX_SLOTS;
	loom_cpu_team_run(nt, LOOM_CPU_FN(sum_part), &g);
	double total = 0;
	for (int t = 0; t < nt; t++)
		total += g.part[t];
	*y = (T)total;
}

static void LOOM_CPU_FN(fill_part)(void *arg, int64_t lo, int64_t hi)
{
	const LOOM_CPU_FN(ew_args) *g = arg;
	const T v = g->v;
	T *y = g->y;
#pragma omp simd
	for (int64_t i = lo; i < hi; i++)
		y[i] = v;
}

void LOOM_CPU_FN(loom_cpu_broadcast_scalar)(int64_t n, const T *x, double scale, T *y)
{
	/* Read once up front: y may alias x. */
	LOOM_CPU_FN(ew_args) g = { .y = y, .v = (T)(*x * scale) };
	loom_cpu_team_for(n, LOOM_CPU_FN(ew_threads)(n), LOOM_CPU_FN(fill_part), &g);
}

static void LOOM_CPU_FN(gap_fwd_part)(void *arg, int64_t lo, int64_t hi)
{
	const LOOM_CPU_FN(ew_args) *g = arg;
	const int64_t hw = g->hw;
	for (int64_t p = lo; p < hi; p++) {
		const T *xp = g->a + p * hw;
		double s = 0;
#pragma omp simd reduction(+ : s)
		for (int64_t i = 0; i < hw; i++)
			s += xp[i];
		g->y[p] = (T)(s / (double)hw);
	}
}

void LOOM_CPU_FN(loom_cpu_global_avgpool_fwd)(int64_t nc, int64_t hw, const T *x, T *y)
{
	LOOM_CPU_FN(ew_args) g = { .a = x, .y = y, .hw = hw };
	loom_cpu_team_for(nc, LOOM_CPU_FN(ew_threads)(nc * hw), LOOM_CPU_FN(gap_fwd_part), &g);
}

static void LOOM_CPU_FN(gap_bwd_part)(void *arg, int64_t lo, int64_t hi)
{
	const LOOM_CPU_FN(ew_args) *g = arg;
	const int64_t hw = g->hw;
	for (int64_t p = lo; p < hi; p++) {
		const T v = (T)(g->a[p] / (double)hw);
		T *dp = g->y + p * hw;
#pragma omp simd
		for (int64_t i = 0; i < hw; i++)
			dp[i] = v;
	}
}

void LOOM_CPU_FN(loom_cpu_global_avgpool_bwd)(int64_t nc, int64_t hw, const T *dy, T *dx)
{
	LOOM_CPU_FN(ew_args) g = { .a = dy, .y = dx, .hw = hw };
	loom_cpu_team_for(nc, LOOM_CPU_FN(ew_threads)(nc * hw), LOOM_CPU_FN(gap_bwd_part), &g);
}
