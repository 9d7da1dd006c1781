/*
 * graph/buckets.c — looking up and freeing a bucket layout (graph/buckets.h).
 */
#include <stdlib.h>
#include <string.h>

#include "graph/buckets.h"

void loom_buckets_free(loom_buckets *b)
{
	free(b->b);
	free(b->grad);
	free(b->offset);
	free(b->order);
	memset(b, 0, sizeof(*b));
}

int loom_bucket_find(const loom_buckets *b, loom_value v, size_t *offset)
{
	for (int k = 0; k < b->n; k++)
		for (int i = b->b[k].first; i < b->b[k].first + b->b[k].n; i++)
			if (b->grad[i] == v) {
				if (offset)
					*offset = b->offset[i];
				return k;
			}
	return -1;
}
