/*
 * bench/bench_util.h — the helpers every benchmark here needs: a monotonic
 * clock in seconds, the process's CPU seconds and peak memory, a
 * comparison of doubles for qsort (medians), and the command line's flags.
 */
#ifndef LOOM_BENCH_UTIL_H
#define LOOM_BENCH_UTIL_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* The command line read by spec, scanf's way: flags apart by spaces, each
 * "--name=%d" (an int, atoi), "--name=%f" (a double, atof) or "--name=%s"
 * (the word itself) with the next word its value, or "--name" alone (an
 * int set to 1), each written through the next pointer argument in spec's
 * order (at most 32). 0, or -1 with usage on stderr: a flag spec has not,
 * or one without its value. */
static inline int bench_args(int argc, char **argv, const char *usage, const char *spec, ...)
{
	void *to[32];
	int n = 0;
	va_list ap;
	va_start(ap, spec);
	for (const char *w = spec + strspn(spec, " "); *w && n < 32; w += strspn(w, " "), n++) {
		to[n] = va_arg(ap, void *);
		w += strcspn(w, " ");
	}
	va_end(ap);
	for (int i = 1; i < argc; i++) {
		const char *w = spec + strspn(spec, " ");
		int k = 0;
		size_t name = 0;
		for (; *w && k < n; w += strspn(w, " "), k++) {
			name = strcspn(w, "= ");
			if (strlen(argv[i]) == name && !strncmp(argv[i], w, name))
				break;
			w += strcspn(w, " ");
		}
		if (!*w || k == n)
			goto bad;
		if (w[name] != '=') {
			*(int *)to[k] = 1;
			continue;
		}
		if (i + 1 >= argc)
			goto bad;
		const char *v = argv[++i];
		if (w[name + 2] == 'd')
			*(int *)to[k] = atoi(v);
		else if (w[name + 2] == 'f')
			*(double *)to[k] = atof(v);
		else
			*(const char **)to[k] = v;
	}
	return 0;
bad:
	fprintf(stderr, "%s\n", usage);
	return -1;
}

#endif
