/*
 * engine/trace.h — the spans loom_trace_start records (io/trace.c writes
 * them as a Chrome trace): what the program and the backends add while a
 * trace is on. Off, ts->trace is NULL and recording is one pointer test.
 */
#ifndef LOOM_ENGINE_TRACE_H
#define LOOM_ENGINE_TRACE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* The clock of traces and of the backends' timers: CLOCK_MONOTONIC seconds. */
static inline double loom_trace_now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef enum loom_span_kind {
	LOOM_SPAN_RUN = 0,   /* one loom_run: id the mode, aux the step it makes */
	LOOM_SPAN_PHASE,     /* id: LOOM_PHASE_* */
	LOOM_SPAN_NODE,      /* id: the node (with what it makes besides, fused) */
	LOOM_SPAN_WAIT,      /* the wait for outstanding all-reduces */
	LOOM_SPAN_ACCUM,     /* gradient accumulation: id the segment (-1: all), aux 1 fold */
	LOOM_SPAN_ALLREDUCE, /* id: the bucket, aux its loom_coll_op; start to its end
			      * (first seen complete, or its event) ("comm" track) */
	LOOM_SPAN_COPY,      /* ZeRO: bucket id's gathered parameters into the parameters */
	LOOM_SPAN_RECV,      /* pipeline: receiving value id of micro-batch aux */
	LOOM_SPAN_KIND_COUNT
} loom_span_kind;

/* One span, plain data of fixed size: rank 0 gathers the others' as bytes
 * (every rank runs the same plan, so ids mean the same everywhere). */
typedef struct loom_span {
	double t0, t1; /* CLOCK_MONOTONIC seconds */
	int32_t kind, id, run, aux;
} loom_span;

typedef struct loom_trace {
	loom_span *span;
	size_t n, cap;
	int lost;      /* spans dropped for want of memory */
	int run;       /* runs recorded so far */
	double origin; /* when it started (rank 0's is the file's zero) */
	FILE *out;     /* rank 0 (or world 1): the file being written */
	char path[512];
} loom_trace;

/* Records a span; never fails a step (a span that finds no memory is
 * counted in lost and the file says so). */
static inline void loom_trace_add(loom_trace *t, int kind, int id, int aux, double t0, double t1)
{
	if (t->n == t->cap) {
		size_t cap = t->cap ? 2 * t->cap : 1024;
		loom_span *s = (loom_span *)realloc(t->span, cap * sizeof(*s));
		if (!s) {
			t->lost++;
			return;
		}
		t->span = s;
		t->cap = cap;
	}
	t->span[t->n++] = (loom_span){ t0, t1, kind, id, t->run, aux };
}

/* Closes the file unwritten and frees t (NULL: nothing). Here, not in
 * io/trace.c (which writes the file), so that the engine, which frees a
 * program's trace, calls nothing in io/. */
static inline void loom_trace_free(loom_trace *t)
{
	if (!t)
		return;
	if (t->out)
		fclose(t->out);
	free(t->span);
	free(t);
}

#endif /* LOOM_ENGINE_TRACE_H */
