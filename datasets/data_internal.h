/*
 * data_internal.h — helpers shared by the files of datasets/, never included
 * by a public header.
 */
#ifndef LOOM_DATA_INTERNAL_H
#define LOOM_DATA_INTERNAL_H

#include <stddef.h>

/* Formats into err (which may be NULL or errlen 0, then nothing is written).
 * Always NUL-terminates; a long message is cut, never overflows. */
void loom_data_errf(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Room for one message kept inside an object. */
#define LOOM_DATA_ERRLEN 512

#endif /* LOOM_DATA_INTERNAL_H */
