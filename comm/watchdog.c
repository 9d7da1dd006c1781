/*
 * comm/watchdog.c — the thread that waits for a communicator's collectives
 * when the step does not: the executor makes the compute stream wait for a
 * collective on the device and hands its work here, and this thread calls
 * the backend's own wait() on it, oldest first. The timeout, the message
 * naming the rank and the collective, and the abort of the communicator are
 * therefore exactly the backend's; the first failure is kept and handed to
 * the next caller on the step's thread (loom_comm_watch_status).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"

struct loom_comm_watch {
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t more, idle; /* a work was handed; the queue ran dry */
	loom_comm_work **q;        /* handed, not yet taken, oldest first */
	int n, cap;
	int busy; /* the thread is in wait() */
	int stop;
	loom_status st; /* the first failure */
	char err[LOOM_COMM_ERRLEN];
	uint64_t handed, ended;
};

static void *watch_main(void *arg)
{
	loom_comm *c = arg;
	struct loom_comm_watch *wd = c->watch;

	pthread_mutex_lock(&wd->mu);
	for (;;) {
		while (!wd->n && !wd->stop)
			pthread_cond_wait(&wd->more, &wd->mu);
		if (!wd->n)
			break; /* stopping, nothing left */
		loom_comm_work *w = wd->q[0];
		memmove(wd->q, wd->q + 1, sizeof(*wd->q) * (size_t)--wd->n);
		wd->busy = 1;
		pthread_mutex_unlock(&wd->mu);
		/* The backend's wait: its timeout, its message, its abort. A
		 * broken communicator answers at once (and frees what it must). */
		loom_status st = c->i->wait(c, w);
		pthread_mutex_lock(&wd->mu);
		wd->busy = 0;
		wd->ended++;
		if (st != LOOM_OK && wd->st == LOOM_OK) {
			wd->st = st;
			strncpy(wd->err, loom_pg_error(c->pg), sizeof(wd->err) - 1);
			/* No rank hangs on a communicator whose collective
			 * failed (the backend's wait may have aborted it
			 * already: abort is idempotent). */
			c->broken = 1;
			c->i->abort(c);
		}
		if (!wd->n)
			pthread_cond_broadcast(&wd->idle);
	}
	pthread_cond_broadcast(&wd->idle);
	pthread_mutex_unlock(&wd->mu);
	return NULL;
}

static loom_status watch_start(loom_comm *c)
{
	struct loom_comm_watch *wd = calloc(1, sizeof(*wd));

	if (!wd)
		return loom_pg_fail(c->pg, LOOM_ERR_NOMEM, "watchdog: out of memory");
	pthread_mutex_init(&wd->mu, NULL);
	pthread_cond_init(&wd->more, NULL);
	pthread_cond_init(&wd->idle, NULL);
	c->watch = wd;
	if (pthread_create(&wd->thread, NULL, watch_main, c) != 0) {
		c->watch = NULL;
		pthread_mutex_destroy(&wd->mu);
		pthread_cond_destroy(&wd->more);
		pthread_cond_destroy(&wd->idle);
		free(wd);
		return loom_pg_fail(c->pg, LOOM_ERR_IO, "watchdog: cannot start its thread");
	}
	return LOOM_OK;
}

/* The kept failure, its message put back into the group's; under mu. */
static loom_status verdict(loom_comm *c)
{
	struct loom_comm_watch *wd = c->watch;

	if (wd->st == LOOM_OK)
		return LOOM_OK;
	return loom_pg_fail(c->pg, wd->st, "%s", wd->err);
}

loom_status loom_comm_watch(loom_comm *c, loom_comm_work *w)
{
	loom_status st;

	if (!c || !w)
		return LOOM_ERR_INVALID;
	if (!c->watch && (st = watch_start(c)) != LOOM_OK) {
		/* No thread: the host waits, as before. */
		return loom_comm_wait(c, w);
	}
	struct loom_comm_watch *wd = c->watch;
	pthread_mutex_lock(&wd->mu);
	int queued = 0;
	for (int i = 0; i < wd->n && !queued; i++)
		queued = wd->q[i] == w;
	if (!queued && wd->n == wd->cap) {
		int cap = wd->cap ? 2 * wd->cap : 16;
		loom_comm_work **q = realloc(wd->q, sizeof(*q) * (size_t)cap);
		if (!q) {
			pthread_mutex_unlock(&wd->mu);
			return loom_pg_fail(c->pg, LOOM_ERR_NOMEM, "watchdog: out of memory");
		}
		wd->q = q;
		wd->cap = cap;
	}
	if (!queued) {
		wd->q[wd->n++] = w;
		wd->handed++;
		pthread_cond_signal(&wd->more);
	}
	st = verdict(c);
	pthread_mutex_unlock(&wd->mu);
	return st;
}

loom_status loom_comm_watch_status(loom_comm *c)
{
	if (!c || !c->watch)
		return LOOM_OK;
	pthread_mutex_lock(&c->watch->mu);
	loom_status st = verdict(c);
	pthread_mutex_unlock(&c->watch->mu);
	return st;
}

loom_status loom_comm_watch_drain(loom_comm *c)
{
	if (!c || !c->watch)
		return LOOM_OK;
	struct loom_comm_watch *wd = c->watch;
	pthread_mutex_lock(&wd->mu);
	while (wd->n || wd->busy)
		pthread_cond_wait(&wd->idle, &wd->mu);
	loom_status st = verdict(c);
	pthread_mutex_unlock(&wd->mu);
	return st;
}

void loom_comm_watch_counts(const loom_comm *c, uint64_t *handed, uint64_t *ended)
{
	*handed = *ended = 0;
	if (!c || !c->watch)
		return;
	pthread_mutex_lock(&c->watch->mu);
	*handed = c->watch->handed;
	*ended = c->watch->ended;
	pthread_mutex_unlock(&c->watch->mu);
}

void loom_comm_watch_stop(loom_comm *c)
{
	if (!c || !c->watch)
		return;
	struct loom_comm_watch *wd = c->watch;
	pthread_mutex_lock(&wd->mu);
	wd->stop = 1;
	pthread_cond_signal(&wd->more);
	pthread_mutex_unlock(&wd->mu);
	pthread_join(wd->thread, NULL);
	pthread_mutex_destroy(&wd->mu);
	pthread_cond_destroy(&wd->more);
	pthread_cond_destroy(&wd->idle);
	free(wd->q);
	free(wd);
	c->watch = NULL;
}

loom_status loom_comm_work_make(loom_comm *c, loom_comm_work **out)
{
	*out = NULL;
	if (!c || !c->i->work_make)
		return LOOM_OK;
	return c->i->work_make(c, out);
}

void loom_comm_work_free(loom_comm *c, loom_comm_work *w)
{
	if (c && w && c->i->work_free)
		c->i->work_free(c, w);
}

int loom_comm_stream_ordered(const loom_comm *c)
{
	return c && c->i->stream_ordered;
}
