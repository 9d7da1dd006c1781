/*
 * tests/engine/cpu/test_spin.c — LOOM_CPU_SPIN=step (engine/cpu/cpu_path.c):
 * the parked team that keeps libgomp on its short spin is let go while a run
 * is in progress and parked again when the last run ends (overlapping runs,
 * an end without a begin), and OpenMP regions run through those changes
 * with every thread. BUILD runs it with the variable set and unset (there
 * nothing moves), and the step mode bounds libgomp's spin (GOMP_SPINCOUNT set
 * before libgomp read it). Whether the bits of a step stay the same:
 * test_spin_same_bits.sh and tests/e2e:test_golden_steps_spin_step.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/cpu/cpu_path.h"

static int step_mode(void)
{
	const char *e = getenv("LOOM_CPU_SPIN");
	return e && !strcmp(e, "step");
}

/* The process's threads now (/proc/self/task). */
static int threads_now(void)
{
	DIR *d = opendir("/proc/self/task");
	int n = 0;
	struct dirent *e;
	cr_assert(d, "/proc/self/task cannot be read");
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/* Waits (up to 10 s, a bound on a hang, not a timing) for the count. */
static int threads_become(int want)
{
	for (int i = 0; i < 1000 && threads_now() != want; i++)
		nanosleep(&(struct timespec){ 0, 10000000 }, NULL);
	return threads_now();
}

static int region_threads(void)
{
	int n = 0;
#pragma omp parallel num_threads(2)
	{
#pragma omp atomic
		n++;
	}
	return n;
}

Test(spin, mode_named_by_the_variable)
{
	cr_assert_str_eq(loom_cpu_spin_mode(), step_mode() ? "step" : "throttled");
}

/* The step mode's bounded spin reached libgomp: GOMP_SPINCOUNT was set
 * before libgomp's constructor read it (BUILD sets none of its own). */
Test(spin, step_mode_bounds_libgomps_spin)
{
	const char *e = getenv("GOMP_SPINCOUNT");
	if (step_mode())
		cr_assert(e && !strcmp(e, "5000"), "GOMP_SPINCOUNT is %s", e ? e : "unset");
	else
		cr_assert_null(e);
}

Test(spin, a_run_lets_the_parked_team_go_and_its_end_parks_it)
{
	cr_assert_eq(region_threads(), 2);
	int base = threads_now();
	cr_assert(loom_cpu_spin_parked()); /* chooses the path: parks a team */
	int idle = threads_become(base + 2);
	cr_assert_eq(idle, base + 2, "no parked team of two threads");
	loom_cpu_spin_step_begin();
	cr_assert_eq(loom_cpu_spin_parked(), !step_mode());
	/* Released: the parked thread and its worker end (2 fewer threads). */
	cr_assert_eq(threads_become(step_mode() ? idle - 2 : idle), step_mode() ? idle - 2 : idle);
	cr_assert_eq(region_threads(), 2);
	loom_cpu_spin_step_begin(); /* a second, overlapping run */
	loom_cpu_spin_step_end();
	cr_assert_eq(loom_cpu_spin_parked(), !step_mode(), "parked while a run is still going");
	loom_cpu_spin_step_end();
	cr_assert(loom_cpu_spin_parked());
	cr_assert_eq(threads_become(idle), idle, "the team was not parked again");
	loom_cpu_spin_step_end(); /* an end without a begin changes nothing */
	cr_assert(loom_cpu_spin_parked());
	cr_assert_eq(region_threads(), 2);
}

Test(spin, many_runs_leave_one_parked_team)
{
	cr_assert_eq(region_threads(), 2);
	int base = threads_now();
	cr_assert(loom_cpu_spin_parked());
	int idle = threads_become(base + 2);
	for (int i = 0; i < 200; i++) {
		loom_cpu_spin_step_begin();
		cr_assert_eq(region_threads(), 2);
		loom_cpu_spin_step_end();
	}
	cr_assert(loom_cpu_spin_parked());
	cr_assert_eq(threads_become(idle), idle, "parked teams pile up or vanish");
}
