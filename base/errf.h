/*
 * base/errf.h — loom's one error path, below every folder:
 *  - the one formatter, loom_errnf: print a message into a buffer and return
 *    the status, so that an error path reads
 *        return loom_errnf(err, errlen, LOOM_ERR_FORMAT, "%s: bad magic", path);
 *    (err may be NULL or errlen 0: the message is dropped, the status kept);
 *  - the error object, loom_error: the status and message of a handle's last
 *    failure; every handle (graph, program, process group, sampler, loader,
 *    prefetch) holds one and its getter returns its message;
 *  - the thread's error object, for calls made without a handle (a failed
 *    constructor, loom_compile refusing its arguments): loom_fail sets it,
 *    loom_last_error (include/loom.h) reads it;
 *  - the log sink, loom_log: the one way library code prints (the user's
 *    callback set with loom_set_log, else stderr). Library code never
 *    writes to stderr itself (tests/base/no_stderr_test.sh holds it so).
 */
#ifndef LOOM_BASE_ERRF_H
#define LOOM_BASE_ERRF_H

#include <stdarg.h>
#include <stddef.h>

#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Size of every error buffer a backend or launcher writes into. */
#define LOOM_ERR_MAX 512
/* Size of an error object's message (a process group's name several ranks). */
#define LOOM_ERROR_MSG 1024

loom_status loom_errnf(char *err, size_t errlen, loom_status st, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
loom_status loom_verrnf(char *err, size_t errlen, loom_status st, const char *fmt,
		       va_list ap) __attribute__((format(printf, 4, 0)));

/* The status and message of the last failure ("" and LOOM_OK while none). */
typedef struct loom_error {
	loom_status st;
	char msg[LOOM_ERROR_MSG];
} loom_error;

/* Records a failure in e; returns st, so `return loom_error_set(...)`. */
loom_status loom_error_set(loom_error *e, loom_status st, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
loom_status loom_error_vset(loom_error *e, loom_status st, const char *fmt, va_list ap)
	__attribute__((format(printf, 3, 0)));
void loom_error_clear(loom_error *e);

/* The calling thread's error object: failures of calls without a handle. */
loom_error *loom_thread_error(void);
/* loom_error_set on the thread's error object. */
loom_status loom_fail(loom_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prints one message (a line ending in a newline) through the log sink. */
void loom_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void loom_vlog(const char *fmt, va_list ap) __attribute__((format(printf, 1, 0)));

#ifdef __cplusplus
}
#endif

#endif /* LOOM_BASE_ERRF_H */
