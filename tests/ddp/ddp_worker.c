/*
 * tests/ddp/ddp_worker.c — one rank of the data-parallel training tests
 * (test_ddp.sh starts it under mpirun, env:// or the launcher). argv[1]
 * names the scenario; the rank prints "rank R: OK ..." or "rank R: ERROR
 * <status>: <message>" and exits 0 or 1, so the script checks every rank.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm/launch.h"
#include "loom.h"
#include "loom_io.h"
#include "tests/ddp/worker_util.h"

static int rank, world;

/* The MLP, or conv 3x3 (4 channels) + batch norm + relu + max-pool + linear
 * on 1x8x8 images. */
static void build(worker_model *m, int batch, int conv)
{
	if (!conv) {
		worker_mlp(m, batch, 7);
		return;
	}
	worker_begin(m, batch, 64, 7);
	loom_graph *g = m->g;
	int64_t xd[4] = { batch, 1, 8, 8 }, yd[1] = { batch }, wd[4] = { 4, 1, 3, 3 }, c[1] = { 4 },
		fw[2] = { WORKER_CLASSES, 64 }, fb[1] = { WORKER_CLASSES };
	loom_value x = loom_input(g, "x", LOOM_F32, 4, xd);
	loom_value w = worker_param(m, "c1.weight", 4, wd, LOOM_INIT_KAIMING_UNIFORM, 9);
	loom_value b = worker_param(m, "c1.bias", 1, c, LOOM_INIT_UNIFORM_FAN_IN, 9);
	loom_value h = loom_conv2d(g, x, w, b, 1, 1);
	loom_value ga = worker_param(m, "bn.weight", 1, c, LOOM_INIT_ONES, 0);
	loom_value be = worker_param(m, "bn.bias", 1, c, LOOM_INIT_ZEROS, 0);
	loom_value rm = loom_buffer(g, "bn.running_mean", LOOM_F32, 1, c, LOOM_INIT_ZEROS);
	loom_value rv = loom_buffer(g, "bn.running_var", LOOM_F32, 1, c, LOOM_INIT_ONES);
	h = loom_batchnorm2d(g, h, ga, be, rm, rv, 0.1, 1e-5);
	h = loom_maxpool2d(g, loom_relu(g, h), 2, 2, 0);
	h = loom_flatten(g, h);
	w = worker_param(m, "fc.weight", 2, fw, LOOM_INIT_KAIMING_UNIFORM, 64);
	b = worker_param(m, "fc.bias", 1, fb, LOOM_INIT_UNIFORM_FAN_IN, 64);
	h = loom_linear(g, h, w, b);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	m->loss = loom_softmax_cross_entropy(g, h, y);
}

static int sync_bn; /* compile() sets loom_compile_opts.sync_bn */

static loom_status compile(worker_model *m, loom_pg *pg, loom_opt_level level, double lr)
{
	loom_compile_opts o;
	worker_opts(&o, pg, level, lr, 0.9);
	o.sync_bn = sync_bn;
	/* Small buckets so that the tiny models still have several. */
	o.bucket_cap_mb = 0.002;
	o.first_bucket_mb = 0.0005;
	return loom_compile(m->g, m->loss, &o, &m->p);
}

/* The batch of global step `step` that rank r of w reads: rows [r*B, (r+1)*B)
 * of a global batch of w*B deterministic samples. */
static loom_status feed(worker_model *m, int step, int r, int w, double poison)
{
	return worker_feed(m, ((long)step * w + r) * m->batch, poison);
}

static loom_opt_level level_of(const char *s)
{
	return s && strcmp(s, "O2") == 0 ? LOOM_O2 : s && strcmp(s, "O1") == 0 ? LOOM_O1 : LOOM_O0;
}

/* Trains 8 steps; after each, every rank's parameters are bit-identical. */
static int identical(loom_pg *pg, const char *lv, int conv)
{
	worker_model m = { 0 };
	build(&m, 4, conv);
	loom_status st = compile(&m, pg, level_of(lv), 0.05);
	if (st)
		return worker_free(worker_fail("compile", st, loom_last_error()), &m, NULL);
	for (int s = 0; s < 8; s++) {
		if ((st = feed(&m, s, rank, world, 0)) || (st = loom_run(m.p, LOOM_RUN_TRAIN)))
			return worker_free(worker_fail("step", st, loom_program_error(m.p)), &m, NULL);
		int same = worker_same_everywhere(pg, worker_param_hash(&m));
		if (same != 1) {
			printf("rank %d: DIFFER after step %d\n", rank, s + 1);
			return worker_free(1, &m, NULL);
		}
	}
	loom_program_info info;
	loom_program_info_get(m.p, &info);
	printf("rank %d: OK identical %s %s%s world %d steps 8 loss %.6f\n", rank, lv,
	       conv ? "convnet" : "mlp", sync_bn ? " sync_bn" : "", world, loom_loss(m.p));
	return worker_free(0, &m, NULL);
}

/* N ranks at batch B against one process at batch N*B, 20 SGD steps (no
 * momentum), O0: the same parameters within 1e-5 relative. */
static int equiv(loom_pg *pg)
{
	worker_model d = { 0 }, one = { 0 };
	int B = 4;
	build(&d, B, 0);
	loom_compile_opts o;
	worker_opts(&o, pg, LOOM_O0, 0.1, 0);
	o.bucket_cap_mb = 0.002;
	o.first_bucket_mb = 0.0005;
	loom_status st = loom_compile(d.g, d.loss, &o, &d.p);
	if (st)
		return worker_free(worker_fail("compile", st, loom_last_error()), &d, &one);
	build(&one, B * world, 0);
	o.pg = NULL;
	if ((st = loom_compile(one.g, one.loss, &o, &one.p)))
		return worker_free(worker_fail("compile (one process)", st, loom_last_error()), &d, &one);
	for (int s = 0; s < 20; s++) {
		if ((st = feed(&d, s, rank, world, 0)) || (st = loom_run(d.p, LOOM_RUN_TRAIN)))
			return worker_free(worker_fail("step", st, loom_program_error(d.p)), &d, &one);
		if ((st = feed(&one, s, 0, 1, 0)) || (st = loom_run(one.p, LOOM_RUN_TRAIN)))
			return worker_free(worker_fail("step (one process)", st, loom_program_error(one.p)), &d, &one);
	}
	double worst = worker_param_rel_diff(&d, &one);
	/* And the training moved the weights: a no-op would match too. */
	printf("rank %d: %s equiv world %d batch %d vs 1 x %d: max relative difference %.3g\n",
	       rank, worst <= 1e-5 ? "OK" : "WRONG", world, B, B * world, worst);
	return worker_free(worst <= 1e-5 ? 0 : 1, &d, &one);
}

/* Rank 1 builds a graph of another batch size: every rank's compile fails
 * naming the first differing node. */
static int mismatch(loom_pg *pg)
{
	worker_model m = { 0 };
	build(&m, rank == 1 ? 8 : 4, 0);
	loom_status st = compile(&m, pg, LOOM_O0, 0.05);
	if (st)
		return worker_free(worker_fail("compile", st, loom_last_error()), &m, NULL);
	printf("rank %d: OK compiled (no mismatch seen)\n", rank);
	return worker_free(0, &m, NULL);
}

/* LOOM_TEST_VICTIM kills itself (SIGKILL) at step 3; the others must fail
 * naming it within the timeout. */
static int die(loom_pg *pg)
{
	worker_model m = { 0 };
	const char *v = getenv("LOOM_TEST_VICTIM");
	int victim = v ? atoi(v) : 1;
	build(&m, 4, 0);
	loom_status st = compile(&m, pg, LOOM_O0, 0.05);
	if (st)
		return worker_free(worker_fail("compile", st, loom_last_error()), &m, NULL);
	for (int s = 0; s < 10; s++) {
		if (s == 3 && rank == victim) {
			fflush(stdout);
			raise(SIGKILL);
		}
		if ((st = feed(&m, s, rank, world, 0)) || (st = loom_run(m.p, LOOM_RUN_TRAIN)))
			return worker_free(worker_fail("step", st, loom_program_error(m.p)), &m, NULL);
	}
	printf("rank %d: OK survived (no death seen)\n", rank);
	return worker_free(0, &m, NULL);
}

/* O1: rank 1 alone feeds an image with 1e30 at step 3; every rank skips
 * that step (and only it) and keeps the same scale and parameters. */
static int overflow(loom_pg *pg)
{
	worker_model m = { 0 };
	build(&m, 4, 1);
	loom_status st = compile(&m, pg, LOOM_O1, 0.05);
	if (st)
		return worker_free(worker_fail("compile", st, loom_last_error()), &m, NULL);
	for (int s = 0; s < 6; s++) {
		double poison = s == 3 && rank == 1 ? 1e30 : 0;
		if ((st = feed(&m, s, rank, world, poison)) || (st = loom_run(m.p, LOOM_RUN_TRAIN)))
			return worker_free(worker_fail("step", st, loom_program_error(m.p)), &m, NULL);
	}
	loom_program_info info;
	loom_program_info_get(m.p, &info);
	int same = worker_same_everywhere(pg, worker_param_hash(&m));
	printf("rank %d: %s overflow skipped %lld steps %lld scale %g identical %d\n", rank,
	       info.skipped_steps == 1 && same == 1 ? "OK" : "WRONG", (long long)info.skipped_steps,
	       (long long)loom_step_count(m.p), info.loss_scale, same);
	return worker_free(info.skipped_steps == 1 && same == 1 ? 0 : 1, &m, NULL);
}

/* Checkpoints across world sizes (the batch is per rank, as in DDP, so the
 * graph is the same at any world size): `save PATH K` trains K steps and
 * rank 0 saves; `load PATH` loads on every rank, prints the hash of what it
 * loaded (the script compares it with the saver's), trains 3 more steps
 * and checks the ranks still agree bit for bit. */
static int ckpt(loom_pg *pg, const char *what, const char *path, int k)
{
	worker_model m = { 0 };
	build(&m, 4, 0);
	loom_status st = compile(&m, pg, LOOM_O0, 0.05);
	if (st)
		return worker_free(worker_fail("compile", st, loom_last_error()), &m, NULL);
	int load = strcmp(what, "load") == 0;
	if (load && (st = loom_load(m.p, path)))
		return worker_free(worker_fail("load", st, loom_program_error(m.p)), &m, NULL);
	int s0 = (int)loom_step_count(m.p);
	uint64_t h0 = worker_param_hash(&m);
	for (int s = s0; s < (load ? s0 + 3 : k); s++)
		if ((st = feed(&m, s, rank, world, 0)) || (st = loom_run(m.p, LOOM_RUN_TRAIN)))
			return worker_free(worker_fail("step", st, loom_program_error(m.p)), &m, NULL);
	if (!load && rank == 0 && (st = loom_save(m.p, path)))
		return worker_free(worker_fail("save", st, loom_program_error(m.p)), &m, NULL);
	int same = worker_same_everywhere(pg, worker_param_hash(&m));
	printf("rank %d: %s %s world %d step %lld hash %016llx\n", rank, same == 1 ? "OK" : "DIFFER",
	       what, world, (long long)(load ? s0 : loom_step_count(m.p)),
	       (unsigned long long)(load ? h0 : worker_param_hash(&m)));
	return worker_free(same == 1 ? 0 : 1, &m, NULL);
}

/* ------------------------------------------------------------------ ZeRO-1 */

/* The conv model compiled for plain data parallelism or ZeRO-1 (zero), with
 * SGD (momentum 0.9) or AdamW. */
static int zero_bucket_small;
static int zero_prefetch; /* loom_compile_opts.zero_prefetch (ZeRO-3) */

static loom_status compile_zero(worker_model *m, loom_pg *pg, loom_opt_level level, int adamw,
				int zero, double clip)
{
	loom_compile_opts o;
	worker_opts(&o, pg, level, adamw ? 0.01 : 0.05, 0.9);
	o.optim.clip_grad = clip;
	if (adamw) {
		o.optim.kind = LOOM_OPTIM_ADAMW;
		o.optim.weight_decay = 0.01;
	}
	o.bucket_cap_mb = 0.002;
	o.first_bucket_mb = 0.0005;
	/* ZeRO-2's scenarios (zero_bucket_small): buckets of some 64 floats, so
	 * that the few shards and buckets in flight weigh less than them all. */
	if (zero_bucket_small) {
		o.bucket_cap_mb = 0.00025;
		o.first_bucket_mb = 0.00025;
	}
	o.zero_stage = zero;
	o.zero_prefetch = zero_prefetch;
	return loom_compile(m->g, m->loss, &o, &m->p);
}

/* 20 steps of plain data parallelism and of ZeRO-1 side by side on the same
 * batches: the parameters after every step equal bit for bit, the same on
 * every rank, and ZeRO's optimizer state is this rank's shard (about 1 /
 * world of plain's). clip > 0: both clip the global gradient norm to clip
 * (loom_optim_opts.clip_grad); ZeRO's norm is the shards' sums of squares added
 * over the ranks, plain's the pieces' in slot order, so the norms may
 * differ in the last bits: they must agree to 1e-12 and the parameters
 * to 1e-6 relative (the line says whether they are bit-identical too). */
static int zero_equal(loom_pg *pg, const char *lv, int adamw, double clip, int stage, int accum)
{
	worker_model d = { 0 }, z = { 0 };
	loom_status st;
	char sname[8] = "";
	zero_bucket_small = stage >= 2;
	if (stage >= 2)
		snprintf(sname, sizeof(sname), " %d", stage);
	build(&d, 4, 1);
	build(&z, 4, 1);
	if ((st = compile_zero(&d, pg, level_of(lv), adamw, 0, clip)))
		return worker_free(worker_fail("compile (plain)", st, loom_last_error()), &d, &z);
	if ((st = compile_zero(&z, pg, level_of(lv), adamw, stage, clip)))
		return worker_free(worker_fail("compile (zero)", st, loom_last_error()), &d, &z);
	double worst = 0, norm_diff = 0;
	int clipped = 0;
	for (int s = 0; s < 20; s++) {
		/* accum > 1: accum - 1 ACCUMULATE micro-steps before each update. */
		for (int m = 0; m < accum; m++) {
			loom_run_mode mode = m < accum - 1 ? LOOM_RUN_ACCUMULATE : LOOM_RUN_TRAIN;
			int batch = s * accum + m;
			if ((st = feed(&d, batch, rank, world, 0)) || (st = loom_run(d.p, mode)))
				return worker_free(worker_fail("step (plain)", st, loom_program_error(d.p)), &d, &z);
			if ((st = feed(&z, batch, rank, world, 0)) || (st = loom_run(z.p, mode)))
				return worker_free(worker_fail("step (zero)", st, loom_program_error(z.p)), &d, &z);
		}
		double r = worker_param_rel_diff(&z, &d);
		if (r > worst)
			worst = r;
		if (worker_same_everywhere(pg, worker_param_hash(&z)) != 1) {
			printf("rank %d: DIFFER zero across ranks after step %d\n", rank, s + 1);
			return worker_free(1, &d, &z);
		}
		if (clip > 0) {
			loom_program_info a, b;
			loom_program_info_get(d.p, &a);
			loom_program_info_get(z.p, &b);
			norm_diff = fmax(norm_diff, fabs(a.grad_norm - b.grad_norm) / a.grad_norm);
			clipped += a.grad_norm > clip;
		}
	}
	loom_program_info a, b;
	loom_program_info_get(d.p, &a);
	loom_program_info_get(z.p, &b);
	int exact = worker_param_hash(&z) == worker_param_hash(&d);
	if (clip > 0) {
		int ok = worst <= 1e-6 && norm_diff <= 1e-12 && clipped >= 5 &&
			 loom_step_count(z.p) == loom_step_count(d.p);
		printf("rank %d: %s zero%s clip %s %s world %d steps %lld: %s to plain (max relative "
		       "difference %.3g), norms within %.3g, %d of 20 steps clipped\n",
		       rank, ok ? "OK" : "WRONG", sname, lv, adamw ? "adamw" : "sgd", world,
		       (long long)loom_step_count(z.p), exact ? "bit-identical" : "within 1e-6",
		       worst, norm_diff, clipped);
		loom_program_free(d.p);
		loom_program_free(z.p);
		loom_graph_free(d.g);
		loom_graph_free(z.g);
		return ok ? 0 : 1;
	}
	int moved = loom_step_count(z.p) == loom_step_count(d.p) && loom_step_count(z.p) > 10;
	int shard = b.optim_state_bytes * world <= a.optim_state_bytes + 64 * 16 * world &&
		    b.optim_state_bytes < a.optim_state_bytes;
	/* O2: the fp32 masters are the shard's too (none at O0). */
	int o2 = level_of(lv) == LOOM_O2;
	int mshard = o2 ? b.master_bytes * world <= a.master_bytes + 64 * 16 * world &&
				  b.master_bytes < a.master_bytes && a.master_bytes > 0 :
			  a.master_bytes == 0 && b.master_bytes == 0;
	shard &= mshard;
	/* Stage 2: the gradients this rank holds (its bucket region) below
	 * plain's whole ones, and at least its shard of them. */
	long saved = 0;
	if (stage == 3) {
		/* Stage 3: the parameters this rank stores are its shards (the
		 * gathered buckets are activations, planned). */
		shard &= b.param_bytes * world <= a.param_bytes + 64 * 16 * world &&
			 b.param_bytes < a.param_bytes && b.grad_bytes * world >= a.grad_bytes;
	} else if (stage == 2) {
		/* Stage 2's plan is stage 1's but for the bucket region: the
		 * arena smaller by what the reused buckets save. */
		worker_model one = { 0 };
		loom_program_info c;
		build(&one, 4, 1);
		if ((st = compile_zero(&one, pg, level_of(lv), adamw, 1, clip)))
			return worker_free(worker_fail("compile (zero 1)", st, loom_last_error()), &d, &z);
		loom_program_info_get(one.p, &c);
		worker_free(0, &one, NULL);
		saved = (long)c.arena_bytes - (long)b.arena_bytes;
		shard &= saved > 0 && b.grad_bytes * world >= a.grad_bytes;
	} else {
		shard &= b.grad_bytes == a.grad_bytes;
	}
	printf("rank %d: %s zero%s%s %s %s world %d steps %lld: %s to plain (max relative difference "
	       "%.3g), optimizer state %zu of %zu bytes, masters %zu of %zu bytes, gradients %zu "
	       "of %zu bytes (%ld fewer than ZeRO-1's buckets), parameters %zu of %zu bytes\n",
	       rank, exact && moved && shard ? "OK" : "WRONG", sname,
	       accum > 1 ? " accum" : "", lv,
	       adamw ? "adamw" : "sgd", world, (long long)loom_step_count(z.p),
	       exact ? "bit-identical" : "DIFFERENT", worst, b.optim_state_bytes,
	       a.optim_state_bytes, b.master_bytes, a.master_bytes, b.grad_bytes, a.grad_bytes,
	       saved, b.param_bytes, a.param_bytes);
	return worker_free(exact && moved && shard ? 0 : 1, &d, &z);
}

/* Checkpoints with ZeRO (conv model, AdamW, O2): `zsave PATH K Z` trains K
 * steps (Z: zero stage) and saves (every rank under ZeRO, rank 0 without);
 * `zload PATH Z` loads, trains 3 more steps and prints the hash, the same
 * on every rank. */
static int zckpt(loom_pg *pg, const char *what, const char *path, int k, int zero)
{
	worker_model m = { 0 };
	build(&m, 4, 1);
	loom_status st = compile_zero(&m, pg, LOOM_O2, 1, zero, 0);
	if (st)
		return worker_free(worker_fail("compile", st, loom_last_error()), &m, NULL);
	int load = strcmp(what, "zload") == 0;
	if (load && (st = loom_load(m.p, path)))
		return worker_free(worker_fail("load", st, loom_program_error(m.p)), &m, NULL);
	int s0 = (int)loom_step_count(m.p);
	for (int s = s0; s < (load ? s0 + 3 : k); s++)
		if ((st = feed(&m, s, rank, world, 0)) || (st = loom_run(m.p, LOOM_RUN_TRAIN)))
			return worker_free(worker_fail("step", st, loom_program_error(m.p)), &m, NULL);
	if (!load && (zero || rank == 0) && (st = loom_save(m.p, path)))
		return worker_free(worker_fail("save", st, loom_program_error(m.p)), &m, NULL);
	/* The weights too (O2: from the masters, gathered under ZeRO). */
	char st_path[4096];
	snprintf(st_path, sizeof(st_path), "%s.safetensors", path);
	if (!load && (zero || rank == 0) && (st = loom_export_safetensors(m.p, st_path, NULL)))
		return worker_free(worker_fail("export", st, loom_program_error(m.p)), &m, NULL);
	int same = worker_same_everywhere(pg, worker_param_hash(&m));
	printf("rank %d: %s %s zero %d world %d step %lld hash %016llx\n", rank,
	       same == 1 ? "OK" : "DIFFER", what, zero, world, (long long)loom_step_count(m.p),
	       (unsigned long long)worker_param_hash(&m));
	return worker_free(same == 1 ? 0 : 1, &m, NULL);
}

/* ------------------------------------------------------- sync batch norm */

/* examples/models.h's ConvNet at batch b, compiled for SGD (no momentum). */
static loom_status convnet(worker_model *m, int b, loom_pg *pg, int sync)
{
	loom_compile_opts o;
	/* Small steps: at lr 0.05 a max-pool's choice flips between two
	 * nearly equal values within 20 steps and the rounding-level
	 * difference of the two runs jumps to 1e-3. */
	worker_opts(&o, pg, LOOM_O0, 0.01, 0);
	o.sync_bn = sync;
	o.bucket_cap_mb = 0.05;
	o.first_bucket_mb = 0.01;
	return worker_convnet(m, b, 11, &o, NULL);
}

/* Rows [r*b, (r+1)*b) of global step `step`'s batch of w*b images; each
 * image gets its own offset and scale so that the ranks' batch statistics
 * differ from the global ones. */
static loom_status feed_convnet(worker_model *m, int step, int r, int w)
{
	int b = m->batch, n = 28 * 28;
	float *x = malloc(sizeof(float) * (size_t)b * n);
	int32_t y[64];
	for (int i = 0; i < b; i++) {
		long idx = (long)step * w * b + (long)r * b + i;
		uint32_t u = (uint32_t)idx * 2654435761u + 12345u;
		for (int j = 0; j < n; j++) {
			u = u * 1664525u + 1013904223u;
			double z = (double)(u >> 8) / 8388608.0 - 1.0;
			x[i * n + j] = (float)((1 + 0.5 * (idx % 4)) * z + 0.3 * (idx % 5));
		}
		y[i] = (int32_t)(idx % WORKER_CLASSES);
	}
	loom_status st = loom_set_input(m->p, "image", x, LOOM_F32, (size_t)b * n);
	if (st == LOOM_OK)
		st = loom_set_input(m->p, "label", y, LOOM_I32, (size_t)b);
	free(x);
	return st;
}

/* The largest relative difference over every parameter and buffer (the
 * values of the same shape in both graphs that both programs keep, bar the
 * loss); *n gets how many were compared. */
static double max_rel_diff(worker_model *a, worker_model *b, int *n)
{
	double worst = 0;
	*n = 0;
	for (loom_value v = 0; loom_value_dtype(a->g, v) != LOOM_DTYPE_COUNT; v++) {
		loom_shape sa = loom_value_shape(a->g, v), sb = loom_value_shape(b->g, v);
		if (v == a->loss || sa.ndim != sb.ndim || memcmp(sa.dims, sb.dims, sizeof(int64_t) * sa.ndim))
			continue;
		int64_t k = 1;
		for (int i = 0; i < sa.ndim; i++)
			k *= sa.dims[i];
		double *da = malloc(sizeof(double) * k), *db = malloc(sizeof(double) * k);
		if (loom_read_f64(a->p, v, da, k) == LOOM_OK && loom_read_f64(b->p, v, db, k) == LOOM_OK) {
			worst = fmax(worst, worker_rel_diff(da, db, k));
			(*n)++;
		}
		free(da);
		free(db);
	}
	return worst;
}

/* The ConvNet at N ranks x batch 4 against one process at batch 4N on the
 * same images, 20 SGD steps at O0: with sync_bn the parameters and running
 * statistics agree within 1e-5 relative; without, batch norm sees only
 * each rank's images and they must differ (so this test can fail). */
static int syncbn_equiv(loom_pg *pg, int sync)
{
	worker_model d = { 0 }, one = { 0 };
	int B = 4;
	loom_status st = convnet(&d, B, pg, sync);
	if (st)
		return worker_free(worker_fail("compile", st, loom_last_error()), &d, &one);
	if ((st = convnet(&one, B * world, NULL, 0)))
		return worker_free(worker_fail("compile (one process)", st, loom_last_error()), &d, &one);
	for (int s = 0; s < 20; s++) {
		if ((st = feed_convnet(&d, s, rank, world)) || (st = loom_run(d.p, LOOM_RUN_TRAIN)))
			return worker_free(worker_fail("step", st, loom_program_error(d.p)), &d, &one);
		if ((st = feed_convnet(&one, s, 0, 1)) || (st = loom_run(one.p, LOOM_RUN_TRAIN)))
			return worker_free(worker_fail("step (one process)", st, loom_program_error(one.p)), &d, &one);
	}
	int n;
	double worst = max_rel_diff(&d, &one, &n);
	/* 10 parameters and 4 running statistics. */
	int ok = n == 14 && (sync ? worst <= 1e-5 : worst > 1e-3);
	printf("rank %d: %s syncbn_equiv %s world %d batch %d vs 1 x %d: %d values, max relative "
	       "difference %.3g\n",
	       rank, ok ? "OK" : "WRONG", sync ? "sync" : "nosync", world, B, B * world, n, worst);
	return worker_free(ok ? 0 : 1, &d, &one);
}

/*
 * Sync batch norm's gradient against central differences of the global
 * loss (the sum of every rank's loss). Rank r's batch is parameter X_r
 * ([N, C*H*W], f64), selected by an input: x = sum over q of sel_q X_q with
 * sel_q the identity on rank q and 0 elsewhere, so every rank has the same
 * graph and X_q is read by rank q alone: d(global loss)/dX_q, summed over
 * the ranks by the gradient buckets, is rank q's input gradient. Then
 * y = batchnorm(x as [N, C, H, W]), loss = sum(gelu(y)).
 */
#define GN 3
#define GC 2
#define GHW 9

static double global_loss(loom_program *p, loom_comm *host, loom_status *st)
{
	double l = 0;
	if ((*st = loom_run(p, LOOM_RUN_FORWARD)) != LOOM_OK)
		return 0;
	l = loom_loss(p);
	*st = loom_comm_allreduce(host, &l, 1, LOOM_F64);
	return l;
}

/* Central difference of the global loss along element i of v (every rank
 * moves it: a shared parameter, or an X_q only rank q reads). */
static double central(loom_program *p, loom_comm *host, loom_value v, double *val, int64_t k,
		      int64_t i, loom_status *st)
{
	const double h = 1e-6;
	double x0 = val[i], lp, lm;
	val[i] = x0 + h;
	if ((*st = loom_write_f64(p, v, val, k)))
		return 0;
	lp = global_loss(p, host, st);
	val[i] = x0 - h;
	if (*st || (*st = loom_write_f64(p, v, val, k)))
		return 0;
	lm = global_loss(p, host, st);
	val[i] = x0;
	if (*st || (*st = loom_write_f64(p, v, val, k)))
		return 0;
	return (lp - lm) / (2 * h);
}

static int syncbn_grad(loom_pg *pg)
{
	worker_model m = { 0 }; /* its graph and program, freed on every path */
	loom_comm *host = loom_pg_comm(pg, LOOM_COMM_HOST);
	int64_t xd[2] = { GN, GC * GHW }, sd[2] = { GN, GN }, cd[1] = { GC },
		x4[4] = { GN, GC, 3, 3 };
	loom_value X[8], sel[8];
	char name[32];
	loom_graph_new(&m.g);
	loom_graph *g = m.g;
	loom_value x = LOOM_NONE;
	for (int q = 0; q < world; q++) {
		snprintf(name, sizeof(name), "X%d", q);
		X[q] = loom_param(g, name, LOOM_F64, 2, xd, LOOM_INIT_ZEROS, 0);
		snprintf(name, sizeof(name), "sel%d", q);
		sel[q] = loom_input(g, name, LOOM_F64, 2, sd);
		loom_value t = loom_matmul(g, sel[q], X[q]);
		x = q ? loom_add(g, x, t) : t;
	}
	loom_value gamma = loom_param(g, "bn.weight", LOOM_F64, 1, cd, LOOM_INIT_ONES, 0);
	loom_value beta = loom_param(g, "bn.bias", LOOM_F64, 1, cd, LOOM_INIT_ZEROS, 0);
	loom_value rm = loom_buffer(g, "bn.running_mean", LOOM_F64, 1, cd, LOOM_INIT_ZEROS);
	loom_value rv = loom_buffer(g, "bn.running_var", LOOM_F64, 1, cd, LOOM_INIT_ONES);
	loom_value y = loom_batchnorm2d(g, loom_reshape(g, x, 4, x4), gamma, beta, rm, rv, 0.1,
					1e-5);
	loom_value loss = loom_sum(g, loom_gelu(g, y));
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim.kind = LOOM_OPTIM_NONE;
	o.pg = pg;
	o.sync_bn = 1;
	loom_status st = loom_compile(g, loss, &o, &m.p);
	if (st)
		return worker_free(worker_fail("compile", st, loom_last_error()), &m, NULL);
	loom_program *p = m.p;

	/* Each rank's images: their own scale and offset. Every rank writes
	 * every X_q the same (X_q is used by rank q only). */
	double xv[8][GN * GC * GHW], gv[GC] = { 1.3, 0.7 }, bv[GC] = { 0.2, -0.4 };
	double s[GN * GN];
	for (int q = 0; q < world; q++) {
		for (int i = 0; i < GN * GC * GHW; i++)
			xv[q][i] = (1 + q) * sin(1.7 * i + 0.9 * q) + 0.5 * q;
		if ((st = loom_write_f64(p, X[q], xv[q], GN * GC * GHW)))
			return worker_free(worker_fail("write", st, loom_program_error(p)), &m, NULL);
		for (int i = 0; i < GN * GN; i++)
			s[i] = q == rank && i / GN == i % GN;
		snprintf(name, sizeof(name), "sel%d", q);
		if ((st = loom_set_input(p, name, s, LOOM_F64, GN * GN)))
			return worker_free(worker_fail("input", st, loom_program_error(p)), &m, NULL);
	}
	if ((st = loom_write_f64(p, gamma, gv, GC)) || (st = loom_write_f64(p, beta, bv, GC)))
		return worker_free(worker_fail("write", st, loom_program_error(p)), &m, NULL);
	if ((st = loom_run(p, LOOM_RUN_GRAD)))
		return worker_free(worker_fail("grad", st, loom_program_error(p)), &m, NULL);

	/* Elements of two ranks' batches, then gamma and beta. */
	struct {
		loom_value v;
		double *val;
		int64_t k, i;
		const char *what;
	} cases[] = {
		{ X[0], xv[0], GN * GC * GHW, 0, "X0[0]" },
		{ X[0], xv[0], GN * GC * GHW, 31, "X0[31]" },
		{ X[1], xv[1], GN * GC * GHW, 5, "X1[5]" },
		{ X[world - 1], xv[world - 1], GN * GC * GHW, 50, "Xlast[50]" },
		{ gamma, gv, GC, 0, "gamma[0]" },
		{ gamma, gv, GC, 1, "gamma[1]" },
		{ beta, bv, GC, 0, "beta[0]" },
		{ beta, bv, GC, 1, "beta[1]" },
	};
	double worst = 0, an[GN * GC * GHW];
	int ncase = (int)(sizeof(cases) / sizeof(cases[0]));
	for (int c = 0; c < ncase; c++) {
		if ((st = loom_read_grad_f64(p, cases[c].v, an, cases[c].k)))
			return worker_free(worker_fail("read_grad", st, loom_program_error(p)), &m, NULL);
		double fd = central(p, host, cases[c].v, cases[c].val, cases[c].k, cases[c].i, &st);
		if (st)
			return worker_free(worker_fail("finite difference", st, loom_program_error(p)), &m, NULL);
		double a = an[cases[c].i], err = fabs(fd - a) / fmax(1, fabs(a));
		if (rank == 0 && err > 1e-6)
			printf("rank 0: %s analytic %.10g numeric %.10g\n", cases[c].what, a, fd);
		worst = fmax(worst, err);
	}
	int ok = worst <= 1e-6;
	printf("rank %d: %s syncbn_grad world %d: %d gradients against central differences, "
	       "worst error %.3g\n",
	       rank, ok ? "OK" : "WRONG", world, ncase, worst);
	return worker_free(ok ? 0 : 1, &m, NULL);
}

/* The ConvNet's parameters and buffers after 5 steps, hashed. */
static uint64_t convnet_hash(worker_model *m)
{
	uint64_t h = 0;
	for (loom_value v = 0; loom_value_dtype(m->g, v) != LOOM_DTYPE_COUNT; v++) {
		loom_shape s = loom_value_shape(m->g, v);
		int64_t k = 1;
		for (int i = 0; i < s.ndim; i++)
			k *= s.dims[i];
		double *d = malloc(sizeof(double) * k);
		if (v != m->loss && loom_read_f64(m->p, v, d, k) == LOOM_OK)
			h = loom_comm_hash(d, sizeof(double) * k, h);
		free(d);
	}
	return h;
}

/* World 1: sync_bn changes nothing, bit for bit. */
static int syncbn_world1(loom_pg *pg)
{
	worker_model m[2] = { { 0 } };
	uint64_t h[2];
	for (int sync = 0; sync < 2; sync++) {
		loom_status st = convnet(&m[sync], 4, pg, sync);
		if (st)
			return worker_free(worker_fail("compile", st, loom_last_error()), &m[0], &m[1]);
		for (int s = 0; s < 5; s++)
			if ((st = feed_convnet(&m[sync], s, 0, 1)) ||
			    (st = loom_run(m[sync].p, LOOM_RUN_TRAIN)))
				return worker_free(worker_fail("step", st, loom_program_error(m[sync].p)), &m[0], &m[1]);
		h[sync] = convnet_hash(&m[sync]);
	}
	printf("rank %d: %s syncbn_world1 world %d: sync_bn %016llx, plain %016llx\n", rank,
	       h[0] == h[1] ? "OK" : "DIFFER", world, (unsigned long long)h[1],
	       (unsigned long long)h[0]);
	return worker_free(h[0] == h[1] ? 0 : 1, &m[0], &m[1]);
}

/* conv -> batch norm -> relu -> linear (the relu folds into the batch
 * norm: graph/fuse.c) with sync_bn, with and without the fusion passes:
 * the fused plan has the synchronised batch norm carry the relu, and both
 * end 4 steps with the same parameters, bit for bit. */
static int syncbn_fused(loom_pg *pg)
{
	uint64_t h[2];
	int carried = 0;
	for (int nofuse = 0; nofuse < 2; nofuse++) {
		worker_model m = { 0 };
		worker_begin(&m, 4, 64, 7);
		loom_graph *g = m.g;
		int64_t xd[4] = { 4, 1, 8, 8 }, yd[1] = { 4 }, wd[4] = { 4, 1, 3, 3 }, c[1] = { 4 },
			fw[2] = { WORKER_CLASSES, 256 }, fb[1] = { WORKER_CLASSES };
		loom_value x = loom_input(g, "x", LOOM_F32, 4, xd);
		loom_value w = worker_param(&m, "c1.weight", 4, wd, LOOM_INIT_KAIMING_UNIFORM, 9);
		loom_value h1 = loom_conv2d(g, x, w, LOOM_NONE, 1, 1);
		h1 = loom_batchnorm2d(g, h1, worker_param(&m, "bn.weight", 1, c, LOOM_INIT_ONES, 0),
				      worker_param(&m, "bn.bias", 1, c, LOOM_INIT_ZEROS, 0),
				      loom_buffer(g, "bn.running_mean", LOOM_F32, 1, c, LOOM_INIT_ZEROS),
				      loom_buffer(g, "bn.running_var", LOOM_F32, 1, c, LOOM_INIT_ONES),
				      0.1, 1e-5);
		w = worker_param(&m, "fc.weight", 2, fw, LOOM_INIT_KAIMING_UNIFORM, 256);
		h1 = loom_linear(g, loom_flatten(g, loom_relu(g, h1)), w,
				 worker_param(&m, "fc.bias", 1, fb, LOOM_INIT_UNIFORM_FAN_IN, 256));
		m.loss = loom_softmax_cross_entropy(g, h1, loom_input(g, "y", LOOM_I32, 1, yd));
		loom_compile_opts o;
		worker_opts(&o, pg, LOOM_O0, 0.05, 0);
		o.sync_bn = 1;
		o.no_fusion = nofuse;
		loom_status st = loom_compile(g, m.loss, &o, &m.p);
		if (st)
			return worker_free(worker_fail("compile", st, loom_last_error()), &m, NULL);
		char *dump = NULL;
		size_t len = 0;
		FILE *f = open_memstream(&dump, &len);
		loom_program_dump(m.p, f);
		fclose(f);
		for (char *l = strtok(dump, "\n"); l; l = strtok(NULL, "\n"))
			carried += !nofuse && strstr(l, "batchnorm2d") && strstr(l, "(relu fused)") &&
				   strstr(l, "(sync)");
		free(dump);
		for (int s = 0; s < 4; s++)
			if ((st = feed(&m, s, rank, world, 0)) || (st = loom_run(m.p, LOOM_RUN_TRAIN)))
				return worker_free(worker_fail("step", st, loom_program_error(m.p)), &m, NULL);
		h[nofuse] = worker_param_hash(&m);
		loom_program_free(m.p);
		loom_graph_free(m.g);
	}
	int ok = carried == 1 && h[0] == h[1];
	printf("rank %d: %s syncbn_fused world %d: relu carried by the sync batch norm %d, fused "
	       "%016llx, unfused %016llx\n",
	       rank, ok ? "OK" : "WRONG", world, carried, (unsigned long long)h[0],
	       (unsigned long long)h[1]);
	return ok ? 0 : 1;
}

/* Rank 1 alone sets sync_bn: every rank's compile fails naming it. */
static int syncbn_mismatch(loom_pg *pg)
{
	worker_model m = { 0 };
	loom_status st = convnet(&m, 4, pg, rank == 1);
	if (st)
		return worker_free(worker_fail("compile", st, loom_last_error()), &m, NULL);
	printf("rank %d: OK compiled (no mismatch seen)\n", rank);
	return worker_free(0, &m, NULL);
}

/* The MLP with both products in fp8 (O1, bf16), scaled by recipe. */
static loom_status compile_fp8(worker_model *m, loom_pg *pg, int recipe)
{
	loom_compile_opts o;
	worker_mlp(m, 4, 7);
	worker_opts(&o, pg, LOOM_O1, 0.05, 0.9);
	o.amp.half = LOOM_BF16;
	o.amp.fp8 = 1;
	o.amp.fp8_all_products = 1;
	o.amp.fp8_scaling = recipe;
	return loom_compile(m->g, m->loss, &o, &m->p);
}

/* Every scaled tensor's amax, next scale, saturation and (with_scale) the
 * scale it was cast with, hashed. */
static uint64_t fp8_hash(worker_model *m, int with_scale, double *x_amax)
{
	uint64_t h = 1469598103934665603ull;
	loom_fp8_tensor_info ti;
	for (int i = 0; i < loom_fp8_tensor_count(m->p); i++) {
		loom_fp8_tensor_get(m->p, i, &ti);
		double f[4] = { with_scale ? ti.scale : 0, ti.amax, ti.next_scale,
				(double)ti.saturated };
		const unsigned char *b = (const unsigned char *)f;
		for (size_t k = 0; k < sizeof(f); k++)
			h = (h ^ b[k]) * 1099511628211ull;
		if (ti.format == LOOM_FP8_E4M3 && strncmp(ti.name, "x.", 2) == 0)
			*x_amax = ti.amax;
	}
	return h;
}

/* Delayed fp8 scaling across ranks: rank r's first input holds 50 (r + 1),
 * so the ranks' own amaxes of x differ; after each step every rank holds
 * the same next scales, x's amax the largest rank's (max-reduced), and the
 * same parameters; from the second step on every rank also cast with the
 * same scales (the first, with no history, casts each rank's tensors by
 * their own amax: current scaling). */
static int fp8_scales(loom_pg *pg)
{
	worker_model m = { 0 };
	loom_status st = compile_fp8(&m, pg, LOOM_FP8_SCALING_DELAYED);
	if (st)
		return worker_free(worker_fail("compile", st, loom_last_error()), &m, NULL);
	double x_amax = 0;
	for (int s = 0; s < 4; s++) {
		if ((st = feed(&m, s, rank, world, 50.0 * (rank + 1))) ||
		    (st = loom_run(m.p, LOOM_RUN_TRAIN)))
			return worker_free(worker_fail("step", st, loom_program_error(m.p)), &m, NULL);
		int same = worker_same_everywhere(pg, fp8_hash(&m, s > 0, &x_amax));
		if (same != 1 || worker_same_everywhere(pg, worker_param_hash(&m)) != 1) {
			printf("rank %d: DIFFER after step %d (%s)\n", rank, s + 1,
			       same != 1 ? "fp8 scales" : "parameters");
			return worker_free(1, &m, NULL);
		}
		if (x_amax != 50.0 * world) {
			printf("rank %d: WRONG x's amax %g after step %d, the ranks' max is %g\n", rank,
			       x_amax, s + 1, 50.0 * world);
			return worker_free(1, &m, NULL);
		}
	}
	printf("rank %d: OK fp8 scales world %d: %d tensors alike, x amax %g\n", rank, world,
	       loom_fp8_tensor_count(m.p), x_amax);
	return worker_free(0, &m, NULL);
}

/* Rank 1 alone scales by current scaling: every rank's compile fails
 * naming the recipe. */
static int fp8_mismatch(loom_pg *pg)
{
	worker_model m = { 0 };
	loom_status st = compile_fp8(&m, pg, rank == 1 ? LOOM_FP8_SCALING_CURRENT :
							 LOOM_FP8_SCALING_DELAYED);
	if (st)
		return worker_free(worker_fail("compile", st, loom_last_error()), &m, NULL);
	printf("rank %d: OK compiled (no mismatch seen)\n", rank);
	return worker_free(0, &m, NULL);
}

int main(int argc, char **argv)
{
	int rc = loom_launch_maybe(&argc, argv);
	if (rc >= 0)
		return rc;
	if (argc < 2) {
		fprintf(stderr, "usage: ddp_worker SCENARIO [ARGS]\n");
		return 2;
	}
	loom_pg *pg;
	if (worker_init(&pg, &rank, &world))
		return 1;
	const char *s = argv[1];
	if (strcmp(s, "identical") == 0) {
		sync_bn = argc > 4 && strcmp(argv[4], "sync") == 0;
		rc = identical(pg, argc > 2 ? argv[2] : "O0", argc > 3 && strcmp(argv[3], "conv") == 0);
	} else if (strcmp(s, "syncbn_equiv") == 0)
		rc = syncbn_equiv(pg, !(argc > 2 && strcmp(argv[2], "nosync") == 0));
	else if (strcmp(s, "syncbn_grad") == 0)
		rc = syncbn_grad(pg);
	else if (strcmp(s, "syncbn_world1") == 0)
		rc = syncbn_world1(pg);
	else if (strcmp(s, "syncbn_fused") == 0)
		rc = syncbn_fused(pg);
	else if (strcmp(s, "syncbn_mismatch") == 0)
		rc = syncbn_mismatch(pg);
	else if (strcmp(s, "equiv") == 0)
		rc = equiv(pg);
	else if (strcmp(s, "mismatch") == 0)
		rc = mismatch(pg);
	else if (strcmp(s, "fp8") == 0)
		rc = fp8_scales(pg);
	else if (strcmp(s, "fp8_mismatch") == 0)
		rc = fp8_mismatch(pg);
	else if (strcmp(s, "die") == 0)
		rc = die(pg);
	else if (strcmp(s, "overflow") == 0)
		rc = overflow(pg);
	else if (strcmp(s, "zero") == 0 && argc > 3)
		rc = zero_equal(pg, argv[2], strcmp(argv[3], "adamw") == 0,
				argc > 4 ? atof(argv[4]) : 0,
				argc > 5 && atoi(argv[5]) > 1 ? atoi(argv[5]) : 1,
				argc > 6 ? atoi(argv[6]) : 1);
	else if (strcmp(s, "zero3pf") == 0 && argc > 2) /* zero3pf N: O2 adamw, prefetch N */
		rc = (zero_prefetch = atoi(argv[2]), zero_equal(pg, "O2", 1, 0, 3, 1));
	else if (strcmp(s, "zsave") == 0 && argc > 4)
		rc = zckpt(pg, s, argv[2], atoi(argv[3]), atoi(argv[4]));
	else if (strcmp(s, "zload") == 0 && argc > 3)
		rc = zckpt(pg, s, argv[2], 0, atoi(argv[3]));
	else if ((strcmp(s, "save") == 0 && argc > 3) || (strcmp(s, "load") == 0 && argc > 2))
		rc = ckpt(pg, s, argv[2], argc > 3 ? atoi(argv[3]) : 0);
	else {
		fprintf(stderr, "ddp_worker: unknown scenario %s\n", s);
		rc = 2;
	}
	fflush(stdout);
	/* A failed rank leaves without MPI_Finalize (it could hang on a dead
	 * peer); loom_pg_free knows when the group is broken. */
	loom_pg_free(pg);
	return rc;
}
