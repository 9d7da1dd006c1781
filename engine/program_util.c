/*
 * engine/program_util.c — small helpers every backend shares: error
 * formatting, and the messages both backends word the same way.
 */
#include <stdio.h>
#include <stdlib.h>

#include "engine/program_internal.h"

#include "base/errf.h"

loom_status loom_program_fail(loom_program *p, loom_status st, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(p->err, sizeof(p->err), fmt, ap);
	va_end(ap);
	return st;
}

loom_status loom_errf(char *err, loom_status st, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	loom_verrnf(err, LOOM_ERR_MAX, st, fmt, ap);
	va_end(ap);
	return st;
}

loom_status loom_bad_label(char *err, const loom_plan *pl, loom_value v, int32_t label, int row)
{
	const loom_node *n = &pl->g->nodes[v];
	char lb[96];
	return loom_errf(err, LOOM_ERR_INVALID, "%s: label %d of row %d is outside [0, %lld)",
			 loom_node_label(pl->g, v, lb, sizeof(lb)), (int)label, row,
			 (long long)pl->g->nodes[n->src[0]].shape.dims[1]);
}

loom_status loom_program_backend_fail(loom_program *p, loom_status st)
{
	snprintf(p->err, sizeof(p->err), "%s", p->be->error(p->be_ctx));
	return st;
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

/* The library's one way to print: the user's callback, else stderr. */
static loom_log_fn log_fn;
static void *log_user;

void loom_set_log(loom_log_fn fn, void *user)
{
	log_fn = fn;
	log_user = user;
}

void loom_log(const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (log_fn)
		log_fn(log_user, msg);
	else
		fputs(msg, stderr);
}
