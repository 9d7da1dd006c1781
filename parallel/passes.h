/*
 * parallel/passes.h — the parallel strategies as compile passes
 * (engine/pass.h), in the order parallel/pass_list.c walks them: the pipeline's
 * cut (before the memory plan), data parallelism (buckets, sync_bn, the
 * memory plan with buckets; start-up: the plan check and rank 0's values),
 * ZeRO-3's parameter gathers (after the buckets: the memory plan again,
 * with the gathered buckets), ZeRO-1/2/3 (after the step list), the pipeline's schedule (start-up: the
 * stages' check and peers) and its per-stage memory limit.
 */
#ifndef LOOM_PARALLEL_PASSES_H
#define LOOM_PARALLEL_PASSES_H

#include "engine/pass.h"

extern const loom_pass loom_pass_pipeline_cut, loom_pass_data_parallel, loom_pass_zero3_gathers,
	loom_pass_zero,
	loom_pass_pipeline, loom_pass_pipeline_limit;

#endif /* LOOM_PARALLEL_PASSES_H */
