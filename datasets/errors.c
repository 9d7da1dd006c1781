/*
 * errors.c — how a datasets/ call without a handle (a load, a constructor)
 * reports: the message goes to the thread's error object (loom_last_error,
 * base/errf.h) and, where the caller gave one, into its buffer.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/errf.h"
#include "data_internal.h"

void loom_data_fail(char *err, size_t errlen, const char *fmt, ...)
{
	loom_error *e = loom_thread_error();
	va_list ap;

	va_start(ap, fmt);
	loom_error_vset(e, LOOM_ERR_INVALID, fmt, ap);
	va_end(ap);
	loom_errnf(err, errlen, LOOM_OK, "%s", e->msg);
}

void loom_data_clear(char *err, size_t errlen)
{
	loom_error_clear(loom_thread_error());
	loom_errnf(err, errlen, LOOM_OK, "%s", "");
}

loom_status loom_data_start(void *out, size_t size, const char *msg, char *err, size_t errlen)
{
	loom_data_clear(err, errlen);
	if (!out) {
		loom_data_fail(err, errlen, "%s", msg);
		return LOOM_ERR_INVALID;
	}
	memset(out, 0, size);
	return LOOM_OK;
}
