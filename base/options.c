/*
 * base/options.c — the options table (base/options.def) as rows, the typed
 * readers of a row's environment variable, and the one getenv of the
 * library: nothing reads the environment but this file.
 */
#include "base/options.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/errf.h"

static const loom_opt_row rows[LOOM_OPT_COUNT] = {
#define OPT(id, flag, env, type, choices, lo, hi, def, layer, agree, doc) \
	[LOOM_OPT_##id] = { #id, flag, env, LOOM_##type, choices, lo, hi, def, layer, agree, doc },
#include "base/options.def"
#undef OPT
};

/*
 * The variables loom reads that are not its settings: what mpirun,
 * torchrun, Slurm and loom's own --nproc launcher (LOOM_LAUNCH_*, from
 * parent to worker) hand a rank, what bazel hands a program it runs, and
 * the few the system defines. loom_env answers these names alone, so this
 * list is every one of them.
 */
static const char *const launcher_names[] = {
	/* torchrun and env:// */
	"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
	"GROUP_RANK", "GROUP_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_MAX_RESTARTS",
	"TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_ERROR_FILE",
	/* mpirun (Open MPI) */
	"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
	"OMPI_COMM_WORLD_LOCAL_SIZE",
	/* Slurm's srun */
	"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_NODELIST", "SLURM_NODEID",
	"SLURM_NNODES", "SLURM_JOB_ID", "SLURM_STEP_ID",
	/* loom's --nproc launcher to its workers (comm/launch.c) */
	"LOOM_LAUNCH_WORKER", "LOOM_LAUNCH_LISTEN_FD", "LOOM_LAUNCH_LIVE_FD", "LOOM_LAUNCH_PID",
	/* bazel run and bazel test */
	"BUILD_WORKING_DIRECTORY", "RUNFILES_DIR", "TEST_SRCDIR",
	/* the system's */
	"CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "TMPDIR",
	NULL,
};

const loom_opt_row *loom_opt_row_get(loom_opt id)
{
	return (unsigned)id < LOOM_OPT_COUNT ? &rows[id] : NULL;
}

int loom_opt_find_env(const char *name)
{
	for (int i = 0; name && i < LOOM_OPT_COUNT; i++)
		if (rows[i].env && !strcmp(rows[i].env, name))
			return i;
	return -1;
}

int loom_opt_find_flag(const char *name)
{
	for (int i = 0; name && i < LOOM_OPT_COUNT; i++)
		if (rows[i].flag && !strcmp(rows[i].flag, name))
			return i;
	return -1;
}

const char *loom_opt_env(loom_opt id)
{
	const loom_opt_row *r = loom_opt_row_get(id);
	return r && r->env ? getenv(r->env) : NULL;
}

int loom_opt_bool(loom_opt id)
{
	const loom_opt_row *r = loom_opt_row_get(id);
	const char *e = loom_opt_env(id);
	if (e && !strcmp(e, "1"))
		return 1;
	if (e && !strcmp(e, "0"))
		return 0;
	return r && r->def && !strcmp(r->def, "1");
}

/* text as a whole number within [lo, hi]: a decimal integer into *iv
 * when integer, else a finite real into *rv (strtol's and strtod's leading
 * blanks and sign allowed, as every reader took them). */
static int parse_number(const char *text, int integer, double lo, double hi, long *iv,
			double *rv)
{
	char *end;
	long l = 0;
	double v;
	if (!text || !*text)
		return 0;
	errno = 0;
	if (integer)
		v = (double)(l = strtol(text, &end, 10));
	else
		v = strtod(text, &end);
	if (*end || errno || !isfinite(v) || v < lo || v > hi)
		return 0;
	if (integer)
		*iv = l;
	else
		*rv = v;
	return 1;
}

/* The index of word in "a|b|c", or -1. */
static int choice_index(const char *choices, const char *word)
{
	size_t n = word ? strlen(word) : 0;
	int i = 0;
	if (!choices || !n)
		return -1;
	for (const char *p = choices;; i++) {
		size_t len = strcspn(p, "|");
		if (len == n && !strncmp(p, word, n))
			return i;
		if (!p[len])
			return -1;
		p += len + 1;
	}
}

int loom_opt_bool_once(loom_opt id, int *cache)
{
	int o = __atomic_load_n(cache, __ATOMIC_RELAXED);
	if (o < 0) {
		o = loom_opt_bool(id);
		__atomic_store_n(cache, o, __ATOMIC_RELAXED);
	}
	return o;
}

int loom_opt_int(loom_opt id, long *out)
{
	const loom_opt_row *r = loom_opt_row_get(id);
	return r && r->type == LOOM_OPT_INT &&
	       parse_number(loom_opt_env(id), 1, r->lo, r->hi, out, NULL);
}

int loom_opt_real(loom_opt id, double *out)
{
	const loom_opt_row *r = loom_opt_row_get(id);
	return r && r->type == LOOM_OPT_REAL &&
	       parse_number(loom_opt_env(id), 0, r->lo, r->hi, NULL, out);
}

int loom_opt_choice(loom_opt id)
{
	const loom_opt_row *r = loom_opt_row_get(id);
	return r && r->type == LOOM_OPT_CHOICE ? choice_index(r->choices, loom_opt_env(id)) : -1;
}

loom_status loom_opt_parse(loom_opt id, const char *text, char *err, size_t errlen)
{
	const loom_opt_row *r = loom_opt_row_get(id);
	const char *name;
	long iv;
	double rv;
	if (!r)
		return loom_errnf(err, errlen, LOOM_ERR_INVALID, "option %d: no such setting",
				  (int)id);
	name = r->env ? r->env : r->flag;
	if (!text)
		text = "";
	switch (r->type) {
	case LOOM_OPT_BOOL:
		if (strcmp(text, "0") && strcmp(text, "1"))
			return loom_errnf(err, errlen, LOOM_ERR_INVALID, "%s=%s: 0 or 1", name,
					  text);
		return LOOM_OK;
	case LOOM_OPT_INT:
	case LOOM_OPT_REAL: {
		const int is_int = r->type == LOOM_OPT_INT;
		if (!parse_number(text, is_int, r->lo, r->hi, &iv, &rv))
			return loom_errnf(err, errlen, LOOM_ERR_INVALID, "%s=%s: %s from %.15g to %.15g",
					  name, text, is_int ? "an integer" : "a number", r->lo, r->hi);
		return LOOM_OK;
	}
	case LOOM_OPT_CHOICE:
		if (choice_index(r->choices, text) < 0)
			return loom_errnf(err, errlen, LOOM_ERR_INVALID, "%s=%s: one of %s", name,
					  text, r->choices);
		return LOOM_OK;
	case LOOM_OPT_STR:
	case LOOM_OPT_PATH:
		if (!*text)
			return loom_errnf(err, errlen, LOOM_ERR_INVALID, "%s is empty", name);
		return LOOM_OK;
	}
	return LOOM_OK;
}

loom_status loom_opt_check(loom_opt id, char *err, size_t errlen)
{
	const char *e = loom_opt_env(id);
	return e && *e ? loom_opt_parse(id, e, err, errlen) : LOOM_OK;
}

loom_status loom_opt_check_env(char *err, size_t errlen)
{
	for (int i = 0; i < LOOM_OPT_COUNT; i++) {
		loom_status st = loom_opt_check((loom_opt)i, err, errlen);
		if (st != LOOM_OK)
			return st;
	}
	return LOOM_OK;
}

const char *loom_env(const char *name)
{
	for (size_t i = 0; name && launcher_names[i]; i++)
		if (!strcmp(launcher_names[i], name))
			return getenv(name);
	return NULL;
}

const char *loom_env_name(size_t i)
{
	return i < sizeof(launcher_names) / sizeof(*launcher_names) ? launcher_names[i] : NULL;
}
