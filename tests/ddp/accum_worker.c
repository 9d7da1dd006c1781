/*
 * tests/ddp/accum_worker.c — one rank of the gradient accumulation and
 * trace tests (test_accum.sh starts it alone or under mpirun). argv[1] names
 * the scenario; the rank prints "rank R: OK ..." or "rank R: WRONG/ERROR ..."
 * and exits 0 or 1, so the script checks every rank.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/trace_json.h"
#include "loom.h"
#include "tests/ddp/worker_util.h"

static int rank, world;

static loom_status compile(worker_model *m, loom_pg *pg, loom_opt_level level)
{
	loom_compile_opts o;
	worker_opts(&o, pg, level, 0.1, 0.9);
	o.optim.weight_decay = 1e-3;
	/* Small buckets so that the MLP has several. */
	o.bucket_cap_mb = 0.002;
	o.first_bucket_mb = 0.0005;
	return loom_compile(m->g, m->loss, &o, &m->p);
}

/*
 * N micro-steps of batch B on each of `world` ranks (pg, or no group at all
 * when pg is NULL) against one process at batch N*world*B, `steps` steps of
 * SGD with momentum and weight decay, O0: the same parameters within 1e-5
 * relative. Micro-step m of rank r reads rows (m*world + r)*B of the step's
 * global batch. Also: an ACCUMULATE changes neither the parameters nor the
 * step count.
 */
static int equiv(loom_pg *pg, int N, int steps, const char *trace)
{
	worker_model d = { 0 }, one = { 0 };
	int B = 4, W = pg ? world : 1, G = N * W * B;
	worker_mlp(&d, B, 11);
	loom_status st = compile(&d, pg, LOOM_O0);
	if (st)
		return worker_free(worker_fail("compile", st, loom_last_error()), &d, &one);
	worker_mlp(&one, G, 11);
	if ((st = compile(&one, NULL, LOOM_O0)))
		return worker_free(worker_fail("compile (one process)", st, loom_last_error()), &d, &one);
	if (trace && (st = loom_trace_start(d.p, trace)))
		return worker_free(worker_fail("trace_start", st, loom_program_error(d.p)), &d, &one);
	int still = 1;
	for (int s = 0; s < steps; s++) {
		for (int m = 0; m < N; m++) {
			loom_run_mode mode = m < N - 1 ? LOOM_RUN_ACCUMULATE : LOOM_RUN_TRAIN;
			uint64_t h = mode == LOOM_RUN_ACCUMULATE ? worker_param_hash(&d) : 0;
			if ((st = worker_feed(&d, (long)s * G + (long)(m * W + (pg ? rank : 0)) * B, 0)) ||
			    (st = loom_run(d.p, mode)))
				return worker_free(worker_fail("micro-step", st, loom_program_error(d.p)), &d, &one);
			if (mode == LOOM_RUN_ACCUMULATE)
				still &= h == worker_param_hash(&d) && loom_step_count(d.p) == s;
		}
		if ((st = worker_feed(&one, (long)s * G, 0)) || (st = loom_run(one.p, LOOM_RUN_TRAIN)))
			return worker_free(worker_fail("step (one process)", st, loom_program_error(one.p)), &d, &one);
	}
	if (trace && (st = loom_trace_stop(d.p)))
		return worker_free(worker_fail("trace_stop", st, loom_program_error(d.p)), &d, &one);
	double worst = worker_param_rel_diff(&d, &one);
	double moved = 0;
	{
		/* The training moved the weights: a no-op would match too. */
		worker_model fresh;
		worker_mlp(&fresh, G, 11);
		if (compile(&fresh, NULL, LOOM_O0) == LOOM_OK)
			moved = worker_param_rel_diff(&fresh, &one);
		loom_program_free(fresh.p);
		loom_graph_free(fresh.g);
	}
	int same = worker_same_everywhere(pg, worker_param_hash(&d));
	int ok = worst <= 1e-5 && moved > 1e-3 && still && same == 1 &&
		 loom_step_count(d.p) == steps;
	printf("rank %d: %s accum world %d: %d micro-steps x batch %d vs 1 x batch %d, %d steps: "
	       "max relative difference %.3g (moved %.3g), accumulate left params %s, steps %lld, "
	       "ranks identical %d\n",
	       rank, ok ? "OK" : "WRONG", W, N, B, G, steps, worst, moved,
	       still ? "alone" : "CHANGED", (long long)loom_step_count(d.p), same);
	return worker_free(ok ? 0 : 1, &d, &one);
}

/*
 * O1, 2 micro-steps per step: at step 2 rank 1 alone feeds 1e30 in its
 * ACCUMULATE micro-step. The scale does not move mid-accumulation; the
 * whole step is skipped on every rank and the scale halves once.
 */
static int overflow(loom_pg *pg)
{
	worker_model m = { 0 };
	int B = 4, steps = 5;
	worker_mlp(&m, B, 11);
	loom_status st = compile(&m, pg, LOOM_O1);
	if (st)
		return worker_free(worker_fail("compile", st, loom_last_error()), &m, NULL);
	loom_program_info info;
	int steady = 1;
	for (int s = 0; s < steps; s++) {
		double poison = s == 2 && rank == 1 ? 1e30 : 0;
		loom_program_info_get(m.p, &info);
		double before = info.loss_scale;
		if ((st = worker_feed(&m, ((long)s * 2 * world + rank) * B, poison)) ||
		    (st = loom_run(m.p, LOOM_RUN_ACCUMULATE)))
			return worker_free(worker_fail("accumulate", st, loom_program_error(m.p)), &m, NULL);
		loom_program_info_get(m.p, &info);
		steady &= info.loss_scale == before;
		if ((st = worker_feed(&m, ((long)s * 2 * world + world + rank) * B, 0)) ||
		    (st = loom_run(m.p, LOOM_RUN_TRAIN)))
			return worker_free(worker_fail("train", st, loom_program_error(m.p)), &m, NULL);
	}
	loom_program_info_get(m.p, &info);
	int same = worker_same_everywhere(pg, worker_param_hash(&m));
	int ok = info.skipped_steps == 1 && loom_step_count(m.p) == steps - 1 &&
		 info.loss_scale == 32768 && steady && same == 1;
	printf("rank %d: %s accum overflow skipped %lld steps %lld scale %g steady %d identical %d\n",
	       rank, ok ? "OK" : "WRONG", (long long)info.skipped_steps,
	       (long long)loom_step_count(m.p), info.loss_scale, steady, same);
	return worker_free(ok ? 0 : 1, &m, NULL);
}

/* No group: an ACCUMULATE, then loom_load of the initial weights, then a
 * TRAIN must equal a fresh program's TRAIN on the same batch bit for bit:
 * the load dropped the sum (and the divisor) of the micro-step before it. */
static int load_drops(const char *path)
{
	worker_model a = { 0 }, b = { 0 };
	loom_status st;
	worker_mlp(&a, 4, 11);
	worker_mlp(&b, 4, 11);
	if ((st = compile(&a, NULL, LOOM_O0)) || (st = compile(&b, NULL, LOOM_O0)))
		return worker_free(worker_fail("compile", st, loom_last_error()), &a, &b);
	if ((st = loom_save(a.p, path)) || (st = worker_feed(&a, 0, 0)) ||
	    (st = loom_run(a.p, LOOM_RUN_ACCUMULATE)) || (st = loom_load(a.p, path)) ||
	    (st = worker_feed(&a, 100, 0)) || (st = loom_run(a.p, LOOM_RUN_TRAIN)))
		return worker_free(worker_fail("accumulate, load, train", st, loom_program_error(a.p)), &a, &b);
	if ((st = worker_feed(&b, 100, 0)) || (st = loom_run(b.p, LOOM_RUN_TRAIN)))
		return worker_free(worker_fail("train", st, loom_program_error(b.p)), &a, &b);
	double d = worker_param_rel_diff(&a, &b);
	printf("rank 0: %s load drops accumulated gradients: difference %.3g\n", d == 0 ? "OK" : "WRONG",
	       d);
	return worker_free(d == 0 ? 0 : 1, &a, &b);
}

/* ------------------------------------------------------------ traces */

static const loom_tj_event *phase_end(const loom_tj *t, int pid, int run, const char *name)
{
	for (int i = 0; i < t->n; i++)
		if (t->ev[i].pid == pid && t->ev[i].run == run && !strcmp(t->ev[i].cat, "phase") &&
		    !strcmp(t->ev[i].name, name))
			return &t->ev[i];
	return NULL;
}

/*
 * What rank 0's file must show for `runs` runs of N micro-steps on `world`
 * ranks: valid JSON; a track per rank; in every TRAIN run each bucket's
 * all-reduce exactly once, started before that run's backward ends, all
 * but the last bucket's before the last backward node starts (overlap); in
 * every ACCUMULATE run no all-reduce and one accumulation per bucket.
 * Returns 0 and the bucket count, or -1 with why.
 */
static int check_trace(const char *path, int N, int runs, int *nb, char *why, size_t len)
{
	loom_tj t;
	if (loom_tj_load(path, &t, why, len))
		return -1;
	int rc = -1, buckets = 0;
	for (int i = 0; i < t.n; i++)
		if (!strncmp(t.ev[i].name, "allreduce bucket", 16) && t.ev[i].bucket + 1 > buckets)
			buckets = t.ev[i].bucket + 1;
	*nb = buckets;
	if (buckets < 2) {
		snprintf(why, len, "%d buckets: no overlap to see", buckets);
		goto out;
	}
	for (int pid = 0; pid < world; pid++) {
		int spans = 0;
		for (int i = 0; i < t.n; i++)
			spans += t.ev[i].pid == pid && t.ev[i].ph == 'X';
		if (!spans) {
			snprintf(why, len, "no spans for rank %d", pid);
			goto out;
		}
		for (int run = 0; run < runs * N; run++) {
			int train = run % N == N - 1, seen[64] = { 0 }, n_ar = 0, n_acc = 0, early = 0;
			const loom_tj_event *bwd = phase_end(&t, pid, run, "backward");
			if (!bwd) {
				snprintf(why, len, "rank %d run %d: no backward phase", pid, run);
				goto out;
			}
			double last_node = 0;
			for (int i = 0; i < t.n; i++) {
				const loom_tj_event *e = &t.ev[i];
				if (e->pid == pid && e->run == run && !strcmp(e->cat, "backward") &&
				    strncmp(e->name, "allreduce", 9) && e->ts > last_node)
					last_node = e->ts;
			}
			for (int i = 0; i < t.n; i++) {
				const loom_tj_event *e = &t.ev[i];
				if (e->pid != pid || e->run != run)
					continue;
				if (!strcmp(e->cat, "accumulate") && !strncmp(e->name, "accumulate", 10))
					n_acc++;
				if (strncmp(e->name, "allreduce bucket", 16))
					continue;
				n_ar++;
				if (e->bucket >= 0 && e->bucket < 64)
					seen[e->bucket]++;
				if (e->ts >= bwd->ts + bwd->dur) {
					snprintf(why, len, "rank %d run %d: bucket %d's all-reduce starts at "
						 "%.1f us, after backward ended at %.1f", pid, run, e->bucket,
						 e->ts, bwd->ts + bwd->dur);
					goto out;
				}
				early += e->ts < last_node;
			}
			int once = 1;
			for (int k = 0; k < buckets && k < 64; k++)
				once &= seen[k] == 1;
			if (train && (n_ar != buckets || !once || early < buckets - 1)) {
				snprintf(why, len, "rank %d run %d: %d all-reduces for %d buckets (each once: "
					 "%d), %d started before the last backward node", pid, run, n_ar,
					 buckets, once, early);
				goto out;
			}
			if (!train && (n_ar != 0 || n_acc != buckets)) {
				snprintf(why, len, "rank %d run %d (accumulate): %d all-reduces, %d "
					 "accumulations for %d buckets", pid, run, n_ar, n_acc, buckets);
				goto out;
			}
		}
	}
	rc = 0;
out:
	loom_tj_free(&t);
	return rc;
}

/* The ConvNet at batch 50 per rank, small buckets: one warm-up step, then
 * a trace of 3 steps of N micro-steps each, checked by rank 0. */
static int trace(loom_pg *pg, const char *path, int N)
{
	worker_model m;
	int B = 50, steps = 3;
	loom_compile_opts o;
	worker_opts(&o, pg, LOOM_O0, 0.01, 0.9);
	/* The default buckets (25 MiB, the first 1 MiB) hold the ConvNet's
	 * 116 KiB of gradients in one bucket, whose all-reduce can only start
	 * at the very end of backward. */
	o.bucket_cap_mb = 0.03;
	o.first_bucket_mb = 0.01;
	loom_status st = worker_convnet(&m, B, 0, &o, NULL);
	if (st)
		return worker_free(worker_fail("compile", st, loom_last_error()), &m, NULL);
	loom_program *p = m.p;
	float *img = malloc(sizeof(float) * B * 784);
	int32_t lab[50];
	for (int i = 0; i < B * 784; i++)
		img[i] = (float)sin(0.01 * i + rank);
	for (int i = 0; i < B; i++)
		lab[i] = (i + rank) % 10;
	st = loom_set_input(p, "image", img, LOOM_F32, (size_t)B * 784);
	if (!st)
		st = loom_set_input(p, "label", lab, LOOM_I32, B);
	if (!st)
		st = loom_run(p, LOOM_RUN_TRAIN);
	if (!st)
		st = loom_trace_start(p, path);
	for (int s = 0; s < steps * N && !st; s++)
		st = loom_run(p, s % N == N - 1 ? LOOM_RUN_TRAIN : LOOM_RUN_ACCUMULATE);
	if (!st)
		st = loom_trace_stop(p);
	free(img);
	if (st)
		return worker_free(worker_fail("trace", st, loom_program_error(p)), &m, NULL);
	int rc = 0;
	if (rank == 0) {
		char why[256] = "";
		int nb = 0;
		rc = check_trace(path, N, steps, &nb, why, sizeof(why)) ? 1 : 0;
		if (rc)
			printf("rank 0: WRONG trace: %s\n", why);
		else
			printf("rank 0: OK trace world %d buckets %d micro-steps %d: every all-reduce once "
			       "per step, started before backward ended\n", world, nb, N);
	} else {
		printf("rank %d: OK trace sent\n", rank);
	}
	return worker_free(rc, &m, NULL);
}

/* No group at all: 2 steps of 2 micro-steps traced to path, and the file
 * must be JSON with one track and the accumulation spans. */
static int trace_single(const char *path)
{
	int rc = equiv(NULL, 2, 2, path);
	loom_tj t;
	char why[256];
	if (rc)
		return rc;
	if (loom_tj_load(path, &t, why, sizeof(why))) {
		printf("rank 0: WRONG single trace: %s\n", why);
		return 1;
	}
	int acc = 0, fold = 0, runs = 0, other_pid = 0;
	for (int i = 0; i < t.n; i++) {
		acc += !strcmp(t.ev[i].cat, "accumulate") && !strncmp(t.ev[i].name, "accumulate ", 11);
		fold += !strcmp(t.ev[i].cat, "accumulate") && !strncmp(t.ev[i].name, "fold", 4);
		runs += !strcmp(t.ev[i].cat, "run");
		other_pid |= t.ev[i].pid > 0;
	}
	loom_tj_free(&t);
	/* 4 parameters: 2 accumulations and 2 folds of each, 4 runs. */
	int ok = acc == 8 && fold == 8 && runs == 4 && !other_pid;
	printf("rank 0: %s single trace: %d accumulations, %d folds, %d runs\n", ok ? "OK" : "WRONG",
	       acc, fold, runs);
	return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: accum_worker SCENARIO [ARGS]\n");
		return 2;
	}
	loom_pg *pg;
	if (worker_init(&pg, &rank, &world))
		return 1;
	const char *s = argv[1];
	int rc;
	if (strcmp(s, "equiv") == 0 && argc > 2)
		rc = equiv(world > 1 ? pg : NULL, atoi(argv[2]), 10, NULL);
	else if (strcmp(s, "overflow") == 0)
		rc = overflow(pg);
	else if (strcmp(s, "trace") == 0 && argc > 3)
		rc = trace(pg, argv[2], atoi(argv[3]));
	else if (strcmp(s, "load") == 0 && argc > 2)
		rc = load_drops(argv[2]);
	else if (strcmp(s, "trace1") == 0 && argc > 2)
		rc = trace_single(argv[2]);
	else {
		fprintf(stderr, "accum_worker: unknown scenario %s\n", s);
		rc = 2;
	}
	fflush(stdout);
	loom_pg_free(pg);
	return rc;
}
