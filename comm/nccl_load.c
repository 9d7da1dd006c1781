/*
 * comm/nccl_load.c — the NCCL collective as comm/ sees it: reached through
 * the CUDA plugin (base/cuda_plugin.h), which is mapped only here, once a
 * device communicator is asked for and the driver reports a device.
 */
#include "base/cuda_plugin.h"
#include "base/options.h"
#include "comm/comm_internal.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

static loom_comm_seat my_seat(const loom_pg *pg, int visible)
{
	char host[256] = "";
	const char *cvd = loom_env("CUDA_VISIBLE_DEVICES");
	loom_comm_seat s;

	gethostname(host, sizeof(host) - 1);
	memset(&s, 0, sizeof(s));
	s.host = loom_comm_hash(host, strlen(host), 0);
	s.visible_devices = cvd ? loom_comm_hash(cvd, strlen(cvd), 1) : 0;
	s.device = loom_comm_pick_device(pg->info.local_rank, visible, NULL, 0);
	return s;
}

int loom_comm_seats_shared(const loom_comm_seat *all, int world, int *a)
{
	for (*a = 0; *a < world; (*a)++)
		for (int b = *a + 1; b < world; b++)
			if (all[b].host == all[*a].host &&
			    all[b].visible_devices == all[*a].visible_devices &&
			    all[b].device == all[*a].device && all[b].device >= 0)
				return b;
	return -1;
}

loom_status loom_comm_shared_device(loom_pg *pg, int *shared)
{
	int visible = loom_cuda_probe(NULL, 0), world = pg->info.world, a;
	loom_comm_seat me = my_seat(pg, visible), *all = calloc((size_t)world, sizeof(*all));
	loom_status st;

	*shared = 0;
	if (!all)
		return loom_pg_fail(pg, LOOM_ERR_NOMEM, "out of memory");
	st = loom_comm_allgather(pg->host, &me, sizeof(me), all);
	int b = st == LOOM_OK ? loom_comm_seats_shared(all, world, &a) : -1;
	long long dev = b >= 0 ? (long long)all[a].device : -1;
	free(all);
	if (b < 0)
		return st;
	*shared = 1;
	pg->info.device = (int)me.device;
	if (pg->info.rank == 0)
		loom_log("loom: ranks %d and %d share GPU %lld of their host (%d local ranks, %d "
			 "visible device%s): NCCL takes one rank per GPU, so the collectives are "
			 "staged through host memory (MPI)\n", a, b, dev, pg->info.local_world,
			 visible, visible == 1 ? "" : "s");
	return LOOM_OK;
}
