/*
 * examples/metrics.h — the --metrics log: one JSON object per line
 * (JSON Lines), written with jansson and flushed line by line, so that a
 * run that crashes keeps everything it logged and a plot (tools/plot_metrics)
 * or a notebook can read it while it runs.
 */
#ifndef LOOM_EXAMPLES_METRICS_H
#define LOOM_EXAMPLES_METRICS_H

#include <stddef.h>

typedef struct train_metrics train_metrics;

/* Creates (truncates) path. 0, or -1 with err naming the path and why. */
int train_metrics_open(train_metrics **out, const char *path, char *err, size_t errlen);

/*
 * Appends one object: {"type": type, "wall_s": seconds since open, ...}
 * where the rest is built by jansson's json_pack from fmt and its
 * arguments (fmt an object: "{s:I, s:f}" ...). A number that may be inf or
 * NaN, which JSON cannot hold, goes in as "s:o" with train_metrics_number.
 * 0, or -1 when the line could not be built or written (err names why).
 */
int train_metrics_log(train_metrics *m, const char *type, char *err, size_t errlen,
		      const char *fmt, ...);

/* x as a JSON number, or null when it is not finite (not measured): a new
 * reference for json_pack's "o". */
struct json_t *train_metrics_number(double x);

/* Closes the file; NULL is fine. 0, or -1 when the last write failed. */
int train_metrics_close(train_metrics *m);

#endif /* LOOM_EXAMPLES_METRICS_H */
