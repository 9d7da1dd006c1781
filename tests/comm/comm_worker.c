/*
 * tests/comm/comm_worker.c — one rank of the multi-process tests, started by
 * mpirun, by env:// variables or by the launcher. argv[1] names the scenario;
 * the rank prints "rank R: OK ..." or "rank R: ERROR <status>: <message>" and
 * exits 0 or 1, so test_comm.sh can check every rank's verdict and timing.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm_internal.h"

static int rank_of(loom_pg *pg)
{
	return loom_pg_get_info(pg)->rank;
}

static int fail(loom_pg *pg, loom_status st)
{
	printf("rank %d: ERROR %s: %s\n", pg ? rank_of(pg) : -1, loom_status_string(st),
	       loom_pg_error(pg));
	fflush(stdout);
	return 1;
}

/* Sums of integers in f32 are exact: rank r contributes r + 1 + i. */
static int allreduce(loom_pg *pg, loom_comm *c)
{
	const loom_pg_info *in = loom_pg_get_info(pg);
	size_t n = 100000, i;
	float *x = malloc(n * sizeof(float));
	loom_comm_work *w;
	loom_status st;
	int step, done = 0;

	for (step = 0; step < 3; step++) {
		for (i = 0; i < n; i++)
			x[i] = (float)(in->rank + 1 + (int)(i % 1000));
		st = loom_comm_allreduce_start(c, x, n, LOOM_F32, NULL, &w);
		if (!st)
			st = loom_comm_test(c, w, &done);
		if (!st)
			st = loom_comm_wait(c, w);
		if (st)
			return fail(pg, st);
		for (i = 0; i < n; i++) {
			float want = (float)(in->world * (in->world + 1) / 2 +
					     in->world * (int)(i % 1000));
			if (x[i] != want) {
				printf("rank %d: WRONG x[%zu] = %g, want %g\n", in->rank, i, x[i],
				       want);
				return 1;
			}
		}
	}
	free(x);
	printf("rank %d: OK allreduce world %d local %d/%d via %s\n", in->rank, in->world,
	       in->local_rank, in->local_world, loom_comm_bootstrap_name(in->how));
	return 0;
}

int main(int argc, char **argv)
{
	const char *what = argc > 1 ? argv[1] : "allreduce";
	loom_comm_options o = { LOOM_COMM_BOOT_AUTO, 0, 0, 0 };
	loom_pg *pg;
	loom_comm *c;
	loom_status st;
	int rc;

	setvbuf(stdout, NULL, _IOLBF, 0);
	st = loom_pg_init(&o, &pg);
	if (st) {
		rc = fail(pg, st);
		loom_pg_free(pg);
		return rc;
	}
	c = loom_pg_comm(pg, LOOM_COMM_HOST);
	if (!strcmp(what, "allreduce"))
		rc = allreduce(pg, c);
	else {
		printf("unknown scenario %s\n", what);
		rc = 2;
	}
	loom_pg_free(pg);
	return rc;
}
