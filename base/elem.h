/*
 * base/elem.h — one element of any loom dtype read as or written from a
 * double: the single place that knows how each storage format converts
 * (half formats through base/half.h, fp8 through base/fp8.h, rounding to
 * nearest even, fp8 saturating). Used off the hot paths: initialisers, reads
 * and writes by handle, the host optimizer, the strategies and file formats.
 */
#ifndef LOOM_BASE_ELEM_H
#define LOOM_BASE_ELEM_H

#include <stdint.h>

#include "base/fp8.h"
#include "base/half.h"
#include "loom.h"

static inline double loom_elem_get(loom_dtype dt, const void *p, int64_t i)
{
	switch (dt) {
	case LOOM_F32: return ((const float *)p)[i];
	case LOOM_F64: return ((const double *)p)[i];
	case LOOM_F16: return loom_f16_to_f32(((const uint16_t *)p)[i]);
	case LOOM_BF16: return loom_bf16_to_f32(((const uint16_t *)p)[i]);
	case LOOM_I32: return ((const int32_t *)p)[i];
	case LOOM_FP8_E4M3: return loom_e4m3_to_f32(((const uint8_t *)p)[i]);
	case LOOM_FP8_E5M2: return loom_e5m2_to_f32(((const uint8_t *)p)[i]);
	default: return 0;
	}
}

static inline void loom_elem_set(loom_dtype dt, void *p, int64_t i, double x)
{
	switch (dt) {
	case LOOM_F32: ((float *)p)[i] = (float)x; break;
	case LOOM_F64: ((double *)p)[i] = x; break;
	case LOOM_F16: ((uint16_t *)p)[i] = loom_f32_to_f16((float)x); break;
	case LOOM_BF16: ((uint16_t *)p)[i] = loom_f32_to_bf16((float)x); break;
	case LOOM_I32: ((int32_t *)p)[i] = (int32_t)x; break;
	case LOOM_FP8_E4M3: ((uint8_t *)p)[i] = loom_f32_to_e4m3((float)x); break;
	case LOOM_FP8_E5M2: ((uint8_t *)p)[i] = loom_f32_to_e5m2((float)x); break;
	default: break;
	}
}

#endif /* LOOM_BASE_ELEM_H */
