/*
 * examples/outputs.h — what a training run writes, made safe before step 1:
 * every output path checked writable with the real reason, and one job per
 * checkpoint (a lock beside it, held for the job's life). Plain POSIX, no
 * engine calls: examples/train.c calls it for its flags, a program for its
 * own (gpt_ddp's --loss-file).
 */
#ifndef LOOM_EXAMPLES_OUTPUTS_H
#define LOOM_EXAMPLES_OUTPUTS_H

#include <stddef.h>

typedef enum train_out_kind {
	/* Written to PATH.tmp then renamed over PATH (checkpoints, --export):
	 * PATH must not be a directory and its directory must take a new file. */
	TRAIN_OUT_REPLACE = 0,
	/* Opened and written in place (--metrics, --trace, --dump-plan): an
	 * existing PATH must open for writing, a new one needs its directory. */
	TRAIN_OUT_DIRECT,
} train_out_kind;

/*
 * Whether path (given as flag, "--export") can be written as kind says,
 * tried for real: a file created and removed in its directory, an existing
 * file opened for writing (without truncating it). 0, or -1 with msg:
 * "--export /: is a directory, expected a file path", "--export
 * /none/x.safetensors: directory /none: does not exist", "... cannot create
 * a file in directory /ro: Read-only file system". Touches nothing that
 * exists.
 */
int train_output_check(const char *flag, const char *path, train_out_kind kind, char *msg,
		       size_t msglen);

/* --checkpoint PATH's lock: PATH.lock, flock()ed, holding "host H pid P
 * program NAME". */
typedef struct train_lock {
	int fd;
	char path[4200];
} train_lock;

/*
 * Takes ckpt's lock for this process's life (the kernel drops it when the
 * process dies, however it dies). 0: taken; note (may be NULL) is then
 * empty, or says whose stale lock (a job that is gone) was taken over.
 * -1: refused, msg naming the job that holds it (its host and pid) or why
 * the lock file could not be made.
 */
int train_lock_take(train_lock *l, const char *ckpt, const char *program, char *msg,
		    size_t msglen, char *note, size_t notelen);

/* Removes the lock file (still holding it, so no other job can take a
 * lock on the removed file unseen) and lets it go. */
void train_lock_release(train_lock *l);

/*
 * Under `bazel run` a program starts in its runfiles tree, and Bazel names
 * the directory the user typed the command in as BUILD_WORKING_DIRECTORY.
 * Every relative path on the command line (--data, --tokens, --export,
 * --checkpoint, --metrics, --init-from, ...) is the user's, so a program
 * moves there before it reads one, and unsets the variable, so a second
 * call does nothing. Without the variable (a binary run directly, a test)
 * nothing changes. 0, or -1 with msg naming the
 * directory and why it could not be entered.
 */
int train_enter_user_dir(char *msg, size_t msglen);

#endif /* LOOM_EXAMPLES_OUTPUTS_H */
