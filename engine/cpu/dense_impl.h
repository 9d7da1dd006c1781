/*
 * engine/cpu/dense_impl.h — matrix products (GEMM, linear), written once
 * for T/SFX/CBLAS_GEMM and included by dense.c for f32 and f64 (no include
 * guard on purpose).
 */

/* One GEMM's arguments, for its split on loom's team. */
typedef struct LOOM_CPU_FN(gemm_args) {
	int ta, tb, m, n, k, by_rows, len;
	double alpha, beta;
	const T *a, *b;
	T *c;
} LOOM_CPU_FN(gemm_args);

static void LOOM_CPU_FN(gemm_part)(void *arg, int t, int cnt)
{
	const LOOM_CPU_FN(gemm_args) *g = arg;
	const int m = g->m, n = g->n, k = g->k, len = g->len;
	const int lda = g->ta ? m : k, ldb = g->tb ? k : n;
	const enum CBLAS_TRANSPOSE opa = g->ta ? CblasTrans : CblasNoTrans;
	const enum CBLAS_TRANSPOSE opb = g->tb ? CblasTrans : CblasNoTrans;
	int i0 = (int)((int64_t)len * t / cnt), i1 = (int)((int64_t)len * (t + 1) / cnt);
	if (i1 > i0 && g->by_rows)
		CBLAS_GEMM(CblasRowMajor, opa, opb, i1 - i0, n, k, (T)g->alpha,
			   g->ta ? g->a + i0 : g->a + (int64_t)i0 * k, lda, g->b, ldb, (T)g->beta,
			   g->c + (int64_t)i0 * n, n);
	else if (i1 > i0)
		CBLAS_GEMM(CblasRowMajor, opa, opb, m, i1 - i0, k, (T)g->alpha, g->a, lda,
			   g->tb ? g->b + (int64_t)i0 * k : g->b + i0, ldb, (T)g->beta, g->c + i0,
			   n);
}

void LOOM_CPU_FN(loom_cpu_gemm)(int ta, int tb, int m, int n, int k, double alpha,
				const T *a, const T *b, double beta, T *c)
{
	/* Split C along its longer side, one single-threaded GEMM per thread
	 * (see loom_cpu_blas_serial_begin); small products stay on one. */
	const int by_rows = m >= n, len = by_rows ? m : n;
	int nt = (double)m * n * k >= LOOM_CPU_GEMM_PAR_MIN ? loom_cpu_team_threads() : 1;
	if (nt > len)
		nt = len;
	if (nt < 1)
		nt = 1;
	LOOM_CPU_FN(gemm_args) g = { ta, tb, m, n, k, by_rows, len, alpha, beta, a, b, c };
	int blas_prev = loom_cpu_blas_serial_begin();
	loom_cpu_team_run(nt, LOOM_CPU_FN(gemm_part), &g);
	loom_cpu_blas_serial_end(blas_prev);
}

void LOOM_CPU_FN(loom_cpu_linear_fwd)(int n, int in, int out, const T *x, const T *w,
				      const T *b, T *y)
{
	/* Seeding y with the bias lets BLAS add it for free (beta = 1). */
	if (b) {
		for (int i = 0; i < n; i++)
			memcpy(y + (int64_t)i * out, b, sizeof(T) * out);
	}
	LOOM_CPU_FN(loom_cpu_gemm)(0, 1, n, out, in, 1, x, w, b ? 1 : 0, y);
}
