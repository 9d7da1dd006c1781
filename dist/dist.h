/*
 * dist/dist.h — parallel strategies as compile passes over the plan, what
 * engine/program.c calls while it compiles: data parallelism (buckets,
 * synchronised batch norm, the start-up fingerprint and broadcast;
 * dist/ddp.c) and ZeRO-1 (sharded optimizer state; dist/zero.c). Each pass
 * turns its strategy into steps of the plan (engine/plan.h); none touches
 * a backend.
 */
#ifndef LOOM_DIST_DIST_H
#define LOOM_DIST_DIST_H

#include "engine/program_internal.h"

/* The group's world size (1 without a group). */
int loom_ddp_world(const loom_compile_opts *o);
/* The bucket pass (sharded into world equal parts when opts.zero_stage)
 * and the memory plan with buckets (in place of loom_memplan_build), after
 * the parameter slots exist. */
loom_status loom_ddp_plan(loom_program *p, char *err, size_t errlen);
/* sync_bn's marks: attrs.bn.sync on every batch norm, forward and backward. */
void loom_ddp_mark_sync_bn(loom_graph *g);
/* Test hook: while set, sync_bn marks the batch norms at world 1 too, where
 * no all-reduce runs (the sums are everyone's already), so that a backend's
 * split kernels can be checked against another's in one process. */
extern int loom_ddp_test_sync_one_rank;
/* Collective, once the arena holds the initial values: every rank's plan
 * compared with rank 0's, then rank 0's parameters and buffers broadcast
 * (queued on a device: the caller synchronises). */
loom_status loom_ddp_start(loom_program *p);
/* The start-up fingerprint's hash of node v (op, dtype, shape, sources,
 * flags): dist/pipeline.c's per-stage check uses it too. */
uint64_t loom_ddp_node_hash(const loom_plan *pl, loom_value v);
/* Collective, on host: every rank's head (the settings that must agree)
 * and items (one hash per node, described by describe(plan, i, ...))
 * compared with rank 0's; a difference fails p with what + the message
 * naming the first. Frees items. */
loom_status loom_ddp_check_items(loom_program *p, struct loom_comm *host, const int64_t *head,
				 size_t head_len, uint64_t *items, size_t n,
				 void (*describe)(void *, size_t, char *, size_t), const char *what);
/* Collective: rank 0's buffers (batch-norm running statistics, which each
 * rank updates from its own batches) to every rank. */
loom_status loom_ddp_broadcast_buffers(loom_program *p);

/*
 * ZeRO-1 (dist/zero.c), after loom_steps_build: every bucket's all-reduce
 * becomes a reduce-scatter, the optimizer's pieces become this rank's
 * shard of every bucket with shard-local optimizer state (state_bytes
 * shrinks to the shard's), and the step ends with an all-gather of the
 * updated parameters per bucket and their copy back. A no-op without
 * buckets or without an optimizer. caps: the backend's (it must update
 * pieces of a slot).
 */
loom_status loom_zero_plan(loom_plan *pl, const loom_backend *be, char *err, size_t errlen);

/* ZeRO: the state of slot s, buffer k, whole (every rank's shards), into
 * dst (numel elements of the slot's state dtype). Collective. */
loom_status loom_zero_gather_state(loom_program *p, int s, int k, void *dst);
/* ZeRO: the O2 master of slot s, whole (each rank updates only its
 * shard's elements of it). Collective. */
loom_status loom_zero_gather_master(loom_program *p, int s, void *dst);
/* ZeRO: this rank's pieces of slot s's state buffer k from the whole src. */
loom_status loom_zero_scatter_state(loom_program *p, int s, int k, const void *src);

#endif /* LOOM_DIST_DIST_H */
