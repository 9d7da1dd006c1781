/*
 * engine/cpu/cpu_path.c — picks the CPU's matrix-product path from its
 * features once, and routes the fp32 and bf16 GEMMs of the kernels there.
 *
 * Why oneDNN and not OpenBLAS on the fast paths: Debian's OpenBLAS 0.3.21
 * chooses its kernels from the CPU *model*, and on a model it does not know
 * (a Sapphire Rapids Xeon, family 6 model 207) it falls back to its SSE3
 * "Prescott" kernels, 3 to 5 times slower. oneDNN JIT-compiles its kernels
 * from the instruction set it finds, so a new CPU model gets the right code.
 * OpenBLAS stays as the portable path for CPUs with neither AVX2 nor AVX-512,
 * and for f64 (oneDNN has no double GEMM).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include "base/options.h"
#include "engine/cpu/cpu_path.h"
#include "engine/cpu/matmul_dnnl.h"
#include "engine/cpu/peak.h"
#include "loom.h"

static pthread_once_t isa_once = PTHREAD_ONCE_INIT;
static loom_cpu_isa isa_chosen;
static int bf16_native;     /* bf16 products on vdpbf16ps, not emulated */
static double bf16_ratio;   /* measured vdpbf16ps / fp32 FMA rate; 0: not measured */
static const char *bf16_why = "no avx512_bf16";

loom_cpu_isa loom_cpu_isa_detect(void)
{
	__builtin_cpu_init();
	/* libgcc's checks include the OS's consent (XCR0) for the wide
	 * registers, not only the cpuid bits. */
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
		return __builtin_cpu_supports("avx512bf16") ? LOOM_CPU_ISA_AVX512_BF16 :
							      LOOM_CPU_ISA_AVX512;
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
		return LOOM_CPU_ISA_AVX2;
	return LOOM_CPU_ISA_PORTABLE;
}

const char *loom_cpu_isa_name(loom_cpu_isa isa)
{
	switch (isa) {
	case LOOM_CPU_ISA_AVX512_BF16:
		return "avx512_bf16";
	case LOOM_CPU_ISA_AVX512:
		return "avx512";
	case LOOM_CPU_ISA_AVX2:
		return "avx2";
	default:
		return "portable";
	}
}

/*
 * libgomp's threads spin about 300,000 rounds (a few ms) at each barrier and
 * between regions before they sleep, unless more OpenMP threads are in
 * teams than there are CPUs, when they spin 100. On a machine others share,
 * a thread spinning at a barrier keeps its core while the thread it waits
 * for is descheduled: at load 4-5 on 2 cores the ConvNet stepped 4-9x
 * slower and burnt 3-5x the CPU time (bench/RESULTS.md). GOMP_SPINCOUNT
 * would say so, but libgomp reads it in its own constructor, before any of
 * ours, and a user should not need a variable. So one thread opens a team
 * of two and parks inside it for the life of the process: its worker
 * sleeps at the team's end barrier and keeps the count one above loom's
 * threads. (mnist_ddp had this by accident, part of the time: its
 * prefetcher converts batches of 84 images and more in a parallel region.)
 * team.c's own workers (LOOM_CPU_TEAM=loom) would wait by loom's policy
 * instead; measured on the shared machine they were not faster, so OpenMP
 * regions and this parked team stay the default.
 */
static void *spin_throttle_main(void *arg)
{
	(void)arg;
#pragma omp parallel num_threads(2)
	{
		if (omp_get_thread_num() == 0)
			for (;;)
				pause();
	}
	return NULL;
}

/*
 * LOOM_CPU_SPIN=step (not the default): the parked team is let go while a
 * plan runs (loom_cpu_spin_step_begin, from the backend's run_begin) and
 * parked again when it ends. Inside a step libgomp's threads then spin
 * (bounded, below) from one region to the next, as one team that stays
 * awake across the step's ops (each region's end barrier is the barrier
 * between dependent ops), instead of going to sleep after each region and
 * being woken by the next (a futex wake, a context switch: the GPT at
 * gpt_ddp's defaults opens about 195 regions of 2 threads a step, the
 * ConvNet 17); outside a step (data loading, logging) they
 * keep the short spin. It changes when threads sleep, never how work is
 * split: the same bits. libgomp counts a team's threads until the thread
 * that opened it ends, so a released parked thread leaves its region and
 * ends, and each park starts a new one (two thread starts per step).
 */
static int spin_step_mode;       /* LOOM_CPU_SPIN=step */

/*
 * libgomp's long spin is about 3 ms (300,000 rounds); at load 17-19 on the
 * shared 2-core machine a step spent 83% of its samples in it and ran 7x
 * slower (bench/RESULTS.md). So under LOOM_CPU_SPIN=step the spin is cut to
 * SPIN_STEP_ROUNDS, about 50 us by libgomp's own estimate of 100,000 rounds
 * a millisecond: a gap between two regions of a step is spun through, a
 * longer wait sleeps. libgomp reads GOMP_SPINCOUNT once, in its constructor,
 * which runs before any of loom's. A function in an executable's
 * .preinit_array runs before every shared library's constructor, but also
 * before the C library has its environment (setenv there is lost): it gets
 * the process's environment array itself, and turns the entry
 * LOOM_CPU_SPIN=step into GOMP_SPINCOUNT=SPIN_STEP_ROUNDS in place (unless
 * the user set GOMP_SPINCOUNT: theirs wins); a constructor, which runs after
 * libgomp's, puts LOOM_CPU_SPIN=step back (for getenv and child processes).
 * In a shared library the array is not run: there the step mode spins
 * libgomp's full 3 ms.
 */
#define SPIN_STEP_ROUNDS "5000"
static int spin_step_env; /* the preinit function took LOOM_CPU_SPIN=step's entry */

static void spin_preinit(int argc, char **argv, char **envp)
{
	int step = -1, user = 0;
	(void)argc;
	(void)argv;
	for (int i = 0; envp && envp[i]; i++) {
		if (!strncmp(envp[i], "GOMP_SPINCOUNT=", 15))
			user = 1;
		else if (!strcmp(envp[i], "LOOM_CPU_SPIN=step"))
			step = i;
	}
	if (step < 0 || user)
		return;
	envp[step] = (char *)"GOMP_SPINCOUNT=" SPIN_STEP_ROUNDS;
	spin_step_env = 1;
}

__attribute__((section(".preinit_array"), used)) static void (*const spin_preinit_fn)(int, char **,
										     char **) =
	spin_preinit;

__attribute__((constructor)) static void spin_env_restore(void)
{
	if (spin_step_env)
		setenv("LOOM_CPU_SPIN", "step", 1);
}
static pthread_mutex_t park_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t park_cv = PTHREAD_COND_INITIALIZER;
static unsigned park_gen;        /* a parked thread of this generation holds */
static int park_runs;            /* runs in progress that let it go */

static void *spin_park_step_main(void *arg)
{
	unsigned gen = (unsigned)(uintptr_t)arg;
#pragma omp parallel num_threads(2)
	{
		if (omp_get_thread_num() == 0) {
			pthread_mutex_lock(&park_lock);
			while (park_gen == gen)
				pthread_cond_wait(&park_cv, &park_lock);
			pthread_mutex_unlock(&park_lock);
		}
	}
	return NULL; /* the thread's end frees its OpenMP pool */
}

static void spin_park(void *(*fn)(void *), void *arg)
{
	pthread_attr_t at;
	pthread_t t;
	if (pthread_attr_init(&at))
		return;
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&at, 1 << 18);
	/* Without it loom is only slower on a busy machine: no error. */
	pthread_create(&t, &at, fn, arg);
	pthread_attr_destroy(&at);
}

static void spin_throttle_start(void)
{
	spin_step_mode = loom_opt_choice(LOOM_OPT_CPU_SPIN) == 0; /* step */
	if (!spin_step_mode) {
		spin_park(spin_throttle_main, NULL);
		return;
	}
	pthread_mutex_lock(&park_lock);
	spin_park(spin_park_step_main, (void *)(uintptr_t)park_gen);
	pthread_mutex_unlock(&park_lock);
}

void loom_cpu_spin_step_begin(void)
{
	loom_cpu_isa_get();
	if (!spin_step_mode)
		return;
	pthread_mutex_lock(&park_lock);
	if (park_runs++ == 0) {
		park_gen++;
		pthread_cond_broadcast(&park_cv);
	}
	pthread_mutex_unlock(&park_lock);
}

void loom_cpu_spin_step_end(void)
{
	if (!spin_step_mode)
		return;
	pthread_mutex_lock(&park_lock);
	if (park_runs > 0 && --park_runs == 0)
		spin_park(spin_park_step_main, (void *)(uintptr_t)park_gen);
	pthread_mutex_unlock(&park_lock);
}

const char *loom_cpu_spin_mode(void)
{
	loom_cpu_isa_get();
	return spin_step_mode ? "step" : "throttled";
}

int loom_cpu_spin_parked(void)
{
	loom_cpu_isa_get();
	pthread_mutex_lock(&park_lock);
	int parked = !spin_step_mode || park_runs == 0;
	pthread_mutex_unlock(&park_lock);
	return parked;
}

/*
 * Native bf16 products pay only where the core issues vdpbf16ps at well
 * above its fp32 FMA rate: on one avx512_bf16 machine it ran at half the
 * fp32 rate (bf16 then lost to the exact emulation, which widens to fp32),
 * on another at 1.86x. So the choice is measured, not read from cpuid:
 * about a millisecond of each loop (best of three, as the machine may be
 * busy), native at 1.5x or more. LOOM_CPU_BF16=native or =emulate decides
 * instead (native only where the CPU has the instruction).
 */
#define BF16_NATIVE_MIN_RATIO 1.5

static void bf16_choose(loom_cpu_isa isa)
{
	const int c = loom_opt_choice(LOOM_OPT_CPU_BF16); /* native|emulate */
	if (isa != LOOM_CPU_ISA_AVX512_BF16)
		return;
	float sink = 0;
	double f = 0, b = 0;
	for (int r = 0; r < 3; r++) {
		double fr = loom_cpu_peak_gflops(LOOM_CPU_PEAK_FP32_AVX512, 100000, &sink);
		double br = loom_cpu_peak_gflops(LOOM_CPU_PEAK_BF16_AVX512, 100000, &sink);
		f = fr > f ? fr : f;
		b = br > b ? br : b;
	}
	bf16_ratio = f > 0 ? b / f : 0;
	if (c == 0) {
		bf16_native = 1;
		bf16_why = "LOOM_CPU_BF16=native";
	} else if (c == 1) {
		bf16_why = "LOOM_CPU_BF16=emulate";
	} else {
		bf16_native = bf16_ratio >= BF16_NATIVE_MIN_RATIO;
		bf16_why = "measured";
	}
}

static void isa_choose(void)
{
	loom_cpu_isa isa = loom_cpu_isa_detect();
	const char *cap = loom_opt_env(LOOM_OPT_CPU_ISA);
	if (cap && *cap) {
		for (int i = LOOM_CPU_ISA_PORTABLE; i <= LOOM_CPU_ISA_AVX512_BF16; i++)
			if (!strcmp(cap, loom_cpu_isa_name((loom_cpu_isa)i)) && i < (int)isa)
				isa = (loom_cpu_isa)i;
	}
	/* oneDNN picks its own ISA; cap it at ours so that a forced lower
	 * path really runs the lower kernels. Must precede its first use. */
	static const dnnl_cpu_isa_t dnnl_cap[] = {
		[LOOM_CPU_ISA_PORTABLE] = dnnl_cpu_isa_avx2, /* unused: no oneDNN */
		[LOOM_CPU_ISA_AVX2] = dnnl_cpu_isa_avx2,
		[LOOM_CPU_ISA_AVX512] = dnnl_cpu_isa_avx512_core,
		[LOOM_CPU_ISA_AVX512_BF16] = dnnl_cpu_isa_all,
	};
	if (isa != LOOM_CPU_ISA_PORTABLE)
		dnnl_set_max_cpu_isa(dnnl_cap[isa]);
	isa_chosen = isa;
	bf16_choose(isa);
	spin_throttle_start();
}

loom_cpu_isa loom_cpu_isa_get(void)
{
	pthread_once(&isa_once, isa_choose);
	return isa_chosen;
}

static int is_t(char t)
{
	return t == 't' || t == 'T';
}

/*
 * The kernels call oneDNN's GEMMs from inside their own parallel regions, one
 * GEMM per thread, and so mean them to run on the calling thread. In a region
 * of several threads oneDNN sees omp_in_parallel() and does. In a region of
 * one (a product too small to split: the ConvNet's fc layer and its
 * gradients) the region is inactive, oneDNN opens a nested one of
 * omp_get_max_threads() threads, and libgomp keeps no pool for nested teams:
 * every such call created and ended a thread (3-5 ms instead of 0.05-0.25 on
 * the shared 2-core machine, bench/RESULTS.md). Inside any region, the GEMM
 * runs on one thread; the thread count is the calling task's own and is put
 * back after. Returns the count to put back, or 0.
 */
static int dnnl_serial_begin(void)
{
	if (omp_get_level() == 0 || omp_in_parallel())
		return 0;
	int prev = omp_get_max_threads();
	if (prev == 1)
		return 0;
	omp_set_num_threads(1);
	return prev;
}

static void dnnl_serial_end(int prev)
{
	if (prev)
		omp_set_num_threads(prev);
}

void loom_cpu_sgemm(char ta, char tb, int m, int n, int k, float alpha, const float *a,
		    int lda, const float *b, int ldb, float beta, float *c, int ldc)
{
	if (m <= 0 || n <= 0)
		return;
	if (loom_cpu_isa_get() != LOOM_CPU_ISA_PORTABLE) {
		int prev = dnnl_serial_begin();
		dnnl_status_t st = dnnl_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
		dnnl_serial_end(prev);
		if (st == dnnl_success)
			return;
	}
	cblas_sgemm(CblasRowMajor, is_t(ta) ? CblasTrans : CblasNoTrans,
		    is_t(tb) ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta,
		    c, ldc);
}

/*
 * The bf16 products' primitives (oneDNN's documented matmul), one per shape
 * and made once: the conv kernels ask for the same few shapes at every
 * step, from every thread. Past MATMUL_CACHE_MAX shapes a product gets a
 * primitive of its own, freed after it ran.
 */
#define MATMUL_CACHE_MAX 256

typedef struct matmul_key {
	int ta, tb, m, n, k, lda, ldb, ldc, accumulate, one_thread;
	float alpha;
} matmul_key;

static struct {
	pthread_mutex_t lock;
	int n;
	matmul_key key[MATMUL_CACHE_MAX];
	loom_cpu_dnnl_matmul *mm[MATMUL_CACHE_MAX];
} matmul_cache = { .lock = PTHREAD_MUTEX_INITIALIZER };

static loom_cpu_dnnl_matmul *matmul_bf16_get(const matmul_key *k, int *owned)
{
	loom_cpu_dnnl_matmul *mm = NULL;
	*owned = 0;
	pthread_mutex_lock(&matmul_cache.lock);
	for (int i = 0; i < matmul_cache.n && !mm; i++)
		if (!memcmp(&matmul_cache.key[i], k, sizeof(*k)))
			mm = matmul_cache.mm[i];
	if (!mm) {
		mm = loom_cpu_dnnl_matmul_new(k->ta, k->tb, k->m, k->n, k->k, k->lda, k->ldb, k->ldc,
					      k->alpha, 1, 0, k->accumulate, k->one_thread);
		if (mm && matmul_cache.n < MATMUL_CACHE_MAX) {
			matmul_cache.key[matmul_cache.n] = *k;
			matmul_cache.mm[matmul_cache.n++] = mm;
		} else {
			*owned = mm != NULL;
		}
	}
	pthread_mutex_unlock(&matmul_cache.lock);
	return mm;
}

int loom_cpu_gemm_bf16(char ta, char tb, int m, int n, int k, float alpha,
		       const uint16_t *a, int lda, const uint16_t *b, int ldb, float beta,
		       float *c, int ldc)
{
	if (loom_cpu_isa_get() != LOOM_CPU_ISA_AVX512_BF16)
		return -1;
	if (m <= 0 || n <= 0)
		return 0;
	if (beta != 0.0f && beta != 1.0f)
		return -1; /* the kernels ask for a new C or a sum into it */
	matmul_key key;
	memset(&key, 0, sizeof(key)); /* compared bytewise */
	key = (matmul_key){ is_t(ta), is_t(tb), m, n, k, lda, ldb, ldc, beta == 1.0f,
			    omp_in_parallel(), alpha };
	int owned, prev = dnnl_serial_begin();
	loom_cpu_dnnl_matmul *mm = matmul_bf16_get(&key, &owned);
	int rc = mm ? loom_cpu_dnnl_matmul_run(mm, a, b, NULL, c) : -1;
	dnnl_serial_end(prev);
	if (owned)
		loom_cpu_dnnl_matmul_free(mm);
	return rc;
}

int loom_cpu_bf16_use_native(void)
{
	loom_cpu_isa_get();
	return bf16_native;
}

double loom_cpu_bf16_measured_ratio(void)
{
	loom_cpu_isa_get();
	return bf16_ratio;
}

const char *loom_cpu_describe(char *buf, size_t size)
{
	loom_cpu_isa isa = loom_cpu_isa_get();
	int t = omp_get_max_threads();
	char ratio[48] = "";
	if (bf16_ratio > 0)
		snprintf(ratio, sizeof(ratio), "vdpbf16ps %.2fx fp32 FMA, ", bf16_ratio);
	snprintf(buf, size, "cpu: %d thread%s, %s kernels (%s), bf16 %s (%s%s)", t, t == 1 ? "" : "s",
		 loom_cpu_isa_name(isa), isa == LOOM_CPU_ISA_PORTABLE ? "openblas" : "onednn",
		 bf16_native ? "native" : "emulated", ratio, bf16_why);
	return buf;
}

void loom_cpu_set_threads(int n)
{
	omp_set_num_threads(n < 1 ? omp_get_num_procs() : n);
}
