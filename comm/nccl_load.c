/*
 * comm/nccl_load.c — the NCCL collective as comm/ sees it: reached through
 * the CUDA plugin (base/cuda_plugin.h), which is mapped only here, once a
 * device communicator is asked for and the driver reports a device.
 */
#include "base/cuda_plugin.h"
#include "comm/comm_internal.h"

/* The plugin, or an error naming why there is none. */
static const loom_cuda_plugin *nccl_plugin(char *err, size_t errlen)
{
	const loom_cuda_plugin *pl;
	char why[2048];

	if (loom_cuda_probe(why, sizeof why) == 0) {
		loom_errnf(err, errlen, LOOM_ERR_UNSUPPORTED,
			       "NCCL: no CUDA device for a device communicator: %s", why);
		return NULL;
	}
	pl = loom_cuda_plugin_load(why, sizeof why);
	if (!pl)
		loom_errnf(err, errlen, LOOM_ERR_UNSUPPORTED, "NCCL: %s", why);
	return pl;
}

loom_status loom_comm_nccl_unique_id(uint8_t id[LOOM_COMM_NCCL_ID_BYTES], char *err,
				     size_t errlen)
{
	const loom_cuda_plugin *pl = nccl_plugin(err, errlen);

	return pl ? pl->nccl_unique_id(id, err, errlen) : LOOM_ERR_UNSUPPORTED;
}

loom_status loom_comm_nccl_backend_new(loom_pg *pg, loom_comm **out)
{
	const loom_cuda_plugin *pl;

	*out = NULL;
	pl = nccl_plugin(pg->err.msg, sizeof pg->err.msg);
	return pl ? pl->nccl_backend_new(pg, out) : LOOM_ERR_UNSUPPORTED;
}

loom_status loom_comm_nccl_use_device(loom_pg *pg, int local_rank)
{
	const loom_cuda_plugin *pl = nccl_plugin(pg->err.msg, sizeof pg->err.msg);
	static int told; /* once per process (this runs before MPI_Init and again at init) */
	loom_status st;

	if (!pl)
		return LOOM_ERR_UNSUPPORTED;
	pg->device_note[0] = '\0';
	st = pl->nccl_use_device(pg, local_rank);
	if (pg->device_note[0] && !told++)
		loom_log("loom: rank %d: %s\n", pg->info.rank, pg->device_note);
	return st;
}
