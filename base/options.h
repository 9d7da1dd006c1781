/*
 * base/options.h — every setting loom has, as rows of one table
 * (base/options.def), and the one way library code reads the environment.
 * A setting is read through its row (loom_opt_bool(LOOM_OPT_CUDA_GRAPH)),
 * so its name, type, range and default live in one place; what a launcher
 * or the build hands over (RANK, SLURM_*, RUNFILES_DIR...) is read through
 * loom_env, which knows the names loom reads. Nothing else calls getenv
 * (tests/base:test_no_getenv holds it so).
 */
#ifndef LOOM_BASE_OPTIONS_H
#define LOOM_BASE_OPTIONS_H

#include <stddef.h>

#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One constant per row: LOOM_OPT_CUDA_GRAPH, ... LOOM_OPT_COUNT last. */
typedef enum loom_opt {
#define OPT(id, flag, env, type, choices, lo, hi, def, layer, agree, doc) LOOM_OPT_##id,
#include "base/options.def"
#undef OPT
	LOOM_OPT_COUNT
} loom_opt;

/* What a row's value is (the row's OPT_BOOL is LOOM_OPT_BOOL here). */
typedef enum loom_opt_type {
	LOOM_OPT_BOOL,   /* "1" or "0" */
	LOOM_OPT_INT,    /* a decimal integer in [lo, hi] */
	LOOM_OPT_REAL,   /* a number in [lo, hi] */
	LOOM_OPT_STR,    /* any text; the doc says what it means */
	LOOM_OPT_CHOICE, /* one of the words of choices ("off|on") */
	LOOM_OPT_PATH,   /* a file or directory */
} loom_opt_type;

typedef struct loom_opt_row {
	const char *id;      /* "CUDA_GRAPH" */
	const char *flag;    /* the examples' flag, or NULL */
	const char *env;     /* the environment variable, or NULL */
	loom_opt_type type;
	const char *choices; /* "off|on" for a choice, else NULL */
	double lo, hi;       /* the range of an int or a real */
	const char *def;     /* the default as text, or NULL for none */
	const char *layer;   /* the folder that reads it ("engine/cuda") */
	int agree;           /* every rank must hold the same value */
	const char *doc;
} loom_opt_row;

/* Row id, or NULL when id is not a row. */
const loom_opt_row *loom_opt_row_get(loom_opt id);
/* The row whose environment variable (or flag) is name; -1 when none. */
int loom_opt_find_env(const char *name);
int loom_opt_find_flag(const char *name);

/*
 * Reading a row's environment variable, at the moment the caller needs it
 * (some callers cache it, some read it at compile, as each always did):
 *  - loom_opt_env: its text, or NULL when unset (or the row has no env);
 *    for callers whose own words decide;
 *  - loom_opt_bool: 1 for "1", 0 for "0", else (unset or any other text)
 *    the row's default ("1" is 1, anything else 0);
 *  - loom_opt_int / loom_opt_real: 1 with *out set when the variable holds
 *    a number of the row's type within its range, else 0 (*out kept);
 *  - loom_opt_choice: the index of its word in the row's choices, or -1
 *    when unset, empty or not one of them.
 * None of them fails: a value they cannot read is the default, as it
 * always was; loom_opt_check names it where a caller has an error path.
 */
const char *loom_opt_env(loom_opt id);
int loom_opt_bool(loom_opt id);
int loom_opt_int(loom_opt id, long *out);
int loom_opt_real(loom_opt id, double *out);
int loom_opt_choice(loom_opt id);
/* loom_opt_bool(id) read once into *cache (start it at -1), for a switch
 * asked on a hot path; every thread reads the same answer. */
int loom_opt_bool_once(loom_opt id, int *cache);

/* LOOM_OK when text suits row id (type, choices, range); else
 * LOOM_ERR_INVALID with a message naming the variable (or flag) and what
 * it accepts: "LOOM_RECOMPUTE=7: an integer from 0 to 3". */
loom_status loom_opt_parse(loom_opt id, const char *text, char *err, size_t errlen);
/* loom_opt_parse on the environment's value; LOOM_OK when it is unset or
 * empty (which every reader takes as unset). */
loom_status loom_opt_check(loom_opt id, char *err, size_t errlen);
/* loom_opt_check on every row with an environment variable: the first
 * value set that its row does not take ("LOOM_CUDA_GRAPH=yes: 0 or 1").
 * loom_compile calls it first, so that a mistyped value fails the start
 * instead of quietly running the default. */
loom_status loom_opt_check_env(char *err, size_t errlen);

/*
 * A variable a launcher, the build or a parent loom process sets (RANK,
 * SLURM_PROCID, RUNFILES_DIR, LOOM_LAUNCH_WORKER...): not a setting of
 * loom's but a protocol it follows. Its value, or NULL when unset or when
 * name is not one of the names loom reads (loom_env_name lists them).
 */
const char *loom_env(const char *name);
/* The i-th name loom_env reads, or NULL past the last. */
const char *loom_env_name(size_t i);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_BASE_OPTIONS_H */
