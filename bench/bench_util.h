/*
 * bench/bench_util.h — the helpers every benchmark here needs: a monotonic
 * clock in seconds, the process's CPU seconds and peak memory, and a
 * comparison of doubles for qsort (medians).
 */
#ifndef LOOM_BENCH_UTIL_H
#define LOOM_BENCH_UTIL_H

#include <sys/resource.h>
#include <time.h>

static inline double bench_now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Seconds of CPU time (user + system) used by this process so far. */
static inline double bench_cpu_seconds(void)
{
	struct rusage u;
	getrusage(RUSAGE_SELF, &u);
	return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

/* The process's peak resident memory so far, MiB (Linux counts KiB). */
static inline double bench_peak_rss_mib(void)
{
	struct rusage u;
	getrusage(RUSAGE_SELF, &u);
	return u.ru_maxrss / 1024.0;
}

static inline int bench_cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

#endif
