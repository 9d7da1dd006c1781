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
#include "tests/engine/print_text.h"

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

/* ------------------------------------------------- fp8 state on a "device" */

/* A fake device that keeps fp8's delayed state apart from ts.fp8 (as the
 * CUDA backend does on the GPU): the CPU's kernels read and write dev_ts's
 * fp8 (run_begin hands them that), and the loom_backend_fp8 group moves it
 * to and from ts.fp8, counting each move. */
static loom_train_state dev_ts;
static int dev_uploads, dev_downloads, dev_step_ends;

static void fp8_copy(loom_fp8_state *to, const loom_fp8_state *from)
{
	memcpy(to->t, from->t, sizeof(*to->t) * (size_t)from->n);
	if (from->history_len) /* current scaling: none */
		memcpy(to->history, from->history,
		       sizeof(float) * (size_t)from->n * from->history_len);
	to->filled = from->filled;
	to->pos = from->pos;
}

static loom_status dev_upload(void *ctx, const loom_fp8_state *fs)
{
	(void)ctx;
	if (dev_ts.fp8.n != fs->n)
		cr_assert_eq(loom_fp8_state_init(&dev_ts.fp8, fs->n, fs->delayed, fs->history_len,
						 fs->margin), 0);
	fp8_copy(&dev_ts.fp8, fs);
	dev_uploads++;
	return LOOM_OK;
}

static loom_status dev_download(void *ctx, loom_fp8_state *fs)
{
	(void)ctx;
	fp8_copy(fs, &dev_ts.fp8);
	dev_downloads++;
	return LOOM_OK;
}

static loom_status dev_step_end(void *ctx, const loom_plan *plan, int reduced)
{
	(void)ctx, (void)plan;
	cr_assert_eq(reduced, 0, "one process: nothing reduced");
	loom_fp8_step_end(&dev_ts.fp8);
	dev_step_ends++;
	return LOOM_OK;
}

static loom_status dev_run_begin(void *ctx, const loom_plan *plan, const loom_arena *arena,
				 loom_train_state *ts, unsigned flags)
{
	dev_ts.scaler = ts->scaler;
	return loom_cpu_backend.run_begin(ctx, plan, arena, &dev_ts, flags);
}

static const loom_backend_fp8 dev_fp8 = {
	.fp8_upload = dev_upload,
	.fp8_download = dev_download,
	.fp8_step_end = dev_step_end,
};

static void fp8_steps(loom_program *p, int steps)
{
	const float x[24] = { 0.5f, -1, 2, 0.25f, 3, -0.5f, 1, 1.5f, -2, 0.75f, 1, -3,
			      0.1f, 0.2f, -0.3f, 4, 1, 1, -1, 0.5f, 2.5f, -1.5f, 0.5f, 1 };
	const int32_t y[6] = { 0, 1, 2, 1, 0, 2 };
	for (int s = 0; s < steps; s++) {
		cr_assert_eq(loom_set_input(p, "x", x, LOOM_F32, 24), LOOM_OK);
		cr_assert_eq(loom_set_input(p, "y", y, LOOM_I32, 6), LOOM_OK);
		cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	}
}

/* Every tensor's scales on a and b alike (the host view: a device's copy
 * brought back first). */
static void fp8_same_scales(loom_program *a, loom_program *b)
{
	cr_assert_eq(loom_fp8_tensor_count(a), loom_fp8_tensor_count(b));
	for (int i = 0; i < loom_fp8_tensor_count(b); i++) {
		loom_fp8_tensor_info ta, tb;
		cr_assert_eq(loom_fp8_tensor_get(a, i, &ta), LOOM_OK);
		cr_assert_eq(loom_fp8_tensor_get(b, i, &tb), LOOM_OK);
		cr_expect(ta.scale == tb.scale && ta.next_scale == tb.next_scale &&
				  ta.amax == tb.amax && ta.saturated == tb.saturated,
			  "%s: device scale %g next %g amax %g, cpu %g %g %g", tb.name, ta.scale,
			  ta.next_scale, ta.amax, tb.scale, tb.next_scale, tb.amax);
	}
}

/* Delayed scaling with its state on a device (loom_backend_fp8): accepted,
 * the state uploaded once at compile, the step end queued to the device
 * every step with no copy back, ts.fp8 brought back once when the host
 * reads it (the report), after a load put back; the scales the CPU's. */
Test(backend_core, fp8_delayed_state_on_the_device)
{
	loom_backend dev;
	loom_graph *g, *h;
	loom_program *p, *cpu;
	char path[] = "/tmp/loom_fp8_dev_XXXXXX";
	int fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	close(fd);

	fake_async_backend(&dev);
	dev.fp8 = &dev_fp8;
	dev.run_begin = dev_run_begin;
	dev_uploads = dev_downloads = dev_step_ends = 0;
	cr_assert_eq(fp8_net(&dev, LOOM_FP8_SCALING_DELAYED, &g, &p), LOOM_OK, "%s",
		     loom_last_error());
	cr_assert_eq(fp8_net(NULL, LOOM_FP8_SCALING_DELAYED, &h, &cpu), LOOM_OK);
	cr_assert(p->ts.fp8.delayed && dev_uploads == 1, "%d uploads", dev_uploads);
	fp8_steps(p, 3);
	fp8_steps(cpu, 3);
	cr_expect_eq(dev_step_ends, 3);
	cr_expect_eq(dev_downloads, 0, "a copy back per step");
	cr_expect_eq(p->ts.fp8.filled, 0, "ts.fp8 moved without a read");
	fp8_same_scales(p, cpu);
	cr_expect_eq(dev_downloads, 1, "the host view: one copy back, %d", dev_downloads);
	cr_expect_eq(p->ts.fp8.filled, 3);

	cr_assert_eq(loom_save(p, path), LOOM_OK, "%s", loom_program_error(p));
	fp8_steps(p, 2);
	cr_assert_eq(loom_load(p, path), LOOM_OK, "%s", loom_program_error(p));
	cr_expect_eq(dev_uploads, 2, "a load puts the state back on the device");
	cr_expect_eq(dev_ts.fp8.filled, 3, "the device's copy is the checkpoint's");
	loom_program_free(p);
	loom_program_free(cpu);
	loom_graph_free(g);
	loom_graph_free(h);
	loom_fp8_state_free(&dev_ts.fp8);
	unlink(path);
}

/* Current scaling on a device that keeps fp8's state (issue 42 item 6:
 * --amp-report's per-tensor scale, amax and saturated count, which the
 * casts record on the device): the tensors uploaded at compile, the
 * step end queued every step with no copy back, one download when the
 * report reads them; the report's text, every row included, the CPU's. */
Test(backend_core, fp8_current_state_on_the_device)
{
	loom_backend dev;
	loom_graph *g, *h;
	loom_program *p, *cpu;

	fake_async_backend(&dev);
	dev.fp8 = &dev_fp8;
	dev.run_begin = dev_run_begin;
	dev_uploads = dev_downloads = dev_step_ends = 0;
	cr_assert_eq(fp8_net(&dev, LOOM_FP8_SCALING_DEFAULT, &g, &p), LOOM_OK, "%s",
		     loom_last_error());
	cr_assert_eq(fp8_net(NULL, LOOM_FP8_SCALING_CURRENT, &h, &cpu), LOOM_OK);
	cr_assert(p->ts.fp8.n == 3 && !p->ts.fp8.delayed, "a device's default is current");
	cr_expect_eq(dev_uploads, 1, "%d uploads", dev_uploads);
	fp8_steps(p, 3);
	fp8_steps(cpu, 3);
	cr_expect_eq(dev_step_ends, 3);
	cr_expect_eq(dev_downloads, 0, "a copy back per step");
	char *a = print_text(loom_amp_report, p), *b = print_text(loom_amp_report, cpu);
	cr_expect_eq(dev_downloads, 1, "the report: one copy back, %d", dev_downloads);
	cr_assert(strstr(b, "fp8, current scaling"), "%s", b);
	cr_expect_str_eq(a, b, "the device's report\n%s\nthe CPU's\n%s", a, b);
	for (int i = 0; i < 3; i++) {
		loom_fp8_tensor_info ti;
		cr_assert_eq(loom_fp8_tensor_get(p, i, &ti), LOOM_OK);
		cr_expect(ti.amax > 0 && ti.scale > 1, "%s: amax %g scale %g, nothing recorded",
			  ti.name, ti.amax, ti.scale);
	}
	fp8_same_scales(p, cpu);
	free(a);
	free(b);
	loom_program_free(p);
	loom_program_free(cpu);
	loom_graph_free(g);
	loom_graph_free(h);
	loom_fp8_state_free(&dev_ts.fp8);
}
