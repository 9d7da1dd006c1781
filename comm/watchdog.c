/*
 * comm/watchdog.c — the thread that waits for a communicator's collectives
 * when the step does not: the executor makes the compute stream wait for a
 * collective on the device and hands its work here, and this thread calls
 * the backend's own wait() on it, oldest first (for a replayed graph's
 * collective, which has no event of its own, wait_mark() on its progress
 * mark: a word the device writes with the launch's serial). The timeout, the message
 * naming the rank and the collective, and the abort of the communicator are
 * therefore exactly the backend's; the first failure is kept and handed to
 * the next caller on the step's thread (loom_comm_watch_status).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"

/* One hand-off: a work, and for a replayed collective the mark it waits on. */
typedef struct watch_item {
	loom_comm_work *w;
	const volatile uint64_t *mark; /* NULL: the backend's wait() */
	uint64_t serial;
	double t0;
} watch_item;

struct loom_comm_watch {
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t more, idle; /* a work was handed; the queue ran dry */
	watch_item *q;             /* handed, not yet taken, oldest first */
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
		watch_item it = wd->q[0];
		memmove(wd->q, wd->q + 1, sizeof(*wd->q) * (size_t)--wd->n);
		wd->busy = 1;
		pthread_mutex_unlock(&wd->mu);
		/* The backend's wait: its timeout, its message, its abort. A
		 * broken communicator answers at once (and frees what it must). */
		loom_status st = it.mark ? c->i->wait_mark(c, it.w, it.mark, it.serial, it.t0) :
					   c->i->wait(c, it.w);
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

/* Queues it (a work queued already and not yet taken: watched once, the
 * later hand-off's serial and clock kept). */
static loom_status hand(loom_comm *c, const watch_item *it)
{
	struct loom_comm_watch *wd = c->watch;
	loom_status st;
	pthread_mutex_lock(&wd->mu);
	watch_item *queued = NULL;
	for (int i = 0; i < wd->n && !queued; i++)
		if (wd->q[i].w == it->w && wd->q[i].mark == it->mark)
			queued = &wd->q[i];
	if (!queued && wd->n == wd->cap) {
		int cap = wd->cap ? 2 * wd->cap : 16;
		watch_item *q = realloc(wd->q, sizeof(*q) * (size_t)cap);
		if (!q) {
			pthread_mutex_unlock(&wd->mu);
			return loom_pg_fail(c->pg, LOOM_ERR_NOMEM, "watchdog: out of memory");
		}
		wd->q = q;
		wd->cap = cap;
	}
	if (queued) {
		*queued = *it;
	} else {
		wd->q[wd->n++] = *it;
		wd->handed++;
		pthread_cond_signal(&wd->more);
	}
	st = verdict(c);
	pthread_mutex_unlock(&wd->mu);
	return st;
}

loom_status loom_comm_watch(loom_comm *c, loom_comm_work *w)
{
	if (!c || !w)
		return LOOM_ERR_INVALID;
	if (!c->watch && watch_start(c) != LOOM_OK) {
		/* No thread: the host waits, as before. */
		return loom_comm_wait(c, w);
	}
	watch_item it = { .w = w };
	return hand(c, &it);
}

int loom_comm_has_marks(const loom_comm *c)
{
	return c && c->i->wait_mark;
}

loom_status loom_comm_watch_mark(loom_comm *c, loom_comm_work *w, const volatile uint64_t *mark,
				 uint64_t serial)
{
	if (!c || !w || !mark)
		return LOOM_ERR_INVALID;
	if (!c->i->wait_mark)
		return loom_pg_fail(c->pg, LOOM_ERR_UNSUPPORTED,
				    "the %s communicator cannot wait for a progress mark", c->i->name);
	watch_item it = { .w = w, .mark = mark, .serial = serial, .t0 = loom_comm_now() };
	if (!c->watch && watch_start(c) != LOOM_OK) {
		if (c->broken)
			return LOOM_ERR_STATE;
		return c->i->wait_mark(c, w, mark, serial, it.t0);
	}
	return hand(c, &it);
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
