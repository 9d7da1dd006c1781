/*
 * graph/ops/reorder.c — the reorder node: the same [N, C, H, W] values
 * in another memory format (node->format; its source's format is the
 * source node's). Only the format pass inserts it (graph/formats.c), after
 * autodiff, where a producer and a consumer disagree.
 */
#include "graph/ops/ops.h"

const char *loom_format_name(loom_format f)
{
	static const char *const names[LOOM_FORMAT_COUNT] = {
		[LOOM_FORMAT_NCHW] = "nchw",
		[LOOM_FORMAT_NHWC] = "nhwc",
		[LOOM_FORMAT_NCHW8C] = "nChw8c",
	};
	return (unsigned)f < LOOM_FORMAT_COUNT ? names[f] : "?";
}

LOOM_BACKWARD_OP(reorder, "reorder", LOOM_ATTRS_NONE, "input");
