/*
 * parallel/pass_list.c — the compile pipeline: the passes loom_compile walks,
 * in order (engine/pass.h). A new pass is one line here, at the point of
 * the pipeline where what it reads exists. It lives above both rooms: it
 * names the engine's passes (engine/pass.h) and the strategies'
 * (parallel/passes.h), so that engine/ names no strategy and no include
 * points up; the engine reaches it only through loom_compile_passes.
 */
#include "engine/pass.h"
#include "parallel/passes.h"

const loom_pass *const loom_compile_passes[] = {
	&loom_pass_amp,            /* casts, masters, the loss scale */
	&loom_pass_autodiff,       /* the backward graph */
	&loom_pass_device,         /* the backend, and what its optimizer lacks */
	&loom_pass_recompute,      /* forward values made again in the backward */
	&loom_pass_fuse,           /* the fusions the backend has kernels for */
	&loom_pass_formats,        /* each activation's memory format, reorders */
	&loom_pass_vocab_pad,      /* a classifier over a padded vocabulary */
	&loom_pass_fp8_storage,    /* fp8 roundings only products read, kept in fp8 */
	&loom_pass_slots,          /* parameter slots and optimizer state */
	&loom_pass_pipeline_cut,   /* stages: every node's, this rank's values */
	&loom_pass_data_parallel,  /* buckets and the memory plan with them */
	&loom_pass_zero3_gathers,  /* ZeRO-3: parameter gathers, the memory plan again */
	&loom_pass_memory_plan,    /* else the plain memory plan */
	&loom_pass_accumulation,   /* accumulation segments */
	&loom_pass_steps,          /* the step list */
	&loom_pass_zero,           /* ZeRO: sharded optimizer steps, ZeRO-3's gather steps */
	&loom_pass_pipeline,       /* stages: the micro-batch schedule */
	&loom_pass_backend_plan,   /* the backend's plans and workspace */
	&loom_pass_pipeline_limit, /* stages: every stage's peak */
	&loom_pass_backend_alloc,  /* the memory limit, the arena */
	&loom_pass_initial_values, /* parameters, buffers, optimizer state */
};

const int loom_n_compile_passes = sizeof(loom_compile_passes) / sizeof(loom_compile_passes[0]);
