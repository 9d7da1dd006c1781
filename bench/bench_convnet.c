/*
 * bench/bench_convnet.c — training throughput and planned memory of the
 * ConvNet (batch 100, 28x28) for each opt level: warm-up steps, then timed
 * steps on fixed random batches (data loading is not what is measured), or
 * with --loader own|into on a loader's batches, converted into the bench's
 * buffers and copied by loom_set_input, or straight into the program's.
 * Prints one table row per level with the throughput of the median step (this
 * shared 2-core machine is noisy; the median resists it) and of the mean;
 * bench/run_convnet.sh puts PyTorch beside it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "examples/models.h"
#include "examples/peak.h"
#include "loom.h"
#include "loom_data.h"

static int no_fusion;
/* --peak-flops: the FLOP/s MFU is measured against; 0: a loom matmul at
 * each level's precision, measured after its timed steps (examples/peak.h),
 * the full-precision one and the half one once each. */
static double peak_flops, peak_measured[2];
static int no_cuda_graph;
/* --loader own|into: each step's batch converted by a loader from bytes
 * (synthetic Fashion-MNIST-shaped images), into the bench's own buffers and
 * then loom_set_input (own), or straight into the program's input buffers
 * (into: loom_input_buffer, the pinned slot under LOOM_CUDA_UPLOAD=graph);
 * 0: fixed random batches through loom_set_input. */
enum { FEED_FIXED, FEED_OWN, FEED_INTO };
static int feed = FEED_FIXED;
static char input_note[4][160];

/* Batch s of the loader into the program: own buffers + set_input, or
 * straight into its input buffers. */
static int feed_loader(loom_program *p, loom_loader *l, int64_t s, float *img, int32_t *lab)
{
	int64_t nb = loom_loader_num_batches(l);
	int count, b = loom_loader_batch_size(l);
	if (feed == FEED_INTO) {
		void *pi, *pl;
		if (loom_input_buffer(p, "image", LOOM_F32, (size_t)b * 784, &pi) ||
		    loom_input_buffer(p, "label", LOOM_I32, (size_t)b, &pl))
			return 1;
		img = pi;
		lab = pl;
	}
	if (loom_loader_get(l, s % nb, img, lab, &count) != LOOM_OK) {
		fprintf(stderr, "bench_convnet: %s\n", loom_loader_error(l));
		return 1;
	}
	if (feed == FEED_INTO)
		return loom_input_commit(p, "image") || loom_input_commit(p, "label");
	return loom_set_input(p, "image", img, LOOM_F32, (size_t)b * 784) ||
	       loom_set_input(p, "label", lab, LOOM_I32, b);
}
/* Each level's launch counters, printed under the table. */
static char launch_note[4][256];

static int bench(loom_opt_level level, loom_dtype half, loom_device dev, int b, int warmup,
		 int steps)
{
	loom_graph *g;
	loom_program *p;
	if (loom_graph_new(&g) != LOOM_OK)
		return 1;
	loom_value loss = loom_model_convnet(g, b, NULL);
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = dev;
	o.optim.momentum = 0.9;
	o.amp.level = level;
	o.amp.half = half;
	o.no_fusion = no_fusion;
	o.cuda_graph = !no_cuda_graph;
	if (loom_compile(g, loss, &o, &p) != LOOM_OK) {
		fprintf(stderr, "bench_convnet: %s\n", loom_last_error());
		loom_graph_free(g);
		return 1;
	}
	float *img = malloc(sizeof(float) * b * 784);
	int32_t *lab = malloc(sizeof(int32_t) * b);
	loom_dataset ds = { 0 };
	loom_sampler *smp = NULL;
	loom_loader *ld = NULL;
	char err[256];
	if (feed != FEED_FIXED &&
	    (loom_synthetic_load(4 * (int64_t)b, 1, 28, 28, 10, 1, &ds, err, sizeof(err)) ||
	     loom_sampler_new(ds.n, 0, 1, 1, 1, 1, &smp, err, sizeof(err)) ||
	     loom_loader_new(&ds, smp, b, 1, LOOM_FASHION_MNIST_MEAN, LOOM_FASHION_MNIST_STD, &ld,
			     err, sizeof(err)))) {
		fprintf(stderr, "bench_convnet: %s\n", err);
		loom_program_free(p);
		loom_graph_free(g);
		return 1;
	}
	srand(1);
	for (int i = 0; i < b * 784; i++)
		img[i] = (float)rand() / RAND_MAX * 2 - 1;
	for (int i = 0; i < b; i++)
		lab[i] = rand() % 10;
	int rc = 0;
	double t0 = 0, c0 = 0, *dt_step = malloc(sizeof(double) * steps);
	for (int s = 0; s < warmup + steps && dt_step; s++) {
		double ts = bench_now();
		if (s == warmup) {
			t0 = ts;
			c0 = bench_cpu_seconds();
		}
		if ((feed != FEED_FIXED ? feed_loader(p, ld, s, img, lab) :
					  loom_set_input(p, "image", img, LOOM_F32, (size_t)b * 784) ||
						  loom_set_input(p, "label", lab, LOOM_I32, b)) ||
		    loom_run(p, LOOM_RUN_TRAIN)) {
			fprintf(stderr, "bench_convnet: %s\n", loom_program_error(p));
			rc = 1;
			break;
		}
		if (s >= warmup)
			dt_step[s - warmup] = bench_now() - ts;
	}
	if (!rc && dt_step) {
		double dt = bench_now() - t0, cpu = bench_cpu_seconds() - c0;
		qsort(dt_step, steps, sizeof(double), bench_cmp_double);
		loom_program_info info;
		loom_program_info_get(p, &info);
		int halved = level != LOOM_O0;
		double peak = peak_flops;
		if (peak <= 0 && !peak_measured[halved])
			peak_measured[halved] = train_peak_flops(
				!strcmp(info.backend, "cuda") ? LOOM_DEVICE_CUDA : LOOM_DEVICE_CPU, level,
				half, 1);
		if (peak <= 0)
			peak = peak_measured[halved];
		printf("| O%d %-4s | %-6s | %8.0f | %8.0f | %9.3f | %9.3f | %9.3f | %9.3f | %11.3f | %8.4f | %8.0f | %7.2f | %6.2f | %5.2f |\n",
		       level, level == LOOM_O0 ? "" : (half == LOOM_BF16 ? "bf16" : "fp16"),
		       info.backend, b / dt_step[steps / 2], steps * (double)b / dt, info.param_bytes / 1048576.0,
		       info.master_bytes / 1048576.0, info.grad_bytes / 1048576.0,
		       info.optim_state_bytes / 1048576.0, info.activation_bytes / 1048576.0,
		       loom_loss(p), steps * (double)b / cpu,
		       (info.flops_fwd + info.flops_bwd) / b * 1e-6,
		       (info.flops_fwd + info.flops_bwd) / dt_step[steps / 2] * 1e-9,
		       train_mfu((info.flops_fwd + info.flops_bwd) / dt_step[steps / 2], peak));
		snprintf(input_note[level], sizeof(input_note[level]),
			 "O%d: input %s, %.0f bytes a step copied by the host", level,
			 feed == FEED_INTO ? "from the loader into the program's buffers" :
			 feed == FEED_OWN ? "from the loader's own buffers, loom_set_input" :
					    "fixed, loom_set_input",
			 (double)info.input_upload_bytes / (warmup + steps));
		if (info.graph_captures || info.host_syncs) /* a backend that counts (CUDA) */
			snprintf(launch_note[level], sizeof(launch_note[level]),
				 "O%d: cuda graph %ld captures, %ld replays%s%s; host syncs %ld, %ld "
				 "inside a step", level, info.graph_captures, info.graph_replays,
				 info.graph_note[0] ? ", off: " : "", info.graph_note, info.host_syncs,
				 info.syncs_in_step);
	}
	free(dt_step);
	free(img);
	free(lab);
	loom_loader_free(ld);
	loom_sampler_free(smp);
	loom_dataset_free(&ds);
	loom_program_free(p);
	loom_graph_free(g);
	return rc;
}

int main(int argc, char **argv)
{
	int steps = 200, warmup = 20, b = 100, bf16 = 0, threads = -1;
	const char *levels = "0123", *device = "auto", *loader = NULL, *peak = NULL;
	static const char usage[] =
		"usage: bench_convnet [--steps N] [--warmup N] [--batch-size N] [--levels 0123] "
		"[--bf16] [--no-fusion] [--no-cuda-graph] [--loader own|into] [--peak-flops X] "
		"[--device auto|cpu|cuda] [--threads N]";
	if (bench_args(argc, argv, usage,
		       "--steps=%d --warmup=%d --batch-size=%d --levels=%s --no-fusion "
		       "--no-cuda-graph --loader=%s --threads=%d --peak-flops=%s --bf16 --device=%s",
		       &steps, &warmup, &b, &levels, &no_fusion, &no_cuda_graph, &loader, &threads,
		       &peak, &bf16, &device))
		return 2;
	if (loader && strcmp(loader, "own") && strcmp(loader, "into")) {
		fprintf(stderr, "%s\n", usage);
		return 2;
	}
	if (loader)
		feed = !strcmp(loader, "own") ? FEED_OWN : FEED_INTO;
	if (threads != -1)
		loom_cpu_set_threads(threads);
	if (peak) {
		char *end;
		peak_flops = strtod(peak, &end);
		if (*end || !(peak_flops >= 0) || !isfinite(peak_flops)) {
			fprintf(stderr, "bench_convnet: --peak-flops expects a number >= 0, got '%s'\n",
				peak);
			return 2;
		}
	}
	loom_dtype half = bf16 ? LOOM_BF16 : LOOM_F16;
	loom_device dev = !strcmp(device, "cpu")  ? LOOM_DEVICE_CPU :
			  !strcmp(device, "cuda") ? LOOM_DEVICE_CUDA :
						    LOOM_DEVICE_AUTO;
	if (steps < 1 || warmup < 0 || b < 1) {
		fprintf(stderr, "bench_convnet: steps, warmup and batch must be positive\n");
		return 2;
	}
	char cpu[128];
	printf("ConvNet training step, batch %d, %d timed steps after %d warm-up; %s\n\n", b,
	       steps, warmup, loom_cpu_describe(cpu, sizeof(cpu)));
	printf("| level   | device | img/s (median step) | img/s (mean) | params MiB | master MiB | grads MiB | optim MiB | activations MiB | last loss | img/s per CPU-s | MFLOP/img | GFLOP/s (median step) | MFU %% |\n");
	printf("| ------- | ------ | -------- | -------- | --------- | --------- | --------- | --------- | ----------- | -------- | -------- | ------- | ------ | ----- |\n");
	int rc = 0;
	for (const char *l = levels; *l; l++)
		if (*l >= '0' && *l <= '3')
			rc |= bench((loom_opt_level)(*l - '0'), half, dev, b, warmup, steps);
	for (int l = 0, said = 0; l < 4; l++)
		if (input_note[l][0])
			printf("%s%s\n", said++ ? "" : "\n", input_note[l]);
	for (int l = 0, said = 0; l < 4; l++)
		if (launch_note[l][0])
			printf("%slaunches %s\n", said++ ? "" : "\n", launch_note[l]);
	return rc;
}
