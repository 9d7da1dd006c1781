/*
 * engine/cpu/gpt_impl.h — embedding, layer norm and causal attention,
 * written once for T/SFX/CBLAS_GEMM and included by gpt.c for f32 and f64
 * (no include guard on purpose). Statistics and softmax sums in double.
 */

int LOOM_CPU_FN(loom_cpu_embedding_fwd)(int64_t n, int v, int c, const int32_t *ids,
					const T *table, T *y, int64_t *bad)
{
	for (int64_t i = 0; i < n; i++) {
		if (ids[i] < 0 || ids[i] >= v) {
			if (bad)
				*bad = i;
			return -1;
		}
	}
#pragma omp parallel for if (n * c >= LOOM_CPU_PAR_MIN) schedule(static)
	for (int64_t i = 0; i < n; i++)
		memcpy(y + i * c, table + (int64_t)ids[i] * c, sizeof(T) * c);
	return 0;
}

void LOOM_CPU_FN(loom_cpu_embedding_bwd)(int64_t n, int v, int c, const int32_t *ids,
					 const T *dy, T *dtable)
{
	memset(dtable, 0, sizeof(T) * (size_t)v * c);
	/* Threads own column ranges, so repeated ids never race; rows are
	 * added in order, the same sums whatever the thread count. */
	int nt = n * c >= LOOM_CPU_PAR_MIN ? omp_get_max_threads() : 1;
	if (nt > c)
		nt = c;
#pragma omp parallel num_threads(nt)
	{
		int t = omp_get_thread_num(), cnt = omp_get_num_threads();
		int j0 = (int)((int64_t)c * t / cnt), j1 = (int)((int64_t)c * (t + 1) / cnt);
		for (int64_t i = 0; i < n; i++) {
			if (ids[i] < 0 || ids[i] >= v)
				continue;
			T *row = dtable + (int64_t)ids[i] * c;
			const T *d = dy + i * c;
			for (int j = j0; j < j1; j++)
				row[j] += d[j];
		}
	}
}

/* Mean and 1 / sqrt(biased variance + eps) of one row, in double. */
static void LOOM_CPU_FN(ln_stats)(int c, const T *x, double eps, double *mean, double *rstd)
{
	double s = 0, ss = 0;
	for (int j = 0; j < c; j++)
		s += x[j];
	double m = s / c;
	for (int j = 0; j < c; j++)
		ss += (x[j] - m) * (x[j] - m);
	*mean = m;
	*rstd = 1.0 / sqrt(ss / c + eps);
}

void LOOM_CPU_FN(loom_cpu_layernorm_fwd)(int64_t rows, int c, const T *x, const T *gamma,
					 const T *beta, double eps, T *y)
{
#pragma omp parallel for if (rows * c >= LOOM_CPU_PAR_MIN) schedule(static)
	for (int64_t r = 0; r < rows; r++) {
		const T *xr = x + r * c;
		T *yr = y + r * c;
		double m, rs;
		LOOM_CPU_FN(ln_stats)(c, xr, eps, &m, &rs);
		for (int j = 0; j < c; j++)
			yr[j] = (T)((xr[j] - m) * rs * gamma[j] + beta[j]);
	}
}

/* dx = rstd (g dy - mean(g dy) - xhat mean(g dy xhat)). */
void LOOM_CPU_FN(loom_cpu_layernorm_bwd_data)(int64_t rows, int c, const T *x, const T *gamma,
					      const T *dy, double eps, T *dx)
{
#pragma omp parallel for if (rows * c >= LOOM_CPU_PAR_MIN) schedule(static)
	for (int64_t r = 0; r < rows; r++) {
		const T *xr = x + r * c, *dr = dy + r * c;
		T *out = dx + r * c;
		double m, rs, a = 0, b = 0;
		LOOM_CPU_FN(ln_stats)(c, xr, eps, &m, &rs);
		for (int j = 0; j < c; j++) {
			double g = (double)gamma[j] * dr[j];
			a += g;
			b += g * (xr[j] - m) * rs;
		}
		a /= c;
		b /= c;
		for (int j = 0; j < c; j++) {
			double xh = (xr[j] - m) * rs;
			out[j] = (T)(rs * ((double)gamma[j] * dr[j] - a - xh * b));
		}
	}
}

/* acc[j] += dy * xhat over rows (one thread's share; gpt_bf16.c calls it
 * per block of widened rows). */
void LOOM_CPU_FN(loom_cpu_layernorm_gamma_rows)(int64_t rows, int c, const T *x, const T *dy,
						double eps, double *acc)
{
	for (int64_t r = 0; r < rows; r++) {
		const T *xr = x + r * c, *dr = dy + r * c;
		double m, rs;
		LOOM_CPU_FN(ln_stats)(c, xr, eps, &m, &rs);
		for (int j = 0; j < c; j++)
			acc[j] += dr[j] * (xr[j] - m) * rs;
	}
}

void LOOM_CPU_FN(loom_cpu_layernorm_bwd_gamma)(int64_t rows, int c, const T *x, const T *dy,
					       double eps, T *dgamma, double *ws)
{
	int nt = rows * c >= LOOM_CPU_PAR_MIN ? loom_cpu_slot_threads(rows < 65536 ? (int)rows : 65536) : 1;
	memset(ws, 0, sizeof(double) * (size_t)nt * c);
#pragma omp parallel num_threads(nt)
	{
		int t = omp_get_thread_num(), cnt = omp_get_num_threads();
		int64_t r0 = rows * t / cnt, r1 = rows * (t + 1) / cnt;
		LOOM_CPU_FN(loom_cpu_layernorm_gamma_rows)(r1 - r0, c, x + r0 * c, dy + r0 * c, eps,
							   ws + (size_t)t * c);
	}
	/* The slots in a fixed order: the same sums for the same thread count. */
	for (int j = 0; j < c; j++) {
		double s = 0;
		for (int t = 0; t < nt; t++)
			s += ws[(size_t)t * c + j];
		dgamma[j] = (T)s;
	}
}

/* Threads for a loop over the b * nh heads, each with a single-threaded
 * GEMM (the caller holds BLAS serial). */
static int LOOM_CPU_FN(attn_threads)(const loom_attn_shape *s)
{
	int64_t work = (int64_t)s->b * s->nh;
	double flops = (double)work * s->t * s->t * (s->c / s->nh);
	return flops >= LOOM_CPU_GEMM_PAR_MIN ? loom_cpu_slot_threads((int)work) : 1;
}

void LOOM_CPU_FN(loom_cpu_attn_probs_fwd)(const loom_attn_shape *s, const T *qkv, T *p)
{
	const int t = s->t, c3 = 3 * s->c, hs = s->c / s->nh;
	const double scale = 1.0 / sqrt((double)hs);
	int blas_prev = loom_cpu_blas_serial_begin();
#pragma omp parallel for num_threads(LOOM_CPU_FN(attn_threads)(s)) schedule(static)
	for (int bh = 0; bh < s->b * s->nh; bh++) {
		int b = bh / s->nh, h = bh % s->nh;
		const T *q = qkv + (int64_t)b * t * c3 + h * hs, *k = q + s->c;
		T *pb = p + (int64_t)bh * t * t;
		CBLAS_GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, t, t, hs, (T)scale, q, c3, k, c3,
			   (T)0, pb, t);
		for (int i = 0; i < t; i++) {
			T *row = pb + (int64_t)i * t;
			double mx = row[0], sum;
			for (int j = 1; j <= i; j++)
				mx = row[j] > mx ? row[j] : mx;
			sum = LOOM_CPU_FN(loom_cpu_exp_inplace)(i + 1, row, mx);
			/* Divide in double and round once (the exp was rounded to T
			 * already; for f64 graphs both are exact to the ulp). */
			for (int j = 0; j <= i; j++)
				row[j] = (T)(row[j] / sum);
			for (int j = i + 1; j < t; j++)
				row[j] = 0;
		}
	}
	loom_cpu_blas_serial_end(blas_prev);
}

void LOOM_CPU_FN(loom_cpu_attn_probs_bwd)(const loom_attn_shape *s, const T *qkv, const T *p,
					  const T *dp, T *dqkv, T *ws)
{
	const int t = s->t, c3 = 3 * s->c, hs = s->c / s->nh;
	const double scale = 1.0 / sqrt((double)hs);
	const int nt = LOOM_CPU_FN(attn_threads)(s);
	int blas_prev = loom_cpu_blas_serial_begin();
	/* The v part takes no gradient from the probabilities. */
	for (int64_t r = 0; r < (int64_t)s->b * t; r++)
		memset(dqkv + r * c3 + 2 * s->c, 0, sizeof(T) * s->c);
#pragma omp parallel num_threads(nt)
	{
		T *ds = ws + (size_t)omp_get_thread_num() * t * t;
#pragma omp for schedule(static)
		for (int bh = 0; bh < s->b * s->nh; bh++) {
			int b = bh / s->nh, h = bh % s->nh;
			int64_t off = (int64_t)b * t * c3 + h * hs;
			const T *q = qkv + off, *k = q + s->c;
			const T *pb = p + (int64_t)bh * t * t, *db = dp + (int64_t)bh * t * t;
			for (int i = 0; i < t; i++) {
				const T *pr = pb + (int64_t)i * t, *dr = db + (int64_t)i * t;
				T *out = ds + (int64_t)i * t;
				double dot = 0;
				for (int j = 0; j <= i; j++)
					dot += (double)pr[j] * dr[j];
				for (int j = 0; j <= i; j++)
					out[j] = (T)(pr[j] * (dr[j] - dot));
				for (int j = i + 1; j < t; j++)
					out[j] = 0;
			}
			/* dq = dS k scale, dk = dS^T q scale. */
			CBLAS_GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, t, hs, t, (T)scale, ds, t,
				   k, c3, (T)0, dqkv + off, c3);
			CBLAS_GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, t, hs, t, (T)scale, ds, t,
				   q, c3, (T)0, dqkv + off + s->c, c3);
		}
	}
	loom_cpu_blas_serial_end(blas_prev);
}

void LOOM_CPU_FN(loom_cpu_attention_fwd)(const loom_attn_shape *s, const T *p, const T *qkv,
					 T *y)
{
	const int t = s->t, c3 = 3 * s->c, hs = s->c / s->nh;
	int blas_prev = loom_cpu_blas_serial_begin();
#pragma omp parallel for num_threads(LOOM_CPU_FN(attn_threads)(s)) schedule(static)
	for (int bh = 0; bh < s->b * s->nh; bh++) {
		int b = bh / s->nh, h = bh % s->nh;
		const T *v = qkv + (int64_t)b * t * c3 + 2 * s->c + h * hs;
		CBLAS_GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, t, hs, t, (T)1,
			   p + (int64_t)bh * t * t, t, v, c3, (T)0,
			   y + (int64_t)b * t * s->c + h * hs, s->c);
	}
	loom_cpu_blas_serial_end(blas_prev);
}

void LOOM_CPU_FN(loom_cpu_attention_bwd_probs)(const loom_attn_shape *s, const T *qkv,
					       const T *dy, T *dp)
{
	const int t = s->t, c3 = 3 * s->c, hs = s->c / s->nh;
	int blas_prev = loom_cpu_blas_serial_begin();
#pragma omp parallel for num_threads(LOOM_CPU_FN(attn_threads)(s)) schedule(static)
	for (int bh = 0; bh < s->b * s->nh; bh++) {
		int b = bh / s->nh, h = bh % s->nh;
		const T *v = qkv + (int64_t)b * t * c3 + 2 * s->c + h * hs;
		CBLAS_GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, t, t, hs, (T)1,
			   dy + (int64_t)b * t * s->c + h * hs, s->c, v, c3, (T)0,
			   dp + (int64_t)bh * t * t, t);
	}
	loom_cpu_blas_serial_end(blas_prev);
}

void LOOM_CPU_FN(loom_cpu_attention_bwd_qkv)(const loom_attn_shape *s, const T *p, const T *dy,
					     T *dqkv)
{
	const int t = s->t, c3 = 3 * s->c, hs = s->c / s->nh;
	int blas_prev = loom_cpu_blas_serial_begin();
	/* The q and k parts take no gradient through v. */
	for (int64_t r = 0; r < (int64_t)s->b * t; r++)
		memset(dqkv + r * c3, 0, sizeof(T) * 2 * s->c);
#pragma omp parallel for num_threads(LOOM_CPU_FN(attn_threads)(s)) schedule(static)
	for (int bh = 0; bh < s->b * s->nh; bh++) {
		int b = bh / s->nh, h = bh % s->nh;
		CBLAS_GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, t, hs, t, (T)1,
			   p + (int64_t)bh * t * t, t, dy + (int64_t)b * t * s->c + h * hs, s->c,
			   (T)0, dqkv + (int64_t)b * t * c3 + 2 * s->c + h * hs, c3);
	}
	loom_cpu_blas_serial_end(blas_prev);
}
