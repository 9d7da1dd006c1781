/*
 * engine/cpu/peak.h — the core's peak multiply-add rate, measured by a
 * register-only loop: what cpu_path.c weighs native bf16 against fp32 with
 * at start-up, and what bench/bf16_peak reports as the machine's limit.
 */
#ifndef LOOM_ENGINE_CPU_PEAK_H
#define LOOM_ENGINE_CPU_PEAK_H

typedef enum loom_cpu_peak {
	LOOM_CPU_PEAK_FP32_AVX2,   /* vfmadd231ps ymm: 8 lanes, 2 FLOP each */
	LOOM_CPU_PEAK_FP32_AVX512, /* vfmadd231ps zmm: 16 lanes, 2 FLOP each */
	LOOM_CPU_PEAK_BF16_AVX512, /* vdpbf16ps zmm: 16 lanes, 2 products each */
} loom_cpu_peak;

/* Can this CPU (and its OS) run kind k? */
int loom_cpu_peak_supported(loom_cpu_peak k);

/*
 * GFLOP/s of iters rounds of 12 independent multiply-adds of kind k on the
 * calling thread (0 where the CPU lacks the instructions). The sums go to
 * *sink, so that the loop cannot be dropped.
 */
double loom_cpu_peak_gflops(loom_cpu_peak k, long iters, float *sink);

#endif /* LOOM_ENGINE_CPU_PEAK_H */
