/*
 * bench/bench_ew_bf16.c — the bf16 elementwise ops (add, relu, relu
 * backward, GELU and its backward) two ways on the same data: backend.c's
 * emulation (widen the bf16 sources into f32 arrays, the f32 kernel, round
 * the result) and engine/cpu's fused bf16 kernel (loom_cpu_ew_bf16), in
 * turn, median of the repetitions. Both give the same bits (checked here
 * too). Usage: bench_ew_bf16 [reps] (default 50).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "bench/bench_util.h"
#include "engine/cpu/kernels.h"

static void emulated(int op, int flag, int64_t n, const uint16_t *a, const uint16_t *b,
		     float *fa, float *fb, float *fy, uint16_t *y)
{
	loom_bf16_to_f32_array(a, fa, n);
	if (b)
		loom_bf16_to_f32_array(b, fb, n);
	switch (op) {
	case LOOM_CPU_EW_ADD:
		loom_cpu_add_f32(n, fa, fb, fy);
		break;
	case LOOM_CPU_EW_RELU:
		loom_cpu_relu_fwd_f32(n, fa, fy);
		break;
	case LOOM_CPU_EW_RELU_BWD:
		loom_cpu_relu_bwd_f32(n, fa, fb, fy);
		break;
	default:
		loom_cpu_gelu_f32(n, fa, b ? fb : NULL, flag, fy);
	}
	loom_f32_to_bf16_array(fy, y, n);
}

int main(int argc, char **argv)
{
	int reps = argc > 1 ? atoi(argv[1]) : 50;
	static const struct {
		const char *name;
		int op, two;
	} ops[] = {
		{ "add", LOOM_CPU_EW_ADD, 1 },		{ "relu", LOOM_CPU_EW_RELU, 0 },
		{ "relu_bwd", LOOM_CPU_EW_RELU_BWD, 1 }, { "gelu", LOOM_CPU_EW_GELU, 0 },
		{ "gelu_bwd", LOOM_CPU_EW_GELU, 1 },
	};
	const int64_t sizes[] = { 131072, 524288, 3211264 };
	if (reps < 1)
		reps = 1;
	printf("| op | elements | emulated ms | fused ms | emulated / fused |\n");
	printf("| --- | --- | --- | --- | --- |\n");
	for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		int64_t n = sizes[s];
		uint16_t *a = malloc(2 * n), *b = malloc(2 * n), *y1 = malloc(2 * n),
			 *y2 = malloc(2 * n);
		float *fa = malloc(4 * n), *fb = malloc(4 * n), *fy = malloc(4 * n);
		double *t1 = malloc(sizeof(double) * reps), *t2 = malloc(sizeof(double) * reps);
		if (!a || !b || !y1 || !y2 || !fa || !fb || !fy || !t1 || !t2) {
			fprintf(stderr, "bench_ew_bf16: out of memory at %lld elements\n",
				(long long)n);
			return 1;
		}
		for (int64_t i = 0; i < n; i++) {
			a[i] = loom_f32_to_bf16((float)((i * 7919 % 1000) / 250.0 - 2));
			b[i] = loom_f32_to_bf16((float)((i * 104729 % 1000) / 500.0 - 1));
		}
		for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++) {
			const uint16_t *bb = ops[o].two ? b : NULL;
			for (int r = -2; r < reps; r++) { /* two warm-ups, then in turn */
				double t0 = bench_now();
				emulated(ops[o].op, 0, n, a, bb, fa, fb, fy, y1);
				double t = bench_now();
				loom_cpu_ew_bf16(ops[o].op, 0, n, a, bb, y2);
				double t3 = bench_now();
				if (r >= 0)
					t1[r] = t - t0, t2[r] = t3 - t;
			}
			if (memcmp(y1, y2, 2 * n) != 0) {
				fprintf(stderr, "bench_ew_bf16: %s: the two paths differ\n",
					ops[o].name);
				return 1;
			}
			qsort(t1, reps, sizeof(double), bench_cmp_double);
			qsort(t2, reps, sizeof(double), bench_cmp_double);
			printf("| %s | %lld | %.3f | %.3f | %.2f |\n", ops[o].name, (long long)n,
			       t1[reps / 2] * 1e3, t2[reps / 2] * 1e3, t1[reps / 2] / t2[reps / 2]);
		}
		free(a), free(b), free(y1), free(y2), free(fa), free(fb), free(fy), free(t1),
			free(t2);
	}
	return 0;
}
