/*
 * engine/cpu/team.h — the CPU kernels' parallel loops as jobs, run as OpenMP
 * regions or on loom's own worker threads (team.c).
 */
#ifndef LOOM_ENGINE_CPU_TEAM_H
#define LOOM_ENGINE_CPU_TEAM_H

#include <stdint.h>

/* One thread's share of a parallel job: thread t of nt (0 <= t < nt). */
typedef void (*loom_cpu_team_fn)(void *ctx, int t, int nt);
/* One thread's block [lo, hi) of a loop over n items. */
typedef void (*loom_cpu_team_range_fn)(void *ctx, int64_t lo, int64_t hi);

/*
 * Runs fn(ctx, t, nt') on nt' threads, the caller being thread 0, and
 * returns when all are done. nt' is nt, or 1 when called from inside a job
 * (or while another thread of the process holds the team): fn must use the
 * nt it is given. Inside a job, oneDNN and BLAS calls run on the calling
 * thread alone (an OpenMP job: oneDNN sees omp_in_parallel(); loom's: every
 * thread's OpenMP count is 1).
 */
void loom_cpu_team_run(int nt, loom_cpu_team_fn fn, void *ctx);

/*
 * A loop over n independent items on nt threads, split as OpenMP's
 * schedule(static) splits it: contiguous blocks, the first n % nt one item
 * longer. Runs on the caller alone when nt <= 1 or n < 2.
 */
void loom_cpu_team_for(int64_t n, int nt, loom_cpu_team_range_fn fn, void *ctx);

/* Thread t's block [*lo, *hi) of n items split over nt. */
void loom_cpu_team_block(int64_t n, int t, int nt, int64_t *lo, int64_t *hi);

/* The threads a kernel may use now: loom's thread count (loom_cpu_set_threads,
 * OMP_NUM_THREADS, else the CPUs), 1 inside a job. */
int loom_cpu_team_threads(void);

/* Which runtime runs the jobs: "openmp" (the default: one OpenMP region per
 * job), or "loom" when LOOM_CPU_TEAM=loom (loom's own workers; team.c says
 * why that is not the default). */
const char *loom_cpu_team_runtime(void);

#endif /* LOOM_ENGINE_CPU_TEAM_H */
