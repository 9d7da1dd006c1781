/*
 * engine/io_view.h — what io/ sees of a program: the const plan and the
 * training state (engine/plan.h), the trace's span buffer (engine/trace.h),
 * and functions for values by handle, a pipeline's stages and the group's
 * host collectives. The program itself stays opaque (loom.h): io/ never
 * includes engine/program_internal.h, which builds on this header, nor
 * parallel/ or comm/ (the engine reaches those through the hooks their
 * passes install). Implemented in engine/program_util.c and engine/io_view.c.
 */
#ifndef LOOM_ENGINE_IO_VIEW_H
#define LOOM_ENGINE_IO_VIEW_H

#include <stddef.h>

#include "engine/plan.h"
#include "engine/trace.h"
#include "loom.h"

/* A program that compiled (a failed compile's handle only explains). */
int loom_io_usable(const loom_program *p);
/* p's plan (const: io reads it) and training state (a checkpoint's load
 * writes the step, rate and scaler). */
const loom_plan *loom_io_plan(const loom_program *p);
loom_train_state *loom_io_state(loom_program *p);
/* The arena's base addresses, and value v's place and size in it. */
const loom_arena *loom_io_arena(const loom_program *p);
void *loom_io_value_ptr(const loom_program *p, loom_value v);
size_t loom_io_value_bytes(const loom_program *p, loom_value v);
/* p's last failure cleared (an entry point starts afresh). */
void loom_io_clear_error(loom_program *p);
/* The backend's one-line description (a trace file's header). */
const char *loom_io_backend(const loom_program *p);

/* Records a message on p and returns st. */
loom_status loom_program_fail(loom_program *p, loom_status st, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* The backend's upload and download, with a failure's message in p. */
loom_status loom_program_upload(loom_program *p, void *dst, const void *src, size_t bytes);
loom_status loom_program_download(loom_program *p, void *dst, const void *src, size_t bytes);

/*
 * Values by handle, whole, wherever this rank keeps them (engine/program_util.c):
 * through p->shards for a sharded value, else the arena's bytes.
 * loom_value_shard: v's slot and buffer (*k) if v is sharded, else -1.
 * loom_shard_gather / _scatter: p->shards' gather and scatter (a program
 * without them fails with LOOM_ERR_STATE). loom_value_read_whole /
 * _write_whole: v in its dtype, a gather (collective) or a download / this
 * rank's pieces or an upload. loom_master_read / _write: parameter v's O2
 * master (v has one), whole, f32.
 */
int loom_value_shard(const loom_program *p, loom_value v, int *k);
loom_status loom_shard_gather(loom_program *p, int s, int k, void *dst);
loom_status loom_shard_scatter(loom_program *p, int s, int k, const void *src);
loom_status loom_value_read_whole(loom_program *p, loom_value v, void *dst);
loom_status loom_value_write_whole(loom_program *p, loom_value v, const void *src);
loom_status loom_master_read(loom_program *p, loom_value v, float *dst);
loom_status loom_master_write(loom_program *p, loom_value v, const float *src);

/* A pipeline's place of this rank, as plain values (the transport's
 * stages member fills it): S stages, R replicas of each, this rank's
 * stage and replica and its rank in the whole group, the nodes of the
 * graph the stages were cut from (later nodes are a stage's own). */
typedef struct loom_stage_info {
	int stages, stage;
	int replicas, replica;
	int group_rank;
	int n_graph;
} loom_stage_info;

/* 1 and *out filled under pipeline stages; else 0 (*out: one stage, one
 * replica, this rank's place in the plan). */
int loom_io_stages(const loom_program *p, loom_stage_info *out);
/* Pipeline stages: the stage that holds and updates leaf v. */
int loom_io_leaf_owner(const loom_program *p, loom_value v);
/* Pipeline stages, collective over the group: `bytes` at addr on
 * replica 0 of `stage` into dst on every rank. */
loom_status loom_io_stage_fetch(loom_program *p, int stage, const void *addr, void *dst,
				size_t bytes);

/* The group's host collectives over every rank of the program (a
 * pipeline's whole group), when loom_io_has_host says the group has them.
 * A failure's message, naming the group's error, is in p after `what`. */
int loom_io_has_host(const loom_program *p);
loom_status loom_io_host_broadcast(loom_program *p, void *buf, size_t bytes, int root,
				   const char *what);
loom_status loom_io_host_allgather(loom_program *p, const void *mine, size_t bytes, void *all,
				   const char *what);

/* amp.fp8's per-tensor scales and amax histories as the floats of one
 * checkpoint record (amp/fp8_scaling.h's layout); 0 floats when the plan
 * casts nothing to fp8. loom_io_fp8_unpack checks in against the plan's
 * scaled tensors and changes nothing on a refusal (LOOM_ERR_FORMAT, a
 * message in err; LOOM_ERR_NOMEM); check_only: it only checks. */
size_t loom_io_fp8_floats(const loom_program *p);
loom_status loom_io_fp8_pack(loom_program *p, float *out);
loom_status loom_io_fp8_unpack(loom_program *p, const float *in, int check_only, char *err,
			       size_t errlen);

#endif /* LOOM_ENGINE_IO_VIEW_H */
