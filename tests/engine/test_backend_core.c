/*
 * tests/engine/test_backend_core.c — the backend interface's shape
 * (engine/backend.h): a required core of at most LOOM_BACKEND_CORE
 * functions, every one filled by the CPU backend, and optional groups a
 * backend may leave NULL: a backend with the core alone (the CPU's
 * functions, no group) compiles and trains a small MLP to the CPU's very
 * losses, and what needs a group is turned off or refused by name.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "engine/program_internal.h"
#include "loom.h"
#include "tests/engine/fake_async.h"

typedef void (*any_fn)(void);

/* The core's functions: init through event_wait, one pointer each. */
static int core_size(void)
{
	return (int)((offsetof(loom_backend, event_wait) - offsetof(loom_backend, init)) /
		     sizeof(any_fn)) + 1;
}

Test(backend_core, has_at_most_the_core_size)
{
	cr_assert_leq(core_size(), LOOM_BACKEND_CORE, "the core has %d functions", core_size());
	cr_assert_leq(LOOM_BACKEND_CORE, 20, "the core may grow to %d", LOOM_BACKEND_CORE);
}

Test(backend_core, the_cpu_backend_fills_every_core_entry)
{
	const unsigned char *base = (const unsigned char *)&loom_cpu_backend;
	for (int i = 0; i < core_size(); i++) {
		any_fn f;
		memcpy(&f, base + offsetof(loom_backend, init) + (size_t)i * sizeof(f), sizeof(f));
		cr_expect_not_null((void *)(uintptr_t)f, "core entry %d is NULL", i);
	}
}

/* The CPU's core with every group left out. */
static loom_backend core_only(void)
{
	loom_backend b = loom_cpu_backend;
	b.name = "core-only";
	b.planning = NULL;
	b.accumulate = NULL;
	b.sharded = NULL;
	b.timing = NULL;
	b.async_loss = NULL;
	b.graph = NULL;
	b.marks = NULL;
	b.input = NULL;
	b.fp8 = NULL;
	return b;
}

static loom_backend bare;

/* x [6, 4] -> linear 4->8 -> relu -> linear 8->3 -> CE with y (the fake
 * device's MLP and inputs), AdamW with clipping, on backend be (NULL: the
 * CPU's own table). */
static loom_program *mlp(loom_graph **gp, const loom_backend *be)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t xd[2] = { 6, 4 }, yd[1] = { 6 };
	loom_value x = loom_input(g, "x", LOOM_F32, 2, xd);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	loom_value h = loom_relu(g, loom_layer_linear(g, "fc1", x, 8, 1));
	loom_value loss = loom_softmax_cross_entropy(g, loom_layer_linear(g, "fc2", h, 3, 1), y);
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim.kind = LOOM_OPTIM_ADAMW;
	o.optim.lr = 0.01;
	o.optim.clip_grad = 1.0;
	loom_program *p;
	loom_test_backend = be;
	loom_status st = loom_compile(g, loss, &o, &p);
	loom_test_backend = NULL;
	cr_assert_eq(st, LOOM_OK, "%s", loom_last_error());
	fake_mlp_inputs(p);
	*gp = g;
	return p;
}

static void train(loom_program *p, double *loss, int steps)
{
	for (int i = 0; i < steps; i++) {
		cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "step %d: %s", i,
			     loom_program_error(p));
		loss[i] = loom_loss(p);
	}
}

Test(backend_core, a_backend_with_only_the_core_trains_as_the_cpu_does)
{
	enum { STEPS = 5 };
	double want[STEPS], got[STEPS];
	loom_graph *g, *h;
	loom_program *p = mlp(&g, NULL);
	train(p, want, STEPS);
	loom_program_free(p);
	loom_graph_free(g);

	bare = core_only();
	p = mlp(&h, &bare);
	cr_assert_eq(p->be, &bare);
	/* LOOM_ASYNC_LOSS=1 needs async_loss: every step waits for its loss. */
	setenv("LOOM_ASYNC_LOSS", "1", 1);
	train(p, got, STEPS);
	unsetenv("LOOM_ASYNC_LOSS");
	for (int i = 0; i < STEPS; i++)
		cr_expect_eq(got[i], want[i], "step %d: %.17g, the CPU's %.17g", i, got[i], want[i]);
	loom_program_info i;
	loom_program_info_get(p, &i);
	cr_expect(i.graph_captures == 0 && i.graph_replays == 0 && i.host_syncs == 0,
		  "no counters without the timing group");
	cr_expect_not_null(strstr(i.graph_note, "records no graphs"), "note: %s", i.graph_note);
	loom_program_free(p);
	loom_graph_free(h);
}

Test(backend_core, what_needs_a_group_is_off_or_refused_by_name)
{
	loom_graph *g;
	bare = core_only();
	loom_program *p = mlp(&g, &bare);
	/* No accumulate group: gradient accumulation refused, naming it. */
	cr_assert_eq(loom_run(p, LOOM_RUN_ACCUMULATE), LOOM_ERR_UNSUPPORTED);
	cr_expect_not_null(strstr(loom_program_error(p), "core-only backend"), "%s",
			   loom_program_error(p));
	loom_program_free(p);
	loom_graph_free(g);
	p = mlp(&g, &bare);
	/* No input group: loom_input_buffer hands out the program's own
	 * buffer, uploaded at commit. */
	float *x = NULL;
	cr_assert_eq(loom_input_buffer(p, "x", LOOM_F32, 24, (void **)&x), LOOM_OK, "%s",
		     loom_program_error(p));
	for (int i = 0; i < 24; i++)
		x[i] = (float)((i * 7) % 11) / 11.0f - 0.5f;
	cr_assert_eq(loom_input_commit(p, "x"), LOOM_OK, "%s", loom_program_error(p));
	/* No timing group: a trace has no spans to read, and says so. */
	char path[] = "/tmp/loom_core_trace_XXXXXX";
	int fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	close(fd);
	cr_assert_eq(loom_trace_start(p, path), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_trace_stop(p), LOOM_OK, "%s", loom_program_error(p));
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f);
	char *buf = calloc(1, 1 << 20);
	size_t n = fread(buf, 1, (1 << 20) - 1, f);
	fclose(f);
	unlink(path);
	cr_assert_gt(n, 0);
	cr_expect_null(strstr(buf, "\"name\":\"linear"), "a node span without timers: %.400s", buf);
	cr_expect_null(strstr(buf, "\"lost_spans\":0}"), "the lost spans counted: %.400s", buf);
	free(buf);
	/* No planning group: --dump-graph has no notes, and says no more. */
	char *dump = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&dump, &len);
	cr_assert_not_null(m);
	loom_program_dump(p, m);
	fclose(m);
	cr_expect_gt(len, 0);
	free(dump);
	loom_program_free(p);
	loom_graph_free(g);
}

/* fp8 on x [6, 4] -> linear 4->3 -> CE, every product in fp8, recipe r, on
 * backend be: the status, and the program on success. */
static loom_status fp8_net(const loom_backend *be, int r, loom_graph **gp, loom_program **pp)
{
	cr_assert_eq(loom_graph_new(gp), LOOM_OK);
	int64_t xd[2] = { 6, 4 }, yd[1] = { 6 };
	loom_value x = loom_input(*gp, "x", LOOM_F32, 2, xd);
	loom_value y = loom_input(*gp, "y", LOOM_I32, 1, yd);
	loom_value loss = loom_softmax_cross_entropy(*gp, loom_layer_linear(*gp, "fc", x, 3, 1), y);
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.amp.level = LOOM_O1;
	o.amp.half = LOOM_BF16;
	o.amp.fp8 = 1;
	o.amp.fp8_all_products = 1;
	o.amp.fp8_scaling = r;
	*pp = NULL;
	loom_test_backend = be;
	loom_status st = loom_compile(*gp, loss, &o, pp);
	loom_test_backend = NULL;
	return st;
}

/* Delayed scaling's histories and scales are state its kernels read and
 * write: a backend without host memory (a device's) and without a device
 * copy (loom_backend_fp8) runs the default recipe as current scaling and
 * refuses delayed by name; the CPU's default is delayed. */
Test(backend_core, fp8_delayed_scaling_needs_host_memory)
{
	loom_backend dev;
	loom_graph *g;
	loom_program *p;

	fake_async_backend(&dev);
	cr_assert_eq(fp8_net(&dev, LOOM_FP8_SCALING_DEFAULT, &g, &p), LOOM_OK, "%s",
		     loom_last_error());
	cr_assert(p->ts.fp8.n > 0 && !p->ts.fp8.delayed, "the device's default is current");
	loom_program_free(p);
	loom_graph_free(g);

	cr_assert_neq(fp8_net(&dev, LOOM_FP8_SCALING_DELAYED, &g, &p), LOOM_OK);
	cr_assert(strstr(loom_last_error(), "delayed scaling on the fake-async backend") &&
			  strstr(loom_last_error(), "its own amax") &&
			  strstr(loom_last_error(), "fake-async"),
		  "%s", loom_last_error());
	loom_program_free(p); /* a refused compile hands back its program */
	loom_graph_free(g);

	cr_assert_eq(fp8_net(NULL, LOOM_FP8_SCALING_DEFAULT, &g, &p), LOOM_OK, "%s",
		     loom_last_error());
	cr_assert(p->ts.fp8.delayed, "the CPU's default is delayed");
	loom_program_free(p);
	loom_graph_free(g);
}
