/*
 * parallel/pipeline_internal.h — what the pipeline's three files share:
 * the cut (pipeline_cut.c), the schedule (pipeline_schedule.c) and the
 * transport with the start-up (pipeline_transport.c).
 */
#ifndef LOOM_PARALLEL_PIPELINE_INTERNAL_H
#define LOOM_PARALLEL_PIPELINE_INTERNAL_H

#include <stddef.h>

#include "graph/ops/ops.h"
#include "parallel/pipeline.h"

struct loom_pg;

static inline size_t loom_pipe_align64(size_t x)
{
	return (x + 63) & ~(size_t)63;
}

static inline int loom_pipe_is_leaf(const loom_graph *g, loom_value v)
{
	return loom_op_is_leaf(g->nodes[v].op);
}

/* pipeline_schedule.c: the micro-batches stage `stage` holds at once. */
int loom_pipe_in_flight(int schedule, int stages, int stage, int m);

/* pipeline_cut.c: per stage, its nodes, parameters, estimated time and
 * what its own memory plan gives (the table loom_pipeline_limit prints). */
loom_status loom_pipe_stage_table(loom_plan *pl, loom_pipe *pp);

/* pipeline_transport.c: every rank's note names its stage (and replica);
 * how values cross a cut (pp->xfer, pp->comm); the steps the executor
 * hands over (SEND, RECV, MICRO). */
void loom_pipe_name_stages(loom_pipe *pp, struct loom_pg *pg, int world);
loom_status loom_pipe_pick_transport(loom_program *p, loom_pipe *pp, char *err, size_t errlen);
/* The host communicator, the ranks' notes, the transport, and the
 * sub-communicators of a stage's replicas and of a replica's stages. */
loom_status loom_pipe_connect(loom_program *p, loom_pipe *pp, char *err, size_t errlen);
extern const loom_transport loom_pipe_transport;

#endif /* LOOM_PARALLEL_PIPELINE_INTERNAL_H */
