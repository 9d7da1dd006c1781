/*
 * device.h — whether loom was built with CUDA and which devices this machine
 * has. Safe on any machine: no driver or no device simply means a count of 0,
 * so callers can pick the CPU backend without special cases. Answered by the
 * driver (libcuda.so.1) alone: asking never maps the CUDA backend.
 */
#ifndef LOOM_ENGINE_CUDA_DEVICE_H
#define LOOM_ENGINE_CUDA_DEVICE_H

#include <stddef.h>

#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when this build compiled the CUDA code with nvcc, 0 for the fallback. */
int loom_cuda_compiled(void);

/* Visible CUDA devices; 0 without a driver or a device (or when the driver
 * refused: loom_cuda_probe_error says why). */
int loom_cuda_device_count(void);

/* Why no device is usable ("no CUDA driver: libcuda.so.1: cannot open
 * shared object file", "cuInit: CUDA_ERROR_NO_DEVICE (...)"); NULL when
 * there is a device. The text is the calling thread's. */
const char *loom_cuda_probe_error(void);

/* 1 when at least one device can be used. Never crashes, never aborts. */
int loom_cuda_available(void);

/*
 * Writes "NAME (sm_XY, N.N GiB)" for device dev into buf. On failure buf
 * holds the reason: LOOM_ERR_INVALID (bad dev or buffer, or no device),
 * LOOM_ERR_BACKEND (the driver refused).
 */
loom_status loom_cuda_device_name(int dev, char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_ENGINE_CUDA_DEVICE_H */
