/*
 * bench/bench_conv.c — one convolution layer at a time, each direction on
 * each CPU candidate side by side: loom's im2col + GEMM kernels, and oneDNN's
 * convolution primitives on NCHW or in their own (blocked) layouts with the
 * reorders counted, in f32 and in bf16 (sources bf16, results f32).
 *   bench_conv [--reps N] [--set convnet|resnet18|resnet50|resnet50-1x1] [--batch B]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "base/half.h"
#include "engine/cpu/conv_dnnl.h"
#include "engine/cpu/cpu_path.h"
#include "engine/cpu/kernels.h"
#include "loom.h"

typedef struct bufs {
	float *x, *w, *b, *y, *dx, *dw;
	uint16_t *xh, *wh, *yh;
	void *ws;
} bufs;

enum { C_LOOM_F, C_DNNL_F, C_DNNL_FB, C_LOOM_H, C_DNNL_H, C_DNNL_HB, NCAND };
static const char *cand_name[NCAND] = { "loom im2col f32", "onednn nchw f32",
					"onednn blocked f32", "loom im2col bf16",
					"onednn nchw bf16", "onednn blocked bf16" };

/* One run of one direction on one candidate (c: its primitive, or NULL for
 * loom's kernels); nonzero if it failed. */
static int run_one(int cand, loom_cpu_dnnl_conv *c, void *dws, loom_cpu_conv_kind kind,
		   const loom_conv_shape *s, bufs *m)
{
	int bf16 = cand >= C_LOOM_H;
	if (c) {
		const void *a = kind == LOOM_CPU_CONV_FWD ? (bf16 ? (void *)m->xh : m->x) :
							    (bf16 ? (void *)m->yh : m->y);
		const void *b = kind == LOOM_CPU_CONV_BWD_FILTER ? (bf16 ? (void *)m->xh : m->x) :
								   (bf16 ? (void *)m->wh : m->w);
		float *o = kind == LOOM_CPU_CONV_FWD ? m->y :
			   kind == LOOM_CPU_CONV_BWD_DATA ? m->dx : m->dw;
		return loom_cpu_dnnl_conv_run(c, a, b, m->b, o, dws);
	}
	if (!bf16) {
		if (kind == LOOM_CPU_CONV_FWD)
			loom_cpu_conv2d_fwd_f32(s, m->x, m->w, m->b, m->y, m->ws);
		else if (kind == LOOM_CPU_CONV_BWD_DATA)
			loom_cpu_conv2d_bwd_data_f32(s, m->y, m->w, m->dx, m->ws);
		else
			loom_cpu_conv2d_bwd_filter_f32(s, m->y, m->x, m->dw, m->ws);
		return 0;
	}
	if (kind == LOOM_CPU_CONV_FWD)
		return loom_cpu_conv2d_fwd_bf16(s, m->xh, m->wh, m->b, m->y, m->ws);
	if (kind == LOOM_CPU_CONV_BWD_DATA)
		return loom_cpu_conv2d_bwd_data_bf16(s, m->yh, m->wh, m->dx, m->ws);
	return loom_cpu_conv2d_bwd_filter_bf16(s, m->yh, m->xh, m->dw, m->ws);
}

/* All candidates of one direction, interleaved run by run so that each sees
 * the same state of a shared machine; prints "median / min" ms of each. */
static void time_all(loom_cpu_conv_kind kind, const loom_conv_shape *s, bufs *m, int reps)
{
	loom_cpu_dnnl_conv *c[NCAND] = { 0 };
	void *dws[NCAND] = { 0 };
	int ok[NCAND];
	double *t[NCAND];
	for (int k = 0; k < NCAND; k++) {
		int bf16 = k >= C_LOOM_H;
		ok[k] = 1;
		t[k] = malloc(sizeof(double) * reps);
		if (k == C_LOOM_H) {
			ok[k] = loom_cpu_bf16_native();
		} else if (k != C_LOOM_F) {
			c[k] = loom_cpu_dnnl_conv_new(kind, s, bf16, kind == LOOM_CPU_CONV_FWD,
						      k == C_DNNL_FB || k == C_DNNL_HB);
			ok[k] = c[k] != NULL;
			if (c[k])
				dws[k] = aligned_alloc(64, loom_cpu_dnnl_conv_ws(c[k]) + 64);
		}
	}
	for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
		for (int k = 0; k < NCAND; k++) {
			if (!ok[k])
				continue;
			double t0 = bench_now();
			if (run_one(k, c[k], dws[k], kind, s, m))
				ok[k] = 0;
			if (r >= 0)
				t[k][r] = (bench_now() - t0) * 1e3;
		}
	}
	for (int k = 0; k < NCAND; k++) {
		if (ok[k]) {
			qsort(t[k], reps, sizeof(double), bench_cmp_double);
			printf(" %.2f / %.2f |", t[k][reps / 2], t[k][0]);
		} else {
			printf(" - |");
		}
	}
	printf(" %s / %s / %s / %s |\n", c[C_DNNL_F] ? loom_cpu_dnnl_conv_impl(c[C_DNNL_F]) : "-",
	       c[C_DNNL_FB] ? loom_cpu_dnnl_conv_impl(c[C_DNNL_FB]) : "-",
	       c[C_DNNL_H] ? loom_cpu_dnnl_conv_impl(c[C_DNNL_H]) : "-",
	       c[C_DNNL_HB] ? loom_cpu_dnnl_conv_impl(c[C_DNNL_HB]) : "-");
	for (int k = 0; k < NCAND; k++) {
		loom_cpu_dnnl_conv_free(c[k]);
		free(dws[k]);
		free(t[k]);
	}
}

static float *rnd(size_t n)
{
	float *p = malloc(sizeof(float) * n);
	for (size_t i = 0; i < n; i++)
		p[i] = (float)rand() / RAND_MAX - 0.5f;
	return p;
}

static uint16_t *half_of(const float *x, size_t n)
{
	uint16_t *h = malloc(2 * n);
	loom_f32_to_bf16_array(x, h, n);
	return h;
}

static void layer(const char *name, int n, int ci, int hw, int co, int k, int stride, int pad,
		  int reps)
{
	loom_conv_shape s = { n, ci, hw, hw, co, k, k, stride, pad, 0, 0 };
	s.h_out = (hw + 2 * pad - k) / stride + 1;
	s.w_out = s.h_out;
	size_t nx = (size_t)n * ci * hw * hw, nw = (size_t)co * ci * k * k;
	size_t ny = (size_t)n * co * s.h_out * s.w_out;
	bufs m = { rnd(nx), rnd(nw), rnd(co), rnd(ny), rnd(nx), rnd(nw) };
	m.xh = half_of(m.x, nx);
	m.wh = half_of(m.w, nw);
	m.yh = half_of(m.y, ny);
	m.ws = aligned_alloc(64, (loom_cpu_conv2d_workspace(&s, 4) + 63) & ~(size_t)63);
	static const char *dir[] = { "fwd", "bwd data", "bwd filter" };
	for (int kind = 0; kind < 3; kind++) {
		printf("| %s %dx%dx%d->%d k%d s%d | %s |", name, ci, hw, hw, co, k, stride,
		       dir[kind]);
		time_all(kind, &s, &m, reps);
		fflush(stdout);
	}
	free(m.x), free(m.w), free(m.b), free(m.y), free(m.dx), free(m.dw);
	free(m.xh), free(m.wh), free(m.yh), free(m.ws);
}

/* The layers of each --set (input channels, side, output channels, kernel,
 * stride, pad): a small ConvNet's, ResNet-18's at 32x32, ResNet-50's
 * pointwise layers past stage 1 (where the channels grow and the images
 * shrink) and strided shortcuts, and ResNet-50's at 224x224. */
typedef struct conv_layer {
	const char *set, *name;
	int ci, hw, co, k, stride, pad;
} conv_layer;

static const conv_layer layers[] = {
	{ "convnet", "conv1", 1, 28, 16, 5, 1, 2 },
	{ "convnet", "conv2", 16, 14, 32, 5, 1, 2 },
	{ "resnet18", "stem", 3, 32, 64, 3, 1, 1 },
	{ "resnet18", "l1", 64, 32, 64, 3, 1, 1 },
	{ "resnet18", "l2a", 64, 32, 128, 3, 2, 1 },
	{ "resnet18", "l2sc", 64, 32, 128, 1, 2, 0 },
	{ "resnet18", "l2", 128, 16, 128, 3, 1, 1 },
	{ "resnet18", "l3", 256, 8, 256, 3, 1, 1 },
	{ "resnet18", "l4", 512, 4, 512, 3, 1, 1 },
	{ "resnet50-1x1", "l2 1x1 in", 512, 28, 128, 1, 1, 0 },
	{ "resnet50-1x1", "l2 1x1 up", 128, 28, 512, 1, 1, 0 },
	{ "resnet50-1x1", "l3 1x1 in", 1024, 14, 256, 1, 1, 0 },
	{ "resnet50-1x1", "l3 1x1 up", 256, 14, 1024, 1, 1, 0 },
	{ "resnet50-1x1", "l4 1x1 in", 2048, 7, 512, 1, 1, 0 },
	{ "resnet50-1x1", "l3 shortcut", 512, 28, 1024, 1, 2, 0 },
	{ "resnet50", "stem", 3, 224, 64, 7, 2, 3 },
	{ "resnet50", "l1 1x1", 64, 56, 64, 1, 1, 0 },
	{ "resnet50", "l1 3x3", 64, 56, 64, 3, 1, 1 },
	{ "resnet50", "l1 1x1 up", 64, 56, 256, 1, 1, 0 },
	{ "resnet50", "l3 3x3", 256, 14, 256, 3, 1, 1 },
	{ "resnet50", "l4 1x1", 512, 7, 2048, 1, 1, 0 },
};

/* Each set's batch when --batch is not given; another name runs resnet50. */
static const struct {
	const char *set;
	int batch;
} sets[] = {
	{ "convnet", 100 },
	{ "resnet18", 32 },
	{ "resnet50-1x1", 16 },
	{ "resnet50", 16 },
};

int main(int argc, char **argv)
{
	int reps = 20, batch = 0;
	const char *set = "convnet";
	int threads = -1;
	if (bench_args(argc, argv,
		       "usage: bench_conv [--reps N] [--set convnet|resnet18|resnet50|resnet50-1x1] "
		       "[--batch B] [--threads N]",
		       "--reps=%d --set=%s --batch=%d --threads=%d", &reps, &set, &batch, &threads))
		return 2;
	if (threads != -1)
		loom_cpu_set_threads(threads);
	char buf[128];
	printf("%s; %d timed runs each, interleaved; ms, median / fastest\n\n", loom_cpu_describe(buf, sizeof(buf)),
	       reps);
	printf("| layer | direction |");
	for (int c = 0; c < NCAND; c++)
		printf(" %s |", cand_name[c]);
	printf(" oneDNN implementations |\n|---|---|");
	for (int c = 0; c <= NCAND; c++)
		printf("---|");
	printf("\n");
	size_t si = 0;
	while (si + 1 < sizeof(sets) / sizeof(sets[0]) && strcmp(set, sets[si].set))
		si++;
	int b = batch ? batch : sets[si].batch;
	for (size_t i = 0; i < sizeof(layers) / sizeof(layers[0]); i++) {
		const conv_layer *l = &layers[i];
		if (!strcmp(l->set, sets[si].set))
			layer(l->name, b, l->ci, l->hw, l->co, l->k, l->stride, l->pad, reps);
	}
	return 0;
}
