/*
 * comm/rank_note.c — a short note per rank (its pipeline stage), so that the
 * messages naming a dead, late or frozen rank say which stage it ran. Apart
 * from pg.c so that the rendezvous and progress code, and the fuzz target
 * that links only them (tests/fuzz/run.sh), have it without MPI.
 */
#include "comm/comm_internal.h"

#include <stdio.h>
#include <stdlib.h>

void loom_pg_set_rank_note(loom_pg *pg, int rank, const char *note)
{
	if (!pg || rank < 0 || rank >= pg->info.world)
		return;
	if (!pg->notes) {
		if (!note || !*note)
			return;
		/* Without memory the messages only name the rank: not worth an error. */
		if (!(pg->notes = calloc((size_t)pg->info.world, sizeof(*pg->notes))))
			return;
	}
	snprintf(pg->notes[rank], sizeof(pg->notes[rank]), "%s", note ? note : "");
}

const char *loom_pg_rank_name(const loom_pg *pg, int rank, char *buf, size_t len)
{
	if (pg->notes && pg->notes[rank][0])
		snprintf(buf, len, "%d (%s)", rank, pg->notes[rank]);
	else
		snprintf(buf, len, "%d", rank);
	return buf;
}
