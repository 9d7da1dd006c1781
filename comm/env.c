/*
 * comm/env.c — the environment a rank starts from (torchrun's env://
 * variables, Open MPI's OMPI_COMM_WORLD_*), parsed strictly, plus the small
 * helpers every file of comm/ uses: error formatting, clocks, polite polling.
 */
#include "comm/comm_internal.h"

#include "base/errf.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

loom_status loom_pg_fail(loom_pg *pg, loom_status st, const char *fmt, ...)
{
	va_list ap;

	if (!pg)
		return st;
	va_start(ap, fmt);
	loom_verrnf(pg->err, sizeof(pg->err), st, fmt, ap);
	va_end(ap);
	return st;
}

loom_status loom_comm_fail(loom_comm *c, loom_status st, const char *fmt, ...)
{
	va_list ap;

	c->broken = 1;
	if (!c->pg)
		return st;
	va_start(ap, fmt);
	loom_verrnf(c->pg->err, sizeof(c->pg->err), st, fmt, ap);
	va_end(ap);
	return st;
}

double loom_comm_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void loom_comm_backoff(double waited_s)
{
	/* 20 us while a collective is young (most finish there), then up to
	 * 1 ms: the wake-up delay stays small next to the timeout. */
	long ns = waited_s < 1e-3 ? 20000 : waited_s < 0.1 ? 200000 : 1000000;
	struct timespec ts = { 0, ns };

	nanosleep(&ts, NULL);
}

loom_status loom_comm_parse_int(const char *name, const char *text, int lo, int hi, int *out,
				char *err, size_t errlen)
{
	const char *p;
	long v = 0;

	if (!text || !*text)
		return loom_comm_errf(err, errlen, LOOM_ERR_INVALID, "%s is empty", name);
	for (p = text; *p; p++) {
		if (*p < '0' || *p > '9')
			return loom_comm_errf(err, errlen, LOOM_ERR_INVALID,
					      "%s='%s' is not a non-negative integer", name, text);
		v = v * 10 + (*p - '0');
		if (v > INT_MAX)
			break;
	}
	if (v < lo || v > hi)
		return loom_comm_errf(err, errlen, LOOM_ERR_INVALID,
				      "%s='%s' is out of range [%d, %d]", name, text, lo, hi);
	*out = (int)v;
	return LOOM_OK;
}

static loom_status required(const char *name, const char **out, char *err, size_t errlen)
{
	*out = getenv(name);
	if (!*out)
		return loom_comm_errf(err, errlen, LOOM_ERR_INVALID,
				      "env://: %s is not set (RANK, WORLD_SIZE, MASTER_ADDR "
				      "and MASTER_PORT are required)",
				      name);
	return LOOM_OK;
}

loom_status loom_comm_env_parse(loom_comm_env *e, char *err, size_t errlen)
{
	const char *rank, *world, *addr, *port, *lr, *lw;
	loom_status st;

	memset(e, 0, sizeof(*e));
	if ((st = required("RANK", &rank, err, errlen)) ||
	    (st = required("WORLD_SIZE", &world, err, errlen)) ||
	    (st = required("MASTER_ADDR", &addr, err, errlen)) ||
	    (st = required("MASTER_PORT", &port, err, errlen)))
		return st;
	if ((st = loom_comm_parse_int("WORLD_SIZE", world, 1, 1 << 20, &e->world, err, errlen)) ||
	    (st = loom_comm_parse_int("RANK", rank, 0, INT_MAX, &e->rank, err, errlen)) ||
	    (st = loom_comm_parse_int("MASTER_PORT", port, 1, 65535, &e->master_port, err,
				      errlen)))
		return st;
	if (e->rank >= e->world)
		return loom_comm_errf(err, errlen, LOOM_ERR_INVALID,
				      "RANK=%d is not below WORLD_SIZE=%d", e->rank, e->world);
	if (!*addr || strlen(addr) >= sizeof(e->master_addr))
		return loom_comm_errf(err, errlen, LOOM_ERR_INVALID,
				      "MASTER_ADDR='%.64s' is empty or too long", addr);
	strcpy(e->master_addr, addr);

	lr = getenv("LOCAL_RANK");
	lw = getenv("LOCAL_WORLD_SIZE");
	e->local_rank = e->local_world = -1;
	if (lr && (st = loom_comm_parse_int("LOCAL_RANK", lr, 0, INT_MAX, &e->local_rank, err,
					    errlen)))
		return st;
	if (lw && (st = loom_comm_parse_int("LOCAL_WORLD_SIZE", lw, 1, e->world,
					    &e->local_world, err, errlen)))
		return st;
	if (lw && lr && e->local_rank >= e->local_world)
		return loom_comm_errf(err, errlen, LOOM_ERR_INVALID,
				      "LOCAL_RANK=%d is not below LOCAL_WORLD_SIZE=%d",
				      e->local_rank, e->local_world);
	if (lr && !lw && e->local_rank >= e->world)
		return loom_comm_errf(err, errlen, LOOM_ERR_INVALID,
				      "LOCAL_RANK=%d is not below WORLD_SIZE=%d", e->local_rank,
				      e->world);
	return LOOM_OK;
}

loom_status loom_comm_env_parse_ompi(loom_comm_env *e, int *present, char *err, size_t errlen)
{
	const char *rank = getenv("OMPI_COMM_WORLD_RANK");
	const char *size = getenv("OMPI_COMM_WORLD_SIZE");
	const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
	const char *lw = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
	loom_status st;

	memset(e, 0, sizeof(*e));
	*present = size != NULL;
	if (!*present)
		return LOOM_OK;
	if (!rank || !lr || !lw)
		return loom_comm_errf(err, errlen, LOOM_ERR_INVALID,
				      "OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_%s is not",
				      !rank ? "RANK" : !lr ? "LOCAL_RANK" : "LOCAL_SIZE");
	if ((st = loom_comm_parse_int("OMPI_COMM_WORLD_SIZE", size, 1, 1 << 20, &e->world, err,
				      errlen)) ||
	    (st = loom_comm_parse_int("OMPI_COMM_WORLD_RANK", rank, 0, e->world - 1, &e->rank,
				      err, errlen)) ||
	    (st = loom_comm_parse_int("OMPI_COMM_WORLD_LOCAL_SIZE", lw, 1, e->world,
				      &e->local_world, err, errlen)) ||
	    (st = loom_comm_parse_int("OMPI_COMM_WORLD_LOCAL_RANK", lr, 0, e->local_world - 1,
				      &e->local_rank, err, errlen)))
		return st;
	return LOOM_OK;
}

loom_status loom_comm_env_timeout(double *out, int *present, char *err, size_t errlen)
{
	const char *t = getenv("LOOM_COMM_TIMEOUT_S");
	char *end;
	double v;

	*present = t != NULL;
	if (!t)
		return LOOM_OK;
	errno = 0;
	v = strtod(t, &end);
	if (!*t || *end || errno || !(v > 0) || v > 1e7)
		return loom_comm_errf(err, errlen, LOOM_ERR_INVALID,
				      "LOOM_COMM_TIMEOUT_S='%s' is not a positive number of seconds",
				      t);
	*out = v;
	return LOOM_OK;
}

int loom_comm_pick_device(int local_rank, int visible, char *note, size_t notelen)
{
	int dev;

	if (note && notelen)
		note[0] = 0;
	if (visible <= 0 || local_rank < 0)
		return -1;
	if (local_rank < visible)
		return local_rank;
	/* A launcher that gives each rank its own CUDA_VISIBLE_DEVICES shows
	 * every rank one device: it is device 0. More ranks than devices on a
	 * host share them round-robin. */
	dev = local_rank % visible;
	if (note && notelen)
		snprintf(note, notelen,
			 "LOCAL_RANK %d but %d visible CUDA device%s: using device %d%s", local_rank,
			 visible, visible == 1 ? "" : "s", dev,
			 visible == 1 ? " (one device per rank, e.g. CUDA_VISIBLE_DEVICES per rank)" :
					" (ranks share devices round-robin)");
	return dev;
}
