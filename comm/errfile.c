/*
 * comm/errfile.c — torchrun's error file: when TORCHELASTIC_ERROR_FILE is
 * set, a process that exits with a non-zero status leaves there, in the
 * JSON torchrun's agent reads (torch.distributed.elastic's ErrorHandler),
 * the last line it wrote to stderr as the message and its last lines as
 * the "traceback", so that torchrun's failure report names loom's cause
 * instead of "error_file: <N/A>".
 *
 * loom prints its errors to stderr wherever they arise, so stderr is
 * wrapped (fopencookie): every byte still goes to fd 2 unbuffered, and the
 * last lines are kept. on_exit sees the status that main returned.
 */
#define _GNU_SOURCE /* fopencookie, on_exit */
#include "comm/comm_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/options.h"

#define ERRFILE_LINES 16
#define ERRFILE_LINE_BYTES 1024
#define ERRFILES_ALL (ERRFILE_LINES * (ERRFILE_LINE_BYTES + 1))

static struct {
	char path[4096];
	char lines[ERRFILE_LINES][ERRFILE_LINE_BYTES];
	int next, count; /* ring of finished lines */
	char cur[ERRFILE_LINE_BYTES];
	size_t used;
	int armed;
} ef;

static void end_line(void)
{
	size_t n = ef.used;

	while (n && (ef.cur[n - 1] == '\r' || ef.cur[n - 1] == ' '))
		n--;
	ef.used = 0;
	if (!n)
		return;
	memcpy(ef.lines[ef.next], ef.cur, n);
	ef.lines[ef.next][n] = 0;
	ef.next = (ef.next + 1) % ERRFILE_LINES;
	if (ef.count < ERRFILE_LINES)
		ef.count++;
}

static void keep(const char *buf, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		if (buf[i] == '\n')
			end_line();
		else if (ef.used + 1 < sizeof(ef.cur))
			ef.cur[ef.used++] = buf[i];
	}
}

static ssize_t tee_write(void *cookie, const char *buf, size_t n)
{
	size_t put = 0;

	(void)cookie;
	keep(buf, n);
	while (put < n) {
		ssize_t k = write(2, buf + put, n - put);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break; /* fd 2 closed: the lines are still kept */
		put += (size_t)k;
	}
	return (ssize_t)n;
}

size_t loom_errfile_json_escape(const char *s, char *out, size_t cap)
{
	size_t o = 0;

	for (; *s && o + 7 < cap; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\') {
			out[o++] = '\\';
			out[o++] = (char)c;
		} else if (c == '\n') {
			out[o++] = '\\';
			out[o++] = 'n';
		} else if (c < 0x20 || c >= 0x7f) {
			/* Bytes above 0x7f as Latin-1 code points: the file stays
			 * valid UTF-8 JSON whatever a message held. */
			o += (size_t)snprintf(out + o, cap - o, "\\u%04x", c);
		} else {
			out[o++] = (char)c;
		}
	}
	out[o] = 0;
	return o;
}

size_t loom_errfile_json(const char *message, const char *callstack, long timestamp,
			 char *out, size_t cap)
{
	static char m[8 * ERRFILE_LINE_BYTES], c[7 * ERRFILES_ALL];
	int n;

	loom_errfile_json_escape(message, m, sizeof(m));
	loom_errfile_json_escape(callstack, c, sizeof(c));
	n = snprintf(out, cap,
		     "{\"message\": {\"message\": \"%s\", \"extraInfo\": {\"py_callstack\": "
		     "\"%s\", \"timestamp\": \"%ld\"}}}\n",
		     m, c, timestamp);
	return n < 0 || (size_t)n >= cap ? 0 : (size_t)n;
}

static void write_error_file(int status, void *arg)
{
	static char stack[ERRFILES_ALL], msg[ERRFILE_LINE_BYTES + 64];
	static char json[7 * ERRFILES_ALL + 8 * ERRFILE_LINE_BYTES + 256];
	size_t o = 0, n;
	int k, fd;

	(void)arg;
	if (status == 0)
		return;
	fflush(stderr);
	end_line();
	for (k = 0; k < ef.count; k++) {
		const char *l = ef.lines[(ef.next - ef.count + k + ERRFILE_LINES) % ERRFILE_LINES];

		o += (size_t)snprintf(stack + o, sizeof(stack) - o, "%s%s", k ? "\n" : "", l);
	}
	if (ef.count)
		snprintf(msg, sizeof(msg), "%s",
			 ef.lines[(ef.next - 1 + ERRFILE_LINES) % ERRFILE_LINES]);
	else
		snprintf(msg, sizeof(msg), "exited with code %d (nothing on stderr)", status);
	n = loom_errfile_json(msg, stack, (long)time(NULL), json, sizeof(json));
	fd = open(ef.path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0 || !n)
		goto out;
	if (write(fd, json, n) != (ssize_t)n) {
		/* Nothing left to tell: the exit status still reaches torchrun. */
	}
out:
	if (fd >= 0)
		close(fd);
}

void loom_comm_error_file_arm(void)
{
	cookie_io_functions_t io = { .write = tee_write };
	const char *path = loom_env("TORCHELASTIC_ERROR_FILE");
	FILE *f;

	if (ef.armed || !path || !*path || strlen(path) >= sizeof(ef.path))
		return;
	f = fopencookie(NULL, "w", io);
	if (!f)
		return;
	setvbuf(f, NULL, _IONBF, 0);
	snprintf(ef.path, sizeof(ef.path), "%s", path);
	fflush(stderr);
	stderr = f;
	if (on_exit(write_error_file, NULL) == 0)
		ef.armed = 1;
}
