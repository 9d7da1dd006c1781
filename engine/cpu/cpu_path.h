/*
 * engine/cpu/cpu_path.h — which matrix-product path the CPU kernels take on
 * this machine, chosen once from the CPU's features (cpuid), never from its
 * model name, and the GEMM entry points that follow that choice.
 */
#ifndef LOOM_ENGINE_CPU_PATH_H
#define LOOM_ENGINE_CPU_PATH_H

#include <stdint.h>

/* Ordered: each path needs every feature of the ones before it. */
typedef enum loom_cpu_isa {
	LOOM_CPU_ISA_PORTABLE,    /* OpenBLAS, whatever kernels it picks */
	LOOM_CPU_ISA_AVX2,        /* oneDNN JIT kernels for AVX2 + FMA */
	LOOM_CPU_ISA_AVX512,      /* oneDNN JIT kernels for AVX-512 (F, BW, VL, DQ) */
	LOOM_CPU_ISA_AVX512_BF16, /* the same, plus vdpbf16ps for bf16 products */
} loom_cpu_isa;

/*
 * The path in use: the best the CPU supports, capped by the environment
 * variable LOOM_CPU_ISA (portable, avx2, avx512, avx512_bf16) if set, so
 * that tests can force a lower path. Decided on the first call, which also
 * caps oneDNN's own choice to match; later calls return the same answer.
 */
loom_cpu_isa loom_cpu_isa_get(void);
const char *loom_cpu_isa_name(loom_cpu_isa isa);

/*
 * Whether bf16 products run natively (vdpbf16ps, fp32 accumulation) rather
 * than in loom's exact emulation: chosen with the path, on CPUs with
 * avx512_bf16 only, from the measured ratio of the core's bf16 dot-product
 * rate to its fp32 FMA rate (native at 1.5x or more), unless LOOM_CPU_BF16
 * is "native" or "emulate". loom_cpu_describe prints the choice and why.
 */
int loom_cpu_bf16_use_native(void);
/* That ratio as measured at start-up; 0 where not measured (no avx512_bf16). */
double loom_cpu_bf16_measured_ratio(void);

/* The best path this CPU supports, ignoring LOOM_CPU_ISA. */
loom_cpu_isa loom_cpu_isa_detect(void);

/*
 * Row-major C[m, n] = alpha op(A) op(B) + beta C (op = transpose when ta/tb
 * is 't' or 'T'), on the chosen path. Runs single-threaded when called from
 * inside a parallel region, on the caller's threads otherwise.
 */
void loom_cpu_sgemm(char ta, char tb, int m, int n, int k, float alpha, const float *a,
		    int lda, const float *b, int ldb, float beta, float *c, int ldc);

/*
 * The same with bf16 A and B (raw uint16 bit patterns) and fp32 accumulation
 * and C, beta 0 or 1, on oneDNN's matmul primitive (one per shape, made at
 * its first call and kept). Only on LOOM_CPU_ISA_AVX512_BF16; returns -1
 * (and does nothing) on any other path or beta.
 */
int loom_cpu_gemm_bf16(char ta, char tb, int m, int n, int k, float alpha,
		       const uint16_t *a, int lda, const uint16_t *b, int ldb, float beta,
		       float *c, int ldc);

/*
 * How libgomp's threads wait between regions. By default a parked team keeps
 * them on libgomp's short spin all the time (cpu_path.c says why);
 * LOOM_CPU_SPIN=step lets that team go while a plan runs, so that the
 * threads spin from one region to the next across a step instead of
 * sleeping after each, and parks it again at the end. The backend calls
 * begin at each run's start and end at its end (runs of several programs
 * may overlap: the team is parked again when the last ends). Neither
 * changes how work is split (the same bits); both do nothing by default.
 */
void loom_cpu_spin_step_begin(void);
void loom_cpu_spin_step_end(void);
/* "step" (LOOM_CPU_SPIN=step) or "throttled" (the default). */
const char *loom_cpu_spin_mode(void);
/* Whether the threads are on the short spin now (always, by default; with
 * LOOM_CPU_SPIN=step, when no run is in progress). */
int loom_cpu_spin_parked(void);

#endif /* LOOM_ENGINE_CPU_PATH_H */
