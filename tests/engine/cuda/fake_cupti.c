/*
 * tests/engine/cuda/fake_cupti.c — a stand-in libcupti for test_kprof_cupti:
 * the five activity calls libloom_kprof.so makes, and a flush that hands it
 * one buffer of made-up kernel records (a mangled C++ name, a plain one, a
 * name with a comma and a quote, and a record of another kind to skip), so
 * that the injection library's tally and CSV are checked without a GPU.
 */
#include <cupti.h>
#include <stdlib.h>
#include <string.h>

static CUpti_BuffersCallbackRequestFunc requested;
static CUpti_BuffersCallbackCompleteFunc completed;
static int enabled;

CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc req,
					   CUpti_BuffersCallbackCompleteFunc done)
{
	requested = req;
	completed = done;
	return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityEnable(CUpti_ActivityKind kind)
{
	enabled = kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
	return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid, CUpti_Activity **rec)
{
	uint8_t *at = *rec ? (uint8_t *)*rec + sizeof(CUpti_ActivityKernel10) : buffer;
	if (at + sizeof(CUpti_ActivityKernel10) > buffer + valid)
		return CUPTI_ERROR_MAX_LIMIT_REACHED;
	*rec = (CUpti_Activity *)at;
	return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext ctx, uint32_t stream, size_t *dropped)
{
	(void)ctx;
	(void)stream;
	*dropped = 0;
	return CUPTI_SUCCESS;
}

/* Ten steps' worth: the update 2 ms once a step, the product 1 ms twice. */
CUptiResult cuptiActivityFlushAll(uint32_t flag)
{
	static const struct {
		const char *name;
		uint64_t ns;
		int times;
		CUpti_ActivityKind kind;
	} recs[] = {
		{ "_Z22loom_opt_update_kernelPfPKfi", 2000000, 10, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL },
		{ "nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NNT", 1000000, 20,
		  CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL },
		{ "odd,\"name\"_kernel", 500000, 10, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL },
		{ "a memcpy, not a kernel", 9000000, 1, CUPTI_ACTIVITY_KIND_MEMCPY },
	};
	uint8_t *buf = NULL;
	size_t size = 0, max = 0, used = 0;
	(void)flag;
	if (!enabled || !requested || !completed)
		return CUPTI_SUCCESS;
	requested(&buf, &size, &max);
	for (size_t i = 0; i < sizeof(recs) / sizeof(recs[0]); i++)
		for (int t = 0; t < recs[i].times && used + sizeof(CUpti_ActivityKernel10) <= size;
		     t++) {
			CUpti_ActivityKernel10 *k = (CUpti_ActivityKernel10 *)(buf + used);
			memset(k, 0, sizeof(*k));
			k->kind = recs[i].kind;
			k->start = 1000000000ull * (used + 1);
			k->end = k->start + recs[i].ns;
			k->name = recs[i].name;
			used += sizeof(*k);
		}
	completed(NULL, 0, buf, size, used);
	enabled = 0; /* one buffer, however often it is flushed */
	return CUPTI_SUCCESS;
}
