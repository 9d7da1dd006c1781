/*
 * graph/ops/comm.c — the data-parallel op: the all-reduce of one gradient
 * bucket, which only graph/bucket_pass.c inserts. Its value is the whole
 * bucket (every gradient in it is a view at its offset); its sources are
 * the bucket's last-made gradients, so the schedule runs it right after them.
 * And ZeRO-3's all-gather of one bucket of parameters (parallel/zero3.c
 * inserts it): its value is the whole bucket of parameters, gathered from
 * every rank's shard; each parameter's readers read a view into it. It has
 * no sources and no kernel: a collective step makes it.
 */
#include "graph/ops/ops.h"

LOOM_BACKWARD_OP(allreduce, "allreduce", LOOM_ATTRS_AR, "grad", "grad", "grad", "grad", "grad");

const loom_op_def loom_op_allgather = {
	.name = "allgather",
	.kind = LOOM_OPK_BACKWARD, /* made after autodiff, never differentiated */
	.amp = { .cls = LOOM_AMP_FOLLOW },
};
