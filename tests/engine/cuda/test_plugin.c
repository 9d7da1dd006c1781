/*
 * test_plugin.c — the CUDA backend as a shared object mapped on demand
 * (base/cuda_plugin.h): the file maps with every symbol resolved and
 * exports its entry alone; a CPU program never maps it, so no cuBLASLt is
 * loaded; --device cuda without a device is an error naming why; a single
 * process makes its own NCCL id (world 1 takes the local path).
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cuda_plugin.h"
#include "comm/comm_internal.h"
#include "engine/cuda/device.h"
#include "engine/program_internal.h"
#include "loom.h"

/* 1 when /proc/self/maps names a file containing part. */
static int mapped(const char *part)
{
	char line[4096];
	int found = 0;
	FILE *f = fopen("/proc/self/maps", "r");

	cr_assert_not_null(f);
	while (!found && fgets(line, sizeof line, f))
		found = strstr(line, part) != NULL;
	fclose(f);
	return found;
}

/* The plugin in this test's runfiles. */
static void plugin_path(char *buf, size_t len)
{
	const char *rf = getenv("TEST_SRCDIR");

	cr_assert_not_null(rf, "TEST_SRCDIR is not set: run under bazel test");
	snprintf(buf, len, "%s/loom/engine/cuda/%s", rf, LOOM_CUDA_PLUGIN_FILE);
}

/* x [5, 4] -> linear 4->3 -> CE: the smallest program with a step. */
static loom_status compile_tiny(loom_device dev, loom_program **p)
{
	loom_graph *g;
	int64_t xd[2] = { 5, 4 }, yd[1] = { 5 };
	loom_compile_opts o;
	loom_status st;

	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value x = loom_input(g, "x", LOOM_F32, 2, xd);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	loom_value loss = loom_softmax_cross_entropy(g, loom_layer_linear(g, "fc", x, 3, 1), y);
	loom_compile_opts_default(&o);
	o.device = dev;
	st = loom_compile(g, loss, &o, p);
	loom_graph_free(g);
	return st;
}

Test(cuda_plugin, shared_object_maps_and_exports_its_entry_alone)
{
	char path[4096];
	void *h;
	const loom_cuda_plugin *(*entry)(void);

	if (!loom_cuda_plugin_built())
		cr_skip_test("needs a build with the CUDA toolkit (no plugin was built)");
	plugin_path(path, sizeof path);
	h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	cr_assert_not_null(h, "%s", dlerror());
	*(void **)&entry = dlsym(h, LOOM_CUDA_PLUGIN_ENTRY);
	cr_assert_not_null(entry, "no %s in %s", LOOM_CUDA_PLUGIN_ENTRY, path);
	const loom_cuda_plugin *pl = entry();
	cr_assert_eq(pl->abi, LOOM_CUDA_PLUGIN_ABI);
	cr_assert_geq(pl->cuda_version, 12000);
	cr_assert_not_null(pl->backend());
	cr_assert_not_null(pl->nccl_unique_id);
	cr_assert_not_null(pl->nccl_backend_new);
	/* The loom code it carries stays private to it. */
	cr_assert_null(dlsym(h, "loom_errnf"), "the plugin exports loom_errnf");
	cr_assert_null(dlsym(h, "loom_cuda_backend_get"));
	cr_assert(mapped("libcublasLt"), "the plugin should bring cuBLASLt with it");
}

Test(cuda_plugin, cpu_program_never_maps_the_plugin)
{
	loom_program *p = NULL;
	float x[20] = { 0 };
	int32_t y[5] = { 0, 1, 2, 0, 1 };

	if (loom_cuda_device_count() > 0)
		cr_skip_test("needs a machine without a CUDA device (AUTO would pick it)");
	cr_assert_eq(compile_tiny(LOOM_DEVICE_AUTO, &p), LOOM_OK, "%s", loom_last_error());
	cr_assert_eq(loom_set_input(p, "x", x, LOOM_F32, 20), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_set_input(p, "y", y, LOOM_I32, 5), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	loom_program_free(p);
	cr_assert_not(loom_cuda_plugin_loaded());
	cr_assert_not(mapped(LOOM_CUDA_PLUGIN_FILE), "the plugin is mapped");
	cr_assert_not(mapped("libcublasLt"), "cuBLASLt is mapped in a CPU process");
	cr_assert_not(mapped("libcudnn"), "cuDNN is mapped in a CPU process");
	cr_assert_not(mapped("libnccl"), "NCCL is mapped in a CPU process");
}

Test(cuda_plugin, device_cuda_without_a_device_names_why)
{
	loom_program *p = NULL;

	if (loom_cuda_device_count() > 0)
		cr_skip_test("needs a machine without a CUDA device");
	cr_assert_eq(compile_tiny(LOOM_DEVICE_CUDA, &p), LOOM_ERR_UNSUPPORTED);
	const char *msg = loom_last_error();
	cr_assert_not_null(strstr(msg, "device cuda: no CUDA device is available: "), "%s", msg);
	/* The probe's own reason follows, never an empty one. */
	cr_assert_not_null(loom_cuda_probe_error());
	cr_assert_gt(strlen(loom_cuda_probe_error()), 0);
	cr_assert_not_null(strstr(msg, loom_cuda_probe_error()), "%s", msg);
	loom_program_free(p);
	cr_assert_not(loom_cuda_plugin_loaded());
}

Test(cuda_plugin, a_bad_plugin_path_is_named)
{
	char err[4096];

	if (!loom_cuda_plugin_built())
		cr_skip_test("needs a build with the CUDA toolkit (no plugin was built)");
	setenv("LOOM_CUDA_PLUGIN", "/nonexistent/dir/libloom_cuda.so", 1);
	cr_assert_null(loom_cuda_plugin_load(err, sizeof err));
	cr_assert_not_null(strstr(err, "/nonexistent/dir/libloom_cuda.so"), "%s", err);
}

Test(cuda_plugin, loads_from_the_runfiles)
{
	char err[4096];
	const loom_cuda_plugin *pl;

	if (!loom_cuda_plugin_built())
		cr_skip_test("needs a build with the CUDA toolkit (no plugin was built)");
	unsetenv("LOOM_CUDA_PLUGIN");
	pl = loom_cuda_plugin_load(err, sizeof err);
	cr_assert_not_null(pl, "%s", err);
	cr_assert(loom_cuda_plugin_loaded());
	cr_assert_not_null(pl->backend());
	/* Without a device the runtime says why, never a silent 0. */
	if (loom_cuda_device_count() == 0) {
		char why[512] = "";
		cr_assert_eq(pl->device_count(why, sizeof why), 0);
		cr_assert_gt(strlen(why), 0, "the runtime gave no reason");
	}
}

Test(cuda_plugin, world_1_makes_its_own_nccl_id)
{
	loom_comm_options o = { .bootstrap = LOOM_COMM_BOOT_SINGLE };
	loom_pg *pg = NULL;

	cr_assert_eq(loom_pg_init(&o, &pg), LOOM_OK, "%s", loom_pg_error(pg));
	cr_assert_eq(loom_pg_nccl_id_source(pg), LOOM_NCCL_ID_LOCAL);
	loom_pg_free(pg);
	if (loom_cuda_device_count() > 0)
		cr_skip_test("the device half needs a machine without a CUDA device");
	/* Asked for a device communicator with no device: refused naming why,
	 * before the plugin is mapped (NCCL's "address family 0" is gone). */
	o.want_device = 1;
	cr_assert_eq(loom_pg_init(&o, &pg), LOOM_ERR_UNSUPPORTED);
	cr_assert_not_null(strstr(loom_pg_error(pg), "no CUDA device for a device communicator"),
			   "%s", loom_pg_error(pg));
	loom_pg_free(pg);
	cr_assert_not(loom_cuda_plugin_loaded());
}
