/*
 * tests/comm/comm_worker.c — one rank of the multi-process tests, started by
 * mpirun, by env:// variables or by the launcher. argv[1] names the scenario;
 * the rank prints "rank R: OK ..." or "rank R: ERROR <status>: <message>" and
 * exits 0 or 1 (with --nproc N it is the launcher), so test_comm.sh can check every rank's verdict and timing.
 */
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/half.h"
#include "comm/comm_internal.h"
#include "comm/launch.h"

static int rank_of(loom_pg *pg)
{
	return loom_pg_get_info(pg)->rank;
}

static int fail(loom_pg *pg, loom_status st)
{
	/* Under torchrun (its error file asked for) on stderr, as a program
	 * reports its error, so that the file's message can be checked. */
	FILE *to = getenv("TORCHELASTIC_ERROR_FILE") ? stderr : stdout;

	fprintf(to, "rank %d: ERROR %s: %s\n", pg ? rank_of(pg) : -1, loom_status_string(st),
		loom_pg_error(pg));
	fflush(to);
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
	printf("rank %d: OK allreduce world %d local %d/%d via %s pid %d\n", in->rank, in->world,
	       in->local_rank, in->local_world, loom_comm_bootstrap_name(in->how), (int)getpid());
	return 0;
}

/* f16 and bf16 sums of small integers are exact too. */
static int allreduce_half(loom_pg *pg, loom_comm *c)
{
	const loom_pg_info *in = loom_pg_get_info(pg);
	uint16_t h[64], b[64];
	int i;
	loom_status st;

	for (i = 0; i < 64; i++) {
		h[i] = loom_f32_to_f16((float)(in->rank + i));
		b[i] = loom_f32_to_bf16((float)(in->rank + i));
	}
	if ((st = loom_comm_allreduce(c, h, 64, LOOM_F16)) ||
	    (st = loom_comm_allreduce(c, b, 64, LOOM_BF16)))
		return fail(pg, st);
	for (i = 0; i < 64; i++) {
		float want = (float)(in->world * (in->world - 1) / 2 + in->world * i);

		if (loom_f16_to_f32(h[i]) != want || loom_bf16_to_f32(b[i]) != want) {
			printf("rank %d: WRONG half sum [%d] %g / %g, want %g\n", in->rank, i,
			       loom_f16_to_f32(h[i]), loom_bf16_to_f32(b[i]), want);
			return 1;
		}
	}
	printf("rank %d: OK half sums\n", in->rank);
	return 0;
}

/* Rank 0's parameters reach every rank. */
static int broadcast(loom_pg *pg, loom_comm *c)
{
	const loom_pg_info *in = loom_pg_get_info(pg);
	float a[10], b[3];
	void *bufs[2] = { a, b };
	size_t bytes[2] = { sizeof(a), sizeof(b) };
	int i;
	loom_status st;

	for (i = 0; i < 10; i++)
		a[i] = (float)(in->rank * 100 + i);
	for (i = 0; i < 3; i++)
		b[i] = (float)(in->rank * 7 - i);
	if ((st = loom_comm_broadcast_many(c, bufs, bytes, 2, 0)) || (st = loom_comm_barrier(c)))
		return fail(pg, st);
	for (i = 0; i < 10; i++)
		if (a[i] != (float)i)
			return printf("rank %d: WRONG a[%d] = %g\n", in->rank, i, a[i]), 1;
	for (i = 0; i < 3; i++)
		if (b[i] != (float)-i)
			return printf("rank %d: WRONG b[%d] = %g\n", in->rank, i, b[i]), 1;
	printf("rank %d: OK broadcast\n", in->rank);
	return 0;
}

/* LOOM_TEST_VICTIM dies by SIGKILL between two all-reduces; the others must
 * fail within the timeout, naming it. */
static int die(loom_pg *pg, loom_comm *c)
{
	const loom_pg_info *in = loom_pg_get_info(pg);
	const char *v = getenv("LOOM_TEST_VICTIM");
	int victim = v ? atoi(v) : 1;
	float x[1000] = { 0 };
	double t0;
	loom_status st;

	printf("rank %d: pid %d\n", in->rank, (int)getpid());
	fflush(stdout);
	if ((st = loom_comm_allreduce(c, x, 1000, LOOM_F32)))
		return fail(pg, st);
	if (in->rank == victim)
		raise(SIGKILL);
	t0 = loom_comm_now();
	st = loom_comm_allreduce(c, x, 1000, LOOM_F32);
	if (!st) {
		printf("rank %d: WRONG the all-reduce without rank %d succeeded\n", in->rank,
		       victim);
		return 1;
	}
	printf("rank %d: after %.1f s: ", in->rank, loom_comm_now() - t0);
	return fail(pg, st);
}

/* LOOM_TEST_VICTIM stops itself (SIGSTOP) after step 2's all-reduce; the
 * others time out in step 3's and must name it with both steps. */
static int freeze(loom_pg *pg, loom_comm *c)
{
	const loom_pg_info *in = loom_pg_get_info(pg);
	const char *v = getenv("LOOM_TEST_VICTIM");
	int victim = v ? atoi(v) : 1, step;
	float x[1000] = { 0 };
	loom_status st;

	for (step = 1; step <= 3; step++) {
		loom_pg_set_step(pg, step);
		if ((st = loom_comm_allreduce(c, x, 1000, LOOM_F32)))
			return fail(pg, st);
		if (step == 2 && in->rank == victim)
			raise(SIGSTOP);
	}
	printf("rank %d: OK freeze\n", in->rank);
	return 0;
}

/* 30 steps of an all-reduce 0.1 s apart, for a process that comes after
 * the group formed (test_comm: a late duplicate rank). */
static int steps(loom_pg *pg, loom_comm *c)
{
	const loom_pg_info *in = loom_pg_get_info(pg);
	float x[10] = { 0 };
	loom_status st;
	int step;

	printf("rank %d: group formed\n", in->rank);
	fflush(stdout);
	for (step = 1; step <= 30; step++) {
		loom_pg_set_step(pg, step);
		if ((st = loom_comm_allreduce(c, x, 10, LOOM_F32)))
			return fail(pg, st);
		usleep(100000);
	}
	printf("rank %d: OK steps\n", in->rank);
	return 0;
}

/* A plan of 20 nodes; rank LOOM_TEST_ODD's node 14 has another shape. */
typedef struct toy_plan {
	int batch14;
} toy_plan;

static void toy_describe(void *user, size_t i, char *buf, size_t len)
{
	const toy_plan *p = user;

	if (i == 14)
		snprintf(buf, len, "node 14 conv2d has shape [%d,32,14,14]", p->batch14);
	else
		snprintf(buf, len, "node %zu relu has shape [8]", i);
}

static int fingerprint(loom_pg *pg, loom_comm *c, const char *how)
{
	const loom_pg_info *in = loom_pg_get_info(pg);
	const char *o = getenv("LOOM_TEST_ODD");
	int odd = o ? atoi(o) : 1, k;
	toy_plan plan = { 50 };
	uint64_t items[20];
	const char head[] = "O2 bucket_cap=25MiB";
	loom_fingerprint fp = { "node", head, sizeof(head), items, 20, toy_describe, &plan };
	loom_status st;

	if (in->rank == odd && !strcmp(how, "fp-mismatch"))
		plan.batch14 = 100;
	for (k = 0; k < 20; k++) {
		char d[128];

		toy_describe(&plan, (size_t)k, d, sizeof(d));
		items[k] = loom_comm_hash(d, strlen(d), 0);
	}
	if (in->rank == odd && !strcmp(how, "fp-count"))
		fp.n_items = 19;
	if (in->rank == odd && !strcmp(how, "fp-garbage")) {
		uint8_t junk[40];

		memset(junk, 0xab, sizeof(junk));
		st = loom_comm_check_fingerprint_bytes(c, junk, sizeof(junk), &fp);
	} else if (in->rank == odd && !strcmp(how, "fp-truncated")) {
		uint8_t *rec;
		size_t len;

		loom_fingerprint_serialize(&fp, &rec, &len);
		st = loom_comm_check_fingerprint_bytes(c, rec, len - 5, &fp);
		free(rec);
	} else {
		st = loom_comm_check_fingerprint(c, &fp);
	}
	if (st)
		return fail(pg, st);
	printf("rank %d: OK fingerprint\n", in->rank);
	return 0;
}

/* LOOM_TEST_GRAB_PORT=1: rank 0, before its group forms, plays another
 * process of the host that takes the launcher's MASTER_PORT in the moment
 * between the launcher picking it and rank 0 listening on it (Open MPI's
 * own listener in rank 0 once did). It keeps what it got until exit. */
static void grab_master_port(void)
{
	const char *port = getenv("MASTER_PORT"), *rank = getenv("RANK");
	struct sockaddr_in a;
	int one = 1, s;

	if (!getenv("LOOM_TEST_GRAB_PORT") || !port || !rank || strcmp(rank, "0"))
		return;
	s = socket(AF_INET, SOCK_STREAM, 0);
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_port = htons((uint16_t)atoi(port));
	a.sin_addr.s_addr = htonl(INADDR_ANY);
	if (s >= 0 && !bind(s, (struct sockaddr *)&a, sizeof(a)) && !listen(s, 4))
		printf("rank 0: grabbed MASTER_PORT %s\n", port);
	else
		printf("rank 0: MASTER_PORT %s is held: %s\n", port, strerror(errno));
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
	rc = loom_launch_maybe(&argc, argv);
	if (rc >= 0)
		return rc;
	what = argc > 1 ? argv[1] : "allreduce";
	grab_master_port();
	st = loom_pg_init(&o, &pg);
	if (st) {
		rc = fail(pg, st);
		loom_pg_free(pg);
		return rc;
	}
	c = loom_pg_comm(pg, LOOM_COMM_HOST);
	if (!strcmp(what, "allreduce"))
		rc = allreduce(pg, c);
	else if (!strcmp(what, "half"))
		rc = allreduce_half(pg, c);
	else if (!strcmp(what, "broadcast"))
		rc = broadcast(pg, c);
	else if (!strcmp(what, "flaky")) {
		/* Rank 1 fails the first attempt; the launcher's restart succeeds. */
		const char *n = getenv("TORCHELASTIC_RESTART_COUNT");

		if (rank_of(pg) == 1 && (!n || !strcmp(n, "0") || getenv("LOOM_TEST_ALWAYS"))) {
			printf("rank 1: failing attempt %s on purpose\n", n ? n : "0");
			rc = 3;
		} else {
			rc = allreduce(pg, c);
		}
	} else if (!strcmp(what, "die"))
		rc = die(pg, c);
	else if (!strcmp(what, "freeze"))
		rc = freeze(pg, c);
	else if (!strcmp(what, "steps"))
		rc = steps(pg, c);
	else if (!strcmp(what, "sleep")) {
		/* Up and waiting, for the launcher's signal tests. */
		rc = allreduce(pg, c);
		sleep(60);
	}
	else if (!strncmp(what, "fp-", 3))
		rc = fingerprint(pg, c, what);
	else {
		printf("unknown scenario %s\n", what);
		rc = 2;
	}
	loom_pg_free(pg);
	return rc;
}
