/*
 * tests/engine/cpu/test_team.c — loom's worker team (engine/cpu/team.c): every
 * thread of every job runs exactly once, a loop's blocks cover its items
 * exactly once, a job inside a job runs on its caller alone, and many
 * back-to-back jobs (workers awake, then asleep) neither hang nor lose one.
 * BUILD runs it under both runtimes (LOOM_CPU_TEAM unset: OpenMP, and =loom).
 */
#include <criterion/criterion.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/cpu/team.h"

typedef struct counts {
	_Atomic int ran[64];
	_Atomic int nt_seen;
	_Atomic int omp_threads_max; /* OpenMP's count inside the job */
	_Atomic int inner_nt_max;    /* the nt a job inside the job got */
	int nested;
} counts;

static void inner(void *arg, int t, int nt)
{
	counts *c = arg;
	(void)t;
	if (nt > atomic_load(&c->inner_nt_max))
		atomic_store(&c->inner_nt_max, nt);
}

static void mark(void *arg, int t, int nt)
{
	counts *c = arg;
	atomic_fetch_add(&c->ran[t], 1);
	atomic_store(&c->nt_seen, nt);
	int o = omp_get_max_threads();
	if (o > atomic_load(&c->omp_threads_max))
		atomic_store(&c->omp_threads_max, o);
	if (c->nested)
		loom_cpu_team_run(4, inner, c);
}

Test(team, every_thread_runs_once)
{
	for (int nt = 1; nt <= 4; nt++) {
		counts c = { .nested = 1 };
		loom_cpu_team_run(nt, mark, &c);
		int got = atomic_load(&c.nt_seen);
		cr_assert(got >= 1 && got <= nt, "nt %d: job saw nt %d", nt, got);
		for (int t = 0; t < 64; t++)
			cr_assert_eq(atomic_load(&c.ran[t]), t < got ? 1 : 0,
				     "nt %d: thread %d ran %d times", nt, t, atomic_load(&c.ran[t]));
		cr_assert_eq(atomic_load(&c.inner_nt_max), 1, "a job inside a job got %d threads",
			     atomic_load(&c.inner_nt_max));
		if (!strcmp(loom_cpu_team_runtime(), "loom"))
			cr_assert_eq(atomic_load(&c.omp_threads_max), 1,
				     "OpenMP count %d inside a job (oneDNN would open a team)",
				     atomic_load(&c.omp_threads_max));
	}
}

typedef struct cover {
	int64_t n;
	_Atomic int *hit;
} cover;

static void cover_range(void *arg, int64_t lo, int64_t hi)
{
	cover *c = arg;
	cr_assert(lo >= 0 && lo < hi && hi <= c->n, "block [%ld, %ld) of %ld", (long)lo,
		  (long)hi, (long)c->n);
	for (int64_t i = lo; i < hi; i++)
		atomic_fetch_add(&c->hit[i], 1);
}

Test(team, loop_blocks_cover_each_item_once)
{
	static const int64_t ns[] = { 1, 2, 3, 7, 64, 1001 };
	for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
		for (int nt = 1; nt <= 5; nt++) {
			cover c = { ns[k], calloc((size_t)ns[k], sizeof(_Atomic int)) };
			loom_cpu_team_for(c.n, nt, cover_range, &c);
			for (int64_t i = 0; i < c.n; i++)
				cr_assert_eq(atomic_load(&c.hit[i]), 1, "n %ld nt %d: item %ld hit %d",
					     (long)c.n, nt, (long)i, atomic_load(&c.hit[i]));
			free(c.hit);
		}
	}
	int64_t lo, hi, prev = 0;
	for (int t = 0; t < 3; t++) {
		loom_cpu_team_block(10, t, 3, &lo, &hi);
		cr_assert_eq(lo, prev, "block %d starts at %ld", t, (long)lo);
		cr_assert_eq(hi - lo, t == 0 ? 4 : 3, "block %d: %ld items (static split)", t,
			     (long)(hi - lo));
		prev = hi;
	}
}

static void add_t(void *arg, int t, int nt)
{
	_Atomic int64_t *sum = arg;
	(void)nt;
	atomic_fetch_add(sum, t + 1);
}

/* Back to back (workers spinning), and with pauses past the spin (workers
 * asleep, woken by the futex): no job lost, none run twice. */
Test(team, many_jobs_awake_and_asleep, .timeout = 60)
{
	_Atomic int64_t sum = 0;
	int64_t want = 0;
	for (int i = 0; i < 20000; i++) {
		int nt = 1 + i % 3;
		loom_cpu_team_run(nt, add_t, &sum);
		want += (int64_t)nt * (nt + 1) / 2;
		if (i % 1000 == 999) {
			struct timespec ts = { 0, 2000000 };
			nanosleep(&ts, NULL);
		}
	}
	/* A job may get fewer threads than asked only inside a job. */
	cr_assert_eq(atomic_load(&sum), want, "sum %ld, want %ld", (long)atomic_load(&sum),
		     (long)want);
}

Test(team, runtime_named)
{
	const char *e = getenv("LOOM_CPU_TEAM");
	cr_assert_str_eq(loom_cpu_team_runtime(), e && !strcmp(e, "loom") ? "loom" : "openmp");
}
