/*
 * base/cuda_plugin.h — the CUDA backend and the NCCL collective live in a
 * shared object (libloom_cuda.so, built from engine/cuda/ and comm/nccl.cu)
 * that loom maps with dlopen only when a device is asked for and present,
 * as ggml's dynamically loaded backends and PyTorch's lazy CUDA start do:
 * its libraries (cuBLASLt's static initialisers above all) cost every
 * process start otherwise. Devices are counted first through the driver
 * (libcuda.so.1, also by dlopen), which is cheap and needs no toolkit.
 *
 * It lives in base/ because comm/ (NCCL) and engine/ (the backend) both load
 * it and comm/ sits below engine/. The plugin's types are opaque here.
 */
#ifndef LOOM_BASE_CUDA_PLUGIN_H
#define LOOM_BASE_CUDA_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever the struct below changes; a plugin of another version
 * is refused with both numbers. */
#define LOOM_CUDA_PLUGIN_ABI 11 /* 4: test hooks take the backend context, grad_sumsq; 5: loss_async; 6: attn_fusable, test_sdpa_descriptors; 7: test_gpt_fusions; 8: grad_sumsq_device, mark_words/mark_record/mark_serial; 9: loom_backend a core plus optional groups; 10: the planning group's ln_residual_fusable, ln_bwd_accum_fusable, vocab_pad; 11: ln_bwd_accum_fusable also asked of an embedding's backward */
/* The file the loader looks for (see loom_cuda_plugin_load). */
#define LOOM_CUDA_PLUGIN_FILE "libloom_cuda.so"
/* The one symbol the shared object exports. */
#define LOOM_CUDA_PLUGIN_ENTRY "loom_cuda_plugin_entry"

struct loom_backend;
struct loom_pg;
struct loom_comm;
struct loom_program;

typedef struct loom_cuda_plugin {
	int abi;          /* LOOM_CUDA_PLUGIN_ABI of the build that made it */
	int cuda_version; /* CUDART_VERSION it was compiled with, e.g. 13000 */
	/* Devices the runtime sees; 0 with the runtime's error in err. */
	int (*device_count)(char *err, size_t errlen);
	/* The backend table (engine/backend.h). */
	const struct loom_backend *(*backend)(void);
	/* comm/nccl.cu: a fresh ncclUniqueId (id holds 128 bytes) and the
	 * device communicator of a formed process group. */
	loom_status (*nccl_unique_id)(uint8_t *id, char *err, size_t errlen);
	loom_status (*nccl_backend_new)(struct loom_pg *pg, struct loom_comm **out);
	/* The device of local rank local_rank (LOCAL_RANK, or LOCAL_RANK %
	 * visible) made current and put in the group's info; before MPI_Init. */
	loom_status (*nccl_use_device)(struct loom_pg *pg, int local_rank);
	/* Test hooks (engine/cuda/cuda_backend.h). */
	void (*test_poison)(int on);
	void (*test_own_kernels)(int on);
	void (*test_library_use)(const void *be_ctx, int *bn_cudnn, int *bgrad_epilogue);
	void (*test_fallbacks)(const void *be_ctx, int *conv_f32, int *mm_unfused);
	int (*test_sdpa_descriptors)(int64_t b, int64_t t, int64_t nh, int64_t hs, int bf16, int bwd,
				     char *why, size_t len);
	/* The plan-level choices of the GPT fusions on a compiled plan (a
	 * const loom_plan *, any backend's: no device needed): softmax-CE
	 * forwards that would write their backward's dlogits, products that
	 * would take a GELU_AUX and a DGELU epilogue. */
	void (*test_gpt_fusions)(const void *plan, int *ce_fused, int *gelu_aux, int *dgelu);
} loom_cuda_plugin;

/*
 * CUDA devices visible to this process, counted through the driver
 * (cuInit, cuDeviceGetCount from libcuda.so.1) without mapping the plugin.
 * 0 when there is no driver, no device or the driver refuses; then why (if
 * not NULL) gets the real reason ("no CUDA driver: libcuda.so.1: cannot open
 * shared object file", "cuInit: CUDA_ERROR_NO_DEVICE (no CUDA-capable device
 * is detected)"). The answer is computed once and cached.
 */
int loom_cuda_probe(char *why, size_t whylen);

/* The driver's CUDA version (e.g. 13000), 0 without a driver. */
int loom_cuda_driver_version(void);

/*
 * "NAME (sm_XY, N.N GiB)" for device dev, through the driver. On failure
 * buf holds the reason: LOOM_ERR_INVALID (bad dev or buffer),
 * LOOM_ERR_BACKEND (the driver refused).
 */
loom_status loom_cuda_probe_device_name(int dev, char *buf, size_t len);

/*
 * The plugin, mapped on first use, NULL with the reason in err. Where it is
 * looked for, first found wins:
 *   1. linked into this binary (the CUDA tests link it directly);
 *   2. $LOOM_CUDA_PLUGIN, a path to the file;
 *   3. next to the executable (the GPU bundle's bin/);
 *   4. the executable's Bazel runfiles (bazel run, bazel-bin/...);
 *   5. the dynamic linker's search path (LD_LIBRARY_PATH).
 * It is never mapped unless called: loom calls it only once a device was
 * asked for and the probe found one (or a test asks).
 */
const loom_cuda_plugin *loom_cuda_plugin_load(char *err, size_t errlen);

/* 1 once the plugin is mapped in this process (tests: a CPU run must never
 * map it). */
int loom_cuda_plugin_loaded(void);

/* 1 when this build made the plugin (the toolkit was found at build time). */
int loom_cuda_plugin_built(void);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_BASE_CUDA_PLUGIN_H */
