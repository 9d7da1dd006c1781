/*
 * io/ckpt_meta.c — the ranges of the run-time scalars a checkpoint carries
 * (ckpt_file.h, "meta"), checked apart from any program so that a fuzzer can
 * reach them without building one.
 */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#include "base/errf.h"
#include "io/ckpt_file.h"

/* Counters travel as doubles: every integer up to 2^53 is exact there. */
#define META_INT_MAX 9007199254740992.0

loom_status loom_ckpt_check_meta(const double *m, char *err, size_t errlen)
{
	static const struct {
		int i;
		const char *name;
		double hi;
	} counters[] = {
		{ LOOM_CKPT_META_STEP, "step", META_INT_MAX },
		{ LOOM_CKPT_META_TRACKER, "loss scaler growth tracker", 2147483647.0 },
		{ LOOM_CKPT_META_SKIPPED, "skipped steps", META_INT_MAX },
		{ LOOM_CKPT_META_BELOW, "steps with the loss scale below 1", META_INT_MAX },
	};

	for (size_t k = 0; k < sizeof(counters) / sizeof(counters[0]); k++) {
		double v = m[counters[k].i];

		if (!(v >= 0 && v <= counters[k].hi && v == floor(v)))
			return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
					 "field '%s' is %g, expected an integer in [0, %.0f]",
					 counters[k].name, v, counters[k].hi);
	}
	if (m[LOOM_CKPT_META_STEP] + m[LOOM_CKPT_META_SKIPPED] > META_INT_MAX)
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
				 "fields 'step' (%.0f) and 'skipped steps' (%.0f) add up to more "
				 "than 2^53",
				 m[LOOM_CKPT_META_STEP], m[LOOM_CKPT_META_SKIPPED]);
	if (!(isfinite(m[LOOM_CKPT_META_LR]) && m[LOOM_CKPT_META_LR] >= 0))
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
				 "field 'learning rate' is %g, expected a finite number >= 0",
				 m[LOOM_CKPT_META_LR]);
	/* The scale is kept as a float: a double below the smallest float
	 * would become 0 there, and one above FLT_MAX cannot be converted. */
	if (!(m[LOOM_CKPT_META_SCALE] > 0 && m[LOOM_CKPT_META_SCALE] <= FLT_MAX &&
	      (float)m[LOOM_CKPT_META_SCALE] > 0))
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
				 "field 'loss scale' is %g, expected a finite number > 0 that a "
				 "float can hold",
				 m[LOOM_CKPT_META_SCALE]);
	return LOOM_OK;
}
