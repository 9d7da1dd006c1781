/*
 * engine/cpu/dispatch.c — the public f32 kernels of kernels.h, each calling
 * the copy compiled for the path chosen at start-up (cpu_path.c): base
 * (plain x86-64) on the portable path, avx2 (x86-64-v3) on the AVX2 and
 * AVX-512 ones, whose products run in oneDNN's AVX-512 code. The build's own
 * baseline is plain x86-64, so the binary runs on any x86-64 CPU and still
 * gets the wide vectors where they exist.
 */
#include "engine/cpu/cpu_path.h"
#include "engine/cpu/kernels.h"

LOOM_CPU_KERNELS(float, f32_base)
LOOM_CPU_KERNELS(float, f32_avx2)
void loom_cpu_gelu_f32_base(int64_t n, const float *x, const float *dy, int tanh_form, float *y);
void loom_cpu_gelu_f32_avx2(int64_t n, const float *x, const float *dy, int tanh_form, float *y);
#define EXP_KERNELS(SFX)                                                              \
	double loom_cpu_exp_sum_##SFX(int64_t n, const float *x, double m);            \
	double loom_cpu_exp_inplace_##SFX(int64_t n, float *x, double m);              \
	void loom_cpu_exp_scale_##SFX(int64_t n, const float *x, double m, double g, float *y);
EXP_KERNELS(f32_base)
EXP_KERNELS(f32_avx2)
#undef EXP_KERNELS
int loom_cpu_maxpool2d_bf16_f32_base(const loom_pool_shape *s, const uint16_t *x,
				     const uint16_t *dy, uint16_t *out);
int loom_cpu_maxpool2d_bf16_f32_avx2(const loom_pool_shape *s, const uint16_t *x,
				     const uint16_t *dy, uint16_t *out);
void loom_cpu_ew_bf16_f32_base(int op, int flag, int64_t n, const uint16_t *a,
			       const uint16_t *b, uint16_t *y);
void loom_cpu_ew_bf16_f32_avx2(int op, int flag, int64_t n, const uint16_t *a,
			       const uint16_t *b, uint16_t *y);

int loom_cpu_conv2d_fwd_bf16_native(const loom_conv_shape *s, const uint16_t *x,
				    const uint16_t *w, const float *b, float *y, void *ws);
int loom_cpu_conv2d_bwd_data_bf16_native(const loom_conv_shape *s, const uint16_t *dy,
					 const uint16_t *w, float *dx, void *ws);
int loom_cpu_conv2d_bwd_filter_bf16_native(const loom_conv_shape *s, const uint16_t *dy,
					   const uint16_t *x, float *dw, void *ws);

/* The copy of kernel fn for the chosen path. */
#define PICK(fn) (loom_cpu_isa_get() >= LOOM_CPU_ISA_AVX2 ? fn##_f32_avx2 : fn##_f32_base)

void loom_cpu_conv2d_fwd_f32(const loom_conv_shape *s, const float *x, const float *w,
			     const float *b, float *y, void *ws)
{
	PICK(loom_cpu_conv2d_fwd)(s, x, w, b, y, ws);
}

void loom_cpu_conv2d_bwd_data_f32(const loom_conv_shape *s, const float *dy, const float *w,
				  float *dx, void *ws)
{
	PICK(loom_cpu_conv2d_bwd_data)(s, dy, w, dx, ws);
}

void loom_cpu_conv2d_bwd_filter_f32(const loom_conv_shape *s, const float *dy, const float *x,
				    float *dw, void *ws)
{
	PICK(loom_cpu_conv2d_bwd_filter)(s, dy, x, dw, ws);
}

void loom_cpu_channel_sum_f32(int n, int c, int64_t hw, const float *x, float *out)
{
	PICK(loom_cpu_channel_sum)(n, c, hw, x, out);
}

void loom_cpu_bn_fwd_train_f32(int n, int c, int64_t hw, const float *x, const float *gamma,
			       const float *beta, float *running_mean, float *running_var,
			       double momentum, double eps, float *y)
{
	PICK(loom_cpu_bn_fwd_train)(n, c, hw, x, gamma, beta, running_mean, running_var,
				    momentum, eps, y);
}

void loom_cpu_bn_fwd_eval_f32(int n, int c, int64_t hw, const float *x, const float *gamma,
			      const float *beta, const float *running_mean,
			      const float *running_var, double eps, float *y)
{
	PICK(loom_cpu_bn_fwd_eval)(n, c, hw, x, gamma, beta, running_mean, running_var, eps, y);
}

void loom_cpu_bn_bwd_data_f32(int n, int c, int64_t hw, const float *x, const float *gamma,
			      const float *dy, double eps, float *dx)
{
	PICK(loom_cpu_bn_bwd_data)(n, c, hw, x, gamma, dy, eps, dx);
}

void loom_cpu_bn_bwd_f32(int n, int c, int64_t hw, const float *x, const float *gamma,
			 const float *dy, double eps, float *dx, float *dgamma, float *dbeta)
{
	PICK(loom_cpu_bn_bwd)(n, c, hw, x, gamma, dy, eps, dx, dgamma, dbeta);
}

void loom_cpu_bn_bwd_gamma_f32(int n, int c, int64_t hw, const float *x, const float *dy,
			       double eps, float *dgamma)
{
	PICK(loom_cpu_bn_bwd_gamma)(n, c, hw, x, dy, eps, dgamma);
}

void loom_cpu_bn_local_sums_f32(int n, int c, int64_t hw, const float *x, const float *dy,
				double *sx, double *sxx, double *sdy, double *sdyx)
{
	PICK(loom_cpu_bn_local_sums)(n, c, hw, x, dy, sx, sxx, sdy, sdyx);
}

void loom_cpu_bn_fwd_apply_f32(int n, int c, int64_t hw, const float *x, const float *gamma,
			       const float *beta, float *running_mean, float *running_var,
			       double momentum, double eps, const double *mean, const double *var,
			       double count, float *y)
{
	PICK(loom_cpu_bn_fwd_apply)(n, c, hw, x, gamma, beta, running_mean, running_var,
				    momentum, eps, mean, var, count, y);
}

void loom_cpu_bn_bwd_data_apply_f32(int n, int c, int64_t hw, const float *x,
				    const float *gamma, const float *dy, double eps,
				    const double *mean, const double *var, const double *sdy,
				    const double *sdyx, double count, float *dx)
{
	PICK(loom_cpu_bn_bwd_data_apply)(n, c, hw, x, gamma, dy, eps, mean, var, sdy, sdyx,
					 count, dx);
}

void loom_cpu_maxpool2d_fwd_f32(const loom_pool_shape *s, const float *x, float *y)
{
	PICK(loom_cpu_maxpool2d_fwd)(s, x, y);
}

void loom_cpu_maxpool2d_bwd_f32(const loom_pool_shape *s, const float *x, const float *dy,
				float *dx)
{
	PICK(loom_cpu_maxpool2d_bwd)(s, x, dy, dx);
}

int loom_cpu_maxpool2d_bf16(const loom_pool_shape *s, const uint16_t *x, const uint16_t *dy,
			    uint16_t *out)
{
	return PICK(loom_cpu_maxpool2d_bf16)(s, x, dy, out);
}

void loom_cpu_relu_fwd_f32(int64_t n, const float *x, float *y)
{
	PICK(loom_cpu_relu_fwd)(n, x, y);
}

void loom_cpu_relu_bwd_f32(int64_t n, const float *x, const float *dy, float *dx)
{
	PICK(loom_cpu_relu_bwd)(n, x, dy, dx);
}

void loom_cpu_gelu_f32(int64_t n, const float *x, const float *dy, int tanh_form, float *y)
{
	PICK(loom_cpu_gelu)(n, x, dy, tanh_form, y);
}

double loom_cpu_exp_sum_f32(int64_t n, const float *x, double m)
{
	return PICK(loom_cpu_exp_sum)(n, x, m);
}

double loom_cpu_exp_inplace_f32(int64_t n, float *x, double m)
{
	return PICK(loom_cpu_exp_inplace)(n, x, m);
}

void loom_cpu_exp_scale_f32(int64_t n, const float *x, double m, double g, float *y)
{
	PICK(loom_cpu_exp_scale)(n, x, m, g, y);
}

void loom_cpu_ew_bf16(int op, int flag, int64_t n, const uint16_t *a, const uint16_t *b,
		      uint16_t *y)
{
	PICK(loom_cpu_ew_bf16)(op, flag, n, a, b, y);
}

void loom_cpu_add_f32(int64_t n, const float *a, const float *b, float *y)
{
	PICK(loom_cpu_add)(n, a, b, y);
}

void loom_cpu_sum_f32(int64_t n, const float *x, float *y)
{
	PICK(loom_cpu_sum)(n, x, y);
}

void loom_cpu_broadcast_scalar_f32(int64_t n, const float *x, double scale, float *y)
{
	PICK(loom_cpu_broadcast_scalar)(n, x, scale, y);
}

void loom_cpu_global_avgpool_fwd_f32(int64_t nc, int64_t hw, const float *x, float *y)
{
	PICK(loom_cpu_global_avgpool_fwd)(nc, hw, x, y);
}

void loom_cpu_global_avgpool_bwd_f32(int64_t nc, int64_t hw, const float *dy, float *dx)
{
	PICK(loom_cpu_global_avgpool_bwd)(nc, hw, dy, dx);
}

#define BF16_ROWS_DECL(V)                                                              \
	void loom_cpu_bf16_widen_f32_##V(int64_t n, const uint16_t *src, float *dst);   \
	void loom_cpu_bf16_round_f32_##V(int64_t n, const float *src, uint16_t *dst);   \
	void loom_cpu_bf16_acc_f32_##V(int64_t n, const uint16_t *src, float *acc);
BF16_ROWS_DECL(base)
BF16_ROWS_DECL(avx2)
#undef BF16_ROWS_DECL

void loom_cpu_bf16_widen(int64_t n, const uint16_t *src, float *dst)
{
	PICK(loom_cpu_bf16_widen)(n, src, dst);
}

void loom_cpu_bf16_round(int64_t n, const float *src, uint16_t *dst)
{
	PICK(loom_cpu_bf16_round)(n, src, dst);
}

void loom_cpu_bf16_acc(int64_t n, const uint16_t *src, float *acc)
{
	PICK(loom_cpu_bf16_acc)(n, src, acc);
}

int loom_cpu_bf16_native(void)
{
	return loom_cpu_isa_get() == LOOM_CPU_ISA_AVX512_BF16;
}

int loom_cpu_conv2d_fwd_bf16(const loom_conv_shape *s, const uint16_t *x, const uint16_t *w,
			     const float *b, float *y, void *ws)
{
	return loom_cpu_bf16_native() ? loom_cpu_conv2d_fwd_bf16_native(s, x, w, b, y, ws) : -1;
}

int loom_cpu_conv2d_bwd_data_bf16(const loom_conv_shape *s, const uint16_t *dy,
				  const uint16_t *w, float *dx, void *ws)
{
	return loom_cpu_bf16_native() ? loom_cpu_conv2d_bwd_data_bf16_native(s, dy, w, dx, ws) :
					-1;
}

int loom_cpu_conv2d_bwd_filter_bf16(const loom_conv_shape *s, const uint16_t *dy,
				    const uint16_t *x, float *dw, void *ws)
{
	return loom_cpu_bf16_native() ? loom_cpu_conv2d_bwd_filter_bf16_native(s, dy, x, dw, ws) :
					-1;
}

int loom_cpu_gemm_bf16f32(int ta, int tb, int m, int n, int k, double alpha,
			  const uint16_t *a, const uint16_t *b, double beta, float *c)
{
	/* oneDNN splits one call over the OpenMP team itself. */
	return loom_cpu_gemm_bf16(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, (float)alpha, a,
				  ta ? m : k, b, tb ? k : n, (float)beta, c, n);
}
