/*
 * comm/launch.h — the built-in launcher, for any loom program: `prog --nproc
 * N [--max-restarts K] args...` runs N copies of prog on this host with
 * torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
 * MASTER_ADDR, MASTER_PORT), prefixes each line they print with "[rank R] ",
 * and when one fails stops the others and reports which rank failed and how.
 */
#ifndef LOOM_COMM_LAUNCH_H
#define LOOM_COMM_LAUNCH_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_launch_options {
	int nproc;           /* workers, >= 1 */
	int max_restarts;    /* restart all workers after a failure, up to this many times */
	int master_port;     /* 0: a free port */
	double grace_s;      /* after a failure, the others may finish on their own this
				long (to report their own error) before SIGTERM; <= 0: 3 s */
	const char *program; /* NULL: this program (/proc/self/exe) */
} loom_launch_options;

/*
 * Runs the workers (argv: the worker's argv, argv[0] included, NULL-ended)
 * and returns the launcher's exit code: 0 when every worker of the last
 * attempt exited 0, 1 otherwise, after printing to stderr a line naming the
 * failed rank and how it ended ("rank 1 was killed by signal 9 (Killed)").
 */
int loom_launch(const loom_launch_options *o, char *const argv[]);

/*
 * For a program's main(): takes --nproc N and --max-restarts K out of argv.
 * Returns -1 when the program should go on as itself (no --nproc, or it is
 * already a worker); otherwise runs the workers and returns the exit code
 * for main to return (2 for a malformed flag, with a message on stderr).
 */
int loom_launch_maybe(int *argc, char **argv);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_COMM_LAUNCH_H */
