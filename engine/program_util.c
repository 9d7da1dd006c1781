/*
 * engine/program_util.c — the engine's small helpers: a program's errors
 * (its own, a backend's copied in), uploads and downloads that record a
 * failure.
 */
#include <stdio.h>
#include <stdlib.h>

#include "engine/program_internal.h"

loom_status loom_program_fail(loom_program *p, loom_status st, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	loom_error_vset(&p->err, st, fmt, ap);
	va_end(ap);
	return st;
}

loom_status loom_program_backend_fail(loom_program *p, loom_status st)
{
	return loom_error_set(&p->err, st, "%s", p->be->error(p->be_ctx));
}

loom_status loom_program_upload(loom_program *p, void *dst, const void *src, size_t bytes)
{
	loom_status st = p->be->upload(p->be_ctx, dst, src, bytes);
	return st != LOOM_OK ? loom_program_backend_fail(p, st) : LOOM_OK;
}

loom_status loom_program_download(loom_program *p, void *dst, const void *src, size_t bytes)
{
	loom_status st = p->be->download(p->be_ctx, dst, src, bytes);
	return st != LOOM_OK ? loom_program_backend_fail(p, st) : LOOM_OK;
}
