/*
 * engine/cpu/bn_impl.h — batch norm and per-channel sums over NCHW, written
 * once for T/SFX and included by bn.c for f32 and f64 (no include guard on
 * purpose). Channels run in parallel on loom's team (team.c). Sums are blocked: at most
 * LOOM_CPU_BN_BLOCK values accumulate in T across SIMD lanes (fast, and a few
 * hundred floats lose nothing that matters), the block sums in double. Two
 * passes for the variance so that a large mean does not cancel it away.
 * The *_apply kernels and loom_cpu_bn_local_sums are synchronised batch
 * norm's halves (ops_bn.c): statistics summed over every rank in between.
 */

/* Channel ch over the batch summed in blocks: of x, or of (x - center)^2
 * when square. Always inlined, square a constant at each call, so that each
 * loop holds only its own arithmetic. */
static inline __attribute__((always_inline)) double
LOOM_CPU_FN(bn_chan_blocks)(int n, int c, int64_t hw, const T *x, int ch, T center, int square)
{
	double s = 0;
	for (int i = 0; i < n; i++) {
		const T *xp = x + ((int64_t)i * c + ch) * hw;
		for (int64_t j0 = 0; j0 < hw; j0 += LOOM_CPU_BN_BLOCK) {
			int64_t e = j0 + LOOM_CPU_BN_BLOCK < hw ? j0 + LOOM_CPU_BN_BLOCK : hw;
			T bs = 0;
#pragma omp simd reduction(+ : bs)
			for (int64_t j = j0; j < e; j++) {
				T d = xp[j] - center;
				bs += square ? d * d : xp[j];
			}
			s += bs;
		}
	}
	return s;
}

/* Sum of channel ch over the batch, double accumulator. */
static double LOOM_CPU_FN(bn_chan_sum)(int n, int c, int64_t hw, const T *x, int ch)
{
	return LOOM_CPU_FN(bn_chan_blocks)(n, c, hw, x, ch, 0, 0);
}

/* Batch mean and biased variance of channel ch. */
static void LOOM_CPU_FN(bn_chan_stats)(int n, int c, int64_t hw, const T *x, int ch,
				       double *mean, double *var)
{
	const double m = (double)n * hw;
	const double mu = LOOM_CPU_FN(bn_chan_sum)(n, c, hw, x, ch) / m;
	const double q = LOOM_CPU_FN(bn_chan_blocks)(n, c, hw, x, ch, (T)mu, 1);
	*mean = mu;
	*var = q / m;
}

/* For backward: mean, biased variance, sum dy and sum dy * (x - mean), with
 * the last three sharing one pass over x and dy. */
static void LOOM_CPU_FN(bn_chan_bwd_sums)(int n, int c, int64_t hw, const T *x,
					  const T *dy, int ch, double *mean,
					  double *var, double *sdy, double *sdyx)
{
	const double m = (double)n * hw;
	const double mu = LOOM_CPU_FN(bn_chan_sum)(n, c, hw, x, ch) / m;
	const T mt = (T)mu;
	double q = 0, a = 0, b = 0;
	for (int i = 0; i < n; i++) {
		int64_t o = ((int64_t)i * c + ch) * hw;
		const T *xp = x + o, *dp = dy + o;
		for (int64_t j0 = 0; j0 < hw; j0 += LOOM_CPU_BN_BLOCK) {
			int64_t e = j0 + LOOM_CPU_BN_BLOCK < hw ? j0 + LOOM_CPU_BN_BLOCK : hw;
			T bq = 0, ba = 0, bb = 0;
#pragma omp simd reduction(+ : bq, ba, bb)
			for (int64_t j = j0; j < e; j++) {
				T d = xp[j] - mt;
				bq += d * d;
				ba += dp[j];
				bb += dp[j] * d;
			}
			q += bq, a += ba, b += bb;
		}
	}
	*mean = mu;
	*var = q / m;
	*sdy = a;
	*sdyx = b;
}

/* y = x * scale + shift over channel ch. */
static void LOOM_CPU_FN(bn_chan_affine)(int n, int c, int64_t hw, const T *x, int ch,
					T scale, T shift, T *y)
{
	for (int i = 0; i < n; i++) {
		int64_t o = ((int64_t)i * c + ch) * hw;
		const T *xp = x + o;
		T *yp = y + o;
#pragma omp simd
		for (int64_t j = 0; j < hw; j++)
			yp[j] = xp[j] * scale + shift;
	}
}

static int LOOM_CPU_FN(bn_threads)(int n, int c, int64_t hw)
{
	return (int64_t)n * c * hw >= LOOM_CPU_PAR_MIN ? loom_cpu_team_threads() : 1;
}

/* Every kernel's arguments, for its per-channel loop on loom's team. */
typedef struct LOOM_CPU_FN(bn_args) {
	int n, c;
	int64_t hw;
	const T *x, *gamma, *beta, *dy;
	const T *rmean_in, *rvar_in;
	T *running_mean, *running_var, *y, *dx, *dgamma, *dbeta, *out;
	double momentum, eps, unbias, m;
	const double *mean, *var, *sdy, *sdyx;
	double *sx, *sxx, *osdy, *osdyx;
} LOOM_CPU_FN(bn_args);

/* Runs body(args, lo, hi) over the channels on loom's team. */
static void LOOM_CPU_FN(bn_run)(LOOM_CPU_FN(bn_args) *a, loom_cpu_team_range_fn body)
{
	loom_cpu_team_for(a->c, LOOM_CPU_FN(bn_threads)(a->n, a->c, a->hw), body, a);
}

static void LOOM_CPU_FN(channel_sum_part)(void *arg, int64_t lo, int64_t hi)
{
	const LOOM_CPU_FN(bn_args) *a = arg;
	for (int ch = (int)lo; ch < (int)hi; ch++)
		a->out[ch] = (T)LOOM_CPU_FN(bn_chan_sum)(a->n, a->c, a->hw, a->x, ch);
}

/* hw == 1 (a linear's or layer norm's bias gradient over [rows, C]): one
 * value per row and channel, so bn_chan_sum would walk each channel with
 * stride c, one double add at a time. Row by row instead, the channels of
 * the range side by side in double accumulators (SIMD across channels):
 * the same additions in the same order as bn_chan_sum, so the same bits
 * (its blocks hold one value each). */
#define LOOM_CPU_ROWSUM_BLOCK 512

static void LOOM_CPU_FN(channel_sum_rows_part)(void *arg, int64_t lo, int64_t hi)
{
	const LOOM_CPU_FN(bn_args) *a = arg;
	double acc[LOOM_CPU_ROWSUM_BLOCK];
	for (int64_t c0 = lo; c0 < hi; c0 += LOOM_CPU_ROWSUM_BLOCK) {
		int64_t w = hi - c0 < LOOM_CPU_ROWSUM_BLOCK ? hi - c0 : LOOM_CPU_ROWSUM_BLOCK;
		for (int64_t j = 0; j < w; j++)
			acc[j] = 0;
		for (int i = 0; i < a->n; i++) {
			const T *xp = a->x + (int64_t)i * a->c + c0;
#pragma omp simd
			for (int64_t j = 0; j < w; j++)
				acc[j] += (double)xp[j];
		}
		for (int64_t j = 0; j < w; j++)
			a->out[c0 + j] = (T)acc[j];
	}
}

void LOOM_CPU_FN(loom_cpu_channel_sum)(int n, int c, int64_t hw, const T *x, T *out)
{
	LOOM_CPU_FN(bn_args) a = { .n = n, .c = c, .hw = hw, .x = x, .out = out };
	LOOM_CPU_FN(bn_run)(&a, hw == 1 ? LOOM_CPU_FN(channel_sum_rows_part) :
					  LOOM_CPU_FN(channel_sum_part));
}

/* Training forward of channel ch from its batch mean and biased variance:
 * the affine, then the running statistics (unbias: m / (m - 1)). */
static void LOOM_CPU_FN(bn_chan_train)(int n, int c, int64_t hw, const T *x, const T *gamma,
				       const T *beta, T *running_mean, T *running_var,
				       double momentum, double eps, int ch, double mean,
				       double var, double unbias, T *y)
{
	double g = gamma ? gamma[ch] : 1, bt = beta ? beta[ch] : 0;
	double scale = g / sqrt(var + eps);
	LOOM_CPU_FN(bn_chan_affine)(n, c, hw, x, ch, (T)scale, (T)(bt - mean * scale), y);
	if (running_mean)
		running_mean[ch] = (T)((1 - momentum) * running_mean[ch] + momentum * mean);
	if (running_var)
		running_var[ch] = (T)((1 - momentum) * running_var[ch] + momentum * var * unbias);
}

/* PyTorch stores the unbiased variance; with one value per channel that is
 * undefined, so the biased one is kept rather than a division by 0. */
static double LOOM_CPU_FN(bn_unbias)(double m)
{
	return m > 1 ? m / (m - 1) : 1;
}

static void LOOM_CPU_FN(bn_fwd_train_part)(void *arg, int64_t lo, int64_t hi)
{
	const LOOM_CPU_FN(bn_args) *a = arg;
	for (int ch = (int)lo; ch < (int)hi; ch++) {
		double mean, var;
		LOOM_CPU_FN(bn_chan_stats)(a->n, a->c, a->hw, a->x, ch, &mean, &var);
		LOOM_CPU_FN(bn_chan_train)(a->n, a->c, a->hw, a->x, a->gamma, a->beta,
					   a->running_mean, a->running_var, a->momentum, a->eps,
					   ch, mean, var, a->unbias, a->y);
	}
}

void LOOM_CPU_FN(loom_cpu_bn_fwd_train)(int n, int c, int64_t hw, const T *x,
					const T *gamma, const T *beta, T *running_mean,
					T *running_var, double momentum, double eps, T *y)
{
	LOOM_CPU_FN(bn_args) a = { .n = n, .c = c, .hw = hw, .x = x, .gamma = gamma,
				   .beta = beta, .running_mean = running_mean,
				   .running_var = running_var, .momentum = momentum, .eps = eps,
				   .unbias = LOOM_CPU_FN(bn_unbias)((double)n * hw), .y = y };
	LOOM_CPU_FN(bn_run)(&a, LOOM_CPU_FN(bn_fwd_train_part));
}

static void LOOM_CPU_FN(bn_fwd_apply_part)(void *arg, int64_t lo, int64_t hi)
{
	const LOOM_CPU_FN(bn_args) *a = arg;
	for (int ch = (int)lo; ch < (int)hi; ch++)
		LOOM_CPU_FN(bn_chan_train)(a->n, a->c, a->hw, a->x, a->gamma, a->beta,
					   a->running_mean, a->running_var, a->momentum, a->eps,
					   ch, a->mean[ch], a->var[ch], a->unbias, a->y);
}

void LOOM_CPU_FN(loom_cpu_bn_fwd_apply)(int n, int c, int64_t hw, const T *x,
					const T *gamma, const T *beta, T *running_mean,
					T *running_var, double momentum, double eps,
					const double *mean, const double *var, double count, T *y)
{
	LOOM_CPU_FN(bn_args) a = { .n = n, .c = c, .hw = hw, .x = x, .gamma = gamma,
				   .beta = beta, .running_mean = running_mean,
				   .running_var = running_var, .momentum = momentum, .eps = eps,
				   .unbias = LOOM_CPU_FN(bn_unbias)(count), .mean = mean,
				   .var = var, .y = y };
	LOOM_CPU_FN(bn_run)(&a, LOOM_CPU_FN(bn_fwd_apply_part));
}

static void LOOM_CPU_FN(bn_local_sums_part)(void *arg, int64_t lo, int64_t hi)
{
	const LOOM_CPU_FN(bn_args) *g = arg;
	const int n = g->n, c = g->c;
	const int64_t hw = g->hw;
	const T *x = g->x, *dy = g->dy;
	const double m = g->m;
	double *sx = g->sx, *sxx = g->sxx, *sdy = g->osdy, *sdyx = g->osdyx;
	for (int ch = (int)lo; ch < (int)hi; ch++) {
		double mean, var, a = 0, b = 0;
		if (dy)
			LOOM_CPU_FN(bn_chan_bwd_sums)(n, c, hw, x, dy, ch, &mean, &var, &a, &b);
		else
			LOOM_CPU_FN(bn_chan_stats)(n, c, hw, x, ch, &mean, &var);
		/* The centred sums are about mt, the mean rounded to T:
		 * sum x^2 = sum (x - mt)^2 + mt (2 sum x - m mt), and
		 * sum dy x = sum dy (x - mt) + mt sum dy, both exact algebra. */
		const double mt = (double)(T)mean;
		sx[ch] = mean * m;
		sxx[ch] = var * m + mt * (2 * mean - mt) * m;
		if (dy) {
			sdy[ch] = a;
			sdyx[ch] = b + mt * a;
		}
	}
}

void LOOM_CPU_FN(loom_cpu_bn_local_sums)(int n, int c, int64_t hw, const T *x, const T *dy,
					 double *sx, double *sxx, double *sdy, double *sdyx)
{
	LOOM_CPU_FN(bn_args) a = { .n = n, .c = c, .hw = hw, .x = x, .dy = dy,
				   .m = (double)n * hw, .sx = sx, .sxx = sxx, .osdy = sdy,
				   .osdyx = sdyx };
	LOOM_CPU_FN(bn_run)(&a, LOOM_CPU_FN(bn_local_sums_part));
}

static void LOOM_CPU_FN(bn_fwd_eval_part)(void *arg, int64_t lo, int64_t hi)
{
	const LOOM_CPU_FN(bn_args) *a = arg;
	for (int ch = (int)lo; ch < (int)hi; ch++) {
		double g = a->gamma ? a->gamma[ch] : 1, bt = a->beta ? a->beta[ch] : 0;
		double scale = g / sqrt((double)a->rvar_in[ch] + a->eps);
		LOOM_CPU_FN(bn_chan_affine)(a->n, a->c, a->hw, a->x, ch, (T)scale,
					    (T)(bt - a->rmean_in[ch] * scale), a->y);
	}
}

void LOOM_CPU_FN(loom_cpu_bn_fwd_eval)(int n, int c, int64_t hw, const T *x,
				       const T *gamma, const T *beta,
				       const T *running_mean, const T *running_var,
				       double eps, T *y)
{
	LOOM_CPU_FN(bn_args) a = { .n = n, .c = c, .hw = hw, .x = x, .gamma = gamma,
				   .beta = beta, .rmean_in = running_mean,
				   .rvar_in = running_var, .eps = eps, .y = y };
	LOOM_CPU_FN(bn_run)(&a, LOOM_CPU_FN(bn_fwd_eval_part));
}

/* dx of channel ch from the batch's mean, biased variance, sum dy and sum
 * dy (x - mean) over m values. */
static void LOOM_CPU_FN(bn_chan_dx)(int n, int c, int64_t hw, const T *x, const T *gamma,
				    const T *dy, double eps, int ch, double mean, double var,
				    double sdy, double sdyx, double m, T *dx)
{
	double istd = 1 / sqrt(var + eps);
	double k = (gamma ? gamma[ch] : 1) * istd;
	/* dx = k (dy - mean(dy) - xhat mean(dy xhat)), folded into
	 * dx = dy * a + x * b + d so the pass is one fma chain. */
	double bb = -k * (sdyx / m) * istd * istd;
	double d = -k * (sdy / m) - bb * mean;
	T a = (T)k, b = (T)bb, dd = (T)d;
	for (int i = 0; i < n; i++) {
		int64_t o = ((int64_t)i * c + ch) * hw;
		const T *xp = x + o, *dp = dy + o;
		T *op = dx + o;
#pragma omp simd
		for (int64_t j = 0; j < hw; j++)
			op[j] = dp[j] * a + xp[j] * b + dd;
	}
}

/* dgamma of channel ch: sum dy xhat. */
static T LOOM_CPU_FN(bn_chan_dgamma)(double var, double sdyx, double eps)
{
	return (T)(sdyx / sqrt(var + eps));
}

/* One set of per-channel sums (bn_chan_bwd_sums) makes all three: dx,
 * dgamma and dbeta, each where not NULL. Its sum of dy is bn_chan_sum's over dy
 * bit for bit (the same blocks, lanes and order; tests/engine/cpu checks it
 * on each compiled copy), so the three equal what bn_bwd_data, bn_bwd_gamma
 * and channel_sum make apart, with the sums made once instead of twice and
 * no pass of dbeta's own. */
static void LOOM_CPU_FN(bn_bwd_part)(void *arg, int64_t lo, int64_t hi)
{
	const LOOM_CPU_FN(bn_args) *a = arg;
	for (int ch = (int)lo; ch < (int)hi; ch++) {
		double mean, var, sdy, sdyx;
		LOOM_CPU_FN(bn_chan_bwd_sums)(a->n, a->c, a->hw, a->x, a->dy, ch, &mean, &var,
					      &sdy, &sdyx);
		if (a->dx)
			LOOM_CPU_FN(bn_chan_dx)(a->n, a->c, a->hw, a->x, a->gamma, a->dy, a->eps,
						ch, mean, var, sdy, sdyx, a->m, a->dx);
		if (a->dgamma)
			a->dgamma[ch] = LOOM_CPU_FN(bn_chan_dgamma)(var, sdyx, a->eps);
		if (a->dbeta)
			a->dbeta[ch] = (T)sdy;
	}
}

void LOOM_CPU_FN(loom_cpu_bn_bwd)(int n, int c, int64_t hw, const T *x, const T *gamma,
				  const T *dy, double eps, T *dx, T *dgamma, T *dbeta)
{
	LOOM_CPU_FN(bn_args) a = { .n = n, .c = c, .hw = hw, .x = x, .gamma = gamma,
				   .dy = dy, .eps = eps, .m = (double)n * hw, .dx = dx,
				   .dgamma = dgamma, .dbeta = dbeta };
	LOOM_CPU_FN(bn_run)(&a, LOOM_CPU_FN(bn_bwd_part));
}

void LOOM_CPU_FN(loom_cpu_bn_bwd_data)(int n, int c, int64_t hw, const T *x,
				       const T *gamma, const T *dy, double eps, T *dx)
{
	LOOM_CPU_FN(loom_cpu_bn_bwd)(n, c, hw, x, gamma, dy, eps, dx, NULL, NULL);
}

static void LOOM_CPU_FN(bn_bwd_data_apply_part)(void *arg, int64_t lo, int64_t hi)
{
	const LOOM_CPU_FN(bn_args) *a = arg;
	for (int ch = (int)lo; ch < (int)hi; ch++)
		LOOM_CPU_FN(bn_chan_dx)(a->n, a->c, a->hw, a->x, a->gamma, a->dy, a->eps, ch,
					a->mean[ch], a->var[ch], a->sdy[ch], a->sdyx[ch], a->m,
					a->dx);
}

void LOOM_CPU_FN(loom_cpu_bn_bwd_data_apply)(int n, int c, int64_t hw, const T *x,
					     const T *gamma, const T *dy, double eps,
					     const double *mean, const double *var,
					     const double *sdy, const double *sdyx,
					     double count, T *dx)
{
	LOOM_CPU_FN(bn_args) a = { .n = n, .c = c, .hw = hw, .x = x, .gamma = gamma,
				   .dy = dy, .eps = eps, .mean = mean, .var = var, .sdy = sdy,
				   .sdyx = sdyx, .m = count, .dx = dx };
	LOOM_CPU_FN(bn_run)(&a, LOOM_CPU_FN(bn_bwd_data_apply_part));
}

void LOOM_CPU_FN(loom_cpu_bn_bwd_gamma)(int n, int c, int64_t hw, const T *x,
					const T *dy, double eps, T *dgamma)
{
	LOOM_CPU_FN(loom_cpu_bn_bwd)(n, c, hw, x, NULL, dy, eps, NULL, dgamma, NULL);
}
