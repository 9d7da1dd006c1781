/*
 * comm/pg.c — forming the process group: from mpirun (MPI is the bootstrap),
 * from torchrun's env:// variables (the TCP rendezvous hands out the Open MPI
 * name server's address, rank 0's MPI port and the NCCL unique id, then the
 * singletons join into one communicator), or as a single process.
 */
#include "comm/comm_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/options.h"

#define BLOB_MAGIC "LMBLOB01"

static const char *const boot_names[LOOM_COMM_BOOT_COUNT] = { "auto",   "single", "mpirun",
							      "env://", "srun" };

static void self_peer(loom_pg *pg, int rank)
{
	loom_comm_peer *p = &pg->peers[rank];

	memset(p, 0, sizeof(*p));
	p->rank = (uint32_t)rank;
	p->pid = (uint32_t)getpid();
	p->probe_port = 0;
	if (gethostname(p->host, sizeof(p->host) - 1))
		snprintf(p->host, sizeof(p->host), "localhost");
	snprintf(p->addr, sizeof(p->addr), "127.0.0.1");
}

static loom_status open_probe(loom_pg *pg)
{
	int port = 0;
	loom_status st = loom_sock_listen(0, &pg->probe_fd, &port, pg->err.msg, sizeof(pg->err.msg));

	if (!st)
		pg->peers[pg->info.rank].probe_port = (uint32_t)port;
	return st;
}

/* ------------------------------------------------------------ ompi-server */

/* Rank 0 under env:// starts Open MPI's name server, through which the
 * singletons find each other, and reads its address from the file it writes. */
static loom_status start_ompi_server(loom_pg *pg, char *uri, size_t len)
{
	char path[] = "/tmp/loom-ompi-server.XXXXXX";
	double deadline = loom_comm_now() + 20.0;
	int fd = mkstemp(path), status;
	pid_t pid;

	if (fd < 0)
		return loom_pg_fail(pg, LOOM_ERR_IO, "env://: mkstemp: %s", strerror(errno));
	close(fd);
	pid = fork();
	if (pid < 0) {
		unlink(path);
		return loom_pg_fail(pg, LOOM_ERR_IO, "env://: fork: %s", strerror(errno));
	}
	if (pid == 0) {
		int null = open("/dev/null", O_RDWR);

		/* It lives exactly as long as rank 0. */
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		dup2(null, 0);
		dup2(null, 1);
		execlp("ompi-server", "ompi-server", "--no-daemonize", "-r", path, (char *)NULL);
		_exit(127);
	}
	pg->ompi_server = pid;
	for (;;) {
		FILE *f = fopen(path, "r");
		size_t n = 0;

		if (f) {
			n = fread(uri, 1, len - 1, f);
			fclose(f);
		}
		uri[n] = 0;
		if (n && uri[n - 1] == '\n') {
			uri[n - 1] = 0;
			break;
		}
		if (waitpid(pid, &status, WNOHANG) == pid) {
			pg->ompi_server = 0;
			unlink(path);
			return loom_pg_fail(pg, LOOM_ERR_NOT_FOUND,
					    "env://: ompi-server (Open MPI's name server, from "
					    "openmpi-bin) did not start: %s %d",
					    WIFEXITED(status) ? "exit code" : "signal",
					    WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
		}
		if (loom_comm_now() > deadline) {
			unlink(path);
			return loom_pg_fail(pg, LOOM_ERR_IO,
					    "env://: ompi-server wrote no address within 20 s");
		}
		usleep(5000);
	}
	unlink(path);
	return LOOM_OK;
}

/* ------------------------------------------------------------ env:// */

/* Open MPI reads SLURM_* at MPI_Init and, finding them, takes the process
 * for one direct-launched by srun and aborts ("OMPI was not built with
 * SLURM support") where loom means to join singletons. So they are hidden
 * from MPI_Init and from ompi-server, and put back afterwards. */
typedef struct slurm_env {
	char **saved; /* "NAME=VALUE" copies */
	int n;
} slurm_env;

static void slurm_hide(slurm_env *h)
{
	extern char **environ;
	int k, n = 0;

	h->saved = NULL;
	h->n = 0;
	for (k = 0; environ[k]; k++)
		n += !strncmp(environ[k], "SLURM_", 6);
	if (!n || !(h->saved = calloc((size_t)n, sizeof(char *))))
		return;
	while (h->n < n) {
		char *e = NULL, *eq;

		for (k = 0; environ[k] && !e; k++)
			if (!strncmp(environ[k], "SLURM_", 6))
				e = environ[k];
		if (!e || !(h->saved[h->n] = strdup(e)))
			break;
		eq = strchr(h->saved[h->n], '=');
		if (!eq)
			break;
		*eq = 0;
		unsetenv(h->saved[h->n]);
		*eq = '=';
		h->n++;
	}
}

static void slurm_restore(slurm_env *h)
{
	int k;

	for (k = 0; k < h->n; k++) {
		char *eq = strchr(h->saved[k], '=');

		*eq = 0;
		setenv(h->saved[k], eq + 1, 0);
		free(h->saved[k]);
	}
	free(h->saved);
	h->saved = NULL;
	h->n = 0;
}

static void put_str(uint8_t **p, const char *s)
{
	uint32_t n = (uint32_t)strlen(s);

	memcpy(*p, &n, 4);
	memcpy(*p + 4, s, n);
	*p += 4 + n;
}

static int get_str(const uint8_t **p, const uint8_t *end, char *out, size_t cap)
{
	uint32_t n;

	if (end - *p < 4)
		return -1;
	memcpy(&n, *p, 4);
	if (n >= cap || (size_t)(end - *p - 4) < n)
		return -1;
	memcpy(out, *p + 4, n);
	out[n] = 0;
	*p += 4 + n;
	return 0;
}

/* Rank 0's listener on MASTER_PORT, opened before anything else of this
 * process opens a port: Open MPI's own listeners (started below, before
 * the rendezvous) take ephemeral ports, and one of them once took the very
 * port loom's launcher had picked for MASTER_PORT (rank 1 then spoke to
 * Open MPI). Under loom's launcher the socket itself comes from it
 * (LOOM_LAUNCH_LISTEN_FD), held from the moment the port was picked, so no
 * other process on the host can take the port in between. -1 when this
 * rank does not listen on MASTER_PORT. */
static loom_status rank0_listener(const loom_comm_env *e, int *fd, char *err, size_t errlen)
{
	const char *given = loom_env("LOOM_LAUNCH_LISTEN_FD");
	loom_status st;
	char why[200];

	int listens = e->rank == 0 && e->world > 1 && !e->agent_store;

	*fd = -1;
	if (given) {
		struct sockaddr_in a;
		socklen_t alen = sizeof(a);
		struct stat sb;
		char *end;
		long v = strtol(given, &end, 10);

		/* Once: not for a second group of this process, nor for what
		 * it starts in turn. */
		unsetenv("LOOM_LAUNCH_LISTEN_FD");
		if (!*end && end != given && v > 2 && v < 65536 && !fstat((int)v, &sb) &&
		    S_ISSOCK(sb.st_mode) && !getsockname((int)v, (struct sockaddr *)&a, &alen) &&
		    a.sin_family == AF_INET && ntohs(a.sin_port) == e->master_port) {
			fcntl((int)v, F_SETFD, FD_CLOEXEC);
			if (listens) {
				*fd = (int)v;
				return LOOM_OK;
			}
			close((int)v); /* handed to a rank that does not listen */
		}
	}
	if (!listens)
		return LOOM_OK;
	st = loom_sock_listen(e->master_port, fd, NULL, why, sizeof(why));
	if (st)
		return loom_errnf(err, errlen, st, "rendezvous: rank 0 (MASTER_PORT): %s", why);
	return LOOM_OK;
}

/* The variables of env:// (or of srun), this rank's peer record and its
 * probe port. */
static loom_status env_self(loom_pg *pg, loom_comm_env *e)
{
	loom_status st;

	st = pg->info.how == LOOM_COMM_BOOT_SLURM
		     ? loom_comm_env_parse_slurm(e, pg->err.msg, sizeof(pg->err.msg))
		     : loom_comm_env_parse(e, pg->err.msg, sizeof(pg->err.msg));
	if (st)
		return st;
	pg->info.rank = e->rank;
	pg->info.world = e->world;
	pg->peers = calloc((size_t)e->world, sizeof(loom_comm_peer));
	if (!pg->peers)
		return loom_pg_fail(pg, LOOM_ERR_NOMEM, "out of memory");
	self_peer(pg, e->rank);
	return open_probe(pg);
}

/* Rank 0 opens what the others will join, before the rendezvous: the name
 * server and its MPI port when there are others, and the NCCL id when the
 * group has devices. */
static loom_status env_rank0_open(loom_pg *pg, const loom_comm_env *e, int want_device, char *uri,
				  size_t urilen, char *port, size_t portlen)
{
	slurm_env hidden;
	loom_status st;

	if (e->world > 1) {
		/* Rank 0 is its host's first unless LOCAL_RANK says otherwise;
		 * its GPU is chosen before MPI_Init (see boot_mpi). */
		if (want_device &&
		    (st = loom_comm_nccl_use_device(pg, e->local_rank >= 0 ? e->local_rank : 0)))
			return st;
		slurm_hide(&hidden);
		st = start_ompi_server(pg, uri, urilen);
		if (!st) {
			setenv("OMPI_MCA_pmix_server_uri", uri, 1);
			st = loom_mpi_open(pg, port, portlen);
		}
		slurm_restore(&hidden);
		if (st)
			return st;
	}
	if (want_device)
		return loom_comm_nccl_unique_id(pg->nccl_id, pg->err.msg, sizeof(pg->err.msg));
	return LOOM_OK;
}

/* Rank 0's start-up blob: magic, the name server's uri, the MPI port and
 * the NCCL id. Returns its length. */
static size_t blob_put(uint8_t *blob, const char *uri, const char *port, const uint8_t *nccl_id)
{
	uint8_t *w = blob;

	memcpy(w, BLOB_MAGIC, 8);
	w += 8;
	put_str(&w, uri);
	put_str(&w, port);
	memcpy(w, nccl_id, LOOM_COMM_NCCL_ID_BYTES);
	w += LOOM_COMM_NCCL_ID_BYTES;
	return (size_t)(w - blob);
}

/* Every rank meets rank 0 on MASTER_PORT, hands it its peer record and
 * takes rank 0's blob and the peer table back (in r). listen_fd, when
 * open, becomes r's. */
static loom_status env_rendezvous(loom_pg *pg, const loom_comm_env *e, loom_rdv *r, int listen_fd,
				  const uint8_t *blob, size_t blob_len)
{
	char rank0_addr[256];
	loom_status st;

	memset(r, 0, sizeof(*r));
	r->listen_fd = listen_fd; /* r's now: loom_rdv_close closes it */
	r->listen_given = listen_fd >= 0;
	r->rank = e->rank;
	r->world = e->world;
	r->master_addr = e->master_addr;
	r->master_port = e->master_port;
	r->timeout_s = pg->join_timeout_s;
	r->self = pg->peers[e->rank];
	r->blob = blob;
	r->blob_len = blob_len;
	/* Under torchrun's agent, MASTER_PORT is its TCP store: rank 0 listens
	 * on a port of its own and says where through the store. The others
	 * wait for it as long as they would wait for rank 0 itself. */
	st = e->agent_store ? loom_store_rendezvous(e, r, rank0_addr, sizeof(rank0_addr),
						    e->rank ? 2 * r->timeout_s + 1.5 : r->timeout_s,
						    pg->err.msg, sizeof(pg->err.msg))
			    : LOOM_OK;
	if (!st)
		st = loom_rdv_run(r, pg->err.msg, sizeof(pg->err.msg));
	return st;
}

/* Reads rank 0's blob back (every rank, rank 0 too) and takes the peer
 * table the rendezvous filled. */
static loom_status env_take_blob(loom_pg *pg, const loom_rdv *r, char *uri, size_t urilen,
				 char *port, size_t portlen)
{
	const uint8_t *rp = r->blob_out, *end = rp + r->blob_out_len;

	if (r->blob_out_len < 8 || memcmp(rp, BLOB_MAGIC, 8) ||
	    (rp += 8, get_str(&rp, end, uri, urilen)) || get_str(&rp, end, port, portlen) ||
	    end - rp != LOOM_COMM_NCCL_ID_BYTES)
		return loom_pg_fail(pg, LOOM_ERR_FORMAT,
				    "env://: rank 0's start-up blob is malformed (%zu bytes)",
				    r->blob_out_len);
	memcpy(pg->nccl_id, rp, LOOM_COMM_NCCL_ID_BYTES);
	memcpy(pg->peers, r->peers, sizeof(loom_comm_peer) * (size_t)pg->info.world);
	return LOOM_OK;
}

/* LOCAL_RANK / LOCAL_WORLD_SIZE when given, else counted by host name. */
static loom_status env_local_ranks(loom_pg *pg, const loom_comm_env *e)
{
	int k;

	pg->info.local_rank = pg->info.local_world = 0;
	for (k = 0; k < e->world; k++)
		if (!strcmp(pg->peers[k].host, pg->peers[e->rank].host)) {
			pg->info.local_world++;
			if (k < e->rank)
				pg->info.local_rank++;
		}
	if (e->local_rank >= 0)
		pg->info.local_rank = e->local_rank;
	if (e->local_world >= 0)
		pg->info.local_world = e->local_world;
	if (pg->info.local_rank >= pg->info.local_world)
		return loom_pg_fail(pg, LOOM_ERR_INVALID,
				    "env://: LOCAL_RANK=%d is not below the local world of %d",
				    pg->info.local_rank, pg->info.local_world);
	return LOOM_OK;
}

/* The ranks other than 0 open MPI as singletons through rank 0's name
 * server (their GPU first), then all join rank 0's port into one
 * communicator. */
static loom_status env_join(loom_pg *pg, const loom_comm_env *e, int want_device, loom_rdv *r,
			    const char *uri, const char *port)
{
	slurm_env hidden;
	loom_status st;

	if (e->world <= 1)
		return LOOM_OK;
	if (e->rank != 0) {
		setenv("OMPI_MCA_pmix_server_uri", uri, 1);
		if (want_device && (st = loom_comm_nccl_use_device(pg, pg->info.local_rank)))
			return st;
		slurm_hide(&hidden);
		st = loom_mpi_open(pg, NULL, 0);
		slurm_restore(&hidden);
		if (st)
			return st;
	}
	return loom_mpi_join(pg, r, port);
}

static loom_status boot_env(loom_pg *pg, const loom_comm_options *o)
{
	loom_comm_env e;
	loom_rdv r;
	char uri[1024] = "", port[1024] = "";
	int listen_fd = -1;
	uint8_t blob[8 + 4 + sizeof(uri) + 4 + sizeof(port) + LOOM_COMM_NCCL_ID_BYTES];
	loom_status st;

	if ((st = env_self(pg, &e)))
		return st;
	if ((st = rank0_listener(&e, &listen_fd, pg->err.msg, sizeof(pg->err.msg))))
		return st;
	if (e.rank == 0 &&
	    (st = env_rank0_open(pg, &e, o->want_device, uri, sizeof(uri), port, sizeof(port))))
		goto out_listen;

	st = env_rendezvous(pg, &e, &r, listen_fd, blob, blob_put(blob, uri, port, pg->nccl_id));
	if (st)
		goto out_close;
	if ((st = env_take_blob(pg, &r, uri, sizeof(uri), port, sizeof(port))) ||
	    (st = env_local_ranks(pg, &e)) || (st = env_join(pg, &e, o->want_device, &r, uri, port)))
		goto out_close;
	pg->late = loom_rdv_keep(&r);
out_close:
	loom_rdv_close(&r);
	return st;
out_listen:
	if (listen_fd >= 0)
		close(listen_fd);
	return st;
}

/* ------------------------------------------------------------ mpirun */

static loom_status boot_mpi(loom_pg *pg, const loom_comm_options *o)
{
	loom_comm_env e;
	loom_status st;
	int present;

	st = loom_comm_env_parse_ompi(&e, &present, pg->err.msg, sizeof(pg->err.msg));
	if (st)
		return st;
	if (!present)
		return loom_pg_fail(pg, LOOM_ERR_INVALID,
				    "mpirun bootstrap: OMPI_COMM_WORLD_SIZE is not set (not "
				    "started by Open MPI's mpirun?)");
	pg->info.rank = e.rank;
	pg->info.world = e.world;
	pg->info.local_rank = e.local_rank;
	pg->info.local_world = e.local_world;
	pg->peers = calloc((size_t)e.world, sizeof(loom_comm_peer));
	if (!pg->peers)
		return loom_pg_fail(pg, LOOM_ERR_NOMEM, "out of memory");
	self_peer(pg, e.rank);
	/* The GPU before MPI_Init: a CUDA-aware MPI opens its context on the
	 * current device, which would be device 0 on every rank. */
	if ((st = open_probe(pg)) ||
	    (o->want_device && (st = loom_comm_nccl_use_device(pg, e.local_rank))) ||
	    (st = loom_mpi_init_world(pg)))
		return st;
	return LOOM_OK;
}

/* ------------------------------------------------------------ the group */

static loom_comm_bootstrap detect(void)
{
	if (loom_env("OMPI_COMM_WORLD_SIZE"))
		return LOOM_COMM_BOOT_MPI;
	/* torchrun's RANK wins over srun's (torchrun started by srun). */
	if (loom_env("RANK") || loom_env("WORLD_SIZE"))
		return LOOM_COMM_BOOT_ENV;
	if (loom_comm_env_is_slurm())
		return LOOM_COMM_BOOT_SLURM;
	if (loom_env("MASTER_ADDR"))
		return LOOM_COMM_BOOT_ENV;
	return LOOM_COMM_BOOT_SINGLE;
}

/* A peer that vanishes mid-write must be an error naming it, not a
 * silent death by SIGPIPE (exit 141): ignore it unless the program
 * chose a handler. */
static void ignore_sigpipe(void)
{
	struct sigaction old;

	if (sigaction(SIGPIPE, NULL, &old) == 0 && old.sa_handler == SIG_DFL)
		signal(SIGPIPE, SIG_IGN);
}

/* Checks the options and settles the timeouts (the options', else the
 * environment's, else the default) and the bootstrap. */
static loom_status settle_options(loom_pg *pg, loom_comm_options *o)
{
	loom_status st;
	double t;
	int present;

	if ((unsigned)o->bootstrap >= LOOM_COMM_BOOT_COUNT || o->timeout_s < 0 ||
	    o->join_timeout_s < 0)
		return loom_pg_fail(pg, LOOM_ERR_INVALID,
				    "loom_pg_init: bad options (bootstrap %d, timeouts %g/%g)",
				    (int)o->bootstrap, o->timeout_s, o->join_timeout_s);
	st = loom_comm_env_timeout(&t, &present, pg->err.msg, sizeof(pg->err.msg));
	if (st)
		return st;
	pg->timeout_s = o->timeout_s > 0 ? o->timeout_s : present ? t : LOOM_COMM_DEFAULT_TIMEOUT_S;
	pg->join_timeout_s = o->join_timeout_s > 0 ? o->join_timeout_s : pg->timeout_s;
	if (o->bootstrap == LOOM_COMM_BOOT_AUTO)
		o->bootstrap = detect();
	pg->info.how = o->bootstrap;
	return LOOM_OK;
}

/* Forms the group: rank, world and peers, and MPI where there are others. */
static loom_status boot(loom_pg *pg, const loom_comm_options *o)
{
	switch (o->bootstrap) {
	case LOOM_COMM_BOOT_MPI:
		return boot_mpi(pg, o);
	case LOOM_COMM_BOOT_ENV:
	case LOOM_COMM_BOOT_SLURM:
		return boot_env(pg, o);
	default:
		pg->peers = calloc(1, sizeof(loom_comm_peer));
		if (!pg->peers)
			return loom_pg_fail(pg, LOOM_ERR_NOMEM, "out of memory");
		self_peer(pg, 0);
		return LOOM_OK;
	}
}

/* The group's communicators: host memory always, device memory (NCCL)
 * when asked for. */
static loom_status open_comms(loom_pg *pg, const loom_comm_options *o)
{
	loom_nccl_id_source src;
	loom_status st;
	int shared;

	if (pg->info.world > 1)
		loom_progress_open(pg);
	st = pg->mpi ? loom_mpi_backend_new(pg, &pg->host) : loom_self_backend_new(pg, &pg->host);
	if (st || !o->want_device)
		return st;
	/* Ranks that share a GPU: no NCCL (it refuses them); data
	 * parallelism stages its buckets through host memory. */
	if (pg->info.world > 1 && ((st = loom_comm_shared_device(pg, &shared)) || shared))
		return st;
	src = loom_pg_nccl_id_source(pg);
	pg->info.device = pg->info.local_rank;
	/* A single process has no rendezvous to hand it an id: it makes
	 * its own (an all-zero id is refused by NCCL's bootstrap). */
	if (src == LOOM_NCCL_ID_LOCAL &&
	    (st = loom_comm_nccl_unique_id(pg->nccl_id, pg->err.msg, sizeof(pg->err.msg))))
		return st;
	if (pg->info.how == LOOM_COMM_BOOT_MPI &&
	    (st = loom_comm_broadcast(pg->host, pg->nccl_id, sizeof(pg->nccl_id), 0)))
		return st;
	return loom_comm_nccl_backend_new(pg, &pg->device);
}

loom_status loom_pg_init(const loom_comm_options *opts, loom_pg **out)
{
	loom_comm_options o = { LOOM_COMM_BOOT_AUTO, 0, 0, 0 };
	loom_pg *pg;
	loom_status st;

	if (!out)
		return LOOM_ERR_INVALID;
	loom_comm_error_file_arm();
	loom_comm_agent_arm();
	*out = pg = calloc(1, sizeof(*pg));
	if (!pg)
		return LOOM_ERR_NOMEM;
	if (opts)
		o = *opts;
	ignore_sigpipe();
	pg->probe_fd = -1;
	pg->step = -1;
	pg->info.device = -1;
	pg->info.world = pg->info.local_world = 1;
	if ((st = settle_options(pg, &o)) || (st = boot(pg, &o)))
		return st;
	return open_comms(pg, &o);
}

loom_nccl_id_source loom_pg_nccl_id_source(const loom_pg *pg)
{
	if (pg->info.how == LOOM_COMM_BOOT_ENV || pg->info.how == LOOM_COMM_BOOT_SLURM)
		return LOOM_NCCL_ID_RENDEZVOUS;
	if (pg->info.how == LOOM_COMM_BOOT_MPI && pg->info.rank > 0)
		return LOOM_NCCL_ID_MPI_BROADCAST;
	return LOOM_NCCL_ID_LOCAL;
}

void loom_pg_free(loom_pg *pg)
{
	if (!pg)
		return;
	loom_comm_watch_stop(pg->device);
	loom_comm_watch_stop(pg->host);
	/* A rank that failed a collective keeps its probe open a moment, so
	 * that peers which time out a little later do not count it as dead. */
	if ((pg->host && pg->host->broken) || (pg->device && pg->device->broken))
		usleep(pg->timeout_s < 1.0 ? (useconds_t)(pg->timeout_s * 1e6) : 1000000);
	if (pg->device)
		pg->device->i->free(pg->device);
	if (pg->host)
		pg->host->i->free(pg->host);
	loom_mpi_finish(pg);
	if (pg->ompi_server > 0) {
		kill(pg->ompi_server, SIGTERM);
		waitpid(pg->ompi_server, NULL, 0);
	}
	if (pg->probe_fd >= 0)
		close(pg->probe_fd);
	loom_rdv_late_free(pg->late);
	loom_progress_close(pg);
	free(pg->notes);
	free(pg->peers);
	free(pg);
}

const loom_pg_info *loom_pg_get_info(const loom_pg *pg)
{
	return pg ? &pg->info : NULL;
}

const char *loom_pg_error(const loom_pg *pg)
{
	return pg ? pg->err.msg : "out of memory (no process group)";
}

double loom_pg_timeout(const loom_pg *pg)
{
	return pg->timeout_s;
}

void loom_pg_set_step(loom_pg *pg, int64_t step)
{
	if (!pg)
		return;
	pg->step = step;
	loom_rdv_late_poll(pg->late);
}

void loom_pg_set_timeout(loom_pg *pg, double seconds)
{
	if (seconds > 0)
		pg->timeout_s = seconds;
}

const char *loom_comm_bootstrap_name(loom_comm_bootstrap b)
{
	return (unsigned)b < LOOM_COMM_BOOT_COUNT ? boot_names[b] : "?";
}

loom_comm *loom_pg_comm_if(loom_pg *pg, loom_comm_memory mem)
{
	if (!pg)
		return NULL;
	return mem == LOOM_COMM_HOST ? pg->host : mem == LOOM_COMM_DEVICE ? pg->device : NULL;
}

loom_comm *loom_pg_comm(loom_pg *pg, loom_comm_memory mem)
{
	loom_comm *c = loom_pg_comm_if(pg, mem);
	if (pg && !c && mem == LOOM_COMM_DEVICE)
		loom_pg_fail(pg, LOOM_ERR_UNSUPPORTED,
			     "no device communicator: open the group with want_device on a GPU host");
	return c;
}
