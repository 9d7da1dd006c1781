/*
 * examples/train.h — what the training examples share once their flags are
 * parsed: the process group (--nproc, mpirun, env://), compiling with the
 * plan and memory reports, the start-up lines, checkpoints with a data
 * cursor, the epoch loop with its progress line and learning-rate schedule,
 * and evaluation summed across ranks. A program builds its graph and its
 * loaders; train.c runs them.
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
	train_metrics *metrics; /* --metrics, on rank 0; else NULL */
} train_run;

/* The settings every rank must share, as train_start compares them across
 * ranks: each named by its flag ("--lr", value "0.1"), two by what they
 * are ("program", "decay on matrices only"). Fills s (room for
 * TRAIN_SETTINGS_MAX) and returns how many. */
#define TRAIN_SETTINGS_MAX 64
size_t train_settings(const train_program *prog, const train_args *a, loom_comm_setting *s);

/* The flags (names without dashes) that may differ between ranks; every
 * other flag of train_args.c is in train_settings. NULL-ended. */
extern const char *const train_settings_free[];

/* Monotonic seconds. */
double train_now(void);

/* The batch the graph is built for: --batch-size, or a micro-batch of it
 * under --pipeline. */
int train_graph_batch(const train_run *t);

/*
 * main()'s first call: --nproc (this process becomes the launcher), the
 * flags, the checkpoint path, the process group; on ranks above 0 stdout is
 * quieted (only rank 0 prints progress; errors go to stderr from every
 * rank). Returns -1 when the program should go on, else the exit code for
 * main (0 after --help, 2 for a bad flag, 1 for a failure, said on stderr).
 */
int train_start(train_run *t, const train_program *prog, int argc, char **argv);

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

/*
 * The epochs: resume (--resume, from the checkpoint and its cursor), the
 * prefetched training batches of train_l (over train_s, whose epoch it
 * sets), the schedule, the progress line every --log-interval steps,
 * checkpoints, and evaluation on test_l (test_n images; 0: none) after
 * every epoch. 0 or -1 after saying why.
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
