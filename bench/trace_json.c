/*
 * bench/trace_json.c — a strict JSON reader just large enough for loom's
 * traces: recursive descent over the whole file (objects, arrays, strings
 * with escapes, numbers, literals), keeping only the fields of each object
 * in the top-level "traceEvents" array.
 */
#include <ctype.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/trace_json.h"

typedef struct parser {
	const char *s;
	size_t at, len;
	char *err;
	size_t errlen;
	int failed;
	loom_tj *out;
	int cap;
} parser;

static int fail(parser *p, const char *fmt, ...)
{
	if (!p->failed) {
		va_list ap;
		int k = snprintf(p->err, p->errlen, "offset %zu: ", p->at);
		va_start(ap, fmt);
		vsnprintf(p->err + k, p->errlen > (size_t)k ? p->errlen - k : 0, fmt, ap);
		va_end(ap);
	}
	p->failed = 1;
	return -1;
}

static void ws(parser *p)
{
	while (p->at < p->len && strchr(" \t\r\n", p->s[p->at]))
		p->at++;
}

static int peek(parser *p)
{
	ws(p);
	return p->at < p->len ? (unsigned char)p->s[p->at] : -1;
}

static int expect(parser *p, char c)
{
	if (peek(p) != c)
		return fail(p, "expected '%c'", c);
	p->at++;
	return 0;
}

/* A string into buf (truncated to len; escapes kept as their character,
 * \u as '?'). */
static int string(parser *p, char *buf, size_t len)
{
	size_t k = 0;
	if (expect(p, '"'))
		return -1;
	while (p->at < p->len) {
		unsigned char c = (unsigned char)p->s[p->at++];
		if (c == '"') {
			if (len)
				buf[k < len ? k : len - 1] = 0;
			return 0;
		}
		if (c < 0x20)
			return fail(p, "control character in a string");
		if (c == '\\') {
			if (p->at >= p->len)
				break;
			c = (unsigned char)p->s[p->at++];
			if (c == 'u') {
				for (int i = 0; i < 4; i++)
					if (p->at >= p->len || !isxdigit((unsigned char)p->s[p->at++]))
						return fail(p, "bad \\u escape");
				c = '?';
			} else if (!strchr("\"\\/bfnrt", c)) {
				return fail(p, "bad escape \\%c", c);
			}
		}
		if (k + 1 < len)
			buf[k++] = (char)c;
	}
	return fail(p, "unterminated string");
}

static int number(parser *p, double *out)
{
	ws(p);
	const char *b = p->s + p->at;
	char *e;
	/* JSON's grammar, stricter than strtod: no leading '+', no hex, no inf. */
	size_t i = 0;
	if (b[i] == '-')
		i++;
	if (!isdigit((unsigned char)b[i]))
		return fail(p, "expected a value");
	*out = strtod(b, &e);
	if (e == b)
		return fail(p, "bad number");
	for (const char *q = b; q < e; q++)
		if (!strchr("0123456789+-.eE", *q))
			return fail(p, "bad number");
	p->at += (size_t)(e - b);
	return 0;
}

static int value(parser *p, int depth, int in_events);

typedef int (*member_fn)(parser *p, const char *key, void *ctx);

/* An object: for each member its key and ':' are read, then member() reads
 * the value. */
static int object(parser *p, member_fn member, void *ctx)
{
	char key[32];
	if (expect(p, '{'))
		return -1;
	if (peek(p) == '}') {
		p->at++;
		return 0;
	}
	for (;;) {
		if (string(p, key, sizeof(key)) || expect(p, ':') || member(p, key, ctx))
			return -1;
		if (peek(p) != ',')
			return expect(p, '}');
		p->at++;
	}
}

/* A member's value as a number into *num: 1; a value of another kind
 * read past: 0; -1 on a parse error. */
static int number_member(parser *p, double *num)
{
	int c = peek(p);
	if (c != '-' && !isdigit(c))
		return value(p, 3, 0) ? -1 : 0;
	return number(p, num) ? -1 : 1;
}

/* The numeric members kept, by key: where in the event, int or double. */
typedef struct num_field {
	const char *key;
	size_t off;
	int is_int;
} num_field;

static const num_field event_nums[] = {
	{ "pid", offsetof(loom_tj_event, pid), 1 },
	{ "tid", offsetof(loom_tj_event, tid), 1 },
	{ "ts", offsetof(loom_tj_event, ts), 0 },
	{ "dur", offsetof(loom_tj_event, dur), 0 },
	{ NULL, 0, 0 },
};

static const num_field arg_nums[] = {
	{ "run", offsetof(loom_tj_event, run), 1 },
	{ "bucket", offsetof(loom_tj_event, bucket), 1 },
	{ "node", offsetof(loom_tj_event, node), 1 },
	{ NULL, 0, 0 },
};

/* num into e's member named key when fields has it; else nothing. */
static void set_num(loom_tj_event *e, const num_field *fields, const char *key, double num)
{
	for (const num_field *f = fields; f->key; f++)
		if (!strcmp(key, f->key)) {
			if (f->is_int)
				*(int *)((char *)e + f->off) = (int)num;
			else
				*(double *)((char *)e + f->off) = num;
			return;
		}
}

/* A member of an event's "args": run, bucket and node kept. */
static int arg_member(parser *p, const char *key, void *ctx)
{
	loom_tj_event *e = ctx;
	double num;
	int got = number_member(p, &num);
	if (got <= 0)
		return got;
	set_num(e, arg_nums, key, num);
	return 0;
}

/* A member of an event: name, cat, ph, pid, tid, ts, dur and args kept. */
static int event_member(parser *p, const char *key, void *ctx)
{
	loom_tj_event *e = ctx;
	int c = peek(p);
	char sv[96];
	double num;
	if (!strcmp(key, "args") && c == '{')
		return object(p, arg_member, e);
	if (c == '"') {
		if (string(p, sv, sizeof(sv)))
			return -1;
		if (!strcmp(key, "name"))
			snprintf(e->name, sizeof(e->name), "%s", sv);
		else if (!strcmp(key, "cat"))
			snprintf(e->cat, sizeof(e->cat), "%s", sv);
		else if (!strcmp(key, "ph"))
			e->ph = sv[0];
		return 0;
	}
	int got = number_member(p, &num);
	if (got <= 0)
		return got;
	set_num(e, event_nums, key, num);
	return 0;
}

/* One event object: the known keys are kept, every value is parsed. */
static int event(parser *p)
{
	if (p->out->n == p->cap) {
		int cap = p->cap ? 2 * p->cap : 256;
		loom_tj_event *ev = realloc(p->out->ev, sizeof(*ev) * (size_t)cap);
		if (!ev)
			return fail(p, "out of memory");
		p->out->ev = ev;
		p->cap = cap;
	}
	loom_tj_event *e = &p->out->ev[p->out->n];
	memset(e, 0, sizeof(*e));
	e->pid = e->tid = e->run = e->bucket = e->node = -1;
	e->ts = e->dur = -1;
	if (object(p, event_member, e))
		return -1;
	p->out->n++;
	return 0;
}

/* A member of any other object; the top-level object's traceEvents holds
 * the events. */
static int value_member(parser *p, const char *key, void *ctx)
{
	int depth = *(const int *)ctx;
	return value(p, depth + 1, depth == 0 && !strcmp(key, "traceEvents"));
}

static int value(parser *p, int depth, int in_events)
{
	char str[32];
	int c = peek(p);
	if (depth > 64)
		return fail(p, "nested too deep");
	if (c == '{')
		return object(p, value_member, &depth);
	if (c == '[') {
		p->at++;
		if (peek(p) == ']') {
			p->at++;
			return 0;
		}
		for (;;) {
			if (in_events ? event(p) : value(p, depth + 1, 0))
				return -1;
			if (peek(p) != ',')
				return expect(p, ']');
			p->at++;
		}
	}
	if (c == '"')
		return string(p, str, sizeof(str));
	for (const char *lit = "true\0false\0null\0"; *lit; lit += strlen(lit) + 1)
		if (p->len - p->at >= strlen(lit) && !strncmp(p->s + p->at, lit, strlen(lit))) {
			p->at += strlen(lit);
			return 0;
		}
	double num;
	return number(p, &num);
}

int loom_tj_load(const char *path, loom_tj *out, char *err, size_t errlen)
{
	memset(out, 0, sizeof(*out));
	FILE *f = fopen(path, "rb");
	if (!f) {
		snprintf(err, errlen, "cannot open %s", path);
		return -1;
	}
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *buf = malloc(n > 0 ? (size_t)n + 1 : 1);
	if (!buf || n < 0 || fread(buf, 1, (size_t)n, f) != (size_t)n) {
		fclose(f);
		free(buf);
		snprintf(err, errlen, "cannot read %s", path);
		return -1;
	}
	fclose(f);
	buf[n] = 0;
	parser p = { .s = buf, .len = (size_t)n, .err = err, .errlen = errlen, .out = out };
	int rc = peek(&p) == '{' ? value(&p, 0, 0) : fail(&p, "the trace is not a JSON object");
	if (!rc && peek(&p) != -1)
		rc = fail(&p, "text after the JSON value");
	free(buf);
	if (rc)
		loom_tj_free(out);
	return rc ? -1 : 0;
}

void loom_tj_free(loom_tj *t)
{
	free(t->ev);
	memset(t, 0, sizeof(*t));
}
