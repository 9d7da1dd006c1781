/*
 * base/dtype.c — the element types' names and sizes (include/loom.h), for
 * every folder that moves tensors: the graph, the engine, comm/.
 */
#include "loom.h"

static const struct {
	const char *name;
	size_t size;
} dtype_info[LOOM_DTYPE_COUNT] = {
	[LOOM_F32] = { "f32", 4 }, [LOOM_F64] = { "f64", 8 },
	[LOOM_F16] = { "f16", 2 }, [LOOM_BF16] = { "bf16", 2 },
	[LOOM_I32] = { "i32", 4 },
	[LOOM_FP8_E4M3] = { "fp8_e4m3", 1 }, [LOOM_FP8_E5M2] = { "fp8_e5m2", 1 },
};

const char *loom_dtype_name(loom_dtype dt)
{
	if ((unsigned)dt >= LOOM_DTYPE_COUNT)
		return "?";
	return dtype_info[dt].name;
}

size_t loom_dtype_size(loom_dtype dt)
{
	if ((unsigned)dt >= LOOM_DTYPE_COUNT)
		return 0;
	return dtype_info[dt].size;
}
