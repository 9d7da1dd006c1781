/*
 * engine/init.c — parameter and buffer initialisers with PyTorch's defaults
 * (ones/zeros, Kaiming-uniform conv/linear weights, fan-in uniform biases).
 * Each tensor draws from its own stream keyed by the graph seed and its
 * name, so adding a layer does not change the others' initial values.
 */
#include <math.h>
#include <string.h>

#include "base/splitmix.h"
#include "base/elem.h"
#include "engine/program_internal.h"


static uint64_t name_hash(const char *s, size_t len)
{
	uint64_t h = 1469598103934665603ull;
	for (const char *e = s + len; s < e; s++) {
		h ^= (unsigned char)*s;
		h *= 1099511628211ull;
	}
	return h;
}

void loom_init_value(const loom_graph *g, loom_value v, void *dst)
{
	const loom_node *n = &g->nodes[v];
	int64_t cnt = loom_shape_numel(&n->shape);
	/* A padded vocabulary's table: the user's rows draw as unpadded, the
	 * padding rows (the storage's tail) are zero. */
	loom_shape us = loom_node_user_shape(n);
	int64_t drawn = loom_shape_numel(&us);
	/* An O2 master ("w.master") draws the stream of its parameter "w", so
	 * every opt level starts from the same weights. */
	size_t len = strlen(n->name);
	if ((n->flags & LOOM_NODE_AMP) && len > 7 && strcmp(n->name + len - 7, ".master") == 0)
		len -= 7;
	uint64_t state = g->seed ^ name_hash(n->name, len);
	double bound = n->a.leaf.fan_in > 0 ? 1.0 / sqrt((double)n->a.leaf.fan_in) : 0;
	for (int64_t i = 0; i < cnt; i++) {
		double x;
		switch (i < drawn ? n->a.leaf.init : LOOM_INIT_ZEROS) {
		case LOOM_INIT_ONES:
			x = 1;
			break;
		case LOOM_INIT_KAIMING_UNIFORM:
		case LOOM_INIT_UNIFORM_FAN_IN:
			/* 53 random bits -> [0, 1) -> [-bound, bound) */
			x = ((loom_splitmix64(&state) >> 11) * 0x1.0p-53 * 2 - 1) * bound;
			break;
		default:
			x = 0;
			break;
		}
		loom_elem_set(n->dtype, dst, i, x);
	}
}
