/*
 * examples/metrics.c — the --metrics log (metrics.h): JSON Lines through
 * jansson, one flushed line per record.
 */
#include "examples/metrics.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct train_metrics {
	FILE *f;
	double t0;
	int failed;
};

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

int train_metrics_open(train_metrics **out, const char *path, char *err, size_t errlen)
{
	*out = NULL;
	train_metrics *m = calloc(1, sizeof(*m));
	if (!m) {
		snprintf(err, errlen, "--metrics %s: out of memory", path);
		return -1;
	}
	if (!(m->f = fopen(path, "w"))) {
		snprintf(err, errlen, "--metrics %s: %s", path, strerror(errno));
		free(m);
		return -1;
	}
	m->t0 = now_s();
	*out = m;
	return 0;
}

json_t *train_metrics_number(double x)
{
	return isfinite(x) ? json_real(x) : json_null();
}

int train_metrics_log(train_metrics *m, const char *type, char *err, size_t errlen,
		      const char *fmt, ...)
{
	json_error_t je;
	va_list ap;
	if (!m)
		return 0;
	va_start(ap, fmt);
	json_t *o = json_vpack_ex(&je, 0, fmt, ap);
	va_end(ap);
	if (!o || !json_is_object(o)) {
		snprintf(err, errlen, "--metrics: cannot build a '%s' record: %s", type,
			 o ? "not an object" : je.text);
		json_decref(o);
		return -1;
	}
	json_t *line = json_pack("{s:s, s:f}", "type", type, "wall_s", now_s() - m->t0);
	int bad = !line || json_object_update(line, o) != 0;
	char *s = bad ? NULL : json_dumps(line, JSON_COMPACT | JSON_REAL_PRECISION(10));
	json_decref(o);
	json_decref(line);
	if (!s || fprintf(m->f, "%s\n", s) < 0 || fflush(m->f) != 0) {
		snprintf(err, errlen, "--metrics: writing a '%s' record failed: %s", type,
			 s ? strerror(errno) : "out of memory");
		free(s);
		m->failed = 1;
		return -1;
	}
	free(s);
	return 0;
}

int train_metrics_close(train_metrics *m)
{
	if (!m)
		return 0;
	int bad = fclose(m->f) != 0 || m->failed;
	free(m);
	return bad ? -1 : 0;
}
