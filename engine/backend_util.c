/*
 * engine/backend_util.c — small helpers every backend shares (declared in
 * engine/plan.h): the messages both backends word the same way.
 */
#include <stdio.h>

#include "base/errf.h"
#include "engine/plan.h"

loom_status loom_bad_label(char *err, const loom_plan *pl, loom_value v, int32_t label, int row)
{
	const loom_node *n = &pl->g->nodes[v];
	char lb[96];
	return loom_errnf(err, LOOM_ERR_MAX, LOOM_ERR_INVALID,
			  "%s: label %d of row %d is outside [0, %lld)",
			  loom_node_label(pl->g, v, lb, sizeof(lb)), (int)label, row,
			  (long long)pl->g->nodes[n->src[0]].shape.dims[1]);
}

loom_status loom_bad_id(char *err, const loom_plan *pl, loom_value v, int32_t id, int64_t pos)
{
	const loom_node *n = &pl->g->nodes[v];
	char lb[96];
	/* a padded vocabulary's table: the real rows are the valid ids */
	return loom_errnf(err, LOOM_ERR_MAX, LOOM_ERR_INVALID,
			  "%s: id %d at position %lld is outside the table's [0, %lld)",
			  loom_node_label(pl->g, v, lb, sizeof(lb)), (int)id, (long long)pos,
			  (long long)loom_node_user_shape(&pl->g->nodes[n->src[1]]).dims[0]);
}
