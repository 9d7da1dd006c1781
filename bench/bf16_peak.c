/*
 * bench/bf16_peak.c — the machine's peak multiply-add rate: fp32 FMA (512-bit
 * vfmadd231ps with AVX-512, 256-bit with AVX2) and bf16 dot products
 * (vdpbf16ps, avx512_bf16 only), on one core and on every core at once, with
 * the CPU's name, family, model and the flags that decide the kernels.
 * The loops are engine/cpu/peak.c's (loom weighs native bf16 with them at
 * start-up): the ceiling that bench/yardstick.sh divides each workload's
 * achieved FLOP/s by.
 *   bf16_peak [rounds] [threads]     (defaults 3, all cores); best round kept
 * The last line, "peak: fp32 X GFLOP/s on T threads (...), bf16 Y", is for
 * scripts (Y is "none" where the CPU has no avx512_bf16); X is the larger of
 * the best one-thread rate times T and the best rate of T threads together.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/cpu/peak.h"

#define ITERS 25000000L

typedef struct job {
	loom_cpu_peak kind;
	double rate;
	float sink;
} job;

static void *job_main(void *arg)
{
	job *j = arg;
	j->rate = loom_cpu_peak_gflops(j->kind, ITERS, &j->sink);
	return NULL;
}

/* The summed rate of kind k on n threads started together. */
static double rate_on(loom_cpu_peak k, int n, float *sink)
{
	job j[64];
	pthread_t t[64];
	if (n > 64)
		n = 64;
	for (int i = 0; i < n; i++) {
		j[i] = (job){ .kind = k };
		if (pthread_create(&t[i], NULL, job_main, &j[i]))
			return 0;
	}
	double sum = 0;
	for (int i = 0; i < n; i++) {
		pthread_join(t[i], NULL);
		sum += j[i].rate;
		*sink += j[i].sink;
	}
	return sum;
}

/* A field of /proc/cpuinfo's first processor ("model name", "cpu family"), or "?". */
static void cpuinfo_field(const char *key, char *out, size_t size)
{
	char line[4096];
	FILE *f = fopen("/proc/cpuinfo", "r");
	snprintf(out, size, "?");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		size_t k = strlen(key);
		char *colon = strchr(line, ':');
		if (!strncmp(line, key, k) && (line[k] == '\t' || line[k] == ' ') && colon) {
			snprintf(out, size, "%s", colon + 2);
			out[strcspn(out, "\n")] = 0;
			break;
		}
	}
	fclose(f);
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 3;
	int threads = argc > 2 ? atoi(argv[2]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
	float sink = 0;
	char name[256], fam[32], model[32];
	if (rounds < 1 || threads < 1) {
		fprintf(stderr, "usage: bf16_peak [rounds >= 1] [threads >= 1]\n");
		return 2;
	}
	__builtin_cpu_init();
	cpuinfo_field("model name", name, sizeof(name));
	cpuinfo_field("cpu family", fam, sizeof(fam));
	cpuinfo_field("model", model, sizeof(model));
	printf("cpu: %s (family %s, model %s), %ld cores online; flags:", name, fam, model,
	       sysconf(_SC_NPROCESSORS_ONLN));
	const struct {
		const char *name;
		int on;
	} flag[] = {
		{ "avx2", __builtin_cpu_supports("avx2") },
		{ "fma", __builtin_cpu_supports("fma") },
		{ "avx512f", __builtin_cpu_supports("avx512f") },
		{ "avx512bw", __builtin_cpu_supports("avx512bw") },
		{ "avx512vl", __builtin_cpu_supports("avx512vl") },
		{ "avx512_bf16", __builtin_cpu_supports("avx512bf16") },
	};
	for (size_t i = 0; i < sizeof(flag) / sizeof(flag[0]); i++)
		printf(" %s%s", flag[i].name, flag[i].on ? "" : "=no");
	printf("\n");
	loom_cpu_peak fp32 = loom_cpu_peak_supported(LOOM_CPU_PEAK_FP32_AVX512) ?
				     LOOM_CPU_PEAK_FP32_AVX512 :
				     LOOM_CPU_PEAK_FP32_AVX2;
	int has_bf16 = loom_cpu_peak_supported(LOOM_CPU_PEAK_BF16_AVX512);
	if (!loom_cpu_peak_supported(fp32)) {
		printf("bf16_peak: this CPU has neither AVX-512 nor AVX2 + FMA; no peak measured\n");
		return 0;
	}
	const char *fp32_insn = fp32 == LOOM_CPU_PEAK_FP32_AVX512 ? "vfmadd231ps zmm" : "vfmadd231ps ymm";
	double best1 = 0, bestn = 0, bf1 = 0, bfn = 0;
	for (int r = 0; r < rounds; r++) {
		double f1 = rate_on(fp32, 1, &sink), fn = rate_on(fp32, threads, &sink);
		printf("round %d: fp32 %s %.1f GFLOP/s on 1 thread, %.1f on %d", r + 1, fp32_insn, f1,
		       fn, threads);
		if (has_bf16) {
			double b1 = rate_on(LOOM_CPU_PEAK_BF16_AVX512, 1, &sink),
			       bn = rate_on(LOOM_CPU_PEAK_BF16_AVX512, threads, &sink);
			printf("; bf16 vdpbf16ps %.1f on 1 thread, %.1f on %d (bf16 / fp32 %.2f)", b1, bn,
			       threads, b1 / f1);
			bf1 = b1 > bf1 ? b1 : bf1;
			bfn = bn > bfn ? bn : bfn;
		}
		printf("\n");
		best1 = f1 > best1 ? f1 : best1;
		bestn = fn > bestn ? fn : bestn;
	}
	if (!has_bf16)
		printf("bf16: this CPU has no avx512_bf16: no native bf16 products; bf16 runs as "
		       "fp32 FMAs after a conversion, so its peak is fp32's at best\n");
	/* On a shared machine the threads run together seldom: the best
	 * one-thread rate times the threads is the limit, unless measuring
	 * them together did better. */
	double pk = best1 * threads > bestn ? best1 * threads : bestn;
	double pkb = bf1 * threads > bfn ? bf1 * threads : bfn;
	printf("peak: fp32 %.1f GFLOP/s on %d threads (best on 1 thread %.1f, on %d together %.1f), "
	       "bf16 ",
	       pk, threads, best1, threads, bestn);
	if (has_bf16)
		printf("%.1f GFLOP/s on %d threads (best on 1 thread %.1f, on %d together %.1f)\n", pkb,
		       threads, bf1, threads, bfn);
	else
		printf("none\n");
	return sink == 1234.5f; /* keeps the sums alive */
}
