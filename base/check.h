/*
 * base/check.h — checked calls into CUDA, cuBLASLt, cuDNN, NCCL (and MPI): each
 * macro runs a call once and yields a loom_status, LOOM_OK on success, else
 * LOOM_ERR_BACKEND with "file:line: callee: library message (code)" written
 * into a caller-supplied buffer. They never return or jump, so use them as
 *     st = LOOM_CUDA_CHECK(cudaMalloc(&p, n), err, errlen);
 *     if (st != LOOM_OK)
 *             goto out_free_x;
 */
#ifndef LOOM_BASE_CHECK_H
#define LOOM_BASE_CHECK_H

#include <stddef.h>

#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Formats the failure of expr (the call's source text, cut at its first
 * parenthesis so a message names the callee, not its arguments) into err,
 * which may be NULL, and returns LOOM_ERR_BACKEND. The one helper behind
 * every LOOM_*_CHECK; libraries with another error convention (MPI writes
 * its string into a buffer) only need a function from code to string.
 */
loom_status loom_check_failed(const char *lib_msg, long code, const char *expr,
			      const char *file, int line, char *err, size_t errlen);

/*
 * The generic checked call: type is the library's status type, ok its success
 * value, to_string its code-to-message function. The call is evaluated once
 * (a GNU statement expression holds its result: gcc and nvcc both take it).
 * Referencing library symbols only at expansion keeps this header free of
 * CUDA includes, so plain C files and CPU-only builds can include it.
 */
#define LOOM_CHECK_CALL(type, ok, to_string, call, err, errlen)                      \
	__extension__({                                                              \
		type loom_rc_ = (call);                                              \
		loom_rc_ == (ok) ? LOOM_OK                                           \
				 : loom_check_failed(to_string(loom_rc_), (long)loom_rc_, \
						     #call, __FILE__, __LINE__, (err),   \
						     (errlen));                          \
	})

/* <cuda_runtime_api.h> */
#define LOOM_CUDA_CHECK(call, err, errlen) \
	LOOM_CHECK_CALL(cudaError_t, cudaSuccess, cudaGetErrorString, call, err, errlen)
/* <cublasLt.h> */
#define LOOM_CUBLAS_CHECK(call, err, errlen)                                              \
	LOOM_CHECK_CALL(cublasStatus_t, CUBLAS_STATUS_SUCCESS, cublasGetStatusString, call, \
			err, errlen)
/* <cudnn.h> */
#define LOOM_CUDNN_CHECK(call, err, errlen) \
	LOOM_CHECK_CALL(cudnnStatus_t, CUDNN_STATUS_SUCCESS, cudnnGetErrorString, call, err, errlen)
/* <nccl.h> */
#define LOOM_NCCL_CHECK(call, err, errlen) \
	LOOM_CHECK_CALL(ncclResult_t, ncclSuccess, ncclGetErrorString, call, err, errlen)
/* <mpi.h>: the includer provides loom_mpi_error_string(int), a wrapper of
 * MPI_Error_string over a thread-local buffer (comm/ owns it). */
#define LOOM_MPI_CHECK(call, err, errlen) \
	LOOM_CHECK_CALL(int, MPI_SUCCESS, loom_mpi_error_string, call, err, errlen)

#ifdef __cplusplus
}
#endif

#endif /* LOOM_BASE_CHECK_H */
