/*
 * tests/base/test_options.c — the options table (base/options.def) and its
 * readers: rows found by name, each type read as its callers always read
 * it, a bad value or an out-of-range number named with what it accepts,
 * and the table itself well formed (unique names, defaults that suit
 * their rows, launcher names apart from the settings).
 */
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "base/errf.h"
#include "base/options.h"

Test(options, rows_found_by_name)
{
	int i = loom_opt_find_env("LOOM_CUDA_GRAPH");
	cr_assert_eq(i, LOOM_OPT_CUDA_GRAPH);
	const loom_opt_row *r = loom_opt_row_get(LOOM_OPT_CUDA_GRAPH);
	cr_assert_str_eq(r->id, "CUDA_GRAPH");
	cr_assert_str_eq(r->env, "LOOM_CUDA_GRAPH");
	cr_assert_eq(r->type, LOOM_OPT_BOOL);
	cr_assert_str_eq(r->def, "1");
	cr_assert_str_eq(r->layer, "engine");
	cr_assert_eq(loom_opt_find_env("LOOM_NO_SUCH_THING"), -1);
	cr_assert_eq(loom_opt_find_env(NULL), -1);
	cr_assert_null(loom_opt_row_get(LOOM_OPT_COUNT));
	cr_assert_null(loom_opt_row_get((loom_opt)-1));
}

Test(options, bool_reads_one_and_zero_else_its_default)
{
	/* Default on: only "0" turns it off (as !(e && !strcmp(e, "0"))). */
	unsetenv("LOOM_CUDA_GRAPH");
	cr_assert_eq(loom_opt_bool(LOOM_OPT_CUDA_GRAPH), 1);
	setenv("LOOM_CUDA_GRAPH", "0", 1);
	cr_assert_eq(loom_opt_bool(LOOM_OPT_CUDA_GRAPH), 0);
	setenv("LOOM_CUDA_GRAPH", "no", 1);
	cr_assert_eq(loom_opt_bool(LOOM_OPT_CUDA_GRAPH), 1);
	unsetenv("LOOM_CUDA_GRAPH");
	/* Default off: only "1" turns it on (as e && !strcmp(e, "1")). */
	unsetenv("LOOM_ASYNC_LOSS");
	cr_assert_eq(loom_opt_bool(LOOM_OPT_ASYNC_LOSS), 0);
	setenv("LOOM_ASYNC_LOSS", "1", 1);
	cr_assert_eq(loom_opt_bool(LOOM_OPT_ASYNC_LOSS), 1);
	setenv("LOOM_ASYNC_LOSS", "yes", 1);
	cr_assert_eq(loom_opt_bool(LOOM_OPT_ASYNC_LOSS), 0);
	setenv("LOOM_ASYNC_LOSS", "", 1);
	cr_assert_eq(loom_opt_bool(LOOM_OPT_ASYNC_LOSS), 0);
	unsetenv("LOOM_ASYNC_LOSS");
}

Test(options, int_in_range_else_not_set)
{
	long v = -7;
	unsetenv("LOOM_RECOMPUTE");
	cr_assert_eq(loom_opt_int(LOOM_OPT_RECOMPUTE, &v), 0);
	cr_assert_eq(v, -7);
	setenv("LOOM_RECOMPUTE", "3", 1);
	cr_assert_eq(loom_opt_int(LOOM_OPT_RECOMPUTE, &v), 1);
	cr_assert_eq(v, 3);
	setenv("LOOM_RECOMPUTE", "4", 1); /* above the row's hi */
	cr_assert_eq(loom_opt_int(LOOM_OPT_RECOMPUTE, &v), 0);
	setenv("LOOM_RECOMPUTE", "2x", 1);
	cr_assert_eq(loom_opt_int(LOOM_OPT_RECOMPUTE, &v), 0);
	setenv("LOOM_RECOMPUTE", "", 1);
	cr_assert_eq(loom_opt_int(LOOM_OPT_RECOMPUTE, &v), 0);
	cr_assert_eq(v, 3);
	unsetenv("LOOM_RECOMPUTE");
	/* Not an int row: never read as one. */
	setenv("LOOM_CUDA_GRAPH", "1", 1);
	cr_assert_eq(loom_opt_int(LOOM_OPT_CUDA_GRAPH, &v), 0);
	unsetenv("LOOM_CUDA_GRAPH");
}

Test(options, real_and_choice)
{
	double d = 0;
	setenv("LOOM_COMM_TIMEOUT_S", "2.5", 1);
	cr_assert_eq(loom_opt_real(LOOM_OPT_COMM_TIMEOUT_S, &d), 1);
	cr_assert_float_eq(d, 2.5, 0);
	setenv("LOOM_COMM_TIMEOUT_S", "1e9", 1);
	cr_assert_eq(loom_opt_real(LOOM_OPT_COMM_TIMEOUT_S, &d), 0);
	unsetenv("LOOM_COMM_TIMEOUT_S");

	setenv("LOOM_KERNEL_SEARCH", "on", 1);
	cr_assert_eq(loom_opt_choice(LOOM_OPT_KERNEL_SEARCH), 1);
	setenv("LOOM_KERNEL_SEARCH", "off", 1);
	cr_assert_eq(loom_opt_choice(LOOM_OPT_KERNEL_SEARCH), 0);
	setenv("LOOM_KERNEL_SEARCH", "of", 1); /* a prefix is not a word */
	cr_assert_eq(loom_opt_choice(LOOM_OPT_KERNEL_SEARCH), -1);
	setenv("LOOM_KERNEL_SEARCH", "off|on", 1);
	cr_assert_eq(loom_opt_choice(LOOM_OPT_KERNEL_SEARCH), -1);
	unsetenv("LOOM_KERNEL_SEARCH");
	cr_assert_eq(loom_opt_choice(LOOM_OPT_KERNEL_SEARCH), -1);
	setenv("LOOM_CPU_CONV", "dnnl_blocked", 1);
	cr_assert_eq(loom_opt_choice(LOOM_OPT_CPU_CONV), 2);
	unsetenv("LOOM_CPU_CONV");
}

Test(options, a_bad_value_is_named_with_what_it_accepts)
{
	char err[LOOM_ERR_MAX] = "";
	cr_assert_eq(loom_opt_parse(LOOM_OPT_KERNEL_SEARCH, "maybe", err, sizeof(err)),
		     LOOM_ERR_INVALID);
	cr_assert_str_eq(err, "LOOM_KERNEL_SEARCH=maybe: one of off|on");
	cr_assert_eq(loom_opt_parse(LOOM_OPT_CUDA_GRAPH, "yes", err, sizeof(err)),
		     LOOM_ERR_INVALID);
	cr_assert_str_eq(err, "LOOM_CUDA_GRAPH=yes: 0 or 1");
	cr_assert_eq(loom_opt_parse(LOOM_OPT_CUDA_GRAPH, "0", err, sizeof(err)), LOOM_OK);

	setenv("LOOM_CPU_TEAM", "gomp", 1);
	cr_assert_eq(loom_opt_check(LOOM_OPT_CPU_TEAM, err, sizeof(err)), LOOM_ERR_INVALID);
	cr_assert_str_eq(err, "LOOM_CPU_TEAM=gomp: one of omp|loom");
	unsetenv("LOOM_CPU_TEAM");
	cr_assert_eq(loom_opt_check(LOOM_OPT_CPU_TEAM, err, sizeof(err)), LOOM_OK);
	cr_assert_eq(loom_opt_parse(LOOM_OPT_COUNT, "1", err, sizeof(err)), LOOM_ERR_INVALID);
}

Test(options, a_number_out_of_range_is_named)
{
	char err[LOOM_ERR_MAX] = "";
	setenv("LOOM_RECOMPUTE", "7", 1);
	cr_assert_eq(loom_opt_check(LOOM_OPT_RECOMPUTE, err, sizeof(err)), LOOM_ERR_INVALID);
	cr_assert_str_eq(err, "LOOM_RECOMPUTE=7: an integer from 0 to 3");
	unsetenv("LOOM_RECOMPUTE");
	cr_assert_eq(loom_opt_parse(LOOM_OPT_COMM_TIMEOUT_S, "2e7", err, sizeof(err)),
		     LOOM_ERR_INVALID);
	cr_assert_str_eq(err, "LOOM_COMM_TIMEOUT_S=2e7: a number from 0 to 10000000");
	cr_assert_eq(loom_opt_parse(LOOM_OPT_VOCAB_PAD, "64", err, sizeof(err)), LOOM_OK);
}

/* Every row: an id, a layer and a doc; each env name unique and LOOM_;
 * a choice row with its words; a default that its own row accepts. */
Test(options, the_table_is_well_formed)
{
	char err[LOOM_ERR_MAX];
	for (int i = 0; i < LOOM_OPT_COUNT; i++) {
		const loom_opt_row *r = loom_opt_row_get((loom_opt)i);
		cr_assert(r->id && *r->id && r->layer && *r->layer && r->doc && *r->doc,
			  "row %d", i);
		cr_assert(r->env || r->flag, "row %s: neither a flag nor a variable", r->id);
		cr_assert(r->agree == 0 || r->agree == 1, "row %s", r->id);
		cr_assert((r->type == LOOM_OPT_CHOICE) == (r->choices != NULL),
			  "row %s: choices go with OPT_CHOICE alone", r->id);
		cr_assert(r->lo <= r->hi, "row %s", r->id);
		if (r->def)
			cr_assert_eq(loom_opt_parse((loom_opt)i, r->def, err, sizeof(err)), LOOM_OK,
				     "row %s: its default: %s", r->id, err);
		if (!r->env)
			continue;
		cr_assert(!strncmp(r->env, "LOOM_", 5), "row %s: %s", r->id, r->env);
		cr_assert_eq(loom_opt_find_env(r->env), i, "%s has two rows", r->env);
		cr_assert_null(loom_env(r->env), "%s is a setting and a launcher's", r->env);
		for (size_t k = 0; loom_env_name(k); k++)
			cr_assert_str_neq(loom_env_name(k), r->env);
	}
	for (int i = 0; i < LOOM_OPT_COUNT; i++) {
		const loom_opt_row *r = loom_opt_row_get((loom_opt)i);
		int first = r->flag ? loom_opt_find_flag(r->flag) : i;
		/* A flag's name has one row, except where two programs' flags
		 * share a name for different settings (gpt_ddp's and classify's
		 * --top-k): examples' rows both, and tests/examples:test_flags
		 * checks that no program takes both. */
		if (first != i)
			cr_assert(!strcmp(r->layer, "examples") &&
					  !strcmp(loom_opt_row_get((loom_opt)first)->layer, "examples"),
				  "%s has two rows", r->flag);
	}
}

Test(options, the_launchers_names_alone)
{
	setenv("SLURM_PROCID", "3", 1);
	cr_assert_str_eq(loom_env("SLURM_PROCID"), "3");
	unsetenv("SLURM_PROCID");
	cr_assert_null(loom_env("SLURM_PROCID"));
	/* Set, but not a name loom reads: refused. */
	setenv("LOOM_NOT_A_LAUNCHER_NAME", "1", 1);
	cr_assert_null(loom_env("LOOM_NOT_A_LAUNCHER_NAME"));
	unsetenv("LOOM_NOT_A_LAUNCHER_NAME");
	cr_assert_null(loom_env(NULL));
	size_t n = 0;
	while (loom_env_name(n))
		n++;
	cr_assert_gt(n, 30);
	for (size_t i = 0; i < n; i++)
		for (size_t k = i + 1; k < n; k++)
			cr_assert_str_neq(loom_env_name(i), loom_env_name(k));
}
