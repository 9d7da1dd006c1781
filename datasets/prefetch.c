/*
 * prefetch.c — double buffering over a loom_loader: one worker thread fills
 * batch k+1 into one buffer while the caller trains on batch k in the other.
 * A generation counter lets start() abandon an epoch without the worker
 * writing a stale batch into the new one. Given buffers: the caller hands
 * over where each batch goes (a program's input buffer, a pinned slot), and
 * the worker converts straight into it.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data_internal.h"
#include "loom_data.h"

struct loom_prefetch {
	loom_loader *l;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv; /* any change of the state below */

	float *images[2]; /* batch b lives in slot b % 2 */
	int32_t *labels[2];
	int count[2];
	/* Caller-given buffers (loom_prefetch_new_given): slots hold what
	 * loom_prefetch_give handed over, owned by the caller; batches
	 * [0, n_given) of the epoch have theirs. */
	int given;
	int64_t n_given;

	/* Guarded by mu. Batches [next_take, next_fill) are filled and not yet
	 * handed out; batch next_take - 1 is the caller's while holding. */
	uint64_t gen;      /* bumped by every start and stop */
	int active;        /* an epoch is being served */
	int busy;          /* the worker is filling a slot, outside mu */
	int holding;
	int quit;
	int64_t nbatches;
	int64_t next_fill;
	int64_t next_take;
	loom_status status; /* a loader failure, reported by next */
	loom_error err; /* the last failure (base/errf.h) */
};

/* The worker may fill next_fill when its slot holds neither the caller's
 * batch nor one still waiting to be taken: two slots, two batches in use. */
static int prefetch_can_fill(const loom_prefetch *p)
{
	int64_t lowest = p->holding ? p->next_take - 1 : p->next_take;

	return p->active && p->status == LOOM_OK && p->next_fill < p->nbatches &&
	       p->next_fill - lowest < 2 && (!p->given || p->next_fill < p->n_given);
}

static void *prefetch_worker(void *arg)
{
	loom_prefetch *p = arg;

	pthread_mutex_lock(&p->mu);
	while (!p->quit) {
		int64_t b;
		uint64_t gen;
		int slot, count;
		float *images;
		int32_t *labels;
		loom_status st;

		if (!prefetch_can_fill(p)) {
			pthread_cond_wait(&p->cv, &p->mu);
			continue;
		}
		b = p->next_fill;
		slot = (int)(b % 2);
		gen = p->gen;
		images = p->images[slot];
		labels = p->labels[slot];
		p->busy = 1;
		pthread_mutex_unlock(&p->mu);

		st = loom_loader_get(p->l, b, images, labels, &count);

		pthread_mutex_lock(&p->mu);
		p->busy = 0;
		if (gen == p->gen) {
			if (st == LOOM_OK) {
				p->count[slot] = count;
				p->next_fill++;
			} else {
				p->status = st;
				loom_error_set(&p->err, st,
					 "prefetch: batch %lld: %s",
					 (long long)b, loom_loader_error(p->l));
			}
		}
		pthread_cond_broadcast(&p->cv);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

static loom_status prefetch_make(loom_loader *l, int given, loom_prefetch **out, char *err,
				 size_t errlen)
{
	loom_prefetch *p;
	size_t floats;
	int i;

	loom_data_clear(err, errlen);
	if (!out || !l) {
		loom_data_fail(err, errlen, "loom_prefetch_new: %s is NULL",
			       !out ? "out" : "loader");
		return LOOM_ERR_INVALID;
	}
	*out = NULL;
	p = calloc(1, sizeof(*p));
	if (!p)
		goto out_nomem;
	p->l = l;
	p->given = given;
	floats = (size_t)loom_loader_batch_size(l) * loom_loader_image_elems(l);
	for (i = 0; i < 2 && !given; i++) {
		p->images[i] = malloc(floats * sizeof(float));
		p->labels[i] = malloc((size_t)loom_loader_batch_size(l) *
				      sizeof(int32_t));
		if (!p->images[i] || !p->labels[i])
			goto out_free_buffers;
	}
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	if (pthread_create(&p->thread, NULL, prefetch_worker, p) != 0) {
		loom_data_fail(err, errlen, "prefetch: cannot start the worker thread");
		pthread_cond_destroy(&p->cv);
		pthread_mutex_destroy(&p->mu);
		for (i = 0; i < 2 && !given; i++) {
			free(p->images[i]);
			free(p->labels[i]);
		}
		free(p);
		return LOOM_ERR_NOMEM;
	}
	*out = p;
	return LOOM_OK;

out_free_buffers:
	for (i = 0; i < 2; i++) {
		free(p->images[i]);
		free(p->labels[i]);
	}
	free(p);
out_nomem:
	loom_data_fail(err, errlen, "prefetch: out of memory for two batches");
	return LOOM_ERR_NOMEM;
}

loom_status loom_prefetch_new(loom_loader *l, loom_prefetch **out, char *err, size_t errlen)
{
	return prefetch_make(l, 0, out, err, errlen);
}

loom_status loom_prefetch_new_given(loom_loader *l, loom_prefetch **out, char *err,
				    size_t errlen)
{
	return prefetch_make(l, 1, out, err, errlen);
}

/* Ends the epoch and waits until the worker is not writing into a slot.
 * Called with mu held. */
static void prefetch_quiesce(loom_prefetch *p)
{
	p->gen++;
	p->active = 0;
	p->holding = 0;
	while (p->busy)
		pthread_cond_wait(&p->cv, &p->mu);
}

void loom_prefetch_free(loom_prefetch *p)
{
	int i;

	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->quit = 1;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	pthread_join(p->thread, NULL);
	pthread_cond_destroy(&p->cv);
	pthread_mutex_destroy(&p->mu);
	for (i = 0; i < 2 && !p->given; i++) {
		free(p->images[i]);
		free(p->labels[i]);
	}
	free(p);
}

loom_status loom_prefetch_stop(loom_prefetch *p)
{
	if (!p)
		return LOOM_ERR_INVALID;
	pthread_mutex_lock(&p->mu);
	prefetch_quiesce(p);
	pthread_mutex_unlock(&p->mu);
	return LOOM_OK;
}

loom_status loom_prefetch_start(loom_prefetch *p)
{
	if (!p)
		return LOOM_ERR_INVALID;
	pthread_mutex_lock(&p->mu);
	prefetch_quiesce(p);
	p->nbatches = loom_loader_num_batches(p->l);
	p->next_fill = 0;
	p->next_take = 0;
	p->n_given = 0;
	p->status = LOOM_OK;
	loom_error_clear(&p->err);
	p->active = 1;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	return LOOM_OK;
}

loom_status loom_prefetch_next(loom_prefetch *p, const float **images,
			       const int32_t **labels, int *count)
{
	loom_status st = LOOM_OK;
	int slot;

	if (!p)
		return LOOM_ERR_INVALID;
	pthread_mutex_lock(&p->mu);
	if (!images || !labels || !count) {
		loom_error_set(&p->err, LOOM_ERR_INVALID,
			 "prefetch: %s pointer is NULL",
			 !images ? "images" : !labels ? "labels" : "count");
		st = LOOM_ERR_INVALID;
		goto out_unlock;
	}
	*images = NULL;
	*labels = NULL;
	*count = 0;
	if (!p->active) {
		loom_error_set(&p->err, LOOM_ERR_STATE,
			 "prefetch: no epoch in progress; call loom_prefetch_start first");
		st = LOOM_ERR_STATE;
		goto out_unlock;
	}
	/* Giving back the last batch frees its slot for the worker. */
	p->holding = 0;
	pthread_cond_broadcast(&p->cv);
	if (p->next_take >= p->nbatches)
		goto out_unlock;
	if (p->given && p->n_given <= p->next_take) {
		loom_error_set(&p->err, LOOM_ERR_STATE,
			       "prefetch: no buffer given for batch %lld; call loom_prefetch_give first",
			       (long long)p->next_take);
		st = LOOM_ERR_STATE;
		goto out_unlock;
	}
	while (p->next_fill <= p->next_take && p->status == LOOM_OK)
		pthread_cond_wait(&p->cv, &p->mu);
	if (p->next_fill <= p->next_take) {
		st = p->status;
		goto out_unlock;
	}
	slot = (int)(p->next_take % 2);
	*images = p->images[slot];
	*labels = p->labels[slot];
	*count = p->count[slot];
	p->next_take++;
	p->holding = 1;
out_unlock:
	pthread_mutex_unlock(&p->mu);
	return st;
}

loom_status loom_prefetch_give(loom_prefetch *p, float *images, int32_t *labels)
{
	loom_status st = LOOM_OK;

	if (!p)
		return LOOM_ERR_INVALID;
	pthread_mutex_lock(&p->mu);
	if (!p->given) {
		st = loom_error_set(&p->err, LOOM_ERR_STATE,
				    "prefetch: it fills buffers of its own (made by loom_prefetch_new, "
				    "not loom_prefetch_new_given)");
	} else if (!images || !labels) {
		st = loom_error_set(&p->err, LOOM_ERR_INVALID, "prefetch: given %s buffer is NULL",
				    !images ? "images" : "labels");
	} else if (!p->active) {
		st = loom_error_set(&p->err, LOOM_ERR_STATE,
				    "prefetch: no epoch in progress; call loom_prefetch_start first");
	} else if (p->n_given >= p->nbatches) {
		st = loom_error_set(&p->err, LOOM_ERR_STATE,
				    "prefetch: every batch of the epoch (%lld) has its buffer",
				    (long long)p->nbatches);
	} else if (p->n_given - (p->holding ? p->next_take - 1 : p->next_take) >= 2) {
		/* Its slot is the batch the caller holds, or one not yet taken. */
		st = loom_error_set(&p->err, LOOM_ERR_STATE,
				    "prefetch: two given buffers are in use (batches %lld and %lld); "
				    "take one with loom_prefetch_next first",
				    (long long)p->n_given - 2, (long long)p->n_given - 1);
	} else {
		int slot = (int)(p->n_given % 2);
		p->images[slot] = images;
		p->labels[slot] = labels;
		p->n_given++;
		pthread_cond_broadcast(&p->cv);
	}
	pthread_mutex_unlock(&p->mu);
	return st;
}

const char *loom_prefetch_error(const loom_prefetch *p)
{
	return p ? p->err.msg : "prefetch is NULL";
}
