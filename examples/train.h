/*
 * examples/train.h — what the training examples share once their flags are
 * parsed: the process group (--nproc, mpirun, env://), compiling with the
 * plan and memory reports, the start-up lines, checkpoints with a data
 * cursor, the epoch loop with its progress line and learning-rate schedule,
 * and evaluation summed across ranks. A program builds its graph and its
 * data, hands train_drive a train_task (its batches, evaluation and lines;
 * train_fit is the image programs'), and train.c runs them: every example,
 * gpt_ddp included, on the one driver.
 */
#ifndef LOOM_EXAMPLES_TRAIN_H
#define LOOM_EXAMPLES_TRAIN_H

#include <stdint.h>

#include "comm/comm.h"
#include "examples/metrics.h"
#include "examples/train_args.h"
#include "loom.h"
#include "loom_io.h"
#include "loom_data.h"

/* One run of a training program. */
typedef struct train_run {
	const train_program *prog;
	train_args a;
	loom_pg *pg;
	/* The data-parallel view (sampler shards, global batch): with
	 * --pipeline S, a replica of S stages is one data-parallel rank. */
	int rank, world;
	int grank, gworld, stage; /* the group's rank and world; the pipeline stage */
	loom_comm *host; /* the group's host collectives (evaluation sums) */
	loom_program *p; /* after train_compile */
	loom_value logits;
	int classes;
	int tracing; /* between loom_trace_start and loom_trace_stop */
	/* The model's names in PyTorch's state_dict, for --init-from and
	 * --export (set by the program before compiling); NULL: loom's own. */
	const loom_name_map *names;
	int n_names;
	/* Hugging Face layouts (loom_weights_opts): weights a file may hold
	 * as Conv1D ([in, out]; conv1d_export: --export writes them so) and
	 * the file's tensors to ignore (gpt_ddp: GPT-2's). NULL: none. */
	const char *const *conv1d;
	int n_conv1d, conv1d_export;
	const char *const *ignore;
	int n_ignore;
	const char *const *first_rows; /* --init-from may hold more rows (loom_weights_opts) */
	int n_first_rows;
	loom_weights_report init_report; /* what --init-from read */
	train_metrics *metrics; /* --metrics, on rank 0; else NULL */
	/* The program's own initial values, written after compiling and
	 * before --init-from replaces them (so that the file's weights are
	 * the ones trained); NULL: the graph's initialisers. 0 or -1 after
	 * saying why. */
	int (*init)(struct train_run *t, void *ctx);
	void *init_ctx;
	/* The learning-rate schedule as the start-up line says it; NULL:
	 * the flags' (train_lr's). */
	const char *schedule_text;
	/* The flags that size the model, blamed when it does not fit in
	 * memory; NULL: "--batch-size N". */
	const char *size_text;
} train_run;

/* The settings every rank must share, as train_start compares them across
 * ranks: each named by its flag ("--lr", value "0.1"), two by what they
 * are ("program", "decay on matrices only"); every flag of train_args
 * whose row in base/options.def has agree set, and no other
 * (tests/examples/test_settings.c). Fills s (room for TRAIN_SETTINGS_MAX)
 * and returns how many. */
#define TRAIN_SETTINGS_MAX 64
size_t train_settings(const train_program *prog, const train_args *a, loom_comm_setting *s);

/* Monotonic seconds. */
double train_now(void);

/* The batch the graph is built for: --batch-size, or a micro-batch of it
 * under --pipeline. */
int train_graph_batch(const train_run *t);

/* A new graph seeded with --seed; NULL, said on stderr, when out of memory. */
loom_graph *train_graph_new(const train_run *t);

/*
 * main()'s first call: --nproc (this process becomes the launcher), the
 * flags, the checkpoint path, the process group; on ranks above 0 stdout is
 * quieted (only rank 0 prints progress; errors go to stderr from every
 * rank). Returns -1 when the program should go on, else the exit code for
 * main (0 after --help, 2 for a bad flag, 1 for a failure, said on stderr).
 */
int train_start(train_run *t, const train_program *prog, int argc, char **argv);

/* The same, the program's own flags (gpt_ddp's) parsed into own, which
 * holds their defaults (train_args.h's train_parse_with). */
int train_start_with(train_run *t, const train_program *prog, const flag_target *own, int argc,
		     char **argv);

/* A program's own output files (gpt_ddp's --loss-file), written in place by
 * rank 0: checked there as train_start checks the common ones (outputs.h),
 * every rank learning the outcome. paths[i] NULL: flags[i] not given. 0, or
 * -1 after saying which path and why (every rank must call it). */
int train_check_program_outputs(train_run *t, const char *const *flags, const char *const *paths,
				 int n);

/*
 * Compiles loss with the flags' optimizer, precision and device on the
 * group, then writes what the flags ask for before step 1 (--dump-graph,
 * --dump-plan by rank 0, --memory-report) and the start-up lines: the
 * program line (`what` names the model and data), the data-parallel line,
 * the CPU line, the memory line. logits: [batch, classes] scores.
 * 0 or -1 after saying why.
 */
int train_compile(train_run *t, loom_graph *g, loom_value loss, loom_value logits,
		  int classes, const char *what);

/* A program's two splits, sharded over the group. */
typedef struct train_data {
	loom_dataset train, test;    /* filled by the program, freed by train_data_free */
	loom_sampler *train_s, *test_s;
	loom_loader *train_l, *test_l;
} train_data;

/*
 * Each rank's shard of both splits (DistributedSampler's: the training one
 * shuffled by --seed, batch per rank, as in DDP) and their loaders,
 * normalising pixels by mean and std (per-channel tables: the program sets
 * them after). 0, or -1 after saying why.
 */
int train_data_shard(train_run *t, train_data *d, float mean, float std);
void train_data_free(train_data *d);

/* train_compile then train_fit on d: main()'s exit code. */
int train_compile_fit(train_run *t, train_data *d, loom_graph *g, loom_value loss,
		      loom_value logits, int classes, const char *what);

/* One batch: inputs "image" (img_elems floats) and "label" (batch labels).
 * update 1: a training step (the gradients of any micro-batches before it
 * included); 0: a micro-batch whose gradients are only accumulated
 * (--accumulate). */
loom_status train_step(train_run *t, const float *img, size_t img_elems, const int32_t *lab,
		       int batch, int update);

/* --trace: after each step, with steps the steps of this run so far and
 * last set on its final one. Starts the recording after the first step,
 * stops it --trace-steps steps later or at the last (every rank calls it
 * alike: both are collective). 0, or -1 after saying why. */
int train_trace_tick(train_run *t, int64_t steps, int last);

/* The learning rate of step `step` (0-based, within the epoch) of epoch
 * `epoch`, with per_epoch steps in an epoch, as the flags' schedule says:
 * step decay per epoch, or a linear warm-up then cosine decay per step. */
double train_lr(const train_args *a, int64_t epoch, int64_t step, int64_t per_epoch);

/*
 * Test accuracy and mean loss in eval mode (running statistics) over every
 * rank's shard of test (n images in all): the sums are added across ranks,
 * so every rank gets the figure of one evaluation of the whole set; the
 * rows the sampler repeats to pad a shard are not counted.
 */
loom_status train_evaluate(train_run *t, loom_loader *test, int64_t n, double *acc,
			   double *loss);

/* What the steps since the last progress line added up to. */
typedef struct train_tally {
	double loss;           /* the steps' mean losses, summed */
	int64_t correct, seen; /* classified right, of seen (seen 0: not measured) */
	int64_t steps;         /* steps since the last line */
} train_tally;

/* Where the run stands when the progress line is printed. */
typedef struct train_progress {
	int64_t epoch;     /* 0-based */
	int64_t b;         /* the step just run, 0-based within the epoch */
	int64_t per_epoch; /* steps in an epoch */
	int64_t done;      /* steps of the whole run done (a resumed run's included) */
	int64_t last;      /* the step the run ends at */
	double secs;       /* since the last line */
	double lr;
	const train_tally *tally;
} train_progress;

/*
 * A program's model and data as the driver (train_drive) sees them. The
 * driver owns what every program shares: --resume and the checkpoint with
 * its cursor (--checkpoint, --save-every, a restart's resume), the epochs
 * and --max-steps, the schedule, the progress line every --log-interval
 * steps with its --metrics row, the epoch's --metrics record, --trace,
 * --export. The task feeds its batches and measures.
 */
typedef struct train_task {
	void *ctx;
	int64_t per_epoch;        /* steps in an epoch, per rank */
	int64_t samples_per_step; /* global samples a step consumes (the cursor's unit) */
	/* 1: the task's step runs its own --accumulate micro-batches and
	 * always updates; 0: every --accumulate-th step (and an epoch's last)
	 * updates, the others accumulate. */
	int accumulates_itself;
	const char *unit;         /* what a sample is called in the summary: "img" */
	int log_last;             /* a progress line on the run's last step too */
	/* An epoch begins: the sampler's epoch, start a feeder (optional). */
	int (*epoch_begin)(train_run *t, void *ctx, int64_t epoch);
	/* Step b of epoch. run 1: train on it (update 0: accumulate only),
	 * adding to *tally its mean loss and, when the task classifies, its
	 * correct and seen counts; run 0: a resumed run is past it, consume
	 * it without training. 0 or -1 after saying why. */
	int (*step)(train_run *t, void *ctx, int64_t epoch, int64_t b, int run, int update,
		    train_tally *tally);
	/* The epoch's steps are over (optional): stop a feeder. */
	void (*epoch_stop)(train_run *t, void *ctx, int64_t epoch);
	/* An epoch's end: the held-out mean loss and accuracy (NaN: not
	 * measured); 1 when there is nothing to evaluate (optional: none). */
	int (*evaluate)(train_run *t, void *ctx, int64_t done, double *loss, double *acc);
	/* After each step (optional), with epoch_end set on an epoch's last
	 * or the run's last step (the driver evaluates there). */
	int (*after_step)(train_run *t, void *ctx, int64_t done, int epoch_end);
	/* The lr of step b of epoch (global step `step`) in a run of `last`
	 * steps (optional: train_lr, the flags' schedule). */
	double (*lr)(train_run *t, void *ctx, int64_t epoch, int64_t b, int64_t step,
		     int64_t last);
	/* The progress line (optional: epoch, step, loss, accuracy, img/s,
	 * ETA, batch, lr, loss scale). The driver writes the --metrics row. */
	void (*progress)(train_run *t, void *ctx, const train_progress *pr);
	/* After the last step, before --export (optional): a sample, a report. */
	int (*finish)(train_run *t, void *ctx);
} train_task;

/*
 * Runs the epochs of task on the compiled program (train_compile first),
 * then --export. 0 or -1 after saying why.
 */
int train_drive(train_run *t, const train_task *task);

/*
 * The image programs' task on train_drive: the prefetched training
 * batches of train_l (over train_s, whose epoch it sets), accuracy from
 * the logits, evaluation on test_l (test_n images; 0: none) after every
 * epoch. 0 or -1 after saying why.
 */
int train_fit(train_run *t, loom_sampler *train_s, loom_loader *train_l, loom_loader *test_l,
	      int64_t test_n);

/*
 * --metrics: one "step" record (rank 0; a no-op without --metrics): the
 * global step, the epoch (1-based), the mean loss and the training accuracy
 * since the last record (acc NaN: not measured, written as null), the lr,
 * the global images/s, and the program's loss scale, skipped steps and the
 * rank count. 0 or -1 after saying why.
 */
int train_log_step(train_run *t, int64_t step, int epoch, double loss, double acc, double lr,
		   double images_per_s);

/* --export: rank 0 writes the weights under the model's names. 0 or -1
 * after saying why; 0 without --export. */
int train_export(train_run *t);

/* Frees the program and the group. */
void train_end(train_run *t);

#endif /* LOOM_EXAMPLES_TRAIN_H */
