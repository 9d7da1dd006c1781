/*
 * examples/train.c — the training loop and start-up the examples share
 * (examples/train.h): one place for the launcher and group, the reports
 * before step 1, the progress line, checkpoints with their data cursor and
 * evaluation summed across ranks, so that each example is its model and
 * its data.
 */
#include "examples/train.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "base/options.h"
#include "comm/launch.h"
#include "engine/cuda/device.h"
#include "examples/outputs.h"

double train_now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

/* --checkpoint's lock, held by the rank that writes the checkpoint for the
 * process's life (outputs.h); one run per process. */
static train_lock ckpt_lock = { .fd = -1 };

/* Rank 0's verdict on the output paths (bad: nonzero when it refused one),
 * shared so that every rank stops together: 0, or -1 on every rank. */
static int outputs_agree(train_run *t, double bad)
{
	if (t->gworld > 1 && loom_comm_allreduce(t->host, &bad, 1, LOOM_F64) != LOOM_OK) {
		fprintf(stderr, "%s: rank %d: %s\n", t->prog->name, t->grank, loom_pg_error(t->pg));
		return -1;
	}
	if (bad && t->grank != 0)
		fprintf(stderr, "%s: rank %d: stopping: rank 0 refused an output path (its message "
			"says which)\n", t->prog->name, t->grank);
	return bad ? -1 : 0;
}

/*
 * Before step 1, on the rank that writes them (rank 0 of the group): every
 * output path the flags name, tried for real, and the checkpoint's lock,
 * so that a run is never lost to a path at its end nor written beside
 * another job. Every rank learns the outcome (a collective), so they stop
 * together. 0, or -1 after saying why.
 */
static int check_outputs(train_run *t)
{
	const train_args *a = &t->a;
	const struct {
		const char *flag, *path;
		train_out_kind kind;
	} out[] = {
		{ "--checkpoint", a->checkpoint, TRAIN_OUT_REPLACE },
		{ "--export", a->export_path, TRAIN_OUT_REPLACE },
		{ "--metrics", a->metrics, TRAIN_OUT_DIRECT },
		{ "--trace", a->trace, TRAIN_OUT_DIRECT },
		{ "--dump-plan", a->dump_plan, TRAIN_OUT_DIRECT },
	};
	char msg[1024], note[1024];
	double bad = 0;
	if (t->grank == 0) {
		for (size_t i = 0; i < sizeof(out) / sizeof(out[0]) && !bad; i++)
			if (out[i].path &&
			    train_output_check(out[i].flag, out[i].path, out[i].kind, msg, sizeof(msg))) {
				fprintf(stderr, "%s: %s\n", t->prog->name, msg);
				bad = 1;
			}
		/* A dry run writes no checkpoint. */
		if (!bad && a->checkpoint && !a->dry_run) {
			if (train_lock_take(&ckpt_lock, a->checkpoint, t->prog->name, msg, sizeof(msg),
					    note, sizeof(note))) {
				fprintf(stderr, "%s: %s\n", t->prog->name, msg);
				bad = 1;
			} else if (note[0]) {
				fprintf(stderr, "%s: %s\n", t->prog->name, note);
			}
		}
	}
	return outputs_agree(t, bad);
}

int train_check_program_outputs(train_run *t, const char *const *flags, const char *const *paths,
				 int n)
{
	char msg[1024];
	double bad = 0;
	if (t->grank == 0)
		for (int i = 0; i < n && !bad; i++)
			if (paths[i] && train_output_check(flags[i], paths[i], TRAIN_OUT_DIRECT, msg,
							   sizeof(msg))) {
				fprintf(stderr, "%s: %s\n", t->prog->name, msg);
				bad = 1;
			}
	return outputs_agree(t, bad);
}

/* A setting's value as text; a number in the fewest digits that read back
 * the same, so that equal text is an equal value. */
static void setting(loom_comm_setting *s, size_t *n, const char *name, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void setting(loom_comm_setting *s, size_t *n, const char *name, const char *fmt, ...)
{
	va_list ap;

	s[*n].name = name;
	va_start(ap, fmt);
	vsnprintf(s[*n].value, sizeof(s[*n].value), fmt, ap);
	va_end(ap);
	++*n;
}

static void setting_num(loom_comm_setting *s, size_t *n, const char *name, double v)
{
	char buf[40];

	snprintf(buf, sizeof(buf), "%.15g", v);
	if (strtod(buf, NULL) != v)
		snprintf(buf, sizeof(buf), "%.17g", v);
	setting(s, n, name, "%s", buf);
}

/*
 * Which flags may differ between ranks is each row's agree column in
 * base/options.def (--data: a host's own copy; --log-interval, the dumps,
 * --export and --metrics: rank 0's are used; --kernel-search,
 * --no-cuda-graph, --deterministic: which kernels run, not what they
 * compute; ...): tests/examples/test_settings.c holds this list to it.
 */
size_t train_settings(const train_program *prog, const train_args *a, loom_comm_setting *s)
{
	size_t n = 0;

	setting(s, &n, "program", "%s", prog->name);
	setting(s, &n, "--epochs", "%d", a->epochs);
	setting(s, &n, "--batch-size", "%d", a->batch);
	setting(s, &n, "--optimizer", "%s", a->optim == LOOM_OPTIM_SGD ? "sgd" : "adamw");
	setting_num(s, &n, "--lr", a->lr);
	setting_num(s, &n, "--momentum", a->momentum);
	setting_num(s, &n, "--weight-decay", a->weight_decay);
	setting(s, &n, "--lr-schedule", "%s", a->schedule == TRAIN_LR_COSINE ? "cosine" : "step");
	setting(s, &n, "--lr-step", "%d", a->lr_step);
	setting_num(s, &n, "--lr-gamma", a->lr_gamma);
	setting_num(s, &n, "--warmup-epochs", a->warmup_epochs);
	setting(s, &n, "--opt-level", "O%d", (int)a->level);
	setting(s, &n, "--precision", "%s", a->fp8 ? "fp8" : a->half == LOOM_BF16 ? "bf16" : "fp16");
	setting(s, &n, "--fp8-all-products", "%s", a->fp8_all_products ? "given" : "not given");
	setting(s, &n, "--fp8-scaling", "%s", a->fp8_scaling == LOOM_FP8_SCALING_CURRENT ? "current" :
		a->fp8_scaling == LOOM_FP8_SCALING_DELAYED ? "delayed" : "default");
	setting(s, &n, "--fp8-history", "%d", a->fp8_history);
	if (a->loss_scale > 0)
		setting_num(s, &n, "--loss-scale", a->loss_scale);
	else
		setting(s, &n, "--loss-scale", "dynamic");
	setting(s, &n, "--keep-batchnorm-fp32", "%s",
		a->keep_bn_fp32 < 0 ? "default" : a->keep_bn_fp32 ? "True" : "False");
	setting(s, &n, "--bn-half", "%s", a->bn_half ? "given" : "not given");
	setting(s, &n, "--device", "%s",
		a->device == LOOM_DEVICE_CPU ? "cpu" : a->device == LOOM_DEVICE_CUDA ? "cuda" : "auto");
	setting(s, &n, "--seed", "%llu", (unsigned long long)a->seed);
	setting(s, &n, "--checkpoint", "%s", a->checkpoint ? "given" : "none");
	setting(s, &n, "--resume", "%s", a->resume ? "given" : "not given");
	setting(s, &n, "--save-every", "%d", a->save_every);
	setting(s, &n, "--max-steps", "%lld", (long long)a->max_steps);
	setting(s, &n, "--dry-run", "%s", a->dry_run ? "given" : "not given");
	setting(s, &n, "--depth", "%d", a->depth);
	setting(s, &n, "--width", "%d", a->width);
	setting(s, &n, "--size", "%d", a->size);
	setting(s, &n, "--synthetic", "%s", a->synthetic ? "given" : "not given");
	setting(s, &n, "--train-images", "%lld", (long long)a->train_images);
	setting(s, &n, "--test-images", "%lld", (long long)a->test_images);
	setting(s, &n, "--no-augment", "%s", a->augment ? "not given" : "given");
	setting(s, &n, "--steps", "%d", a->steps);
	setting(s, &n, "--warmup", "%d", a->warmup);
	setting(s, &n, "--sync-bn", "%s", a->sync_bn ? "given" : "not given");
	setting(s, &n, "--accumulate", "%d", a->accumulate);
	setting(s, &n, "--zero", "%d", a->zero);
	setting(s, &n, "--bucket-cap-mb", "%g", a->bucket_cap_mb);
	setting(s, &n, "--zero-prefetch", "%d", a->zero_prefetch);
	setting(s, &n, "--pipeline", "%d", a->pipeline);
	setting(s, &n, "--micro-batches", "%d", a->micro_batches);
	setting(s, &n, "--schedule", "%s", a->pipe_schedule == LOOM_SCHEDULE_GPIPE ? "gpipe" : "1f1b");
	setting(s, &n, "--pipeline-balance", "%s",
		a->pipe_balance == LOOM_BALANCE_MEMORY ? "memory" : "time");
	/* Under --pipeline every rank checks every stage's plan against it
	 * and may change the cut: ranks with other limits would cut apart. */
	setting_num(s, &n, "--memory-limit", a->memory_limit);
	setting(s, &n, "--clip-grad", "%.17g", a->clip_grad);
	setting(s, &n, "decay on matrices only", "%s", a->decay_matrices_only ? "on" : "off");
	setting(s, &n, "--trace", "%s", a->trace ? "given" : "none");
	setting(s, &n, "--trace-steps", "%d", a->trace_steps);
	setting(s, &n, "--tf32", "%s", a->no_tf32 ? "off" : "on");
	setting(s, &n, "--recompute", "%d", a->recompute);
	/* Each rank reads --init-from after rank 0's parameters are broadcast. */
	setting(s, &n, "--init-from", "%s", a->init_from ? "given" : "none");
	setting(s, &n, "--reinit", "%s", a->reinit ? a->reinit : "");
	setting(s, &n, "--init-strict", "%s", a->init_strict ? "true" : "false");
	return n;
}

/*
 * Every setting that must agree across ranks (train_settings), checked
 * right after the group forms (before any data is read), so that a typo on
 * one rank is named ("rank 1 has --lr 0.2, rank 0 has 0.1") instead of
 * diverging silently or timing out at a later collective.
 */
static int check_settings(train_run *t)
{
	loom_comm_setting s[TRAIN_SETTINGS_MAX];
	size_t n = train_settings(t->prog, &t->a, s);
	if (loom_comm_check_settings(t->host, s, n) != LOOM_OK) {
		fprintf(stderr, "%s: rank %d: %s\n", t->prog->name, t->rank, loom_pg_error(t->pg));
		return -1;
	}
	return 0;
}

/* The value of --name V or --name=V in argv, or NULL. */
static const char *flag_value(int argc, char **argv, const char *name)
{
	size_t n = strlen(name);

	for (int k = 1; k < argc; k++) {
		if (!strcmp(argv[k], name))
			return k + 1 < argc ? argv[k + 1] : "";
		if (!strncmp(argv[k], name, n) && argv[k][n] == '=')
			return argv[k] + n + 1;
	}
	return NULL;
}

int train_start(train_run *t, const train_program *prog, int argc, char **argv)
{
	return train_start_with(t, prog, NULL, argc, argv);
}

int train_start_with(train_run *t, const train_program *prog, const flag_target *own, int argc,
		     char **argv)
{
	char msg[512];

	memset(t, 0, sizeof(*t));
	t->prog = prog;
	if (train_enter_user_dir(msg, sizeof(msg))) {
		fprintf(stderr, "%s: %s\n", prog->name, msg);
		return 2;
	}
	/* --nproc N: this process becomes the launcher of N ranks. A restart
	 * resumes from --checkpoint (below); without one it begins again at
	 * step 0, which is allowed (a short run) but said. */
	if (flag_value(argc, argv, "--max-restarts") && !flag_value(argc, argv, "--checkpoint") &&
	    strcmp(flag_value(argc, argv, "--max-restarts"), "0"))
		fprintf(stderr, "%s: warning: --max-restarts without --checkpoint: a restart "
				"begins again from step 0\n",
			prog->name);
	/* The same for torchrun's --max-restarts (said once, by rank 0). */
	const char *tmr = loom_env("TORCHELASTIC_MAX_RESTARTS"), *trk = loom_env("RANK");
	if (tmr && strcmp(tmr, "0") && trk && !strcmp(trk, "0") &&
	    !flag_value(argc, argv, "--checkpoint"))
		fprintf(stderr, "%s: warning: torchrun --max-restarts %s without --checkpoint: a "
				"restart begins again from step 0\n",
			prog->name, tmr);
	int lrc = loom_launch_maybe(&argc, argv);
	if (lrc >= 0)
		return lrc;
	switch (train_parse_with(prog, own, argc, argv, &t->a, msg, sizeof(msg))) {
	case TRAIN_RUN: break;
	case TRAIN_HELP: train_usage(prog, own, stdout); return 0;
	default: fprintf(stderr, "%s: %s\n", prog->name, msg); return 2;
	}
	/* A restarted worker (the launcher's or torchrun's) always continues
	 * from the checkpoint when there is one, --resume or not: starting
	 * over would lose the run and then overwrite its checkpoint with an
	 * earlier step. */
	const char *restart = loom_env("TORCHELASTIC_RESTART_COUNT");
	if (restart && strcmp(restart, "0") && t->a.checkpoint && !t->a.resume) {
		t->a.resume = 1;
		fprintf(stderr, "%s: restart %s: resuming from %s\n", prog->name, restart,
			t->a.checkpoint);
	}

	/* The group: mpirun's, torchrun's variables (the launcher sets them),
	 * or one process. Training on a GPU: NCCL on LOCAL_RANK's GPU. */
	loom_comm_options co = { .bootstrap = LOOM_COMM_BOOT_AUTO };
	if (t->a.device == LOOM_DEVICE_CUDA && !loom_cuda_available()) {
		fprintf(stderr, "%s: --device cuda: no CUDA device is available: %s\n", prog->name,
			loom_cuda_probe_error());
		return 1;
	}
	co.want_device = t->a.device == LOOM_DEVICE_CUDA ||
			 (t->a.device == LOOM_DEVICE_AUTO && loom_cuda_available());
	if (loom_pg_init(&co, &t->pg) != LOOM_OK) {
		fprintf(stderr, "%s: %s\n", prog->name, loom_pg_error(t->pg));
		loom_pg_free(t->pg);
		t->pg = NULL;
		return 1;
	}
	t->rank = loom_pg_get_info(t->pg)->rank;
	t->world = loom_pg_get_info(t->pg)->world;
	t->host = loom_pg_comm(t->pg, LOOM_COMM_HOST);
	if (t->world > 1 && check_settings(t)) {
		train_end(t);
		return 1;
	}
	t->grank = t->rank;
	t->gworld = t->world;
	if (t->a.pipeline > 1) {
		if (t->world % t->a.pipeline) {
			fprintf(stderr, "%s: --pipeline %d does not divide the %d ranks\n", prog->name,
				t->a.pipeline, t->world);
			train_end(t);
			return 1;
		}
		t->stage = t->grank % t->a.pipeline;
		t->rank = t->grank / t->a.pipeline;
		t->world = t->gworld / t->a.pipeline;
	}
	if (t->grank > 0 && !freopen("/dev/null", "w", stdout)) {
		fprintf(stderr, "%s: rank %d: cannot quiet stdout\n", prog->name, t->rank);
		train_end(t);
		return 1;
	}
	if (check_outputs(t)) {
		train_end(t);
		return 1;
	}
	if (t->a.threads)
		loom_cpu_set_threads(t->a.threads);
	if (t->a.metrics && t->grank == 0 &&
	    train_metrics_open(&t->metrics, t->a.metrics, msg, sizeof(msg))) {
		fprintf(stderr, "%s: %s\n", prog->name, msg);
		train_end(t);
		return 1;
	}
	return -1;
}

/* The --reinit list split at its commas into names (at most 32). */
#define REINIT_MAX 32

static int split_names(char *buf, const char **names)
{
	int n = 0;
	for (char *s = strtok(buf, ","); s && n < REINIT_MAX; s = strtok(NULL, ","))
		names[n++] = s;
	return n;
}

/* What --init-from and --export share: the model's names in PyTorch's
 * state_dict and its weights stored as Conv1D (train.h). */
static void weights_opts(const train_run *t, loom_weights_opts *o)
{
	loom_weights_opts_default(o);
	o->names = t->names;
	o->n_names = t->n_names;
	o->conv1d = t->conv1d;
	o->n_conv1d = t->n_conv1d;
}

/* --init-from: every rank reads the file into its program. */
static int init_from(train_run *t)
{
	const train_args *a = &t->a;
	char buf[1024];
	const char *skip[REINIT_MAX];
	loom_weights_opts o;
	loom_weights_report r;

	weights_opts(t, &o);
	o.ignore = t->ignore;
	o.n_ignore = t->n_ignore;
	o.first_rows = t->first_rows;
	o.n_first_rows = t->n_first_rows;
	o.strict = a->init_strict;
	snprintf(buf, sizeof(buf), "%s", a->reinit ? a->reinit : "");
	o.skip = skip;
	o.n_skip = split_names(buf, skip);
	loom_status st = loom_import_safetensors(t->p, a->init_from, &o, &r);
	if (st != LOOM_OK) {
		/* A name on one side only: the flag that accepts it. */
		int names = a->init_strict && (st == LOOM_ERR_NOT_FOUND || st == LOOM_ERR_MISMATCH) &&
			    (r.missing || r.unexpected);
		fprintf(stderr, "%s: --init-from: %s%s\n", t->prog->name, loom_program_error(t->p),
			names ? " (--init-strict false loads the tensors both sides have)" : "");
		return -1;
	}
	t->init_report = r;
	printf("initialised from %s: %d tensors", a->init_from, r.loaded);
	if (r.transposed)
		printf(" (%d Conv1D weights transposed)", r.transposed);
	if (r.ignored)
		printf(", %d of the file's ignored (buffers, tied)", r.ignored);
	if (r.first_rows)
		printf(", %d read in part (the file's first rows)", r.first_rows);
	if (r.skipped)
		printf(", %d left as initialised (--reinit %s)", r.skipped, a->reinit);
	if (r.missing)
		printf(", %d not in the file (first: %s)", r.missing, r.first_missing);
	if (r.unexpected)
		printf(", %d of the file's not in the model (first: %s)", r.unexpected,
		       r.first_unexpected);
	printf("\n");
	return 0;
}

/* One try at writing the weights to path; under ZeRO every rank takes
 * part, and learns whether rank 0's write went through. 0, or -1 with err
 * set on rank 0. */
static int export_to(train_run *t, const char *path, int collective, char *err, size_t errlen)
{
	loom_weights_opts o;
	weights_opts(t, &o);
	o.conv1d_export = t->conv1d_export;
	double bad = loom_export_safetensors(t->p, path, &o) != LOOM_OK;
	if (bad)
		snprintf(err, errlen, "%s", loom_program_error(t->p));
	if (collective && loom_comm_allreduce(t->host, &bad, 1, LOOM_F64) != LOOM_OK) {
		snprintf(err, errlen, "%s", loom_pg_error(t->pg));
		return -1;
	}
	return bad ? -1 : 0;
}

int train_export(train_run *t)
{
	const char *name = t->prog->name, *path = t->a.export_path;
	char err[1024], fb[3][4300];
	int collective = t->a.zero && t->world > 1 && t->a.pipeline <= 1;
	/* Under ZeRO every rank takes part (O2 masters are gathered). */
	if (!path || (t->rank != 0 && !collective))
		return 0;
	if (export_to(t, path, collective, err, sizeof(err)) == 0) {
		if (t->rank == 0)
			printf("exported the weights to %s (safetensors, %s)\n", path,
			       t->conv1d_export ? "Hugging Face's names and layout" : "PyTorch's names");
		return 0;
	}
	if (t->rank == 0)
		fprintf(stderr, "%s: --export: %s\n", name, err);
	/* The path was writable at start-up; the run is not lost to it now.
	 * The checkpoint holds the end of the run (train_fit saved it). */
	if (t->a.checkpoint) {
		if (t->rank == 0)
			fprintf(stderr, "%s: the trained weights are in the checkpoint %s (saved at "
				"step %lld): the same command with --resume and a writable --export "
				"writes them without training again\n",
				name, t->a.checkpoint, (long long)loom_step_count(t->p));
		return -1;
	}
	/* No checkpoint: a file named for the export beside it, else in the
	 * working directory, else in TMPDIR or /tmp (the same names on every
	 * rank: under ZeRO they all take part). */
	const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
	const char *tmpdir = loom_env("TMPDIR");
	if (!tmpdir || !tmpdir[0])
		tmpdir = "/tmp";
	snprintf(fb[0], sizeof(fb[0]), "%s.fallback.safetensors", path);
	snprintf(fb[1], sizeof(fb[1]), "%s.fallback.safetensors", base);
	snprintf(fb[2], sizeof(fb[2]), "%s/%s.fallback.safetensors", tmpdir, base);
	for (int i = 0; i < 3; i++) {
		char why[1024];
		if (export_to(t, fb[i], collective, why, sizeof(why)) == 0) {
			if (t->rank == 0)
				fprintf(stderr, "%s: the trained weights went to %s instead (safetensors, "
					"PyTorch's names)\n", name, fb[i]);
			return -1;
		}
		if (t->rank == 0)
			fprintf(stderr, "%s: fallback: %s\n", name, why);
	}
	if (t->rank == 0)
		fprintf(stderr, "%s: the trained weights could not be written anywhere\n", name);
	return -1;
}

int train_log_step(train_run *t, int64_t step, int epoch, double loss, double acc, double lr,
		   double images_per_s)
{
	loom_program_info info;
	char err[256];
	if (!t->metrics)
		return 0;
	loom_program_info_get(t->p, &info);
	if (train_metrics_log(t->metrics, "step", err, sizeof(err),
			      "{s:I, s:i, s:o, s:o, s:f, s:f, s:f, s:I, s:i, s:i}", "step",
			      (json_int_t)step, "epoch", epoch, "loss", train_metrics_number(loss),
			      "accuracy", train_metrics_number(acc), "lr",
			      lr, "images_per_s", images_per_s, "loss_scale", info.loss_scale,
			      "skipped_steps", (json_int_t)info.skipped_steps, "ranks", t->world,
			      "global_batch", t->a.batch * t->world)) {
		fprintf(stderr, "%s: %s\n", t->prog->name, err);
		return -1;
	}
	return 0;
}

static int dump_plan(train_run *t)
{
	const char *name = t->prog->name, *path = t->a.dump_plan;
	FILE *df = fopen(path, "w");
	if (!df) {
		fprintf(stderr, "%s: --dump-plan %s: %s\n", name, path, strerror(errno));
		return -1;
	}
	loom_program_dump_dot(t->p, df);
	if (fclose(df) != 0) {
		fprintf(stderr, "%s: --dump-plan %s: %s\n", name, path, strerror(errno));
		return -1;
	}
	printf("wrote the plan to %s (dot -Tsvg %s -o plan.svg; sfdp instead of dot for a large "
	       "plan)\n", path, path);
	return 0;
}

static void schedule_text(const train_args *a, char *buf, size_t len)
{
	if (!(a->lr_step || a->schedule == TRAIN_LR_COSINE))
		snprintf(buf, len, "constant");
	else if (a->schedule == TRAIN_LR_COSINE)
		snprintf(buf, len, "cosine, %g warm-up epochs", a->warmup_epochs);
	else
		snprintf(buf, len, "x%g every %d epochs", a->lr_gamma, a->lr_step);
}

int train_graph_batch(const train_run *t)
{
	const train_args *a = &t->a;
	if (a->pipeline <= 1)
		return a->batch;
	return a->batch / (a->micro_batches ? a->micro_batches : a->pipeline);
}

loom_graph *train_graph_new(const train_run *t)
{
	loom_graph *g = NULL;
	if (loom_graph_new(&g) != LOOM_OK) {
		fprintf(stderr, "%s: out of memory\n", t->prog->name);
		return NULL;
	}
	loom_graph_set_seed(g, t->a.seed);
	return g;
}

/* The run's first lines: program, backend, model, precision, optimizer,
 * batch; the ranks, the pipeline and the accumulation when there are. */
static void print_run(const train_run *t, const loom_program_info *pi, const char *what)
{
	const train_args *a = &t->a;
	const char *name = t->prog->name;
	char sched[96], tail[64];
	if (t->schedule_text)
		snprintf(sched, sizeof(sched), "%s", t->schedule_text);
	else
		schedule_text(a, sched, sizeof(sched));
	if (t->prog->groups & TRAIN_FLAGS_FIT)
		snprintf(tail, sizeof(tail), "%d epochs", a->epochs);
	else
		snprintf(tail, sizeof(tail), "%d steps after %d warm-up", a->steps, a->warmup);
	printf("loom %s: %s, %s, opt level O%d%s, %s lr %g (%s), batch %d%s, %s\n", name,
	       pi->backend, what, a->level,
	       a->level == LOOM_O0 ? "" : a->fp8 && a->level != LOOM_O3 ? " (fp8)" :
	       a->half == LOOM_BF16 ? " (bf16)" : " (fp16)",
	       a->optim == LOOM_OPTIM_SGD ? "sgd" : "adamw", a->lr, sched, a->batch,
	       t->world > 1 ? " per rank" : "", tail);
	if (t->world > 1)
		printf("data parallel: %d ranks (%s), global batch %d%s\n", t->world,
		       loom_comm_bootstrap_name(loom_pg_get_info(t->pg)->how), a->batch * t->world,
		       a->sync_bn ? ", synchronised batch norm" : a->zero == 1 ? ", ZeRO-1" :
		       a->zero == 2 ? ", ZeRO-2" : a->zero ? ", ZeRO-3" : "");
	if (a->pipeline > 1)
		printf("pipeline: %d stages x %d replicas, %d micro-batches of %d, %s schedule\n",
		       a->pipeline, t->world, a->micro_batches ? a->micro_batches : a->pipeline,
		       train_graph_batch(t), a->pipe_schedule == LOOM_SCHEDULE_GPIPE ? "gpipe" : "1f1b");
	if (a->accumulate > 1)
		printf("gradient accumulation: %d micro-batches per step, %d images per update\n",
		       a->accumulate, a->accumulate * a->batch * t->world);
}

/* The compile options the flags ask for. */
static void compile_opts(const train_run *t, loom_compile_opts *o)
{
	const train_args *a = &t->a;

	loom_compile_opts_default(o);
	o->device = a->device;
	o->optim.kind = a->optim;
	o->optim.lr = a->lr;
	o->optim.momentum = a->optim == LOOM_OPTIM_SGD ? a->momentum : 0;
	o->optim.weight_decay = a->weight_decay;
	o->optim.clip_grad = a->clip_grad;
	o->optim.decay_matrices_only = a->decay_matrices_only;
	o->amp.level = a->level;
	o->amp.half = a->half;
	o->amp.fp8 = a->fp8;
	o->amp.fp8_all_products = a->fp8_all_products;
	o->amp.fp8_scaling = a->fp8_scaling;
	o->amp.fp8_history = a->fp8_history;
	o->amp.static_scale = a->loss_scale;
	o->amp.keep_batchnorm_fp32 = a->keep_bn_fp32;
	o->amp.bn_half = a->bn_half;
	o->pg = t->pg;
	o->sync_bn = a->sync_bn;
	o->zero_stage = a->zero;
	o->bucket_cap_mb = a->bucket_cap_mb;
	o->zero_prefetch = a->zero_prefetch;
	if (a->bucket_cap_mb > 0 && a->bucket_cap_mb < 1.0)
		o->first_bucket_mb = a->bucket_cap_mb; /* the first no larger than the others */
	o->pipeline_stages = a->pipeline > 1 ? a->pipeline : 0;
	o->micro_batches = a->micro_batches;
	o->schedule = a->pipe_schedule;
	o->pipeline_balance = a->pipe_balance;
	o->memory_limit_mb = a->memory_limit;
	o->no_tf32 = a->no_tf32;
	o->cuda_graph = !a->no_cuda_graph;
	o->deterministic = a->deterministic;
	o->kernel_search = a->kernel_search;
	o->recompute = a->recompute;
	o->memory_report = a->memory_report && (t->gworld > 1); /* each rank's peak, on stderr */
}

int train_compile(train_run *t, loom_graph *g, loom_value loss, loom_value logits, int classes,
		  const char *what)
{
	const train_args *a = &t->a;
	const char *name = t->prog->name;
	loom_compile_opts o;

	compile_opts(t, &o);
	loom_status cst = loom_compile(g, loss, &o, &t->p);
	if (cst == LOOM_ERR_NOMEM) {
		char size[64];
		snprintf(size, sizeof(size), "--batch-size %d", a->batch);
		fprintf(stderr, "%s: %s needs more memory than %s: %s\n", name,
			t->size_text ? t->size_text : size,
			a->memory_limit > 0 ? "--memory-limit allows" : "there is", loom_last_error());
		return -1;
	} else if (cst != LOOM_OK) {
		fprintf(stderr, "%s: %s\n", name, loom_last_error());
		return -1;
	}
	t->logits = logits;
	t->classes = classes;
	if (t->init && !a->dry_run && t->init(t, t->init_ctx))
		return -1;
	if (a->init_from && init_from(t))
		return -1;
	if (a->dump_graph)
		loom_program_dump(t->p, stdout);
	if (a->dump_plan && t->grank == 0 && dump_plan(t)) /* one writer */
		return -1;

	loom_program_info info;
	loom_program_info_get(t->p, &info);
	print_run(t, &info, what);
	if (!strncmp(info.backend, "cpu", 3)) {
		char cpu[128];
		printf("%s\n", loom_cpu_describe(cpu, sizeof(cpu)));
	}
	if (a->memory_report)
		loom_program_memory_report(t->p, stdout);
	/* Under pipeline stages the figures are this rank's stage's (it holds
	 * only those): say so, rank r runs stage r % S. */
	char stage[48] = "";
	if (a->pipeline > 1)
		snprintf(stage, sizeof(stage), " (pipeline stage %d's)", t->rank % a->pipeline);
	char recomputed[64] = "";
	if (info.n_recomputed > 0)
		snprintf(recomputed, sizeof(recomputed), "; %d values made again in the backward",
			 info.n_recomputed);
	printf("model: %lld parameters%s; memory planned before step 1: %.2f MiB arena "
	       "(params %.2f, master %.2f, grads %.2f, optimizer %.2f, activations %.2f MiB%s)\n",
	       (long long)info.n_param_elems, stage, info.arena_bytes / 1048576.0,
	       info.param_bytes / 1048576.0, info.master_bytes / 1048576.0,
	       info.grad_bytes / 1048576.0, info.optim_state_bytes / 1048576.0,
	       info.activation_bytes / 1048576.0, recomputed);
	fflush(stdout);
	char merr[256];
	if (t->metrics &&
	    train_metrics_log(t->metrics, "start", merr, sizeof(merr),
			      "{s:s, s:s, s:s, s:s, s:i, s:i, s:f, s:s}", "program", name,
			      "backend", info.backend, "opt_level",
			      (const char *[]){ "O0", "O1", "O2", "O3" }[a->level], "precision",
			      a->level == LOOM_O0 ? "fp32" : a->fp8 && a->level != LOOM_O3 ? "fp8" :
			      a->half == LOOM_BF16 ? "bf16" : "fp16",
			      "ranks", t->world, "batch_per_rank", a->batch, "lr", a->lr, "optimizer",
			      a->optim == LOOM_OPTIM_SGD ? "sgd" : "adamw")) {
		fprintf(stderr, "%s: %s\n", name, merr);
		return -1;
	}
	if (a->dry_run) {
		printf("dry run: compiled, stopping before step 1\n");
		return 1;
	}
	return 0;
}

int train_data_shard(train_run *t, train_data *d, float mean, float std)
{
	char err[512];
	if (loom_sampler_new(d->train.n, t->rank, t->world, 1, t->a.seed, 0, &d->train_s, err,
			     sizeof(err)) ||
	    loom_sampler_new(d->test.n, t->rank, t->world, 0, 0, 0, &d->test_s, err, sizeof(err)) ||
	    loom_loader_new(&d->train, d->train_s, t->a.batch, 1, mean, std, &d->train_l, err,
			    sizeof(err)) ||
	    loom_loader_new(&d->test, d->test_s, t->a.batch, 0, mean, std, &d->test_l, err,
			    sizeof(err))) {
		fprintf(stderr, "%s: %s\n", t->prog->name, err);
		return -1;
	}
	loom_sampler_set_epoch(d->test_s, 0);
	return 0;
}

void train_data_free(train_data *d)
{
	loom_loader_free(d->train_l);
	loom_loader_free(d->test_l);
	loom_sampler_free(d->train_s);
	loom_sampler_free(d->test_s);
	loom_dataset_free(&d->train);
	loom_dataset_free(&d->test);
	memset(d, 0, sizeof(*d));
}

int train_compile_fit(train_run *t, train_data *d, loom_graph *g, loom_value loss,
		      loom_value logits, int classes, const char *what)
{
	switch (train_compile(t, g, loss, logits, classes, what)) {
	case 0: break;
	case 1: return 0; /* --dry-run */
	default: return 1;
	}
	return train_fit(t, d->train_s, d->train_l, d->test_l, d->test.n) ? 1 : 0;
}

loom_status train_step(train_run *t, const float *img, size_t img_elems, const int32_t *lab,
		       int batch, int update)
{
	loom_status st;
	if ((st = loom_set_input(t->p, "image", img, LOOM_F32, img_elems)) ||
	    (st = loom_set_input(t->p, "label", lab, LOOM_I32, batch)))
		return st;
	return loom_run(t->p, update ? LOOM_RUN_TRAIN : LOOM_RUN_ACCUMULATE);
}

/* Stops the recording and says where it went. */
static int trace_stop(train_run *t, int64_t steps)
{
	t->tracing = 0;
	if (loom_trace_stop(t->p) != LOOM_OK)
		return -1;
	printf("trace: %lld step%s on %d rank%s written to %s (chrome://tracing, ui.perfetto.dev)\n",
	       (long long)steps, steps == 1 ? "" : "s", t->gworld, t->gworld > 1 ? "s" : "",
	       t->a.trace);
	return 0;
}

int train_trace_tick(train_run *t, int64_t steps, int last)
{
	const train_args *a = &t->a;
	int rc = 0;
	if (!a->trace)
		return 0;
	/* The run's first step pays for start-up; the trace begins after it. */
	if (!t->tracing && steps == 1 && !last)
		rc = loom_trace_start(t->p, a->trace) == LOOM_OK ? (t->tracing = 1, 0) : -1;
	else if (t->tracing && (steps >= 1 + a->trace_steps || last))
		rc = trace_stop(t, steps - 1);
	else if (!t->tracing && last && steps <= 1)
		printf("trace: nothing written to %s, the run stopped after its first step\n",
		       a->trace);
	if (rc)
		fprintf(stderr, "%s: --trace %s: %s\n", t->prog->name, a->trace,
			loom_program_error(t->p));
	return rc;
}

double train_lr(const train_args *a, int64_t epoch, int64_t step, int64_t per_epoch)
{
	if (a->schedule == TRAIN_LR_COSINE) {
		double s = (double)(epoch * per_epoch + step), total = (double)a->epochs * per_epoch;
		double w = a->warmup_epochs * per_epoch;
		if (s < w)
			return a->lr * (s + 1) / w;
		return a->lr * 0.5 * (1 + cos(M_PI * (s - w) / (total - w > 0 ? total - w : 1)));
	}
	return a->lr_step > 0 ? a->lr * pow(a->lr_gamma, (double)(epoch / a->lr_step)) : a->lr;
}

/* The predicted class of one row of scores. */
static int argmax(const float *z, int classes)
{
	int arg = 0;
	for (int k = 1; k < classes; k++)
		if (z[k] > z[arg])
			arg = k;
	return arg;
}

/* The image programs' batches go straight into the program's input
 * buffers (loom_input_buffer: the loader converts into the device's pinned
 * slot where the backend stages inputs), unless LOOM_INPUT_BUFFER=0 in the
 * environment: the loader's own buffers and loom_set_input's copy (the
 * path before, kept to measure against). */
static int input_buffers_on(void)
{
	return loom_opt_bool(LOOM_OPT_INPUT_BUFFER);
}

/* The program's buffers for the next batch of images and labels. */
static loom_status input_buffers(train_run *t, size_t img_elems, int batch, float **img,
				  int32_t **lab)
{
	void *pi, *pl;
	loom_status st;
	if ((st = loom_input_buffer(t->p, "image", LOOM_F32, img_elems, &pi)) != LOOM_OK)
		return st;
	if ((st = loom_input_buffer(t->p, "label", LOOM_I32, (size_t)batch, &pl)) != LOOM_OK) {
		(void)loom_input_release(t->p, "image");
		return st;
	}
	*img = pi;
	*lab = pl;
	return LOOM_OK;
}

static loom_status input_commit(train_run *t)
{
	loom_status st = loom_input_commit(t->p, "image");
	return st != LOOM_OK ? st : loom_input_commit(t->p, "label");
}

loom_status train_evaluate(train_run *t, loom_loader *test, int64_t n, double *acc, double *loss)
{
	int b = loom_loader_batch_size(test), classes = t->classes;
	size_t elems = loom_loader_image_elems(test);
	double sums[3] = { 0, 0, 0 }; /* correct, seen, loss */
	loom_status st = LOOM_ERR_NOMEM;
	int direct = input_buffers_on();
	float *own_img = direct ? NULL : malloc(sizeof(float) * (size_t)b * elems);
	float *out = malloc(sizeof(float) * (size_t)b * classes);
	int32_t *own_lab = direct ? NULL : malloc(sizeof(int32_t) * (size_t)b);
	float *img = own_img;
	int32_t *lab = own_lab;
	if ((!direct && (!img || !lab)) || !out)
		goto out_free;
	for (int64_t i = 0; i < loom_loader_num_batches(test); i++) {
		int count;
		if (direct && (st = input_buffers(t, (size_t)b * elems, b, &img, &lab)) != LOOM_OK)
			goto out_free;
		if ((st = loom_loader_get(test, i, img, lab, &count)) != LOOM_OK) {
			if (direct) {
				(void)loom_input_release(t->p, "image");
				(void)loom_input_release(t->p, "label");
			}
			goto out_free;
		}
		/* A final partial batch is padded; padded rows are not counted. */
		memset(img + (size_t)count * elems, 0, (size_t)(b - count) * elems * sizeof(float));
		memset(lab + count, 0, (size_t)(b - count) * sizeof(int32_t));
		if (direct)
			st = input_commit(t);
		else if ((st = loom_set_input(t->p, "image", img, LOOM_F32, (size_t)b * elems)) ==
			 LOOM_OK)
			st = loom_set_input(t->p, "label", lab, LOOM_I32, b);
		if (st ||
		    (st = loom_run(t->p, LOOM_RUN_EVAL)) ||
		    (st = loom_read(t->p, t->logits, out, (size_t)b * classes)))
			goto out_free;
		for (int r = 0; r < count; r++) {
			const float *z = out + (size_t)r * classes;
			if (t->rank + (i * b + r) * (int64_t)t->world >= n)
				continue; /* a repeated image padding this shard */
			int arg = argmax(z, classes);
			double mx = z[arg], s = 0;
			for (int k = 0; k < classes; k++)
				s += exp(z[k] - mx);
			sums[2] += mx + log(s) - z[lab[r]];
			sums[0] += arg == lab[r];
			sums[1]++;
		}
	}
	/* Under --pipeline every stage of a replica read the same logits:
	 * stage 0's count. */
	if (t->a.pipeline > 1 && t->stage != 0)
		sums[0] = sums[1] = sums[2] = 0;
	if (t->gworld > 1 && (st = loom_comm_allreduce(t->host, sums, 3, LOOM_F64)) != LOOM_OK)
		goto out_free;
	*acc = sums[1] ? sums[0] / sums[1] : 0;
	*loss = sums[1] ? sums[2] / sums[1] : 0;
	st = LOOM_OK;
out_free:
	free(own_img);
	free(out);
	free(own_lab);
	return st;
}

/*
 * Where training stands, in global samples, beside the checkpoint (PATH
 * + ".cursor", written after it and renamed into place): the epoch and the
 * images all ranks together consumed in it, so that a run resumed at
 * another world size (another global batch) starts where this one stopped.
 */
static void cursor_path(char *buf, size_t len, const char *ckpt)
{
	snprintf(buf, len, "%s.cursor", ckpt);
}

static int cursor_save(const char *ckpt, int64_t epoch, int64_t samples)
{
	char path[4200], tmp[4300];
	cursor_path(path, sizeof(path), ckpt);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	if (!f)
		return -1;
	int bad = fprintf(f, "epoch %lld samples %lld\n", (long long)epoch, (long long)samples) < 0;
	bad |= fclose(f) != 0;
	return bad || rename(tmp, path) != 0 ? -1 : 0;
}

static int cursor_load(const char *ckpt, int64_t *epoch, int64_t *samples)
{
	char path[4200];
	long long e, n;
	cursor_path(path, sizeof(path), ckpt);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	int ok = fscanf(f, "epoch %lld samples %lld", &e, &n) == 2 && e >= 0 && n >= 0;
	fclose(f);
	if (!ok)
		return -1;
	*epoch = e;
	*samples = n;
	return 0;
}

/* Rank 0 writes the checkpoint and its cursor; every rank loads them.
 * Under ZeRO every rank takes part in the save (its shard is gathered). */
static int save(train_run *t, int64_t epoch, int64_t samples, int64_t step)
{
	if (t->grank != 0 && !(t->a.zero && t->world > 1) && !(t->a.pipeline > 1))
		return 0;
	if (loom_save(t->p, t->a.checkpoint) != LOOM_OK) {
		fprintf(stderr, "%s: %s\n", t->prog->name, loom_program_error(t->p));
		return -1;
	}
	if (t->grank != 0)
		return 0;
	if (cursor_save(t->a.checkpoint, epoch, samples)) {
		fprintf(stderr, "%s: %s.cursor: %s\n", t->prog->name, t->a.checkpoint,
			strerror(errno));
		return -1;
	}
	printf("saved %s (step %lld)\n", t->a.checkpoint, (long long)step);
	return 0;
}

/* --resume: the step to start at and its epoch, with per_epoch steps of
 * unit global samples each. 0 or -1 after saying why. */
static int resume(train_run *t, int64_t per_epoch, int64_t unit, int64_t *step,
		  int64_t *first_epoch)
{
	const train_args *a = &t->a;
	loom_program_info info;

	if (access(a->checkpoint, F_OK) != 0) {
		printf("resume: %s does not exist yet, starting fresh\n", a->checkpoint);
		return 0;
	}
	if (loom_load(t->p, a->checkpoint) != LOOM_OK) {
		fprintf(stderr, "%s: %s\n", t->prog->name, loom_program_error(t->p));
		return -1;
	}
	/* Every training run either stepped or was skipped (AMP overflow):
	 * together they count the batches consumed. */
	loom_program_info_get(t->p, &info);
	*step = loom_step_count(t->p) + info.skipped_steps;
	/* The cursor is in global samples: at another world size the same
	 * images are behind us, in other batches. */
	int64_t ce, cs;
	if (cursor_load(a->checkpoint, &ce, &cs) == 0) {
		*first_epoch = ce;
		*step = ce * per_epoch + cs / unit;
	} else {
		*first_epoch = *step / per_epoch;
	}
	printf("resumed %s at step %lld (epoch %lld, batch %lld), loss scale %g\n", a->checkpoint,
	       (long long)*step, (long long)(*first_epoch + 1),
	       (long long)(*step - *first_epoch * per_epoch), info.loss_scale);
	return 0;
}

/* "1h02m", "3m05s", "42s": the time left, read at a glance. */
static void eta_text(double s, char *buf, size_t len)
{
	long v = s > 0 && s < 1e8 ? (long)(s + 0.5) : 0;
	if (v >= 3600)
		snprintf(buf, len, "%ldh%02ldm", v / 3600, v / 60 % 60);
	else if (v >= 60)
		snprintf(buf, len, "%ldm%02lds", v / 60, v % 60);
	else
		snprintf(buf, len, "%lds", v);
}

/*
 * The image programs' line, read at a glance: where in the run (epoch,
 * step of the epoch), how it learns (rank 0's mean loss and accuracy since
 * the last line), how fast (global images/s: every rank steps together)
 * and how long is left (all the run's remaining steps at the current
 * speed; evaluation is not counted), then the global batch, lr and loss
 * scale.
 */
static void progress_line(train_run *t, const train_progress *pr)
{
	const train_tally *ty = pr->tally;
	loom_program_info info;
	double ips = pr->secs > 0 ? ty->steps * (double)t->a.batch * t->world / pr->secs : 0;
	char eta[32];

	eta_text(ty->steps ? (pr->last - pr->done) * pr->secs / ty->steps : 0, eta, sizeof(eta));
	loom_program_info_get(t->p, &info);
	printf("epoch %d step %5lld/%lld  loss %.4f  acc %5.2f%%  %6.1f img/s  ETA %s  batch %d  "
	       "lr %.4g  loss scale %g",
	       (int)pr->epoch + 1, (long long)(pr->b + 1), (long long)pr->per_epoch,
	       ty->loss / ty->steps, 100.0 * ty->correct / (ty->seen ? ty->seen : 1), ips, eta,
	       t->a.batch * t->world, pr->lr, info.loss_scale);
	if (info.skipped_steps)
		printf(" (%lld steps skipped)", (long long)info.skipped_steps);
	printf("\n");
	if (info.amp_report && info.amp_report[0])
		printf("amp: first non-finite value from %s\n", info.amp_report);
}

/* Every --log-interval steps: the task's line (or the images'), then the
 * --metrics row; the tally starts again. */
static int progress(train_run *t, const train_task *task, train_tally *ty, double *tlog,
		    int64_t epoch, int64_t b, int64_t done, int64_t last, double lr)
{
	double now = train_now(), secs = now - *tlog;
	train_progress pr = { .epoch = epoch, .b = b, .per_epoch = task->per_epoch, .done = done,
			      .last = last, .secs = secs, .lr = lr, .tally = ty };
	if (task->progress)
		task->progress(t, task->ctx, &pr);
	else
		progress_line(t, &pr);
	if (t->a.amp_report)
		loom_amp_report(t->p, stdout);
	fflush(stdout);
	double sps = secs > 0 ? ty->steps * (double)task->samples_per_step / secs : 0;
	int rc = train_log_step(t, done, (int)epoch + 1, ty->loss / ty->steps,
				ty->seen ? (double)ty->correct / ty->seen : NAN, lr, sps);
	*ty = (train_tally){ 0 };
	*tlog = train_now();
	return rc;
}

/* After an epoch: the task's evaluation, the epoch's speed, the --metrics
 * record, a checkpoint (at the step after this epoch, or at stopped_at
 * when --max-steps ended the run inside it). */
static int epoch_end(train_run *t, const train_task *task, int64_t epoch, double secs,
		     int64_t steps, int64_t done, int64_t stopped_at)
{
	char test_part[96] = "";
	loom_program_info info;
	double acc = NAN, tloss = NAN;

	if (task->evaluate) {
		int rc = task->evaluate(t, task->ctx, done, &tloss, &acc);
		if (rc < 0)
			return -1;
		if (rc == 1)
			snprintf(test_part, sizeof(test_part), "no test images to evaluate, ");
		else if (isnan(acc))
			snprintf(test_part, sizeof(test_part), "test loss %.6f, ", tloss);
		else
			snprintf(test_part, sizeof(test_part), "test loss %.6f, test accuracy %.2f%%, ",
				 tloss, 100 * acc);
	}
	loom_program_info_get(t->p, &info);
	double ips = steps * (double)task->samples_per_step / (secs > 0 ? secs : 1);
	printf("epoch %d done: %strain %.1f s (%.1f %s/s), loss scale %g, skipped steps %lld\n",
	       (int)epoch + 1, test_part, secs, ips, task->unit ? task->unit : "img",
	       info.loss_scale, (long long)info.skipped_steps);
	/* How the steps were launched, where the backend counts it (CUDA). */
	if (info.graph_captures || info.host_syncs)
		printf("launches: cuda graph %ld captures, %ld replays%s%s; host syncs %ld, %ld "
		       "inside a step\n", info.graph_captures, info.graph_replays,
		       info.graph_note[0] ? ", off: " : "", info.graph_note, info.host_syncs,
		       info.syncs_in_step);
	char err[256];
	if (t->metrics &&
	    train_metrics_log(t->metrics, "epoch", err, sizeof(err),
			      "{s:i, s:I, s:o, s:o, s:f, s:f, s:f, s:I, s:i}", "epoch", (int)epoch + 1,
			      "step", (json_int_t)loom_step_count(t->p), "test_loss",
			      train_metrics_number(tloss), "test_accuracy", train_metrics_number(acc),
			      "train_s", secs, "images_per_s", ips, "loss_scale", info.loss_scale,
			      "skipped_steps", (json_int_t)info.skipped_steps, "ranks", t->world)) {
		fprintf(stderr, "%s: %s\n", t->prog->name, err);
		return -1;
	}
	/* A run stopped mid-epoch (--max-steps) resumes at its next batch. */
	if (t->a.checkpoint &&
	    save(t, stopped_at ? epoch : epoch + 1,
		 stopped_at ? stopped_at * task->samples_per_step : 0, loom_step_count(t->p)))
		return -1;
	fflush(stdout);
	return 0;
}

int train_drive(train_run *t, const train_task *task)
{
	const train_args *a = &t->a;
	const char *name = t->prog->name;
	const int64_t per_epoch = task->per_epoch;
	int64_t step = 0, first_epoch = 0;

	if (per_epoch < 1) {
		fprintf(stderr, "%s: an epoch of %lld steps: nothing to train on\n", name,
			(long long)per_epoch);
		return -1;
	}
	if (a->resume && resume(t, per_epoch, task->samples_per_step, &step, &first_epoch))
		return -1;
	int64_t last = (int64_t)a->epochs * per_epoch;
	if (a->max_steps && a->max_steps < last)
		last = a->max_steps;
	int64_t done = step, timed = 0;
	/* Test hook (tests/ddp/test_ddp.sh): rank 1 of a launcher's first
	 * attempt dies by SIGKILL before step LOOM_TEST_KILL_AT_STEP. */
	const char *ka = loom_opt_env(LOOM_OPT_TEST_KILL_AT_STEP);
	const char *att = loom_env("TORCHELASTIC_RESTART_COUNT");
	int64_t kill_at = ka && t->rank == 1 && att && !strcmp(att, "0") ? atoll(ka) : -1;
	double timed_s = 0; /* steps after this run's first (start-up) one, evaluation left out */
	for (int64_t epoch = first_epoch; epoch < a->epochs && done < last; epoch++) {
		int64_t b0 = epoch == first_epoch ? done - first_epoch * per_epoch : 0;
		int64_t steps = 0, stopped_at = 0;
		double lr = -1, t0 = train_now(), t_prev, tlog = t0;
		train_tally ty = { 0 };

		if (task->epoch_begin && task->epoch_begin(t, task->ctx, epoch))
			return -1;
		t_prev = train_now();
		for (int64_t b = 0; b < per_epoch && done < last; b++) {
			if (b < b0) { /* resumed mid-epoch: these were trained on */
				if (task->step(t, task->ctx, epoch, b, 0, 0, &ty))
					goto out_stop;
				t_prev = tlog = train_now();
				continue;
			}
			double want = task->lr ? task->lr(t, task->ctx, epoch, b, done, last) :
						 train_lr(a, epoch, b, per_epoch);
			if (want != lr && loom_set_lr(t->p, lr = want) != LOOM_OK) {
				fprintf(stderr, "%s: %s\n", name, loom_program_error(t->p));
				goto out_stop;
			}
			/* --accumulate: the optimizer steps on every N-th batch, on an
			 * epoch's last and on the run's last, so that no micro-batch's
			 * gradient is left behind or carried into a checkpoint. */
			int update = task->accumulates_itself || (b + 1) % a->accumulate == 0 ||
				     b + 1 == per_epoch || done + 1 >= last;
			loom_pg_set_step(t->pg, done + 1); /* for a hang report: "step 39's all-reduce" */
			if (kill_at >= 0 && done == kill_at)
				raise(SIGKILL);
			if (task->step(t, task->ctx, epoch, b, 1, update, &ty))
				goto out_stop;
			ty.steps++;
			steps++;
			done++;
			double now = train_now();
			if (done - step > 1) {
				timed++;
				timed_s += now - t_prev;
			}
			t_prev = now;
			int ends = b + 1 == per_epoch || done >= last;
			if ((done % a->log_interval == 0 || (done >= last && task->log_last)) &&
			    progress(t, task, &ty, &tlog, epoch, b, done, last, lr))
				goto out_stop;
			if (train_trace_tick(t, done - step, done >= last))
				goto out_stop;
			if (task->after_step && task->after_step(t, task->ctx, done, ends))
				goto out_stop;
			/* The run's last step saves in epoch_end (once). */
			if (update && a->save_every && done % a->save_every == 0 && b + 1 < per_epoch &&
			    done < last && save(t, epoch, (b + 1) * task->samples_per_step, done))
				goto out_stop;
			if (done >= last && b + 1 < per_epoch)
				stopped_at = b + 1;
		}
		if (task->epoch_stop)
			task->epoch_stop(t, task->ctx, epoch);
		if (epoch_end(t, task, epoch, train_now() - t0, steps, done, stopped_at))
			return -1;
	}
	if (timed > 0)
		printf("trained %lld steps: %.1f %s/s (global batch %lld, steps 2..%lld of this run: "
		       "%.1f s, loading included, evaluation not)\n",
		       (long long)(done - step), timed * (double)task->samples_per_step / timed_s,
		       task->unit ? task->unit : "img", (long long)task->samples_per_step,
		       (long long)(done - step), timed_s);
	if (task->finish && task->finish(t, task->ctx))
		return -1;
	return train_export(t);
out_stop:
	if (task->epoch_stop)
		task->epoch_stop(t, task->ctx, -1);
	return -1;
}

/* ------------------------------------------------- the image programs' task */

/* Test hook (LOOM_TEST_EPOCH_ORDER, tests/e2e/test_epoch_order.sh): what an
 * epoch fed, as a hash of the order of its samples and a sum of their
 * hashes (the same whatever the order), so that a test sees that two epochs
 * shuffle the same set differently. */
typedef struct epoch_order {
	uint64_t order, set;
} epoch_order;

static void epoch_order_add(epoch_order *eo, const float *img, const int32_t *lab, int count,
			    size_t elems)
{
	for (int i = 0; i < count; i++) {
		uint64_t h = loom_comm_hash(img + (size_t)i * elems, elems * sizeof(float),
					    (uint64_t)lab[i]);
		eo->order = loom_comm_hash(&h, sizeof(h), eo->order);
		eo->set += h;
	}
}

/* A loader's batches, prefetched while the step runs. */
typedef struct image_task {
	loom_sampler *train_s;
	loom_loader *test_l;
	int64_t test_n;
	loom_prefetch *pf;
	int64_t per_epoch;
	size_t elems;
	float *out; /* the batch's logits */
	int order_hook, running;
	/* The prefetcher converts into the program's input buffers
	 * (input_buffers_on); out: a pair of them is handed to it. */
	int direct, out_given;
	epoch_order eo;
} image_task;

/* Hands the prefetcher the program's buffers for the epoch's next batch. */
static int image_give(train_run *t, image_task *k)
{
	float *img;
	int32_t *lab;
	if (input_buffers(t, (size_t)t->a.batch * k->elems, t->a.batch, &img, &lab) != LOOM_OK) {
		fprintf(stderr, "%s: %s\n", t->prog->name, loom_program_error(t->p));
		return -1;
	}
	k->out_given = 1;
	if (loom_prefetch_give(k->pf, img, lab) != LOOM_OK) {
		fprintf(stderr, "%s: %s\n", t->prog->name, loom_prefetch_error(k->pf));
		return -1;
	}
	return 0;
}

/* The buffers handed out and not committed go back unused. */
static void image_take_back(train_run *t, image_task *k)
{
	if (!k->out_given)
		return;
	(void)loom_input_release(t->p, "image");
	(void)loom_input_release(t->p, "label");
	k->out_given = 0;
}

static int image_epoch_begin(train_run *t, void *ctx, int64_t epoch)
{
	image_task *k = ctx;
	loom_sampler_set_epoch(k->train_s, epoch);
	k->eo = (epoch_order){ 1469598103934665603ull, 0 };
	if (loom_prefetch_start(k->pf)) {
		fprintf(stderr, "%s: %s\n", t->prog->name, loom_prefetch_error(k->pf));
		return -1;
	}
	k->running = 1;
	return k->direct && k->per_epoch > 0 ? image_give(t, k) : 0;
}

static int image_step(train_run *t, void *ctx, int64_t epoch, int64_t b, int run, int update,
		      train_tally *ty)
{
	image_task *k = ctx;
	const char *name = t->prog->name;
	const float *img;
	const int32_t *lab;
	int count;
	if (loom_prefetch_next(k->pf, &img, &lab, &count) != LOOM_OK) {
		fprintf(stderr, "%s: %s\n", name, loom_prefetch_error(k->pf));
		return -1;
	}
	if (count != t->a.batch) {
		fprintf(stderr, "%s: batch %lld of epoch %d holds %d images, not %d\n", name,
			(long long)b, (int)epoch + 1, count, t->a.batch);
		return -1;
	}
	if (k->order_hook)
		epoch_order_add(&k->eo, img, lab, count, k->elems);
	/* The batch is in the program's buffers: committed, and the next
	 * batch's handed to the prefetcher to fill while this step runs (the
	 * labels read below stay until the hand-out after next). */
	if (k->direct) {
		k->out_given = 0;
		if (input_commit(t) != LOOM_OK) {
			fprintf(stderr, "%s: %s\n", name, loom_program_error(t->p));
			return -1;
		}
		if (b + 1 < k->per_epoch && image_give(t, k))
			return -1;
	}
	if (!run)
		return 0;
	loom_status st = k->direct ? loom_run(t->p, update ? LOOM_RUN_TRAIN : LOOM_RUN_ACCUMULATE) :
				     train_step(t, img, (size_t)t->a.batch * k->elems, lab,
						t->a.batch, update);
	if (st != LOOM_OK || loom_read(t->p, t->logits, k->out, (size_t)t->a.batch * t->classes)) {
		fprintf(stderr, "%s: step %lld: %s\n", name, (long long)(epoch * k->per_epoch + b),
			loom_program_error(t->p));
		return -1;
	}
	for (int i = 0; i < count; i++)
		ty->correct += argmax(k->out + (size_t)i * t->classes, t->classes) == lab[i];
	ty->seen += count;
	ty->loss += loom_loss(t->p);
	return 0;
}

/* The sampler's epoch changes next: the worker must be idle. */
static void image_epoch_stop(train_run *t, void *ctx, int64_t epoch)
{
	image_task *k = ctx;
	if (!k->running)
		return;
	loom_prefetch_stop(k->pf);
	image_take_back(t, k);
	k->running = 0;
	if (k->order_hook && epoch >= 0)
		printf("epoch %d order %016llx set %016llx\n", (int)epoch + 1,
		       (unsigned long long)k->eo.order, (unsigned long long)k->eo.set);
}

static int image_evaluate(train_run *t, void *ctx, int64_t done, double *loss, double *acc)
{
	image_task *k = ctx;
	(void)done;
	if (k->test_n <= 0)
		return 1;
	if (train_evaluate(t, k->test_l, k->test_n, acc, loss)) {
		fprintf(stderr, "%s: evaluation: %s%s\n", t->prog->name, loom_program_error(t->p),
			loom_pg_error(t->pg));
		return -1;
	}
	return 0;
}

int train_fit(train_run *t, loom_sampler *train_s, loom_loader *train_l, loom_loader *test_l,
	      int64_t test_n)
{
	char err[512];
	image_task k = { .train_s = train_s, .test_l = test_l, .test_n = test_n,
			 .elems = loom_loader_image_elems(train_l),
			 .per_epoch = loom_loader_num_batches(train_l),
			 .order_hook = loom_opt_env(LOOM_OPT_TEST_EPOCH_ORDER) != NULL,
			 .direct = input_buffers_on() };
	train_task task = {
		.ctx = &k,
		.per_epoch = loom_loader_num_batches(train_l),
		.samples_per_step = (int64_t)t->a.batch * t->world,
		.unit = "img",
		.epoch_begin = image_epoch_begin,
		.step = image_step,
		.epoch_stop = image_epoch_stop,
		.evaluate = image_evaluate,
	};
	int rc = -1;
	k.out = malloc(sizeof(float) * (size_t)t->a.batch * t->classes);
	if (!k.out) {
		fprintf(stderr, "%s: out of memory\n", t->prog->name);
		return -1;
	}
	/* Batches are read, augmented and normalised on the prefetcher's
	 * thread while the step runs, into the program's input buffers
	 * (k.direct) or its own. */
	if ((k.direct ? loom_prefetch_new_given : loom_prefetch_new)(train_l, &k.pf, err,
								     sizeof(err))) {
		fprintf(stderr, "%s: %s\n", t->prog->name, err);
		goto out_free;
	}
	rc = train_drive(t, &task);
out_free:
	loom_prefetch_free(k.pf);
	free(k.out);
	return rc;
}

void train_end(train_run *t)
{
	if (train_metrics_close(t->metrics))
		fprintf(stderr, "%s: --metrics %s: the log is incomplete\n", t->prog->name,
			t->a.metrics);
	t->metrics = NULL;
	loom_program_free(t->p);
	t->p = NULL;
	loom_pg_free(t->pg);
	t->pg = NULL;
	train_lock_release(&ckpt_lock);
}
