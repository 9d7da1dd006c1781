/*
 * examples/peak.c — the peak FLOP/s behind every example's MFU: see peak.h.
 */
#include "examples/peak.h"

#include <stdio.h>
#include <time.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int train_peak_side(loom_device dev)
{
	return dev == LOOM_DEVICE_CUDA ? 8192 : 1024;
}

double train_peak_flops(loom_device dev, loom_opt_level level, loom_dtype half, int tf32)
{
	loom_graph *g = NULL;
	loom_program *p = NULL;
	loom_compile_opts o;
	const int64_t n = train_peak_side(dev);
	int64_t d[2] = { n, n };
	const double flop = 2.0 * (double)n * (double)n * (double)n;
	double best = 0;
	if (loom_graph_new(&g) != LOOM_OK)
		return 0;
	loom_value x = loom_param(g, "a", LOOM_F32, 2, d, LOOM_INIT_ONES, 0);
	loom_value w = loom_param(g, "b", LOOM_F32, 2, d, LOOM_INIT_ONES, 0);
	loom_value y = loom_sum(g, loom_matmul(g, x, w));
	loom_compile_opts_default(&o);
	o.device = dev;
	o.optim.kind = LOOM_OPTIM_NONE;
	o.amp.level = level == LOOM_O0 ? LOOM_O0 : LOOM_O1;
	o.amp.half = half;
	o.no_tf32 = !tf32;
	if (loom_compile(g, y, &o, &p) == LOOM_OK)
		for (int i = 0; i < 6; i++) {
			double t0 = now();
			if (loom_run(p, LOOM_RUN_FORWARD) != LOOM_OK) /* waits for the loss */
				break;
			double dt = now() - t0;
			if (i > 0 && flop / dt > best)
				best = flop / dt;
		}
	loom_program_free(p);
	loom_graph_free(g);
	return best;
}

const char *train_peak_how(char *buf, size_t len, double given, loom_device dev,
			   loom_opt_level level, loom_dtype half)
{
	if (given > 0)
		snprintf(buf, len, "--peak-flops");
	else
		snprintf(buf, len, "a %d^3 loom matmul%s, measured", train_peak_side(dev),
			 level == LOOM_O0 ? "" : half == LOOM_BF16 ? " in bf16" : " in fp16");
	return buf;
}

double train_mfu(double flop_per_s, double peak)
{
	return peak > 0 ? 100.0 * flop_per_s / peak : 0;
}
