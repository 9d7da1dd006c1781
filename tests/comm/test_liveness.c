/*
 * tests/comm/test_liveness.c — how the wait's watchdog (comm/progress.c)
 * tells that a peer on this host has ended, without sockets or a group: a
 * child that exited but is not reaped (a zombie: its pid and start time
 * still read as before) has ended, so a dead rank whose parent never reaps
 * it is named within a second, not after the whole timeout.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm_internal.h"

/* A child that waits on a pipe and exits when it closes. */
static pid_t child(int *release)
{
	int p[2];
	pid_t pid;
	char c;

	cr_assert_eq(pipe(p), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(p[1]);
		while (read(p[0], &c, 1) < 0)
			;
		_exit(0);
	}
	close(p[0]);
	*release = p[1];
	return pid;
}

Test(liveness, a_child_that_exited_unreaped_has_ended)
{
	siginfo_t si;
	uint64_t t;
	int release;
	pid_t pid = child(&release);

	t = loom_proc_start((unsigned)pid);
	cr_assert_neq(t, 0, "the child's start time is readable");
	cr_assert_not(loom_proc_ended((unsigned)pid, t), "a live child has not ended");
	close(release);
	/* Until it has exited, without reaping it: it is a zombie now. */
	cr_assert_eq(waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT), 0);
	cr_assert_eq(loom_proc_start((unsigned)pid), t, "a zombie keeps its start time");
	cr_assert(loom_proc_ended((unsigned)pid, t), "exited but not reaped: ended");
	cr_assert_eq(waitpid(pid, NULL, 0), pid);
	cr_assert(loom_proc_ended((unsigned)pid, t), "reaped: ended");
}

Test(liveness, a_pid_that_names_another_process_has_ended)
{
	uint64_t t = loom_proc_start((unsigned)getpid());

	cr_assert_neq(t, 0);
	cr_assert_not(loom_proc_ended((unsigned)getpid(), t), "this process lives");
	cr_assert(loom_proc_ended((unsigned)getpid(), t + 1),
		  "the pid now names a process that started at another time");
}

Test(liveness, a_stopped_child_lives)
{
	uint64_t t;
	int release;
	pid_t pid = child(&release);

	t = loom_proc_start((unsigned)pid);
	kill(pid, SIGSTOP);
	cr_assert_eq(waitpid(pid, NULL, WUNTRACED), pid);
	cr_assert_not(loom_proc_ended((unsigned)pid, t), "stopped is alive (the timeout decides)");
	kill(pid, SIGKILL);
	cr_assert_eq(waitpid(pid, NULL, 0), pid);
}
