/*
 * data_internal.h — helpers shared by the files of datasets/, never included
 * by a public header.
 */
#ifndef LOOM_DATA_INTERNAL_H
#define LOOM_DATA_INTERNAL_H

#include <stddef.h>

#include "base/errf.h" /* loom_error: each handle's last failure */

/* A failure of a call without a handle: the message goes to the thread's
 * error object (loom_last_error) and, unless err is NULL or errlen 0, into
 * err (always NUL-terminated; a long message is cut, never overflows). */
void loom_data_fail(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Empties both at the start of such a call. */
void loom_data_clear(char *err, size_t errlen);
/* The start of such a call that fills *out (size bytes): both emptied,
 * then *out zeroed; out NULL fails with msg (LOOM_ERR_INVALID). */
loom_status loom_data_start(void *out, size_t size, const char *msg, char *err, size_t errlen);

#endif /* LOOM_DATA_INTERNAL_H */
