/*
 * comm/progress.c — what each rank has reached, readable by the other ranks
 * on its host even while it is stopped: a small file in /dev/shm, mapped,
 * holding the number and the description of the last collective this rank
 * entered ("step 38's all-reduce of 1000 f32"). When a collective times out
 * and every peer is alive, the survivors read it and name the rank that has
 * not reached theirs, as a hang report would.
 *
 * Ranks on other hosts cannot read that file, and a stopped rank answers
 * nothing: so each rank also sends the same record, on entry to every
 * collective, to each rank on another host, over one TCP connection to that
 * rank's liveness listener (opened once the group formed). The receiver
 * reads it without blocking every 0.1 s at most (on entry to its own
 * collectives) and when a collective times out; what a stopped rank wrote
 * before it stopped is in the receiver's socket buffer by then.
 */
#define _GNU_SOURCE /* accept4 */
#include "comm/comm_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define PROGRESS_MAGIC "LMPROG01"

struct loom_progress {
	char magic[8];
	uint64_t begun;  /* seq being written (a reader seeing begun != seq retries) */
	uint64_t seq;    /* collectives entered, counting from 1 */
	char label[LOOM_PROGRESS_LABEL];
};

#define PROGRESS_DIR "/dev/shm"
#define PROGRESS_PREFIX "loom-progress-"

static void progress_path(char *buf, size_t len, const char *host, unsigned pid)
{
	snprintf(buf, len, PROGRESS_DIR "/" PROGRESS_PREFIX "%s-%u", host, pid);
}

/* This process's own file, for the exit handler and the launcher's
 * watcher (launch.c), which act without the group at hand. */
static char self_path[160];
static struct loom_progress *self_map;
static pid_t self_pid;

/* (Not in a forked child that exits: the file is its parent's.) */
static void remove_self_at_exit(void)
{
	if (self_path[0] && getpid() == self_pid)
		unlink(self_path);
}

void loom_progress_host(char *host, size_t len)
{
	if (gethostname(host, len - 1))
		snprintf(host, len, "localhost");
	host[len - 1] = 0;
}

void loom_progress_remove(unsigned pid)
{
	char host[LOOM_COMM_HOSTLEN] = "", path[160];

	loom_progress_host(host, sizeof(host));
	progress_path(path, sizeof(path), host, pid);
	unlink(path);
}

void loom_progress_abandon(const char *why)
{
	struct loom_progress *p = self_map;

	if (p) {
		/* Seen by a reader as a newer collective with this label. */
		uint64_t seq = __atomic_load_n(&p->seq, __ATOMIC_ACQUIRE) + 1;

		__atomic_store_n(&p->begun, seq, __ATOMIC_RELEASE);
		snprintf(p->label, sizeof(p->label), "%s", why);
		__atomic_store_n(&p->seq, seq, __ATOMIC_RELEASE);
	}
	if (self_path[0])
		unlink(self_path);
}

/* Start-up: files this host's ranks left behind when they were killed
 * (SIGKILL leaves no chance to remove them) go, once their process is gone. */
static void sweep_stale(const char *host)
{
	char prefix[LOOM_COMM_HOSTLEN + 32], path[160];
	size_t pl;
	struct dirent *e;
	DIR *d = opendir(PROGRESS_DIR);

	if (!d)
		return;
	pl = (size_t)snprintf(prefix, sizeof(prefix), PROGRESS_PREFIX "%s-", host);
	while ((e = readdir(d))) {
		const char *t = e->d_name + pl, *q;
		long pid;

		if (strncmp(e->d_name, prefix, pl) || !*t || strlen(t) > 9)
			continue;
		for (q = t; *q >= '0' && *q <= '9'; q++)
			;
		if (*q)
			continue; /* another host whose name starts like ours */
		pid = strtol(t, NULL, 10);
		if (pid <= 0 || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
			continue;
		snprintf(path, sizeof(path), PROGRESS_DIR "/%s", e->d_name);
		unlink(path);
	}
	closedir(d);
}

/* ------------------------------------------------------ links to other hosts */

typedef struct progress_link {
	int out;                              /* to this peer, or -1 */
	uint8_t pend[LOOM_PROG_RECORD_BYTES]; /* a record partly sent */
	size_t pend_off, pend_len;
	int in;                               /* from this peer, or -1 */
	uint8_t buf[LOOM_PROG_RECORD_BYTES];  /* a record partly read */
	size_t got;
	int have;                             /* a record came: seq, label */
	int lost;                             /* it ended: the peer closed it or died */
	uint64_t seq;
	char label[LOOM_PROGRESS_LABEL];
} progress_link;

struct loom_progress_links {
	progress_link *l; /* world entries */
	double drained;
};

static int other_host(const loom_pg *pg, int k)
{
	return k != pg->info.rank && strcmp(pg->peers[k].host, pg->peers[pg->info.rank].host);
}

/* One link per rank on another host, to its liveness listener; a peer that
 * cannot be reached just has none (its state stays unknown). */
static void links_open(loom_pg *pg)
{
	struct loom_progress_links *L;
	uint8_t hello[LOOM_PROG_LINK_BYTES];
	char ignore[64];
	int k, any = 0;

	for (k = 0; k < pg->info.world; k++)
		any |= other_host(pg, k);
	if (!any || pg->probe_fd < 0)
		return;
	L = calloc(1, sizeof(*L));
	if (!L || !(L->l = calloc((size_t)pg->info.world, sizeof(*L->l)))) {
		free(L);
		return;
	}
	/* Links and liveness probes arrive there: accept without blocking. */
	fcntl(pg->probe_fd, F_SETFL, fcntl(pg->probe_fd, F_GETFL) | O_NONBLOCK);
	loom_prog_encode_link(pg->info.rank, pg->info.world, hello);
	for (k = 0; k < pg->info.world; k++) {
		progress_link *l = &L->l[k];

		l->out = l->in = -1;
		if (!other_host(pg, k) || !pg->peers[k].probe_port)
			continue;
		l->out = loom_sock_connect(pg->peers[k].addr, (int)pg->peers[k].probe_port,
					   loom_comm_now() + 2.0);
		if (l->out >= 0 && loom_sock_write(l->out, hello, sizeof(hello), loom_comm_now() + 2.0,
						   "progress link", ignore, sizeof(ignore))) {
			close(l->out);
			l->out = -1;
		}
	}
	pg->links = L;
}

static void links_close(loom_pg *pg)
{
	struct loom_progress_links *L = pg->links;
	int k;

	if (!L)
		return;
	for (k = 0; k < pg->info.world; k++) {
		if (L->l[k].out >= 0)
			close(L->l[k].out);
		if (L->l[k].in >= 0)
			close(L->l[k].in);
	}
	free(L->l);
	free(L);
	pg->links = NULL;
}

/* Sends what is pending on l; 1 when all of it went. A link that fails
 * otherwise than by being full is closed. */
static int link_flush(progress_link *l)
{
	while (l->pend_off < l->pend_len) {
		ssize_t n = send(l->out, l->pend + l->pend_off, l->pend_len - l->pend_off,
				 MSG_DONTWAIT | MSG_NOSIGNAL);

		if (n > 0) {
			l->pend_off += (size_t)n;
			continue;
		}
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
			return 0;
		close(l->out);
		l->out = -1;
		return 0;
	}
	return 1;
}

/* The record of collective seq to every other host. A link whose peer has
 * not read the last ones (its buffers full) skips this one rather than
 * block: records are whole, so the peer reads the latest that fitted. */
static void links_push(loom_pg *pg, uint64_t seq, const char *label)
{
	struct loom_progress_links *L = pg->links;
	int k;

	for (k = 0; L && k < pg->info.world; k++) {
		progress_link *l = &L->l[k];

		if (l->out < 0 || !link_flush(l))
			continue;
		loom_prog_encode_record(seq, label, l->pend);
		l->pend_off = 0;
		l->pend_len = sizeof(l->pend);
		link_flush(l);
	}
}

/* A connection just accepted on the liveness listener: a peer's link (its
 * first 16 bytes say which), or a liveness probe or a stranger (closed). */
static void link_accept(loom_pg *pg, int fd)
{
	struct loom_progress_links *L = pg->links;
	uint8_t m[LOOM_PROG_LINK_BYTES];
	struct pollfd p = { fd, POLLIN, 0 };
	size_t got = 0;
	int rank, tries;

	for (tries = 0; got < sizeof(m) && tries < 3; tries++) {
		ssize_t n;

		if (poll(&p, 1, 20) <= 0)
			continue;
		n = recv(fd, m + got, sizeof(m) - got, MSG_DONTWAIT);
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	if (got < sizeof(m) || loom_prog_decode_link(m, pg->info.world, pg->info.rank, &rank) ||
	    !other_host(pg, rank)) {
		close(fd);
		return;
	}
	if (L->l[rank].in >= 0)
		close(L->l[rank].in);
	L->l[rank].in = fd;
	L->l[rank].got = 0;
	L->l[rank].lost = 0;
}

/* Reads every link without blocking and keeps each peer's latest record;
 * at most every 0.1 s unless forced. */
static void links_drain(loom_pg *pg, int force)
{
	struct loom_progress_links *L = pg->links;
	int k, fd, n;

	if (!L || (!force && loom_comm_now() < L->drained + 0.1))
		return;
	L->drained = loom_comm_now();
	for (n = 0; n < 4 * pg->info.world + 16; n++) {
		fd = accept4(pg->probe_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0)
			break;
		link_accept(pg, fd);
	}
	for (k = 0; k < pg->info.world; k++) {
		progress_link *l = &L->l[k];

		while (l->in >= 0) {
			ssize_t r = recv(l->in, l->buf + l->got, sizeof(l->buf) - l->got, MSG_DONTWAIT);

			if (r <= 0) {
				if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
					close(l->in);
					l->in = -1;
					l->lost = 1;
				}
				break;
			}
			l->got += (size_t)r;
			if (l->got < sizeof(l->buf))
				continue;
			l->got = 0;
			if (loom_prog_decode_record(l->buf, &l->seq, l->label, sizeof(l->label))) {
				close(l->in); /* not a record: the stream is lost */
				l->in = -1;
				break;
			}
			l->have = 1;
		}
	}
}

/* ------------------------------------------------------------ the watchdog */

/* /proc/PID/stat into buf (len bytes); the fields after the command's
 * name, from field 3 (the state) on, or NULL when it cannot be read (the
 * name may hold spaces and parentheses: the last ')' ends it). */
static char *proc_stat(unsigned pid, char *buf, size_t len)
{
	char path[64], *p;
	size_t n;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%u/stat", pid);
	f = fopen(path, "r");
	if (!f)
		return NULL;
	n = fread(buf, 1, len - 1, f);
	fclose(f);
	buf[n] = 0;
	p = strrchr(buf, ')');
	return p && p[1] == ' ' ? p + 2 : NULL;
}

/* A process's start time (field 22 of /proc/PID/stat, in clock ticks since
 * boot), 0 when it cannot be read; *zombie says whether it has ended and
 * waits to be reaped. */
static uint64_t start_time(unsigned pid, int *zombie)
{
	char buf[1024], *p;
	unsigned long long t = 0;
	int field;

	*zombie = 0;
	p = proc_stat(pid, buf, sizeof(buf));
	if (!p)
		return 0;
	*zombie = p[0] == 'Z' || p[0] == 'X';
	/* p is field 3 (the state); the start time is field 22. */
	for (field = 3; *p && field < 22; p++)
		if (*p == ' ')
			field++;
	if (sscanf(p, "%llu", &t) != 1)
		return 0;
	return t;
}

uint64_t loom_proc_start(unsigned pid)
{
	int zombie;

	return start_time(pid, &zombie);
}

int loom_proc_ended(unsigned pid, uint64_t start)
{
	int zombie;
	uint64_t t = start_time(pid, &zombie);

	/* A zombie keeps its pid and start time until its parent reaps it,
	 * which a rank's parent may never do. */
	return zombie || t != start;
}

/* After the group formed: the start time of each peer on this host, so
 * that the watchdog can tell its pid still names it. A peer whose process
 * cannot be seen here (another pid namespace under the same host name)
 * gets 0 and is left to the timeout. */
static void peers_seen(loom_pg *pg)
{
	const loom_comm_peer *me = &pg->peers[pg->info.rank];
	int k;

	pg->peer_start = calloc((size_t)pg->info.world, sizeof(*pg->peer_start));
	for (k = 0; pg->peer_start && k < pg->info.world; k++)
		if (k != pg->info.rank && !strcmp(pg->peers[k].host, me->host))
			pg->peer_start[k] = loom_proc_start(pg->peers[k].pid);
}

/* Whether peer k looks gone: on this host its process ended (or its pid
 * now names another process); on another host its progress link closed. */
static int looks_gone(loom_pg *pg, int k)
{
	const progress_link *l = pg->links ? &pg->links->l[k] : NULL;

	if (pg->peer_start && pg->peer_start[k])
		return loom_proc_ended(pg->peers[k].pid, pg->peer_start[k]);
	return l && l->lost;
}

int loom_pg_watch(loom_pg *pg, double t0, double *next, char *buf, size_t len)
{
	double now = loom_comm_now();
	int k, suspect = 0, dead;

	if (pg->info.world < 2)
		return 0;
	if (*next <= 0)
		*next = t0 + LOOM_COMM_WATCH_S;
	if (now < *next)
		return 0;
	*next = now + LOOM_COMM_WATCH_S;
	links_drain(pg, 1);
	for (k = 0; k < pg->info.world; k++)
		suspect |= k != pg->info.rank && looks_gone(pg, k);
	if (!suspect)
		return 0;
	/* The liveness probe decides (its listener refuses once the process
	 * is gone) and writes the sentence a timeout would. */
	dead = loom_pg_name_dead(pg, buf, len);
	if (dead)
		for (k = 0; k < pg->info.world; k++)
			if (k != pg->info.rank && pg->peer_start && pg->peer_start[k] &&
			    looks_gone(pg, k)) {
				char path[160];

				/* Killed, it could not remove its own file. */
				progress_path(path, sizeof(path), pg->peers[k].host, pg->peers[k].pid);
				unlink(path);
			}
	return dead;
}

/* ------------------------------------------------------------ the file */

void loom_progress_open(loom_pg *pg)
{
	const loom_comm_peer *me = &pg->peers[pg->info.rank];
	char path[160];
	void *m;
	int fd;

	links_open(pg);
	peers_seen(pg);
	sweep_stale(me->host);
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
	/* Removed at exit too when the program returns or exits on an error
	 * without freeing the group. */
	if (!self_map) {
		static int registered;

		if (!registered && !atexit(remove_self_at_exit))
			registered = 1;
		snprintf(self_path, sizeof(self_path), "%s", path);
		self_map = m;
		self_pid = getpid();
	}
}

void loom_progress_close(loom_pg *pg)
{
	const loom_comm_peer *me;
	char path[160];

	links_close(pg);
	free(pg->peer_start);
	pg->peer_start = NULL;
	if (!pg->progress)
		return;
	me = &pg->peers[pg->info.rank];
	if (self_map == pg->progress) {
		self_map = NULL;
		self_path[0] = 0;
	}
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
	links_push(pg, seq, pg->labels[seq % LOOM_PROGRESS_RING]);
	links_drain(pg, 0);
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
	char buf[512], *p = proc_stat(pid, buf, sizeof(buf));
	return p && (p[0] == 'T' || p[0] == 't');
}

size_t loom_progress_laggards(loom_pg *pg, uint64_t seq, char *buf, size_t len)
{
	const loom_comm_peer *me = &pg->peers[pg->info.rank];
	size_t n = 0;
	int k;

	buf[0] = 0;
	links_drain(pg, 1);
	for (k = 0; k < pg->info.world && n < len; k++) {
		const loom_comm_peer *p = &pg->peers[k];
		const progress_link *l = pg->links ? &pg->links->l[k] : NULL;
		char last[LOOM_PROGRESS_LABEL], where[LOOM_COMM_HOSTLEN + 16] = "";
		char who[LOOM_PG_NOTE_BYTES + 16];
		uint64_t theirs;

		if (k == pg->info.rank)
			continue;
		if (!strcmp(p->host, me->host)) {
			if (loom_progress_read(p, &theirs, last, sizeof(last)))
				continue;
			if (stopped(p->pid))
				snprintf(where, sizeof(where), " (stopped: SIGSTOP?)");
		} else {
			/* On another host: what its link last brought. */
			if (!l || !l->have)
				continue;
			theirs = l->seq;
			snprintf(last, sizeof(last), "%s", l->label);
			snprintf(where, sizeof(where), " (on %s)", p->host);
		}
		if (theirs >= seq)
			continue;
		n += (size_t)snprintf(buf + n, len - n,
				      "%srank %s is alive%s but has not reached %s (its last: %s)",
				      n ? "; " : "", loom_pg_rank_name(pg, k, who, sizeof(who)), where,
				      loom_progress_label(pg, seq), last);
	}
	return n;
}
