/*
 * examples/flags.c — the rows of base/options.def that name a flag, read
 * the one way every program reads them: the same parse, range check and
 * message for a row wherever it is taken, and --help written from the rows.
 */
#include "examples/flags.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const flag_info flag_rows[FLAG_ROW_COUNT] = {
#define OPT(id, flag, env, type, choices, lo, hi, def, layer, agree, doc) \
	[FLAG_##id] = { flag, env, type, choices, lo, hi, def, layer, agree, doc },
#include "base/options.def"
#undef OPT
};

/* A range's end at or past this is open. */
#define OPEN_END 1e308

void flags_say(char *msg, size_t msglen, const char *fmt, ...)
{
	va_list ap;

	if (!msg || !msglen)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, msglen, fmt, ap);
	va_end(ap);
}

/* The k-th of "a|b|c" (its length in *n), or NULL past the last. */
static const char *choice_at(const char *choices, int k, size_t *n)
{
	const char *s = choices;

	for (; s && k > 0; k--) {
		s = strchr(s, '|');
		s = s ? s + 1 : NULL;
	}
	if (s)
		*n = strcspn(s, "|");
	return s;
}

/* "a, b or c" */
static void choices_text(const char *choices, char *buf, size_t len)
{
	const char *s;
	size_t n, at = 0;

	buf[0] = 0;
	for (int k = 0; (s = choice_at(choices, k, &n)); k++) {
		const char *sep = !k ? "" : choice_at(choices, k + 1, &(size_t){ 0 }) ? ", " : " or ";
		if (at < len)
			at += snprintf(buf + at, len - at, "%s%.*s", sep, (int)n, s);
	}
}

static int read_int(const flag_info *r, const char *s, flag_parsed *v, char *msg, size_t msglen)
{
	char *end;

	errno = 0;
	long long x = strtoll(s, &end, 10);
	if (errno || end == s || *end || x < r->lo || x > r->hi) {
		flags_say(msg, msglen, "%s expects an integer in [%.0f, %.0f], got '%s'", r->flag, r->lo,
		    r->hi, s);
		return -1;
	}
	v->i = x;
	return 0;
}

static int read_real(const flag_info *r, const char *s, flag_parsed *v, char *msg, size_t msglen)
{
	char *end, range[64] = "";

	errno = 0;
	double x = strtod(s, &end);
	if (!errno && end != s && !*end && isfinite(x) && x >= r->lo && x <= r->hi) {
		v->x = x;
		return 0;
	}
	if (r->lo > -OPEN_END && r->hi < OPEN_END)
		snprintf(range, sizeof(range), " in [%g, %g]", r->lo, r->hi);
	else if (r->lo > -OPEN_END)
		snprintf(range, sizeof(range), " >= %g", r->lo);
	else if (r->hi < OPEN_END)
		snprintf(range, sizeof(range), " <= %g", r->hi);
	flags_say(msg, msglen, "%s expects a number%s, got '%s'", r->flag, range, s);
	return -1;
}

static int read_choice(const flag_info *r, const char *s, flag_parsed *v, char *msg, size_t msglen)
{
	const char *c;
	size_t n;
	char list[256];

	for (int k = 0; (c = choice_at(r->choices, k, &n)); k++)
		if (strlen(s) == n && !strncasecmp(s, c, n)) {
			v->choice = k;
			return 0;
		}
	choices_text(r->choices, list, sizeof(list));
	flags_say(msg, msglen, "%s must be %s, got '%s'", r->flag, list, s);
	return -1;
}

/* arg read by row's type and range-checked: 0, or -1 with msg set. */
static int read_value(int row, const char *arg, flag_parsed *v, char *msg, size_t msglen)
{
	const flag_info *r = &flag_rows[row];

	*v = (flag_parsed){ .i = 1, .s = arg };
	switch (r->type) {
	case OPT_INT: return read_int(r, arg, v, msg, msglen);
	case OPT_REAL: return read_real(r, arg, v, msg, msglen);
	case OPT_CHOICE: return read_choice(r, arg, v, msg, msglen);
	default: return 0;
	}
}

static void store(const flag_place *pl, void *base, const flag_parsed *v)
{
	char *field = (char *)base + pl->offset;
	int i;
	int64_t l;

	switch (flag_rows[pl->row].type) {
	case OPT_INT:
		if (pl->size == sizeof(int64_t)) {
			l = v->i;
			memcpy(field, &l, sizeof(l));
		} else {
			i = (int)v->i;
			memcpy(field, &i, sizeof(i));
		}
		break;
	case OPT_REAL: memcpy(field, &v->x, sizeof(v->x)); break;
	case OPT_STR:
	case OPT_PATH: memcpy(field, &v->s, sizeof(v->s)); break;
	case OPT_BOOL:
		i = pl->values ? pl->values[0] : 1;
		memcpy(field, &i, sizeof(i));
		break;
	case OPT_CHOICE:
		i = pl->values ? pl->values[v->choice] : v->choice;
		memcpy(field, &i, sizeof(i));
		break;
	}
}

const flag_place *flags_place(unsigned prog, const flag_target *t, size_t nt, int row, size_t *k)
{
	for (size_t j = 0; j < nt; j++)
		for (size_t i = 0; i < t[j].n; i++)
			if (t[j].places[i].row == row && (t[j].places[i].programs & prog)) {
				if (k)
					*k = j;
				return &t[j].places[i];
			}
	return NULL;
}

int flags_row(unsigned prog, const flag_target *t, size_t nt, const char *name)
{
	for (int row = 0; row < FLAG_ROW_COUNT; row++)
		if (flag_rows[row].flag && !strcmp(flag_rows[row].flag + 2, name) &&
		    flags_place(prog, t, nt, row, NULL))
			return row;
	return -1;
}

/* Row's argument into its place for prog: 0, or -1 with msg set. */
static int set_row(unsigned prog, const flag_target *t, size_t nt, int row, const char *arg,
		   char *msg, size_t msglen)
{
	size_t k = 0;
	const flag_place *pl = flags_place(prog, t, nt, row, &k);
	flag_parsed v;

	if (!pl) {
		flags_say(msg, msglen, "unknown option '%s'", flag_rows[row].flag);
		return -1;
	}
	if (read_value(row, arg, &v, msg, msglen))
		return -1;
	if (t[k].given)
		t[k].given[row] = 1;
	if (pl->set)
		return pl->set(t[k].base, &v, msg, msglen);
	if (pl->size)
		store(pl, t[k].base, &v);
	return 0;
}

int flags_set(unsigned prog, const flag_target *t, size_t nt, const char *name, const char *arg,
	      char *msg, size_t msglen)
{
	int row = flags_row(prog, t, nt, name);

	if (row < 0) {
		flags_say(msg, msglen, "unknown option '--%s'", name);
		return -1;
	}
	if (flag_rows[row].type != OPT_BOOL && !arg) {
		flags_say(msg, msglen, "--%s expects a value", name);
		return -1;
	}
	return set_row(prog, t, nt, row, arg, msg, msglen);
}

/* --help or -h before any "--": help, whatever else is there. */
static int wants_help(int argc, char **argv)
{
	for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
			return 1;
	return 0;
}

int flags_parse(unsigned prog, const flag_target *t, size_t nt, int argc, char **argv,
		char *msg, size_t msglen)
{
	struct option opts[FLAG_ROW_COUNT + 1];
	size_t n = 0;
	int c;

	flags_say(msg, msglen, "%s", "");
	if (wants_help(argc, argv))
		return FLAGS_HELP;
	for (int row = 0; row < FLAG_ROW_COUNT; row++)
		if (flag_rows[row].flag && flags_place(prog, t, nt, row, NULL))
			opts[n++] = (struct option){ flag_rows[row].flag + 2,
						     flag_rows[row].type == OPT_BOOL ?
							     no_argument : required_argument,
						     NULL, 256 + row };
	opts[n] = (struct option){ 0, 0, 0, 0 };
	opterr = 0;
	/* 0, not 1: glibc then starts afresh, so a second call parses too. */
	optind = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c < 256) {
			flags_say(msg, msglen, "unknown or incomplete option '%s' (see --help)",
			    optind > 1 ? argv[optind - 1] : "?");
			return FLAGS_BAD;
		}
		if (set_row(prog, t, nt, c - 256, optarg, msg, msglen))
			return FLAGS_BAD;
	}
	if (optind < argc) {
		flags_say(msg, msglen, "unexpected argument '%s' (see --help)", argv[optind]);
		return FLAGS_BAD;
	}
	return FLAGS_RUN;
}

const char *flags_arg_name(int row)
{
	switch (flag_rows[row].type) {
	case OPT_INT: return "N";
	case OPT_REAL: return "X";
	case OPT_STR: return "S";
	case OPT_PATH: return "PATH";
	case OPT_CHOICE: return flag_rows[row].choices;
	default: return "";
	}
}

/* The field's value as a flag would write it; 0 when no flag writes it
 * (none, or a stand-in for "the engine's default"). */
static int field_text(const flag_place *pl, const char *field, char *buf, size_t len)
{
	const flag_info *r = &flag_rows[pl->row];
	const char *s, *c;
	int i;
	int64_t l;
	double x;
	size_t n;

	switch (r->type) {
	case OPT_INT:
		if (pl->size == sizeof(int64_t))
			memcpy(&l, field, sizeof(l));
		else
			memcpy(&i, field, sizeof(i)), l = i;
		return l >= r->lo && l <= r->hi && snprintf(buf, len, "%lld", (long long)l) > 0;
	case OPT_REAL:
		memcpy(&x, field, sizeof(x));
		return x >= r->lo && x <= r->hi && snprintf(buf, len, "%g", x) > 0;
	case OPT_STR:
	case OPT_PATH:
		memcpy(&s, field, sizeof(s));
		return s && snprintf(buf, len, "%s", s) > 0;
	case OPT_CHOICE:
		memcpy(&i, field, sizeof(i));
		for (int k = 0; (c = choice_at(r->choices, k, &n)); k++)
			if ((pl->values ? pl->values[k] : k) == i)
				return snprintf(buf, len, "%.*s", (int)n, c) > 0;
		return 0;
	default:
		return 1; /* a switch: no default to print */
	}
}

void flags_default_text(const flag_place *pl, const void *base, char *buf, size_t len)
{
	const char *def = flag_rows[pl->row].def;

	buf[0] = 0;
	if (pl->size && !pl->set && field_text(pl, (const char *)base + pl->offset, buf, len))
		return;
	snprintf(buf, len, "%s", def ? def : "");
}

/* s's words from column col on, wrapped before column 80. */
static void wrap(FILE *f, const char *s, int col)
{
	int at = col;

	while (*s) {
		int w = (int)strcspn(s, " ");
		if (at > col && at + 1 + w >= 80) {
			fprintf(f, "\n%*s", col, "");
			at = col;
		} else if (at > col) {
			fputc(' ', f);
			at++;
		}
		fwrite(s, 1, (size_t)w, f);
		at += w;
		s += w;
		s += strspn(s, " ");
	}
	fputc('\n', f);
}

void flags_usage(unsigned prog, const flag_target *t, size_t nt, FILE *f)
{
	char head[96], def[256], text[1024];
	const flag_place *pl;
	size_t k;

	for (int row = 0; row < FLAG_ROW_COUNT; row++) {
		const flag_info *r = &flag_rows[row];
		if (!r->flag || !(pl = flags_place(prog, t, nt, row, &k)))
			continue;
		flags_default_text(pl, t[k].base, def, sizeof(def));
		snprintf(head, sizeof(head), "  %s%s%s", r->flag, r->type == OPT_BOOL ? "" : " ",
			 flags_arg_name(row));
		snprintf(text, sizeof(text), "%s%s%s%s", r->doc, def[0] ? " (default " : "", def,
			 def[0] ? ")" : "");
		if (strlen(head) < 22)
			fprintf(f, "%-23s", head);
		else
			fprintf(f, "%s\n%23s", head, "");
		wrap(f, text, 23);
	}
}
