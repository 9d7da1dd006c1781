/*
 * base/free_each.h — freeing an array of n owned buffers and the array
 * itself, the one copy of the loop the file formats' tables (io/) and
 * their lists of host copies repeat.
 */
#ifndef LOOM_BASE_FREE_EACH_H
#define LOOM_BASE_FREE_EACH_H

#include <stdlib.h>

/* free(a[0]) ... free(a[n - 1]), then free(a); a may be NULL (an array
 * never made), any a[i] too. */
#define LOOM_FREE_EACH(a, n)                                           \
	do {                                                           \
		for (int loom_i_ = 0; (a) && loom_i_ < (n); loom_i_++) \
			free((a)[loom_i_]);                            \
		free(a);                                               \
	} while (0)

#endif
