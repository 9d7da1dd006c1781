/* base/errf.c — see errf.h. */
#include "base/errf.h"

#include <stdio.h>

loom_status loom_verrnf(char *err, size_t errlen, loom_status st, const char *fmt, va_list ap)
{
	if (err && errlen)
		vsnprintf(err, errlen, fmt, ap);
	return st;
}

loom_status loom_errnf(char *err, size_t errlen, loom_status st, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	loom_verrnf(err, errlen, st, fmt, ap);
	va_end(ap);
	return st;
}
