/* base/errf.c — the formatter, the error objects and the log sink (errf.h). */
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

loom_status loom_error_vset(loom_error *e, loom_status st, const char *fmt, va_list ap)
{
	e->st = st;
	return loom_verrnf(e->msg, sizeof(e->msg), st, fmt, ap);
}

loom_status loom_error_set(loom_error *e, loom_status st, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	loom_error_vset(e, st, fmt, ap);
	va_end(ap);
	return st;
}

void loom_error_clear(loom_error *e)
{
	e->st = LOOM_OK;
	e->msg[0] = '\0';
}

static __thread loom_error thread_error;

loom_error *loom_thread_error(void)
{
	return &thread_error;
}

loom_status loom_fail(loom_status st, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	loom_error_vset(&thread_error, st, fmt, ap);
	va_end(ap);
	return st;
}

const char *loom_last_error(void)
{
	return thread_error.msg;
}

/* The user's callback, else stderr: one setting for the process. */
static loom_log_fn log_fn;
static void *log_user;

void loom_set_log(loom_log_fn fn, void *user)
{
	log_fn = fn;
	log_user = user;
}

void loom_vlog(const char *fmt, va_list ap)
{
	char msg[2048];

	vsnprintf(msg, sizeof(msg), fmt, ap);
	if (log_fn)
		log_fn(log_user, msg);
	else
		fputs(msg, stderr);
}

void loom_log(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	loom_vlog(fmt, ap);
	va_end(ap);
}
