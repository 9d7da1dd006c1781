/*
 * examples/peak.h — the FLOP/s that MFU is measured against: a square
 * matrix product run by loom on this machine at the run's precision (as
 * llm.c measures its own peak), or the user's --peak-flops. Shared by
 * gpt_ddp, resnet50_synthetic and bench_convnet, so that the three print
 * MFU the same way.
 */
#ifndef LOOM_EXAMPLES_PEAK_H
#define LOOM_EXAMPLES_PEAK_H

#include <stddef.h>

#include "loom.h"

/* The product's side: 1024 on the CPU; 8192 on a GPU, where a smaller
 * product is mostly launch and synchronisation (1024^3 measured an H200 at
 * 7 TFLOP/s, and MFU read 600%). dev must be CPU or CUDA, not AUTO. */
int train_peak_side(loom_device dev);

/*
 * FLOP/s of an n^3 product (n = train_peak_side(dev)), the best of five
 * forward runs after one warm-up, in the half type under O1 and above (the
 * level's products run in it) and with tf32 as the run's (0: exact fp32
 * products on a GPU). 0 when the product could not be compiled or run
 * (out of memory): the caller prints MFU as unmeasured.
 */
double train_peak_flops(loom_device dev, loom_opt_level level, loom_dtype half, int tf32);

/* Where the peak came from, for the MFU line: "--peak-flops" when given
 * (given > 0), else "a 8192^3 loom matmul in bf16, measured". */
const char *train_peak_how(char *buf, size_t len, double given, loom_device dev,
			   loom_opt_level level, loom_dtype half);

/* MFU in percent: flop_per_s achieved against peak; 0 when peak is 0. */
double train_mfu(double flop_per_s, double peak);

#endif /* LOOM_EXAMPLES_PEAK_H */
