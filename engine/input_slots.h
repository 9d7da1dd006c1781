/*
 * engine/input_slots.h — which of an input's two staging slots the host
 * writes next, for a backend that stages inputs (the CUDA backend under
 * LOOM_CUDA_UPLOAD=graph) and for the fake one that tests it
 * (tests/engine/test_async.c): one rule, so the test proves the backend's.
 * slot: the slot filled last (-1 before any); pending: its batch is not
 * queued yet (no run took it). The caller still waits for the last queued
 * copy that read the slot it is given.
 */
#ifndef LOOM_ENGINE_INPUT_SLOTS_H
#define LOOM_ENGINE_INPUT_SLOTS_H

/* loom_set_input's copy: a batch no run took yet is replaced in place,
 * else the other slot. */
static inline int loom_input_slot_fill(int slot, int pending)
{
	return pending ? slot : slot < 0 ? 0 : slot ^ 1;
}

/* loom_input_buffer's hand-out: never the slot filled last, whose batch a
 * queued copy, or a run still to come, reads. */
static inline int loom_input_slot_take(int slot)
{
	return slot < 0 ? 0 : slot ^ 1;
}

#endif
