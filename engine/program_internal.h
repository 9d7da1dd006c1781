/*
 * engine/program_internal.h — what only the engine sees of a program: the
 * executor's state and the engine's own helpers (steps, formats, input
 * buffers, dumps). The program itself, its hooks and what the engine
 * offers a pass are engine/pass.h, which parallel/ includes instead.
 */
#ifndef LOOM_ENGINE_PROGRAM_INTERNAL_H
#define LOOM_ENGINE_PROGRAM_INTERNAL_H

#include <stdarg.h>
#include <stdio.h>

#include "engine/backend.h"
#include "engine/io_view.h" /* what io/ sees of a program */
#include "engine/pass.h"    /* the program, what its passes see */
#include "engine/plan.h"
#include "loom.h"

/*
 * The executor's state of a program (engine/exec.c; p->exec): the
 * collectives in flight, per bucket, and the spans a traced run waits to
 * read from the backend's timers.
 */
typedef struct loom_exec_span {
	int32_t kind, id, aux;
	int t0, t1; /* timer slots */
} loom_exec_span;

typedef struct loom_exec {
	struct loom_comm_work **pending; /* per bucket: its collective, else NULL */
	int n_pending;
	/* An asynchronous backend over a stream-ordered communicator: the
	 * WAIT step is an event on the device and the watchdog waits on the
	 * host (engine/exec.c); kept: per bucket, its work made once (NULL
	 * where the communicator keeps none). */
	int device_wait;
	struct loom_comm_work **kept;
	/* The training step as one graph (engine/exec.c): graph -1 off, 0
	 * not decided yet, 1 on; graph_runs: training steps run so far on it
	 * (the first eager, the second captured, later replayed); capturing:
	 * the walk is being recorded; captured: the capture was kept and
	 * launched; graph_note: why it is off. */
	int graph, graph_runs, capturing, captured;
	char graph_note[160];
	/* A captured step's collectives, seen by the host through progress
	 * marks (engine/backend.h's mark_*), one per collective start of the
	 * step (a bucket's reduce-scatter and all-gather are two): marks, the
	 * backend's n_marks words; mark_work, per mark, the work made once
	 * that the captured start was given (it names the collective to the
	 * watchdog); n_marked: marks the capture recorded; mark_handed:
	 * hand-offs to the watchdog by mark so far (tests). */
	const volatile uint64_t *marks;
	struct loom_comm_work **mark_work;
	int n_marks, n_marked;
	uint64_t mark_handed;
	int *pending_span;   /* per bucket: its span's index in spans, -1: none */
	loom_exec_span *spans;
	int n_spans, cap_spans;
	int n_timers;        /* timer slots used by this run */
	/* A run changed the device's copy of fp8's delayed state since ts.fp8
	 * was last brought back (loom_exec_fp8_host). */
	int fp8_on_device_newer;
} loom_exec;

/* A program that compiled (a failed compile's handle is not). */
static inline int loom_program_usable(const loom_program *p)
{
	return p && p->ready;
}

/* loom_program_fail, loom_program_upload and _download, values by handle
 * wherever this rank keeps them (loom_value_read_whole, ...): engine/io_view.h. */

/* engine/input_buffer.c: whether input v's buffer is handed out (then
 * loom_set_input waits for its commit or release), and the free of what
 * the hand-outs made. */
typedef struct loom_input_buf loom_input_buf;
int loom_input_buffer_out(const loom_program *p, loom_value v);
void loom_input_buffers_free(loom_program *p);

/* engine/steps.c: the plan's step list from its schedule (nodes,
 * accumulation, the buckets' all-reduces, the optimizer's pieces), for a
 * plain or data-parallel plan; parallel/zero.c makes a ZeRO plan's. */
loom_status loom_steps_build(loom_plan *pl);
/* One piece per slot, the slots' own state offsets. */
loom_status loom_pieces_plain(loom_plan *pl);

/* amp.fp8's delayed state kept on the device (loom_backend_fp8): host
 * brings it into ts.fp8 when a run changed it since (the host view: the
 * report, a checkpoint; waits); device puts ts.fp8 back there (after a
 * checkpoint's load). Both nothing elsewhere. */
loom_status loom_exec_fp8_host(loom_program *p);
loom_status loom_exec_fp8_device(loom_program *p);
/* After synchronize: the traced runs' spans, read from the backend's
 * timers, into the trace. */
loom_status loom_exec_trace_flush(loom_program *p);
void loom_exec_free(loom_exec *x);
/* Before the backend is freed: no collective still writes into its arena. */
void loom_exec_drain(loom_program *p);
/* Whether the backend runs every node a step runs; else the message names
 * the first node it refuses, with its dtypes and shapes. */
loom_status loom_exec_check_support(loom_program *p);

/* Test hook: while set, loom_compile runs every program on this backend. */
extern const loom_backend *loom_test_backend;

/* The step list, one line per step (loom_program_dump ends with it). */
void loom_program_dump_steps(const loom_program *p, FILE *out);

/* The format pass for p (engine/formats.c): each value's memory format
 * from what p's backend takes, reorder nodes where they disagree. Run
 * after the fusion passes, before the memory plan. */
loom_status loom_plan_formats(loom_program *p);
/* Whether o (or LOOM_FORMATS, which decides instead) asks for the pass. */
int loom_formats_on(const loom_compile_opts *o);

#endif /* LOOM_ENGINE_PROGRAM_INTERNAL_H */
