/*
 * engine/program_util.c — small helpers every backend shares.
 */
#include <stdio.h>

#include "engine/program_internal.h"

loom_status loom_program_fail(loom_program *p, loom_status st, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(p->err, sizeof(p->err), fmt, ap);
	va_end(ap);
	return st;
}
