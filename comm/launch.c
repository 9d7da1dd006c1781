/*
 * comm/launch.c — the built-in launcher (see launch.h): fork/exec of N
 * workers in their own process groups (so that stopping one also stops what
 * it started: rank 0's ompi-server, Open MPI's helpers), two pipes per
 * worker read line by line (its stdout to ours, its stderr to ours, each
 * line prefixed with its rank), and a failure policy like torchrun's.
 *
 * Workers die with their launcher, however it ends (SIGKILL, the OOM
 * killer): each is forked with a parent-death signal and checks that its
 * parent is still the launcher (it may have died before the prctl), and
 * every worker watches the read end of a pipe whose write end only the
 * launcher holds. When the launcher is gone the pipe reads EOF, and the
 * worker's watcher thread says why and ends the process at once, before
 * another step or checkpoint.
 */
#define _GNU_SOURCE /* pipe2 */
#include "comm/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/options.h"
#include "comm/comm_internal.h"

/* One of a worker's output streams: read from fd, whole lines to `to`. */
typedef struct stream {
	int fd; /* -1 at EOF */
	FILE *to;
	char line[4096];
	size_t used;
} stream;

typedef struct worker {
	pid_t pid;
	stream out[2]; /* its stdout (to ours) and its stderr (to ours) */
	int running;
	int status;    /* from waitpid, once it ended */
} worker;

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
	interrupted = sig;
}

/* What the first survivor to report a timed-out collective said of the
 * others ("rank 1 is alive but has not reached step 39's all-reduce ...",
 * "rank 2 died ..."): the launcher blames that rank, not the reporter. */
static char blame[512];
static int blame_by = -1;

static void note_blame(int rank, const char *s, size_t n)
{
	char line[4096];
	const char *t, *why;

	if (blame_by >= 0)
		return;
	snprintf(line, sizeof(line), "%.*s", (int)n, s);
	t = strstr(line, " timed out after ");
	if (!t)
		t = strstr(line, " failed after "); /* the watchdog found it dead */
	why = t ? strstr(t, " s: ") : NULL;
	if (!why || strncmp(why + 4, "rank", 4) || (!strstr(why, " is alive") && !strstr(why, " died")))
		return;
	snprintf(blame, sizeof(blame), "%s", why + 4);
	blame_by = rank;
}

static void emit(int rank, FILE *to, const char *s, size_t n)
{
	note_blame(rank, s, n);
	fprintf(to, "[rank %d] %.*s\n", rank, (int)n, s);
	fflush(to);
}

/* Reads what a worker wrote on one stream; whole lines go out prefixed. */
static void drain(stream *w, int rank)
{
	for (;;) {
		ssize_t k = read(w->fd, w->line + w->used, sizeof(w->line) - w->used);
		size_t start = 0, i;

		if (k < 0 && (errno == EINTR))
			continue;
		if (k <= 0) {
			if (k == 0 || errno != EAGAIN) {
				if (w->used)
					emit(rank, w->to, w->line, w->used);
				w->used = 0;
				close(w->fd);
				w->fd = -1;
			}
			return;
		}
		w->used += (size_t)k;
		for (i = 0; i < w->used; i++)
			if (w->line[i] == '\n') {
				emit(rank, w->to, w->line + start, i - start);
				start = i + 1;
			}
		memmove(w->line, w->line + start, w->used - start);
		w->used -= start;
		if (w->used == sizeof(w->line)) { /* a very long line: cut it */
			emit(rank, w->to, w->line, w->used);
			w->used = 0;
		}
	}
}

static void describe_end(int status, char *buf, size_t len)
{
	if (WIFSIGNALED(status))
		snprintf(buf, len, "was killed by signal %d (%s)", WTERMSIG(status),
			 strsignal(WTERMSIG(status)));
	else
		snprintf(buf, len, "exited with code %d", WEXITSTATUS(status));
}

/* A free port for MASTER_PORT, and its listening socket, kept open until
 * rank 0 has it (LOOM_LAUNCH_LISTEN_FD): closed and reopened by rank 0, the
 * port could be taken in between by any process on the host (it once was,
 * by Open MPI's own listener in rank 0). */
static int free_port(int *fd)
{
	int port = 0;
	char err[128];

	if (loom_sock_listen(0, fd, &port, err, sizeof(err))) {
		*fd = -1;
		return 29500;
	}
	return port;
}

/* Starts one worker; fd[0] and fd[1] read its stdout and its stderr. */
static pid_t spawn(const loom_launch_options *o, char *const argv[], int rank, int port,
		   int listen_fd, int attempt, int live, int fd[2])
{
	pid_t launcher = getpid(), pid;
	int p[2], e[2];

	if (pipe2(p, O_CLOEXEC))
		return -1;
	if (pipe2(e, O_CLOEXEC)) {
		close(p[0]);
		close(p[1]);
		return -1;
	}
	pid = fork();
	if (pid < 0) {
		close(p[0]);
		close(p[1]);
		close(e[0]);
		close(e[1]);
		return -1;
	}
	if (pid == 0) {
		char v[32];

		/* Dies with the launcher; and if the launcher died before the
		 * prctl, the parent is already another process. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != launcher)
			_exit(1);
		setpgid(0, 0);
		dup2(p[1], 1);
		dup2(e[1], 2);
		snprintf(v, sizeof(v), "%d", rank);
		setenv("RANK", v, 1);
		setenv("LOCAL_RANK", v, 1);
		snprintf(v, sizeof(v), "%d", o->nproc);
		setenv("WORLD_SIZE", v, 1);
		setenv("LOCAL_WORLD_SIZE", v, 1);
		setenv("MASTER_ADDR", "127.0.0.1", 1);
		snprintf(v, sizeof(v), "%d", port);
		setenv("MASTER_PORT", v, 1);
		if (rank == 0 && listen_fd >= 0 && !fcntl(listen_fd, F_SETFD, 0)) {
			snprintf(v, sizeof(v), "%d", listen_fd);
			setenv("LOOM_LAUNCH_LISTEN_FD", v, 1);
		}
		snprintf(v, sizeof(v), "%d", attempt);
		setenv("TORCHELASTIC_RESTART_COUNT", v, 1);
		setenv("LOOM_LAUNCH_WORKER", "1", 1);
		/* The liveness pipe's read end stays open across exec (its
		 * write end, close-on-exec, stays with the launcher only). */
		if (live >= 0 && !fcntl(live, F_SETFD, 0)) {
			snprintf(v, sizeof(v), "%d", live);
			setenv("LOOM_LAUNCH_LIVE_FD", v, 1);
			snprintf(v, sizeof(v), "%d", (int)launcher);
			setenv("LOOM_LAUNCH_PID", v, 1);
		}
		/* N ranks each running as many OpenMP threads as there are
		 * cores spin against each other (measured: 2 ranks x 2 threads
		 * on 2 cores ran at a third of 2 x 1). As torchrun does, give
		 * each its share unless the user chose. */
		if (!loom_env("OMP_NUM_THREADS")) {
			long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
			long share = ncpu > o->nproc ? ncpu / o->nproc : 1;
			snprintf(v, sizeof(v), "%ld", share);
			setenv("OMP_NUM_THREADS", v, 1);
		}
		execv(o->program ? o->program : "/proc/self/exe", argv);
		loom_log("cannot run %s: %s\n", o->program ? o->program : argv[0],
			strerror(errno));
		_exit(127);
	}
	setpgid(pid, pid); /* also here: no race with the kill below */
	close(p[1]);
	close(e[1]);
	fcntl(p[0], F_SETFL, O_NONBLOCK);
	fcntl(e[0], F_SETFL, O_NONBLOCK);
	fd[0] = p[0];
	fd[1] = e[0];
	return pid;
}

static void signal_all(worker *w, int n, int sig)
{
	int k;

	for (k = 0; k < n; k++)
		if (w[k].running)
			kill(-w[k].pid, sig);
}

/* One attempt: its workers, their streams' poll entries and how it goes. */
typedef struct run_state {
	const loom_launch_options *o;
	worker *w;          /* nproc */
	struct pollfd *pf;  /* 2 * nproc: each worker's stdout and stderr */
	int running;        /* workers not yet reaped */
	int failed;         /* the first rank to fail, nproc if interrupted, else -1 */
	double failed_at;   /* when failed was set */
	double termed_at;   /* when SIGTERM went out, -1 before */
	double grace;       /* seconds the others get to report before SIGTERM */
	char *why;
	size_t whylen;
} run_state;

/* Forks the workers; a fork that fails fails the attempt at once. */
static void start_workers(run_state *rs, char *const argv[], int port, int listen_fd, int attempt,
			  int live)
{
	const loom_launch_options *o = rs->o;
	worker *w = rs->w;
	int k;

	for (k = 0; k < o->nproc; k++) {
		int fd[2] = { -1, -1 };

		w[k].out[0].fd = w[k].out[1].fd = -1;
		w[k].out[0].to = stdout;
		w[k].out[1].to = stderr;
		w[k].pid = spawn(o, argv, k, port, listen_fd, attempt, live, fd);
		if (w[k].pid < 0) {
			snprintf(rs->why, rs->whylen, "cannot start rank %d: %s", k,
				 strerror(errno));
			rs->failed = k;
			rs->failed_at = loom_comm_now();
			rs->grace = 0;
			break;
		}
		w[k].out[0].fd = fd[0];
		w[k].out[1].fd = fd[1];
		w[k].running = 1;
		rs->running++;
	}
}

/* Points the poll entries at the streams still open; returns how many. */
static int arm_polls(run_state *rs)
{
	int open = 0, i;

	for (i = 0; i < 2 * rs->o->nproc; i++) {
		rs->pf[i].fd = rs->w[i / 2].out[i % 2].fd;
		rs->pf[i].events = POLLIN;
		rs->pf[i].revents = 0;
		open += rs->pf[i].fd >= 0;
	}
	return open;
}

/* Waits up to 50 ms for output and passes on what came. */
static void pump_streams(run_state *rs)
{
	int i;

	poll(rs->pf, 2 * (nfds_t)rs->o->nproc, 50);
	for (i = 0; i < 2 * rs->o->nproc; i++)
		if (rs->pf[i].fd >= 0 && (rs->pf[i].revents & (POLLIN | POLLHUP | POLLERR)))
			drain(&rs->w[i / 2].out[i % 2], i / 2);
}

/* Reaps the workers that ended; the first to end badly fails the attempt. */
static void reap_workers(run_state *rs)
{
	worker *w = rs->w;
	int k;

	for (k = 0; k < rs->o->nproc; k++) {
		int st;

		if (!w[k].running || waitpid(w[k].pid, &st, WNOHANG) != w[k].pid)
			continue;
		w[k].running = 0;
		w[k].status = st;
		rs->running--;
		/* Killed by a signal, it left its progress file behind. */
		loom_progress_remove((unsigned)w[k].pid);
		if (rs->failed < 0 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
			char how[96];

			describe_end(st, how, sizeof(how));
			rs->failed = k;
			rs->failed_at = loom_comm_now();
			snprintf(rs->why, rs->whylen, "rank %d %s", k, how);
			if (rs->running)
				loom_log("launch: rank %d %s; stopping the other %d worker%s\n", k,
					 how, rs->running, rs->running > 1 ? "s" : "");
		}
	}
}

/* After a failure or a signal: SIGTERM once the grace is over, SIGKILL
 * 3 s later. The others first get a chance to report their own error. */
static void stop_workers(run_state *rs)
{
	double now;

	if (interrupted && rs->failed < 0) {
		rs->failed = rs->o->nproc;
		rs->failed_at = loom_comm_now();
		rs->grace = 0;
		snprintf(rs->why, rs->whylen, "interrupted by signal %d", (int)interrupted);
	}
	if (rs->failed < 0 || !rs->running)
		return;
	now = loom_comm_now();
	if (rs->termed_at < 0 && now - rs->failed_at >= rs->grace) {
		signal_all(rs->w, rs->o->nproc, SIGTERM);
		rs->termed_at = now;
	} else if (rs->termed_at >= 0 && now - rs->termed_at >= 3.0) {
		signal_all(rs->w, rs->o->nproc, SIGKILL);
		rs->termed_at = now + 1e9;
	}
}

/* Workers gone but a grandchild holds the pipe: stop waiting. */
static void drop_orphan_streams(run_state *rs)
{
	int i;

	if (rs->running)
		return;
	for (i = 0; i < 2 * rs->o->nproc; i++) {
		stream *s = &rs->w[i / 2].out[i % 2];

		if (s->fd >= 0 && !(rs->pf[i].revents & POLLIN)) {
			kill(-rs->w[i / 2].pid, SIGKILL);
			close(s->fd);
			s->fd = -1;
		}
	}
}

/* The first rank to fail may only be the one that noticed: say whom it
 * named. */
static void name_blamed(run_state *rs)
{
	char own[16], first[1024];

	if (rs->failed < 0 || rs->failed >= rs->o->nproc || blame_by < 0)
		return;
	snprintf(own, sizeof(own), "rank %d ", rs->failed);
	if (strncmp(blame, own, strlen(own))) {
		snprintf(first, sizeof(first), "%s", rs->why);
		snprintf(rs->why, rs->whylen, "%s (reported by rank %d; %s)", blame, blame_by,
			 first);
	}
}

/* One attempt: 0 when every worker exited 0; else 1 and why in buf. */
static int run_once(const loom_launch_options *o, char *const argv[], int port, int listen_fd,
		    int attempt, int live, char *why, size_t whylen)
{
	run_state rs = {
		.o = o,
		.w = calloc((size_t)o->nproc, sizeof(worker)),
		.pf = calloc(2 * (size_t)o->nproc, sizeof(struct pollfd)),
		.failed = -1,
		.failed_at = -1,
		.termed_at = -1,
		.grace = o->grace_s > 0 ? o->grace_s : 3.0,
		.why = why,
		.whylen = whylen,
	};

	if (!rs.w || !rs.pf) {
		if (listen_fd >= 0)
			close(listen_fd);
		snprintf(why, whylen, "out of memory");
		free(rs.w);
		free(rs.pf);
		return 1;
	}
	blame_by = -1;
	blame[0] = 0;
	start_workers(&rs, argv, port, listen_fd, attempt, live);
	/* Rank 0 has its own copy now: a connection to the port after rank 0
	 * is gone is refused, not queued here. */
	if (listen_fd >= 0)
		close(listen_fd);

	for (;;) {
		int open = arm_polls(&rs);

		if (!rs.running && !open)
			break;
		pump_streams(&rs);
		reap_workers(&rs);
		stop_workers(&rs);
		drop_orphan_streams(&rs);
	}
	name_blamed(&rs);
	free(rs.w);
	free(rs.pf);
	return rs.failed >= 0;
}

int loom_launch(const loom_launch_options *o, char *const argv[])
{
	struct sigaction sa, old_int, old_term;
	int attempt, port, rc = 1, live[2] = { -1, -1 };
	char why[1024] = "";

	if (!o || o->nproc < 1 || o->max_restarts < 0 || !argv || !argv[0]) {
		loom_log("launch: bad options\n");
		return 2;
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, &old_int);
	sigaction(SIGTERM, &sa, &old_term);
	interrupted = 0;
	/* The workers' liveness pipe: nothing is ever written; they see EOF
	 * when the launcher is gone. Without it they still have the
	 * parent-death signal. */
	if (pipe2(live, O_CLOEXEC))
		live[0] = live[1] = -1;
	for (attempt = 0; attempt <= o->max_restarts; attempt++) {
		/* A fresh port each attempt: the old one may linger in TIME_WAIT. */
		int listen_fd = -1;

		port = o->master_port ? o->master_port : free_port(&listen_fd);
		rc = run_once(o, argv, port, listen_fd, attempt, live[0], why, sizeof(why));
		if (!rc || interrupted)
			break;
		if (attempt < o->max_restarts)
			loom_log("launch: %s; restarting all %d workers (restart %d of %d)\n",
				why, o->nproc, attempt + 1, o->max_restarts);
	}
	if (rc)
		loom_log("launch: failed: %s%s\n", why,
			o->max_restarts && !interrupted ? " (no restarts left)" : "");
	sigaction(SIGINT, &old_int, NULL);
	sigaction(SIGTERM, &old_term, NULL);
	if (live[0] >= 0) {
		close(live[0]);
		close(live[1]);
	}
	return rc ? 1 : 0;
}

/* ------------------------------------------------------------ the worker */

static int live_fd = -1;
static pid_t live_launcher;
static char live_rank[16]; /* RANK, read before the thread starts (getenv races setenv) */

/* The worker's watcher: blocks on the liveness pipe until EOF (the
 * launcher is gone), then says so on stderr and in the progress file and
 * ends the process at once, from this thread: the main thread gets no
 * chance to take another step or save a checkpoint. */
static void *watch_launcher(void *arg)
{
	struct pollfd p = { live_fd, POLLIN, 0 };
	const char *rank = live_rank[0] ? live_rank : NULL;
	char why[160], c;

	(void)arg;
	for (;;) {
		ssize_t n;

		if (poll(&p, 1, -1) < 0 && errno != EINTR)
			break;
		n = read(live_fd, &c, 1);
		if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
			break;
	}
	snprintf(why, sizeof(why), "stopped: its launcher (pid %d) is gone", (int)live_launcher);
	loom_progress_abandon(why);
	loom_log("%s%s%s%s; stopping now, without saving\n", rank ? "rank " : "",
		rank ? rank : "", rank ? ": " : "", why);
	_exit(1);
	return NULL;
}

/* A worker of loom's launcher: starts the watcher. The parent-death
 * signal becomes SIGCONT: the watcher names why and cleans up (SIGKILL
 * would end the process first), and a stopped worker is woken to do so. */
static void worker_watch(void)
{
	const char *fd = loom_env("LOOM_LAUNCH_LIVE_FD"), *lp = loom_env("LOOM_LAUNCH_PID");
	pthread_attr_t a;
	pthread_t t;
	int ok;

	struct stat sb;

	if (!fd || !lp || live_fd >= 0)
		return;
	live_fd = atoi(fd);
	live_launcher = (pid_t)atoi(lp);
	snprintf(live_rank, sizeof(live_rank), "%s", loom_env("RANK") ? loom_env("RANK") : "");
	/* Not for what this worker starts in turn: its fd is closed there. */
	unsetenv("LOOM_LAUNCH_LIVE_FD");
	unsetenv("LOOM_LAUNCH_PID");
	if (live_fd < 0 || fstat(live_fd, &sb) || !S_ISFIFO(sb.st_mode) ||
	    fcntl(live_fd, F_SETFD, FD_CLOEXEC)) {
		live_fd = -1;
		return;
	}
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	ok = !pthread_create(&t, &a, watch_launcher, NULL);
	pthread_attr_destroy(&a);
	if (ok)
		prctl(PR_SET_PDEATHSIG, SIGCONT);
}

/* Takes "--name V" or "--name=V" out of argv; 1 if found, -1 if malformed. */
static int take_flag(int *argc, char **argv, const char *name, int lo, int *out)
{
	size_t nl = strlen(name);
	char err[256];
	int k;

	for (k = 1; k < *argc; k++) {
		const char *v = NULL;
		int used = 1, j;

		if (!strcmp(argv[k], name)) {
			if (k + 1 >= *argc) {
				loom_log("%s expects a number\n", name);
				return -1;
			}
			v = argv[k + 1];
			used = 2;
		} else if (!strncmp(argv[k], name, nl) && argv[k][nl] == '=') {
			v = argv[k] + nl + 1;
		} else {
			continue;
		}
		if (loom_comm_parse_int(name, v, lo, 4096, out, err, sizeof(err))) {
			loom_log("%s\n", err);
			return -1;
		}
		for (j = k; j + used <= *argc; j++)
			argv[j] = argv[j + used];
		*argc -= used;
		return 1;
	}
	return 0;
}

int loom_launch_maybe(int *argc, char **argv)
{
	loom_launch_options o;
	int have_n, have_k;

	loom_comm_error_file_arm(); /* under torchrun: errors reach its report */
	loom_comm_agent_arm();      /* under torchrun: dies with its agent */
	memset(&o, 0, sizeof(o));
	have_n = take_flag(argc, argv, "--nproc", 1, &o.nproc);
	have_k = take_flag(argc, argv, "--max-restarts", 0, &o.max_restarts);
	if (have_n < 0 || have_k < 0)
		return 2;
	if (have_k > 0 && have_n <= 0) {
		loom_log("--max-restarts needs --nproc\n");
		return 2;
	}
	if (loom_env("LOOM_LAUNCH_WORKER")) {
		worker_watch();
		return -1;
	}
	if (have_n <= 0)
		return -1;
	/* Already one rank of a group: N more each would form groups of their
	 * own on the same ports and die of it without a reason. */
	if (loom_env("OMPI_COMM_WORLD_SIZE") || loom_env("RANK") || loom_env("WORLD_SIZE")) {
		loom_log("--nproc %d: this process is already one rank of a group (started by "
			"%s): start it either with --nproc or with %s, not both\n",
			o.nproc,
			loom_env("OMPI_COMM_WORLD_SIZE") ? "mpirun: OMPI_COMM_WORLD_SIZE is set"
						       : "torchrun: RANK or WORLD_SIZE is set",
			loom_env("OMPI_COMM_WORLD_SIZE") ? "mpirun" : "torchrun");
		return 2;
	}
	/* One task of an srun step of several: each task would start N of its
	 * own. (A step of one task, or a batch script, may start N.) */
	const char *ntasks = loom_env("SLURM_NTASKS");
	if (loom_env("SLURM_STEP_NODELIST") && loom_env("SLURM_PROCID") && ntasks && atoi(ntasks) > 1) {
		loom_log("--nproc %d: this process is already one of the %s tasks of an srun step "
			"(SLURM_PROCID %s): start it either with --nproc (srun -n 1) or with srun -n "
			"N, not both\n",
			o.nproc, ntasks, loom_env("SLURM_PROCID"));
		return 2;
	}
	return loom_launch(&o, argv);
}
