/*
 * parallel/parallel.h — parallel strategies as compile passes over the plan, what
 * engine/program.c calls while it compiles: data parallelism (buckets,
 * synchronised batch norm, the start-up fingerprint and broadcast;
 * parallel/ddp.c) and ZeRO-1/2/3 (sharded optimizer state and masters,
 * gradients, parameters; parallel/zero.c, zero2.c, zero3.c). Each pass
 * turns its strategy into steps of the plan (engine/plan.h); none touches
 * a backend.
 */
#ifndef LOOM_PARALLEL_PARALLEL_H
#define LOOM_PARALLEL_PARALLEL_H

#include "engine/pass.h"

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

/* parallel/ddp_staged.c: a device backend's buckets summed through host
 * buffers by the group's host communicator (ranks that share a GPU, or
 * LOOM_DDP_STAGE_HOST=1). _new makes p->plan.comm the staged communicator
 * over host, or refuses (err) what it does not stage yet (ZeRO, pipeline
 * replicas); _buffers allocates its host buffers once the bucket
 * layout is known; _free (any time) frees it. */
loom_status loom_ddp_staged_new(loom_program *p, struct loom_comm *host, char *err, size_t errlen);
loom_status loom_ddp_staged_buffers(loom_program *p, char *err, size_t errlen);
int loom_ddp_staged(const loom_plan *pl);
void loom_ddp_staged_free(loom_program *p);
/* The start-up fingerprint's hash of node v (op, dtype, shape, sources,
 * flags): parallel/pipeline_transport.c's start-up check uses it too. */
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
 * ZeRO-1 (parallel/zero.c), after loom_steps_build: every bucket's all-reduce
 * becomes a reduce-scatter, the optimizer's pieces become this rank's
 * shard of every bucket with shard-local optimizer state (state_bytes
 * shrinks to the shard's) and, under O2, shard-local fp32 masters
 * (master_shard_bytes, after the state), and the step ends with an all-gather of the
 * updated parameters per bucket and their copy back. A no-op without
 * buckets or without an optimizer. shard_caps: the backend's
 * (loom_pass_shard_caps: it must update pieces of a slot, and take their
 * gradient norm for clipping); backend: its name, for messages.
 */
loom_status loom_zero_plan(loom_plan *pl, unsigned shard_caps, const char *backend, char *err,
			   size_t errlen);

/*
 * ZeRO-2 (parallel/zero2.c): before the memory plan, each bucket's place in
 * the bucket region (bk->b[k].base, bk->bytes) for this rank: a bucket
 * whole from its first gradient to its reduce-scatter's end, this rank's
 * shard of it to the step's end, so later buckets reuse the rest. After
 * loom_steps_build and the pieces (loom_zero_plan calls it): stage 1's
 * reduce-scatters each after a wait for the one before, and the gathers
 * one bucket at a time (all-gather, wait, copy), the last made first.
 */
loom_status loom_zero2_layout(loom_buckets *bk, const loom_graph *g, int world, int rank);
loom_status loom_zero2_steps(loom_plan *pl);
/* ZeRO-2: the bytes of this rank's gradient shards (kept to the step's end). */
size_t loom_zero2_shard_bytes(const loom_plan *pl);

/*
 * ZeRO-3 (parallel/zero3.c), after the buckets, before the memory plan:
 * the bucket parameters marked LOOM_NODE_SHARDED, an ALLGATHER node per
 * bucket and phase (forward readers, backward readers) with a view per
 * parameter that its readers now read, the buckets' schedule with each
 * gather placed zero_prefetch gathers ahead of its first reader
 * (pl->n_fwd_sched the forward's length), pl->gathers, and under O2 the
 * half shards' store after the buckets (param_shard_bytes).
 */
loom_status loom_zero3_gathers(loom_plan *pl, char *err, size_t errlen);
/* After loom_zero2_steps: each gather node's step becomes its collective
 * (index buckets.n + gather) and a wait for it alone goes before its first
 * reader. LOOM_ERR_INVALID if a gather has no reader. */
loom_status loom_zero3_steps(loom_plan *pl);
/* The most bytes of gathered parameter buckets alive at once (planned, in
 * the activations). */
size_t loom_zero3_gathered_peak(const loom_plan *pl);
/* O2: where bucket k's half shard lies in the bucket region. */
size_t loom_zero3_half_at(const loom_plan *pl, int k);
/* After the pieces (make_pieces): each f32 bucket's gather source, its
 * master shard at master_at[k] in the state region (the shards end at
 * end); param_shard_bytes and master_bytes as this rank holds them (an
 * f32 bucket's master shards are its parameters). */
void loom_zero3_sources(loom_plan *pl, const size_t *master_at, size_t end);

/* Before the memory plan (loom_ddp_plan): under ZeRO-1 or 2 with an optimizer,
 * the slots' O2 masters are marked LOOM_NODE_SHARDED (no persistent
 * storage); loom_zero_plan gives every piece its shard of them. */
void loom_zero_mark_masters(loom_plan *pl);
/* The parameter slot whose gradient is v, -1 if none (zero.c, zero3.c). */
int loom_zero_slot_of_grad(const loom_plan *pl, loom_value v);
/* Collective, in loom_ddp_start: rank 0's initial masters, each rank
 * keeping its pieces. */
loom_status loom_zero_start(loom_program *p);

/* ZeRO: slot s's state buffer k (-1: its f32 master shards, ZeRO-3 O0/O1
 * the parameter's; -2: ZeRO-3's half parameter shards), whole (every
 * rank's shards), into dst (numel elements of the buffer's dtype).
 * Collective. */
loom_status loom_zero_gather(loom_program *p, int s, int k, void *dst);
/* ZeRO: this rank's pieces of slot s's state buffer k (k < 0: its O2
 * master) from the whole src. */
loom_status loom_zero_scatter(loom_program *p, int s, int k, const void *src);
/* ZeRO with sharded masters: the slot whose parameter or master is v, if
 * that slot's master is sharded; else -1 (v's master, if any, is whole). */
int loom_zero_master_slot(const loom_program *p, loom_value v);
/* A sharded value v (ZeRO's O2 master, ZeRO-3's parameter): its slot, and
 * in *k the buffer of loom_zero_gather that holds it (-1: the f32 master
 * shards; -2: ZeRO-3's half parameter shards); -1 if v is not sharded. */
int loom_zero_shard_of(const loom_program *p, loom_value v, int *k);
/* A sharded value v, whole in its dtype, gathered from every rank's
 * shards into dst (collective). */
loom_status loom_zero_value_read(loom_program *p, loom_value v, void *dst);

#endif /* LOOM_PARALLEL_PARALLEL_H */
