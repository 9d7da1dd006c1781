/*
 * bench/bench_resnet.c — ResNet-18/34/50 training steps on synthetic data
 * (random images and labels: the loader is not what is measured): the plan's
 * memory, known before step 1, and per opt level images/s (wall and per
 * CPU-second), the process's peak memory, the products' FLOPs per image
 * counted from the plan and the FLOP/s they make.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "examples/models.h"
#include "loom.h"

static loom_dtype half = LOOM_F16;
static int no_fusion; /* --no-fusion: the planner's fusions off, to measure them */
static const char *trace_path; /* --trace FILE: a Chrome trace of the timed steps */

static int run(int depth, int b, int size, loom_opt_level level, loom_device dev, int warmup,
	       int steps)
{
	loom_graph *g;
	loom_program *p;
	if (loom_graph_new(&g) != LOOM_OK)
		return 1;
	loom_value loss = loom_model_resnet(g, depth, b, size, size <= 64 ? 10 : 1000, NULL);
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = dev;
	o.optim.lr = 0.1;
	o.optim.momentum = 0.9;
	o.optim.weight_decay = 1e-4;
	o.amp.level = level;
	o.amp.half = half;
	o.no_fusion = no_fusion;
	double tc = bench_now();
	if (loom_compile(g, loss, &o, &p) != LOOM_OK) {
		fprintf(stderr, "bench_resnet: %s\n", loom_last_error());
		loom_graph_free(g);
		return 1;
	}
	tc = bench_now() - tc;
	size_t ni = (size_t)b * 3 * size * size;
	float *img = malloc(sizeof(float) * ni);
	int32_t *lab = malloc(sizeof(int32_t) * b);
	srand(1);
	for (size_t i = 0; i < ni; i++)
		img[i] = (float)rand() / RAND_MAX * 2 - 1;
	for (int i = 0; i < b; i++)
		lab[i] = rand() % (size <= 64 ? 10 : 1000);
	int rc = 0;
	double t0 = 0, c0 = 0;
	for (int s = 0; s < warmup + steps; s++) {
		if (s == warmup) {
			if (trace_path && loom_trace_start(p, trace_path) != LOOM_OK) {
				fprintf(stderr, "bench_resnet: %s\n", loom_program_error(p));
				rc = 1;
				break;
			}
			t0 = bench_now();
			c0 = bench_cpu_seconds();
		}
		if (loom_set_input(p, "image", img, LOOM_F32, ni) ||
		    loom_set_input(p, "label", lab, LOOM_I32, b) || loom_run(p, LOOM_RUN_TRAIN)) {
			fprintf(stderr, "bench_resnet: %s\n", loom_program_error(p));
			rc = 1;
			break;
		}
	}
	double dt = bench_now() - t0, cpu = bench_cpu_seconds() - c0;
	if (trace_path && !rc && loom_trace_stop(p) != LOOM_OK) {
		fprintf(stderr, "bench_resnet: %s\n", loom_program_error(p));
		rc = 1;
	}
	if (!rc) {
		loom_program_info info;
		loom_program_info_get(p, &info);
		double flops = info.flops_fwd + info.flops_bwd;
		printf("| ResNet-%d | %3d | %3d | O%d%s%s | %-6s | %7.2f | %7.2f | %7.0f | %7.3f | %7.1f | %8.1f | %9.1f | %11.1f | %11.1f | %6.1f |\n",
		       depth, b, size, level,
		       level == LOOM_O0 ? "" : half == LOOM_BF16 ? " bf16" : " fp16",
		       no_fusion ? " unfused" : "", info.backend,
		       steps * (double)b / dt, steps * (double)b / cpu, bench_peak_rss_mib(),
		       flops / b * 1e-9, flops * steps / dt * 1e-9, info.n_param_elems / 1e6, info.param_bytes / 1048576.0,
		       info.activation_bytes / 1048576.0, info.activation_naive_bytes / 1048576.0,
		       tc * 1e3);
	}
	free(img);
	free(lab);
	loom_program_free(p);
	loom_graph_free(g);
	return rc;
}

int main(int argc, char **argv)
{
	int depth = 34, b = 32, size = 32, steps = 5, warmup = 1, bf16 = 0, threads = -1;
	const char *levels = "0", *device = "auto";
	if (bench_args(argc, argv,
		       "usage: bench_resnet [--depth 18|34|50] [--batch-size N] [--size 32|224] "
		       "[--steps N] [--warmup N] [--levels 0123] [--device auto|cpu|cuda] "
		       "[--threads N] [--bf16] [--no-fusion] [--trace FILE.json]",
		       "--depth=%d --batch-size=%d --size=%d --steps=%d --warmup=%d --levels=%s --bf16 "
		       "--trace=%s --no-fusion --threads=%d --device=%s",
		       &depth, &b, &size, &steps, &warmup, &levels, &bf16, &trace_path, &no_fusion,
		       &threads, &device))
		return 2;
	if (bf16)
		half = LOOM_BF16;
	if (threads != -1)
		loom_cpu_set_threads(threads);
	loom_device dev = !strcmp(device, "cpu")  ? LOOM_DEVICE_CPU :
			  !strcmp(device, "cuda") ? LOOM_DEVICE_CUDA :
						    LOOM_DEVICE_AUTO;
	if ((depth != 18 && depth != 34 && depth != 50) || b < 1 || size < 8 || steps < 1 ||
	    warmup < 0) {
		fprintf(stderr, "bench_resnet: depth must be 18, 34 or 50; batch, size and steps positive\n");
		return 2;
	}
	char cpu[128];
	printf("%s\n\n", loom_cpu_describe(cpu, sizeof(cpu)));
	printf("| model | batch | size | level | device | img/s | img/s per CPU-s | peak RSS MiB | GFLOP/img | GFLOP/s | params (M) | params MiB | activations MiB | naive act. MiB | compile ms |\n");
	printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
	int rc = 0;
	for (const char *l = levels; *l; l++)
		if (*l >= '0' && *l <= '3')
			rc |= run(depth, b, size, (loom_opt_level)(*l - '0'), dev, warmup, steps);
	return rc;
}
