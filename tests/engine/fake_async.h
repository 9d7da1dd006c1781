/*
 * tests/engine/fake_async.h — the pieces of a fake asynchronous device and
 * of a fake group of two identical ranks that test_async and test_zero_norm
 * (and, for the plain communicator methods, test_exec) share: the CPU
 * backend's kernels behind two stream handles (LOOM_BE_ASYNC_STREAMS, no
 * host memory), the communicator methods that do the same in every fake,
 * a single process's group made into rank 0 of 2, and the small MLP these
 * suites train. Each test keeps what it checks (its collectives' timing,
 * its counters) in its own file.
 */
#ifndef LOOM_TESTS_ENGINE_FAKE_ASYNC_H
#define LOOM_TESTS_ENGINE_FAKE_ASYNC_H

#include <stddef.h>

#include "comm/comm_internal.h"
#include "engine/program_internal.h"
#include "loom.h"

/* The stream handles: their addresses (fake_streams[LOOM_STREAM_COMPUTE]...). */
extern char fake_streams[2];

/* *b becomes the CPU backend named "fake-async", with LOOM_BE_ASYNC_STREAMS
 * and without LOOM_BE_HOST_MEMORY, fake_streams as its stream handles and
 * events that do nothing; the caller sets the rest. */
void fake_async_backend(loom_backend *b);

/* What two identical ranks' sum makes of this rank's f32, f64 or i32
 * values: each times `world`. */
void fake_twice(void *buf, size_t count, loom_dtype dt, int world);

/* Communicator methods every fake here has alike: a broadcast that leaves
 * the buffer (every rank has it), an all-gather that repeats this rank's
 * bytes (every rank compiled the same plan), a barrier and an abort that do
 * nothing, the free of the communicator, and a wait that only frees its
 * work (after a blocking start). */
loom_status fake_comm_broadcast(loom_comm *c, void *buf, size_t bytes, int root);
loom_status fake_comm_allgather(loom_comm *c, const void *send, size_t bytes, void *recv);
loom_status fake_comm_barrier(loom_comm *c);
void fake_comm_abort(loom_comm *c);
void fake_comm_free(loom_comm *c);
loom_status fake_comm_wait_free(loom_comm *c, loom_comm_work *w);

/* A single process's group (timeout `timeout_s`) made into rank 0 of 2,
 * with `host` and `device` as its communicators (device NULL: none, as
 * where two ranks share a GPU). */
loom_pg *fake_group_of_two(double timeout_s, const loom_comm_i *host, const loom_comm_i *device);

/* The MLP's options: the CPU, SGD at `lr`, group `pg`, ZeRO-`zero`, buckets
 * of 100 bytes (several of them); the caller may change more. */
void fake_mlp_opts(loom_compile_opts *o, loom_pg *pg, int zero, double lr);

/* The MLP's inputs: x [6, 4] of fixed values in [-0.5, 0.5), y [6] the
 * classes 0 1 2 0 1 2. */
void fake_mlp_inputs(loom_program *p);

/* x [6, 4] -> linear 4->8 -> relu -> linear 8->3 -> CE with y (test_exec's),
 * compiled with `o`, its inputs set (fake_mlp_inputs). */
loom_program *fake_mlp_compile(loom_graph **gp, const loom_compile_opts *o);

/*
 * A fake device that stages inputs as the CUDA backend does under
 * LOOM_CUDA_UPLOAD=graph (engine/cuda/backend.cu): two host slots per
 * input, chosen by engine/input_slots.h's rule, loom_set_input's copy into
 * one of them (counted: host_copy_bytes), loom_input_buffer's hand-out of
 * one (input_slot), and the "DMA" from the slot into the arena when a run
 * begins (dma_bytes). The device finishes a step late: its slots stay read
 * until the host waits for it (a download, a synchronise, the next step's
 * loss_async under LOOM_ASYNC_LOSS=1, or a hand-out's wait for that slot,
 * counted: slot_waits). When a step finishes, each slot it read must still
 * hold what it held when the step was queued: a host write into a slot a
 * queued step still read counts in overwrites.
 */
typedef struct fake_slots_counters {
	uint64_t host_copy_bytes, dma_bytes;
	int slot_waits, overwrites, handouts, steps_queued, steps_done;
} fake_slots_counters;

extern fake_slots_counters fake_slots;

/* Makes b stage inputs (alloc, upload, download, synchronize, run_begin,
 * loss_async and input_slot/commit/release wrapped around the methods b
 * has; call it last). Zeroes fake_slots. */
void fake_slots_backend(loom_backend *b);

#endif
