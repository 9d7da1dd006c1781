/*
 * base/errf.h — the one "print a message into the caller's buffer and return
 * a status" helper, so that an error path reads
 *     return loom_errnf(err, errlen, LOOM_ERR_FORMAT, "%s: bad magic", path);
 * err may be NULL or errlen 0 (the message is dropped, the status kept).
 */
#ifndef LOOM_BASE_ERRF_H
#define LOOM_BASE_ERRF_H

#include <stdarg.h>
#include <stddef.h>

#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

loom_status loom_errnf(char *err, size_t errlen, loom_status st, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
loom_status loom_verrnf(char *err, size_t errlen, loom_status st, const char *fmt,
		       va_list ap) __attribute__((format(printf, 4, 0)));

#ifdef __cplusplus
}
#endif

#endif /* LOOM_BASE_ERRF_H */
