/*
 * base/cuda_plugin.c — counting CUDA devices through the driver and mapping
 * the CUDA plugin (libloom_cuda.so) only when it is needed. Neither needs a
 * CUDA header: the few driver calls are declared here with plain types.
 */
#define _GNU_SOURCE
#include "base/cuda_plugin.h"
#include "base/options.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The driver API's types and the two attributes used (cuda.h). */
typedef int cu_result; /* CUresult: 0 is CUDA_SUCCESS */
typedef int cu_device; /* CUdevice */
#define CU_ATTR_CC_MAJOR 75 /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
#define CU_ATTR_CC_MINOR 76 /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR */

typedef struct cu_driver {
	cu_result (*init)(unsigned flags);
	cu_result (*driver_version)(int *v);
	cu_result (*device_count)(int *n);
	cu_result (*device_get)(cu_device *d, int ordinal);
	cu_result (*device_name)(char *name, int len, cu_device d);
	cu_result (*device_mem)(size_t *bytes, cu_device d);
	cu_result (*device_attr)(int *v, int attr, cu_device d);
	cu_result (*error_name)(cu_result r, const char **s);
	cu_result (*error_string)(cu_result r, const char **s);
} cu_driver;

/* The plugin linked into the binary itself (the CUDA tests), else NULL. */
extern const loom_cuda_plugin *loom_cuda_plugin_entry(void) __attribute__((weak));

static struct {
	pthread_mutex_t mu;
	int probed, count, driver_version;
	char why[512];
	cu_driver cu;
	int load_tried;
	const loom_cuda_plugin *plugin;
	char load_err[2048];
} g = {.mu = PTHREAD_MUTEX_INITIALIZER};

int loom_cuda_plugin_built(void)
{
#ifdef LOOM_CUDA_PLUGIN_BUILT
	return 1;
#else
	return 0;
#endif
}

/* "cuInit: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)". */
static void cu_describe(const char *call, cu_result r, char *buf, size_t len)
{
	const char *name = NULL, *text = NULL;

	if (g.cu.error_name)
		g.cu.error_name(r, &name);
	if (g.cu.error_string)
		g.cu.error_string(r, &text);
	snprintf(buf, len, "%s: %s (%s)", call, name ? name : "CUDA error",
		 text ? text : "no description");
	if (!name)
		snprintf(buf + strlen(buf), len - strlen(buf), " [%d]", r);
}

#define CU_SYM(field, sym)                                                      \
	do {                                                                    \
		*(void **)&g.cu.field = dlsym(lib, sym);                        \
		if (!g.cu.field) {                                              \
			snprintf(g.why, sizeof g.why,                           \
				 "the CUDA driver library has no %s: driver too old", \
				 sym);                                          \
			return 0;                                               \
		}                                                               \
	} while (0)

/* Under g.mu: fills g.cu from libcuda.so.1 and counts devices. */
static int probe_locked(void)
{
	void *lib;
	cu_result r;
	int n = 0;

	lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		snprintf(g.why, sizeof g.why, "no CUDA driver: %s", dlerror());
		return 0;
	}
	CU_SYM(init, "cuInit");
	CU_SYM(driver_version, "cuDriverGetVersion");
	CU_SYM(device_count, "cuDeviceGetCount");
	CU_SYM(device_get, "cuDeviceGet");
	CU_SYM(device_name, "cuDeviceGetName");
	CU_SYM(device_mem, "cuDeviceTotalMem_v2");
	CU_SYM(device_attr, "cuDeviceGetAttribute");
	CU_SYM(error_name, "cuGetErrorName");
	CU_SYM(error_string, "cuGetErrorString");
	if (g.cu.driver_version(&g.driver_version) != 0)
		g.driver_version = 0;
	r = g.cu.init(0);
	if (r != 0) {
		cu_describe("cuInit", r, g.why, sizeof g.why);
		return 0;
	}
	r = g.cu.device_count(&n);
	if (r != 0) {
		cu_describe("cuDeviceGetCount", r, g.why, sizeof g.why);
		return 0;
	}
	if (n == 0)
		snprintf(g.why, sizeof g.why,
			 "the CUDA driver (version %d.%d) sees no device (CUDA_VISIBLE_DEVICES=%s)",
			 g.driver_version / 1000, g.driver_version % 1000 / 10,
			 loom_env("CUDA_VISIBLE_DEVICES") ? loom_env("CUDA_VISIBLE_DEVICES")
							: "unset");
	return n;
}

int loom_cuda_probe(char *why, size_t whylen)
{
	int n;

	pthread_mutex_lock(&g.mu);
	if (!g.probed) {
		g.count = probe_locked();
		g.probed = 1;
	}
	n = g.count;
	if (why && whylen)
		snprintf(why, whylen, "%s", n > 0 ? "" : g.why);
	pthread_mutex_unlock(&g.mu);
	return n;
}

int loom_cuda_driver_version(void)
{
	loom_cuda_probe(NULL, 0);
	return g.driver_version;
}

loom_status loom_cuda_probe_device_name(int dev, char *buf, size_t len)
{
	char why[512];
	cu_device d;
	cu_result r;
	size_t mem = 0;
	int major = 0, minor = 0, n;
	char name[256];

	if (!buf || len == 0)
		return LOOM_ERR_INVALID;
	n = loom_cuda_probe(why, sizeof why);
	if (dev < 0 || dev >= n) {
		snprintf(buf, len, "no CUDA device %d (this machine has %d%s%s)", dev, n,
			 n ? "" : ": ", why);
		return LOOM_ERR_INVALID;
	}
	if ((r = g.cu.device_get(&d, dev)) != 0) {
		cu_describe("cuDeviceGet", r, buf, len);
		return LOOM_ERR_BACKEND;
	}
	if ((r = g.cu.device_name(name, sizeof name, d)) != 0 ||
	    (r = g.cu.device_mem(&mem, d)) != 0 ||
	    (r = g.cu.device_attr(&major, CU_ATTR_CC_MAJOR, d)) != 0 ||
	    (r = g.cu.device_attr(&minor, CU_ATTR_CC_MINOR, d)) != 0) {
		cu_describe("device query", r, buf, len);
		return LOOM_ERR_BACKEND;
	}
	snprintf(buf, len, "%s (sm_%d%d, %.1f GiB)", name, major, minor,
		 (double)mem / (1024.0 * 1024.0 * 1024.0));
	return LOOM_OK;
}

/* Appends to g.load_err, "; "-separated. */
static void load_note(const char *fmt, const char *a, const char *b)
{
	size_t used = strlen(g.load_err);

	if (used + 3 >= sizeof g.load_err)
		return;
	snprintf(g.load_err + used, sizeof g.load_err - used, "%s", used ? "; " : "");
	used = strlen(g.load_err);
	snprintf(g.load_err + used, sizeof g.load_err - used, fmt, a, b);
}

/* dlopen(path) if it names a file (or, with must_exist 0, any name the
 * dynamic linker may find); NULL with a note otherwise. */
static void *try_open(const char *path, int must_exist)
{
	void *h;

	if (must_exist && access(path, F_OK) != 0)
		return NULL;
	h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h && (must_exist || access(path, F_OK) == 0))
		load_note("%s%s", "", dlerror());
	return h;
}

/* Under g.mu: finds the shared object and takes its entry; NULL with
 * g.load_err on failure. */
typedef const loom_cuda_plugin *(*plugin_entry_fn)(void);

/* Opens the plugin: LOOM_CUDA_PLUGIN's file when set (and nothing else),
 * else the first found next to the executable, in its runfiles or on the
 * library path. NULL, with a note, when none opens. */
static void *open_plugin(void)
{
	char exe[PATH_MAX], path[PATH_MAX + 64];
	const char *env, *rf;
	void *h = NULL;
	ssize_t n;

	env = loom_opt_env(LOOM_OPT_CUDA_PLUGIN);
	if (env && *env) {
		h = try_open(env, 0);
		if (!h && !g.load_err[0])
			load_note("LOOM_CUDA_PLUGIN=%s: %s", env, dlerror());
		return h;
	}
	n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	exe[n > 0 ? n : 0] = '\0';
	if (n > 0) {
		char *slash = strrchr(exe, '/');
		snprintf(path, sizeof path, "%.*s/%s", slash ? (int)(slash - exe) : 0, exe,
			 LOOM_CUDA_PLUGIN_FILE);
		h = try_open(path, 1);
	}
	if (!h && n > 0) {
		snprintf(path, sizeof path, "%s.runfiles/loom/engine/cuda/%s", exe,
			 LOOM_CUDA_PLUGIN_FILE);
		h = try_open(path, 1);
	}
	if (!h && ((rf = loom_env("RUNFILES_DIR")) || (rf = loom_env("TEST_SRCDIR")))) {
		snprintf(path, sizeof path, "%s/loom/engine/cuda/%s", rf, LOOM_CUDA_PLUGIN_FILE);
		h = try_open(path, 1);
	}
	if (!h)
		h = try_open(LOOM_CUDA_PLUGIN_FILE, 0);
	if (!h && !g.load_err[0])
		load_note("%s was not found next to the executable, in its "
			  "runfiles or on the library path; set LOOM_CUDA_PLUGIN=%s",
			  LOOM_CUDA_PLUGIN_FILE, "/path/to/" LOOM_CUDA_PLUGIN_FILE);
	return h;
}

/* The plugin's entry point, from the shared object when it is not linked
 * in. NULL, with a note, when there is none. */
static plugin_entry_fn find_entry(void)
{
	plugin_entry_fn entry;
	void *h;

	if (!loom_cuda_plugin_built()) {
		load_note("%s%s", "loom was built without the CUDA toolkit, so it has no ",
			  "CUDA backend");
		return NULL;
	}
	h = open_plugin();
	if (!h)
		return NULL;
	*(void **)&entry = dlsym(h, LOOM_CUDA_PLUGIN_ENTRY);
	if (!entry) {
		load_note("%s has no %s: not a loom CUDA plugin", LOOM_CUDA_PLUGIN_FILE,
			  LOOM_CUDA_PLUGIN_ENTRY);
		dlclose(h);
	}
	return entry;
}

/* Whether this loom and the plugin were built together, and the driver
 * runs the CUDA the plugin was built with; a note says which is not. */
static int plugin_fits(const loom_cuda_plugin *pl)
{
	if (!pl || pl->abi != LOOM_CUDA_PLUGIN_ABI) {
		char a[32], b[32];
		snprintf(a, sizeof a, "%d", pl ? pl->abi : -1);
		snprintf(b, sizeof b, "%d", LOOM_CUDA_PLUGIN_ABI);
		load_note("the CUDA plugin has interface version %s, this loom expects %s: "
			  "rebuild them together", a, b);
		return 0;
	}
	if (!g.probed) {
		g.count = probe_locked();
		g.probed = 1;
	}
	int drv = g.driver_version;
	if (drv > 0 && drv < pl->cuda_version) {
		char a[32], b[32];
		snprintf(a, sizeof a, "%d.%d", drv / 1000, drv % 1000 / 10);
		snprintf(b, sizeof b, "%d.%d", pl->cuda_version / 1000,
			 pl->cuda_version % 1000 / 10);
		load_note("the NVIDIA driver supports CUDA %s, loom's CUDA backend was built "
			  "with CUDA %s: update the driver", a, b);
		return 0;
	}
	return 1;
}

static const loom_cuda_plugin *load_locked(void)
{
	plugin_entry_fn entry = loom_cuda_plugin_entry;
	const loom_cuda_plugin *pl;

	if (!entry && !(entry = find_entry()))
		return NULL;
	pl = entry();
	return plugin_fits(pl) ? pl : NULL;
}

const loom_cuda_plugin *loom_cuda_plugin_load(char *err, size_t errlen)
{
	const loom_cuda_plugin *pl;

	pthread_mutex_lock(&g.mu);
	if (!g.load_tried) {
		g.plugin = load_locked();
		g.load_tried = 1;
	}
	pl = g.plugin;
	if (!pl && err && errlen)
		snprintf(err, errlen, "CUDA backend unavailable: %s", g.load_err);
	pthread_mutex_unlock(&g.mu);
	return pl;
}

int loom_cuda_plugin_loaded(void)
{
	int on;

	pthread_mutex_lock(&g.mu);
	on = g.plugin != NULL;
	pthread_mutex_unlock(&g.mu);
	return on;
}
