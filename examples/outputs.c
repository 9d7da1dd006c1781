/*
 * examples/outputs.c — output paths checked before step 1 and the
 * checkpoint's lock (outputs.h).
 */
#include "examples/outputs.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/options.h"

/* The directory of path into dir: "." for a bare name, "/" for "/x". */
static int dir_of(const char *path, char *dir, size_t len)
{
	const char *slash = strrchr(path, '/');
	if (!slash)
		return snprintf(dir, len, ".") >= (int)len ? -1 : 0;
	if ((size_t)(slash - path) + 2 > len)
		return -1;
	return snprintf(dir, len, "%.*s", slash == path ? 1 : (int)(slash - path), path) >= (int)len
		       ? -1 : 0;
}

/* A new file can be made in dir: one is created there and removed. */
static int probe_dir(const char *flag, const char *path, const char *dir, char *msg, size_t msglen)
{
	struct stat sb;
	char probe[4300];
	if (stat(dir, &sb) != 0) {
		snprintf(msg, msglen, "%s %s: directory %s: %s", flag, path, dir,
			 errno == ENOENT ? "does not exist" : strerror(errno));
		return -1;
	}
	if (!S_ISDIR(sb.st_mode)) {
		snprintf(msg, msglen, "%s %s: %s is not a directory", flag, path, dir);
		return -1;
	}
	snprintf(probe, sizeof(probe), "%s/.loom-probe-XXXXXX", dir);
	int fd = mkstemp(probe);
	if (fd < 0) {
		snprintf(msg, msglen, "%s %s: cannot create a file in directory %s: %s", flag, path,
			 dir, strerror(errno));
		return -1;
	}
	close(fd);
	unlink(probe);
	return 0;
}

int train_output_check(const char *flag, const char *path, train_out_kind kind, char *msg,
		       size_t msglen)
{
	struct stat sb;
	char dir[4096];
	if (!path[0]) {
		snprintf(msg, msglen, "%s: an empty path", flag);
		return -1;
	}
	int exists = stat(path, &sb) == 0;
	if (exists && S_ISDIR(sb.st_mode)) {
		snprintf(msg, msglen, "%s %s: is a directory, expected a file path", flag, path);
		return -1;
	}
	if (dir_of(path, dir, sizeof(dir))) {
		snprintf(msg, msglen, "%s %s: path too long", flag, path);
		return -1;
	}
	if (kind == TRAIN_OUT_REPLACE || !exists)
		return probe_dir(flag, path, dir, msg, msglen);
	/* In place: opened as the writer will open it, without truncating
	 * (O_NONBLOCK: a FIFO without a reader fails instead of waiting). */
	int fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		snprintf(msg, msglen, "%s %s: cannot write it: %s", flag, path, strerror(errno));
		return -1;
	}
	close(fd);
	return 0;
}

/* What the lock file says about its holder, on one line without its
 * newline; "" if it says nothing yet. */
static void holder(int fd, char *buf, size_t len)
{
	ssize_t n = pread(fd, buf, len - 1, 0);
	buf[n > 0 ? n : 0] = 0;
	buf[strcspn(buf, "\n")] = 0;
}

int train_lock_take(train_lock *l, const char *ckpt, const char *program, char *msg,
		    size_t msglen, char *note, size_t notelen)
{
	char was[256], host[256] = "?", line[512];
	l->fd = -1;
	if (note && notelen)
		note[0] = 0;
	if (snprintf(l->path, sizeof(l->path), "%s.lock", ckpt) >= (int)sizeof(l->path)) {
		snprintf(msg, msglen, "--checkpoint %s: path too long", ckpt);
		return -1;
	}
	gethostname(host, sizeof(host) - 1);
	host[sizeof(host) - 1] = 0;
	/* A holder that lets go removes the file: a lock taken on a removed
	 * file is no lock, so take it again on the file the path names now. */
	for (int tries = 0; tries < 100; tries++) {
		struct stat held, named;
		int fd = open(l->path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
		if (fd < 0) {
			snprintf(msg, msglen, "--checkpoint %s: cannot make its lock %s: %s", ckpt,
				 l->path, strerror(errno));
			return -1;
		}
		if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
			int e = errno;
			holder(fd, was, sizeof(was));
			close(fd);
			if (e == EWOULDBLOCK)
				snprintf(msg, msglen,
					 "--checkpoint %s is in use by another job (%s), which holds "
					 "its lock %s: one job writes a checkpoint at a time; stop that "
					 "job or give this one another path",
					 ckpt, was[0] ? was : "which has not said who it is yet",
					 l->path);
			else
				snprintf(msg, msglen, "--checkpoint %s: cannot lock %s: %s", ckpt,
					 l->path, strerror(e));
			return -1;
		}
		if (fstat(fd, &held) != 0 || stat(l->path, &named) != 0 ||
		    held.st_dev != named.st_dev || held.st_ino != named.st_ino) {
			close(fd);
			continue;
		}
		/* A job that let go removed the file: anything in it is a job
		 * that died holding it. */
		holder(fd, was, sizeof(was));
		if (was[0] && note && notelen)
			snprintf(note, notelen, "--checkpoint %s: took over the lock %s of a job "
				 "that is gone (%s)", ckpt, l->path, was);
		int n = snprintf(line, sizeof(line), "host %s pid %ld program %s\n", host,
				 (long)getpid(), program);
		if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)n, 0) != n) {
			snprintf(msg, msglen, "--checkpoint %s: cannot write its lock %s: %s", ckpt,
				 l->path, strerror(errno));
			unlink(l->path);
			close(fd);
			return -1;
		}
		l->fd = fd;
		return 0;
	}
	snprintf(msg, msglen, "--checkpoint %s: its lock %s keeps being replaced", ckpt, l->path);
	return -1;
}

void train_lock_release(train_lock *l)
{
	if (!l || l->fd < 0)
		return;
	unlink(l->path);
	close(l->fd);
	l->fd = -1;
}

int train_enter_user_dir(char *msg, size_t msglen)
{
	const char *dir = loom_env("BUILD_WORKING_DIRECTORY");
	if (!dir || !*dir)
		return 0;
	if (chdir(dir)) {
		snprintf(msg, msglen, "cannot enter the directory bazel run was started in "
			 "(BUILD_WORKING_DIRECTORY=%s): %s", dir, strerror(errno));
		return -1;
	}
	/* Entered once: a later call (gpt_ddp's, then train_start's) and the
	 * workers --nproc starts, which inherit the directory, do nothing. */
	unsetenv("BUILD_WORKING_DIRECTORY");
	return 0;
}
