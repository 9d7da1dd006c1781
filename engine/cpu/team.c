/*
 * engine/cpu/team.c — the CPU kernels' parallel loops as jobs (a function run
 * by thread t of nt, the caller being thread 0), run as OpenMP regions or on
 * loom's own worker threads.
 *
 * Why own workers at all: libgomp decides once, in its constructor, how long a
 * waiting thread spins (about 300,000 rounds, a few ms; 100 when more OpenMP
 * threads exist than CPUs), and a thread that spins at a barrier keeps its
 * core while the thread it waits for is descheduled: on a shared 2-core
 * machine the ConvNet stepped 4-9x slower (bench/RESULTS.md). loom worked
 * round it with a parked second team that pushed libgomp onto its short spin,
 * which made every region on an idle machine wake its workers from sleep.
 * loom's workers wait by loom's policy: spin for an adaptive time (below),
 * then sleep on a futex (a descheduled sibling costs at most that spin). Jobs run oneDNN primitives and GEMMs on their own thread: the
 * OpenMP thread count of every thread in a job is 1, so oneDNN never opens a
 * team of its own there.
 *
 * Not the default: measured side by side on the shared 2-core machine (load
 * 9-12, bench/RESULTS.md) it was not faster than OpenMP's regions with the
 * parked team, and the ConvNet epoch rounds favoured OpenMP. So by default
 * every job runs as one OpenMP region (the threading before this file), and
 * LOOM_CPU_TEAM=loom selects loom's workers, to measure the two again on a
 * quieter machine.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <linux/futex.h>
#include <omp.h>
#include <sys/syscall.h>

#include "base/options.h"
#include "engine/cpu/team.h"

/* At most this many threads in a job (the kernels' scratch slots). */
#define TEAM_MAX 64
/*
 * How long a waiting thread spins before it sleeps, adapted per thread as
 * glibc's adaptive mutexes do: a wait that the spin covered lets the next
 * spin be longer (up to TEAM_SPIN_MAX_NS, the serial gap between two kernels
 * of a step on an idle machine), one that ran out halves it (down to
 * TEAM_SPIN_MIN_NS, about libgomp's short spin). On a busy machine the
 * thread waited for is often descheduled and a fixed long spin only burnt
 * the core it needed: the ConvNet's epoch ran at half the rate of OpenMP's
 * short spin (bench/RESULTS.md).
 */
#define TEAM_SPIN_MAX_NS 50000
#define TEAM_SPIN_MIN_NS 1000
static __thread int64_t spin_ns = TEAM_SPIN_MAX_NS;

typedef struct team_worker {
	_Atomic uint32_t seq;  /* bumped by the caller: a job for this worker */
	_Atomic int sleeping;  /* in futex_wait on seq */
	uint32_t seq0;         /* seq when the worker was made: its first job is seq0 + 1 */
	pthread_t thread;
	char pad[64 - 3 * sizeof(uint32_t) - sizeof(pthread_t)];
} team_worker;

static pthread_once_t team_once = PTHREAD_ONCE_INIT;
static int team_omp;                 /* unless LOOM_CPU_TEAM=loom */
static pthread_mutex_t team_lock = PTHREAD_MUTEX_INITIALIZER;
static int team_started;             /* workers 1..team_started exist */
static team_worker team_w[TEAM_MAX] __attribute__((aligned(64)));

/* The job in flight, written by the caller before it bumps the seqs. */
static loom_cpu_team_fn job_fn;
static void *job_ctx;
static int job_nt;
static _Atomic int job_pending;      /* workers not yet done */
static _Atomic int caller_sleeping;

static __thread int team_in_job;

static long futex(_Atomic uint32_t *addr, int op, uint32_t val)
{
	return syscall(SYS_futex, (uint32_t *)addr, op | FUTEX_PRIVATE_FLAG, val, NULL, NULL, 0);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* One check of a spin that began at *start (0: not yet): pauses, and
 * every 16th round reads the clock. Returns 0 once this thread's spin_ns
 * have passed, and halves spin_ns for the next wait. */
static int spin_step(unsigned i, int64_t *start)
{
	cpu_relax();
	if (i & 15)
		return 1;
	int64_t t = now_ns();
	if (!*start)
		*start = t;
	if (t - *start < spin_ns)
		return 1;
	spin_ns = spin_ns / 2 > TEAM_SPIN_MIN_NS ? spin_ns / 2 : TEAM_SPIN_MIN_NS;
	return 0;
}

/* A wait the spin covered: the next may spin longer. */
static void spin_paid(void)
{
	spin_ns = spin_ns * 2 < TEAM_SPIN_MAX_NS ? spin_ns * 2 : TEAM_SPIN_MAX_NS;
}

/* Spins up to spin_ns for *w != old; returns whether it changed. */
static int spin_until_changed(_Atomic uint32_t *w, uint32_t old)
{
	int64_t start = 0;
	for (unsigned i = 1;; i++) {
		if (atomic_load_explicit(w, memory_order_acquire) != old) {
			spin_paid();
			return 1;
		}
		if (!spin_step(i, &start))
			return 0;
	}
}

/* The caller, after its own share: spin up to its spin_ns in all for the
 * workers to finish, then sleep until the last one wakes it. */
static void wait_workers(void)
{
	_Atomic uint32_t *pend = (_Atomic uint32_t *)&job_pending;
	uint32_t p;
	int64_t start = 0;
	for (unsigned i = 1; atomic_load(pend) != 0; i++) {
		if (spin_step(i, &start))
			continue;
		atomic_store(&caller_sleeping, 1);
		while ((p = atomic_load(pend)) != 0)
			futex(pend, FUTEX_WAIT, p);
		atomic_store(&caller_sleeping, 0);
		return;
	}
	spin_paid();
}

static void *worker_main(void *arg)
{
	team_worker *me = arg;
	const int id = (int)(me - team_w);
	/* Not the seq now: the caller may have bumped it already. */
	uint32_t seen = me->seq0;
	team_in_job = 1;
	omp_set_num_threads(1);
	for (;;) {
		if (!spin_until_changed(&me->seq, seen)) {
			atomic_store(&me->sleeping, 1);
			while (atomic_load(&me->seq) == seen)
				futex(&me->seq, FUTEX_WAIT, seen);
			atomic_store(&me->sleeping, 0);
		}
		seen = atomic_load(&me->seq);
		job_fn(job_ctx, id, job_nt);
		if (atomic_fetch_sub(&job_pending, 1) == 1 && atomic_load(&caller_sleeping))
			futex((_Atomic uint32_t *)&job_pending, FUTEX_WAKE, INT_MAX);
	}
	return NULL;
}

/* A forked child has the caller's thread only: start the workers again. */
static void team_atfork_child(void)
{
	team_started = 0;
	pthread_mutex_init(&team_lock, NULL);
}

static void team_init(void)
{
	team_omp = loom_opt_choice(LOOM_OPT_CPU_TEAM) != 1; /* omp|loom */
	pthread_atfork(NULL, NULL, team_atfork_child);
}

/* Starts workers up to nt - 1; returns the threads a job may have. */
static int team_grow(int nt)
{
	while (team_started + 1 < nt) {
		team_worker *w = &team_w[team_started + 1];
		pthread_attr_t at;
		if (pthread_attr_init(&at))
			break;
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		w->seq0 = atomic_load(&w->seq);
		int rc = pthread_create(&w->thread, &at, worker_main, w);
		pthread_attr_destroy(&at);
		if (rc)
			break; /* fewer threads: slower, not wrong */
		team_started++;
	}
	return team_started + 1 < nt ? team_started + 1 : nt;
}

static void run_openmp(int nt, loom_cpu_team_fn fn, void *ctx)
{
#pragma omp parallel num_threads(nt)
	{
		int was = team_in_job;
		team_in_job = 1;
		fn(ctx, omp_get_thread_num(), omp_get_num_threads());
		team_in_job = was;
	}
}

void loom_cpu_team_run(int nt, loom_cpu_team_fn fn, void *ctx)
{
	pthread_once(&team_once, team_init);
	if (nt > TEAM_MAX)
		nt = TEAM_MAX;
	if (team_omp) {
		if (team_in_job)
			fn(ctx, 0, 1);
		else
			run_openmp(nt < 1 ? 1 : nt, fn, ctx);
		return;
	}
	if (team_in_job) {
		fn(ctx, 0, 1);
		return;
	}
	/* The caller's OpenMP count is 1 for the job (oneDNN and BLAS calls in
	 * it run here alone), and put back after. */
	int omp_prev = omp_get_max_threads();
	if (omp_prev != 1)
		omp_set_num_threads(1);
	team_in_job = 1;
	if (nt <= 1 || pthread_mutex_trylock(&team_lock)) {
		fn(ctx, 0, 1);
		goto out;
	}
	nt = team_grow(nt);
	if (nt <= 1) {
		pthread_mutex_unlock(&team_lock);
		fn(ctx, 0, 1);
		goto out;
	}
	job_fn = fn;
	job_ctx = ctx;
	job_nt = nt;
	atomic_store(&job_pending, nt - 1);
	for (int i = 1; i < nt; i++) {
		atomic_fetch_add(&team_w[i].seq, 1);
		if (atomic_load(&team_w[i].sleeping))
			futex(&team_w[i].seq, FUTEX_WAKE, 1);
	}
	fn(ctx, 0, nt);
	wait_workers();
	pthread_mutex_unlock(&team_lock);
out:
	team_in_job = 0;
	if (omp_prev != 1)
		omp_set_num_threads(omp_prev);
}

void loom_cpu_team_block(int64_t n, int t, int nt, int64_t *lo, int64_t *hi)
{
	int64_t q = n / nt, r = n % nt;
	*lo = t * q + (t < r ? t : r);
	*hi = *lo + q + (t < r);
}

typedef struct team_for_ctx {
	int64_t n;
	loom_cpu_team_range_fn fn;
	void *ctx;
} team_for_ctx;

static void team_for_one(void *arg, int t, int nt)
{
	team_for_ctx *c = arg;
	int64_t lo, hi;
	loom_cpu_team_block(c->n, t, nt, &lo, &hi);
	if (hi > lo)
		c->fn(c->ctx, lo, hi);
}

void loom_cpu_team_for(int64_t n, int nt, loom_cpu_team_range_fn fn, void *ctx)
{
	if (n <= 0)
		return;
	if (nt > n)
		nt = (int)n;
	if (nt <= 1) {
		fn(ctx, 0, n);
		return;
	}
	team_for_ctx c = { n, fn, ctx };
	loom_cpu_team_run(nt, team_for_one, &c);
}

int loom_cpu_team_threads(void)
{
	return team_in_job ? 1 : omp_get_max_threads();
}

const char *loom_cpu_team_runtime(void)
{
	pthread_once(&team_once, team_init);
	return team_omp ? "openmp" : "loom";
}
