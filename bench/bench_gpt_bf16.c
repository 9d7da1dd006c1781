/*
 * bench/bench_gpt_bf16.c — the transformer ops on bf16 storage two ways on
 * the same data: backend.c's emulation (every bf16 source widened whole into
 * f32, the f32 kernel, the result rounded whole) and the *_bf16 kernels of
 * engine/cpu's family files (layernorm.c, attention.c, ...), the native
 * path (a block of rows or a batch at a time), in turn, median of the
 * repetitions; the two results are checked to be the same bits. Shapes:
 * gpt_ddp's defaults (batch 8, context 128, width 128, 4 heads, vocabulary
 * 256) and a wider one (4, 256, 768, 12, 4096). Each path's wall time and
 * the process's CPU time (all threads: on a loaded machine, where wall times
 * move with the other processes, the CPU seconds with OMP_NUM_THREADS=1 show
 * the work itself). Usage: bench_gpt_bf16 [reps] (default 30).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/half.h"
#include "bench/bench_util.h"
#include "engine/cpu/kernels.h"
#include "engine/cpu/kernels.h"

enum { LN_FWD, LN_FWD_O1, LN_DX, LN_DGAMMA, ATT0, CE_BWD = ATT0 + 5, EMB_BWD, N_OPS };

static const char *names[N_OPS] = {
	"layernorm (bf16 in/out)", "layernorm (f32 in, bf16 out: O1)", "layernorm dx",
	"layernorm dgamma", "attn_probs", "attn_probs_bwd", "attention", "attention_bwd_probs",
	"attention_bwd_qkv", "softmax_ce_bwd (f32 in, bf16 out)", "embedding_bwd",
};

typedef struct data {
	loom_attn_shape s;
	int vocab;
	int64_t rows, nq, np, ny, nl;
	uint16_t *h[4]; /* bf16 sources (qkv or x, p, dp or dy, dy) */
	float *f[4];    /* f32 sources (and the emulation's widened copies) */
	float *g32, *b32, *fo;
	uint16_t *g16, *b16, *o1, *o2;
	int32_t *ids;
	void *ws;
	size_t ws_bytes;
} data;

static double cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double median(double *t, int n)
{
	qsort(t, n, sizeof(double), bench_cmp_double);
	return t[n / 2];
}

static void widen(const uint16_t *h, float *f, int64_t n)
{
	loom_bf16_to_f32_array(h, f, n);
}

/* One op, emulated (native 0) or native (1), writing bf16 into out. */
static void run(data *d, int op, int native, uint16_t *out)
{
	const loom_attn_shape *s = &d->s;
	const int c = s->c;
	const unsigned all = LOOM_CPU_BF16_SRC(0) | LOOM_CPU_BF16_SRC(1) | LOOM_CPU_BF16_SRC(2) |
			     LOOM_CPU_BF16_OUT;
	float *wf = (float *)d->ws;
	switch (op) {
	case LN_FWD:
	case LN_FWD_O1:
		if (native) {
			if (op == LN_FWD)
				loom_cpu_layernorm_fwd_bf16(d->rows, c, d->h[0], d->g16, d->b16, 1e-5,
							    out, all);
			else
				loom_cpu_layernorm_fwd_bf16(d->rows, c, d->f[0], d->g32, d->b32, 1e-5,
							    out, LOOM_CPU_BF16_OUT);
			return;
		}
		if (op == LN_FWD)
			widen(d->h[0], d->f[0], d->ny);
		loom_cpu_layernorm_fwd_f32(d->rows, c, d->f[0], d->g32, d->b32, 1e-5, d->fo);
		break;
	case LN_DX:
		if (native) {
			loom_cpu_norm_bwd_data_bf16(loom_cpu_layernorm_bwd_data_f32, d->rows, c,
						    d->h[0], d->g16, d->h[2], 1e-5, out, all);
			return;
		}
		widen(d->h[0], d->f[0], d->ny);
		widen(d->h[2], d->f[2], d->ny);
		loom_cpu_layernorm_bwd_data_f32(d->rows, c, d->f[0], d->g32, d->f[2], 1e-5, d->fo);
		break;
	case LN_DGAMMA:
		if (native) {
			loom_cpu_norm_bwd_gamma_bf16(loom_cpu_layernorm_gamma_rows_f32, d->rows, c,
						     d->h[0], d->h[2], 1e-5, out, d->ws,
						     LOOM_CPU_BF16_SRC(0) | LOOM_CPU_BF16_SRC(1) |
							     LOOM_CPU_BF16_OUT);
			return;
		}
		widen(d->h[0], d->f[0], d->ny);
		widen(d->h[2], d->f[2], d->ny);
		loom_cpu_norm_bwd_gamma_f32(loom_cpu_layernorm_gamma_rows_f32, d->rows, c, d->f[0],
					    d->f[2], 1e-5, d->fo, d->ws);
		loom_f32_to_bf16_array(d->fo, out, c);
		return;
	case CE_BWD: {
		float dl = 1;
		if (native) {
			loom_cpu_softmax_ce_bwd_bf16((int)d->rows, d->vocab, d->f[1], d->ids, &dl, out,
						     wf, LOOM_CPU_BF16_OUT);
			return;
		}
		loom_cpu_softmax_ce_bwd_f32((int)d->rows, d->vocab, d->f[1], d->ids, &dl, d->fo);
		loom_f32_to_bf16_array(d->fo, out, d->nl);
		return;
	}
	case EMB_BWD:
		if (native) {
			loom_cpu_embedding_bwd_bf16(d->rows, d->vocab, c, d->ids, d->h[2], out, wf,
						    LOOM_CPU_BF16_SRC(1) | LOOM_CPU_BF16_OUT);
			return;
		}
		widen(d->h[2], d->f[2], d->ny);
		loom_cpu_embedding_bwd_f32(d->rows, d->vocab, c, d->ids, d->f[2], d->fo);
		loom_f32_to_bf16_array(d->fo, out, (int64_t)d->vocab * c);
		return;
	default: { /* attention: sources qkv (h0), p (h1), dp/dy (h2 as p-sized, h3 y-sized) */
		int k = op - ATT0;
		const void *src[3];
		int64_t no;
		switch (k) {
		case LOOM_CPU_ATTN_PROBS_FWD:
			src[0] = d->h[0], no = d->np;
			break;
		case LOOM_CPU_ATTN_PROBS_BWD:
			src[0] = d->h[0], src[1] = d->h[1], src[2] = d->h[2], no = d->nq;
			break;
		case LOOM_CPU_ATTENTION_FWD:
			src[0] = d->h[1], src[1] = d->h[0], no = d->ny;
			break;
		case LOOM_CPU_ATTENTION_BWD_PROBS:
			src[0] = d->h[0], src[1] = d->h[3], no = d->np;
			break;
		default:
			src[0] = d->h[1], src[1] = d->h[3], no = d->nq;
		}
		if (native) {
			loom_cpu_attn_bf16(k, s, src, out, d->ws, d->ws_bytes, all);
			return;
		}
		/* Widen what this kernel reads into f[0..2], as the emulation. */
		float *wq = d->f[0], *wp = d->f[1], *w2 = d->f[2], *wy = d->f[3];
		switch (k) {
		case LOOM_CPU_ATTN_PROBS_FWD:
			widen(d->h[0], wq, d->nq);
			loom_cpu_attn_probs_fwd_f32(s, wq, d->fo);
			break;
		case LOOM_CPU_ATTN_PROBS_BWD:
			widen(d->h[0], wq, d->nq), widen(d->h[1], wp, d->np), widen(d->h[2], w2, d->np);
			loom_cpu_attn_probs_bwd_f32(s, wq, wp, w2, d->fo, d->ws);
			break;
		case LOOM_CPU_ATTENTION_FWD:
			widen(d->h[1], wp, d->np), widen(d->h[0], wq, d->nq);
			loom_cpu_attention_fwd_f32(s, wp, wq, d->fo);
			break;
		case LOOM_CPU_ATTENTION_BWD_PROBS:
			widen(d->h[0], wq, d->nq), widen(d->h[3], wy, d->ny);
			loom_cpu_attention_bwd_probs_f32(s, wq, wy, d->fo);
			break;
		default:
			widen(d->h[1], wp, d->np), widen(d->h[3], wy, d->ny);
			loom_cpu_attention_bwd_qkv_f32(s, wp, wy, d->fo);
		}
		loom_f32_to_bf16_array(d->fo, out, no);
		return;
	}
	}
	loom_f32_to_bf16_array(d->fo, out, d->ny);
}

static int64_t out_elems(const data *d, int op)
{
	switch (op) {
	case LN_DGAMMA:
		return d->s.c;
	case CE_BWD:
		return d->nl;
	case EMB_BWD:
		return (int64_t)d->vocab * d->s.c;
	case ATT0 + LOOM_CPU_ATTN_PROBS_FWD:
	case ATT0 + LOOM_CPU_ATTENTION_BWD_PROBS:
		return d->np;
	case ATT0 + LOOM_CPU_ATTN_PROBS_BWD:
	case ATT0 + LOOM_CPU_ATTENTION_BWD_QKV:
		return d->nq;
	default:
		return d->ny;
	}
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	if (!p) {
		fprintf(stderr, "bench_gpt_bf16: out of memory (%zu bytes)\n", n);
		exit(1);
	}
	return p;
}

static void bench_shape(loom_attn_shape s, int vocab, int reps)
{
	data d = { .s = s, .vocab = vocab };
	d.rows = (int64_t)s.b * s.t;
	d.nq = d.rows * 3 * s.c, d.np = (int64_t)s.b * s.nh * s.t * s.t, d.ny = d.rows * s.c;
	d.nl = d.rows * vocab;
	int64_t big = d.nq > d.np ? d.nq : d.np;
	big = big > d.nl ? big : d.nl;
	for (int i = 0; i < 4; i++) {
		d.h[i] = xmalloc(2 * (size_t)big);
		d.f[i] = xmalloc(4 * (size_t)big);
		for (int64_t j = 0; j < big; j++) {
			d.h[i][j] = loom_f32_to_bf16((float)(((j * 7919 + i * 31) % 1000) / 250.0 - 2));
			d.f[i][j] = loom_bf16_to_f32(d.h[i][j]);
		}
	}
	d.g32 = xmalloc(4 * (size_t)s.c), d.b32 = xmalloc(4 * (size_t)s.c);
	d.g16 = xmalloc(2 * (size_t)s.c), d.b16 = xmalloc(2 * (size_t)s.c);
	for (int j = 0; j < s.c; j++) {
		d.g16[j] = loom_f32_to_bf16(1 + (j % 7) / 20.0f), d.g32[j] = loom_bf16_to_f32(d.g16[j]);
		d.b16[j] = loom_f32_to_bf16((j % 5) / 10.0f), d.b32[j] = loom_bf16_to_f32(d.b16[j]);
	}
	d.fo = xmalloc(4 * (size_t)big);
	d.o1 = xmalloc(2 * (size_t)big), d.o2 = xmalloc(2 * (size_t)big);
	d.ids = xmalloc(4 * (size_t)d.rows);
	for (int64_t i = 0; i < d.rows; i++)
		d.ids[i] = (int32_t)(i * 2654435761u % (unsigned)vocab);
	size_t ws = 0;
	for (int k = LOOM_CPU_ATTN_PROBS_FWD; k <= LOOM_CPU_ATTENTION_BWD_QKV; k++)
		if (ws < loom_cpu_attn_bf16_ws(k, &s))
			ws = loom_cpu_attn_bf16_ws(k, &s);
	if (ws < loom_cpu_norm_bwd_gamma_ws(s.c))
		ws = loom_cpu_norm_bwd_gamma_ws(s.c);
	if (ws < 8 * (size_t)vocab * s.c + 8 * (size_t)vocab)
		ws = 8 * (size_t)vocab * s.c + 8 * (size_t)vocab;
	d.ws = xmalloc(ws);
	d.ws_bytes = ws;
	double *t[4];
	for (int i = 0; i < 4; i++)
		t[i] = xmalloc(sizeof(double) * reps);
	for (int op = 0; op < N_OPS; op++) {
		for (int r = -2; r < reps; r++) { /* two warm-ups, then in turn */
			double w0 = bench_now(), c0 = cpu_now();
			run(&d, op, 0, d.o1);
			double w1 = bench_now(), c1 = cpu_now();
			run(&d, op, 1, d.o2);
			double w2 = bench_now(), c2 = cpu_now();
			if (r >= 0)
				t[0][r] = w1 - w0, t[1][r] = w2 - w1, t[2][r] = c1 - c0, t[3][r] = c2 - c1;
		}
		if (memcmp(d.o1, d.o2, 2 * (size_t)out_elems(&d, op)) != 0) {
			fprintf(stderr, "bench_gpt_bf16: %s: the two paths differ\n", names[op]);
			exit(1);
		}
		double m[4];
		for (int i = 0; i < 4; i++)
			m[i] = median(t[i], reps) * 1e3;
		printf("| b%d t%d c%d h%d v%d | %s | %.3f | %.3f | %.2f | %.3f | %.3f | %.2f |\n", s.b,
		       s.t, s.c, s.nh, vocab, names[op], m[0], m[1], m[0] / m[1], m[2], m[3],
		       m[2] / m[3]);
	}
	for (int i = 0; i < 4; i++)
		free(d.h[i]), free(d.f[i]);
	free(d.g32), free(d.b32), free(d.g16), free(d.b16), free(d.fo), free(d.o1), free(d.o2);
	free(d.ids), free(d.ws);
	for (int i = 0; i < 4; i++)
		free(t[i]);
}

int main(int argc, char **argv)
{
	int reps = argc > 1 ? atoi(argv[1]) : 30;
	if (reps < 1)
		reps = 1;
	printf("| shape | op | emulated ms | native ms | emulated / native | emulated cpu ms | "
	       "native cpu ms | emulated / native (cpu) |\n");
	printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
	bench_shape((loom_attn_shape){ 8, 128, 128, 4 }, 256, reps);
	bench_shape((loom_attn_shape){ 4, 256, 768, 12 }, 4096, reps);
	return 0;
}
