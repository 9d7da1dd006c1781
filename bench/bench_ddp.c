/*
 * bench/bench_ddp.c — the ConvNet trained data-parallel (start it under
 * mpirun, or alone for 1 rank) at a fixed global batch: images/s over timed
 * steps, then a traced run (loom_trace_start) from which rank 0 reads back
 * the time each step spends in all-reduces and how much of it lies before
 * backward ends (hidden behind backward), the rest waited for before the
 * optimizer. bench/ddp_overlap.sh runs it at 1 and 2 ranks.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "bench/trace_json.h"
#include "comm/comm.h"
#include "examples/models.h"
#include "loom.h"

/* Per TRAIN run and rank, from the trace (microseconds): the step, the
 * all-reduces (sum of their spans, which overlap one another), the part of
 * each before backward ended, the time at least one was in flight (the
 * union of the spans) and its part before backward ended, and the wait
 * before the optimizer; averaged over every run and rank. */
typedef struct figures {
	double step, comm, hidden, flight, flight_hidden, wait;
	int buckets, samples;
} figures;

/* The length of the union of n intervals [a[i], b[i]) clipped to end. */
static double union_len(double *a, double *b, int n, double end)
{
	double total = 0, lo = 0, hi = -1;
	for (int i = 0; i < n; i++) /* sort by start; n is a few buckets */
		for (int j = i + 1; j < n; j++)
			if (a[j] < a[i]) {
				double t = a[i];
				a[i] = a[j], a[j] = t;
				t = b[i], b[i] = b[j], b[j] = t;
			}
	for (int i = 0; i < n; i++) {
		double x = a[i], y = fmin(b[i], end);
		if (y <= x)
			continue;
		if (hi < lo || x > hi) {
			total += hi > lo ? hi - lo : 0;
			lo = x, hi = y;
		} else if (y > hi) {
			hi = y;
		}
	}
	return total + (hi > lo ? hi - lo : 0);
}

static int read_trace(const char *path, int world, figures *f)
{
	loom_tj t;
	char err[256];
	memset(f, 0, sizeof(*f));
	if (loom_tj_load(path, &t, err, sizeof(err))) {
		fprintf(stderr, "bench_ddp: %s: %s\n", path, err);
		return 1;
	}
	for (int i = 0; i < t.n; i++)
		if (t.ev[i].bucket + 1 > f->buckets && !strncmp(t.ev[i].name, "allreduce", 9))
			f->buckets = t.ev[i].bucket + 1;
	for (int i = 0; i < t.n; i++) {
		const loom_tj_event *run = &t.ev[i];
		if (strcmp(run->cat, "run") || strncmp(run->name, "train", 5) || run->pid >= world)
			continue;
		double bwd_end = 0;
		for (int j = 0; j < t.n; j++)
			if (t.ev[j].pid == run->pid && t.ev[j].run == run->run &&
			    !strcmp(t.ev[j].cat, "phase") && !strcmp(t.ev[j].name, "backward"))
				bwd_end = t.ev[j].ts + t.ev[j].dur;
		f->step += run->dur;
		double a[64], b[64], a2[64], b2[64];
		int n = 0;
		for (int j = 0; j < t.n; j++) {
			const loom_tj_event *e = &t.ev[j];
			if (e->pid != run->pid || e->run != run->run)
				continue;
			if (!strncmp(e->name, "allreduce bucket", 16)) {
				f->comm += e->dur;
				f->hidden += fmax(0, fmin(e->ts + e->dur, bwd_end) - e->ts);
				if (n < 64) {
					a[n] = a2[n] = e->ts;
					b[n] = b2[n] = e->ts + e->dur;
					n++;
				}
			} else if (!strcmp(e->name, "wait for all-reduces")) {
				f->wait += e->dur;
			}
		}
		f->flight += union_len(a, b, n, 1e300);
		f->flight_hidden += union_len(a2, b2, n, bwd_end);
		f->samples++;
	}
	loom_tj_free(&t);
	if (f->samples) {
		f->step /= f->samples;
		f->comm /= f->samples;
		f->hidden /= f->samples;
		f->flight /= f->samples;
		f->flight_hidden /= f->samples;
		f->wait /= f->samples;
	}
	return 0;
}

int main(int argc, char **argv)
{
	int global = 100, steps = 40, warmup = 5, traced = 10, rc = 0;
	double cap = 25, first = 1;
	const char *trace = "bench_ddp_trace.json";
	if (bench_args(argc, argv,
		       "usage: bench_ddp [--batch-size GLOBAL] [--steps N] [--warmup N] "
		       "[--traced-steps N] [--bucket-cap-mb X] [--first-bucket-mb X] "
		       "[--trace FILE]   (under mpirun for several ranks)",
		       "--batch-size=%d --steps=%d --warmup=%d --traced-steps=%d --bucket-cap-mb=%f "
		       "--first-bucket-mb=%f --trace=%s",
		       &global, &steps, &warmup, &traced, &cap, &first, &trace))
		return 2;
	loom_pg *pg = NULL;
	if (loom_pg_init(NULL, &pg) != LOOM_OK) {
		fprintf(stderr, "bench_ddp: %s\n", loom_pg_error(pg));
		return 1;
	}
	int rank = loom_pg_get_info(pg)->rank, world = loom_pg_get_info(pg)->world;
	int b = global / world;
	if (steps < 1 || traced < 1 || b < 1 || b * world != global) {
		fprintf(stderr, "bench_ddp: the global batch %d must split evenly over %d ranks\n",
			global, world);
		loom_pg_free(pg);
		return 2;
	}
	loom_graph *g;
	loom_program *p = NULL;
	loom_graph_new(&g);
	loom_value loss = loom_model_convnet(g, b, NULL);
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim.momentum = 0.9;
	o.pg = pg;
	o.bucket_cap_mb = cap;
	o.first_bucket_mb = first;
	if (loom_compile(g, loss, &o, &p) != LOOM_OK) {
		fprintf(stderr, "bench_ddp: rank %d: %s\n", rank, loom_last_error());
		rc = 1;
		goto out;
	}
	float *img = malloc(sizeof(float) * b * 784);
	int32_t *lab = malloc(sizeof(int32_t) * b);
	srand(1 + rank);
	for (int i = 0; i < b * 784; i++)
		img[i] = (float)rand() / RAND_MAX * 2 - 1;
	for (int i = 0; i < b; i++)
		lab[i] = rand() % 10;
	double *dt = malloc(sizeof(double) * steps);
	for (int s = 0; s < warmup + steps + traced && !rc; s++) {
		if (s == warmup + steps && loom_trace_start(p, trace) != LOOM_OK)
			rc = 1;
		double t0 = bench_now();
		if (rc || loom_set_input(p, "image", img, LOOM_F32, (size_t)b * 784) ||
		    loom_set_input(p, "label", lab, LOOM_I32, b) || loom_run(p, LOOM_RUN_TRAIN))
			rc = 1;
		if (s >= warmup && s < warmup + steps)
			dt[s - warmup] = bench_now() - t0;
	}
	if (!rc && loom_trace_stop(p) != LOOM_OK)
		rc = 1;
	if (rc)
		fprintf(stderr, "bench_ddp: rank %d: %s\n", rank, loom_program_error(p));
	figures f;
	if (!rc && rank == 0 && !(rc = read_trace(trace, world, &f))) {
		qsort(dt, steps, sizeof(double), bench_cmp_double);
		const char *th = getenv("OMP_NUM_THREADS");
		printf("| %d x %s | %d | %g / %g | %d | %.0f | %.1f | %.1f | %.1f (%.0f%%) | %.1f | "
		       "%.1f (%.0f%%) | %.1f |\n",
		       world, th ? th : "?", b, first, cap, f.buckets, global / dt[steps / 2],
		       f.step / 1e3, f.comm / 1e3, f.hidden / 1e3,
		       f.comm > 0 ? 100 * f.hidden / f.comm : 0, f.flight / 1e3, f.flight_hidden / 1e3,
		       f.flight > 0 ? 100 * f.flight_hidden / f.flight : 0, f.wait / 1e3);
	}
	free(dt);
	free(img);
	free(lab);
out:
	loom_program_free(p);
	loom_graph_free(g);
	loom_pg_free(pg);
	return rc;
}
