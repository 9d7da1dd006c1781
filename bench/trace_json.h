/*
 * bench/trace_json.h — reads back a Chrome trace that loom_trace_stop wrote:
 * a small strict JSON parser (the whole file must be valid JSON) and the
 * events of its "traceEvents" array, for bench/bench_ddp's figures and the
 * tests that check what a trace shows.
 */
#ifndef LOOM_BENCH_TRACE_JSON_H
#define LOOM_BENCH_TRACE_JSON_H

#include <stddef.h>

/* One event: the fields loom writes (absent numbers are -1). */
typedef struct loom_tj_event {
	char name[96];
	char cat[24];
	char ph;        /* 'X' a span, 'M' metadata */
	int pid, tid;
	double ts, dur; /* microseconds */
	int run;        /* args.run */
	int bucket;     /* args.bucket (all-reduce spans) */
	int node;       /* args.node (node spans) */
} loom_tj_event;

typedef struct loom_tj {
	loom_tj_event *ev;
	int n;
} loom_tj;

/* Parses path; 0 on success, else -1 with a message in err ("offset 1234:
 * expected ','"). */
int loom_tj_load(const char *path, loom_tj *out, char *err, size_t errlen);
void loom_tj_free(loom_tj *t);

#endif /* LOOM_BENCH_TRACE_JSON_H */
