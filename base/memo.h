/*
 * base/memo.h — a process's memo of measured choices, the one copy that the
 * CPU kernel search (engine/cpu/ksearch.c) and cuDNN's convolution search
 * (engine/cuda/conv_cudnn.cu) keep: fixed-size entries whose first bytes
 * are the key, under one lock. A full memo keeps what it has (the caller
 * measures again). C and CUDA C++ alike.
 */
#ifndef LOOM_BASE_MEMO_H
#define LOOM_BASE_MEMO_H

#include <pthread.h>
#include <stddef.h>
#include <string.h>

typedef struct loom_memo {
	pthread_mutex_t lock; /* the entries; callers may take it for their own rare state */
	int n, max;
	size_t entry_bytes, key_bytes;
	void *e; /* max entries of entry_bytes, the key their first key_bytes */
} loom_memo;

/* A static memo over the array `entries`, keyed by each one's first
 * key_bytes bytes (a key that is a string must be zero-filled past its end). */
#define LOOM_MEMO_INIT(entries, key_bytes)                                                 \
	{ PTHREAD_MUTEX_INITIALIZER, 0, (int)(sizeof(entries) / sizeof((entries)[0])),        \
	  sizeof((entries)[0]), (key_bytes), (entries) }

/* Whether an entry with key's bytes is there; if so, a copy into *out. */
static inline int loom_memo_get(loom_memo *m, const void *key, void *out)
{
	int hit = 0;
	pthread_mutex_lock(&m->lock);
	for (int i = 0; i < m->n && !hit; i++) {
		const char *e = (const char *)m->e + (size_t)i * m->entry_bytes;
		if (!memcmp(e, key, m->key_bytes)) {
			memcpy(out, e, m->entry_bytes);
			hit = 1;
		}
	}
	pthread_mutex_unlock(&m->lock);
	return hit;
}

/* Adds a copy of *entry, unless the memo is full. */
static inline void loom_memo_put(loom_memo *m, const void *entry)
{
	pthread_mutex_lock(&m->lock);
	if (m->n < m->max)
		memcpy((char *)m->e + (size_t)m->n++ * m->entry_bytes, entry, m->entry_bytes);
	pthread_mutex_unlock(&m->lock);
}

#endif
