/*
 * tests/engine/cuda/kprof_cupti.c — every kernel's GPU time in a process,
 * through CUPTI, for GPU hosts without Nsight Systems (gpu_kprof.sh's second
 * way). The CUDA driver loads it (CUDA_INJECTION64_PATH=libloom_kprof.so)
 * and calls InitializeInjection at cuInit; it records each kernel, graph
 * nodes included (CUPTI's default: per node), and at exit writes
 * LOOM_KPROF_CSV in nsys's cuda_gpu_kern_sum columns that gpu_kernels.py
 * reads (Total Time (ns), Instances, Avg (ns), Name; names demangled).
 * libcupti is opened at run time (LOOM_KPROF_CUPTI, then the usual names and
 * the toolkit's folders): the library links against nothing of CUDA.
 */
#include <cupti.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* From libstdc++ (linked): C++ kernel names arrive mangled. */
extern char *__cxa_demangle(const char *name, char *buf, size_t *len, int *status);

#define KPROF_SLOTS 16384 /* distinct kernel names; a GPT step has < 200 */
#define KPROF_BUFFER (8u << 20)

typedef struct {
	char *name; /* NULL: free slot */
	uint64_t ns;
	uint64_t count;
} kprof_slot;

static struct {
	CUptiResult (*reg)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
	CUptiResult (*enable)(CUpti_ActivityKind);
	CUptiResult (*flush)(uint32_t);
	CUptiResult (*next)(uint8_t *, size_t, CUpti_Activity **);
	CUptiResult (*dropped)(CUcontext, uint32_t, size_t *);
} cupti;

static kprof_slot slots[KPROF_SLOTS];
static uint64_t overflow_ns, overflow_count, dropped_records;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialised;

static uint64_t kprof_hash(const char *s)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */
	while (*s)
		h = (h ^ (unsigned char)*s++) * 1099511628211ull;
	return h;
}

/* Adds one kernel's run to its name's slot (called under lock). */
static void kprof_add(const char *name, uint64_t ns)
{
	uint64_t i = kprof_hash(name) % KPROF_SLOTS;
	for (int probe = 0; probe < KPROF_SLOTS; probe++, i = (i + 1) % KPROF_SLOTS) {
		kprof_slot *s = &slots[i];
		if (!s->name) {
			s->name = strdup(name);
			if (!s->name)
				break;
		} else if (strcmp(s->name, name) != 0) {
			continue;
		}
		s->ns += ns;
		s->count++;
		return;
	}
	overflow_ns += ns;
	overflow_count++;
}

static void CUPTIAPI kprof_buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
	*buffer = aligned_alloc(8, KPROF_BUFFER);
	*size = *buffer ? KPROF_BUFFER : 0;
	*max_records = 0;
}

static void CUPTIAPI kprof_buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer,
					    size_t size, size_t valid)
{
	CUpti_Activity *rec = NULL;
	size_t dropped = 0;
	pthread_mutex_lock(&lock);
	while (valid && cupti.next(buffer, valid, &rec) == CUPTI_SUCCESS) {
		if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ||
		    rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
			/* start, end and name sit at the same offsets in every
			 * version of the kernel record. */
			const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
			kprof_add(k->name ? k->name : "(unnamed)",
				  k->end > k->start ? k->end - k->start : 0);
		}
	}
	if (cupti.dropped && cupti.dropped(ctx, stream, &dropped) == CUPTI_SUCCESS)
		dropped_records += dropped;
	pthread_mutex_unlock(&lock);
	(void)size;
	free(buffer);
}

static int kprof_by_time(const void *a, const void *b)
{
	const kprof_slot *x = a, *y = b;
	return x->ns < y->ns ? 1 : x->ns > y->ns ? -1 : 0;
}

/* The name as a CSV field: demangled, quoted, quotes doubled. */
static void kprof_put_name(FILE *f, const char *name)
{
	int status = -1;
	char *plain = name[0] == '_' && name[1] == 'Z' ? __cxa_demangle(name, NULL, NULL, &status)
						       : NULL;
	const char *s = status == 0 && plain ? plain : name;
	fputc('"', f);
	for (; *s; s++) {
		if (*s == '"')
			fputc('"', f);
		fputc(*s, f);
	}
	fputc('"', f);
	free(plain);
}

static void kprof_write(void)
{
	const char *path = getenv("LOOM_KPROF_CSV");
	kprof_slot *all;
	size_t n = 0;
	uint64_t total = 0;
	FILE *f;

	if (cupti.flush)
		cupti.flush(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
	if (!path || !*path) {
		fprintf(stderr, "loom_kprof: LOOM_KPROF_CSV is not set; nothing written\n");
		return;
	}
	pthread_mutex_lock(&lock);
	all = malloc(sizeof(*all) * KPROF_SLOTS);
	for (size_t i = 0; all && i < KPROF_SLOTS; i++)
		if (slots[i].name) {
			all[n++] = slots[i];
			total += slots[i].ns;
		}
	pthread_mutex_unlock(&lock);
	if (!all || !(f = fopen(path, "w"))) {
		fprintf(stderr, "loom_kprof: cannot write %s\n", path);
		free(all);
		return;
	}
	qsort(all, n, sizeof(*all), kprof_by_time);
	fprintf(f, "Time (%%),Total Time (ns),Instances,Avg (ns),Name\n");
	for (size_t i = 0; i < n; i++) {
		fprintf(f, "%.1f,%llu,%llu,%.1f,", total ? 100.0 * all[i].ns / total : 0.0,
			(unsigned long long)all[i].ns, (unsigned long long)all[i].count,
			(double)all[i].ns / (double)all[i].count);
		kprof_put_name(f, all[i].name);
		fputc('\n', f);
	}
	fclose(f);
	fprintf(stderr, "loom_kprof: %zu kernels, %.3f ms of kernel time, into %s", n,
		total / 1e6, path);
	if (overflow_count || dropped_records)
		fprintf(stderr, " (%llu runs past the table, %llu records dropped by CUPTI)",
			(unsigned long long)overflow_count, (unsigned long long)dropped_records);
	fputc('\n', stderr);
	free(all);
}

/* libcupti: LOOM_KPROF_CUPTI, then by name (LD_LIBRARY_PATH: the toolkit's
 * lib64, PyTorch's nvidia/<lib>/lib), then the toolkit's own folders. */
static void *kprof_open_cupti(void)
{
	static const char *const names[] = {
		"libcupti.so.13", "libcupti.so.12", "libcupti.so",
		"/usr/local/cuda/extras/CUPTI/lib64/libcupti.so",
		"/usr/local/cuda/lib64/libcupti.so",
	};
	const char *env = getenv("LOOM_KPROF_CUPTI");
	void *h = env && *env ? dlopen(env, RTLD_NOW | RTLD_GLOBAL) : NULL;
	for (size_t i = 0; !h && i < sizeof(names) / sizeof(names[0]); i++)
		h = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
	if (!h) {
		char path[4096];
		const char *home = getenv("CUDA_HOME");
		if (home && *home) {
			snprintf(path, sizeof(path), "%s/extras/CUPTI/lib64/libcupti.so", home);
			h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
		}
	}
	return h;
}

/* What the CUDA driver calls when it loads an injection library; 1: ready. */
int InitializeInjection(void)
{
	void *h;
	if (initialised)
		return 1;
	initialised = 1;
	if (!(h = kprof_open_cupti())) {
		fprintf(stderr, "loom_kprof: no libcupti (LOOM_KPROF_CUPTI, LD_LIBRARY_PATH): %s\n",
			dlerror());
		return 0;
	}
	*(void **)&cupti.reg = dlsym(h, "cuptiActivityRegisterCallbacks");
	*(void **)&cupti.enable = dlsym(h, "cuptiActivityEnable");
	*(void **)&cupti.flush = dlsym(h, "cuptiActivityFlushAll");
	*(void **)&cupti.next = dlsym(h, "cuptiActivityGetNextRecord");
	*(void **)&cupti.dropped = dlsym(h, "cuptiActivityGetNumDroppedRecords");
	if (!cupti.reg || !cupti.enable || !cupti.flush || !cupti.next) {
		fprintf(stderr, "loom_kprof: libcupti lacks the activity API\n");
		return 0;
	}
	if (cupti.reg(kprof_buffer_requested, kprof_buffer_completed) != CUPTI_SUCCESS ||
	    cupti.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
		fprintf(stderr, "loom_kprof: CUPTI refused the kernel activity\n");
		return 0;
	}
	atexit(kprof_write);
	fprintf(stderr, "loom_kprof: recording kernels through CUPTI\n");
	return 1;
}
