/*
 * parallel/shards.h — the loom_shards tables (engine/pass.h)
 * the passes give a program whose ranks each hold some of the gradients.
 */
#ifndef LOOM_PARALLEL_SHARDS_H
#define LOOM_PARALLEL_SHARDS_H

#include "engine/pass.h"

extern const loom_shards loom_zero_shards, loom_stage_shards;

#endif /* LOOM_PARALLEL_SHARDS_H */
