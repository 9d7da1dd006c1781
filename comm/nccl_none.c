/*
 * comm/nccl_none.c — the NCCL entry points of a build without a CUDA
 * toolkit: asking for a device communicator is an error that says why.
 */
#include "comm/comm_internal.h"

loom_status loom_nccl_unique_id(uint8_t id[LOOM_COMM_NCCL_ID_BYTES], char *err, size_t errlen)
{
	(void)id;
	return loom_comm_errf(err, errlen, LOOM_ERR_UNSUPPORTED,
			      "NCCL: this build has no CUDA toolkit; device communication is "
			      "unavailable");
}

static loom_status no_toolkit(loom_pg *pg)
{
	return loom_pg_fail(pg, LOOM_ERR_UNSUPPORTED,
			    "NCCL: this build has no CUDA toolkit; device communication is "
			    "unavailable");
}

loom_status loom_nccl_backend_new(loom_pg *pg, loom_comm **out)
{
	*out = NULL;
	return no_toolkit(pg);
}

loom_status loom_nccl_use_device(loom_pg *pg, int local_rank)
{
	(void)local_rank;
	return no_toolkit(pg);
}
