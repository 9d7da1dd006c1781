/*
 * engine/cpu/dense_impl.h — matrix products (GEMM, linear) and softmax
 * cross-entropy, written once for T/SFX/CBLAS_GEMM and included by dense.c
 * for f32 and f64 (no include guard on purpose).
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

void LOOM_CPU_FN(loom_cpu_softmax_ce_bwd_rows)(int n, int classes, const T *logits,
					       const int32_t *labels, double g, T *dlogits);

/* log(sum(exp(row))) with the max taken out so that exp never overflows. */
static double LOOM_CPU_FN(ce_logsumexp)(int classes, const T *row)
{
	double mx = row[0], s = 0;
	for (int j = 1; j < classes; j++)
		mx = row[j] > mx ? row[j] : mx;
	s = LOOM_CPU_FN(loom_cpu_exp_sum)(classes, row, mx);
	return mx + log(s);
}

/* *total += logsumexp(row) - row[label] over n rows in order (labels
 * checked by the caller); gpt_bf16.c calls it per widened row too. */
void LOOM_CPU_FN(loom_cpu_softmax_ce_rows)(int n, int classes, const T *logits,
					   const int32_t *labels, double *total)
{
	for (int i = 0; i < n; i++) {
		const T *row = logits + (int64_t)i * classes;
		*total += LOOM_CPU_FN(ce_logsumexp)(classes, row) - row[labels[i]];
	}
}

int LOOM_CPU_FN(loom_cpu_softmax_ce_fwd)(int n, int classes, const T *logits,
					 const int32_t *labels, T *loss, int *bad)
{
	/* Validate everything first so that a bad label writes nothing. */
	for (int i = 0; i < n; i++) {
		if (labels[i] < 0 || labels[i] >= classes) {
			if (bad)
				*bad = i;
			return -1;
		}
	}
	double total = 0;
	LOOM_CPU_FN(loom_cpu_softmax_ce_rows)(n, classes, logits, labels, &total);
	*loss = (T)(n > 0 ? total / n : 0);
	return 0;
}

void LOOM_CPU_FN(loom_cpu_softmax_ce_bwd)(int n, int classes, const T *logits,
					  const int32_t *labels, const T *dloss,
					  T *dlogits)
{
	LOOM_CPU_FN(loom_cpu_softmax_ce_bwd_rows)(n, classes, logits, labels,
						  n > 0 ? (double)*dloss / n : 0, dlogits);
}

/* dlogits of n rows for the gradient scale g = dloss / (all rows). */
void LOOM_CPU_FN(loom_cpu_softmax_ce_bwd_rows)(int n, int classes, const T *logits,
					       const int32_t *labels, double g, T *dlogits)
{
	for (int i = 0; i < n; i++) {
		const T *row = logits + (int64_t)i * classes;
		T *out = dlogits + (int64_t)i * classes;
		/* dlogits may be logits (LOOM_OPF_INPLACE): the label's logit is
		 * read before its place is written. */
		int lab = labels[i];
		T at_label = lab >= 0 && lab < classes ? row[lab] : 0;
		double lse = LOOM_CPU_FN(ce_logsumexp)(classes, row);
		LOOM_CPU_FN(loom_cpu_exp_scale)(classes, row, lse, g, out);
		/* The forward rejected bad labels; a bad one here only loses its
		 * one-hot term instead of writing out of bounds. */
		if (lab >= 0 && lab < classes)
			out[lab] = (T)((exp(at_label - lse) - 1) * g);
	}
}
