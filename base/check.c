/*
 * base/check.c — the one formatter behind the LOOM_*_CHECK macros. Plain C with no
 * CUDA dependency, so CPU-only builds (and MPI code) share it.
 */
#include "base/check.h"

#include <stdio.h>
#include <string.h>

loom_status loom_check_failed(const char *lib_msg, long code, const char *expr,
			      const char *file, int line, char *err, size_t errlen)
{
	size_t callee;

	if (!err || !errlen)
		return LOOM_ERR_BACKEND;
	if (!expr)
		expr = "?";
	/* "cudaMalloc(&p, n)" -> "cudaMalloc"; trailing blanks dropped too. */
	callee = strcspn(expr, "(");
	while (callee > 0 && (expr[callee - 1] == ' ' || expr[callee - 1] == '\t'))
		callee--;
	snprintf(err, errlen, "%s:%d: %.*s: %s (%ld)", file ? file : "?", line, (int)callee,
		 expr, lib_msg ? lib_msg : "unknown error", code);
	return LOOM_ERR_BACKEND;
}
