/*
 * errors.c — the one formatter every datasets/ message goes through, so that
 * a NULL or short buffer is handled in a single place.
 */
#include <stdarg.h>
#include <stdio.h>

#include "data_internal.h"

void loom_data_errf(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || errlen == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}
