/*
 * comm/progress.c — what each rank has reached, readable by the other ranks
 * on its host even while it is stopped: a small file in /dev/shm, mapped,
 * holding the number and the description of the last collective this rank
 * entered ("step 38's all-reduce of 1000 f32"). When a collective times out
 * and every peer is alive, the survivors read it and name the rank that has
 * not reached theirs, as a hang report would.
 */
#include "comm/comm_internal.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PROGRESS_MAGIC "LMPROG01"

struct loom_progress {
	char magic[8];
	uint64_t begun;  /* seq being written (a reader seeing begun != seq retries) */
	uint64_t seq;    /* collectives entered, counting from 1 */
	char label[LOOM_PROGRESS_LABEL];
};

static void progress_path(char *buf, size_t len, const char *host, unsigned pid)
{
	snprintf(buf, len, "/dev/shm/loom-progress-%s-%u", host, pid);
}

void loom_progress_open(loom_pg *pg)
{
	const loom_comm_peer *me = &pg->peers[pg->info.rank];
	char path[160];
	void *m;
	int fd;

	progress_path(path, sizeof(path), me->host, me->pid);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return; /* no /dev/shm: the survivors say less, nothing breaks */
	if (ftruncate(fd, sizeof(struct loom_progress))) {
		close(fd);
		unlink(path);
		return;
	}
	m = mmap(NULL, sizeof(struct loom_progress), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED) {
		unlink(path);
		return;
	}
	pg->progress = m;
	memcpy(pg->progress->magic, PROGRESS_MAGIC, 8);
}

void loom_progress_close(loom_pg *pg)
{
	const loom_comm_peer *me;
	char path[160];

	if (!pg->progress)
		return;
	me = &pg->peers[pg->info.rank];
	munmap(pg->progress, sizeof(struct loom_progress));
	pg->progress = NULL;
	progress_path(path, sizeof(path), me->host, me->pid);
	unlink(path);
}

void loom_progress_enter(loom_pg *pg, const char *what)
{
	struct loom_progress *p = pg->progress;
	uint64_t seq = ++pg->seq;

	loom_rdv_late_poll(pg->late); /* a late process is told why (rendezvous.c) */

	if (pg->step >= 0)
		snprintf(pg->labels[seq % LOOM_PROGRESS_RING], LOOM_PROGRESS_LABEL, "step %lld's %s",
			 (long long)pg->step, what);
	else
		snprintf(pg->labels[seq % LOOM_PROGRESS_RING], LOOM_PROGRESS_LABEL,
			 "collective %llu, %s", (unsigned long long)seq, what);
	if (!p)
		return;
	__atomic_store_n(&p->begun, seq, __ATOMIC_RELEASE);
	memcpy(p->label, pg->labels[seq % LOOM_PROGRESS_RING], LOOM_PROGRESS_LABEL);
	__atomic_store_n(&p->seq, seq, __ATOMIC_RELEASE);
}

const char *loom_progress_label(const loom_pg *pg, uint64_t seq)
{
	if (seq == 0 || seq > pg->seq || pg->seq - seq >= LOOM_PROGRESS_RING)
		return "a collective";
	return pg->labels[seq % LOOM_PROGRESS_RING];
}

int loom_progress_read(const loom_comm_peer *peer, uint64_t *seq, char *label, size_t len)
{
	struct loom_progress rec;
	char path[160];
	int fd, tries;

	progress_path(path, sizeof(path), peer->host, peer->pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	for (tries = 0; tries < 3; tries++) {
		if (pread(fd, &rec, sizeof(rec), 0) != (ssize_t)sizeof(rec) ||
		    memcmp(rec.magic, PROGRESS_MAGIC, 8))
			break;
		if (rec.begun != rec.seq)
			continue; /* caught mid-write: read again */
		close(fd);
		rec.label[LOOM_PROGRESS_LABEL - 1] = 0;
		*seq = rec.seq;
		snprintf(label, len, "%s", rec.seq ? rec.label : "none yet");
		return 0;
	}
	close(fd);
	return -1;
}

/* Whether process pid (on this host) is stopped (state T: SIGSTOP, a
 * debugger). */
static int stopped(unsigned pid)
{
	char path[64], buf[512], *p;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "/proc/%u/stat", pid);
	f = fopen(path, "r");
	if (!f)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	p = strrchr(buf, ')');
	return p && p[1] == ' ' && (p[2] == 'T' || p[2] == 't');
}

size_t loom_progress_laggards(loom_pg *pg, uint64_t seq, char *buf, size_t len)
{
	const loom_comm_peer *me = &pg->peers[pg->info.rank];
	size_t n = 0;
	int k;

	buf[0] = 0;
	for (k = 0; k < pg->info.world && n < len; k++) {
		const loom_comm_peer *p = &pg->peers[k];
		char last[LOOM_PROGRESS_LABEL];
		uint64_t theirs;

		if (k == pg->info.rank || strcmp(p->host, me->host) ||
		    loom_progress_read(p, &theirs, last, sizeof(last)) || theirs >= seq)
			continue;
		n += (size_t)snprintf(buf + n, len - n,
				      "%srank %d is alive%s but has not reached %s (its last: %s)",
				      n ? "; " : "", k, stopped(p->pid) ? " (stopped: SIGSTOP?)" : "",
				      loom_progress_label(pg, seq), last);
	}
	return n;
}
