/*
 * examples/flags.h — the examples' command line, made from the rows of
 * base/options.def that name a flag: one parser, one range check and one
 * message per row whatever the program, and --help printed from the rows.
 * Which programs take a row, and where its value goes, is each program's
 * place table (train_args.c, gpt_args.c, classify_args.c). Nothing here
 * prints on its own or exits: a status and a message come back, so tests
 * and fuzzers may call it as often as they like.
 */
#ifndef LOOM_EXAMPLES_FLAGS_H
#define LOOM_EXAMPLES_FLAGS_H

#include <stddef.h>
#include <stdio.h>

/* A row's value type (base/options.h, the environment's half, names the
 * same constants: keep one of the two when both exist). */
enum { OPT_BOOL, OPT_INT, OPT_REAL, OPT_STR, OPT_CHOICE, OPT_PATH };

/* Every row of base/options.def by its id, rows without a flag too. */
enum flag_row {
#define OPT(id, flag, env, type, choices, lo, hi, def, layer, agree, doc) FLAG_##id,
#include "base/options.def"
#undef OPT
	FLAG_ROW_COUNT
};

/* One row as written. */
typedef struct flag_info {
	const char *flag, *env;
	int type;
	const char *choices; /* "a|b|c" */
	double lo, hi;       /* +-1e308: open */
	const char *def, *layer;
	int agree;
	const char *doc;
} flag_info;

extern const flag_info flag_rows[FLAG_ROW_COUNT];

/* The programs that take flags, for a place's programs mask. */
enum {
	FLAG_PROG_MNIST_DDP = 1u << 0,
	FLAG_PROG_CIFAR_DDP = 1u << 1,
	FLAG_PROG_RESNET50_SYNTHETIC = 1u << 2,
	FLAG_PROG_GPT_DDP = 1u << 3,
	FLAG_PROG_CLASSIFY = 1u << 4,
	FLAG_PROG_COUNT = 5,
};

/* A flag's argument once read and range-checked. */
typedef struct flag_parsed {
	long long i;   /* OPT_INT; OPT_BOOL: 1 */
	double x;      /* OPT_REAL */
	int choice;    /* OPT_CHOICE: its index in the row's choices */
	const char *s; /* the argument as given (NULL for OPT_BOOL) */
} flag_parsed;

/* A value no single field takes as it is (--precision sets two): 0, or
 * -1 with msg set. base is the program's struct. */
typedef int (*flag_setter)(void *base, const flag_parsed *v, char *msg, size_t msglen);

/*
 * Where a program keeps one row's value, and which programs take it. The
 * field is an int or an int64_t (OPT_INT, by size), a double (OPT_REAL), a
 * const char * (OPT_STR, OPT_PATH), an int (OPT_BOOL: values[0], or 1;
 * OPT_CHOICE: values[choice], or the index). size 0: no field (a flag
 * another layer takes out of argv first: --nproc, --help).
 */
typedef struct flag_place {
	int row;
	unsigned programs;
	size_t offset, size;
	const int *values;
	flag_setter set;
} flag_place;

#define FLAG_AT(type, field) .offset = offsetof(type, field), .size = sizeof(((type *)0)->field)

/* A program's struct and its place table; given (optional, FLAG_ROW_COUNT
 * bytes) marks the rows the command line set. */
typedef struct flag_target {
	const flag_place *places;
	size_t n;
	void *base;
	unsigned char *given;
} flag_target;

enum { FLAGS_RUN = 0, FLAGS_HELP = 1, FLAGS_BAD = -1 };

/*
 * argv's flags (argv[0] is the program's name; getopt_long may permute the
 * rest) into the targets, over the values already there (the defaults),
 * for the program whose bit is prog: a row no target places for prog is an
 * unknown flag. FLAGS_HELP when --help or -h is anywhere. msg (may be NULL)
 * receives a message without the program's name.
 */
int flags_parse(unsigned prog, const flag_target *t, size_t nt, int argc, char **argv,
		char *msg, size_t msglen);

/* One flag (without dashes: "opt-level") and its argument (ignored for a
 * flag that takes none), as flags_parse would set it: 0, or -1 with msg set. */
int flags_set(unsigned prog, const flag_target *t, size_t nt, const char *name, const char *arg,
	      char *msg, size_t msglen);

/* The place of row for prog in the targets (*k: which target), or NULL. */
const flag_place *flags_place(unsigned prog, const flag_target *t, size_t nt, int row, size_t *k);

/* The row whose flag is name (without dashes) for prog, or -1. */
int flags_row(unsigned prog, const flag_target *t, size_t nt, const char *name);

/* One line per row prog takes, in the rows' order: the flag, its
 * argument, its doc and its default (read from the targets: give them the
 * defaults), wrapped to 80 columns. */
void flags_usage(unsigned prog, const flag_target *t, size_t nt, FILE *f);

/* The default --help prints for row in target t (buf empty: none); the
 * program's own value, or the row's def where the field holds a value no
 * flag gives (0 for "none" or "the engine's default"). */
void flags_default_text(const flag_place *pl, const void *base, char *buf, size_t len);

/* msg (may be NULL or msglen 0: dropped) printed from fmt: the one way
 * the examples' argument readers word a refusal. */
void flags_say(char *msg, size_t msglen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* What a row's argument looks like in --help ("N", "X", "FILE", "a|b"). */
const char *flags_arg_name(int row);

#endif /* LOOM_EXAMPLES_FLAGS_H */
