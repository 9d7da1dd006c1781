/*
 * comm/env.c — the environment a rank starts from (torchrun's env://
 * variables, Slurm's srun, Open MPI's OMPI_COMM_WORLD_*), parsed strictly,
 * Slurm's compressed host lists, plus the small
 * helpers every file of comm/ uses: error formatting, clocks, polite polling.
 */
#include "comm/comm_internal.h"

#include "base/errf.h"
#include "base/options.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

loom_status loom_pg_fail(loom_pg *pg, loom_status st, const char *fmt, ...)
{
	va_list ap;

	if (!pg)
		return st;
	va_start(ap, fmt);
	loom_error_vset(&pg->err, st, fmt, ap);
	va_end(ap);
	return st;
}

loom_status loom_comm_fail(loom_comm *c, loom_status st, const char *fmt, ...)
{
	va_list ap;

	c->broken = 1;
	if (!c->pg)
		return st;
	va_start(ap, fmt);
	loom_error_vset(&c->pg->err, st, fmt, ap);
	va_end(ap);
	return st;
}

double loom_comm_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void loom_comm_backoff(double waited_s)
{
	/* 20 us while a collective is young (most finish there), then up to
	 * 1 ms: the wake-up delay stays small next to the timeout. */
	long ns = waited_s < 1e-3 ? 20000 : waited_s < 0.1 ? 200000 : 1000000;
	struct timespec ts = { 0, ns };

	nanosleep(&ts, NULL);
}

loom_status loom_comm_parse_int(const char *name, const char *text, int lo, int hi, int *out,
				char *err, size_t errlen)
{
	const char *p;
	long v = 0;

	if (!text || !*text)
		return loom_errnf(err, errlen, LOOM_ERR_INVALID, "%s is empty", name);
	for (p = text; *p; p++) {
		if (*p < '0' || *p > '9')
			return loom_errnf(err, errlen, LOOM_ERR_INVALID,
					      "%s='%s' is not a non-negative integer", name, text);
		v = v * 10 + (*p - '0');
		if (v > INT_MAX)
			break;
	}
	if (v < lo || v > hi)
		return loom_errnf(err, errlen, LOOM_ERR_INVALID,
				      "%s='%s' is out of range [%d, %d]", name, text, lo, hi);
	*out = (int)v;
	return LOOM_OK;
}

static loom_status required(const char *name, const char **out, char *err, size_t errlen)
{
	*out = loom_env(name);
	if (!*out)
		return loom_errnf(err, errlen, LOOM_ERR_INVALID,
				      "env://: %s is not set (RANK, WORLD_SIZE, MASTER_ADDR "
				      "and MASTER_PORT are required)",
				      name);
	return LOOM_OK;
}

void loom_comm_agent_arm(void)
{
	static int armed;
	pid_t agent;

	/* Only torchrun sets these (loom's --nproc sets RESTART_COUNT alone). */
	if (armed || loom_env("LOOM_LAUNCH_WORKER") ||
	    !(loom_env("TORCHELASTIC_RUN_ID") || loom_env("TORCHELASTIC_MAX_RESTARTS") ||
	      loom_env("TORCHELASTIC_USE_AGENT_STORE")))
		return;
	armed = 1;
	agent = getppid();
	if (prctl(PR_SET_PDEATHSIG, SIGKILL))
		return;
	/* An agent that died before the prctl sent nothing: the parent is
	 * another process by now. (One that died before this process ran at
	 * all cannot be told from a parent that is pid 1 or a subreaper.) */
	if (getppid() != agent) {
		loom_log("%s%s%sstopped: torchrun's agent (pid %d) is gone\n",
			 loom_env("RANK") ? "rank " : "", loom_env("RANK") ? loom_env("RANK") : "",
			 loom_env("RANK") ? ": " : "", (int)agent);
		_exit(1);
	}
}

/* What torchrun's agent adds to env://: the node (GROUP_RANK of
 * GROUP_WORLD_SIZE), whether MASTER_PORT is its own store, the attempt. */
static loom_status torchrun_extras(loom_comm_env *e, char *err, size_t errlen)
{
	const char *gr = loom_env("GROUP_RANK"), *gw = loom_env("GROUP_WORLD_SIZE");
	const char *store = loom_env("TORCHELASTIC_USE_AGENT_STORE");
	const char *restart = loom_env("TORCHELASTIC_RESTART_COUNT");
	loom_status st;

	e->group_rank = e->group_world = -1;
	if (gw && (st = loom_comm_parse_int("GROUP_WORLD_SIZE", gw, 1, e->world, &e->group_world,
					    err, errlen)))
		return st;
	if (gr && (st = loom_comm_parse_int("GROUP_RANK", gr, 0, e->world - 1, &e->group_rank,
					    err, errlen)))
		return st;
	if (gr && gw && e->group_rank >= e->group_world)
		return loom_errnf(err, errlen, LOOM_ERR_INVALID,
				      "GROUP_RANK=%d is not below GROUP_WORLD_SIZE=%d",
				      e->group_rank, e->group_world);
	if (restart && (st = loom_comm_parse_int("TORCHELASTIC_RESTART_COUNT", restart, 0,
						 INT_MAX, &e->restart, err, errlen)))
		return st;
	if (!store || !strcmp(store, "False") || !strcmp(store, "false") || !strcmp(store, "0"))
		e->agent_store = 0;
	else if (!strcmp(store, "True") || !strcmp(store, "true") || !strcmp(store, "1"))
		e->agent_store = 1;
	else
		return loom_errnf(err, errlen, LOOM_ERR_INVALID,
				      "TORCHELASTIC_USE_AGENT_STORE='%.32s' is neither True nor False",
				      store);
	return LOOM_OK;
}

loom_status loom_comm_env_parse(loom_comm_env *e, char *err, size_t errlen)
{
	const char *rank, *world, *addr, *port, *lr, *lw;
	loom_status st;

	memset(e, 0, sizeof(*e));
	if ((st = required("RANK", &rank, err, errlen)) ||
	    (st = required("WORLD_SIZE", &world, err, errlen)) ||
	    (st = required("MASTER_ADDR", &addr, err, errlen)) ||
	    (st = required("MASTER_PORT", &port, err, errlen)))
		return st;
	if ((st = loom_comm_parse_int("WORLD_SIZE", world, 1, 1 << 20, &e->world, err, errlen)) ||
	    (st = loom_comm_parse_int("RANK", rank, 0, INT_MAX, &e->rank, err, errlen)) ||
	    (st = loom_comm_parse_int("MASTER_PORT", port, 1, 65535, &e->master_port, err,
				      errlen)))
		return st;
	if (e->rank >= e->world)
		return loom_errnf(err, errlen, LOOM_ERR_INVALID,
				      "RANK=%d is not below WORLD_SIZE=%d", e->rank, e->world);
	if (!*addr || strlen(addr) >= sizeof(e->master_addr))
		return loom_errnf(err, errlen, LOOM_ERR_INVALID,
				      "MASTER_ADDR='%.64s' is empty or too long", addr);
	strcpy(e->master_addr, addr);

	lr = loom_env("LOCAL_RANK");
	lw = loom_env("LOCAL_WORLD_SIZE");
	e->local_rank = e->local_world = -1;
	if (lr && (st = loom_comm_parse_int("LOCAL_RANK", lr, 0, INT_MAX, &e->local_rank, err,
					    errlen)))
		return st;
	if (lw && (st = loom_comm_parse_int("LOCAL_WORLD_SIZE", lw, 1, e->world,
					    &e->local_world, err, errlen)))
		return st;
	if (lw && lr && e->local_rank >= e->local_world)
		return loom_errnf(err, errlen, LOOM_ERR_INVALID,
				      "LOCAL_RANK=%d is not below LOCAL_WORLD_SIZE=%d",
				      e->local_rank, e->local_world);
	if (lr && !lw && e->local_rank >= e->world)
		return loom_errnf(err, errlen, LOOM_ERR_INVALID,
				      "LOCAL_RANK=%d is not below WORLD_SIZE=%d", e->local_rank,
				      e->world);
	return torchrun_extras(e, err, errlen);
}

/* ------------------------------------------------------------ Slurm */

int loom_comm_env_is_slurm(void)
{
	return loom_env("SLURM_PROCID") && loom_env("SLURM_STEP_NODELIST");
}

int loom_comm_slurm_port(unsigned long job, unsigned long step)
{
	/* 20000..29999 (below Linux's ephemeral ports, 32768 up), a step of
	 * a job its own port: jobs and steps sharing a node rarely meet. */
	return 20000 + (int)((job * 7 + step) % 10000);
}

static loom_status slurm_number(const char *name, unsigned long *out, char *err, size_t errlen)
{
	const char *t = loom_env(name);
	int v;
	loom_status st;

	*out = 0;
	if (!t)
		return LOOM_OK;
	/* A step id may be a word (batch, extern): those ranks have no port. */
	if ((st = loom_comm_parse_int(name, t, 0, INT_MAX, &v, err, errlen)))
		return st;
	*out = (unsigned long)v;
	return LOOM_OK;
}

loom_status loom_comm_env_parse_slurm(loom_comm_env *e, char *err, size_t errlen)
{
	const char *procid = loom_env("SLURM_PROCID"), *ntasks = loom_env("SLURM_NTASKS");
	const char *localid = loom_env("SLURM_LOCALID"), *nodes = loom_env("SLURM_STEP_NODELIST");
	const char *addr = loom_env("MASTER_ADDR"), *port = loom_env("MASTER_PORT");
	const char *nodeid = loom_env("SLURM_NODEID"), *nnodes = loom_env("SLURM_NNODES");
	unsigned long job, step;
	loom_status st;
	char why[LOOM_COMM_ERRLEN];

	memset(e, 0, sizeof(*e));
	e->slurm = 1;
	e->local_rank = e->local_world = e->group_rank = e->group_world = -1;
	if (!procid || !ntasks || !nodes)
		return loom_errnf(err, errlen, LOOM_ERR_INVALID,
				      "srun: %s is not set (SLURM_PROCID, SLURM_NTASKS and "
				      "SLURM_STEP_NODELIST are required)",
				      !procid ? "SLURM_PROCID" : !ntasks ? "SLURM_NTASKS"
								 : "SLURM_STEP_NODELIST");
	if ((st = loom_comm_parse_int("SLURM_NTASKS", ntasks, 1, 1 << 20, &e->world, err,
				      errlen)) ||
	    (st = loom_comm_parse_int("SLURM_PROCID", procid, 0, e->world - 1, &e->rank, err,
				      errlen)) ||
	    (localid && (st = loom_comm_parse_int("SLURM_LOCALID", localid, 0, e->world - 1,
						  &e->local_rank, err, errlen))) ||
	    (nnodes && (st = loom_comm_parse_int("SLURM_NNODES", nnodes, 1, e->world,
						 &e->group_world, err, errlen))) ||
	    (nodeid && (st = loom_comm_parse_int("SLURM_NODEID", nodeid, 0, e->world - 1,
						 &e->group_rank, err, errlen))))
		return st;
	if (addr && *addr) {
		if (strlen(addr) >= sizeof(e->master_addr))
			return loom_errnf(err, errlen, LOOM_ERR_INVALID,
					      "MASTER_ADDR='%.64s' is too long", addr);
		strcpy(e->master_addr, addr);
	} else if ((st = loom_slurm_hostlist_nth(nodes, 0, e->master_addr,
						  sizeof(e->master_addr), why, sizeof(why)))) {
		return loom_errnf(err, errlen, st, "srun: SLURM_STEP_NODELIST='%.200s': %s",
				      nodes, why);
	}
	if (port)
		return loom_comm_parse_int("MASTER_PORT", port, 1, 65535, &e->master_port, err,
					   errlen);
	if ((st = slurm_number("SLURM_JOB_ID", &job, err, errlen)) ||
	    (st = slurm_number("SLURM_STEP_ID", &step, err, errlen)))
		return st;
	e->master_port = loom_comm_slurm_port(job, step);
	return LOOM_OK;
}

/*
 * Host lists. One name is literal text and bracket groups; a group is a
 * comma list of N or LO-HI. Walked twice: once to count, once to pick.
 */
#define HOSTLIST_MAX_HOSTS (1L << 24)

/* The bracket group at s (just past '['): its count, and its member k
 * (k >= 0) printed into out. -1 when malformed. *end: past the ']'. */
static long group_walk(const char *s, const char **end, long k, char *out, size_t len,
		       char *err, size_t errlen)
{
	long count = 0;

	for (;;) {
		const char *p = s;
		unsigned long lo = 0, hi;
		int width = 0;

		while (*p >= '0' && *p <= '9') {
			lo = lo * 10 + (unsigned long)(*p++ - '0');
			if (++width > 9)
				goto bad;
		}
		if (!width)
			goto bad;
		hi = lo;
		if (*p == '-') {
			int w2 = 0;

			hi = 0;
			p++;
			while (*p >= '0' && *p <= '9') {
				hi = hi * 10 + (unsigned long)(*p++ - '0');
				if (++w2 > 9)
					goto bad;
			}
			if (!w2 || hi < lo)
				goto bad;
		}
		if (k >= count && k <= count + (long)(hi - lo))
			snprintf(out, len, "%0*lu", width, lo + (unsigned long)(k - count));
		count += (long)(hi - lo) + 1;
		if (count > HOSTLIST_MAX_HOSTS) {
			loom_errnf(err, errlen, LOOM_ERR_INVALID, "more than %ld hosts",
				       HOSTLIST_MAX_HOSTS);
			return -1;
		}
		if (*p == ',') {
			s = p + 1;
			continue;
		}
		if (*p != ']')
			goto bad;
		*end = p + 1;
		return count;
	}
bad:
	loom_errnf(err, errlen, LOOM_ERR_INVALID,
		       "bad range in brackets at '%.16s' (expected N or LO-HI, LO <= HI, "
		       "comma-separated)",
		       s);
	return -1;
}

static int name_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '-' || c == '_' || c == '.';
}

/* One name from s (up to a ',' outside brackets or the end): its count,
 * and its host k (0 <= k < count) into out when k >= 0 (-1 when it does
 * not fit in len). */
static long name_walk(const char *s, const char **end, long k, char *out, size_t len,
		      char *err, size_t errlen)
{
	const char *p;
	long count = 1, below;
	size_t o = 0;
	char piece[16];

	/* Count first: k's digits come from the product's mixed radix. */
	for (p = s; *p && *p != ','; ) {
		if (*p == '[') {
			long n = group_walk(p + 1, &p, -1, NULL, 0, err, errlen);

			if (n < 0)
				return -1;
			if (count > HOSTLIST_MAX_HOSTS / n) {
				loom_errnf(err, errlen, LOOM_ERR_INVALID, "more than %ld hosts",
					       HOSTLIST_MAX_HOSTS);
				return -1;
			}
			count *= n;
		} else if (name_char(*p)) {
			p++;
		} else {
			loom_errnf(err, errlen, LOOM_ERR_INVALID,
				       "unexpected character '%c' (0x%02x)",
				       *p >= 32 && *p < 127 ? *p : '?', (unsigned char)*p);
			return -1;
		}
	}
	if (p == s) {
		loom_errnf(err, errlen, LOOM_ERR_INVALID, "empty host name");
		return -1;
	}
	*end = p;
	if (k < 0)
		return count;
	/* Then print host k: the first group varies slowest, as Slurm lists. */
	below = count;
	for (p = s; *p && *p != ',';) {
		if (*p == '[') {
			const char *q = p + 1;
			long n = group_walk(q, &p, -1, NULL, 0, err, errlen);
			size_t m;

			below /= n;
			group_walk(q, &p, (k / below) % n, piece, sizeof(piece), err, errlen);
			m = strlen(piece);
			if (o + m >= len)
				return -1;
			memcpy(out + o, piece, m);
			o += m;
		} else {
			if (o + 1 >= len)
				return -1;
			out[o++] = *p++;
		}
	}
	out[o] = 0;
	return count;
}
long loom_slurm_hostlist_count(const char *list, char *err, size_t errlen)
{
	const char *p = list;
	long total = 0;

	if (!list || !*list) {
		loom_errnf(err, errlen, LOOM_ERR_INVALID, "empty host list");
		return -1;
	}
	for (;;) {
		long n = name_walk(p, &p, -1, NULL, 0, err, errlen);

		if (n < 0)
			return -1;
		if (total > HOSTLIST_MAX_HOSTS - n) {
			loom_errnf(err, errlen, LOOM_ERR_INVALID, "more than %ld hosts",
				       HOSTLIST_MAX_HOSTS);
			return -1;
		}
		total += n;
		if (!*p)
			return total;
		p++; /* the ',' between names */
	}
}

loom_status loom_slurm_hostlist_nth(const char *list, long index, char *out, size_t len,
				    char *err, size_t errlen)
{
	const char *p = list;
	long total = loom_slurm_hostlist_count(list, err, errlen);

	if (total < 0)
		return LOOM_ERR_INVALID;
	if (index < 0 || index >= total)
		return loom_errnf(err, errlen, LOOM_ERR_INVALID,
				      "host %ld of a list of %ld", index, total);
	if (!len)
		return loom_errnf(err, errlen, LOOM_ERR_INVALID, "no room for a host name");
	for (;;) {
		const char *start = p;
		long n = name_walk(start, &p, -1, NULL, 0, err, errlen);

		if (index < n) {
			if (name_walk(start, &p, index, out, len, err, errlen) < 0)
				return loom_errnf(err, errlen, LOOM_ERR_INVALID,
						      "host name longer than %zu bytes", len - 1);
			return LOOM_OK;
		}
		index -= n;
		p++;
	}
}

loom_status loom_comm_env_parse_ompi(loom_comm_env *e, int *present, char *err, size_t errlen)
{
	const char *rank = loom_env("OMPI_COMM_WORLD_RANK");
	const char *size = loom_env("OMPI_COMM_WORLD_SIZE");
	const char *lr = loom_env("OMPI_COMM_WORLD_LOCAL_RANK");
	const char *lw = loom_env("OMPI_COMM_WORLD_LOCAL_SIZE");
	loom_status st;

	memset(e, 0, sizeof(*e));
	*present = size != NULL;
	if (!*present)
		return LOOM_OK;
	if (!rank || !lr || !lw)
		return loom_errnf(err, errlen, LOOM_ERR_INVALID,
				      "OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_%s is not",
				      !rank ? "RANK" : !lr ? "LOCAL_RANK" : "LOCAL_SIZE");
	if ((st = loom_comm_parse_int("OMPI_COMM_WORLD_SIZE", size, 1, 1 << 20, &e->world, err,
				      errlen)) ||
	    (st = loom_comm_parse_int("OMPI_COMM_WORLD_RANK", rank, 0, e->world - 1, &e->rank,
				      err, errlen)) ||
	    (st = loom_comm_parse_int("OMPI_COMM_WORLD_LOCAL_SIZE", lw, 1, e->world,
				      &e->local_world, err, errlen)) ||
	    (st = loom_comm_parse_int("OMPI_COMM_WORLD_LOCAL_RANK", lr, 0, e->local_world - 1,
				      &e->local_rank, err, errlen)))
		return st;
	return LOOM_OK;
}

loom_status loom_comm_env_timeout(double *out, int *present, char *err, size_t errlen)
{
	const char *t = loom_opt_env(LOOM_OPT_COMM_TIMEOUT_S);
	char *end;
	double v;

	*present = t != NULL;
	if (!t)
		return LOOM_OK;
	errno = 0;
	v = strtod(t, &end);
	if (!*t || *end || errno || !(v > 0) || v > 1e7)
		return loom_errnf(err, errlen, LOOM_ERR_INVALID,
				      "LOOM_COMM_TIMEOUT_S='%s' is not a positive number of seconds",
				      t);
	*out = v;
	return LOOM_OK;
}

int loom_comm_pick_device(int local_rank, int visible, char *note, size_t notelen)
{
	int dev;

	if (note && notelen)
		note[0] = 0;
	if (visible <= 0 || local_rank < 0)
		return -1;
	if (local_rank < visible)
		return local_rank;
	/* A launcher that gives each rank its own CUDA_VISIBLE_DEVICES shows
	 * every rank one device: it is device 0. More ranks than devices on a
	 * host share them round-robin. */
	dev = local_rank % visible;
	if (note && notelen)
		snprintf(note, notelen,
			 "LOCAL_RANK %d but %d visible CUDA device%s: using device %d%s", local_rank,
			 visible, visible == 1 ? "" : "s", dev,
			 visible == 1 ? " (one device per rank, e.g. CUDA_VISIBLE_DEVICES per rank)" :
					" (ranks share devices round-robin)");
	return dev;
}
